#!/bin/bash
# Alternates the tree before group commit (old) and after (new), six rounds.
export WORKERS_TEST_POSTGRES='postgres://postgres@127.0.0.1:5432/test?sslmode=disable&pool_max_conns=16'
for i in 1 2 3 4 5 6; do
  for tree in old new; do
    dir=/work/wt/old/bench; [ $tree = new ] && dir=/work/wt/gc/bench
    (cd $dir && go test -run '^$' -bench 'Postgres/impl=workers|PostgresLatency' -benchtime=4000x -count=1 . 2>&1 | grep '^Bench' >> /tmp/pgb/pg-$tree.txt)
  done
  (cd /work/wt/gc/bench && go test -run '^$' -bench 'Postgres/impl=river-cooldown' -benchtime=4000x -count=1 . 2>&1 | grep '^Bench' >> /tmp/pgb/pg-river.txt)
  uptime >> /tmp/pgb/load.txt
done
echo done > /tmp/pgb/finished
