#!/usr/bin/env bash
# Runs INSIDE the VM lane's guest (scripts/vm-test.sh boots it; see docs/vm-lane.md).
# Usage: vm-guest.sh RUN_DIR [PYTEST ARGS...]
# The guest's root is the host's filesystem (read-only, with throwaway overlays); the
# repo and RUN_DIR are shared read-write, so the host's .venv is used as it is.
# Writes into RUN_DIR: guest.log (everything below), started, timings.tsv, modules.txt,
# doctor.txt, calibration.json (the guest's own rate at the start), pytest.xml,
# calibration-tests.jsonl (every rate check: its calibration, floor and ceiling),
# skips.txt, smoke/ (the smoke campaign's results), rtt.json, dmesg.txt,
# tbf-warnings.txt, bench-link-{netem,userspace}.json (VM_BENCH=1) and, last, status
# ("pytest=N smoke=N modules=N tbf=N skipped=N").
# Gates: pytest must pass; a netem test may skip only because the guest is too slow to
# test a rate ("guest too slow to test ...", measured by testbed/tools/calibrate.py),
# and at most VM_MAX_SKIPS (2) of those; any other skip fails the lane (VM_ALLOW_SKIP=1
# allows every skip, for runs narrowed with -k). The smoke campaign must finish with no
# aborted episode, every module must load, and the kernel log must hold no sch_tbf
# warning.
# Env: VM_SMOKE=0 skips the smoke campaign, VM_RTT=0 the timing probe, VM_BENCH=1 runs
# `testbed bench link` on netem and on userspace (timing figures, never gating).
set -uo pipefail
RUN=${1:?usage: vm-guest.sh RUN_DIR [PYTEST ARGS...]}
shift
cd "$(dirname "$0")/.."
exec >>"$RUN/guest.log" 2>&1
now() { date +%s.%N; }
echo "$(now) $(cut -d' ' -f1 /proc/uptime)" >"$RUN/started"
printf 'step\tseconds\n' >"$RUN/timings.tsv"
printf 'guest_uptime_at_script\t%s\n' "$(cut -d' ' -f1 /proc/uptime)" >>"$RUN/timings.tsv"
timed() {  # timed NAME CMD... : run CMD, append its wall time, return its status
  local name=$1 t0 rc
  shift
  t0=$(now)
  "$@"
  rc=$?
  awk -v n="$name" -v a="$t0" -v b="$(now)" 'BEGIN { printf "%s\t%.1f\n", n, b - a }' >>"$RUN/timings.tsv"
  return $rc
}
say() { echo "== vm-guest: $*"; }

say "kernel $(uname -r), $(nproc) cpus, $(awk '/MemTotal/ {print int($2/1024) " MiB"}' /proc/meminfo)"

# Kernel modules: the Debian kernel has all of these as modules.
modules_rc=0
: >"$RUN/modules.txt"
for m in tun veth bridge sch_netem sch_tbf sch_htb sch_codel sch_fq_codel sch_pie; do
  if modprobe "$m" >>"$RUN/modules.txt" 2>&1; then
    echo "$m: loaded" >>"$RUN/modules.txt"
  else
    echo "$m: FAILED" >>"$RUN/modules.txt"
    modules_rc=1
  fi
done
[ -e /dev/net/tun ] || { mkdir -p /dev/net && mknod /dev/net/tun c 10 200; }
cat "$RUN/modules.txt"

# The Python stack from the squashfs disks vm-test.sh attached (pyimg.map: serial, path)
if [ -s "$RUN/pyimg.map" ] && modprobe virtio_blk && modprobe squashfs; then
  while read -r serial dir; do
    dev=
    for s in /sys/block/vd*/serial; do
      [ "$(cat "$s" 2>/dev/null)" = "$serial" ] && dev=/dev/$(basename "$(dirname "$s")")
    done
    mnt=/run/planfence-pyimg/$serial
    if [ -n "$dev" ] && mkdir -p "$mnt" && mount -t squashfs -o ro "$dev" "$mnt" &&
        mount --bind "$mnt" "$dir"; then
      echo "python image $serial ($dev) over $dir"
    else
      echo "python image $serial: not mounted, $dir stays on 9p"
    fi
  done <"$RUN/pyimg.map"
fi

export COLUMNS=180
PY=.venv/bin/python
MAX_SKIPS=${VM_MAX_SKIPS:-2}

say "testbed doctor"
timed doctor .venv/bin/testbed doctor >"$RUN/doctor.txt" 2>&1
echo "doctor exit $?" >>"$RUN/doctor.txt"
cat "$RUN/doctor.txt"

# The guest's own rate before anything is measured against it: how fast it moves
# full-size datagrams over an unshaped netem link (the rate checks calibrate again
# around their own streams, on their own topologies; testbed/tools/calibrate.py)
say "calibration: testbed bench calibrate --backend netem --runs 5"
timed calibrate .venv/bin/testbed bench calibrate --backend netem --runs 5 \
  --json "$RUN/calibration.json"
echo "calibrate exit $?"

say "pytest -m netem $*"
export TESTBED_CALIBRATION_LOG="$RUN/calibration-tests.jsonl"
: >"$TESTBED_CALIBRATION_LOG"
# the files vm-test.sh found the netem tests in (none listed: collect the whole suite)
mapfile -t netem_files <"$RUN/netem-files.txt" 2>/dev/null || netem_files=()
timed pytest_netem $PY -m pytest -m netem -p no:cacheprovider -v -rA --durations=12 \
  --junitxml="$RUN/pytest.xml" "${netem_files[@]}" "$@"
