"""Network definitions as data: ``[networks.NAME]`` tables in, :class:`NetworkProfile` out.

Rules this module obeys:

1. A table is checked completely before anything is built: every field is known, every
   number is in range, every file exists and parses (capacity traces, delay traces),
   a queue holds at least one full packet; a failure is one :class:`ProfileError` line
   naming the field by its path (``networks.myfi.loss.p``) and what is allowed.
2. Trace references: a string names a file relative to ``base_dir`` (the campaign
   file's folder) or an absolute path if such a file exists, else a shipped trace
   (``testbed traces list``). Files are stored as absolute paths, shipped traces by
   name (``testbed.links.traces`` rules).
3. A ``hosts`` entry is a complete link of its own (the defaults of any link apply), or,
   with ``network = "NAME"``, NAME's common link with the fields given replacing its
   own; fields replace in groups: giving any capacity field (traces or rates) replaces
   all of them, any delay field (``delay_ms``, ``delay_trace``, ``up_delay_ms``,
   ``down_delay_ms``) all of those, likewise the loss fields (``loss``, ``up_loss``,
   ``down_loss``) and the queue fields (``queue``, ``up_queue``, ``down_queue``). NAME
   may be a built-in, a network defined earlier, or the network being defined.
4. A network table may itself start from another with ``network = "NAME"`` (a built-in
   or a network defined earlier, not itself): NAME's common link with the fields given
   replacing it in the groups of rule 3, NAME's congestion control unless the table
   gives one, and NAME's hosts, each unless the table names the same host.
5. :func:`network_to_data` writes a profile back as a table that parses to the same
   profile (for the manifest and ``--resume``).

The field reference is docs/links.md ("Networks as data").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from testbed.links import netdef_fields as nf
from testbed.links.linkspec import (
    AQM_KINDS,
    CENTRAL_HOST,
    DEFAULT_CONGESTION_CONTROL,
    DEFAULT_ORDER,
    ORDERS,
    LinkSpec,
    LossSpec,
    NetworkProfile,
    ProfileError,
    QueueSpec,
    check_congestion_control,
)
from testbed.links.traces import (
    MAX_DELAY_MS,
    TraceError,
    load_delay_trace,
    load_trace_ref,
    trace_catalogue,
)

CAPACITY_FIELDS = ("up_trace", "down_trace", "rate_kbit", "up_rate_kbit", "down_rate_kbit")
DELAY_FIELDS = ("delay_ms", "delay_trace", "up_delay_ms", "down_delay_ms")
LOSS_FIELDS = ("loss", "up_loss", "down_loss")
QUEUE_FIELDS = ("queue", "up_queue", "down_queue")
LINK_FIELDS = (*CAPACITY_FIELDS, *DELAY_FIELDS, *LOSS_FIELDS, *QUEUE_FIELDS, "order",
               "trace_offset_s", "trace_wrap")
#: table field -> the LinkSpec fields it sets (rule 3's groups reset them together)
_GROUPS: dict[str, tuple[str, ...]] = {
    "delay": ("delay_ms", "delay_trace", "up_delay_ms", "down_delay_ms"),
    "loss": ("loss_pct", "gilbert", "up_loss", "down_loss"),
    "queue": ("queue_kind", "queue_packets", "queue_bytes", "codel_target_ms",
              "codel_interval_ms", "queue_tupdate_ms", "queue_flows", "up_queue",
              "down_queue"),
}
NETWORK_FIELDS = ("description", "unshaped", "congestion_control", *LINK_FIELDS, "hosts",
                  "network")
HOST_FIELDS = ("network", *LINK_FIELDS, "congestion_control", "unshaped")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_SELECTOR = re.compile(r"^(?:\d{1,3}|[A-Za-z_][A-Za-z0-9_]{0,31})$")

Known = Callable[[str], NetworkProfile | None]


def resolve_trace_file(value: Any, where: str, base_dir: Path | None, *,
                       must_exist: bool = True) -> str:
    """A trace reference as stored in a LinkSpec (rule 2); the file must exist (without
    MUST_EXIST a name that is no file is kept as a shipped name, unchecked)."""
    if not isinstance(value, str) or not value:
        raise nf.fail(where, value, "a trace file (relative to the campaign file) or a "
                    "shipped trace name")
    candidates = [Path(value)] if Path(value).is_absolute() else \
        ([base_dir / value] if base_dir is not None else [])
    for path in candidates:
        if path.is_file():
            return str(path.resolve())
    if not Path(value).is_absolute() and (value in trace_catalogue() or not must_exist):
        return value
    looked = f" (no file {candidates[0]})" if candidates else ""
    shipped = ", ".join(trace_catalogue()) or "none"
    raise ProfileError(f"{where}: {value!r} is neither a file{looked} nor a shipped trace; "
                       f"shipped: {shipped}")


def _capacity(table: Mapping[str, Any], where: str, base_dir: Path | None,
              check_files: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    traces = [k for k in ("up_trace", "down_trace") if k in table]
    rates = [k for k in ("rate_kbit", "up_rate_kbit", "down_rate_kbit") if k in table]
    if traces and rates:
        raise ProfileError(f"{where}.{rates[0]}: a trace-driven link takes its rate from "
                           f"{traces[0]}; give traces or rates, not both")
    if len(traces) == 1:
        missing = "down_trace" if traces[0] == "up_trace" else "up_trace"
        raise ProfileError(f"{where}.{missing}: missing; a trace-driven link needs both "
                           "up_trace and down_trace")
    for key in traces:
        ref = resolve_trace_file(table[key], f"{where}.{key}", base_dir,
                                 must_exist=check_files)
        if check_files:
            try:
                load_trace_ref(ref, "up" if key == "up_trace" else "down")
            except TraceError as exc:
                raise ProfileError(f"{where}.{key}: {exc}") from None
        out[key] = ref
    if "rate_kbit" in table and ("up_rate_kbit" in table or "down_rate_kbit" in table):
        raise ProfileError(f"{where}.rate_kbit: give rate_kbit (both directions) or "
                           "up_rate_kbit/down_rate_kbit, not both")
    for key in rates:
        out[key] = nf.number(table, key, where, low=0.0, low_open=True)
    return out


def _delay(table: Mapping[str, Any], where: str, base_dir: Path | None,
           check_files: bool) -> dict[str, Any]:
    if "delay_trace" in table and "delay_ms" in table:
        raise ProfileError(f"{where}.delay_ms: a link with delay_trace takes its delay from "
                           "the trace; give one of delay_ms, delay_trace")
    out: dict[str, Any] = {}
    for side in ("up", "down"):
        own = nf.number(table, f"{side}_delay_ms", where, low=0.0, high=MAX_DELAY_MS)
        if own is not None:
            out[f"{side}_delay_ms"] = own
    if "delay_trace" not in table:
        delay = nf.number(table, "delay_ms", where, low=0.0, high=MAX_DELAY_MS)
        return out if delay is None else {**out, "delay_ms": delay}
    value = table["delay_trace"]
    key = f"{where}.delay_trace"
    if not isinstance(value, str) or not value:
        raise nf.fail(key, value, "a delay trace file (relative to the campaign file)")
    path = Path(value) if Path(value).is_absolute() or base_dir is None else base_dir / value
    if not path.is_file():
        raise ProfileError(f"{key}: {value!r} is not a file (looked for {path})")
    first = 0.0
    if check_files:
        try:
            first = load_delay_trace(path).steps[0][1]
        except TraceError as exc:
            raise ProfileError(f"{key}: {exc}") from None
    return {**out, "delay_trace": str(path.resolve()), "delay_ms": first}


def link_fields(table: Mapping[str, Any], where: str, *, base_dir: Path | None,
                check_files: bool = True) -> dict[str, Any]:
    """The LinkSpec fields a table gives (only those it names), checked (rule 1)."""
    out = {**_capacity(table, where, base_dir, check_files),
           **_delay(table, where, base_dir, check_files)}
    if "loss" in table:
        out.update(nf.loss(table["loss"], f"{where}.loss"))
    if "queue" in table:
        out.update(nf.common_queue(nf.queue(table["queue"], f"{where}.queue")))
    for side in ("up", "down"):
        if f"{side}_loss" in table:
            loss = nf.loss(table[f"{side}_loss"], f"{where}.{side}_loss")
            out[f"{side}_loss"] = LossSpec(loss["loss_pct"], loss["gilbert"])
        if f"{side}_queue" in table:
            out[f"{side}_queue"] = nf.queue(table[f"{side}_queue"], f"{where}.{side}_queue")
    if "order" in table:
        if table["order"] not in ORDERS:
            raise nf.fail(f"{where}.order", table["order"], ", ".join(ORDERS))
        out["order"] = table["order"]
    offset = nf.number(table, "trace_offset_s", where, low=0.0, high=1e6)
    if offset is not None:
        out["trace_offset_s"] = offset
    if "trace_wrap" in table:
        if not isinstance(table["trace_wrap"], bool):
            raise nf.fail(f"{where}.trace_wrap", table["trace_wrap"], "true or false")
        out["trace_wrap"] = table["trace_wrap"]
    return out


def _build(fields: dict[str, Any], where: str, base: LinkSpec | None = None) -> LinkSpec:
    try:
        link = LinkSpec(**fields) if base is None else base.with_overrides(**fields)
    except ProfileError as exc:
        raise ProfileError(f"{where}.{exc}") from None
    for side in link.sides:
        if side.queue.kind in AQM_KINDS and not side.shaped:
            field = "queue" if side.queue == link.queue else f"{side.direction}_queue"
            raise ProfileError(f"{where}.{field}.kind: {side.queue.kind} needs a bottleneck "
                               f"(traces or a rate) on the {side.direction}link; an "
                               "unlimited direction never queues")
    return link


def _inherit(given: dict[str, Any]) -> dict[str, Any]:
    """GIVEN, plus the inherited fields it replaces as a group (rule 3)."""
    defaults = {name: f.default for name, f in LinkSpec.__dataclass_fields__.items()}
    reset: dict[str, Any] = {}
    if any(k in given for k in CAPACITY_FIELDS):
        reset.update(dict.fromkeys(CAPACITY_FIELDS, None))
    for fields in _GROUPS.values():
        if any(k in given for k in fields):
            reset.update({k: defaults[k] for k in fields})
    return {**reset, **given}


def _host_extras(table: Mapping[str, Any], where: str) -> tuple[bool, str | None]:
    """A host table's ``unshaped`` and ``congestion_control`` (not link fields)."""
    cc = (check_congestion_control(table["congestion_control"], f"{where}.congestion_control")
          if "congestion_control" in table else None)
    unshaped = table.get("unshaped", False)
    if not isinstance(unshaped, bool):
        raise nf.fail(f"{where}.unshaped", unshaped, "true or false")
    if unshaped:
        extra = [k for k in table if k not in ("unshaped", "congestion_control")]
        if extra:
            raise ProfileError(f"{where}.{extra[0]}: an unshaped host (unshaped = true) has "
                               "no link fields; leave them out")
    return unshaped, cc


