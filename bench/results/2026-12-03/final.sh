#!/usr/bin/env bash
cd /work/wt/bench/bench
R=/tmp/benchres
rm -f $R/final-*.txt
for i in 1 2 3 4 5 6; do
  go test -run '^$' -bench 'Async|Sequential|IdleLatency' -benchmem -count=1 . | grep ^Benchmark >> $R/final-mem.txt
  go test -run '^$' -bench 'Queued' -benchtime=1x -count=1 . | grep ^Benchmark >> $R/final-queued.txt
done
echo finished >> $R/final-progress
