#!/bin/sh
# CPU time (user + system) and wall time of 300,000 submissions to
# completion, alternating a test binary of ac57b25 (old) and one of
# 53e8c03 (new), eight pairs. Build them in each tree with
#   go test -c -o /tmp/old.test .   (and /tmp/new.test)
# Each line: tree, user s, system s, wall s.
for i in 1 2 3 4 5 6 7 8; do
	for v in old new; do
		/usr/bin/time -f "$v %U %S %e" /tmp/$v.test -test.run '^$' \
			-test.bench 'SubmitToCompletion$' -test.benchtime=300000x -test.count=1 2>&1 | grep -E "^(old|new) "
	done
done
