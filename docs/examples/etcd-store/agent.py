"""An agent that keeps its plans in etcd: naive or check-before-act.

Plain Python, standard library only (etcdapi.py: etcd's HTTP/JSON gateway), no testbed
imports. It follows the testbed's seeded schedule ($TESTBED_SCHEDULE,
docs/own-programs.md) against the etcd member on the host named on the command line.
Key ``k`` of the schedule is ``k/k`` in etcd; its version is its mod_revision.

- update (this host owns the key): put a new value (naming this host as its owner);
- plan (this host plans the action): read the inputs' mod_revisions in one transaction,
  derive the plan from them (a ``derive``) and keep it, in memory and as
  ``plan/<action>`` in etcd for an executor on another host;
- act (this host executes it), by the arm ($TESTBED_POLICY or the second argument):
  - ``naive``: act on the plan it holds: put ``done/<action>`` at once;
  - ``check``: one transaction puts ``done/<action>`` only if every input's
    mod_revision is still the plan's; if not, etcd returns the revisions now, the agent
    re-derives from them (a new ``derive``) and tries again.

Every action goes to $TESTBED_METRICS (``stall_ms``: from the act's start to its issue)
and, with the plan it executed, to $TESTBED_HISTORY, so the testbed judges each act
from the versions it was derived from, not from what this agent believes.
"""

from __future__ import annotations

import json
import os
import sys
import time

from etcdapi import Etcd

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


def act_checked(store: Etcd, history: History, action: str, plan: str,
                inputs: dict[str, str], me: str) -> tuple[int, int]:
    """Compare-and-put until it succeeds; returns (issue ns, replans)."""
    replans = 0
    while True:
        start = issued = time.monotonic_ns()
        done, now = store.put_if({f"k/{k}": v for k, v in inputs.items()},
                                 f"done/{action}", json.dumps({"by": me, "plan": plan}))
        if done:
            # etcd applied the put only while every input was at the plan's revision,
            # and revisions only grow: the plan was current when the request left
            history.emit({"type": "check", "t_ns": issued, "start_t_ns": start,
                          "action": action})
            history.emit({"type": "act", "t_ns": issued, "action": action, "plan": plan,
                          "replans": replans})
            return issued, replans
        replans += 1
        plan = f"{action}/{me}/r{replans}"
        inputs = {k.removeprefix("k/"): v for k, v in now.items()}
        history.emit({"type": "derive", "t_ns": time.monotonic_ns(), "plan": plan,
                      "inputs": inputs})


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
    store = Etcd(host)
    history = History(me)
    plans: dict[str, tuple[str, dict[str, str]]] = {}
    with open(os.environ["TESTBED_METRICS"], "a") as metrics:
        for event in events:
            due_ns = t0_ns + int(event["t_ms"] * 1e6)
            delay = (due_ns - time.monotonic_ns()) / 1e9
            if delay > 0:
                time.sleep(delay)
            if event["kind"] == "update":
                store.put(f"k/{event['key']}", json.dumps(
                    {"owner": me, "content": "x" * int(event["size"])}))
            elif event["kind"] == "plan":
                keys = list(event["keys"])
                got = store.revisions([f"k/{k}" for k in keys])
                plan = f"{event['action']}/{me}"
                inputs = {k: got[f"k/{k}"] for k in keys}
                history.emit({"type": "derive", "t_ns": time.monotonic_ns(), "plan": plan,
                              "inputs": inputs})
                plans[event["action"]] = (plan, inputs)
                store.put(f"plan/{event['action']}", json.dumps({"plan": plan, "inputs": inputs}))
            else:
                action = event["action"]
                if action not in plans:  # planned elsewhere: the plan travels in etcd
                    raw = store.get(f"plan/{action}")
                    deadline = time.monotonic() + PLAN_WAIT_S
                    while raw is None and time.monotonic() < deadline:  # the planner is late
                        time.sleep(0.01)
                        raw = store.get(f"plan/{action}")
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
                    issued = time.monotonic_ns()
                    store.put(f"done/{action}", json.dumps({"by": me, "plan": plan}))
                    history.emit({"type": "act", "t_ns": issued, "action": action,
                                  "plan": plan})
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
