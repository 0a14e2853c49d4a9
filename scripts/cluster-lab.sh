#!/usr/bin/env bash
# Lab lane: docs/cluster.md's SSH and Slurm recipes on hosts that are network namespaces
# of this machine, with the real daemons (sshd, munged, slurmctld, slurmd) and dask-jobqueue
# submitting with the real sbatch. Installs those Debian packages (as root) and the
# project, then runs tests/lab. See docs/cluster.md ("Tested here").
#
# Usage: scripts/cluster-lab.sh [PYTEST ARGS...]      (as root)
# Exit:  pytest's status; 77 with a one-line reason when this machine cannot run the lane.
set -uo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "cluster-lab: SKIP: needs root (apt-get, namespaces)" >&2; exit 77; }
command -v apt-get >/dev/null || { echo "cluster-lab: SKIP: needs apt-get (Debian or Ubuntu)" >&2; exit 77; }
bash scripts/setup.sh || exit 1
need=
for tool in /usr/sbin/sshd:openssh-server ssh:openssh-client munged:munge \
    slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client; do
  command -v "${tool%%:*}" >/dev/null || need="$need ${tool#*:}"
done
if [ -n "$need" ]; then
  echo "cluster-lab: installing$need"
  # the packages' own services are not started (a system sshd would listen on port 22
  # of this machine): invoke-rc.d asks policy-rc.d, which says no while we install
  policy=/usr/sbin/policy-rc.d
  ours=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && ours=1
  fi
  log=$(mktemp /tmp/cluster-lab-apt-XXXXXX.log)
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends $need; } >"$log" 2>&1
  rc=$?
  [ -n "$ours" ] && rm -f "$policy"
  [ "$rc" = 0 ] || { tail -20 "$log"; exit 1; }
  rm -f "$log"
fi
TESTBED_LAB=1 exec .venv/bin/python -m pytest tests/lab -p no:cacheprovider "$@"
