"""The allowed values of every campaign field, read from the registries that define them.

Nothing here keeps its own list of names: networks come from the profile registry
(``testbed.links.profiles``), policies from the policy registry (with their
parameters and whether they need the central directory), connection and durability
settings from the node that implements them, backends from the link layer, tiers and
workload bounds from the workload generator. Registering a profile or a policy is
therefore enough for a campaign file to name it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from nodes.store import DURABILITY_MODES
from nodes.transport import CONNECTION_SETTINGS, Connection
from protocols.policies import allowed_specs, describe_policy, make_policy
from protocols.policies.registry import normal_spec, policy_class
from protocols.records import WIRE_ENCODINGS as _WIRE_ENCODINGS
from testbed.campaign.workload import (
    FAMILIES,
    MAX_KEYS,
    MAX_SIM_AGENTS,
    MAX_UNITS,
    MIN_UNITS,
    TEMPLATES_PER_FAMILY,
    TIERS,
)
from testbed.links.backend import RUN_BACKEND_CHOICES
from testbed.links.profiles import profile_names

#: Nominal update rates a campaign may ask for: the paper's grid and the interpolated
#: rates its learned-selector study (D.10) holds out.
RHOS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
CONNECTIONS: tuple[Connection, ...] = CONNECTION_SETTINGS
DURABILITY: tuple[str, ...] = tuple(DURABILITY_MODES)
WIRE_ENCODINGS: tuple[str, ...] = tuple(_WIRE_ENCODINGS)
BACKENDS: tuple[str, ...] = RUN_BACKEND_CHOICES
MAX_TEMPLATES = len(FAMILIES) * TEMPLATES_PER_FAMILY
#: ``[execution] cluster`` and ``--cluster``: local:N or a scheduler's address.
CLUSTER_SPEC = re.compile(r"local:[1-9][0-9]*|(tcp|tls)://[^\s/:]+:[0-9]+")
CLUSTER_ALLOWED = "local:N (N >= 1) or tcp://HOST:PORT"
#: (lowest, highest) for the integer grid fields; ``agents`` up to the sim backend's
#: team, the packet-level backends' MAX_AGENTS is checked with the backend
#: (``testbed.campaign.networks.check_backend``).
INT_LIMITS: dict[str, tuple[int, int]] = {
    "keys": (1, MAX_KEYS), "agents": (2, MAX_SIM_AGENTS), "deps": (1, MAX_KEYS),
    "units": (MIN_UNITS, MAX_UNITS),
}

__all__ = [
    "BACKENDS",
    "CLUSTER_ALLOWED",
    "CLUSTER_SPEC",
    "CONNECTIONS",
    "DURABILITY",
    "INT_LIMITS",
    "MAX_TEMPLATES",
    "RHOS",
    "TIERS",
    "WIRE_ENCODINGS",
    "allowed_policies",
    "network_names",
    "normal_spec",
    "policy_allowed",
    "policy_exists",
    "policy_needs_central",
    "policy_problem",
]


def network_names() -> tuple[str, ...]:
    return profile_names()


def allowed_policies() -> str:
    """What a campaign may write as a policy, in words."""
    return allowed_specs()


def policy_allowed(spec: object) -> bool:
    if not isinstance(spec, str):
        return False
    try:
        make_policy(spec)
    except ValueError:
        return False
    return True


def policy_exists(spec: str) -> bool:
    """Whether the name part of ``spec`` is a registered policy."""
    return policy_class(spec.partition("/")[0]) is not None


def policy_problem(spec: str, table: Mapping[str, Any] | None = None) -> str | None:
    """What is wrong with ``spec`` (and a ``[policies.NAME]`` table), in one line; None
    if nothing."""
    try:
        make_policy(spec, table)
    except ValueError as exc:
        return str(exc)
    return None


def policy_needs_central(spec: str) -> bool:
    """Whether cells of this policy need the central metadata directory's host."""
    return describe_policy(spec).needs_central
