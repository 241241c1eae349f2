#!/bin/sh
# Alternates the tree before the MemStore's listing path (old, a worktree
# of the commit before it, with this bench_test.go) and after (new), six
# rounds, BenchmarkRetained in the root module.
set -e
old=${1:?old tree} new=${2:?new tree} out=${3:-.}
for i in 1 2 3 4 5 6; do
	(cd "$old" && go test -run '^$' -bench Retained -benchmem -count=1 .) | grep Benchmark >>"$out/retained-old.txt"
	(cd "$new" && go test -run '^$' -bench Retained -benchmem -count=1 .) | grep Benchmark >>"$out/retained-new.txt"
done
