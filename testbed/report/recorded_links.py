"""The links a run replayed, rebuilt from its manifest, and what one episode met on them.

The manifest's ``networks`` section holds each network's resolved definition (trace
files as absolute paths or shipped names), so a report can rebuild the profiles
without the campaign file (``recorded_profiles``). For one episode (its network, team,
trace offset and wall time) :func:`what_it_met` says what its links did during it:
the seconds of outage (stretches of at least ``netinfo.OUTAGE_PLOT_MS`` without a
delivery opportunity, on any direction of any host's link) and the delay steps of delay traces.
The link plots pick, per network, the logged episode that met the most, so the default
figure shows an outage or a delay step when the run has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.errors import UserError
from testbed.links.linkspec import CENTRAL_HOST, LinkSpec, NetworkProfile
from testbed.links.netdef import parse_network
from testbed.links.netinfo import outage_ms_in_window
from testbed.links.traces import load_delay_trace


def recorded_profiles(manifest: dict[str, Any]) -> dict[str, NetworkProfile]:
    """Per network of the manifest, its profile (networks that no longer parse, e.g.
    a missing shipped trace, are left out)."""
    out: dict[str, NetworkProfile] = {}
    networks = manifest.get("networks")
    if not isinstance(networks, dict):
        return out
    for name, entry in networks.items():
        definition = entry.get("definition") if isinstance(entry, dict) else None
        if not isinstance(definition, dict):
            continue
        try:
            out[str(name)] = parse_network(str(name), definition, check_files=False)
        except UserError:
            continue
    return out


def team_links(profile: NetworkProfile, agents: int, central: bool) -> list[LinkSpec]:
    names = [f"a{i}" for i in range(agents)] + ([CENTRAL_HOST] if central else [])
    return [lk for i, name in enumerate(names) if (lk := profile.link_of(name, i)) is not None]


@dataclass(frozen=True)
class Met:
    outage_s: float
    delay_steps: int

    @property
    def score(self) -> tuple[float, int]:
        return self.outage_s, self.delay_steps


def _outage_s(link: LinkSpec, direction: str, start_ms: float, end_ms: float) -> float:
    try:
        return outage_ms_in_window(link, direction, start_ms, end_ms) / 1000.0
    except (UserError, OSError):
        return 0.0


def _delay_steps(link: LinkSpec, direction: str, start_ms: float, end_ms: float) -> int:
    trace = link.side(direction).delay_trace
    if trace is None:
        return 0
    try:
        steps = load_delay_trace(trace).steps
    except (UserError, OSError):
        return 0
    return sum(1 for t, _ in steps[1:] if start_ms < t <= end_ms)


def what_it_met(profile: NetworkProfile, *, agents: int, central: bool,
                offset_s: float, seconds: float) -> Met:
    """Outage seconds and delay steps the episode's links had while it ran."""
    outage = 0.0
    steps = 0
    for link in team_links(profile, agents, central):
        start = (offset_s + link.trace_offset_s) * 1000.0
        end = start + max(0.0, seconds) * 1000.0
        for direction in ("up", "down"):
            outage += _outage_s(link, direction, start, end)
            steps += _delay_steps(link, direction, start, end)
    return Met(outage, steps)
