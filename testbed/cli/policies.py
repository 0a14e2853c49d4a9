"""``testbed policies list|show NAME``: built-in and plugin policies, their parameters,
methods and category."""

from __future__ import annotations

import argparse
from typing import Any

from testbed.cli.common import console
from testbed.errors import UserError


def _load(args: argparse.Namespace) -> None:
    from testbed.campaign.plugins import load, resolve_names
    from testbed.campaign.vocabulary import allowed_policies  # noqa: F401 (registers all)

    load(resolve_names(list(args.plugin), base_dir=None, where="--plugin"), where="--plugin")


def _origin(name: str) -> str:
    from nodes.plugins import plugin_of
    from protocols.policies.registry import is_builtin

    if is_builtin(name):
        return "built-in"
    info = plugin_of(name)
    if info is None:
        return "registered"
    dist = f"{info.distribution} {info.version}" if info.distribution else info.module
    return f"plugin {info.name} ({dist})"


def cmd_list(args: argparse.Namespace) -> int:
    from protocols.policies import make_policy, policy_names
    from protocols.policies.registry import policy_class

    _load(args)
    out = console()
    for name in policy_names():
        cls = policy_class(name)
        assert cls is not None
        policy = make_policy(name)
        extras = [f"{len(cls.parameters)} parameters"] if cls.parameters else []
        extras += [f"/K in {', '.join(map(str, cls.params))}"] if cls.params else []
        extras += [f"rpcs {', '.join(r.name for r in cls.rpcs)}"] if cls.rpcs else []
        extras += ["central"] if cls.needs_central else []
        out.print(f"{name:32} {policy.category:26} {_origin(name):24} {'; '.join(extras)}",
                  markup=False)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from protocols.policies import make_policy
    from protocols.policies.registry import policy_class

    _load(args)
    cls = policy_class(args.name)
    if cls is None:
        from protocols.policies import allowed_specs

        raise UserError(f"NAME: {args.name!r} is not a policy; allowed: {allowed_specs()}")
    policy = make_policy(args.name)
    lines = [f"{cls.name}: {policy.title}", f"  origin: {_origin(cls.name)}",
             f"  category: {policy.category}", f"  needs central: {cls.needs_central}",
             f"  off-path hooks: {', '.join(sorted(cls.off_path_hooks)) or '-'}"]
    if cls.params:
        lines.append(f"  positional /K: {', '.join(map(str, cls.params))}")
    for param in cls.parameters:
        lines.append(f"  parameter {param.name} ({param.kind}, default "
                     f"{param.default!r}): {param.allowed()}"
                     + (f" - {param.doc}" if param.doc else ""))
    for rpc in cls.rpcs:
        lines.append(f"  rpc {rpc.describe()}" + (f" - {rpc.doc}" if rpc.doc else ""))
    doc = (cls.__doc__ or "").strip().splitlines()
    if doc:
        lines.append(f"  {doc[0]}")
    out = console()
    for line in lines:
        out.print(line, markup=False)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("policies", help="list or show the policies a campaign may name")
    inner = p.add_subparsers(dest="policies_cmd", required=True, metavar="WHAT")
    for name, func, helptext in (("list", cmd_list, "every policy, one a line"),
                                 ("show", cmd_show, "one policy's parameters and methods")):
        q = inner.add_parser(name, help=helptext)
        if name == "show":
            q.add_argument("name", help="policy name")
        q.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                       help="import a policy plugin first (module or .py file)")
        q.set_defaults(func=func)
