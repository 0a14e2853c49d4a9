#!/usr/bin/env bash
dir=/work/main
echo "$(date -u +%T) new30 start steal0 $(head -1 /proc/stat | awk '{print $9}') load $(cut -d' ' -f1 /proc/loadavg)" >> /tmp/prof24/pairs.log
(cd "$dir" && PYTHONPATH="$dir" /work/main/.venv/bin/python -m testbed bench lanes --lanes 1,16 --workers none --templates 30 --json /tmp/prof24/new30.json > /tmp/prof24/new30.log 2>&1)
echo "$(date -u +%T) new30 end rc $? steal1 $(head -1 /proc/stat | awk '{print $9}')" >> /tmp/prof24/pairs.log
