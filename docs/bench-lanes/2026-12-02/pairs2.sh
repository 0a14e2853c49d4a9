#!/bin/bash
# interleaved 16-lane rows: base (b0fad88), new (fork), new with TESTBED_NODE_START=exec; then 1-lane rows
run() { # name repo templates jobs [env]
  local name=$1 repo=$2 t=$3 j=$4; shift 4
  env "$@" REPO=$repo /tmp/prof/measure.sh $t $j /tmp/prof/run-$name /r-$name > /dev/null 2>&1
  echo "$(date +%T) $name done: $(grep -h wall /tmp/prof/r-$name.txt)"
}
for round in 1 2; do
  run base16-$round /tmp/prof/base 16 16
  run new16-$round /tmp/prof/new 16 16
  run exec16-$round /tmp/prof/new 16 16 TESTBED_NODE_START=exec
done
run base1 /tmp/prof/base 16 1
run new1 /tmp/prof/new 16 1
echo finished
