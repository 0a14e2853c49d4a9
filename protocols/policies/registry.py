"""The policy registry: a campaign names a policy, the registry builds and describes it.

Adding a policy touches one new file: subclass :class:`Policy`, decorate it with
``@register`` and import the module in ``protocols/policies/_all.py`` (or ship it in
a plugin: docs/policies.md, "Your own policy"). Its name is then allowed in campaign
files, its ``needs_central`` gives its cells a central host, and reports label it with
its ``title`` and ``category`` (nothing else to edit).

Rules:

1. ``register`` refuses (``ValueError``, one line) an empty or taken name, a parameter
   declaration that is not a tuple of ``Param``, and an RPC whose name is a built-in
   method or is taken by a different declaration (``protocols.policy_rpc`` rule 1).
2. A spec is ``NAME[/K][/field=value...]`` (``protocols.policy_params``); ``make_policy``
   builds the object with every setting resolved; a bad spec is one ``ValueError``
   line naming the field and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from protocols.policies.base import Policy
from protocols.policy_params import (
    Param,
    ParamError,
    canonical_spec,
    resolve_settings,
    split_spec,
)
from protocols.policy_rpc import Rpc, check_rpc

_REGISTRY: dict[str, type[Policy]] = {}
_RPCS: dict[str, tuple[Rpc, set[str]]] = {}  # wire name -> (declaration, policies using it)
BUILTIN_PREFIX = "protocols.policies."


def is_builtin(name: str) -> bool:
    cls = _REGISTRY.get(name)
    return cls is not None and cls.__module__.startswith(BUILTIN_PREFIX)


def register(cls: type[Policy]) -> type[Policy]:
    if not cls.name or not isinstance(cls.name, str) or "/" in cls.name or "=" in cls.name:
        raise ValueError(f"policy name {cls.name!r}: empty or contains '/' or '='")
    if cls.name in _REGISTRY:
        kind = "a built-in policy" if is_builtin(cls.name) else "a registered policy"
        raise ValueError(f"policy name {cls.name!r} collides with {kind}")
    if not isinstance(cls.parameters, tuple) or not all(
            isinstance(p, Param) for p in cls.parameters):
        raise ValueError(f"policy {cls.name!r}: parameters must be a tuple of Param")
    if not isinstance(cls.rpcs, tuple) or not all(isinstance(r, Rpc) for r in cls.rpcs):
        raise ValueError(f"policy {cls.name!r}: rpcs must be a tuple of Rpc")
    for rpc in cls.rpcs:
        check_rpc(rpc)
        taken = _RPCS.get(rpc.name)
        if taken is not None and taken[0] is not rpc:
            raise ValueError(f"policy {cls.name!r}: rpc {rpc.name!r} collides with the one "
                             f"of {', '.join(sorted(taken[1]))}")
    for rpc in cls.rpcs:
        _RPCS.setdefault(rpc.name, (rpc, set()))[1].add(cls.name)
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Forget a registered policy (tests and notebooks that registered their own)."""
    cls = _REGISTRY.pop(name, None)
    for rpc in () if cls is None else cls.rpcs:
        users = _RPCS.get(rpc.name, (rpc, set()))[1]
        users.discard(name)
        if not users:
            _RPCS.pop(rpc.name, None)


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[Policy] | None:
    return _REGISTRY.get(name)


def rpc_named(method: str) -> Rpc | None:
    """The declaration of a policy-defined method, None for any other name."""
    entry = _RPCS.get(method)
    return None if entry is None else entry[0]


def allowed_specs() -> str:
    """What a campaign may write as a policy, in words (for one-line errors)."""
    plain = ", ".join(policy_names())
    with_params = [f"{name}/K with K in {', '.join(map(str, cls.params))}"
                   for name, cls in sorted(_REGISTRY.items()) if cls.params]
    named = [f"{name}/FIELD=VALUE with FIELD in {', '.join(p.name for p in cls.parameters)}"
             for name, cls in sorted(_REGISTRY.items()) if cls.parameters]
    return ", ".join([plain, *with_params, *named])


def make_policy(spec: str, table: Mapping[str, Any] | None = None) -> Policy:
    """Build a policy from a campaign spec such as ``planfence``, ``metadata_sync/4`` or
    ``mylease/lease_ms=500``; ``table`` holds settings of a ``[policies.NAME]`` table
    (the spec's own settings win).

    Raises ValueError (naming the allowed specs, or the field and its allowed values)
    for an unknown name, a positional parameter the policy does not declare in
    ``params``, or a bad setting.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"policy: unknown {spec!r}; allowed: {allowed_specs()}")
    cls = _REGISTRY.get(spec.partition("/")[0])
    if cls is None:
        raise ValueError(f"policy: unknown {spec!r}; allowed: {allowed_specs()}")
    try:
        parts = split_spec(spec)
    except ParamError as exc:
        raise ValueError(f"policy {spec!r}: {exc}") from None
    if parts.positional is not None and parts.positional not in cls.params:
        raise ValueError(f"policy: {spec!r} is not allowed; allowed: {allowed_specs()}")
    try:
        settings = resolve_settings(cls.parameters, parts.given, table)
    except ParamError as exc:
        raise ValueError(f"policy {spec!r}: {exc}") from None
    policy = cls(parts.positional) if parts.positional is not None else cls()
    policy.settings = settings
    return policy


def normal_spec(spec: str, table: Mapping[str, Any] | None = None) -> str:
    """The one spelling of ``spec`` with ``table`` applied (a cell's policy)."""
    policy = make_policy(spec, table)
    return canonical_spec(type(policy).name, policy.param, type(policy).parameters,
                          policy.settings)


@dataclass(frozen=True)
class PolicyInfo:
    """What the testbed and its reports need to know of a policy spec."""

    spec: str
    name: str
    title: str
    category: str
    needs_central: bool
    derivation_current: bool
    has_unit_end_hook: bool


def describe_policy(spec: str) -> PolicyInfo:
    policy = make_policy(spec)
    cls = type(policy)
    return PolicyInfo(spec=spec, name=cls.name, title=policy.title, category=policy.category,
                      needs_central=cls.needs_central,
                      derivation_current=policy.category == Policy.DERIVATION_CURRENT,
                      has_unit_end_hook=cls.at_unit_end is not Policy.at_unit_end)
