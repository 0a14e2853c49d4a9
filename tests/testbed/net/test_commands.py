"""Users' commands as data: placeholders, segments, hosts, readiness (pure)."""

from __future__ import annotations

import pytest

from testbed.campaign.command import CommandTableError
from testbed.campaign.command_table import check_ready
from testbed.net.commands import (
    CommandError,
    CommandSpec,
    Readiness,
    Segment,
    default_hosts,
    host_env,
    hosts_file_text,
    parse_ready,
    plan_commands,
    referenced_hosts,
    split_segments,
    substitute,
)
from testbed.net.session import SessionResult, batches, labels

ADDRS = {"c": "198.18.0.1", "s": "198.18.0.2"}


def test_placeholders_name_hosts_and_leave_other_braces_alone() -> None:
    argv = ("ping", "-c", "3", "{addr:s}", "{host}@{addr}", "awk", "{print $1}", "{hosts}")
    assert substitute(argv, "c", ADDRS) == (
        "ping", "-c", "3", "198.18.0.2", "c@198.18.0.1", "awk", "{print $1}", "c s")
    assert referenced_hosts(argv) == ["s"]


def test_a_placeholder_of_a_missing_host_is_one_line() -> None:
    with pytest.raises(CommandError, match=r"\{addr:x\}: no host 'x'.*hosts: c, s"):
        substitute(("{addr:x}",), "c", ADDRS)


def test_environment_names_every_host() -> None:
    env = host_env("c", ADDRS, t0_ns=5)
    assert env == {"TESTBED_HOST": "c", "TESTBED_ADDR": "198.18.0.1", "TESTBED_HOSTS": "c s",
                   "TESTBED_ADDR_C": "198.18.0.1", "TESTBED_ADDR_S": "198.18.0.2",
                   "TESTBED_T0_NS": "5"}


def test_hosts_file_resolves_every_host() -> None:
    text = hosts_file_text(ADDRS)
    assert "127.0.0.1\tlocalhost" in text
    assert "198.18.0.2\ts\n" in text


def test_segments_split_at_each_on() -> None:
    options, segments = split_segments(
        ["--hosts", "2", "--on", "s", "--service", "--ready", "tcp:80", "--", "srv", "-x",
         "--on", "c", "--", "cli", "--", "y"])
    assert options == ["--hosts", "2"]
    assert segments == [Segment("s", ("srv", "-x"), True, Readiness("tcp", port=80)),
                        Segment("c", ("cli", "--", "y"))]
    assert split_segments(["att", "--", "echo", "--on"]) == (["att"], [Segment(None, (
        "echo", "--on"))])
    assert split_segments(["att", "--help"]) == (["att", "--help"], [])


