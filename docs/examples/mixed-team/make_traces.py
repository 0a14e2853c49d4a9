"""Write the example's own traces (seeded, so the files are reproducible).

python3 make_traces.py   # rewrites traces/field-lte.up, .down and field-delay.txt

A Mahimahi trace holds one line per chance to send a 1500-byte packet, in ms since
the trace start; here the capacity follows a seeded random walk per second (uplink
1-5 Mbit/s, downlink 3-9 Mbit/s), the uplink has no capacity at all from 12 to 14 s
(an outage), and the trace lasts 30 s (replay wraps around after that). The delay trace
holds `<ms> <one-way delay ms>` steps: 20 ms, then 70 ms from 8 s to 12 s.
"""

from __future__ import annotations

import random
from pathlib import Path

HERE = Path(__file__).resolve().parent / "traces"


def rates(seed: int, low: float, high: float, seconds: int) -> list[float]:
    rng = random.Random(seed)
    rate = (low + high) / 2
    out = []
    for _ in range(seconds):
        rate = min(high, max(low, rate + rng.uniform(-1.0, 1.0)))
        out.append(rate)
    return out


def stamps(mbit_per_s: list[float]) -> list[int]:
    out: list[int] = []
    credit = 0.0
    for ms in range(1, 1000 * len(mbit_per_s) + 1):
        credit += mbit_per_s[(ms - 1) // 1000] / 12.0  # 12 Mbit/s = one packet per ms
        while credit >= 1.0:
            out.append(ms)
            credit -= 1.0
    if not out or out[-1] != 1000 * len(mbit_per_s):
        out.append(1000 * len(mbit_per_s))  # the last stamp is the period
    return out


def main() -> None:
    HERE.mkdir(exist_ok=True)
    up = rates(1, 1.0, 5.0, 30)
    up[12] = up[13] = 0.0  # two seconds without capacity
    down = rates(2, 3.0, 9.0, 30)
    (HERE / "field-lte.up").write_text("".join(f"{s}\n" for s in stamps(up)))
    (HERE / "field-lte.down").write_text("".join(f"{s}\n" for s in stamps(down)))
    (HERE / "field-delay.txt").write_text(
        "# ms  one-way delay ms (per crossing of this host's link)\n"
        "0 20\n8000 70\n12000 20\n")


if __name__ == "__main__":
    main()
