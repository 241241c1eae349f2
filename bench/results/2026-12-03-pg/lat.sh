#!/bin/bash
export WORKERS_TEST_POSTGRES='postgres://postgres@127.0.0.1:5432/test?sslmode=disable&pool_max_conns=16'
for i in 1 2 3 4 5 6; do
  for tree in old new; do
    dir=/work/wt/old/bench; [ $tree = new ] && dir=/work/wt/gc/bench
    (cd $dir && go test -run '^$' -bench 'PostgresLatency' -benchtime=4000x -count=1 . 2>&1 | grep '^Bench' >> /tmp/pgb/lat-$tree.txt)
  done
done
echo done > /tmp/pgb/latdone
