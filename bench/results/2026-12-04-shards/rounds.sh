#!/bin/sh
# Alternating rounds of the bench module's test binaries: /tmp/old.test
# (commit 754ba32) and /tmp/new.test (the commit named in the README of
# this directory), each built in its tree with `go test -c -o ... .`.
# Writes into the directory given as $1.
set -e
out=$1
export WORKERS_TEST_POSTGRES='postgres://postgres@127.0.0.1:5432/test?sslmode=disable&pool_max_conns=16'
for i in 1 2 3 4 5 6; do
	for v in old new; do
		/tmp/$v.test -test.run '^$' -test.bench 'Async|Sequential' -test.benchmem >> "$out/paths-$v.txt"
	done
done
for i in 1 2 3; do
	for v in old new; do
		/tmp/$v.test -test.run '^$' -test.bench 'Queued' -test.benchtime=1x >> "$out/queued-$v.txt"
		/tmp/$v.test -test.run '^$' -test.bench 'IdleLatency' -test.benchtime=20000x >> "$out/idle-$v.txt"
	done
done
/tmp/new.test -test.run '^$' -test.bench 'PostgresLatency' -test.benchtime=4000x -test.count=6 >> "$out/pg-latency-new.txt"
