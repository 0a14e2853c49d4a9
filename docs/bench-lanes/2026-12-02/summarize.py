"""Summarize the runs of pairs2.sh: one row per run (host CPU from /proc/stat, steal
apart; per-process CPU by kind; emulator lateness; paired stall against the 1-lane run
of the same revision) and every episode's stall, into runs.json."""
import json, re, sys
from pathlib import Path
import pandas as pd
here = Path(sys.argv[1])
runs = {}
for txt in sorted(here.glob("r-*.txt")):
    name = txt.stem[2:]
    text = txt.read_text()
    row = {"wall_s": float(re.search(r"wall ([\d.]+)", text).group(1))}
    m = re.search(r"busy_excl_steal s ([\d.]+) steal ([\d.]+)", text)
    row["host_busy_cpu_s"], row["host_steal_s"] = float(m.group(1)), float(m.group(2))
    row["process_cpu_s"] = {}
    for line in text.splitlines():
        m2 = re.match(r"\s+([\d.]+) s\s+x(\d+)\s+(.*)$", line)
        if m2:
            kind = m2.group(3).strip() or "(exited before its command line was read)"
            row["process_cpu_s"][kind] = round(row["process_cpu_s"].get(kind, 0) + float(m2.group(1)), 2)
    ep = pd.read_parquet(here / f"r-{name}.parquet")
    row["episodes"] = len(ep)
    row["aborted"] = int(ep["aborted"].sum())
    row["episodes_per_hour"] = round(len(ep) / row["wall_s"] * 3600, 1)
    row["host_cpu_s_per_episode"] = round(row["host_busy_cpu_s"] / len(ep), 2)
    late = ep["emulator_late_p99_ms"].dropna()
    row["late_p99_ms_median"] = round(float(late.median()), 3)
    row["late_p99_ms_max"] = round(float(late.max()), 3)
    row["stall_ms_per_action"] = {e: round(float(s), 3) for e, s in
                                  zip(ep["episode"], ep["stall_ms_per_action"])}
    runs[name] = row
for name, row in runs.items():
    ref = runs.get(("base1" if name.startswith("base") else "new1"))
    if ref is None or name.endswith("1") and name[:-1] in ("base", "new"):
        continue
    ratios = [row["stall_ms_per_action"][e] / ref["stall_ms_per_action"][e]
              for e in row["stall_ms_per_action"] if e in ref["stall_ms_per_action"]]
    s = pd.Series(ratios)
    row["paired_stall_ratio"] = {"median": round(float(s.median()), 4), "min": round(float(s.min()), 4),
                                 "max": round(float(s.max()), 4), "pairs": len(s)}
(here / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
for name, row in runs.items():
    print(f"{name:10s} wall {row['wall_s']:6.1f} ep/h {row['episodes_per_hour']:7.1f} cpu/ep {row['host_cpu_s_per_episode']:5.2f} steal {row['host_steal_s']:5.1f} late {row['late_p99_ms_median']:.3f}/{row['late_p99_ms_max']:.3f} ratio {row.get('paired_stall_ratio')}")
