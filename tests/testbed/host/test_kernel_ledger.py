"""Namespaces, links, sysctls and the ledger against the real kernel (privileged)."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.errors import UserError
from testbed.host import kernel, processes
from testbed.host import ledger as ledger_mod

pytestmark = pytest.mark.privileged

if os.geteuid() != 0:
    pytest.skip("needs root for network namespaces", allow_module_level=True)
if not os.path.exists("/dev/net/tun"):
    pytest.skip("needs /dev/net/tun", allow_module_level=True)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[ledger_mod.Ledger]:
    led = ledger_mod.Ledger(ledger_mod.new_prefix(), state_dir=tmp_path)
    yield led
    led.teardown()


def test_prefix_is_checked() -> None:
    assert ledger_mod.check_prefix(ledger_mod.new_prefix()).startswith("tb")
    with pytest.raises(UserError, match="prefix"):
        ledger_mod.check_prefix("../etc")


def test_ledger_removes_in_reverse_and_forgets_its_state_file(ledger: ledger_mod.Ledger) -> None:
    name = f"{ledger.prefix}-x"
    ledger.record_netns(name)
    kernel.create_netns(name)
    ifname = f"{ledger.prefix}t0"
    ledger.record_link(ifname, name)
    fd = kernel.open_host_tun(name, ifname, "198.18.0.1")
    try:
        assert ifname in kernel.list_links(name)
        assert ifname not in kernel.list_links()  # made inside the namespace
        assert json.loads(ledger.path.read_text())["entries"][-1]["name"] == ifname
    finally:
        os.close(fd)  # a non-persistent TUN device goes away with its fd
    removed = ledger.teardown()
    assert removed == [f"netns {name}"]  # the link had already gone with its fd
    assert name not in kernel.list_netns()
    assert not ledger.path.exists()


def test_a_team_host_is_set_up_and_removed_without_forking(ledger: ledger_mod.Ledger) -> None:
    """Namespaces and netlink inside them take a thread, not a forked helper: pyroute2's
    `netns=` forks this (large) process for each call, 20-35 ms of CPU each."""
    forks: list[int] = []
    os.register_at_fork(before=lambda: forks.append(threading.get_native_id()))
    name = f"{ledger.prefix}-nofork"
    ifname = f"{ledger.prefix}t9"
    ledger.record_netns(name)
    kernel.create_netns(name)
    ledger.record_link(ifname, name)
    fd = kernel.open_host_tun(name, ifname, "198.18.0.9")
    try:
        kernel.set_sysctl(name, "net.ipv4.tcp_no_metrics_save", "1")
        assert kernel.link_index(ifname, name) is not None
        assert kernel.link_index(ifname) is None  # not in this thread's namespace
        assert kernel.remove_link(ifname, name) is True
        assert kernel.remove_link(ifname, name) is False
    finally:
        os.close(fd)
    ledger.teardown()
    assert name not in kernel.list_netns()
    assert forks == []
    with pytest.raises(kernel.KernelError) as info:
        kernel.link_index("lo", name)  # the namespace is gone: setns names it
    assert info.value.errno == errno.ENOENT


def test_ledger_refuses_names_without_its_prefix(ledger: ledger_mod.Ledger) -> None:
    with pytest.raises(ValueError, match="prefix"):
        ledger.record_netns("somebody-elses")


def test_kernel_errors_keep_their_errno(ledger: ledger_mod.Ledger) -> None:
    name = f"{ledger.prefix}-dup"
    ledger.record_netns(name)
    kernel.create_netns(name)
    with pytest.raises(kernel.KernelError) as info:
        kernel.create_netns(name)
    assert info.value.errno == errno.EEXIST
    assert name in str(info.value)
    with pytest.raises(kernel.KernelError) as info2:
        kernel.open_host_tun(f"{ledger.prefix}-nope", f"{ledger.prefix}t8", "198.18.0.8")
    assert info2.value.errno == errno.ENOENT  # no such namespace: setns names it


def test_sysctl_and_sockets_are_per_namespace(ledger: ledger_mod.Ledger) -> None:
    name = f"{ledger.prefix}-s"
    ledger.record_netns(name)
    kernel.create_netns(name)
    root_value = kernel.get_sysctl(None, "net.ipv4.tcp_no_metrics_save")
    new_value = "0" if root_value == "1" else "1"
    kernel.set_sysctl(name, "net.ipv4.tcp_no_metrics_save", new_value)
    assert kernel.get_sysctl(name, "net.ipv4.tcp_no_metrics_save") == new_value
    assert kernel.get_sysctl(None, "net.ipv4.tcp_no_metrics_save") == root_value
    # lo is down in a fresh namespace: nothing is reachable from a socket born there
    sock = kernel.socket_in_netns(name, socket.AF_INET, socket.SOCK_DGRAM)
    with sock, pytest.raises(OSError, match="unreachable") as info:
        sock.connect(("127.0.0.1", 9))
    assert info.value.errno == errno.ENETUNREACH
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as root_sock:
        root_sock.connect(("127.0.0.1", 9))  # the same call works in the root namespace


def test_clean_all_undoes_only_dead_owners(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    orphan = ledger_mod.Ledger(ledger_mod.new_prefix(), owner_pid=dead_pid, state_dir=tmp_path)
    live = ledger_mod.Ledger(ledger_mod.new_prefix(), state_dir=tmp_path)  # owned by this process
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        orphan.record_netns(f"{orphan.prefix}-o")
        kernel.create_netns(f"{orphan.prefix}-o")
        orphan.record_process(sleeper.pid)
        live.record_netns(f"{live.prefix}-l")
        kernel.create_netns(f"{live.prefix}-l")
        removed = ledger_mod.clean_all(tmp_path)
        assert removed == [f"process {sleeper.pid}", f"netns {orphan.prefix}-o"]
        assert processes.process_start_ticks(sleeper.pid) is None  # stopped and reaped
        assert f"{live.prefix}-l" in kernel.list_netns()
        assert live.path.exists()
        assert not orphan.path.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        live.teardown()
        orphan.teardown()
    assert f"{live.prefix}-l" not in kernel.list_netns()


def test_clean_all_does_not_kill_a_reused_pid(tmp_path: Path) -> None:
    orphan = ledger_mod.Ledger(ledger_mod.new_prefix(), owner_pid=2**22 + 1, state_dir=tmp_path)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        orphan.entries.append({"kind": "process", "pid": sleeper.pid, "start_ticks": 1})
        orphan._save()
        assert ledger_mod.clean_all(tmp_path) == []
        assert sleeper.poll() is None  # a different start time: not ours, left alone
    finally:
        sleeper.kill()
        sleeper.wait()


ALLOWED_CC = "net.ipv4.tcp_allowed_congestion_control"


@pytest.fixture
def missing_cc() -> str:
    """An available congestion control that the root namespace does not (yet) allow to
    namespaces. The test never edits the list itself: a testbed run on this host may
    hold an entry in it right now."""
    allowed = kernel.get_sysctl(None, ALLOWED_CC).split()
    available = kernel.get_sysctl(None, "net.ipv4.tcp_available_congestion_control").split()
    missing = [cc for cc in available if cc not in allowed]
    if not missing:
        pytest.skip("every available congestion control is already allowed to namespaces "
                    "here (by the host, or by a testbed run holding it)")
    return missing[0]


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_root_sysctl_is_held_jointly_and_restored_by_the_last_holder(
        tmp_path: Path, missing_cc: str) -> None:
    """Lanes (and concurrent runs) share the global allowed-congestion-control list:
    one topology closing must not take the algorithm away from one still running."""
    host_value = kernel.get_sysctl(None, ALLOWED_CC)
    first = ledger_mod.Ledger(ledger_mod.new_prefix(), state_dir=tmp_path)
    second = ledger_mod.Ledger(ledger_mod.new_prefix(), state_dir=tmp_path)
    try:
        ledger_mod.allow_congestion_control(first, missing_cc)
        ledger_mod.allow_congestion_control(second, missing_cc)
        assert kernel.get_sysctl(None, ALLOWED_CC).split().count(missing_cc) == 1
        first.teardown()
        assert missing_cc in kernel.get_sysctl(None, ALLOWED_CC).split(), \
            "the first topology to close took the algorithm from the second"
        second.teardown()
        assert kernel.get_sysctl(None, ALLOWED_CC) == host_value
        assert not list(tmp_path.glob("sysctl-*.json"))
    finally:
        first.teardown()
        second.teardown()


def test_a_dead_holder_does_not_pin_the_root_sysctl(tmp_path: Path, missing_cc: str) -> None:
    host_value = kernel.get_sysctl(None, ALLOWED_CC)
    crashed = ledger_mod.Ledger(ledger_mod.new_prefix(), owner_pid=_dead_pid(), state_dir=tmp_path)
    live = ledger_mod.Ledger(ledger_mod.new_prefix(), state_dir=tmp_path)
    try:
        ledger_mod.allow_congestion_control(crashed, missing_cc)
        ledger_mod.allow_congestion_control(live, missing_cc)
        live.teardown()  # the crashed run's hold does not count: the host value returns
        assert kernel.get_sysctl(None, ALLOWED_CC) == host_value
        assert ledger_mod.clean_all(tmp_path) == []  # nothing left to restore for `clean`
        assert not crashed.path.exists()
    finally:
        live.teardown()
        crashed.teardown()


def test_cleaners_that_start_at_once_take_turns(tmp_path: Path) -> None:
    """`clean`, --resume and every dask worker that starts clean dead runs; several at
    once (two workers of a cluster starting together) must not trip over one another."""
    state = tmp_path / "state"
    dead = ledger_mod.Ledger(ledger_mod.new_prefix(), owner_pid=_dead_pid(), state_dir=state)
    for _ in range(150):
        dead.new_tmpdir("planfence", tmp_path)  # every entry undone rewrites the ledger
    errors: list[BaseException] = []

    def clean() -> None:
        try:
            ledger_mod.clean_dead_runs(state)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=clean) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert not list(state.glob("tb*"))
    assert not list(tmp_path.glob("planfence-tb*"))
