"""A campaign's own networks and the checks that need the grid (pure: reads files only).

Rules this module obeys:

1. ``[networks.NAME]`` tables are parsed by ``testbed.links.netdef`` in file order,
   trace paths relative to the campaign file; a name may not shadow a registered
   network (``testbed networks list``), and a host table's ``network = ...`` may name
   a registered network or one defined earlier in the file.
2. Checked against the grid, before anything runs: every ``hosts`` selector names an
   agent that exists in every cell of that network (index ``< agents``, name
   ``a<index>``) or ``central``, and no agent is named twice (``1`` and ``a1``); every
   trace offset (the cell's plus the link's ``trace_offset_s``) lies inside every trace
   of the link, unless the link sets ``trace_wrap = true``.
3. Every error is one :class:`CampaignError` line naming the field. A backend named
   explicitly (``options.backend``, ``--backend``) that cannot run a network as defined
   is refused here too (:func:`check_backend`; what needs a kernel probe, CoDel's
   sch_codel, is refused when the run starts, before its first topology).
5. Team size: the grid allows up to the sim backend's team (``agents`` up to
   ``vocabulary.INT_LIMITS``); every other backend runs at most
   ``workload.MAX_AGENTS`` agents and refuses more in one line.
4. Provenance (:func:`network_provenance`): per network of the grid, its resolved
   definition (``netdef.network_to_data``) and every file it replays (capacity and
   delay traces, shipped or the user's) with path, size and SHA-256;
   :func:`changed_files` compares a recorded provenance with the files as they are now.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from testbed.campaign.model import Campaign, CampaignError, fmt_number
from testbed.campaign.workload import MAX_AGENTS as PACKET_MAX_AGENTS
from testbed.campaign.workload import MAX_SIM_AGENTS
from testbed.errors import UserError
from testbed.links.backend import SIM_BACKEND
from testbed.links.linkspec import CENTRAL_HOST, LinkSpec, NetworkProfile
from testbed.links.netdef import network_to_data, parse_network
from testbed.links.netem_plan import unsupported
from testbed.links.profiles import network_template, profile_names
from testbed.links.traces import TraceError, file_digest, load_trace_ref, resolve_trace_ref
from testbed.links.userspace_support import support_problem as userspace_problem

_AGENT_NAME = re.compile(r"^a(\d+)$")


def parse_networks(raw: Any, *, base_dir: Path | None, check_files: bool = True,
                   ) -> dict[str, NetworkProfile]:
    """The campaign's ``[networks]`` tables (rule 1)."""
    if not isinstance(raw, Mapping):
        raise CampaignError("networks: expected [networks.NAME] tables")
    defined: dict[str, NetworkProfile] = {}
    builtin = profile_names()

    def known(name: str) -> NetworkProfile | None:
        return defined.get(name) or network_template(name)

    for name, table in raw.items():
        if name in builtin:
            raise CampaignError(f"networks.{name}: {name!r} is a registered network; choose "
                                f"another name (registered: {', '.join(builtin)})")
        try:
            defined[name] = parse_network(name, table, base_dir=base_dir, known=known,
                                          check_files=check_files)
        except UserError as exc:
            raise CampaignError(str(exc)) from None
    return defined


def _agent_index(selector: str) -> int | None:
    if selector.isdigit():
        return int(selector)
    match = _AGENT_NAME.match(selector)
    return int(match.group(1)) if match else None


def _check_hosts(name: str, profile: NetworkProfile, agents: set[int],
                 extra: tuple[str, ...] = ()) -> None:
    """EXTRA: a command workload's own hosts (``command.hosts``), selectable by name."""
    seen: dict[int, str] = {}
    fewest = min(agents)
    selectors = dict.fromkeys([s for s, _ in profile.hosts]
                              + [s for s, _ in profile.host_congestion_control])
    for selector in selectors:
        where = f"networks.{name}.hosts.{selector}"
        if selector == CENTRAL_HOST or selector in extra:
            continue
        index = _agent_index(selector)
        others = "".join(f", {h}" for h in extra)
        if index is None:
            raise CampaignError(
                f"{where}: {selector!r} is not a host name; allowed: an agent index "
                f"(0..{fewest - 1}), an agent name (a0..a{fewest - 1}){others} or "
                f"{CENTRAL_HOST}")
        if index >= fewest:
            raise CampaignError(
                f"{where}: no such agent in cells with agents = {fewest}; allowed: "
                f"0..{fewest - 1}, a0..a{fewest - 1}{others} or {CENTRAL_HOST}")
        if index in seen:
            raise CampaignError(f"{where}: agent {index} is already given as "
                                f"hosts.{seen[index]}; name each host once")
        seen[index] = selector


def _periods_s(link: LinkSpec) -> list[tuple[str, float]]:
    out = []
    for side in ("up", "down"):
        ref = link.trace_of(side)
        if ref is not None:
            trace = load_trace_ref(ref, "up" if side == "up" else "down")
            out.append((trace.name, trace.length_s))
    return out


