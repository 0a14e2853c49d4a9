"""Coordination policies, one file each, behind one registry (``registry.py``).

``make_policy("metadata_sync/4")`` builds one; ``describe_policy`` says what a spec
is (title, category, whether it needs the central directory). Importing this package
imports every policy module (``_all.py``), so every name is registered.
"""

from __future__ import annotations

import protocols.policies._all  # noqa: F401  (registers every policy)
from protocols.policies.base import Policy
from protocols.policies.registry import (
    PolicyInfo,
    allowed_specs,
    describe_policy,
    make_policy,
    policy_names,
    register,
)

__all__ = ["Policy", "PolicyInfo", "allowed_specs", "describe_policy", "make_policy",
           "policy_names", "register"]
