#!/usr/bin/env bash
# Interleaves the tree at main's start (old) and this branch (new).
set -u
OLD=/tmp/benchbase NEW=/tmp/benchnew R=/tmp/benchres
export WORKERS_TEST_POSTGRES='postgres://postgres@127.0.0.1:5432/test?sslmode=disable&pool_max_conns=16'
rm -f $R/*.txt
for i in 1 2 3 4 5 6; do
  for side in old new; do
    dir=$OLD; [ $side = new ] && dir=$NEW
    (cd $dir && go test -run '^$' -bench . -benchmem -count=1 . | grep ^Benchmark >> $R/root-$side.txt)
    (cd $dir/bench && go test -run '^$' -bench 'Async|Sequential|IdleLatency' -benchmem -count=1 . | grep ^Benchmark >> $R/mem-$side.txt)
    (cd $dir/bench && go test -run '^$' -bench 'Queued' -benchtime=1x -count=1 . | grep ^Benchmark >> $R/queued-$side.txt)
    (cd $dir/bench && go test -run '^$' -bench 'Postgres/impl=workers' -benchtime=2000x -count=1 . | grep ^Benchmark >> $R/pg-$side.txt)
  done
  (cd $NEW/bench && go test -run '^$' -bench 'Postgres/impl=river' -benchtime=2000x -count=1 . | grep ^Benchmark >> $R/pg-river.txt)
  (cd $NEW/bench && go test -run '^$' -bench 'SQLite' -benchtime=1000x -count=1 . | grep ^Benchmark >> $R/sqlite.txt)
  echo "round $i done $(date -u +%T)" >> $R/progress
done
echo finished >> $R/progress
