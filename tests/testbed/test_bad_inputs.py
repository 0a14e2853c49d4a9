"""What a user meets first: every bad input is one line, the right exit status, and
nothing created.

Each case runs ``testbed`` (``testbed.cli.main``, in this process) in a folder holding
the files the case needs and asserts: the exit status (2 for the user's input, 3 for
what this host lacks), exactly one line on stderr naming the field (no traceback), and
that the folder holds exactly what it held before (no run directory, no plot, no
copy). Inputs that are allowed but probably a mistake are warnings (exit 0, one
``warning:`` line each), in the second table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from testbed.cli import main
from testbed.links.netem import netem_available

BASE = """name = "c"
seed = 1
templates = 1
{top}
[options]
{options}
{networks}
[grid]
policy = ["planfence"]
network = ["{network}"]
agents = [2]
keys = [2]
units = [8]
{grid}
"""


def campaign(*, top: str = "", options: str = "", networks: str = "", grid: str = "",
             network: str = "loopback") -> str:
    return BASE.format(top=top, options=options, networks=networks, grid=grid,
                       network=network)


def own(table: str, *, grid: str = "", options: str = "", network: str = "mine") -> str:
    """A campaign with a network of its own, ``[networks.mine]`` holding TABLE."""
    return campaign(networks=f"[networks.mine]\n{table}\n", grid=grid, options=options,
                    network=network)


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    code: int
    fragment: str
    files: dict[str, str | bytes] = field(default_factory=dict)


def check(text: str, *extra: str) -> tuple[str, ...]:
    """argv of `testbed check c.toml` (the campaign written as c.toml)."""
    return ("check", "c.toml", *extra)


def bad_campaign(id: str, text: str, fragment: str, code: int = 2) -> Case:
    return Case(id, check(text), code, fragment, {"c.toml": text})


def bad_own(id: str, table: str, fragment: str, **kw: str) -> Case:
    return bad_campaign(id, own(table, **kw), fragment)


TRACES = {"t/ok.up": "0\n5\n10\n", "t/ok.down": "1\n2\n"}
OK_TRACES = 'up_trace = "t/ok.up"\ndown_trace = "t/ok.down"'


def bad_trace(id: str, content: str | bytes, fragment: str) -> Case:
    text = own('up_trace = "t/bad.up"\ndown_trace = "t/ok.down"')
    return Case(id, check(text), 2, fragment, {"c.toml": text, **TRACES, "t/bad.up": content})


def bad_delay_trace(id: str, content: str | bytes, fragment: str) -> Case:
    text = own('delay_trace = "t/d.txt"')
    return Case(id, check(text), 2, fragment, {"c.toml": text, "t/d.txt": content})


CASES: list[Case] = [
    # --- the command line itself ----------------------------------------------------------
    Case("no-command", (), 2, "the following arguments are required: COMMAND"),
    Case("unknown-command", ("fly",), 2, "argument COMMAND: invalid choice: 'fly'"),
    Case("check-no-campaign", ("check",), 2, "the following arguments are required: campaign"),
    Case("run-no-campaign", ("run",), 2, "the following arguments are required: campaign"),
    Case("unknown-flag", ("check", "demo", "--fast"), 2, "unrecognized arguments: --fast"),
    Case("jobs-zero", ("check", "demo", "--jobs", "0"), 2, "argument --jobs: '0' is not allowed"),
    Case("jobs-negative", ("run", "demo", "--jobs", "-1"), 2, "argument --jobs: '-1' is not"),
    Case("jobs-word", ("run", "demo", "--jobs", "many"), 2, "argument --jobs: 'many' is not"),
    Case("templates-word", ("check", "demo", "--templates", "x"), 2,
         "argument --templates: invalid int value: 'x'"),
    Case("templates-zero", ("check", "demo", "--templates", "0"), 2,
         "--templates: 0 is not allowed; allowed: 1..30"),
    Case("templates-too-many", ("run", "demo", "--templates", "31"), 2,
         "--templates: 31 is not allowed"),
    Case("backend-unknown", ("check", "demo", "--backend", "kernel"), 2,
         "argument --backend: invalid choice: 'kernel'"),
    Case("cluster-bogus-dry-run", ("run", "demo", "--cluster", "bogus", "--dry-run"), 2,
         "argument --cluster: 'bogus' is not allowed; allowed: local:N (N >= 1) or"),
    Case("cluster-local-zero", ("run", "demo", "--cluster", "local:0"), 2,
         "argument --cluster: 'local:0' is not allowed"),
    Case("cluster-no-port", ("run", "demo", "--cluster", "tcp://host"), 2,
         "argument --cluster: 'tcp://host' is not allowed"),
    Case("resume-and-extend", ("run", "demo", "--resume", "--extend"), 2,
         "argument --extend: not allowed with argument --resume"),
    Case("resume-a-missing-dir", ("run", "c.toml", "--out", "gone", "--resume"), 2,
         "--resume: gone does not exist; there is no run to resume (check --out, or drop "
         "--resume to start a new run there)", {"c.toml": campaign()}),
    Case("extend-a-missing-dir", ("run", "c.toml", "--out", "gone", "--extend"), 2,
         "--extend: gone does not exist; there is no run to extend", {"c.toml": campaign()}),
    Case("out-empty", ("run", "demo", "--out", ""), 2, "--out: empty; allowed: a directory"),
    Case("out-a-file", ("run", "demo", "--out", "afile"), 2,
         "--out: afile is not a directory", {"afile": "x"}),
    Case("out-under-a-file", ("run", "demo", "--out", "afile/sub"), 2,
         "--out: afile/sub cannot be a directory: afile is a file", {"afile": "x"}),
    Case("workdir-a-file", ("run", "c.toml", "--workdir", "afile", "--out", "o"), 2,
         "--workdir: afile is not a directory", {"afile": "x", "c.toml": campaign()}),
    Case("workdir-empty", ("run", "c.toml", "--workdir", "", "--out", "o"), 2,
         "--workdir: empty", {"c.toml": campaign()}),
    Case("link-log-on-a-cluster", ("run", "c.toml", "--cluster", "local:1", "--out", "o"), 2,
         "options.link_log: packet logs are written by runs in this process",
         {"c.toml": campaign(options="link_log = true")}),
    Case("draws-zero", ("report", "run", "--draws", "0"), 2,
         "argument --draws: '0' is not allowed; allowed: an integer >= 1"),
    Case("draws-negative", ("report", "run", "--draws", "-5"), 2,
         "argument --draws: '-5' is not allowed"),
    Case("seed-word", ("report", "run", "--seed", "x"), 2, "argument --seed: invalid int"),
    Case("report-missing-dir", ("report", "nowhere"), 2, "nowhere has no episodes.parquet"),
    Case("report-a-file", ("report", "afile"), 2, "afile has no episodes.parquet",
         {"afile": "x"}),
    Case("report-unknown-episode", ("report", "run", "--episode", "nosuch"), 2,
         "--episode: 'nosuch' is not an episode of this run"),
    Case("report-episode-without-log", ("report", "run", "--episode", "LOGLESS"), 2,
         "has no packet log; no episode of this run has one"),
    Case("report-episode-folder-form", ("report", "run", "--episode", "LOGLESS~"), 2,
         "has no packet log"),
    Case("plot-format", ("networks", "show", "att", "--plot", "x.txt"), 2,
         "argument --plot: x.txt: format '.txt' is not allowed; allowed: .png, .pdf, .svg"),
    Case("plot-no-suffix", ("traces", "show", "ATT-LTE-driving.up", "--plot", "x"), 2,
         "argument --plot: x: format '(none)' is not allowed"),
    Case("plot-under-a-file", ("networks", "show", "att", "--plot", "afile/x.png"), 2,
         "argument --plot: afile/x.png: afile is a file, not a folder", {"afile": "x"}),
    Case("plot-a-directory", ("traces", "show", "ATT-LTE-driving.up", "--plot", "d.png"), 2,
         "argument --plot: d.png is a directory", {"d.png/keep": "x"}),
    Case("bench-json-under-a-file", ("bench", "rpc", "--json", "afile/x.json"), 2,
         "argument --json: afile/x.json: afile is a file, not a folder", {"afile": "x"}),
    Case("bench-unknown", ("bench", "speed"), 2, "argument WHICH: invalid choice: 'speed'"),
    Case("traces-unknown-name", ("traces", "show", "nosuch.up"), 2, "trace: unknown name "
         "'nosuch.up'"),
    Case("traces-missing-path", ("traces", "show", "./nosuch.up"), 2,
         "./nosuch.up: no such file"),
    Case("traces-a-directory", ("traces", "show", "t"), 2, "t: is a directory",
         {"t/x.up": "1\n"}),
    Case("traces-no-direction", ("traces", "show", "mine.txt"), 2,
         "cannot tell the direction from the name; pass --direction", {"mine.txt": "1\n"}),
    Case("traces-bad-direction", ("traces", "show", "mine.txt", "--direction", "left"), 2,
         "argument --direction: invalid choice: 'left'"),
    Case("traces-bom", ("traces", "show", "b.up"), 2,
         "starts with a UTF-8 byte order mark", {"b.up": b"\xef\xbb\xbf1\n"}),
    Case("networks-unknown", ("networks", "show", "mars"), 2, "network: unknown profile 'mars'"),
    Case("networks-defined-without-campaign", ("networks", "show", "mine"), 2,
         "a network a campaign file defines needs --campaign FILE"),
    Case("networks-campaign-missing", ("networks", "list", "--campaign", "gone.toml"), 2,
         "campaign: 'gone.toml' is not a file"),
    Case("examples-unknown", ("examples", "copy", "nosuch", "ex"), 2,
         "example: 'nosuch' is not one of "),
    Case("examples-into-a-file", ("examples", "copy", "mixed-team", "afile"), 2,
         "DIR: afile is a file", {"afile": "x"}),
    Case("examples-into-a-full-folder", ("examples", "copy", "mixed-team", "full"), 2,
         "DIR: full is not empty", {"full/x": "x"}),
    Case("examples-under-a-file", ("examples", "copy", "mixed-team", "afile/ex"), 2,
         "DIR: afile is a file, so afile/ex cannot be made", {"afile": "x"}),
    # --- the campaign file as a file -------------------------------------------------------
    Case("campaign-missing", ("check", "gone.toml"), 2, "campaign: 'gone.toml' is not a file"),
    Case("campaign-unknown-preset", ("check", "nosuch"), 2,
         "campaign: 'nosuch' is neither a file nor a preset; presets: artifact"),
    Case("campaign-a-directory", ("check", "t"), 2, "campaign: 't' is a directory; give the "
         "campaign's .toml file in it", {"t/x": "x"}),
    Case("campaign-not-utf8", ("check", "c.toml"), 2,
         "not UTF-8 text (byte 0xff at offset 0)", {"c.toml": b"\xff\xfe"}),
    Case("campaign-invalid-toml", ("check", "c.toml"), 2, "c.toml: invalid TOML:",
         {"c.toml": "name = \n"}),
    Case("campaign-empty", ("check", "c.toml"), 2, "name: missing; a campaign needs name,",
         {"c.toml": ""}),
    # --- campaign fields -------------------------------------------------------------------
    bad_campaign("top-unknown", campaign(top='owner = "me"'), "campaign: unknown field 'owner'"),
    bad_campaign("name-spaces", campaign().replace('name = "c"', 'name = "my run"'),
                 "name: 'my run' is not allowed"),
    bad_campaign("name-number", campaign().replace('name = "c"', "name = 5"),
                 "name: 5 is not allowed"),
    bad_campaign("seed-negative", campaign().replace("seed = 1", "seed = -1"),
                 "seed: -1 is not allowed; allowed: an integer 0..9223372036854775807"),
    bad_campaign("seed-beyond-64-bits", campaign().replace("seed = 1", f"seed = {2**64}"),
                 f"seed: {2**64} is not allowed; allowed: an integer 0..9223372036854775807 "
                 "(2**63 - 1)"),
    bad_campaign("seed-float", campaign().replace("seed = 1", "seed = 1.5"),
                 "seed: 1.5 is not allowed"),
    bad_campaign("seed-missing", campaign().replace("seed = 1\n", ""), "seed: missing"),
    bad_campaign("templates-31", campaign().replace("templates = 1", "templates = 31"),
                 "templates: 31 is not allowed"),
    bad_campaign("templates-unknown-id", campaign().replace(
        "templates = 1", 'templates = ["cruise-01"]'), "templates: 'cruise-01' is not allowed"),
    bad_campaign("templates-twice", campaign().replace(
        "templates = 1", 'templates = ["deployment-01", "deployment-01"]'),
        "templates: 'deployment-01' is listed twice"),
    bad_campaign("description-number", campaign(top="description = 5"),
                 "description: 5 is not allowed; allowed: a string"),
    bad_campaign("kind-unknown", campaign(top='kind = "study"'), "kind: 'study' is not allowed"),
    bad_campaign("grid-missing", 'name = "c"\nseed = 1\ntemplates = 1\n', "grid: missing"),
    bad_campaign("grid-rho", campaign(grid="rho = [3]"), "grid.rho: 3 is not allowed; allowed: "
                 "0.25, 0.5, 1, 2, 4, 8, 16"),
    bad_campaign("grid-rho-twice", campaign(grid="rho = [4, 4]"), "grid.rho: 4 is listed twice"),
    bad_campaign("grid-rho-empty", campaign(grid="rho = []"), "grid.rho: empty list"),
    bad_campaign("grid-rho-table", campaign(grid="rho = { a = 1 }"),
                 "grid.rho: expected a value or a list of values, not a table"),
    bad_campaign("grid-network", campaign(network="mars"), "grid.network: 'mars' is not allowed"),
    bad_campaign("grid-policy", campaign().replace('"planfence"', '"fastest"'),
                 "grid.policy: 'fastest' is not allowed"),
    bad_campaign("grid-policy-param", campaign().replace('"planfence"', '"metadata_sync/3"'),
                 "grid.policy: 'metadata_sync/3' is not allowed"),
    bad_campaign("grid-connection", campaign(grid='connection = ["pooled"]'),
                 "grid.connection: 'pooled' is not allowed; allowed: fresh, reuse"),
    bad_campaign("grid-tier", campaign(grid='tier = ["large"]'), "grid.tier: 'large' is not"),
    bad_campaign("grid-keys", campaign().replace("keys = [2]", "keys = [200]"),
                 "grid.keys: 200 is not allowed; allowed: integers 1..128"),
    bad_campaign("grid-keys-bool", campaign().replace("keys = [2]", "keys = [true]"),
                 "grid.keys: True is not allowed"),
    bad_campaign("grid-agents", campaign().replace("agents = [2]", "agents = [1]"),
                 "grid.agents: 1 is not allowed; allowed: integers 2..10000"),
    bad_campaign("grid-units", campaign().replace("units = [8]", "units = [2]"),
                 "grid.units: 2 is not allowed; allowed: integers 4..4096"),
    bad_campaign("grid-deps", campaign(grid="deps = [3]"), "grid.deps: 3 exceeds grid.keys 2"),
    bad_campaign("grid-offset", campaign(grid="trace_offset_s = [-5]"),
                 "grid.trace_offset_s: -5 is not allowed"),
    bad_campaign("grid-batch", campaign(grid="batch = [0]"), "grid.batch: 0 is not allowed"),
    bad_campaign("grid-unknown", campaign(grid="rate = [1]"), "grid: unknown field 'rate'"),
    bad_campaign("grid-study-field", campaign(grid="scenario = ['handoff']"),
                 "grid.scenario: only for kind = 'handoff' campaigns"),
    bad_campaign("grid-offset-past-trace", campaign(network="tmobile",
                                                    grid="trace_offset_s = [150]"),
                 "grid.trace_offset_s: 150 s is past the end of trace TMobile-LTE-short.up"),
    bad_campaign("options-unknown", campaign(options="retries = 2"),
                 "options: unknown field 'retries'"),
    bad_campaign("options-backend", campaign(options='backend = "kernel"'),
                 "options.backend: 'kernel' is not allowed; allowed: auto, userspace, netem, sim"),
    bad_campaign("options-durability", campaign(options='durability = "none"'),
                 "options.durability: 'none' is not allowed"),
    bad_campaign("options-rpc-timeout", campaign(options="rpc_timeout_s = 0"),
                 "options.rpc_timeout_s: 0 is not allowed; allowed: a number > 0"),
    bad_campaign("options-episode-timeout", campaign(options="episode_timeout_s = -1"),
                 "options.episode_timeout_s: -1 is not allowed"),
    bad_campaign("options-delay", campaign(options="delay_ms = -3"),
                 "options.delay_ms: -3 is not allowed; allowed: a number >= 0"),
    bad_campaign("options-link-log", campaign(options="link_log = 1"),
                 "options.link_log: 1 is not allowed; allowed: true, false"),
    bad_campaign("options-derivation", campaign(options='derivation = "deep"'),
                 "options.derivation: 'deep' is not allowed"),
    bad_campaign("execution-unknown", campaign(top="[execution]\nlanes = 2"),
                 "execution: unknown field 'lanes'"),
    bad_campaign("execution-cluster", campaign(top='[execution]\ncluster = "bogus"'),
                 "execution.cluster: 'bogus' is not allowed; allowed: local:N (N >= 1) or"),
    bad_campaign("execution-jobs", campaign(top="[execution]\njobs = 0"),
                 "execution.jobs: 0 is not allowed"),
    # --- networks of the campaign's own ----------------------------------------------------
    bad_campaign("network-shadows", campaign(networks="[networks.att]\ndelay_ms = 5\n",
                                             network="att"),
                 "networks.att: 'att' is a registered network; choose another name"),
    bad_campaign("network-bad-name", campaign(networks='[networks."My Net"]\ndelay_ms = 5\n'),
                 "networks.My Net: the name is not allowed"),
    bad_own("network-unknown-field", "speed = 5", "networks.mine: unknown field 'speed'"),
    bad_own("network-delay-negative", "delay_ms = -1", "networks.mine.delay_ms: -1 is not"),
    bad_own("network-delay-huge", "delay_ms = 20000", "networks.mine.delay_ms: 20000 is not"),
    bad_own("network-delay-word", 'delay_ms = "fast"', "networks.mine.delay_ms: 'fast' is not"),
    bad_own("network-rate-zero", "rate_kbit = 0", "networks.mine.rate_kbit: 0 is not allowed"),
    bad_own("network-rate-and-up", "rate_kbit = 1\nup_rate_kbit = 2",
            "networks.mine.rate_kbit: give rate_kbit (both directions) or up_rate_kbit"),
    bad_own("network-one-trace", 'up_trace = "ATT-LTE-driving.up"',
            "networks.mine.down_trace: missing; a trace-driven link needs both"),
    bad_own("network-trace-and-rate", 'up_trace = "ATT-LTE-driving.up"\n'
            'down_trace = "ATT-LTE-driving.down"\nrate_kbit = 5',
            "networks.mine.rate_kbit: a trace-driven link takes its rate from up_trace"),
    bad_own("network-trace-missing", 'up_trace = "gone.up"\ndown_trace = "gone.down"',
            "networks.mine.up_trace: 'gone.up' is neither a file"),
    bad_own("network-trace-number", "up_trace = 5\ndown_trace = 6",
            "networks.mine.up_trace: 5 is not allowed"),
    bad_own("network-delay-and-trace", 'delay_ms = 5\ndelay_trace = "d.txt"',
            "networks.mine.delay_ms: a link with delay_trace takes its delay from the trace"),
    bad_own("network-delay-trace-missing", 'delay_trace = "d.txt"',
            "networks.mine.delay_trace: 'd.txt' is not a file"),
    bad_own("network-loss-model", 'loss = { model = "burst" }',
            "networks.mine.loss.model: 'burst' is not allowed; allowed: none, iid, gilbert"),
    bad_own("network-loss-not-table", "loss = 5", "networks.mine.loss: expected a table"),
    bad_own("network-loss-pct-100", 'loss = { model = "iid", pct = 100 }',
            "networks.mine.loss.pct: 100 is not allowed"),
    bad_own("network-loss-pct-missing", 'loss = { model = "iid" }',
            "networks.mine.loss.pct: missing"),
    bad_own("network-loss-extra", 'loss = { model = "iid", pct = 1, p = 0.1 }',
            "networks.mine.loss: unknown field 'p'"),
    bad_own("network-gilbert-p", 'loss = { model = "gilbert", p = 1.5, r = 0.5 }',
            "networks.mine.loss.p: 1.5 is not allowed; allowed: a number > 0 and <= 1"),
    bad_own("network-gilbert-r-missing", 'loss = { model = "gilbert", p = 0.1 }',
            "networks.mine.loss.r: missing"),
    bad_own("network-gilbert-bad-pct", 'loss = { model = "gilbert", p = 0.1, r = 0.5, '
            "loss_bad_pct = 120 }", "networks.mine.loss.loss_bad_pct: 120 is not allowed"),
    bad_own("network-queue-kind", 'queue = { kind = "red" }',
            "networks.mine.queue.kind: 'red' is not allowed"),
    bad_own("network-queue-packets", "queue = { packets = 0 }",
            "networks.mine.queue.packets: 0 is not allowed"),
    bad_own("network-queue-bytes", "queue = { bytes = 1000 }",
            "networks.mine.queue.bytes: 1000 is not allowed; allowed: an integer >= 1500"),
    bad_own("network-queue-extra", "queue = { size = 5 }",
            "networks.mine.queue: unknown field 'size'"),
    bad_own("network-codel-unlimited", 'queue = { kind = "codel" }',
            "networks.mine.queue.kind: codel needs a bottleneck"),
    bad_own("network-codel-interval", 'rate_kbit = 100\nqueue = { kind = "codel", target_ms = 50'
            ", interval_ms = 10 }", "networks.mine.queue.interval_ms: 10 is not allowed"),
    bad_own("network-offset-negative", "trace_offset_s = -1",
            "networks.mine.trace_offset_s: -1 is not allowed"),
    bad_own("network-wrap-word", 'trace_wrap = "yes"',
            "networks.mine.trace_wrap: 'yes' is not allowed; allowed: true or false"),
    bad_own("network-cc-name", 'congestion_control = "Vegas!"',
            "networks.mine.congestion_control: 'Vegas!' is not a kernel algorithm name"),
    bad_own("network-unshaped-with-link", "unshaped = true\ndelay_ms = 5",
            "networks.mine.delay_ms: an unshaped network (unshaped = true) has no link"),
    bad_own("network-unshaped-word", 'unshaped = "yes"',
            "networks.mine.unshaped: 'yes' is not allowed"),
    bad_own("network-description-number", "description = 5",
            "networks.mine.description: 5 is not allowed"),
    bad_own("hosts-unknown-name", "[networks.mine.hosts.foo]\ndelay_ms = 1",
            "networks.mine.hosts.foo: 'foo' is not a host name; allowed: an agent index "
            "(0..1), an agent name (a0..a1) or central"),
    bad_own("hosts-index-too-high", "[networks.mine.hosts.5]\ndelay_ms = 1",
            "networks.mine.hosts.5: no such agent in cells with agents = 2"),
    bad_own("hosts-name-too-high", "[networks.mine.hosts.a2]\ndelay_ms = 1",
            "networks.mine.hosts.a2: no such agent in cells with agents = 2"),
    bad_own("hosts-twice", "[networks.mine.hosts.1]\ndelay_ms = 1\n"
            "[networks.mine.hosts.a1]\ndelay_ms = 2",
            "networks.mine.hosts.a1: agent 1 is already given as hosts.1"),
    bad_own("hosts-bad-selector", '[networks.mine.hosts."a-1"]\ndelay_ms = 1',
            "networks.mine.hosts.a-1: not a host"),
    bad_own("hosts-unknown-network", "[networks.mine.hosts.0]\nnetwork = \"mars\"",
            "networks.mine.hosts.0.network: 'mars' is not allowed"),
    bad_own("hosts-unshaped-network", "[networks.mine.hosts.0]\nnetwork = \"loopback\"",
            "networks.mine.hosts.0.network: 'loopback' has no link (unshaped)"),
    bad_own("hosts-not-a-table", "hosts = 5", "networks.mine.hosts: expected a table"),
    bad_own("hosts-unknown-field", "[networks.mine.hosts.0]\nspeed = 1",
            "networks.mine.hosts.0: unknown field 'speed'"),
    bad_campaign("netem-and-link-log", own("rate_kbit = 100", options='backend = "netem"\n'
                                                                      "link_log = true"),
                 "options.link_log: the netem backend keeps no packet log"),
    # --- trace files -----------------------------------------------------------------------
    bad_trace("trace-bom", b"\xef\xbb\xbf0\n5\n", "starts with a UTF-8 byte order mark (EF BB"),
    bad_trace("trace-not-ascii", b"0\n5\xc3\xa9\n", "t/bad.up:2: byte 0xc3 is not ASCII"),
    bad_trace("trace-word", "0\nfive\n", "t/bad.up:2: expected an integer millisecond stamp, "
              "got 'five'"),
    bad_trace("trace-decimal", "0\n2.5\n", "t/bad.up:2: expected an integer millisecond stamp"),
    bad_trace("trace-underscore", "0\n1_000\n", "t/bad.up:2: expected an integer"),
    bad_trace("trace-negative", "-1\n5\n", "t/bad.up:1: stamp -1 is negative"),
    bad_trace("trace-decreasing", "0\n9\n5\n", "t/bad.up:3: stamp 5 is smaller than the "
              "previous 9"),
    bad_trace("trace-empty", "", "t/bad.up: trace is empty (no stamps)"),
    bad_trace("trace-blank-only", "\n \r\n", "t/bad.up: trace is empty"),
    bad_trace("trace-zero", "0\n0\n", "last stamp is 0; a trace must last longer than 0 ms"),
    bad_delay_trace("delay-trace-bom", b"\xef\xbb\xbf0 20\n", "starts with a UTF-8 byte order"),
    bad_delay_trace("delay-trace-one-number", "0\n", "t/d.txt:1: expected '<ms> <delay_ms>'"),
    bad_delay_trace("delay-trace-late-start", "5 20\n", "t/d.txt:1: the first step must be at "
                    "0 ms"),
    bad_delay_trace("delay-trace-too-slow", "0 20000\n", "t/d.txt:1: delay 20000 is not "
                    "allowed"),
    bad_delay_trace("delay-trace-back", "0 20\n9 30\n5 40\n", "t/d.txt:3: time 5 is not after"),
    bad_delay_trace("delay-trace-empty", "# nothing\n", "t/d.txt: delay trace is empty"),
    # --- what this host lacks (exit 3) -----------------------------------------------------
    Case("congestion-control-missing", check(own("rate_kbit = 100\ncongestion_control = "
                                                 '"vegas2"')), 3,
         "networks.mine.congestion_control: 'vegas2' is not available on this host",
         {"c.toml": own('rate_kbit = 100\ncongestion_control = "vegas2"')}),
    Case("congestion-control-missing-run",
         ("run", "c.toml", "--out", "o"), 3,
         "networks.mine.congestion_control: 'vegas2' is not available on this host",
         {"c.toml": own('rate_kbit = 100\ncongestion_control = "vegas2"')}),
]

ROOT_CASES = [
    Case("netem-backend-missing-check", ("check", "c.toml", "--backend", "netem"), 3,
         "backend netem: does not work on this host", {"c.toml": own("rate_kbit = 100")}),
    Case("netem-backend-missing-run", ("run", "c.toml", "--backend", "netem", "--out", "o"), 3,
         "backend netem: does not work on this host", {"c.toml": own("rate_kbit = 100")}),
]


def _snapshot(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(folder)), p.stat().st_size if p.is_file() else -1)
                  for p in folder.rglob("*"))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A finished run (the campaign loop's twin runner) for the report cases."""
    from testbed.campaign.parse import parse_campaign
    from tests.testbed.run.fake_runner import SMALL, FakeRunner, run_small

    out = tmp_path_factory.mktemp("report") / "run"
    campaign = parse_campaign(SMALL)
    trio.run(run_small, campaign, out, FakeRunner())
    first = sorted(p.name for p in (out / "shards" / "episodes").iterdir())[0]
    return out, first.removesuffix(".parquet").replace("~", "/")


