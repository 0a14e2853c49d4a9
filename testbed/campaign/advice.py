"""Warnings about a valid campaign: input that is allowed but probably a mistake (pure).

Errors refuse a campaign (``testbed.campaign.parse``); these only say what looks wrong,
one line each naming the field, and the campaign still runs. ``testbed check`` and
``testbed run`` print them before anything else. Rules, one per warning:

1. ``options.delay_ms`` changes the built-in networks only: a network the campaign
   defines keeps its own ``delay_ms``, so the option is ignored for it.
2. ``hosts.central`` of a network whose cells never need the central host (no policy
   of the grid on that network commits to the directory) is a link never built.
3. A shipped or named trace whose file name says the other direction (``up_trace =
   "X.down"``): the traces are probably swapped.
4. A trace that carries less than :data:`LOW_CAPACITY_KBIT` on average, or whose
   longest outage is longer than ``options.episode_timeout_s``: episodes on it would
   wait for hours or be aborted.
"""

from __future__ import annotations

from pathlib import Path

from testbed.campaign.model import Campaign, fmt_number
from testbed.campaign.vocabulary import policy_needs_central
from testbed.links.linkspec import CENTRAL_HOST, LinkSpec
from testbed.links.traces import TraceError, load_trace_ref

LOW_CAPACITY_KBIT = 12.0
"""One delivery opportunity per second: below it a link hardly carries a handshake."""


def _links(campaign: Campaign, name: str) -> list[tuple[str, LinkSpec]]:
    profile = campaign.network_profile(name)
    if profile.link is None:
        return []
    where = f"networks.{name}"
    return [(where, profile.link), *((f"{where}.hosts.{sel}", link)
                                     for sel, link in profile.hosts)]


def _delay_option(campaign: Campaign) -> list[str]:
    if campaign.options.delay_ms is None:
        return []
    names = campaign.network_names()
    defined = [n for n in names if n in campaign.networks
               and campaign.networks[n].link is not None]
    if not defined:
        return []
    builtin = [n for n in names if n not in campaign.networks
               and campaign.network_profile(n).link is not None]
    tail = (f"it applies to {', '.join(builtin)} only" if builtin
            else "no built-in shaped network is in the grid, so it changes nothing")
    return [f"options.delay_ms: {fmt_number(campaign.options.delay_ms)} ms is ignored for "
            f"{', '.join(defined)} (defined in the campaign; set delay_ms there); {tail}"]


def _unused_central(campaign: Campaign) -> list[str]:
    out = []
    for name in campaign.network_names():
        if name not in campaign.networks:
            continue
        selectors = [sel for sel, _ in campaign.networks[name].hosts]
        if CENTRAL_HOST not in selectors:
            continue
        cells = [c for c in campaign.cells() if c.network == name]
        if any(policy_needs_central(c.policy) for c in cells):
            continue
        policies = sorted({c.policy for c in cells})
        out.append(f"networks.{name}.hosts.{CENTRAL_HOST}: no policy of the grid on "
                   f"{name} ({', '.join(policies)}) uses a central host, so this link is "
                   "never built")
    return out


def _direction_named(ref: str) -> str | None:
    suffix = Path(ref).suffix
    return {".up": "up", ".down": "down"}.get(suffix)


def _traces(campaign: Campaign) -> list[str]:
    out: list[str] = []
    timeout_s = campaign.options.episode_timeout_s
    seen: set[tuple[str, str]] = set()
    for name in campaign.network_names():
        for where, link in _links(campaign, name):
            for side in ("up", "down"):
                ref = link.trace_of(side)
                if ref is None or (where, ref) in seen:
                    continue
                seen.add((where, ref))
                field = f"{where}.{side}_trace"
                named = _direction_named(ref)
                if named is not None and named != side:
                    article = "an" if named == "up" else "a"
                    out.append(f"{field}: {Path(ref).name} is named as {article} {named}link "
                               "trace; are up_trace and down_trace swapped?")
                try:
                    trace = load_trace_ref(ref, "up" if side == "up" else "down")
                except TraceError:
                    continue  # the campaign's own checks report unreadable files
                mean = trace.mean_rate_kbit()
                outage_s = trace.longest_outage_ms() / 1000.0
                if mean < LOW_CAPACITY_KBIT:
                    n = trace.stamps_ms.size
                    out.append(f"{field}: {trace.name} carries {mean:.3g} kbit/s on average "
                               f"({n} delivery opportunit{'y' if n == 1 else 'ies'} in "
                               f"{trace.length_s:g} s); episodes would wait on it for hours")
                elif outage_s > timeout_s:
                    out.append(f"{field}: {trace.name} has an outage of {outage_s:g} s, "
                               f"longer than options.episode_timeout_s ({timeout_s:g} s); "
                               "an episode that meets it is aborted")
    return out


def campaign_warnings(campaign: Campaign) -> list[str]:
    """Every warning of the module rules, in rule order."""
    return [*_delay_option(campaign), *_unused_central(campaign), *_traces(campaign)]
