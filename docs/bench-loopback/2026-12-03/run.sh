#!/bin/bash
# As run on 2026-12-03: /work/main holds the current revision, /work/wt/old a worktree of
# 0d401f5 with its own .venv (scripts/setup.sh there); results go to /tmp/lo/<setting>-<round>.
# interleaved rounds of the loopback inflation experiment
cd /tmp/lo
for round in 1 2 3; do
  for v in new old newexec newnoprobe newexecnoprobe; do
    out=/tmp/lo/$v-$round
    rm -rf $out
    case $v in
      new) (cd /work/main && .venv/bin/python -m testbed run /tmp/lo/lo.toml --out $out --jobs 1) ;;
      old) (cd /work/wt/old && .venv/bin/python -m testbed run /tmp/lo/lo.toml --out $out --jobs 1) ;;
      newexec) (cd /work/main && TESTBED_NODE_START=exec .venv/bin/python -m testbed run /tmp/lo/lo.toml --out $out --jobs 1) ;;
      newnoprobe) (cd /work/main && PLANFENCE_SCHED_PERIOD_MS=0 .venv/bin/python -m testbed run /tmp/lo/lo.toml --out $out --jobs 1) ;;
      newexecnoprobe) (cd /work/main && TESTBED_NODE_START=exec PLANFENCE_SCHED_PERIOD_MS=0 .venv/bin/python -m testbed run /tmp/lo/lo.toml --out $out --jobs 1) ;;
    esac > /tmp/lo/$v-$round.log 2>&1
    echo "$v $round rc $? $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/lo/progress.txt
  done
done
echo done >> /tmp/lo/progress.txt
