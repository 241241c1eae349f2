#!/bin/sh
# Alternates two trees (old: a worktree of ac57b25, before runners grow
# their stacks up front; new: a worktree of the commit measured), six
# rounds of the async and sequential paths in the bench module.
set -e
old=${1:?old tree} new=${2:?new tree} out=${3:-.}
for i in 1 2 3 4 5 6; do
	for side in old new; do
		eval tree=\$$side
		(cd "$tree/bench" && go test -run '^$' -bench 'Async|Sequential' -benchmem -count=1 .) | grep Benchmark >>"$out/paths-$side.txt"
	done
done
