"""The JSON Schema of ``[policies.NAME]`` tables: each registered policy's parameters
(``protocols.policy_params.Param``) with their types, ranges, choices and defaults, read
from the policy registry when asked, so a plugin's policy is in it once it is loaded
(``testbed schema --plugin``). The parameters are checked by the registry itself
(``make_policy``); this only tells an editor what they are."""

from __future__ import annotations

from typing import Any

from protocols.policies.registry import policy_class, policy_names
from protocols.policy_params import Param

_TYPES = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}


def param_schema(param: Param) -> dict[str, Any]:
    """One parameter's schema."""
    out: dict[str, Any] = {"type": _TYPES[param.kind]}
    if param.choices:
        out["enum"] = list(param.choices)
    if param.lo is not None:
        out["minimum"] = param.lo
    if param.hi is not None:
        out["maximum"] = param.hi
    if param.named:
        out = {"anyOf": [out, {"enum": list(param.named)}]}
    out["default"] = param.default
    if param.doc:
        out["description"] = param.doc
    return out


def policies_schema() -> dict[str, Any]:
    """``[policies]``: a table per registered policy, of its parameters; a name the
    registry does not know (a plugin not loaded here) is any table."""
    properties: dict[str, Any] = {}
    for name in policy_names():
        cls = policy_class(name)
        params = cls.parameters if cls is not None else ()
        properties[name] = {"type": "object", "additionalProperties": False,
                            "properties": {p.name: param_schema(p) for p in params}}
    return {"type": "object", "description": "a policy's parameters for every cell naming "
            "it (`testbed policies show NAME`)", "properties": properties,
            "additionalProperties": {"type": "object"}}