@pytest.mark.parametrize(("args", "message"), [
    (["--on"], "expected --on HOST"),
    (["--on", "c", "--"], "give a command after --"),
    (["--on", "c", "--wait", "--", "x"], "'--wait' is not allowed here"),
    (["--on", "c d", "--", "x"], "--on: 'c d' is not allowed"),
    (["--on", "c", "--ready", "http:80", "--", "x"], "--ready: 'http:80' is not allowed"),
    (["--"], "give a command after --"),
])
def test_bad_segments_are_one_line(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        split_segments(args)


def test_plan_and_default_hosts() -> None:
    _, segments = split_segments(["--on", "c", "--", "ping", "{addr:s}"])
    assert default_hosts(segments) == ["c", "s"]
    assert plan_commands(segments, ["c", "s"]) == [CommandSpec("c", ("ping", "{addr:s}"))]
    _, bare = split_segments(["--", "hostname"])
    assert [s.host for s in plan_commands(bare, ["a0", "a1"])] == ["a0", "a1"]
    with pytest.raises(CommandError, match="--on x: no such host"):
        plan_commands([Segment("x", ("true",))], ["c"])
    with pytest.raises(CommandError, match="every command is a service"):
        plan_commands([Segment("c", ("srv",), service=True)], ["c"])


def test_a_placeholder_of_a_host_not_selected_is_refused_before_anything_runs() -> None:
    with pytest.raises(CommandError, match=r"\{addr:s\}: no host 's'"):
        plan_commands([Segment("c", ("ping", "{addr:s}"))], ["c"])


def test_a_placeholder_adds_a_host_only_where_the_commands_name_every_host() -> None:
    """`--on c -- ping {addr:s}` builds c and s (mm-link style); where the hosts are
    given otherwise (a0 and a1 for a bare `--`, a campaign's), `{addr:zz}` naming none
    of them is refused in one line, never a new idle host."""
    from testbed.tools.user_network import NetworkChoice, select_hosts

    choice = NetworkChoice("fixed")
    _, named = split_segments(["--on", "c", "--", "ping", "{addr:s}"])
    assert select_hosts(choice, named, []) == ["c", "s"]
    _, bare = split_segments(["--", "ping", "-c", "1", "{addr:a1}"])
    assert select_hosts(choice, bare, []) == ["a0", "a1"]
    _, typo = split_segments(["--", "ping", "-c", "1", "{addr:zz}"])
    with pytest.raises(CommandError) as bare_error:
        select_hosts(choice, typo, [])
    assert str(bare_error.value) == ("{addr:zz}: no host 'zz' in this network; hosts: a0, "
                                     "a1 (more with --hosts N or --host NAME)")
    _, on_campaign = split_segments(["--on", "a0", "--", "curl", "{addr:srv}:7000",
                                     "--on", "c", "--", "ping", "{addr:c}"])
    with pytest.raises(CommandError, match=r"^\{addr:srv\}: no host 'srv' in this network; "
                       r"hosts: a0, a1, server, c \(more"):
        select_hosts(choice, on_campaign, ["a0", "a1", "server"])
    _, fine = split_segments(["--on", "a0", "--", "curl", "{addr:server}:7000"])
    assert select_hosts(choice, fine, ["a0", "a1", "server"]) == ["a0", "a1", "server"]


def test_batches_start_together_between_readiness_points() -> None:
    ready = Readiness("tcp", port=1)
    specs = [CommandSpec("s", ("a",), service=True), CommandSpec("t", ("b",), service=True,
                                                                  ready=ready),
             CommandSpec("c", ("c",)), CommandSpec("d", ("d",)),
             CommandSpec("e", ("e",), ready=ready), CommandSpec("f", ("f",))]
    assert batches(specs) == [(0, 2), (2, 5), (5, 6)]
    services = [CommandSpec("s", ("a",), service=True), CommandSpec("c", ("c",))]
    assert batches(services) == [(0, 1), (1, 2)]  # the trace restarts in between
    assert batches([CommandSpec(h, ("x",)) for h in "abc"]) == [(0, 3)]


def test_labels_number_hosts_with_several_commands() -> None:
    specs = [CommandSpec("s", ("a",)), CommandSpec("c", ("b",)), CommandSpec("s", ("d",))]
    assert labels(specs) == ["s.1", "c", "s.2"]


@pytest.mark.parametrize("text", ["tcp:7000", "udp:53", "delay:0.5", "delay:3600",
                                  "tcp:0", "udp:65536", "delay:-1", "delay:nan", "tcp",
                                  "http:80", "tcp:x", ""])
def test_readiness_reads_alike_in_campaigns_and_on_the_command_line(text: str) -> None:
    try:
        ready = parse_ready(text)
    except CommandError:
        with pytest.raises(CommandTableError):
            check_ready(text, "ready")
        return
    assert parse_ready(check_ready(text, "ready")) == ready


def test_session_status_is_the_first_failure() -> None:
    from testbed.net.session import ProgramResult

    def result(label: str, status: int | None, stopped: str = "", service: bool = False
               ) -> ProgramResult:
        return ProgramResult(label, label, (), service, status, stopped, 0.0, 1.0)

    assert SessionResult([result("s", 143, "service", True), result("c", 0)]).status == 0
    assert SessionResult([result("s", 1, "", True), result("c", 0)]).status == 1
    assert SessionResult([result("a", 0), result("b", 3), result("c", 4)]).status == 3
    assert SessionResult([result("a", 143, "timeout")], timed_out=True).status == 124
    assert SessionResult([], failure="s: not ready").status == 125
