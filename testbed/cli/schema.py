"""``testbed schema [campaign|network|networks|command|model]``: the JSON Schema of a file
a user writes, for editors that complete and check TOML (docs/campaigns.md, "Editor
setup"). The schema comes from the models that validate the files
(``testbed.campaign.schema``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

SCHEMA_NAMES = ("campaign", "network", "networks", "command", "model")


def cmd_schema(args: argparse.Namespace) -> int:
    from testbed.campaign.plugins import load, resolve_names
    from testbed.campaign.schema import schemas

    load(resolve_names(list(args.plugin or []), base_dir=None, where="--plugin"),
         where="--plugin")  # installed plugins too: their policies' parameters

    try:
        sys.stdout.write(json.dumps(schemas()[args.name], indent=2) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `testbed schema | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of a campaign file (or of a "
                                      "network, networks file, [command] or [model] table)")
    p.add_argument("name", nargs="?", default="campaign", choices=SCHEMA_NAMES,
                   help="which file or table (default campaign)")
    p.add_argument("--plugin", action="append", metavar="MODULE_OR_FILE",
                   help="load a policy plugin first, so its parameters are in the schema "
                        "(repeatable; installed plugins are always loaded)")
    p.set_defaults(func=cmd_schema)
