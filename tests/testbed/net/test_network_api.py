"""``testbed.api.network``: a network from Python, programs in its hosts, nothing left.

Privileged (namespaces and links) except the argument checks. Timing assertions are
physics with wide margins: a fixed 20 ms link per crossing gives a round trip of four
crossings, 80 ms; a host with no link halves it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from testbed import api
from testbed.errors import UserError
from tests.leftovers import prefix_objects

RTT = re.compile(r"rtt min/avg/max/mdev = ([\d.]+)/([\d.]+)/([\d.]+)/")

def _avg_rtt_ms(out: str) -> float:
    match = RTT.search(out)
    assert match, out
    return float(match.group(2))


def _skip_without_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("needs /dev/net/tun")


@pytest.mark.privileged
@pytest.mark.parametrize(("unshaped", "low", "high"), [((), 70.0, 120.0),
                                                        (("s",), 35.0, 70.0)])
def test_ping_between_two_hosts_reads_the_links_round_trip(
        unshaped: tuple[str, ...], low: float, high: float) -> None:
    _skip_without_root()
    with api.network("fixed", hosts=["c", "s"], delay_ms=20, unshaped=unshaped) as net:
        assert set(net.addresses) == {"c", "s"}
        assert net["s"].address == net.addresses["s"]
        done = net["c"].run(["ping", "-c", "5", "-i", "0.2", "{addr:s}"], timeout=60)
        assert done.returncode == 0, done.stderr
        assert low < _avg_rtt_ms(done.stdout) < high
        by_name = net["c"].run("ping -c 2 -i 0.2 s", timeout=60)  # the run's /etc/hosts
        assert by_name.returncode == 0, by_name.stderr
        prefix = net.prefix
    assert prefix_objects(prefix) == []


@pytest.mark.privileged
def test_leaving_the_block_stops_programs_and_removes_everything(tmp_path: Path) -> None:
    _skip_without_root()
    seen: dict[str, object] = {}

    def body() -> None:
        with api.network("fixed", hosts=["c", "s"], delay_ms=5,
                         link_log=tmp_path / "links") as net:
            seen["server"] = net["s"].popen(["sleep", "600"], stdout=subprocess.DEVNULL)
            env = net["c"].run(["sh", "-c", "echo $TESTBED_ADDR_S"], timeout=30)
            assert env.stdout.strip() == net["s"].address
            seen["prefix"] = net.prefix
            assert prefix_objects(net.prefix), "nothing built: the test would prove nothing"
            raise RuntimeError("the body failed")

    with pytest.raises(RuntimeError, match="the body failed"):
        body()
    server, prefix = seen["server"], str(seen["prefix"])
    assert isinstance(server, subprocess.Popen)
    assert server.poll() is not None  # stopped, not left running
    assert prefix_objects(prefix) == []
    assert sorted(p.name for p in (tmp_path / "links").iterdir())  # the packet logs


def test_bad_arguments_fail_before_anything_is_built() -> None:
    with pytest.raises(UserError, match="s: no such host"), \
            api.network("fixed", hosts=["c"], unshaped=["s"]):
        pass
    with pytest.raises(UserError, match="hosts: a list"), \
            api.network("fixed", hosts="cs"):
        pass


DOC = Path(__file__).resolve().parents[3] / "docs" / "python-api.md"


@pytest.mark.privileged
def test_the_documented_example_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    _skip_without_root()
    text = DOC.read_text().split("## A network from Python", 1)[1]
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, str(DOC), "exec"), {})  # the doc's own example
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("{'c': '198.18.")
    assert 35.0 < _avg_rtt_ms(out[1]) < 70.0  # one end unshaped: two crossings each way
    assert out[2] == "200"