def _host(name: str, selector: str, value: Any, where: str, common: LinkSpec, *,
          base_dir: Path | None, known: Known, check_files: bool
          ) -> tuple[LinkSpec | None, str | None]:
    """A host's own link (None: the network's) and congestion control (None: the
    network's). ``unshaped = true``: no delay, no rate, no loss (a server "on the
    internet", as outside Mahimahi's shells); only ``congestion_control``: the
    network's link."""
    table = nf.as_table(value, where, '{ rate_kbit = 100000, delay_ms = 1 }')
    nf.unknown(table, HOST_FIELDS, where)
    unshaped, cc = _host_extras(table, where)
    if unshaped:
        return LinkSpec(delay_ms=0.0), cc
    if set(table) <= {"congestion_control"}:
        return None, cc
    return _host_link(name, table, where, common, base_dir=base_dir, known=known,
                      check_files=check_files), cc


def _host_link(name: str, table: Mapping[str, Any], where: str, common: LinkSpec, *,
               base_dir: Path | None, known: Known, check_files: bool) -> LinkSpec:
    given = link_fields(table, where, base_dir=base_dir, check_files=check_files)
    if "network" not in table:
        return _build(given, where)
    other = table["network"]
    base = common if other == name else _shaped_network(
        other, f"{where}.network", known,
        f"a built-in network, one defined before this one, or {name!r} itself")[1]
    return _build(_inherit(given), where, base)


