#!/bin/sh
# Alternates two trees (old: a worktree of 076a736, before the compact
# waiting item; new: a worktree of the commit measured), six rounds: in
# the bench module, the queued backlog and the async and sequential
# paths; in the root module, the retained-records benchmark. The files it
# writes are kept here with the new commit's id in their names.
set -e
old=${1:?old tree} new=${2:?new tree} out=${3:-.}
for i in 1 2 3 4 5 6; do
	for side in old new; do
		eval tree=\$$side
		(cd "$tree/bench" && go test -run '^$' -bench Queued -benchtime=1x -count=1 .) | grep Benchmark >>"$out/queued-$side.txt"
		(cd "$tree/bench" && go test -run '^$' -bench 'Async|Sequential' -benchmem -count=1 .) | grep Benchmark >>"$out/paths-$side.txt"
		(cd "$tree" && go test -run '^$' -bench Retained -benchmem -count=1 .) | grep Benchmark >>"$out/retained-$side.txt"
	done
done
