"""The nodes' service times the simulator charges, measured on this host's real nodes.

Rules:

1. A calibration is measured by ``testbed calibrate sim``: ``testbed.tools.bench_rpc``
   calls one real node process on loopback through the production transport, and the
   medians become service times: ``exchange_ms`` (a request answered on a pooled
   connection, end to end), ``handshake_ms`` (what a new connection and the channel
   handshake add: the fresh median less the pooled one), ``install_ms`` and
   ``install_normal_ms`` (what an install of one record adds at durability ``full`` and
   ``normal``). Nothing is fitted to a run.
2. The file records the host, the code revision and the time it was measured with,
   and its ``id`` is a digest of all of them, so a result row names exactly the
   calibration it used.
3. A sim run without a calibration file is refused with one line naming the command
   that writes one; a file that does not parse, or a field outside its range, is one
   line naming the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from testbed.errors import UserError

#: Where ``testbed calibrate sim`` writes and ``--backend sim`` reads by default.
DEFAULT_PATH_ENV = "TESTBED_SIM_CALIBRATION"
FIELDS_MS = ("exchange_ms", "handshake_ms", "install_ms", "install_normal_ms")


def default_path() -> Path:
    env = os.environ.get(DEFAULT_PATH_ENV)
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "planfence-testbed" / "sim-calibration.json"


@dataclass(frozen=True)
class Calibration:
    """Service times in ms (rule 1) and where they were measured (rule 2)."""

    exchange_ms: float
    handshake_ms: float
    install_ms: float
    install_normal_ms: float
    host: str
    revision: str
    measured_at: str
    source: str = "testbed.tools.bench_rpc"

    def __post_init__(self) -> None:
        for name in FIELDS_MS:
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise UserError(f"calibration {name}: {value!r}; a number of ms >= 0")

    @property
    def id(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return "simcal-" + hashlib.sha256(text.encode()).hexdigest()[:12]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, **asdict(self)}

    @classmethod
    def from_bench(cls, figures: dict[str, Any], *, host: str, revision: str,
                   measured_at: str) -> Calibration:
        """Rule 1 from ``bench_rpc``'s figures."""
        reuse = float(figures["reuse_p50_ms"])
        return cls(exchange_ms=reuse,
                   handshake_ms=max(0.0, float(figures["fresh_p50_ms"]) - reuse),
                   install_ms=max(0.0, float(figures["install_full_p50_ms"]) - reuse),
                   install_normal_ms=max(0.0,
                                         float(figures["install_normal_p50_ms"]) - reuse),
                   host=host, revision=revision, measured_at=measured_at)


def load(path: Path | None = None) -> Calibration:
    """The calibration at PATH (default: :func:`default_path`), or a one-line UserError."""
    where = path or default_path()
    if not where.exists():
        raise UserError(f"sim calibration: {where} does not exist; measure one with "
                        f"`testbed calibrate sim` (or name one with --calibration FILE)")
    try:
        raw = json.loads(where.read_text())
        fields = {k: raw[k] for k in (*FIELDS_MS, "host", "revision", "measured_at")}
        calibration = Calibration(**fields, source=str(raw.get("source", "")))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"sim calibration {where}: not a calibration file "
                        f"({type(exc).__name__}: {exc})") from None
    if raw.get("id", calibration.id) != calibration.id:
        raise UserError(f"sim calibration {where}: id {raw.get('id')!r} does not match its "
                        f"contents ({calibration.id}); it was edited by hand")
    return calibration


def save(calibration: Calibration, path: Path | None = None) -> Path:
    where = path or default_path()
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(json.dumps(calibration.to_json(), indent=2, sort_keys=True) + "\n")
    return where


def measure(*, calls: int) -> Calibration:
    """Rule 1 on this host now: real node processes on loopback (no root needed)."""
    import datetime

    from testbed.results.provenance import git_revision, host_description
    from testbed.tools.bench_rpc import run_bench

    figures = run_bench(calls=calls)
    git = git_revision()
    revision = str(git["revision"]) + ("-dirty" if git.get("dirty") else "")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Calibration.from_bench(figures, host=str(host_description()["host"]),
                                  revision=revision, measured_at=now)