def _shaped_network(other: Any, where: str, known: Known,
                    allowed: str) -> tuple[NetworkProfile, LinkSpec]:
    """The network a ``network = "OTHER"`` field names, and its link (rules 3, 4)."""
    profile = known(other) if isinstance(other, str) else None
    if profile is None:
        raise nf.fail(where, other, allowed)
    if profile.link is None:
        raise ProfileError(f"{where}: {other!r} has no link (unshaped); name a shaped network")
    return profile, profile.link


def parse_network(name: str, value: Any, *, where: str = "networks",
                  base_dir: Path | None = None, known: Known = lambda _: None,
                  check_files: bool = True) -> NetworkProfile:
    """One ``[networks.NAME]`` table as a profile (module rules)."""
    here = f"{where}.{name}"
    if not isinstance(name, str) or not _NAME.match(name):
        raise ProfileError(f"{here}: the name is not allowed; allowed: 1-32 of a-z, 0-9, _ "
                           "starting with a letter")
    table = nf.as_table(value, here, "delay_ms = 20")
    nf.unknown(table, NETWORK_FIELDS, here)
    description = table.get("description", "")
    if not isinstance(description, str):
        raise nf.fail(f"{here}.description", description, "a string")
    if table.get("unshaped", False) is not False:
        if table["unshaped"] is not True:
            raise nf.fail(f"{here}.unshaped", table["unshaped"], "true or false")
        extra = [k for k in table if k not in ("description", "unshaped")]
        if extra:
            raise ProfileError(f"{here}.{extra[0]}: an unshaped network (unshaped = true) "
                               "has no link; leave out every link field")
        return NetworkProfile(name=name, link=None, description=description)
    parent = None
    given = link_fields(table, here, base_dir=base_dir, check_files=check_files)
    if "network" in table:  # rule 4; not the network being defined
        parent, parent_link = _shaped_network(
            table["network"], f"{here}.network", lambda n: None if n == name else known(n),
            "a built-in network or one defined before this one")
        common = _build(_inherit(given), here, parent_link)
    else:
        common = _build(given, here)
    cc = check_congestion_control(
        table.get("congestion_control", DEFAULT_CONGESTION_CONTROL if parent is None
                  else parent.congestion_control), f"{here}.congestion_control")
    hosts = dict(parent.hosts) if parent is not None else {}
    host_cc = dict(parent.host_congestion_control) if parent is not None else {}
    raw_hosts = nf.as_table(table.get("hosts", {}), f"{here}.hosts", "{ central = { ... } }")
    for selector, host_value in raw_hosts.items():
        key = f"{here}.hosts.{selector}"
        if not _SELECTOR.match(str(selector)):
            raise ProfileError(f"{key}: not a host; allowed: an agent index (0, 1, ...), an "
                               f"agent name (a0, a1, ...), a host name or {CENTRAL_HOST}")
        link, own_cc = _host(name, str(selector), host_value, key, common, base_dir=base_dir,
                             known=known, check_files=check_files)
        hosts.pop(str(selector), None)
        host_cc.pop(str(selector), None)
        if link is not None:
            hosts[str(selector)] = link
        if own_cc is not None:
            host_cc[str(selector)] = own_cc
    return NetworkProfile(name=name, link=common, congestion_control=cc,
                          hosts=tuple(hosts.items()), description=description,
                          host_congestion_control=tuple(sorted(host_cc.items())))


