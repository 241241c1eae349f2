#!/bin/sh
# Alternating rounds of the bench module's test binaries: /tmp/old.test
# (commit 1b3bc89) and /tmp/new.test (77ccff9), each built in its tree
# with `go test -c -o ... .` in bench/. Run from bench/; writes into the
# directory given as $1.
set -e
out=$1
export WORKERS_TEST_POSTGRES='postgres://postgres@127.0.0.1:5432/test?sslmode=disable&pool_max_conns=16'
for i in 1 2 3 4 5 6; do
	for v in old new; do
		/tmp/$v.test -test.run '^$' -test.bench 'Async|Sequential' -test.benchmem >> "$out/paths-$v.txt"
		/tmp/$v.test -test.run '^$' -test.bench 'IdleLatency' -test.benchtime=20000x >> "$out/idle-$v.txt"
	done
done
for i in 1 2 3; do
	for v in old new; do
		/tmp/$v.test -test.run '^$' -test.bench 'Queued' -test.benchtime=1x >> "$out/queued-$v.txt"
	done
done
/tmp/new.test -test.run '^$' -test.bench 'PostgresLatency' -test.benchtime=4000x -test.count=6 >> "$out/pg-latency-new.txt"
