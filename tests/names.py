"""Names from the registries, for tests (never a spelled-out list: tests/test_house.py).

A test that covers "every policy" or "every network" takes the names from here, so the
recipes of docs/architecture.md ("add a policy", "add a network profile") pass the
suite without editing a test: the new name is picked up, and tests that hold facts
about particular policies or networks parametrise over their own tables' keys.
"""

from __future__ import annotations

from protocols.policies import describe_policy, policy_names
from protocols.policies.registry import policy_class

TEST_PREFIX = "test_"
"""Policies tests register for themselves (node plugins) start with this."""


def policies(*categories: str) -> list[str]:
    """The project's registered policies (without tests' own, and without a plugin's an
    earlier test loaded into this process: node processes know only the project's and
    the campaign's own plugins), of CATEGORIES if given, in name order."""
    names = [n for n in policy_names() if not n.startswith(TEST_PREFIX)
             and policy_class(n).__module__.startswith("protocols.policies.")]
    if not categories:
        return names
    return [n for n in names if describe_policy(n).category in categories]


def derivation_current_policies() -> list[str]:
    return [n for n in policies() if describe_policy(n).derivation_current]


def central_policies() -> list[str]:
    return [n for n in policies() if describe_policy(n).needs_central]


def networks(*, shaped: bool | None = None, traced: bool | None = None,
             builtin: bool = False) -> list[str]:
    """Registered networks in registry order; SHAPED / TRACED filter on their common
    link (traced: both directions follow capacity traces); BUILTIN: only the shipped
    presets."""
    # imported here: node processes import test modules that use this file as plugins,
    # and the profiles pull in numpy, which would slow every node's start
    from testbed.links.profiles import builtin_names, network_template, profile_names

    out = []
    for name in builtin_names() if builtin else profile_names():
        profile = network_template(name)
        assert profile is not None
        link = profile.link
        if shaped is not None and (link is not None) != shaped:
            continue
        if traced is not None and (link is not None and link.trace_driven) != traced:
            continue
        out.append(name)
    return out
