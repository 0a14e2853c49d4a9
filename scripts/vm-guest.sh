#!/usr/bin/env bash
# Runs INSIDE the VM lane's guest (scripts/vm-test.sh boots it; see docs/vm-lane.md).
# Usage: vm-guest.sh RUN_DIR [PYTEST ARGS...]
# The guest's root is the host's filesystem (read-only, with throwaway overlays); the
# repo and RUN_DIR are shared read-write, so the host's .venv is used as it is.
# Writes into RUN_DIR: guest.log (everything below), started, timings.tsv, modules.txt,
# doctor.txt, pytest.xml, smoke/ (the smoke campaign's results), rtt.json, dmesg.txt,
# tbf-warnings.txt, bench-link-{netem,userspace}.json (VM_BENCH=1) and, last, status
# ("pytest=N smoke=N modules=N tbf=N").
# Gates: pytest must pass with no netem test skipped (VM_ALLOW_SKIP=1 allows skips, for
# runs narrowed with -k), the smoke campaign must finish with no aborted episode, every
# module must load, and the kernel log must hold no sch_tbf warning.
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
# timing assertions of rates allow for the emulated CPU (tests/testbed/net/test_link_fidelity.py)
export TESTBED_TCG_GUEST=1
PY=.venv/bin/python

say "testbed doctor"
timed doctor .venv/bin/testbed doctor >"$RUN/doctor.txt" 2>&1
echo "doctor exit $?" >>"$RUN/doctor.txt"
cat "$RUN/doctor.txt"

say "pytest -m netem $*"
timed pytest_netem $PY -m pytest -m netem -p no:cacheprovider -v -rA \
  --junitxml="$RUN/pytest.xml" "$@"
pytest_rc=$?
if [ "$pytest_rc" = 5 ]; then
  echo "vm-guest: pytest collected no netem test; that is a broken checkout, not a pass"
  pytest_rc=1
fi
# a netem test that skips here (root, a kernel with netem, TUN) is a failure of the lane
skipped=$(grep -o 'skipped="[0-9]*"' "$RUN/pytest.xml" 2>/dev/null | head -n 1 | tr -dc 0-9)
if [ "${skipped:-0}" != 0 ] && [ "${VM_ALLOW_SKIP:-0}" = 0 ]; then
  echo "vm-guest: $skipped netem test(s) skipped inside the guest, where every one must run"
  [ "$pytest_rc" != 0 ] || pytest_rc=1
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
echo "pytest=$pytest_rc smoke=$smoke_rc modules=$modules_rc tbf=$tbf_rc" >"$RUN/status"
say "status: $(cat "$RUN/status")"
exit "$pytest_rc"
