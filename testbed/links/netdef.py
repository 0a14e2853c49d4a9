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
   own; giving any capacity field (traces or rates) replaces all of them, and
   ``delay_ms`` / ``delay_trace`` replace each other. NAME may be a built-in, a network
   defined earlier, or the network being defined.
4. :func:`network_to_data` writes a profile back as a table that parses to the same
   profile (for the manifest and ``--resume``).

The field reference is docs/links.md ("Networks as data").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from testbed.links.linkspec import (
    CENTRAL_HOST,
    CODEL_INTERVAL_MS,
    CODEL_TARGET_MS,
    DEFAULT_CONGESTION_CONTROL,
    DEFAULT_QUEUE_PACKETS,
    MIN_QUEUE_BYTES,
    QUEUE_KINDS,
    GilbertLoss,
    LinkSpec,
    NetworkProfile,
    ProfileError,
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
DELAY_FIELDS = ("delay_ms", "delay_trace")
LINK_FIELDS = (*CAPACITY_FIELDS, *DELAY_FIELDS, "loss", "queue", "trace_offset_s",
               "trace_wrap")
NETWORK_FIELDS = ("description", "unshaped", "congestion_control", *LINK_FIELDS, "hosts")
HOST_FIELDS = ("network", *LINK_FIELDS, "congestion_control", "unshaped")
LOSS_MODELS = ("none", "iid", "gilbert")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_SELECTOR = re.compile(r"^(?:\d{1,3}|[A-Za-z_][A-Za-z0-9_]{0,31})$")

Known = Callable[[str], NetworkProfile | None]


def _fail(where: str, value: Any, allowed: str) -> ProfileError:
    shown = repr(value) if not isinstance(value, int | float) or isinstance(value, bool) \
        else f"{value:g}"
    return ProfileError(f"{where}: {shown} is not allowed; allowed: {allowed}")


def _number(table: Mapping[str, Any], key: str, where: str, *, low: float,
            high: float | None = None, low_open: bool = False, default: float | None = None,
            ) -> float | None:
    if key not in table:
        return default
    value = table[key]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        lo = f"{'>' if low_open else '>='} {low:g}"
        hi = "" if high is None else f" and <= {high:g}"
        raise _fail(f"{where}.{key}", value, f"a number {lo}{hi}")
    return float(value)


def _integer(table: Mapping[str, Any], key: str, where: str, *, low: int,
             what: str) -> int | None:
    if key not in table:
        return None
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _fail(f"{where}.{key}", value, f"an integer >= {low} ({what})")
    return int(value)


def _unknown(table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise ProfileError(f"{where}: unknown field {key!r}; allowed: {', '.join(allowed)}")


def _table(value: Any, where: str, example: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ProfileError(f"{where}: expected a table, e.g. {example}")
    return value


def resolve_trace_file(value: Any, where: str, base_dir: Path | None, *,
                       must_exist: bool = True) -> str:
    """A trace reference as stored in a LinkSpec (rule 2); the file must exist (without
    MUST_EXIST a name that is no file is kept as a shipped name, unchecked)."""
    if not isinstance(value, str) or not value:
        raise _fail(where, value, "a trace file (relative to the campaign file) or a "
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
        out[key] = _number(table, key, where, low=0.0, low_open=True)
    return out


def _delay(table: Mapping[str, Any], where: str, base_dir: Path | None,
           check_files: bool) -> dict[str, Any]:
    if "delay_trace" in table and "delay_ms" in table:
        raise ProfileError(f"{where}.delay_ms: a link with delay_trace takes its delay from "
                           "the trace; give one of delay_ms, delay_trace")
    if "delay_trace" not in table:
        delay = _number(table, "delay_ms", where, low=0.0, high=MAX_DELAY_MS)
        return {} if delay is None else {"delay_ms": delay}
    value = table["delay_trace"]
    key = f"{where}.delay_trace"
    if not isinstance(value, str) or not value:
        raise _fail(key, value, "a delay trace file (relative to the campaign file)")
    path = Path(value) if Path(value).is_absolute() or base_dir is None else base_dir / value
    if not path.is_file():
        raise ProfileError(f"{key}: {value!r} is not a file (looked for {path})")
    first = 0.0
    if check_files:
        try:
            first = load_delay_trace(path).steps[0][1]
        except TraceError as exc:
            raise ProfileError(f"{key}: {exc}") from None
    return {"delay_trace": str(path.resolve()), "delay_ms": first}


def _loss(value: Any, where: str) -> dict[str, Any]:
    table = _table(value, where, '{ model = "iid", pct = 1.0 }')
    model = table.get("model")
    if model not in LOSS_MODELS:
        raise _fail(f"{where}.model", model, ", ".join(LOSS_MODELS))
    if model == "none":
        _unknown(table, ("model",), where)
        return {"loss_pct": 0.0, "gilbert": None}
    if model == "iid":
        _unknown(table, ("model", "pct"), where)
        if "pct" not in table:
            raise ProfileError(f"{where}.pct: missing; give the loss in percent (0 <= pct < 100)")
        pct = table["pct"]
        if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 <= pct < 100:
            raise _fail(f"{where}.pct", pct, "a number >= 0 and < 100 (percent)")
        return {"loss_pct": float(pct), "gilbert": None}
    _unknown(table, ("model", "p", "r", "loss_good_pct", "loss_bad_pct"), where)
    values: dict[str, float] = {}
    for key in ("p", "r"):
        if key not in table:
            raise ProfileError(f"{where}.{key}: missing; a gilbert model needs p (good -> "
                               "bad) and r (bad -> good), probabilities per packet")
        got = _number(table, key, where, low=0.0, high=1.0, low_open=True)
        assert got is not None
        values[key] = got
    for key, default in (("loss_good_pct", 0.0), ("loss_bad_pct", 100.0)):
        got = _number(table, key, where, low=0.0, high=100.0, default=default)
        assert got is not None
        values[key] = got
    return {"loss_pct": 0.0, "gilbert": GilbertLoss(**values)}


def _queue(value: Any, where: str) -> dict[str, Any]:
    table = _table(value, where, '{ kind = "droptail", packets = 100 }')
    kind = table.get("kind", "droptail")
    if kind not in QUEUE_KINDS:
        raise _fail(f"{where}.kind", kind, ", ".join(QUEUE_KINDS))
    allowed = ("kind", "packets", "bytes") + (("target_ms", "interval_ms")
                                              if kind == "codel" else ())
    _unknown(table, allowed, where)
    packets = _integer(table, "packets", where, low=1, what="packets the queue holds")
    size = _integer(table, "bytes", where, low=MIN_QUEUE_BYTES,
                    what="bytes the queue holds; one full packet must fit")
    out: dict[str, Any] = {"queue_kind": kind,
                           "queue_packets": DEFAULT_QUEUE_PACKETS if packets is None
                           else packets, "queue_bytes": size}
    if kind == "codel":
        target = _number(table, "target_ms", where, low=0.0, high=10_000.0, low_open=True,
                         default=CODEL_TARGET_MS)
        assert target is not None
        interval = _number(table, "interval_ms", where, low=target, high=100_000.0,
                           default=CODEL_INTERVAL_MS)
        out.update(codel_target_ms=target, codel_interval_ms=interval)
    else:
        out.update(codel_target_ms=CODEL_TARGET_MS, codel_interval_ms=CODEL_INTERVAL_MS)
    return out


def link_fields(table: Mapping[str, Any], where: str, *, base_dir: Path | None,
                check_files: bool = True) -> dict[str, Any]:
    """The LinkSpec fields a table gives (only those it names), checked (rule 1)."""
    out = {**_capacity(table, where, base_dir, check_files),
           **_delay(table, where, base_dir, check_files)}
    if "loss" in table:
        out.update(_loss(table["loss"], f"{where}.loss"))
    if "queue" in table:
        out.update(_queue(table["queue"], f"{where}.queue"))
    offset = _number(table, "trace_offset_s", where, low=0.0, high=1e6)
    if offset is not None:
        out["trace_offset_s"] = offset
    if "trace_wrap" in table:
        if not isinstance(table["trace_wrap"], bool):
            raise _fail(f"{where}.trace_wrap", table["trace_wrap"], "true or false")
        out["trace_wrap"] = table["trace_wrap"]
    return out


def _build(fields: dict[str, Any], where: str, base: LinkSpec | None = None) -> LinkSpec:
    try:
        link = LinkSpec(**fields) if base is None else base.with_overrides(**fields)
    except ProfileError as exc:
        raise ProfileError(f"{where}.{exc}") from None
    if link.queue_kind == "codel" and not (link.trace_driven or link.shaped_rate):
        raise ProfileError(f"{where}.queue.kind: codel needs a bottleneck (traces or a rate); "
                           "an unlimited link never queues")
    return link


def _inherit(given: dict[str, Any]) -> dict[str, Any]:
    """GIVEN, plus the inherited fields it replaces as a group (rule 3)."""
    reset: dict[str, Any] = {}
    if any(k in given for k in CAPACITY_FIELDS):
        reset.update(dict.fromkeys(CAPACITY_FIELDS, None))
    if "delay_ms" in given and "delay_trace" not in given:
        reset["delay_trace"] = None
    return {**reset, **given}


def _host_extras(table: Mapping[str, Any], where: str) -> tuple[bool, str | None]:
    """A host table's ``unshaped`` and ``congestion_control`` (not link fields)."""
    cc = (check_congestion_control(table["congestion_control"], f"{where}.congestion_control")
          if "congestion_control" in table else None)
    unshaped = table.get("unshaped", False)
    if not isinstance(unshaped, bool):
        raise _fail(f"{where}.unshaped", unshaped, "true or false")
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
    table = _table(value, where, '{ rate_kbit = 100000, delay_ms = 1 }')
    _unknown(table, HOST_FIELDS, where)
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
    if other == name:
        base: LinkSpec | None = common
    else:
        profile = known(other) if isinstance(other, str) else None
        if profile is None:
            raise _fail(f"{where}.network", other, "a built-in network, one defined before "
                        f"this one, or {name!r} itself")
        base = profile.link
        if base is None:
            raise ProfileError(f"{where}.network: {other!r} has no link (unshaped); name a "
                               "shaped network")
    return _build(_inherit(given), where, base)


def parse_network(name: str, value: Any, *, where: str = "networks",
                  base_dir: Path | None = None, known: Known = lambda _: None,
                  check_files: bool = True) -> NetworkProfile:
    """One ``[networks.NAME]`` table as a profile (module rules)."""
    here = f"{where}.{name}"
    if not isinstance(name, str) or not _NAME.match(name):
        raise ProfileError(f"{here}: the name is not allowed; allowed: 1-32 of a-z, 0-9, _ "
                           "starting with a letter")
    table = _table(value, here, "delay_ms = 20")
    _unknown(table, NETWORK_FIELDS, here)
    description = table.get("description", "")
    if not isinstance(description, str):
        raise _fail(f"{here}.description", description, "a string")
    cc = check_congestion_control(table.get("congestion_control", DEFAULT_CONGESTION_CONTROL),
                                  f"{here}.congestion_control")
    if table.get("unshaped", False) is not False:
        if table["unshaped"] is not True:
            raise _fail(f"{here}.unshaped", table["unshaped"], "true or false")
        extra = [k for k in table if k not in ("description", "unshaped")]
        if extra:
            raise ProfileError(f"{here}.{extra[0]}: an unshaped network (unshaped = true) "
                               "has no link; leave out every link field")
        return NetworkProfile(name=name, link=None, description=description)
    common = _build(link_fields(table, here, base_dir=base_dir, check_files=check_files), here)
    hosts: list[tuple[str, LinkSpec]] = []
    host_cc: list[tuple[str, str]] = []
    raw_hosts = _table(table.get("hosts", {}), f"{here}.hosts", "{ central = { ... } }")
    for selector, host_value in raw_hosts.items():
        key = f"{here}.hosts.{selector}"
        if not _SELECTOR.match(str(selector)):
            raise ProfileError(f"{key}: not a host; allowed: an agent index (0, 1, ...), an "
                               f"agent name (a0, a1, ...), a host name or {CENTRAL_HOST}")
        link, own_cc = _host(name, str(selector), host_value, key, common, base_dir=base_dir,
                             known=known, check_files=check_files)
        if link is not None:
            hosts.append((str(selector), link))
        if own_cc is not None:
            host_cc.append((str(selector), own_cc))
    return NetworkProfile(name=name, link=common, congestion_control=cc, hosts=tuple(hosts),
                          description=description,
                          host_congestion_control=tuple(sorted(host_cc)))


def link_to_data(link: LinkSpec) -> dict[str, Any]:
    """A link as the table fields that parse back to it (rule 4)."""
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
    if link.gilbert is not None:
        g = link.gilbert
        out["loss"] = {"model": "gilbert", "p": g.p, "r": g.r,
                       "loss_good_pct": g.loss_good_pct, "loss_bad_pct": g.loss_bad_pct}
    elif link.loss_pct > 0:
        out["loss"] = {"model": "iid", "pct": link.loss_pct}
    queue: dict[str, Any] = {"kind": link.queue_kind, "packets": link.queue_packets}
    if link.queue_bytes is not None:
        queue["bytes"] = link.queue_bytes
    if link.queue_kind == "codel":
        queue.update(target_ms=link.codel_target_ms, interval_ms=link.codel_interval_ms)
    out["queue"] = queue
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

