"""Static agent identities and the team roster.

Every agent (and the central directory) has one Ed25519 key pair. It signs records
with it, and the channel handshake uses the same key converted to X25519, so one
pinned public key per agent in the roster authenticates both records and
connections. Keys are derived from a seed so that a campaign is reproducible.

Episode binding: a controller derives every member's key from the campaign seed *and
an episode label* (:meth:`Identity.derive` with ``episode=``) and re-pins the whole
roster at each episode's reset. A record signed, or a handshake made, in another
episode (or in another campaign with the same seed) then fails verification against
the pinned keys: nothing of it is stored. Key sizes never change, so neither do frame
or record sizes (docs/architecture.md, "Threat model").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from nacl.signing import SigningKey, VerifyKey

from protocols.errors import LocalProtocolError

CENTRAL_ID = "central"


@dataclass(frozen=True)
class Identity:
    """An agent's private identity (only ever held by that agent's process)."""

    agent_id: str
    seed: bytes  # 32 bytes; the Ed25519 seed

    @classmethod
    def derive(cls, agent_id: str, campaign_seed: int | str, *,
               episode: str | None = None) -> Identity:
        """The key of ``agent_id`` in a campaign, bound to ``episode`` when given."""
        material = f"planfence-testbed/identity/{campaign_seed}/{agent_id}".encode()
        if episode is not None:  # length-delimited: no two (seed, episode, agent) collide
            label = episode.encode()
            material = (b"planfence-testbed/episode-identity/v1\x00"
                        + len(label).to_bytes(4, "big") + label + b"\x00" + material)
        return cls(agent_id, hashlib.blake2b(material, digest_size=32).digest())

    @cached_property
    def signing_key(self) -> SigningKey:
        return SigningKey(self.seed)

    @property
    def public_key(self) -> bytes:
        return bytes(self.signing_key.verify_key)

    def sign(self, message: bytes) -> bytes:
        return bytes(self.signing_key.sign(message).signature)


@dataclass(frozen=True)
class Member:
    """What every agent knows about a team member: pinned key and data-plane address."""

    agent_id: str
    public_key: bytes  # Ed25519 verify key, 32 bytes
    host: str
    port: int

    def to_wire(self) -> dict[str, object]:
        return {"agent_id": self.agent_id, "public_key": self.public_key,
                "host": self.host, "port": self.port}

    @classmethod
    def from_wire(cls, d: Mapping[str, object]) -> Member:
        agent_id, pk, host, port = d["agent_id"], d["public_key"], d["host"], d["port"]
        if not (isinstance(agent_id, str) and isinstance(pk, bytes) and len(pk) == 32
                and isinstance(host, str) and isinstance(port, int)):
            raise LocalProtocolError(f"bad roster member: {dict(d)!r}")
        return cls(agent_id, pk, host, port)


@dataclass(frozen=True)
class Roster:
    """The team: pinned identities and the single owner of each semantic key."""

    members: Mapping[str, Member]
    owners: Mapping[str, str]  # semantic key -> owner agent id
    agents: tuple[str, ...] = field(default=())  # replica agents in order (not central)

    def __post_init__(self) -> None:
        for key, owner in self.owners.items():
            if owner not in self.members:
                raise LocalProtocolError(f"key {key!r} owned by unknown agent {owner!r}")

    def verify_key(self, agent_id: str) -> VerifyKey:
        member = self.members.get(agent_id)
        if member is None:
            raise KeyError(agent_id)
        return VerifyKey(member.public_key)

    def owner_of(self, key: str) -> str:
        return self.owners[key]

    def keys_of(self, owner: str) -> list[str]:
        return sorted(k for k, o in self.owners.items() if o == owner)

    @property
    def keys(self) -> list[str]:
        return sorted(self.owners)

    def peers_of(self, agent_id: str) -> list[str]:
        return [a for a in self.agents if a != agent_id]

    def to_wire(self) -> dict[str, object]:
        return {"members": [m.to_wire() for m in self.members.values()],
                "owners": dict(self.owners), "agents": list(self.agents)}

    @classmethod
    def from_wire(cls, d: Mapping[str, object]) -> Roster:
        members_raw = d["members"]
        owners_raw = d["owners"]
        agents_raw = d.get("agents", [])
        if not isinstance(members_raw, list) or not isinstance(owners_raw, dict) \
                or not isinstance(agents_raw, list):
            raise LocalProtocolError("bad roster")
        members = {m.agent_id: m for m in (Member.from_wire(x) for x in members_raw)}
        return cls(members, {str(k): str(v) for k, v in owners_raw.items()},
                   tuple(str(a) for a in agents_raw))

    @classmethod
    def build(cls, members: Iterable[Member], owners: Mapping[str, str],
              agents: Iterable[str]) -> Roster:
        return cls({m.agent_id: m for m in members}, dict(owners), tuple(agents))