def _check_offsets(name: str, profile: NetworkProfile, offsets: set[float]) -> None:
    for selector, link in [("", profile.link), *profile.hosts]:
        if link is None or not link.trace_driven or link.trace_wrap:
            continue
        where = f"networks.{name}" + (f".hosts.{selector}" if selector else "")
        try:
            periods = _periods_s(link)
        except TraceError as exc:
            raise CampaignError(f"{where}: {exc}") from None
        for offset in sorted(offsets):
            start = offset + link.trace_offset_s
            for trace, length in periods:
                if start >= length:
                    own = (f" + {where}.trace_offset_s {fmt_number(link.trace_offset_s)}"
                           if link.trace_offset_s else "")
                    raise CampaignError(
                        f"grid.trace_offset_s: {fmt_number(offset)}{own} s is past the end "
                        f"of trace {trace} ({length:g} s) of network {name}; allowed: "
                        f"offsets < {length:g} s, or trace_wrap = true in a network of "
                        "your own")


def check_against_grid(campaign: Campaign) -> None:
    """Rule 2, for every network the grid names."""
    agents: dict[str, set[int]] = {}
    offsets: dict[str, set[float]] = {}
    for cell in campaign.cells():
        agents.setdefault(cell.network, set()).add(cell.agents)
        offsets.setdefault(cell.network, set()).add(cell.trace_offset_s)
    for name in agents:
        try:
            profile = campaign.network_profile(name)
        except UserError as exc:
            raise CampaignError(f"grid.network: {str(exc).removeprefix('network: ')}") from None
        extra = campaign.command.hosts if campaign.command is not None else ()
        _check_hosts(name, profile, agents[name], extra)
        _check_offsets(name, profile, offsets[name])


def check_backend(campaign: Campaign, backend: str, *, final: bool = True) -> None:
    """Refuse an explicit backend that cannot run some network of CAMPAIGN as defined,
    and a team larger than the packet-level backends run on any backend but sim (rule
    5). Not FINAL (a file's own ``options.backend``, which ``--backend`` may still
    override): ``auto`` lets a larger team through."""
    if backend == SIM_BACKEND:
        from testbed.campaign.sim_support import check_campaign

        check_campaign(campaign)
        return
    if final or backend != "auto":
        check_team_size(campaign, backend)
    if backend not in ("netem", "userspace"):
        return
    for name in campaign.network_names():
        profile = campaign.network_profile(name)
        if profile.link is None:
            continue
        if backend == "userspace":
            reason = userspace_problem(profile)
            if reason is not None:
                raise CampaignError(f"backend userspace: {reason}")
            continue
        if campaign.options.link_log:
            raise CampaignError("options.link_log: the netem backend keeps no packet log; "
                                "use backend userspace or auto")
        reason = unsupported(profile)
        if reason is not None:
            raise CampaignError(f"backend netem: {reason}")


def check_team_size(campaign: Campaign, backend: str) -> None:
    """Rule 5: at most PACKET_MAX_AGENTS agents per cell on a packet-level backend."""
    largest = max((cell.agents for cell in campaign.cells()), default=0)
    if largest > PACKET_MAX_AGENTS:
        raise CampaignError(
            f"grid.agents: {largest} is more than backend {backend} runs (packet-level "
            f"teams: 2..{PACKET_MAX_AGENTS} agents); use backend sim (up to "
            f"{MAX_SIM_AGENTS}) or agents <= {PACKET_MAX_AGENTS}")


def _files(name: str, profile: NetworkProfile) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for selector, link in [("", profile.link), *profile.hosts]:
        if link is None:
            continue
        where = f"networks.{name}" + (f".hosts.{selector}" if selector else "")
        for key in ("up_trace", "down_trace", "delay_trace"):
            ref = getattr(link, key)
            if ref is None:
                continue
            try:
                path = resolve_trace_ref(ref) if key != "delay_trace" else Path(ref)
                size, sha = file_digest(path)
            except (OSError, TraceError) as exc:
                raise CampaignError(f"{where}.{key}: {exc}") from None
            out.append({"field": f"{where}.{key}", "host": selector or None, "role": key,
                        "ref": ref, "path": str(path), "size": size, "sha256": sha,
                        "trace_offset_s": link.trace_offset_s})
    return out


def network_provenance(campaign: Campaign) -> dict[str, dict[str, Any]]:
    """Rule 4: per network the grid names, its definition and its files."""
    out: dict[str, dict[str, Any]] = {}
    for name in campaign.network_names():
        profile = campaign.network_profile(name)
        out[name] = {"defined_in": "campaign" if name in campaign.networks else "built-in",
                     "definition": network_to_data(profile),
                     "base_rtt_ms": profile.base_rtt_ms,
                     "files": _files(name, profile)}
    return out


def shipped_trace(ref: str) -> Path | None:
    """The shipped trace file a recorded reference names (None: not a shipped name)."""
    if "/" in ref or Path(ref).is_absolute():
        return None
    try:
        return resolve_trace_ref(ref)
    except TraceError:
        return None


def changed_files(recorded: Mapping[str, Any]) -> str | None:
    """The first file a recorded provenance names that differs now (one line), or None."""
    for entry in recorded.values():
        files = entry.get("files", []) if isinstance(entry, Mapping) else []
        for item in files:
            path = Path(str(item.get("path", "")))
            try:
                size, sha = file_digest(path)
            except OSError:
                return (f"{item.get('field')}: {path} is gone since the run started; restore "
                        "it or choose another --out")
            if sha != item.get("sha256") or size != item.get("size"):
                return (f"{item.get('field')}: {path} changed since the run started (sha256 "
                        f"{str(item.get('sha256'))[:12]}... now {sha[:12]}...); restore it or "
                        "choose another --out")
    return None
