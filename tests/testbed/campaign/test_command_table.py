"""Command workloads: the [command] table, its checks and the schedule file (pure)."""

from __future__ import annotations

import base64
import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.campaign.command import COMMAND_KIND, command_to_data
from testbed.campaign.parse import campaign_from_config, parse_campaign
from testbed.campaign.schedule_file import schedule_document
from testbed.campaign.workload import Act, Plan, Update
from testbed.errors import UserError

BASE: dict[str, Any] = {
    "name": "own", "seed": 3, "templates": 2, "kind": "command",
    "networks": {"lte": {"rate_kbit": 5000, "delay_ms": 20,
                         "hosts": {"server": {"unshaped": True},
                                   "a1": {"congestion_control": "reno"}}}},
    "command": {"name": "kv", "hosts": ["server"], "timeout_s": 30, "unit_ms": 50,
                "env": {"MODE": "fast"},
                "run": [{"on": "server", "cmd": "python3 server.py 7000", "service": True,
                         "ready": "tcp:7000"},
                        {"on": "agents", "argv": ["python3", "client.py", "{addr:server}"],
                         "env": {"VERBOSE": 1}}]},
    "grid": {"network": ["lte", "fixed"], "agents": [2, 3], "units": [8], "keys": [4]},
}


def campaign(**changes: Any) -> Any:
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        where = data
        *parents, last = path.split("__")
        for key in parents:
            where = where[int(key)] if isinstance(where, list) else where[key]
        if value is None:
            del where[last]
        else:
            where[last] = value
    return parse_campaign(data, base_dir=None)


def test_a_command_campaign_parses_and_round_trips() -> None:
    camp = campaign()
    assert camp.kind == COMMAND_KIND
    assert camp.command is not None
    assert [r.service for r in camp.command.runs] == [True, False]
    assert camp.command.runs[0].argv == ("python3", "server.py", "7000")
    assert camp.command.runs[0].ready == "tcp:7000"
    assert camp.command.hosts_of(camp.command.runs[1], ["a0", "a1"]) == ["a0", "a1"]
    cells = camp.cells()
    assert {c.policy for c in cells} == {"kv"}  # the command's name is the default policy
    assert not any(c.needs_central for c in cells)
    assert len(camp.episodes()) == 2 * 2 * 2
    again = campaign_from_config(camp.config())
    assert again.command == camp.command
    assert again.config() == camp.config()
    assert command_to_data(camp.command)["lead_ms"] == 1000.0


def test_policies_are_labels_of_the_program_variants() -> None:
    camp = campaign(grid__policy=["fast", "safe"])
    assert {c.policy for c in camp.cells()} == {"fast", "safe"}


@pytest.mark.parametrize(("changes", "message"), [
    ({"command": None}, r"command: missing; a kind = \"command\" campaign needs"),
    ({"command__run": []}, r"command.run: missing"),
    ({"command__run__1__on": "nobody"}, r"command.run\[1\].on: 'nobody' is not allowed"),
    ({"command__run__1__on": "a2"}, r"command.run\[1\].on: 'a2' is not allowed"),
    ({"command__run__0__ready": "tcp:99999"}, r"command.run\[0\].ready: 'tcp:99999'"),
    ({"command__run__1__service": True}, r"command.run: every run is a service"),
    ({"command__run__1__cmd": "x"}, r"command.run\[1\]: give the command as argv"),
    ({"command__run__0__cmd": "  "}, r"command.run\[0\].cmd: '  ' is not allowed"),
    ({"command__run__0__cmd": None, "command__run__0__argv": []},
     r"command.run\[0\].argv: \[\] is not allowed"),
    ({"command__run__0__oops": 1}, r"command.run\[0\]: unknown field 'oops'"),
    ({"command__run__1__argv": ["c", "{addr:srv}"]},
     r"command.run\[1\]: \{addr:srv\}: 'srv' is not allowed; allowed: a host"),
    ({"command__timeout_s": 0}, r"command.timeout_s: 0 is not allowed"),
    ({"command__unit_ms": "fast"}, r"command.unit_ms: 'fast' is not allowed"),
    ({"command__lead_ms": -1}, r"command.lead_ms: -1 is not allowed"),
    ({"command__hosts": ["a9"]}, r"command.hosts: 'a9' is not allowed"),
    ({"command__hosts": ["s", "s"]}, r"command.hosts: .* each host once"),
    ({"command__env": {"TESTBED_SEED": "1"}}, r"command.env.TESTBED_SEED"),
    ({"command__env": {"X": [1]}}, r"command.env.X: \[1\] is not allowed"),
    ({"command__env": {"LABEL": "{polcy}"}},
     r"^command.env.LABEL: '\{polcy\}' is not a placeholder; allowed: \{policy\}, "
     r"\{episode\}, \{seed\}, \{host\}, \{addr\}, \{addr:NAME\}, \{hosts\}$"),
    ({"command__run__1__env": {"V": "run-{seed}-{variant}"}},
     r"^command.run\[1\].env.V: '\{variant\}' is not a placeholder; allowed: \{policy\}"),
    ({"command__run__1__env": {"V": "{host:a0}"}}, r"'\{host:a0\}' is not a placeholder"),
    ({"command__env": {"PEER": "{addr:srv}"}},
     r"command.env.PEER: \{addr:srv\}: 'srv' is not allowed; allowed: a host \(a0, a1, "
     r"server\)"),
    ({"command__name": "has space"}, r"command.name: 'has space' is not allowed"),
    ({"command__cwd": 3}, r"command.cwd: 3 is not allowed"),
    ({"grid__policy": ["a b"]}, r"grid.policy: 'a b' is not allowed"),
    ({"kind": "episodes", "grid__policy": ["planfence"]},
     r"command: only for kind = \"command\" campaigns"),
    ({"networks__lte__hosts__srv": {"unshaped": True}},
     r"networks.lte.hosts.srv: 'srv' is not a host name; allowed: .*a0..a1\), server or "
     r"central"),
])
def test_bad_command_tables_are_one_line_errors(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message) as info:
        campaign(**changes)
    assert "\n" not in str(info.value)


