"""Policy registry: a campaign names a policy, the registry builds it.

Adding a policy touches one new file: subclass :class:`Policy`, decorate it with
``@register``, and import the module below.
"""

from __future__ import annotations

from protocols.policies.base import Policy

_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"policy name {cls.name!r} empty or taken")
    _REGISTRY[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def make_policy(spec: str) -> Policy:
    """Build a policy from a campaign name such as ``planfence`` or ``metadata_sync/4``."""
    name, _, param = spec.partition("/")
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"policy: unknown {spec!r}; allowed: {', '.join(policy_names())}")
    if param:
        if not param.isdigit() or int(param) < 1:
            raise ValueError(f"policy: {spec!r} needs a positive integer after '/'")
        return cls(int(param))
    return cls()


# Policy modules register themselves on import (kept at the bottom on purpose).
from protocols.policies import _all  # noqa: E402,F401
