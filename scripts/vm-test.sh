#!/usr/bin/env bash
# VM lane: boot Debian's 6.1 kernel (which has sch_netem) under QEMU with the host's own
# filesystem as the guest's root (virtme-ng), and run the netem tests and a netem smoke
# campaign inside it. See docs/vm-lane.md.
#
# Usage: scripts/vm-test.sh [PYTEST ARGS...]      (as root; extra args go to pytest -m netem)
# Exit:  the guest's pytest status (1 if a netem test skipped, the smoke campaign or a
#        module load failed, or the guest's kernel log has sch_tbf warnings, while pytest
#        passed); 77 with a one-line reason when this machine cannot boot a guest.
# Env:   PLANFENCE_VM_CACHE (default /var/lib/planfence-vm: tools venv, kernel, debs),
#        VM_OUT (run directory, default .vm/runs/<stamp>), VM_CPUS (2), VM_MEMORY (3G),
#        VM_TIMEOUT (seconds for the whole guest, 3600), VM_KERNEL_PKG (a Debian
#        linux-image-* package; default: what linux-image-amd64 depends on, or the one
#        cached), VM_APPEND (extra guest kernel arguments), VM_SMOKE / VM_RTT / VM_BENCH /
#        VM_ALLOW_SKIP (see scripts/vm-guest.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd -P)
SKIP=77
T0=$(date +%s.%N)
skip() { echo "vm-test: SKIP: $*" >&2; exit "$SKIP"; }
die() { echo "vm-test: $*" >&2; exit 1; }
say() { echo "vm-test: $*"; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

CACHE=${PLANFENCE_VM_CACHE:-/var/lib/planfence-vm}
VIRTME_NG_VERSION=1.42
CPUS=${VM_CPUS:-2}
MEMORY=${VM_MEMORY:-3G}
TIMEOUT=${VM_TIMEOUT:-3600}

[ "$(id -u)" = 0 ] || skip "needs root (apt-get, and the guest runs as the calling user)"
[ "$(uname -m)" = x86_64 ] || skip "x86_64 only (Debian's amd64 kernel), this is $(uname -m)"
case "$CACHE/" in
  /var/cache/* | /tmp/* | /var/tmp/* | /run/*)
    # virtme-ng mounts fresh tmpfs/overlays there in the guest: the kernel's modules vanish
    die "PLANFENCE_VM_CACHE=$CACHE: must not be under /var/cache, /tmp, /var/tmp or /run" ;;
esac
mkdir -p "$CACHE" || skip "cannot create $CACHE"
exec 9>"$CACHE/.lock"
flock -w 1800 9 || die "another vm-test holds $CACHE/.lock"

# --- host packages: QEMU, kmod (modprobe/depmod, also used by the guest), busybox (for
# virtme-ng's initramfs), python3-venv (tool venv), ping (the timing probe)
need_apt=()
command -v qemu-system-x86_64 >/dev/null || need_apt+=(qemu-system-x86)
command -v modprobe >/dev/null && command -v depmod >/dev/null || need_apt+=(kmod)
command -v busybox >/dev/null || need_apt+=(busybox-static)
command -v ping >/dev/null || need_apt+=(iputils-ping)
command -v flock >/dev/null || need_apt+=(util-linux)
command -v mksquashfs >/dev/null || need_apt+=(squashfs-tools)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing ${need_apt[*]}"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${need_apt[@]}"; } >"$CACHE/apt.log" 2>&1 ||
    skip "cannot install ${need_apt[*]} with apt-get (see $CACHE/apt.log)"
fi
command -v qemu-system-x86_64 >/dev/null || skip "no qemu-system-x86_64"

# --- the project's own venv (the guest uses this very .venv through the shared repo)
if [ ! -x .venv/bin/python ] || [ ! -x .venv/bin/testbed ]; then
  say "no .venv: running scripts/setup.sh"
  bash scripts/setup.sh || die "scripts/setup.sh failed"
fi

# --- virtme-ng in a tool venv of its own (kept out of the project's dependencies)
TOOLS=$CACHE/tools
if ! "$TOOLS/bin/vng" --version 2>/dev/null | grep -q "$VIRTME_NG_VERSION"; then
  say "installing virtme-ng $VIRTME_NG_VERSION into $TOOLS"
  rm -rf "$TOOLS"
  { python3 -m venv "$TOOLS" &&
    "$TOOLS/bin/pip" install -q "virtme-ng==$VIRTME_NG_VERSION"; } >"$CACHE/pip.log" 2>&1 ||
    skip "cannot install virtme-ng $VIRTME_NG_VERSION from PyPI (see $CACHE/pip.log)"
fi

# --- the Python stack as read-only squashfs images on virtio-blk disks. Over 9p every
# stat/open is a round trip through QEMU's I/O thread (~2 ms under TCG, far more when both
# host cores run vCPUs), so imports crawl and node processes miss their 30 s startup
# limit; from a disk image the guest's own page cache serves them. One image per
# directory (the interpreter's stdlib, the venv's site-packages), rebuilt when a file in
# it changes; the guest bind-mounts each over the same path (VM_PYIMG=0: plain 9p).
pyimg_opts=()
PYMAP=$CACHE/pyimg.map.$$
: >"$PYMAP"
if [ "${VM_PYIMG:-1}" != 0 ]; then
  mkdir -p "$CACHE/pyimg"
  # every clone path gets images of its own: drop those no run has used for 3 days
  find "$CACHE/pyimg" -name '*.sqsh' -mtime +3 -delete 2>/dev/null
  n=0
  while read -r dir; do
    [ -d "$dir" ] || continue
    tag=$(printf '%s' "$dir" | sha1sum | cut -c1-12)
    key=$(cd "$dir" && find . -printf '%P %s %T@\n' | sort | sha1sum | cut -c1-12)
    img=$CACHE/pyimg/$tag-$key.sqsh
    if [ ! -s "$img" ]; then
      say "building $img from $dir"
      rm -f "$CACHE/pyimg/$tag"-*.sqsh
      mksquashfs "$dir" "$img.tmp" -noappend -comp lz4 -no-xattrs -quiet -no-progress \
        >"$CACHE/pyimg/build.log" 2>&1 && mv "$img.tmp" "$img" ||
        { rm -f "$img.tmp"; say "mksquashfs failed (see $CACHE/pyimg/build.log); using 9p"; continue; }
    fi
    touch "$img"
    pyimg_opts+=(-drive "file=$img,if=none,id=pfpy$n,format=raw,readonly=on"
                 -device "virtio-blk-pci,drive=pfpy$n,serial=pfpy$n")
    printf 'pfpy%s %s\n' "$n" "$dir" >>"$PYMAP"
    n=$((n + 1))
  done < <(.venv/bin/python -c 'import sysconfig; p = sysconfig.get_paths()
print(p["stdlib"]); print(p["purelib"])' | awk '!seen[$0]++')
fi

# --- guest kernel: a Debian linux-image package, unpacked (never installed: no postinst,
# no initramfs-tools, no bootloader, /boot and /lib/modules of the host untouched)
pkg=${VM_KERNEL_PKG:-}
if [ -z "$pkg" ]; then
  cached=$(ls -d "$CACHE"/linux-image-*-amd64 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$cached" ]; then
    pkg=$(basename "$cached")
  else
    resolve() { apt-cache depends linux-image-amd64 2>/dev/null |
                awk '/Depends: linux-image-[0-9]/ { print $2; exit }'; }
    pkg=$(resolve)
    [ -n "$pkg" ] || { apt-get update -qq >/dev/null 2>&1; pkg=$(resolve); }
    [ -n "$pkg" ] || skip "apt knows no linux-image-amd64 (no Debian kernel to boot)"
  fi
fi
KDIR=$CACHE/$pkg
if [ ! -d "$KDIR/lib/modules" ]; then
  say "fetching $pkg"
  mkdir -p "$CACHE/debs" && chown _apt "$CACHE/debs" 2>/dev/null
  (cd "$CACHE/debs" && rm -f "$pkg"_*.deb && apt-get download -q "$pkg") >"$CACHE/download.log" 2>&1 ||
    skip "cannot download $pkg (see $CACHE/download.log)"
  rm -rf "$KDIR.tmp" && mkdir -p "$KDIR.tmp" &&
    dpkg-deb -x "$CACHE/debs/$pkg"_*.deb "$KDIR.tmp" || die "cannot unpack $pkg"
  kver=$(ls "$KDIR.tmp/lib/modules")
  depmod -b "$KDIR.tmp" "$kver" || die "depmod failed for $pkg"
  mv "$KDIR.tmp" "$KDIR" && rm -f "$CACHE/debs/$pkg"_*.deb
fi
kver=$(ls "$KDIR/lib/modules")
KIMG=$KDIR/boot/vmlinuz-$kver
[ -r "$KIMG" ] || die "no kernel image $KIMG"
find "$KDIR/lib/modules/$kver" -name 'sch_netem.ko*' | grep -q . || die "$pkg has no sch_netem module"
flock -u 9
T_SETUP=$(elapsed "$T0")

# --- run directory (inside the repo, which the guest sees read-write at the same path)
RUN=${VM_OUT:-$REPO/.vm/runs/$(date +%Y%m%d-%H%M%S)-$$}
mkdir -p "$RUN" || die "cannot create $RUN"
RUN=$(cd "$RUN" && pwd -P)
rwdirs=(--rwdir "$REPO")
case "$RUN/" in "$REPO"/*) ;; *) rwdirs+=(--rwdir "$RUN") ;; esac
mv "$PYMAP" "$RUN/pyimg.map"
# the guest starts with a fresh environment: hand over its switches explicitly
guest_cmd=$(printf '%q ' env "VM_SMOKE=${VM_SMOKE:-1}" "VM_RTT=${VM_RTT:-1}" "VM_BENCH=${VM_BENCH:-0}" \
  "VM_ALLOW_SKIP=${VM_ALLOW_SKIP:-0}" "VM_MAX_SKIPS=${VM_MAX_SKIPS:-2}" \
  bash "$REPO/scripts/vm-guest.sh" "$RUN" "$@")
# Bytecode up front: every file the guest stats or reads crosses 9p (about 2 ms each).
.venv/bin/python -m compileall -q testbed nodes protocols tests scripts >/dev/null 2>&1
# Which test files hold the netem tests, collected here: the guest then imports only
# those (collecting the whole suite under TCG took 3-10 minutes beside a busy host).
# An empty list (a collection error) leaves the guest to collect everything itself.
.venv/bin/python -m pytest -m netem --collect-only -q -p no:cacheprovider "$@" 2>/dev/null |
  awk -F:: '/::/ { print $1 }' | sort -u >"$RUN/netem-files.txt"
say "netem tests in $(wc -l <"$RUN/netem-files.txt") files (collected on the host)"
# The guest marks its TSC unstable and falls back to the emulated HPET, which makes every
# clock_gettime a syscall (imports were ~3x slower); mitigations cost a lot under TCG.
APPEND="tsc=reliable clocksource=tsc mitigations=off ${VM_APPEND:-}"

say "booting $kver under QEMU (TCG, $CPUS cpus, $MEMORY); run directory $RUN"
T_BOOT=$(date +%s.%N)
PATH=$TOOLS/bin:$PATH timeout --kill-after=30 "$TIMEOUT" \
  "$TOOLS/bin/vng" --verbose --run "$KIMG" --disable-kvm --cpus "$CPUS" --memory "$MEMORY" \
  "${rwdirs[@]}" --append "$APPEND" --qemu-opts="-pidfile $RUN/qemu.pid ${pyimg_opts[*]}" --exec "$guest_cmd" \
  </dev/null >"$RUN/console.log" 2>&1 &
vng_pid=$!
tail_pid=
cleanup() {
  [ -n "$tail_pid" ] && kill "$tail_pid" 2>/dev/null
  if [ -s "$RUN/qemu.pid" ]; then  # never leave a guest running
    qpid=$(cat "$RUN/qemu.pid")
    case "$(cat "/proc/$qpid/comm" 2>/dev/null)" in qemu*) kill "$qpid" 2>/dev/null ;; esac
  fi
  kill "$vng_pid" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM
T_STARTED=
while kill -0 "$vng_pid" 2>/dev/null; do
  if [ -z "$T_STARTED" ] && [ -e "$RUN/started" ]; then
    T_STARTED=$(elapsed "$T_BOOT")
    say "guest script started after ${T_STARTED}s"
    tail -n +1 -F "$RUN/guest.log" 2>/dev/null &
    tail_pid=$!
  fi
  sleep 0.2
done
wait "$vng_pid"
vng_rc=$?
sleep 0.5
T_TOTAL=$(elapsed "$T0")
cleanup
trap - EXIT

if [ -z "$T_STARTED" ]; then
  grep -iE 'panic|error|fail' "$RUN/console.log" | tail -n 5 >&2
  skip "guest did not reach its script (vng exit $vng_rc; console: $RUN/console.log)"
fi
{
  printf 'host_setup\t%s\n' "$T_SETUP"
  printf 'host_boot_to_script\t%s\n' "$T_STARTED"
  printf 'host_total\t%s\n' "$T_TOTAL"
} >>"$RUN/timings.tsv"
say "timings (seconds):"
column -t "$RUN/timings.tsv" 2>/dev/null || cat "$RUN/timings.tsv"
if [ ! -s "$RUN/status" ]; then
  say "guest ended without a status (vng exit $vng_rc; timeout ${TIMEOUT}s?); see $RUN/console.log"
  exit 1
fi
read -r p s m t _ < <(sed -E 's/[a-z]+=//g' "$RUN/status")
say "status: $(cat "$RUN/status"); artifacts in $RUN"
[ "$p" = 0 ] || exit "$p"
[ "$s" = 0 ] && [ "$m" = 0 ] && [ "${t:-1}" = 0 ] || exit 1
exit 0
