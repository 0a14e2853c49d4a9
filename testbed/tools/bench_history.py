"""``testbed bench history``: the history checker's throughput and memory.

A seeded synthetic history of N events over 4 hosts and 64 keys (40% writes, 30%
installs, the rest derive/check/act triples, each action issued a few steps after its
plan was derived, so some are stale) is generated as the files' text, then parsed and
judged in this process. Reported: events per second of parsing, of checking and of
both, the process's peak resident memory after generating and after judging, and the
verdict counts.
"""

from __future__ import annotations

import json
import random
import resource
import time
from collections import deque
from typing import Any

from protocols.history import parse_history
from protocols.history_check import STALE_IN_WINDOW, check_history

HOSTS = tuple(f"a{i}" for i in range(4))
KEYS = tuple(f"k{i:03d}" for i in range(64))
#: Steps between a plan's derive and its act (a write in between makes it stale).
ACT_LAG_STEPS = 4


def synthetic_history(events: int, seed: int = 1) -> dict[str, str]:
    """Host -> file text of a history with about ``events`` events."""
    rng = random.Random(seed)
    owner = {k: HOSTS[i % len(HOSTS)] for i, k in enumerate(KEYS)}
    version = dict.fromkeys(KEYS, 0)
    lines: dict[str, list[str]] = {h: [json.dumps({"history": 1, "host": h})] for h in HOSTS}
    pending: deque[tuple[str, int, int]] = deque()  # (host, plan number, derived at step)
    t, n, plans = 0, 0, 0

    def emit(host: str, event: dict[str, Any]) -> None:
        nonlocal n
        lines[host].append(json.dumps(event))
        n += 1

    for k in KEYS:
        t += 1
        emit(owner[k], {"type": "write", "t_ns": t, "key": k, "version": f"{k}.0",
                        "owner": owner[k]})
    step = 0
    while n < events:
        step += 1
        t += 10
        while pending and step - pending[0][2] >= ACT_LAG_STEPS:
            host, plan, _ = pending.popleft()
            emit(host, {"type": "check", "t_ns": t, "start_t_ns": t - 5, "action": f"x{plan}"})
            emit(host, {"type": "act", "t_ns": t, "action": f"x{plan}", "plan": f"p{plan}"})
        r = rng.random()
        if r < 0.4:
            k = rng.choice(KEYS)
            version[k] += 1
            emit(owner[k], {"type": "write", "t_ns": t, "key": k,
                            "version": f"{k}.{version[k]}", "owner": owner[k]})
        elif r < 0.7:
            k = rng.choice(KEYS)
            emit(rng.choice(HOSTS), {"type": "install", "t_ns": t, "key": k,
                                     "version": f"{k}.{version[k]}"})
        else:
            host = rng.choice(HOSTS)
            inputs = {k: f"{k}.{version[k]}" for k in rng.sample(KEYS, 3)}
            emit(host, {"type": "derive", "t_ns": t, "plan": f"p{plans}", "inputs": inputs})
            pending.append((host, plans, step))
            plans += 1
    return {h: "\n".join(v) + "\n" for h, v in lines.items()}


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_history(events: int) -> dict[str, Any]:
    texts = synthetic_history(events)
    count = sum(t.count("\n") - 1 for t in texts.values())
    generated_mib = _peak_mib()
    started = time.perf_counter()
    histories = [parse_history(text, f"{host}.jsonl") for host, text in texts.items()]
    parsed = time.perf_counter()
    result = check_history(histories)
    checked = time.perf_counter()
    anomalies = result.anomalies
    return {
        "events": count, "actions": len(result.verdicts),
        "stale": len(anomalies),
        "stale_in_window": sum(1 for v in anomalies if v.status == STALE_IN_WINDOW),
        "fresh_memory_stale_plan": sum(1 for v in anomalies if v.fresh_memory_stale_plan),
        "parse_s": round(parsed - started, 3), "check_s": round(checked - parsed, 3),
        "parse_events_per_s": round(count / (parsed - started)),
        "check_events_per_s": round(count / (checked - parsed)),
        "events_per_s": round(count / (checked - started)),
        "peak_rss_generated_mib": round(generated_mib), "peak_rss_mib": round(_peak_mib()),
    }
