"""What a run changed on this host, written down before it is changed, and undone.

Rules of this module:

- Everything a run creates carries its run prefix (``tb`` + 6 hex digits, short enough
  for interface names) and is recorded in the run's :class:`Ledger` *before* it is
  created; the ledger is persisted under ``/run/planfence-testbed/`` so that
  :func:`clean_all` can remove the leftovers of a run whose controller died.
- Removal goes in reverse order of creation and tolerates objects that are already
  gone (``ENOENT``/``ENODEV``/``ESRCH``), nothing else; a process is stopped only if it
  is still the same process (pid and start time), never by pattern.
- Temporary directories of a run (node stores and logs, control sockets) are named
  ``<kind>-<prefix>-<n>`` under the temp root and recorded (``tmpdir``) before they
  are made; a run that has no topology (loopback) still has a ledger for them
  (:func:`open_run_ledger`).
- A ledger is a dead run's when its owner process is gone: no process with that pid
  *and* start time, or only its zombie. ``testbed clean`` and ``--resume`` undo every
  dead run's ledger whatever its label (:func:`clean_dead_runs`): a killed controller
  leaves a run ledger labelled with its results directory, but also one ledger per
  topology and one for a shared emulator, which carry no label. A live owner's ledger
  is never touched, nor a recorded process whose start time differs (a reused pid).
- Root-namespace sysctls are global: several runs may need a word in one at once, so
  they hold it jointly (:func:`hold_root_sysctl_word`); the last live holder restores
  the host's value.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.errors import HostError, UserError
from testbed.host.kernel import (
    KernelError,
    get_sysctl,
    remove_link,
    remove_netns,
    sysctl_path,
    write_root_sysctl,
)
from testbed.host.processes import is_running, process_start_ticks, same_process, stop_process
from testbed.host.userns import in_user_namespace, outer_uid

STATE_DIR = Path("/run/planfence-testbed")
#: Node stores and logs; control sockets; the model relay's Unix sockets (live campaigns);
#: users' programs (hosts file, output, metrics).
TMPDIR_KINDS = ("planfence", "pft-ctl", "pft-model", "pft-run")


def run_state_dir() -> Path:
    """Where this user's run ledgers live: STATE_DIR for root, else a directory of the
    user's under the temp root (loopback runs need no root; a rootless run's /run is
    a private tmpfs that vanishes with it, while its temporary directories do not)."""
    if os.geteuid() == 0 and not in_user_namespace():
        return STATE_DIR
    return Path(tempfile.gettempdir()) / f"planfence-testbed-{outer_uid()}"


def new_prefix() -> str:
    """A run-specific name prefix, ``tb`` + 6 hex digits (interface names stay < 16 chars)."""
    return "tb" + secrets.token_hex(3)


def check_prefix(prefix: str) -> str:
    if not (prefix.startswith("tb") and 3 <= len(prefix) <= 8 and prefix.isalnum()):
        raise UserError(f"prefix: must be 'tb' + 1-6 letters/digits, got {prefix!r}")
    return prefix


def allow_congestion_control(ledger: Ledger, cc: str) -> None:
    """Make CC settable as a namespace default.

    The kernel lets a non-root namespace default only to algorithms listed in the root
    namespace's net.ipv4.tcp_allowed_congestion_control (EPERM otherwise). That sysctl is
    global, and several topologies (lanes of one run, or several runs) may need it at
    once, so it is held jointly (:func:`hold_root_sysctl_word`): the first holder appends
    CC, the last one to leave restores the host's value.
    """
    available = get_sysctl(None, "net.ipv4.tcp_available_congestion_control").split()
    if cc not in available:
        raise HostError(
            f"congestion_control: {cc!r} is not available here; allowed: {', '.join(available)}"
        )
    hold_root_sysctl_word(ledger, "net.ipv4.tcp_allowed_congestion_control", cc)


class _SharedSysctl:
    """The joint-holding record of one root sysctl: ``<state_dir>/sysctl-<key>.json``
    with the host's value, the value set, and the holders (prefix -> owner pid, start
    ticks). Read and written only under an exclusive flock on ``root-sysctl.lock``."""

    def __init__(self, state_dir: Path, key: str) -> None:
        self.state_dir = state_dir
        self.path = state_dir / f"sysctl-{key}.json"
        self._fd: int | None = None

    def __enter__(self) -> _SharedSysctl:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.state_dir / "root-sysctl.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def load(self) -> dict[str, Any] | None:
        try:
            state = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        if not isinstance(state, dict):
            return None
        state["holders"] = {prefix: owner for prefix, owner in state.get("holders", {}).items()
                            if same_process(int(owner[0]), owner[1])}  # live ones only
        return state

    def save(self, state: dict[str, Any] | None) -> None:
        if state is None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.path)


def hold_root_sysctl_word(ledger: Ledger, key: str, word: str) -> None:
    """Ensure WORD is in the space-separated root sysctl KEY while LEDGER's run lives.

    A host that already lists WORD is left alone (nothing recorded). Otherwise the hold
    is written down first (the shared record, then the ledger) and the sysctl changed
    last, so a crash in between never leaves an unrecorded change; the last live holder
    to leave (:func:`release_root_sysctl_word`, at teardown or `clean`) restores the
    host's value.
    """
    with _SharedSysctl(ledger.state_dir, key) as shared:
        state = shared.load()
        current = get_sysctl(None, key)
        if state is None and word in current.split():
            return  # the host allows it by itself
        if state is None:
            state = {"previous": current, "value": current, "holders": {}}
        value = current if word in current.split() else f"{current} {word}".strip()
        state["value"] = value
        state["holders"][ledger.prefix] = ledger.owner
        shared.save(state)
        ledger.record_shared_sysctl(key)
        if value != current:
            try:
                write_root_sysctl(key, value)
            except OSError as exc:
                raise KernelError(exc.errno or errno.EIO, f"sysctl {key}={value}") from exc


def release_root_sysctl_word(key: str, holder: str, state_dir: Path) -> bool:
    """Drop HOLDER's hold on KEY; the last live holder restores the host's value (unless
    someone else changed the sysctl since). True if the value was restored."""
    with _SharedSysctl(state_dir, key) as shared:
        state = shared.load()
        if state is None:
            return False
        state["holders"].pop(holder, None)
        if state["holders"]:
            shared.save(state)
            return False
        shared.save(None)
        return restore_root_sysctl(key, str(state["previous"]), str(state["value"]))


def restore_root_sysctl(key: str, previous: str, value: str) -> bool:
    """Put back PREVIOUS unless someone changed the sysctl since we set VALUE."""
    path = sysctl_path(key)
    if path.read_text().split() != value.split():
        return False
    try:
        write_root_sysctl(key, previous)
    except OSError as exc:
        raise KernelError(exc.errno or errno.EIO, f"restore sysctl {key}") from exc
    return True


@dataclass
class Ledger:
    """What one run created, in order; persisted so a later `clean` can undo a crashed run."""

    prefix: str
    entries: list[dict[str, Any]] = field(default_factory=list)
    owner_pid: int = field(default_factory=os.getpid)
    state_dir: Path = STATE_DIR
    owner_start_ticks: int | None = None  # None: read from /proc for owner_pid
    label: str = ""  # what the run is about (a run ledger: its results directory)

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        self._lock = threading.Lock()
        if self.owner_start_ticks is None:
            self.owner_start_ticks = process_start_ticks(self.owner_pid)

    @classmethod
    def load(cls, path: Path) -> Ledger:
        """A ledger as a run persisted it (``clean`` reads those of dead runs)."""
        body = json.loads(path.read_text())
        return cls(prefix=str(body["prefix"]), entries=list(body["entries"]),
                   owner_pid=int(body["owner_pid"]), state_dir=path.parent,
                   owner_start_ticks=body.get("owner_start_ticks"),
                   label=str(body.get("label", "")))

    def owner_alive(self) -> bool:
        """The run that owns this ledger still runs (a zombie has exited: it is dead)."""
        return is_running(self.owner_pid, self.owner_start_ticks)

    @property
    def path(self) -> Path:
        return self.state_dir / f"{self.prefix}.json"

    def _save(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")  # one per writing process
        body = {
            "prefix": self.prefix,
            "owner_pid": self.owner_pid,
            "owner_start_ticks": self.owner_start_ticks,
            "label": self.label,
            "entries": self.entries,
        }
        tmp.write_text(json.dumps(body))
        tmp.replace(self.path)

    def _add(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.entries.append(entry)
            self._save()

    def record_netns(self, name: str) -> None:
        """Record BEFORE creating: a crash in between leaves an entry, never an orphan."""
        self._check_name(name)
        self._add({"kind": "netns", "name": name})

    def record_link(self, ifname: str, netns: str | None) -> None:
        self._check_name(ifname)
        self._add({"kind": "link", "name": ifname, "netns": netns})

    def new_tmpdir(self, kind: str, root: Path | None = None) -> Path:
        """Record, then create, a fresh directory ``<root>/<kind>-<prefix>-<n>``."""
        if kind not in TMPDIR_KINDS:
            raise ValueError(f"tmpdir kind: {kind!r} not one of {', '.join(TMPDIR_KINDS)}")
        base = Path(root) if root is not None else Path(tempfile.gettempdir())
        for n in itertools.count(1):
            path = (base / f"{kind}-{self.prefix}-{n}").absolute()
            if path.exists() or any(e.get("path") == str(path) for e in self.entries):
                continue
            self._add({"kind": "tmpdir", "path": str(path)})
            path.mkdir(mode=0o700, parents=False)
            return path
        raise AssertionError("unreachable")

    def remove_tmpdir(self, path: Path) -> None:
        """Remove a directory made by :meth:`new_tmpdir`, and its entry."""
        entry = {"kind": "tmpdir", "path": str(Path(path).absolute())}
        _undo(entry)
        with self._lock:
            if entry in self.entries:
                self.entries.remove(entry)
                self._save()

    def record_process(self, pid: int) -> None:
        self._add({"kind": "process", "pid": pid, "start_ticks": process_start_ticks(pid)})

    def forget_process(self, pid: int) -> None:
        """The process has exited: drop its entry (nothing left to undo)."""
        with self._lock:
            kept = [e for e in self.entries if not (e["kind"] == "process" and e["pid"] == pid)]
            if len(kept) != len(self.entries):
                self.entries = kept
                self._save()

    @property
    def owner(self) -> list[Any]:
        """[pid, start ticks] of the run that owns this ledger (how others tell it lives)."""
        return [self.owner_pid, self.owner_start_ticks]

    def record_shared_sysctl(self, key: str) -> None:
        """This run holds root sysctl KEY jointly (:func:`hold_root_sysctl_word`); teardown
        releases the hold. (Ledgers written by older versions may hold "sysctl" entries,
        a private change with its previous value; teardown still undoes those.)"""
        self._add({"kind": "shared_sysctl", "key": key, "holder": self.prefix,
                   "state_dir": str(self.state_dir)})

    def _check_name(self, name: str) -> None:
        if not name.startswith(self.prefix):
            raise ValueError(f"name {name!r} lacks the run prefix {self.prefix!r}")

    def teardown(self) -> list[str]:
        """Remove everything recorded, newest first; returns what was removed.

        Keeps going after a failure and raises the first one at the end, so one stuck
        object does not leak the others; an entry that could not be undone stays
        recorded (a later `clean` retries it; a version that does not know its kind
        leaves it to one that does).
        """
        removed: list[str] = []
        first_error: BaseException | None = None
        with self._lock:
            entries = list(reversed(self.entries))
        for entry in entries:
            try:
                if _undo(entry):
                    removed.append(_describe(entry))
            except Exception as exc:
                first_error = first_error or exc
                continue
            with self._lock:
                self.entries.remove(entry)
                self._save()
        with self._lock, contextlib.suppress(FileNotFoundError):
            if not self.entries:
                self.path.unlink()
        if first_error is not None:
            raise first_error
        return removed


def _describe(entry: dict[str, Any]) -> str:
    if entry["kind"] == "tmpdir":
        return f"directory {entry['path']}"
    if entry["kind"] == "process":
        return f"process {entry['pid']}"
    if entry["kind"] == "sysctl":
        return f"sysctl {entry['key']}={entry['previous']} (restored)"
    if entry["kind"] == "shared_sysctl":
        return f"sysctl {entry['key']} (host value restored)"
    where = f" (in {entry['netns']})" if entry.get("netns") else ""
    return f"{entry['kind']} {entry['name']}{where}"


def _undo(entry: dict[str, Any]) -> bool:
    kind = entry["kind"]
    if kind == "netns":
        return remove_netns(str(entry["name"]))
    if kind == "link":
        return remove_link(str(entry["name"]), entry.get("netns"))
    if kind == "process":
        return stop_process(int(entry["pid"]), entry.get("start_ticks"))
    if kind == "sysctl":
        return restore_root_sysctl(str(entry["key"]), str(entry["previous"]), str(entry["value"]))
    if kind == "shared_sysctl":
        return release_root_sysctl_word(str(entry["key"]), str(entry["holder"]),
                                        Path(str(entry["state_dir"])))
    if kind == "tmpdir":
        return _remove_tmpdir(Path(str(entry["path"])))
    raise ValueError("ledger entry kind: netns|link|process|sysctl|shared_sysctl|tmpdir, "
                     f"got {kind!r}")


def _remove_tmpdir(path: Path) -> bool:
    """Remove a run's temporary directory; refuses a path not named by new_tmpdir."""
    if not (path.is_absolute() and any(path.name.startswith(f"{k}-tb") for k in TMPDIR_KINDS)):
        raise ValueError(f"tmpdir entry {path}: not a run's temporary directory")
    if not path.exists():
        return False
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():  # what rmtree could not remove
        raise OSError(errno.ENOTEMPTY, f"cannot remove {path}")
    return True