pytest_rc=$?
if [ "$pytest_rc" = 5 ]; then
  echo "vm-guest: pytest collected no netem test; that is a broken checkout, not a pass"
  pytest_rc=1
fi
say "rate checks against the guest's calibrated rate (kbit/s):"
$PY - "$TESTBED_CALIBRATION_LOG" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    verdict = "SKIP: " + r["untestable"] if r["untestable"] else "checked"
    print(f"  {r['test']:<22} capacity {r['capacity_kbit']:>8.0f}  measured "
          f"{r['measured_kbit']:>8.0f}  floor {r['floor_kbit']:>8.0f}  ceiling "
          f"{r['ceiling_kbit']:>8.0f}  guest {r['median_kbit']:>8.0f} (spread "
          f"{r['spread']:.0%}, margin {r['margin']:.0%})  timers late p50/p99 "
          f"{r.get('timer_late_p50_ms') or 0:.2f}/{r.get('timer_late_p99_ms') or 0:.2f} ms"
          f"  {verdict}")
PY
# Skips: inside the guest (root, netem, TUN) only a rate the guest is too slow to test
# may skip, and only a few; the lane fails on any other skip or on more of them
$PY - "$RUN/pytest.xml" >"$RUN/skips.txt" <<'PY'
import sys
import xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).iter("testcase"):
    for skip in case.iter("skipped"):
        kind = "slow" if skip.get("message", "").startswith("guest too slow") else "other"
        print(kind, f"{case.get('classname')}::{case.get('name')}", skip.get("message"))
PY
slow=$(grep -c '^slow ' "$RUN/skips.txt")
other=$(grep -c '^other ' "$RUN/skips.txt")
skipped=$((slow + other))
say "skipped: $skipped ($slow for a guest too slow to test a rate, at most $MAX_SKIPS allowed)"
sed 's/^/  /' "$RUN/skips.txt"
if [ "${VM_ALLOW_SKIP:-0}" = 0 ]; then
  if [ "$other" != 0 ]; then
    echo "vm-guest: $other netem test(s) skipped for another reason, where every one must run"
    [ "$pytest_rc" != 0 ] || pytest_rc=1
  fi
  if [ "$slow" -gt "$MAX_SKIPS" ]; then
    echo "vm-guest: $slow rate checks skipped (guest too slow), more than the $MAX_SKIPS allowed"
    [ "$pytest_rc" != 0 ] || pytest_rc=1
  fi
fi
say "pytest exit $pytest_rc"

smoke_rc=0
if [ "${VM_SMOKE:-1}" != 0 ]; then
  cat >"$RUN/smoke.toml" <<'TOML'
# VM lane smoke campaign: one PlanFence episode per template over the netem AT&T link.
name = "vm-smoke"
description = "VM lane: planfence on att over the kernel netem backend"
seed = 20260101
templates = 2

[options]
backend = "netem"
rpc_timeout_s = 10
episode_timeout_s = 300

[grid]
policy = ["planfence"]
network = ["att"]
rho = [4]
agents = [2]
keys = [8]
connection = ["reuse"]
units = [16]
TOML
  say "smoke campaign (att, 2 templates, planfence) --backend netem"
  timed smoke_campaign .venv/bin/testbed run "$RUN/smoke.toml" --backend netem --out "$RUN/smoke"
  smoke_rc=$?
  # `testbed run` exits 0 with aborted episodes: those count as a failed smoke here
  $PY - "$RUN/smoke/episodes.parquet" <<'PY' || { [ "$smoke_rc" != 0 ] || smoke_rc=1; }
import sys
import pandas as pd
try:
    e = pd.read_parquet(sys.argv[1])
except (OSError, ValueError) as exc:
    sys.exit(f"smoke: no episodes ({exc})")
for row in e.itertuples():
    print(f"smoke episode {row.template}: " + (f"ABORTED: {row.abort_reason}" if row.aborted
          else f"ok, stall {row.stall_ms_per_action:.0f} ms/action, wall {row.wall_s:.1f} s"))
sys.exit(1 if e["aborted"].any() or e.empty else 0)
PY
  say "smoke exit $smoke_rc"
fi

if [ "${VM_BENCH:-0}" != 0 ]; then
  for backend in netem userspace; do
    say "testbed bench link --backend $backend (timing under TCG: figures, not a gate)"
    timed "bench_link_$backend" .venv/bin/testbed bench link --backend "$backend" \
      --json "$RUN/bench-link-$backend.json"
    say "bench link $backend exit $?"
  done
fi

if [ "${VM_RTT:-1}" != 0 ]; then
  say "timing probe (UDP echo / ping over a veth pair, netem 20 ms; sleep lateness)"
  timed rtt_probe $PY scripts/vm_rtt_probe.py --out "$RUN/rtt.json"
  say "rtt probe exit $?"
fi

dmesg >"$RUN/dmesg.txt" 2>&1
grep -E 'sch_tbf|netem' "$RUN/dmesg.txt" | sed 's/^\[[^]]*\] //' | sort | uniq -c | sort -rn >"$RUN/tbf-warnings.txt"
say "kernel log lines about tbf/netem (count, line):"
cat "$RUN/tbf-warnings.txt"
# "sch_tbf: burst N is lower than device ... mtu": tbf would drop every full-size frame
tbf_rc=0
if grep -q 'sch_tbf' "$RUN/dmesg.txt"; then
  echo "vm-guest: the kernel log has sch_tbf warnings (see tbf-warnings.txt)"
  tbf_rc=1
fi
echo "pytest=$pytest_rc smoke=$smoke_rc modules=$modules_rc tbf=$tbf_rc skipped=$skipped" >"$RUN/status"
say "status: $(cat "$RUN/status")"
exit "$pytest_rc"
