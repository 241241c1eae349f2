#!/bin/sh
# Alternates the tree before the compact records (old, a worktree at
# 48edd2e) and this one (new), so both see the same load.
set -e
OLD=${OLD:-/work/wt/old}
NEW=${NEW:-$(git rev-parse --show-toplevel)}
OUT=${OUT:-$(dirname "$0")}
for i in 1 2 3 4 5 6; do
	for t in old new; do
		eval dir=\$$(echo $t | tr a-z A-Z)
		(cd "$dir/bench" && go test -run '^$' -bench 'Async|Sequential|IdleLatency' -benchmem -count=1 .) >>"$OUT/mem-$t.txt"
	done
done
for i in 1 2 3; do
	for t in old new; do
		eval dir=\$$(echo $t | tr a-z A-Z)
		(cd "$dir/bench" && go test -run '^$' -bench 'Queued' -benchtime=1x -count=1 .) >>"$OUT/queued-$t.txt"
		(cd "$dir" && go test -run '^$' -bench 'Retained' -benchmem -count=1 .) >>"$OUT/retained-$t.txt"
	done
done