def link_to_data(link: LinkSpec) -> dict[str, Any]:
    """A link as the table fields that parse back to it (rule 5)."""
    out: dict[str, Any] = {}
    if link.trace_driven:
        out.update(up_trace=link.up_trace, down_trace=link.down_trace)
    for key in ("rate_kbit", "up_rate_kbit", "down_rate_kbit"):
        if getattr(link, key) is not None:
            out[key] = getattr(link, key)
    if link.delay_trace is not None:
        out["delay_trace"] = link.delay_trace
    else:
        out["delay_ms"] = link.delay_ms
    for side in ("up", "down"):
        if getattr(link, f"{side}_delay_ms") is not None:
            out[f"{side}_delay_ms"] = getattr(link, f"{side}_delay_ms")
    loss = nf.loss_data(link.loss_pct, link.gilbert)
    if loss is not None:
        out["loss"] = loss
    out["queue"] = nf.queue_data(link.queue)
    for side in ("up", "down"):
        own_loss: LossSpec | None = getattr(link, f"{side}_loss")
        if own_loss is not None:
            out[f"{side}_loss"] = nf.loss_data(own_loss.pct, own_loss.gilbert) or {
                "model": "none"}
        own_queue: QueueSpec | None = getattr(link, f"{side}_queue")
        if own_queue is not None:
            out[f"{side}_queue"] = nf.queue_data(own_queue)
    if link.order != DEFAULT_ORDER:
        out["order"] = link.order
    if link.trace_offset_s:
        out["trace_offset_s"] = link.trace_offset_s
    if link.trace_wrap:
        out["trace_wrap"] = True
    return out


def network_to_data(profile: NetworkProfile) -> dict[str, Any]:
    """A profile as a ``[networks.NAME]`` table that parses to an equal profile."""
    out: dict[str, Any] = {}
    if profile.description:
        out["description"] = profile.description
    if profile.link is None:
        out["unshaped"] = True
        return out
    if profile.congestion_control != DEFAULT_CONGESTION_CONTROL:
        out["congestion_control"] = profile.congestion_control
    out.update(link_to_data(profile.link))
    hosts: dict[str, dict[str, Any]] = {sel: link_to_data(link) for sel, link in profile.hosts}
    for sel, host_cc in profile.host_congestion_control:
        hosts.setdefault(sel, {})["congestion_control"] = host_cc
    if hosts:
        out["hosts"] = hosts
    return out

