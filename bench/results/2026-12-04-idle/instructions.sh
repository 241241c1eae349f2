#!/bin/bash
# instructions.sh BINARY BENCH [N]: instructions per task of the
# library's submit path, counted by callgrind over N tasks (60,000 by
# default) of one root-package benchmark, e.g.
#
#	go test -c -o /tmp/root.test . && instructions.sh /tmp/root.test 'SubmitLatency$'
#
# callgrind counts instructions, not seconds, so the count of a
# function's own calls barely moves with the machine's load; the
# program's total moves by a few hundred per task with the scheduler.
# Needs valgrind.
set -eu
bin=$1 re=$2 n=${3:-60000}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
GOGC=off GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --callgrind-out-file="$out" \
	"$bin" -test.run '^$' -test.bench "$re" -test.benchtime="${n}x" -test.cpu=1 >/dev/null 2>&1
callgrind_annotate --inclusive=yes "$out" 2>/dev/null |
	awk -v n="$n" '/PROGRAM TOTALS/ || /\]\)\.submit \[/ {
		gsub(",", "", $1)
		name = /PROGRAM TOTALS/ ? "program" : "submit"
		printf "%s: %d instructions per task\n", name, $1 / n
	}'
