"""Real schedulers and workers for the cluster tests, started as a lab starts them:
`testbed scheduler`, `testbed worker`, `dask worker`, each a process of its own with a
log, stopped by pid (SIGTERM, then SIGKILL) when the test ends."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil

BIN = Path(sys.executable).parent
WORLD_PYTHON = "python3.11"
"""The system interpreter a world-readable venv is built on (this checkout's own lives
under /root, which uid 65534 cannot enter)."""


def world_venv(directory: Path) -> Path | None:
    """A venv in ``directory`` that uid 65534 can run, on a system python3.11, with this
    checkout's packages on its path; its python, or None where there is no such
    interpreter."""
    world = shutil.which(WORLD_PYTHON, path="/usr/bin:/usr/local/bin")
    if not world:
        return None
    venv = directory / "venv"
    subprocess.run([world, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    ours = next((BIN.parent / "lib").glob("python3*/site-packages"))
    (site / "checkout.pth").write_text(f"import site; site.addsitedir({str(ours)!r})\n")
    return venv / "bin" / "python"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Procs:
    """Processes of one test, by name; each one's output goes to DIR/NAME.log."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stack = contextlib.ExitStack()

    def start(self, name: str, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        log = self._stack.enter_context(self.log_path(name).open("ab"))
        options: dict[str, object] = {"cwd": self.directory, **kwargs}
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                **options)  # type: ignore[call-overload]
        self.procs[name] = proc
        return proc

    def log_path(self, name: str) -> Path:
        return self.directory / f"{name}.log"

    def log(self, name: str) -> str:
        return self.log_path(name).read_text(errors="replace")

    def wait_for_log(self, name: str, text: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log(name):
            proc = self.procs[name]
            assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{self.log(name)[-3000:]}"
            assert time.monotonic() < deadline, f"{name}: no {text!r}:\n{self.log(name)[-3000:]}"
            time.sleep(0.3)

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name)
        self._stack.close()


@contextlib.contextmanager
def processes(directory: Path) -> Iterator[Procs]:
    procs = Procs(directory)
    try:
        yield procs
    finally:
        procs.close()


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket of ``pid`` and its descendants."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    out = []
    for proc in family:
        try:
            conns = proc.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        out += [(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out
