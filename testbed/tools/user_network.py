"""A network for your own programs: the one path ``testbed exec``, ``testbed shell`` and
``testbed.api.network`` build it by.

Rules:

1. The network is a registered one (with ``delay_ms`` / ``rate_kbit`` overrides as
   ``get_profile`` takes them) or one a campaign file defines (per-host links
   included); an unshaped host gets no link at all (no delay, no rate, no loss: a
   server "on the internet", outside Mahimahi's shells) and ``cc`` (``[HOST=]ALG``)
   sets the TCP congestion control of the network or of one host.
2. Hosts: a count (``a0``..), names, else those the commands name (``--on HOST``,
   ``{addr:HOST}``), else the hosts of the campaign's first cell on that network, else
   ``a0`` and ``a1``. ``{addr:HOST}`` adds a host only where the commands name them
   all; where the hosts are given otherwise a placeholder naming none of them is a
   one-line error, never a new idle host. Never more hosts than this machine can run
   (``testbed.net.capacity``).
3. :func:`open_user_network` builds everything before it yields and removes it all on
   the way out, on Ctrl-C and on SIGTERM (``testbed.net.topology``); packet logs start
   when the caller says (:meth:`UserNetwork.start_link_log`: exec at the traces' start,
   the API once built) and always stop before the links are removed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import trio

from testbed.errors import UserError
from testbed.links.linkspec import LinkSpec, NetworkProfile, check_congestion_control
from testbed.links.profiles import get_profile
from testbed.net.capacity import host_limit
from testbed.net.commands import (
    CommandError,
    Segment,
    check_host_name,
    default_hosts,
    referenced_hosts,
)
from testbed.net.session import HostNetwork, open_host_network


@dataclass(frozen=True)
class NetworkChoice:
    """What network to build, as the command line or the API asked (rule 1)."""

    name: str
    campaign: str | None = None
    delay_ms: float | None = None
    rate_kbit: float | None = None
    unshaped: tuple[str, ...] = ()
    cc: tuple[str, ...] = ()
    backend: str = "auto"
    trace_offset_s: float = 0.0
    seed: int = 0
    hosts: int | None = None
    host: tuple[str, ...] = ()
    extra_hosts: tuple[str, ...] = field(default=())


def resolve_network(choice: NetworkChoice) -> tuple[NetworkProfile, list[str]]:
    """The profile and the campaign's default hosts (empty without a campaign)."""
    defaults: list[str] = []
    if choice.campaign is not None:
        from testbed.campaign.parse import load_campaign

        campaign = load_campaign(choice.campaign)
        if choice.delay_ms is not None or choice.rate_kbit is not None:
            raise UserError("--delay-ms/--rate-kbit: a campaign's network is defined in its "
                            "file; change it there")
        profile = campaign.network_profile(choice.name)
        cells = [c for c in campaign.cells() if c.network == choice.name]
        if cells:
            defaults = list(campaign.schedule(cells[0], campaign.templates[0]).agents)
            defaults += list(campaign.command.hosts) if campaign.command is not None else []
    else:
        profile = get_profile(choice.name, delay_ms=choice.delay_ms, rate_kbit=choice.rate_kbit)
    if profile.link is None and (choice.unshaped or any("=" in c for c in choice.cc)):
        raise UserError(f"--unshaped/--cc HOST=ALG: network {choice.name} has no links")
    if choice.unshaped:
        unshaped = tuple((check_host_name(h, "--unshaped"), LinkSpec(delay_ms=0.0))
                         for h in choice.unshaped)
        profile = replace(profile, hosts=(*profile.hosts, *unshaped))
    for item in choice.cc:
        host, _, alg = item.rpartition("=")
        alg = check_congestion_control(alg, "--cc")
        if host:
            check_host_name(host, "--cc")
            profile = replace(profile, host_congestion_control=(
                *profile.host_congestion_control, (host, alg)))
        else:
            profile = replace(profile, congestion_control=alg)
    return profile, defaults


def select_hosts(choice: NetworkChoice, segments: Sequence[Segment],
                 defaults: Sequence[str]) -> list[str]:
    """Rule 2."""
    if choice.hosts is not None and choice.host:
        raise UserError("--hosts/--host: give a count or names, not both")
    if choice.hosts is not None:
        names = [f"a{i}" for i in range(choice.hosts)]
    elif choice.host:
        names = [check_host_name(h, "--host") for h in choice.host]
    else:
        named = default_hosts(segments, count=0)
        bare = any(seg.host is None for seg in segments)
        base = list(defaults) or (["a0", "a1"] if bare or not named else [])
        if base:  # the hosts are given: a placeholder names one, it adds none (rule 2)
            known = base + [s.host for s in segments if s.host and s.host not in base]
            for seg in segments:
                missing = [h for h in referenced_hosts(seg.argv) if h not in known]
                if missing:
                    raise CommandError(f"{{addr:{missing[0]}}}: no host {missing[0]!r} in "
                                       f"this network; hosts: {', '.join(known)} (more "
                                       "with --hosts N or --host NAME)")
        names = base + [n for n in named if n not in base]
    for name in (*choice.unshaped, *(c.rpartition("=")[0] for c in choice.cc if "=" in c)):
        if name not in names:
            raise UserError(f"{name}: no such host; hosts: {', '.join(names)}")
    if len(set(names)) != len(names):
        raise UserError(f"--host: each host once; got {', '.join(names)}")
    limit, reason = host_limit(len(names))
    if len(names) > limit:
        flag = "--hosts" if choice.hosts is not None else "hosts"
        raise UserError(f"{flag}: {len(names)} is more than this machine can run; allowed: "
                        f"1..{limit} (set by {reason})")
    return names


def plan_network(choice: NetworkChoice,
                 segments: Sequence[Segment] = ()) -> tuple[NetworkProfile, list[str]]:
    """The profile and the hosts to build (rules 1 and 2); creates nothing."""
    profile, defaults = resolve_network(choice)
    return profile, select_hosts(choice, segments, defaults)


@dataclass
class UserNetwork:
    """A built network (``net``: namespaces, links, hosts file) and its packet logs."""

    net: HostNetwork
    link_log: Path | None
    label: str
    logging: bool = False

    async def start_link_log(self) -> None:
        """Start every link's packet log into ``link_log`` (nothing without one)."""
        if self.link_log is None or self.logging:
            return
        await trio.to_thread.run_sync(partial(self.link_log.mkdir, parents=True,
                                              exist_ok=True))
        self.logging = True  # stopped on the way out even when cut short while starting
        await self.net.topo.start_link_log(str(self.link_log), self.label)


@asynccontextmanager
async def open_user_network(choice: NetworkChoice, profile: NetworkProfile,
                            hosts: Sequence[str], *, link_log: Path | None, label: str,
                            link_log_field: str = "--link-log") -> AsyncIterator[UserNetwork]:
    """Build HOSTS on PROFILE as CHOICE says, yield it, remove it all (rule 3).
    LINK_LOG names the directory of the packet logs; LINK_LOG_FIELD names it in the
    one-line error of a network without links."""
    if link_log is not None and profile.link is None:
        raise UserError(f"{link_log_field}: network {profile.name} has no links to log")
    async with open_host_network(profile, hosts, backend=choice.backend,
                                 trace_offset_s=choice.trace_offset_s, seed=choice.seed,
                                 packet_log=link_log is not None) as net:
        user = UserNetwork(net, link_log, label)
        try:
            yield user
        finally:
            if user.logging:
                with trio.CancelScope(shield=True):
                    await net.topo.stop_link_log()
