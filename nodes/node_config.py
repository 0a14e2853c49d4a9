"""What a node's control ops carry: the configuration a ``configure`` sets, and the
checks of the arguments the ops take (a ControlError naming the field otherwise)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodes.control import ControlError, field
from nodes.transport import Connection
from protocols.errors import LocalProtocolError
from protocols.identity import Identity, Roster
from protocols.records import RECORD_ID_BYTES

MAX_ACTION_CHARS = 120  # record keys (plan/<action>/r<n>) are capped at 200


@dataclass
class NodeConfig:
    identity: Identity
    roster: Roster
    connection: Connection
    policy: str
    rpc_timeout_s: float
    durability: str
    store_path: Path
    congestion_control: str | None = None  # set per socket (rootless runs); None: default


def record_ids(value: object, name: str) -> tuple[bytes, ...]:
    if not isinstance(value, list) or not all(
            isinstance(v, bytes) and len(v) == RECORD_ID_BYTES for v in value):
        raise ControlError(f"{name}: expected a list of {RECORD_ID_BYTES}-byte record IDs")
    return tuple(value)


def nonempty_strs(value: object, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ControlError(f"{name}: expected a list of non-empty strings")
    return list(value)


def action_name(name: str) -> str:
    if not 0 < len(name) <= MAX_ACTION_CHARS or "/" in name:
        raise ControlError(f"action: must be 1..{MAX_ACTION_CHARS} characters without '/'")
    return name


def congestion_control_arg(args: Mapping[str, Any]) -> str | None:
    name = field(args, "congestion_control", (str, type(None)), default=None)
    if name is not None and not (0 < len(name) <= 15 and name.replace("_", "").isalnum()):
        raise ControlError(f"congestion_control: {name!r} is not a kernel algorithm name")
    return name  # type: ignore[no-any-return]


def ms_of_ns(ns: int) -> float:
    return ns / 1e6


def check_identity(identity: Identity, roster: Roster) -> None:
    member = roster.members.get(identity.agent_id)
    if member is None:
        raise ControlError(f"roster: has no member {identity.agent_id!r}")
    if member.public_key != identity.public_key:
        raise ControlError("identity_seed: does not match the roster's pinned key")


def episode_identity(args: Mapping[str, Any], cfg: NodeConfig) -> tuple[Identity, Roster] | None:
    """The identity and roster a ``reset`` binds the episode to (both or neither)."""
    if "identity_seed" not in args and "roster" not in args:
        return None
    seed = field(args, "identity_seed", bytes)
    if len(seed) != 32:
        raise ControlError("identity_seed: must be 32 bytes")
    try:
        roster = Roster.from_wire(field(args, "roster", dict))
    except (KeyError, LocalProtocolError) as exc:
        raise ControlError(f"roster: malformed ({exc})") from None
    me = roster.members.get(cfg.identity.agent_id)
    old = cfg.roster.members[cfg.identity.agent_id]
    if me is not None and (me.host, me.port) != (old.host, old.port):
        raise ControlError("roster: a reset keeps the node's data-plane address")
    identity = Identity(cfg.identity.agent_id, seed)
    check_identity(identity, roster)
    return identity, roster
