"""Is Python-level timing usable inside the VM lane's guest? (run as root, in the guest)

Two namespaces `<prefix>a` / `<prefix>b` joined by one veth pair (198.18.100.1/.2, the
benchmarking range), first without any qdisc, then with `netem delay 20ms` on a's end
(so the round trip should be 20 ms plus the guest's own overhead). For each setting it
measures UDP echo round trips from Python (and ICMP ones with ping(8), where installed),
plus how late `time.sleep(0.01)` and `trio.sleep_until` on a 10 ms grid (the netem
backend's rate-change interval) wake up. Prints a short summary and writes JSON.
Everything is removed in `finally`. Usage: vm_rtt_probe.py [--out FILE] [--count N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import trio
from pyroute2 import IPRoute
from pyroute2 import netns as pr_netns

from testbed.host.kernel import socket_in_netns

ADDR_A, ADDR_B = "198.18.100.1", "198.18.100.2"
DELAY_MS = 20


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "min": round(ordered[0], 3),
        "median": round(statistics.median(ordered), 3),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        "max": round(ordered[-1], 3),
    }


def build(prefix: str) -> tuple[str, str]:
    ns_a, ns_b = f"{prefix}a", f"{prefix}b"
    for name in (ns_a, ns_b):
        pr_netns.create(name)
    with IPRoute(netns=ns_a) as ipr:
        ipr.link("add", ifname=f"{prefix}x", kind="veth", peer=f"{prefix}y")
        peer = ipr.link_lookup(ifname=f"{prefix}y")[0]
        ipr.link("set", index=peer, net_ns_fd=ns_b)
    for name, ifname, addr in ((ns_a, f"{prefix}x", ADDR_A), (ns_b, f"{prefix}y", ADDR_B)):
        with IPRoute(netns=name) as ipr:
            for dev in ("lo", ifname):
                ipr.link("set", index=ipr.link_lookup(ifname=dev)[0], state="up")
            ipr.addr("add", index=ipr.link_lookup(ifname=ifname)[0], address=addr, prefixlen=24)
    return ns_a, ns_b


def set_delay(ns: str, ifname: str, delay_ms: int) -> None:
    with IPRoute(netns=ns) as ipr:
        ipr.tc("add", "netem", ipr.link_lookup(ifname=ifname)[0], handle="1:0",
               delay=delay_ms * 1000, limit=1000)


def udp_rtts(ns_a: str, ns_b: str, count: int) -> list[float]:
    server = socket_in_netns(ns_b, socket.AF_INET, socket.SOCK_DGRAM)
    client = socket_in_netns(ns_a, socket.AF_INET, socket.SOCK_DGRAM)
    server.bind((ADDR_B, 7100))
    server.settimeout(10)
    client.settimeout(10)
    stop = threading.Event()

    def echo() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                data, peer = server.recvfrom(2048)
                server.sendto(data, peer)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    rtts: list[float] = []
    try:
        for i in range(count):
            t = time.monotonic()
            client.sendto(i.to_bytes(4, "big") * 16, (ADDR_B, 7100))
            client.recvfrom(2048)
            rtts.append((time.monotonic() - t) * 1000)
            time.sleep(0.02)
    finally:
        stop.set()
        with contextlib.suppress(OSError):  # wakes the echo thread's recvfrom at once
            client.sendto(b"", (ADDR_B, 7100))
        thread.join()  # no timeout: the sockets close only once it has ended
        client.close()
        server.close()
    return rtts


def icmp_rtts(ns_a: str, count: int) -> list[float] | str:
    ping = shutil.which("ping")
    if ping is None:
        return "ping(8) not installed"
    out = subprocess.run(["ip", "netns", "exec", ns_a, ping, "-n", "-c", str(count), "-i", "0.05",
                          ADDR_B], capture_output=True, text=True, timeout=60, check=False)
    rtts = [float(part.split("=")[1]) for line in out.stdout.splitlines()
            for part in line.split() if part.startswith("time=")]
    return rtts or f"ping failed (exit {out.returncode}): {out.stderr.strip() or out.stdout.strip()}"


def sleep_lateness(count: int) -> list[float]:
    late = []
    for _ in range(count):
        t = time.monotonic()
        time.sleep(0.01)
        late.append((time.monotonic() - t) * 1000 - 10)
    return late


async def trio_grid_lateness(count: int) -> list[float]:
    start = trio.current_time()
    late = []
    for k in range(1, count + 1):
        target = start + k * 0.01
        await trio.sleep_until(target)
        late.append((trio.current_time() - target) * 1000)
    return late


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--count", type=int, default=50)
    args = parser.parse_args()
    prefix = f"tbvr{os.getpid() % 10000}"
    result: dict[str, Any] = {"kernel": os.uname().release, "netem_delay_ms": DELAY_MS}
    ns_a, ns_b = f"{prefix}a", f"{prefix}b"
    try:
        build(prefix)
        for label in ("no_qdisc", f"netem_{DELAY_MS}ms"):
            if label != "no_qdisc":
                set_delay(ns_a, f"{prefix}x", DELAY_MS)
            udp = udp_rtts(ns_a, ns_b, args.count)
            icmp = icmp_rtts(ns_a, args.count)
            result[label] = {"udp_python_ms": summary(udp),
                             "icmp_ping_ms": summary(icmp) if isinstance(icmp, list) else icmp}
    finally:
        for name in (ns_a, ns_b):
            with contextlib.suppress(OSError):
                pr_netns.remove(name)
    result["time_sleep_10ms_lateness_ms"] = summary(sleep_lateness(args.count))
    result["trio_sleep_until_10ms_grid_lateness_ms"] = summary(trio.run(trio_grid_lateness, 200))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
