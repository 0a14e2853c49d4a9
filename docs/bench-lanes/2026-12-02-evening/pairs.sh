#!/usr/bin/env bash
# Interleaved `bench lanes --lanes 1,16 --workers none`: base (a0d8acd) and new (HEAD of /work/main)
set -u
run() { # name dir
  local name=$1 dir=$2
  echo "$(date -u +%T) $name start steal0 $(head -1 /proc/stat | awk '{print $9}') load $(cut -d' ' -f1 /proc/loadavg)" >> /tmp/prof24/pairs.log
  (cd "$dir" && PYTHONPATH="$dir" /work/main/.venv/bin/python -m testbed bench lanes --lanes 1,16 --workers none --json /tmp/prof24/$name.json > /tmp/prof24/$name.log 2>&1)
  echo "$(date -u +%T) $name end rc $? steal1 $(head -1 /proc/stat | awk '{print $9}')" >> /tmp/prof24/pairs.log
}
run new1 /work/main
run base1 /tmp/prof24/base
run new2 /work/main
