"""The history of an episode on the testbed's own nodes, from what the run records anyway.

Rules (docs/history.md, "The testbed's own nodes"):

1. Nothing is added on the action path: after the last event the controller reads every
   agent's ``head_log`` and ``install_log`` (every stored record with its install
   time) and has every ``act`` reply; the history is derived from those alone.
2. ``write``: each head change in an owner's ``head_log`` (version = record ID in hex).
   ``install``: each record of a shared key stored at a host other than its owner.
3. ``derive``: each plan record at the host that made it (its author), at its install
   time there; its inputs are the shared-key records its ancestry reaches first (a
   review in between is walked through), as the executor's frontier reconstructs them.
   A replan is a plan record made by the executor, so it is a ``derive`` there.
4. ``check``: the final head round of an action's validation, from when it was sent
   (``last_head_round_t_ns``) to when its answer returned (``last_head_read_t_ns``).
   ``act``: each released action at its ``issue_t_ns``, executing its issued root,
   with the action's declared keys. A blocked action issues nothing, so it has no ``act``.
5. ``rpc`` (optional): each remote call a node sent (``rpc_log``), at the instant its
   answer returned, from when it was sent; ``served_t_ns`` is when the peer answered
   it: the first request the peer recorded from this caller for this method within
   the call's interval (left out when none is).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from testbed.campaign.workload import Act

#: Order of events at the same instant on one host (a write before what reads it).
_RANK = {"write": 0, "install": 1, "read": 1, "derive": 2, "check": 3, "act": 4, "rpc": 5}


def _inputs(root: bytes, records: Mapping[bytes, tuple[str, Sequence[bytes]]],
            shared: Mapping[str, str]) -> dict[str, str]:
    """The shared-key versions the ancestry of ``root`` reaches first (rule 3); a key
    reached at two versions is left out (the plan has no single input for it)."""
    found: dict[str, set[bytes]] = {}
    queue, seen = [root], set()
    while queue:
        rid = queue.pop()
        if rid in seen or rid not in records:
            continue
        seen.add(rid)
        key, parents = records[rid]
        if key in shared and rid != root:
            found.setdefault(key, set()).add(rid)
        else:
            queue.extend(parents)
    return {k: next(iter(v)).hex() for k, v in sorted(found.items()) if len(v) == 1}


def rpc_events(rpc_logs: Mapping[str, Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each host's ``rpc`` events from the nodes' ``rpc_log`` replies (rule 5)."""
    served: dict[tuple[str, str, str], list[int]] = {}
    for server, log in rpc_logs.items():
        for caller, method, t_ns in log.get("served") or ():
            served.setdefault((server, str(caller), str(method)), []).append(int(t_ns))
    for instants in served.values():
        instants.sort()
    used: set[tuple[str, str, str, int]] = set()
    out: dict[str, list[dict[str, Any]]] = {}
    for host, log in rpc_logs.items():
        for peer, method, sent, returned in sorted(log.get("calls") or (),
                                                   key=lambda c: int(c[2])):
            event: dict[str, Any] = {"type": "rpc", "t_ns": int(returned),
                                     "start_t_ns": int(sent), "peer": str(peer),
                                     "method": str(method)}
            for t in served.get((str(peer), host, str(method)), ()):
                mark = (str(peer), host, str(method), t)
                if int(sent) <= t <= int(returned) and mark not in used:
                    used.add(mark)
                    event["served_t_ns"] = t
                    break
            out.setdefault(host, []).append(event)
    return out


def node_history(*, owners: Mapping[str, str],
                 head_logs: Mapping[str, Sequence[Sequence[Any]]],
                 install_logs: Mapping[str, Sequence[Sequence[Any]]],
                 acts: Sequence[tuple[Act, Mapping[str, Any]]],
                 rpc_logs: Mapping[str, Mapping[str, Any]] | None = None,
                 ) -> dict[str, list[dict[str, Any]]]:
    """Each host's history events (plain dicts, in time order) for one episode."""
    out: dict[str, list[dict[str, Any]]] = {h: [] for h in (*head_logs, *install_logs)}
    for host, events in rpc_events(rpc_logs or {}).items():
        out.setdefault(host, []).extend(events)
    for host, log in head_logs.items():
        for key, seq, rid, t_ns in log:
            out[host].append({"type": "write", "t_ns": int(t_ns), "key": str(key),
                              "version": bytes(rid).hex(), "owner": host, "seq": int(seq)})
    records: dict[bytes, tuple[str, Sequence[bytes]]] = {}
    for log in install_logs.values():
        for rid, key, _owner, _seq, parents, _rtype, _author, _t in log:
            records[bytes(rid)] = (str(key), [bytes(p) for p in parents])
    for host, log in install_logs.items():
        for rid, key, owner, seq, _parents, rtype, author, t_ns in log:
            if key in owners and owner != host:
                out[host].append({"type": "install", "t_ns": int(t_ns), "key": str(key),
                                  "version": bytes(rid).hex(), "seq": int(seq)})
            elif rtype == "plan" and author == host:
                out[host].append({"type": "derive", "t_ns": int(t_ns),
                                  "plan": bytes(rid).hex(), "record_key": str(key),
                                  "inputs": _inputs(bytes(rid), records, owners)})
    for act, reply in acts:
        host = act.executor
        start, end = int(reply.get("last_head_round_t_ns") or 0), \
            int(reply.get("last_head_read_t_ns") or 0)
        if end:
            out.setdefault(host, []).append({"type": "check", "t_ns": end, "start_t_ns": start,
                                             "action": act.action})
        if reply["outcome"] != "released":
            continue
        roots = [bytes(r) for r in reply.get("issued_roots") or ()]
        issue = int(reply["issue_t_ns"])
        if len(roots) == 1:
            plan = roots[0].hex()
        else:  # several roots: their union is the plan (as the frontier reconstructs it)
            plan = f"{act.action}/issued"
            merged: dict[str, str] = {}
            for root in roots:
                merged.update(_inputs(root, records, owners))
            out.setdefault(host, []).append({"type": "derive", "t_ns": issue, "plan": plan,
                                             "inputs": merged,
                                             "roots": [r.hex() for r in roots]})
        out.setdefault(host, []).append({
            "type": "act", "t_ns": issue, "action": act.action, "plan": plan,
            "keys": list(act.keys), "replans": int(reply.get("replans") or 0),
            "effect_t_ns": int(reply.get("effect_t_ns") or issue)})
    for events in out.values():
        events.sort(key=lambda e: (e["t_ns"], _RANK[e["type"]]))
    return out
