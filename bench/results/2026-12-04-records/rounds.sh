#!/bin/sh
# Alternating rounds, old = 75014df, new = the record-kept handles
# (049ef1d). Bench module binaries: /tmp/old.test and /tmp/new.test,
# each built with `go test -c` in bench/ of its tree; root package
# binaries: /tmp/root-old.test and /tmp/root-new.test, built with
# `go test -c` in the tree's root. Run from bench/; writes into $1.
set -e
out=$1
for i in 1 2 3 4 5 6; do
	for v in old new; do
		/tmp/$v.test -test.run '^$' -test.bench 'Async|Sequential' -test.benchmem >> "$out/paths-$v.txt"
		/tmp/$v.test -test.run '^$' -test.bench 'IdleLatency' -test.benchtime=20000x >> "$out/idle-$v.txt"
		/tmp/$v.test -test.run '^$' -test.bench 'Queued' -test.benchtime=1x >> "$out/queued-$v.txt"
		/tmp/root-$v.test -test.run '^$' -test.bench 'SubmitSequential$|SubmitToCompletion$' -test.benchtime=300000x -test.benchmem >> "$out/root-$v.txt"
	done
done
