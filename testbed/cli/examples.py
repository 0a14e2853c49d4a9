"""``testbed examples list|copy NAME DIR``: the worked examples, found wherever the testbed
is installed (``testbed.tools.examples``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from testbed.cli.common import console


def cmd_examples(args: argparse.Namespace) -> int:
    from testbed.tools.examples import copy_example, describe, example_names, examples_dir

    out = console()
    if args.examples_cmd == "list":
        out.print(f"examples in {examples_dir()}", markup=False, soft_wrap=True)
        for name in example_names():
            out.print(f"  {name}: {describe(name)}", markup=False, soft_wrap=True)
        out.print("copy one with `testbed examples copy NAME DIR`", markup=False)
        return 0
    campaign = copy_example(args.name, Path(args.dir))
    out.print(f"copied {args.name} to {args.dir}; next: testbed check {campaign}",
              markup=False, soft_wrap=True)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("examples", help="list the worked examples or copy one to a folder")
    esub = p.add_subparsers(dest="examples_cmd", required=True, metavar="ACTION")
    esub.add_parser("list", help="every example with its description")
    copy = esub.add_parser("copy", help="copy example NAME into DIR (new or empty)")
    copy.add_argument("name", help="an example name (see `testbed examples list`)")
    copy.add_argument("dir", help="a new or empty folder")
    p.set_defaults(func=cmd_examples)
