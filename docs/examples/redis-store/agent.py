"""An agent that keeps its plans in Redis's shared memory: naive or check-before-act.

Plain Python against redis-py, no testbed imports. It follows the testbed's seeded
schedule ($TESTBED_SCHEDULE, docs/own-programs.md) and talks to redis-server on the
host named on the command line. Every key ``k`` of the schedule is ``ver:k`` (its
version, a counter) and ``val:k`` (its content) in the store.

- update (this host owns the key): one atomic script increments ``ver:k``, sets
  ``val:k`` and publishes ``k version owner`` on ``writes`` (the store's recorder makes
  that the history's ``write``);
- plan (this host plans the action): ``MGET`` the versions of the action's keys, derive
  the plan from them (a ``derive``) and keep it, in memory and as ``plan:<action>`` in
  the store for an executor on another host;
- act (this host executes it), by the arm ($TESTBED_POLICY or the second argument):
  - ``naive``: act on the plan it holds: ``RPUSH actions`` at once;
  - ``check``: ``WATCH`` the inputs' versions, ``MGET`` them; if they are not the
    plan's, re-derive from them (a new ``derive``); then ``MULTI``/``RPUSH``/``EXEC``,
    which Redis refuses if a watched version changed meanwhile (then start over).

Every action goes to $TESTBED_METRICS (``stall_ms``: from the act's start to its issue)
and, with the plan it executed, to $TESTBED_HISTORY, so the testbed judges each act
from the versions it was derived from, not from what this agent believes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import redis

WRITE = """
local v = redis.call('INCR', KEYS[1])
redis.call('SET', KEYS[2], ARGV[1])
redis.call('PUBLISH', 'writes', ARGV[2] .. ' ' .. v .. ' ' .. ARGV[3])
return v
"""

PLAN_WAIT_S = 5.0  # how long an executor waits for a plan made on another host


class History:
    """The history lines of this program (nothing without $TESTBED_HISTORY)."""

    def __init__(self, me: str) -> None:
        path = os.environ.get("TESTBED_HISTORY")
        self.file = open(path, "w") if path else None  # noqa: SIM115 (closed in close())
        self.emit({"history": 1, "host": me})

    def emit(self, event: dict[str, object]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(event) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def versions(values: list[Any]) -> list[str]:
    return [v.decode() if v is not None else "0" for v in values]


def act_naive(store: redis.Redis, history: History, action: str, plan: str) -> int:
    issued = time.monotonic_ns()
    store.rpush("actions", action)
    history.emit({"type": "act", "t_ns": issued, "action": action, "plan": plan})
    return issued


def act_checked(store: redis.Redis, history: History, action: str, plan: str,
                inputs: dict[str, str], me: str) -> tuple[int, int]:
    """WATCH/MGET the inputs, re-derive if they moved, EXEC; returns (issue ns, replans)."""
    keys = list(inputs)
    replans = 0
    with store.pipeline() as pipe:
        while True:
            start = time.monotonic_ns()
            pipe.watch(*[f"ver:{k}" for k in keys])  # type: ignore[no-untyped-call]
            now = dict(zip(keys, versions(pipe.mget([f"ver:{k}" for k in keys])), strict=True))
            if now != inputs:  # stale: derive again from what the store holds now
                replans += 1
                plan, inputs = f"{action}/{me}/r{replans}", now
                history.emit({"type": "derive", "t_ns": time.monotonic_ns(), "plan": plan,
                              "inputs": inputs})
            pipe.multi()
            pipe.rpush("actions", action)
            issued = time.monotonic_ns()
            try:
                pipe.execute()
            except redis.WatchError:
                continue  # a watched version changed before EXEC: nothing was done
            history.emit({"type": "check", "t_ns": issued, "start_t_ns": start,
                          "action": action})
            history.emit({"type": "act", "t_ns": issued, "action": action, "plan": plan,
                          "replans": replans})
            return issued, replans


def main() -> int:
    host = sys.argv[1] if len(sys.argv) > 1 else "store"
    arm = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("TESTBED_POLICY", "naive")
    if arm not in ("naive", "check"):
        print(f"agent: arm {arm!r} is not allowed; allowed: naive, check", file=sys.stderr)
        return 2
    me = os.environ["TESTBED_HOST"]
    t0_ns = int(os.environ["TESTBED_T0_NS"])
    with open(os.environ["TESTBED_SCHEDULE"]) as f:
        schedule = json.load(f)
    events = [schedule["events"][i] for i in schedule["by_host"].get(me, [])]
    store = redis.Redis(host=host, port=6379, socket_timeout=30)
    write = store.register_script(WRITE)
    store.ping()
    history = History(me)
    plans: dict[str, tuple[str, dict[str, str]]] = {}
    with open(os.environ["TESTBED_METRICS"], "a") as metrics:
        for event in events:
            due_ns = t0_ns + int(event["t_ms"] * 1e6)
            delay = (due_ns - time.monotonic_ns()) / 1e9
            if delay > 0:
                time.sleep(delay)
            if event["kind"] == "update":
                key = event["key"]
                write(keys=[f"ver:{key}", f"val:{key}"],
                      args=["x" * int(event["size"]), key, me])
            elif event["kind"] == "plan":
                keys = list(event["keys"])
                got = versions(store.mget([f"ver:{k}" for k in keys]))
                plan, inputs = f"{event['action']}/{me}", dict(zip(keys, got, strict=True))
                history.emit({"type": "derive", "t_ns": time.monotonic_ns(), "plan": plan,
                              "inputs": inputs})
                plans[event["action"]] = (plan, inputs)
                store.set(f"plan:{event['action']}", json.dumps({"plan": plan, "inputs": inputs}))
            else:
                action = event["action"]
                if action not in plans:  # planned elsewhere: the plan travels in the store
                    raw = store.get(f"plan:{action}")
                    deadline = time.monotonic() + PLAN_WAIT_S
                    while raw is None and time.monotonic() < deadline:  # the planner is late
                        time.sleep(0.01)
                        raw = store.get(f"plan:{action}")
                    if raw is None:
                        metrics.write(json.dumps({"event": "action", "action": action,
                                                  "ok": False, "reason": "no plan"}) + "\n")
                        continue
                    held = json.loads(raw)
                    plans[action] = (held["plan"], held["inputs"])
                start = time.monotonic_ns()
                plan, inputs = plans[action]
                replans = 0
                if arm == "naive":
                    issued = act_naive(store, history, action, plan)
                else:
                    issued, replans = act_checked(store, history, action, plan, inputs, me)
                line = {"event": "action", "action": action, "ok": True,
                        "stall_ms": (issued - start) / 1e6, "t_ns": start,
                        "late_ms": max(0.0, (start - due_ns) / 1e6), "replans": replans}
                metrics.write(json.dumps(line) + "\n")
                metrics.flush()
        metrics.write(json.dumps({"event": "episode", "events": len(events)}) + "\n")
    history.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