def clean_all(state_dir: Path = STATE_DIR) -> list[str]:
    """Undo the ledgers of runs whose owner process is dead; never touches unrecorded things."""
    return clean_dead_runs(state_dir)


def clean_dead_runs(state_dir: Path) -> list[str]:
    """Undo the ledgers in ``state_dir`` whose owner is dead, whatever their label
    (``testbed clean``; ``--resume`` before it runs: a killed run on the same results
    directory left its run ledger there, and its topologies' unlabelled ledgers)."""
    removed: list[str] = []
    first_error: BaseException | None = None
    if not state_dir.is_dir():
        return removed
    # Cleaners of one host take turns (`clean`, --resume and every dask worker that
    # starts clean dead runs): two tearing one ledger down at once raced on its file.
    lock = os.open(state_dir / "clean.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        first_error = _clean_dead(state_dir, removed)
    finally:
        os.close(lock)
    if first_error is not None:
        raise first_error
    return removed


def _clean_dead(state_dir: Path, removed: list[str]) -> BaseException | None:
    first_error: BaseException | None = None
    for path in sorted(state_dir.glob("tb*.json")):
        try:
            ledger = Ledger.load(path)
        except (OSError, ValueError, KeyError, TypeError, UserError):
            continue  # not a ledger this version can read: leave it alone
        if ledger.owner_alive():
            continue  # a live run owns it
        try:
            removed.extend(ledger.teardown())
        except Exception as exc:  # keep cleaning the others; what failed stays recorded
            first_error = first_error or exc
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return first_error


@contextlib.contextmanager
def open_run_ledger(label: str, *, state_dir: Path | None = None) -> Iterator[Ledger]:
    """The ledger of one ``testbed run`` (its temporary directories); on exit whatever
    is still recorded is removed and the ledger deleted. A SIGKILLed run leaves the
    ledger for ``testbed clean`` or ``--resume``."""
    ledger = Ledger(new_prefix(), state_dir=state_dir or run_state_dir(), label=label)
    ledger.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ledger._save()  # an empty ledger already names its owner
    try:
        yield ledger
    finally:
        ledger.teardown()
        with contextlib.suppress(FileNotFoundError):
            ledger.path.unlink()


@contextlib.contextmanager
def scratch_ledger(*, prefix: str | None = None, state_dir: Path = STATE_DIR
                   ) -> Iterator[Ledger]:
    """A ledger for short-lived probes: everything recorded in it is removed on exit."""
    ledger = Ledger(prefix or new_prefix(), state_dir=state_dir)
    try:
        yield ledger
    finally:
        ledger.teardown()
