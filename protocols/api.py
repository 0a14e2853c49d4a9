"""The public policy API, version 1: everything a policy written outside this repository
may use. Import from here, not from the modules behind it.

Stability promise (docs/policies.md, "Your own policy"): within API major version 1,
names exported here keep their meaning and signatures; additions bump the minor
version (``API_VERSION``). Hooks and their stall attribution are those of
``protocols.policies.base``; ``DerivationPolicy`` gives a derivation-current policy
the capture, frontier, refresh, predicate, single replan and fail-closed blocking of
Algorithm 1, so that it implements only ``obtain_heads`` (docs/policies.md, "How to add
a policy"); a policy-defined method costs exactly the bytes of its
frames and counts in the same columns as the built-in methods. Anything not exported
here (``protocols.policies._derivation`` and other underscored modules, node
internals) may change without notice.

A plugin is a module (or an installed distribution's entry point in the group
:data:`ENTRY_POINT_GROUP`) that defines ``Policy`` subclasses decorated with
``@register``; campaigns then name them like built-in policies.
"""

from __future__ import annotations

from protocols.env import ActionOutcome, ActionRequest, LocalStore, PolicyEnv, PolicyState
from protocols.errors import (
    IntegrityError,
    LocalProtocolError,
    PeerUnavailable,
    RemoteCallError,
    RemoteProtocolError,
    RpcError,
    RpcTimeout,
)
from protocols.identity import Roster
from protocols.policies._derivation import (
    DerivationPolicy,
    Evidence,
    Tally,
    all_or_raise,
    check_head,
    frontier_known,
    local_heads,
)
from protocols.policies.base import Policy
from protocols.policies.registry import make_policy, policy_names, register, unregister
from protocols.policy_params import Param, ParamError
from protocols.policy_rpc import (
    BUILTIN_METHODS,
    POLICY_FAULT,
    MemoryState,
    PolicyContext,
    Rpc,
)
from protocols.policy_schema import (
    Any_,
    Bool,
    Bytes,
    Float,
    Head,
    Int,
    List,
    Map,
    Optional,
    Schema,
    SchemaError,
    Str,
)
from protocols.records import HeadInfo, Record

API_VERSION = "1.1"  # 1.1: ActionRequest.critical, Param(named=...)
#: The entry-point group installed distributions register their plugin modules in.
ENTRY_POINT_GROUP = "planfence_testbed.policies"

__all__ = [
    "API_VERSION",
    "BUILTIN_METHODS",
    "ENTRY_POINT_GROUP",
    "POLICY_FAULT",
    "ActionOutcome",
    "ActionRequest",
    "Any_",
    "Bool",
    "Bytes",
    "DerivationPolicy",
    "Evidence",
    "Float",
    "Head",
    "HeadInfo",
    "Int",
    "IntegrityError",
    "List",
    "LocalProtocolError",
    "LocalStore",
    "Map",
    "MemoryState",
    "Optional",
    "Param",
    "ParamError",
    "PeerUnavailable",
    "Policy",
    "PolicyContext",
    "PolicyEnv",
    "PolicyState",
    "Record",
    "RemoteCallError",
    "RemoteProtocolError",
    "Roster",
    "Rpc",
    "RpcError",
    "RpcTimeout",
    "Schema",
    "SchemaError",
    "Str",
    "Tally",
    "all_or_raise",
    "check_head",
    "frontier_known",
    "local_heads",
    "make_policy",
    "policy_names",
    "register",
    "unregister",
]