def test_placeholders_fill_env_values_as_they_fill_argv() -> None:
    """`{policy}` and the rest reach a program's environment filled in, never literally;
    other braces in env values are refused (above), JSON-like text passes."""
    from testbed.campaign.model import episode_key
    from testbed.net.commands import substitute
    from testbed.run.command_runner import episode_specs

    camp = campaign(command__env={"LABEL": "{policy}@{episode}", "CONF": '{"a": 1}'},
                    command__run__1__env={"ME": "{host}={addr}", "S": "{addr:server}",
                                          "SEED": "{seed}"})
    cell = camp.cells()[0]
    schedule = camp.schedule(cell, camp.templates[0])
    key = episode_key(cell, schedule.template)
    pairs = episode_specs(camp.command, cell, schedule, key=key, seed=42)
    spec, env = pairs[-1]
    assert env["LABEL"] == f"kv@{key}"
    assert env["CONF"] == '{"a": 1}'
    assert env["SEED"] == "42"
    addresses = {"a0": "198.18.0.1", "a1": "198.18.0.2", "server": "198.18.0.3"}
    filled = {k: substitute((v,), spec.host, addresses)[0] for k, v in env.items()}
    assert filled["ME"] == f"{spec.host}={addresses[spec.host]}"
    assert filled["S"] == "198.18.0.3"


def test_testbed_check_refuses_a_bad_table_before_anything_exists(tmp_path: Path) -> None:
    text = (
        'name = "bad"\nseed = 1\ntemplates = 1\nkind = "command"\n'
        '[command]\n[[command.run]]\non = "server"\ncmd = "true"\n'
        '[grid]\nnetwork = ["fixed"]\n')
    (tmp_path / "bad.toml").write_text(text)
    proc = subprocess.run([sys.executable, "-m", "testbed", "run", "bad.toml", "--out", "out"],
                          cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert "command.run[0].on: 'server' is not allowed" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_schedule_file_paces_the_seeded_schedule() -> None:
    camp = campaign()
    cell = camp.cells()[0]
    schedule = camp.schedule(cell, camp.templates[0])
    doc = schedule_document(schedule, episode="e/1", unit_ms=50.0, lead_ms=500.0,
                            program_seed=9)
    assert doc["agents"] == list(schedule.agents)
    assert doc["digest"] == schedule.digest
    assert len(doc["events"]) == len(schedule.events)
    for item, event in zip(doc["events"], schedule.events, strict=True):
        assert item["t_ms"] == 500.0 + 50.0 * event.unit
        if isinstance(event, Update):
            assert (item["kind"], item["owner"]) == ("update", event.owner)
            assert base64.b64decode(item["content_b64"]) == event.content
        elif isinstance(event, Plan):
            assert (item["kind"], item["planner"]) == ("plan", event.planner)
        else:
            assert isinstance(event, Act)
            assert (item["kind"], item["executor"]) == ("act", event.executor)
    for host, indices in doc["by_host"].items():
        for i in indices:
            item = doc["events"][i]
            assert host == item.get("owner", item.get("planner", item.get("executor")))
    assert sum(len(v) for v in doc["by_host"].values()) == len(doc["events"])