def _write(folder: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def _run_case(case: Case, tmp_path: Path, run_dir: tuple[Path, str],
              monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, case.files)
    if case.argv[:1] == ("report",) and case.argv[1] == "run":
        (tmp_path / "run").symlink_to(run_dir[0], target_is_directory=True)
    key = run_dir[1]
    argv = [key if a == "LOGLESS" else key.replace("/", "~") if a == "LOGLESS~" else a
            for a in case.argv]
    before = _snapshot(tmp_path)
    report_before = _snapshot(run_dir[0])
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == case.code, captured.err
    assert "Traceback" not in captured.err
    assert len(lines) == 1, captured.err
    assert case.fragment in lines[0], lines[0]
    assert _snapshot(tmp_path) == before, "the command created or changed something"
    assert _snapshot(run_dir[0]) == report_before


def test_the_table_is_large() -> None:
    assert len(CASES) + len(ROOT_CASES) >= 120
    assert len({c.id for c in CASES + ROOT_CASES}) == len(CASES) + len(ROOT_CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_bad_input_is_one_line_and_creates_nothing(
        case: Case, tmp_path: Path, run_dir: tuple[Path, str],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _run_case(case, tmp_path, run_dir, monkeypatch, capsys)


@pytest.mark.privileged
@pytest.mark.parametrize("case", ROOT_CASES, ids=lambda c: c.id)
def test_a_missing_backend_is_one_line_and_creates_nothing(
        case: Case, tmp_path: Path, run_dir: tuple[Path, str],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() != 0:
        pytest.skip("the backend probes need root")
    if netem_available()[0]:
        pytest.skip("this kernel has sch_netem")
    _run_case(case, tmp_path, run_dir, monkeypatch, capsys)


# --- allowed, but probably a mistake: a warning line each, and the plan ----------------------

WARNINGS: list[Case] = [
    Case("delay-option-beside-own-network", check(""), 0,
         "warning: options.delay_ms: 50 ms is ignored for mine (defined in the campaign; set "
         "delay_ms there); no built-in shaped network is in the grid, so it changes nothing",
         {"c.toml": own("rate_kbit = 100", options="delay_ms = 50")}),
    Case("unused-central-host", check(""), 0,
         "warning: networks.mine.hosts.central: no policy of the grid on mine (planfence) uses "
         "a central host, so this link is never built",
         {"c.toml": own("rate_kbit = 100\n[networks.mine.hosts.central]\nrate_kbit = 1000")}),
    Case("swapped-shipped-traces", check(""), 0,
         "warning: networks.mine.up_trace: ATT-LTE-driving.down is named as a downlink trace; "
         "are up_trace and down_trace swapped?",
         {"c.toml": own('up_trace = "ATT-LTE-driving.down"\n'
                        'down_trace = "ATT-LTE-driving.up"')}),
    Case("a-trace-of-one-stamp-a-day", check(""), 0,
         "warning: networks.mine.up_trace: slow.up carries 0.00012 kbit/s on average (1 "
         "delivery opportunity in 100000 s); episodes would wait on it for hours",
         {"c.toml": own('up_trace = "t/slow.up"\ndown_trace = "t/ok.down"'), **TRACES,
          "t/slow.up": "100000000\n"}),
    Case("an-outage-beyond-the-episode-timeout", check(""), 0,
         "warning: networks.mine.up_trace: gap.up has an outage of 30 s, longer than "
         "options.episode_timeout_s (20 s)",
         {"c.toml": own('up_trace = "t/gap.up"\ndown_trace = "t/ok.down"',
                        options="episode_timeout_s = 20"),
          **TRACES, "t/gap.up": "0\n" * 50 + "30000\n"}),
    Case("episodes-estimated-beyond-the-timeout", check(""), 0,
         "warning: grid.network: episodes on mine are estimated at about",
         {"c.toml": own("rate_kbit = 20", options="episode_timeout_s = 5",
                        grid='tier = ["artifact"]')}),
]


@pytest.mark.parametrize("case", WARNINGS, ids=lambda c: c.id)
def test_a_likely_mistake_is_a_warning_line(
        case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, case.files)
    before = _snapshot(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(list(case.argv)) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    warnings = [line for line in captured.err.splitlines() if line]
    assert any(case.fragment in line for line in warnings), captured.err
    assert all(line.startswith("testbed check: warning: ") for line in warnings), warnings
    assert "nothing was created" in captured.out
    assert _snapshot(tmp_path) == before


def test_a_clean_campaign_has_no_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, {"c.toml": own(OK_TRACES), **TRACES})
    monkeypatch.chdir(tmp_path)
    assert main(["check", "c.toml"]) == 0
    assert capsys.readouterr().err == ""


def test_crlf_blank_lines_and_spaces_in_a_trace_read_as_the_same_stamps(
        tmp_path: Path) -> None:
    from testbed.links.traces import load_trace

    clean = tmp_path / "clean.up"
    clean.write_text("0\n5\n5\n10\n")
    messy = tmp_path / "messy.up"
    messy.write_bytes(b"0\r\n\r\n  5 \r\n5\t\r\n\n10\r\n\r\n")
    assert load_trace(messy).stamps_ms.tolist() == load_trace(clean).stamps_ms.tolist()
