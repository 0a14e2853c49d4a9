"""What each kind of ``testbed faults`` must show, and whether its trials proved it.

Rules of this module:

1. Every kind must lose, repeat and wrongly judge no episode (``wrongly judged``:
   testbed/tools/fault_inject.py) and leave no process, namespace or file behind; every
   abort must give one of the kind's reasons (:data:`EXPECTED`).
2. Beyond that, per kind: faults that must abort their episode abort every one
   (:data:`MUST_ABORT`, and ``disk_full``); a frozen emulator flags every episode it
   let complete (:data:`MUST_DISTURB`, counted as wrongly judged otherwise); TCP hides duplicates and reordering, so
   those complete every episode; a killed controller's campaign ends with every episode
   exactly once; a flood is survived within the node's byte caps: the victim closed the
   attacker's connections, its peak resident growth stays below the cap that bounds
   the attack plus :data:`SLACK_MIB`, and :data:`RETURNED_MIB` after the flood its
   resident memory is back within that much of where it started.
3. :func:`failures` names every criterion a kind's result missed; a kind is proved when
   there is none.
"""

from __future__ import annotations

from typing import Any

from nodes.limits import Limits

#: The abort reasons a kind may give (substrings). A link fault or a flood may also
#: just let the episode complete (TCP recovers, the policy blocks, the node keeps
#: serving); if it aborts, the reason must be the network's, never a node's.
NETWORK_REASONS = ("RpcTimeout", "PeerUnavailable", "RemoteProtocolError", "IntegrityError")
EXPECTED: dict[str, tuple[str, ...]] = {
    "node_kill": ("NodeDied",), "node_stop": ("node_unresponsive",),
    "node_freeze": ("node_unresponsive",), "disk_full": ("disk is full",),
    "controller_kill": (), "controller_kill_shaped": (),
    "partition": NETWORK_REASONS, "corrupt": NETWORK_REASONS,
    "duplicate": NETWORK_REASONS, "reorder": NETWORK_REASONS,
    "emulator_freeze": NETWORK_REASONS, "store_overwrite": ("NodeDied", "store_failed"),
    "unread_flood": NETWORK_REASONS, "preauth_flood": NETWORK_REASONS,
    "many_source_flood": NETWORK_REASONS, "junk_flood": NETWORK_REASONS}
#: Faults that must abort their episode: a completed one carries the fault's time.
MUST_ABORT = ("node_kill", "node_stop", "node_freeze", "store_overwrite")
#: Faults whose completed episodes must be flagged ``disturbed`` (else wrongly judged).
MUST_DISTURB = ("emulator_freeze",)
CONTROLLER_KINDS = ("controller_kill", "controller_kill_shaped")
FLOOD_KINDS = ("unread_flood", "preauth_flood", "many_source_flood", "junk_flood")
SLACK_MIB = 48.0
RETURNED_MIB = 64.0
MIB = 1024 * 1024


def flood_cap_mib(kind: str, limits: Limits | None = None) -> float:
    """The node limit that bounds a flood kind's attack (one connection, one source,
    or the whole node for floods from many sources or connections)."""
    limits = limits or Limits()
    caps = {"unread_flood": limits.answer_bytes_per_connection,
            "preauth_flood": limits.pre_auth_bytes_per_source}
    return caps.get(kind, limits.held_bytes_per_node) / MIB


def failures(result: Any) -> list[str]:
    """The criteria (rules 1-2) that ``result`` (a ``KindResult``) did not meet."""
    r = result
    missed: list[str] = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            missed.append(what)

    need(r.lost == 0 and r.duplicated == 0, "no episode lost or run twice")
    need(r.wrongly_judged == 0, "no episode wrongly judged")
    need(r.processes_left == 0 and r.namespaces_left == 0 and r.files_left == 0,
         "nothing left behind")
    need(r.aborted_right_reason == r.aborted, "every abort for one of the kind's reasons")
    if r.kind in (*MUST_ABORT, "disk_full"):
        need(r.aborted == r.trials, "every episode aborted")
    if r.kind in ("duplicate", "reorder"):
        need(r.completed == r.trials, "every episode completed")
    if r.kind in CONTROLLER_KINDS:
        need(r.completed == r.episodes, "every episode completed exactly once")
    if r.kind in FLOOD_KINDS:
        need(r.attacks_closed >= r.trials, "the victim closed the attacker's connections")
        need(r.victim_peak_mib is not None
             and r.victim_peak_mib <= flood_cap_mib(r.kind) + SLACK_MIB,
             f"peak growth within the cap ({flood_cap_mib(r.kind):g} MiB) "
             f"+ {SLACK_MIB:g} MiB")
        need(r.victim_after_mib is not None and r.victim_after_mib <= RETURNED_MIB,
             f"memory back within {RETURNED_MIB:g} MiB after the flood")
    return missed
