"""The policy registry: a campaign names a policy, the registry builds and describes it.

Adding a policy touches one new file: subclass :class:`Policy`, decorate it with
``@register`` and import the module in ``protocols/policies/_all.py``. Its name is
then allowed in campaign files, its ``needs_central`` gives its cells a central host,
and reports label it with its ``title`` and ``category`` (nothing else to edit).
"""

from __future__ import annotations

from dataclasses import dataclass

from protocols.policies.base import Policy

_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"policy name {cls.name!r} empty or taken")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Forget a registered policy (tests and notebooks that registered their own)."""
    _REGISTRY.pop(name, None)


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def allowed_specs() -> str:
    """What a campaign may write as a policy, in words (for one-line errors)."""
    plain = ", ".join(policy_names())
    with_params = [f"{name}/K with K in {', '.join(map(str, cls.params))}"
                   for name, cls in sorted(_REGISTRY.items()) if cls.params]
    return ", ".join([plain, *with_params])


def make_policy(spec: str) -> Policy:
    """Build a policy from a campaign name such as ``planfence`` or ``metadata_sync/4``.

    Raises ValueError (naming the allowed specs) for an unknown name or a parameter
    the policy does not declare in ``params``.
    """
    name, sep, param = spec.partition("/") if isinstance(spec, str) else ("", "", "")
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"policy: unknown {spec!r}; allowed: {allowed_specs()}")
    if sep:
        if not (param.isdigit() and str(int(param)) == param and int(param) in cls.params):
            raise ValueError(f"policy: {spec!r} is not allowed; allowed: {allowed_specs()}")
        return cls(int(param))
    return cls()


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
