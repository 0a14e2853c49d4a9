"""Leftover checks that hold while other runs share the host.

Every run records its namespaces in its ledger before it creates them, so a namespace
that no ledger of a live (or foreign) run holds, or a ledger whose owner died, is a
leak; namespaces of other live runs beside a test are never mistaken for one.
"""

from __future__ import annotations

from testbed.errors import UserError
from testbed.host import kernel
from testbed.host import ledger as ledger_mod


def run_objects(owners: set[int] | None = None) -> set[str]:
    """Leftovers: ledgers of dead runs (of ``owners`` only, if given) and run namespaces
    that no ledger of a live or foreign run holds. Other runs on this host record their
    namespaces in their ledgers before they create them, so a run beside this test (even
    one that was killed on purpose) is never mistaken for a leak of ours."""
    held: set[str] = set()
    dead: set[str] = set()
    for path in ledger_mod.STATE_DIR.glob("tb*.json"):
        try:
            ledger = ledger_mod.Ledger.load(path)
        except (OSError, ValueError, KeyError, UserError):
            continue
        ours = owners is None or ledger.owner_pid in owners
        if ledger.owner_alive() or not ours:
            held |= {str(e.get("name")) for e in ledger.entries}
        else:
            dead.add(f"ledger {path.name}")
    return {f"netns {n}" for n in kernel.list_netns()
            if n.startswith("tb") and n not in held} | dead


def prefix_objects(prefix: str) -> list[str]:
    """The namespaces, links and ledger state file of the run with ``prefix`` that still
    exist (a test that knows its run's prefix)."""
    found = [n for n in kernel.list_netns() if n.startswith(prefix)]
    found += [n for n in kernel.list_links() if n.startswith(prefix)]
    if (ledger_mod.STATE_DIR / f"{prefix}.json").exists():
        found.append("ledger state file")
    return found
