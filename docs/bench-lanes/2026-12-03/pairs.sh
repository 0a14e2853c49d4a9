#!/usr/bin/env bash
# interleaved bench lanes: new (main) and old (wt/ref) arms
set -u
for i in 1 2; do
  for arm in new old; do
    d=/work/main; [ $arm = old ] && d=/work/wt/ref
    s0=$(head -1 /proc/stat)
    (cd $d && .venv/bin/testbed bench lanes --lanes 1,16 --workers none --json /tmp/bl/$arm-$i.json > /tmp/bl/$arm-$i.log 2>&1)
    s1=$(head -1 /proc/stat)
    echo "$arm $i $(date +%T) rc=$? stat0=[$s0] stat1=[$s1]"
  done
done
