"""Who may talk to a testbed cluster: bound addresses and mutual TLS (dask's ``Security``).

A dask worker runs whatever a client sends it, and a testbed worker runs as root (or
owns user namespaces), so an open scheduler is code execution on every worker. Rules:

1. Everything the testbed starts (``testbed scheduler``, ``testbed worker``, the
   scheduler and workers of ``--cluster local:N``, ``testbed bench cluster``) listens on
   127.0.0.1 unless an address (``--listen``) or an interface (``--interface``) is
   given. Dashboards are off unless asked for; dask's HTTP endpoint (health, metrics)
   that every scheduler and worker serves anyway is then bound to loopback.
2. TLS with mutual authentication is dask's own: ``tls://`` addresses and a
   :class:`distributed.security.Security` built from a CA file, a certificate and its
   key (``--tls-ca-file/--tls-cert/--tls-key``, or the ``[cluster]`` section of a TOML
   file given with ``--cluster-config``; flags override the file). Every side then
   requires encryption and a peer certificate signed by that CA (dask sets
   ``CERT_REQUIRED`` both ways), so a client or worker without one is refused.
3. A plain ``tcp://`` address of another host, or a ``tcp://`` listener on a
   non-loopback address, is refused unless ``insecure``; with it a warning line says
   what that means. ``tls://`` without certificates is refused in one line, and so are
   certificates with a ``tcp://`` address.
"""

from __future__ import annotations

import ipaddress
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.errors import UserError

#: How long a worker waits for a lost scheduler before it exits (``testbed worker
#: --death-timeout``; here so the command line names it without importing the worker).
DEFAULT_DEATH_TIMEOUT_S = 300.0

CONFIG_SECTION = "cluster"
CONFIG_KEYS = ("tls_ca_file", "tls_cert", "tls_key")
LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 8786


@dataclass(frozen=True)
class ClusterAccess:
    """How this process talks to (or serves) a cluster: TLS files, or none."""

    tls_ca_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    insecure: bool = False

    @property
    def tls(self) -> bool:
        return self.tls_ca_file is not None

    def security(self) -> Any:
        """dask's ``Security``: mutual TLS for every role, or plain (rule 2)."""
        from distributed.security import Security

        if not self.tls:
            return Security(require_encryption=False)
        files = {"tls_ca_file": self.tls_ca_file}
        for role in ("client", "scheduler", "worker"):
            files[f"tls_{role}_cert"] = self.tls_cert
            files[f"tls_{role}_key"] = self.tls_key
        return Security(require_encryption=True, **files)

    def protocol(self) -> str:
        return "tls" if self.tls else "tcp"


def load_cluster_config(path: str | Path) -> dict[str, str]:
    """The ``[cluster]`` section of a TOML file; relative paths are the file's."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text())
    except OSError as exc:
        raise UserError(f"--cluster-config: cannot read {file} ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"--cluster-config: {file} is not TOML ({exc})") from None
    section = data.get(CONFIG_SECTION)
    if not isinstance(section, dict):
        raise UserError(f"--cluster-config: {file} has no [{CONFIG_SECTION}] table; allowed "
                        f"keys there: {', '.join(CONFIG_KEYS)}")
    unknown = sorted(set(section) - set(CONFIG_KEYS))
    if unknown:
        raise UserError(f"{CONFIG_SECTION}.{unknown[0]} in {file} is not allowed; allowed: "
                        f"{', '.join(CONFIG_KEYS)}")
    out = {}
    for key, value in section.items():
        if not isinstance(value, str) or not value:
            raise UserError(f"{CONFIG_SECTION}.{key} in {file}: {value!r} is not allowed; "
                            "allowed: a file path")
        out[key] = str((file.parent / value).resolve())
    return out


def cluster_access(*, tls_ca_file: str | None = None, tls_cert: str | None = None,
                   tls_key: str | None = None, config: str | None = None,
                   insecure: bool = False) -> ClusterAccess:
    """Flags over the ``[cluster]`` section of ``config``; all three TLS files or none."""
    given = load_cluster_config(config) if config else {}
    for key, value in (("tls_ca_file", tls_ca_file), ("tls_cert", tls_cert),
                       ("tls_key", tls_key)):
        if value is not None:
            given[key] = value
    missing = [k for k in CONFIG_KEYS if k not in given]
    if given and missing:
        flag = "--" + missing[0].replace("_", "-")
        raise UserError(f"{flag}: missing; TLS needs --tls-ca-file, --tls-cert and --tls-key "
                        "together (or a [cluster] section naming all three)")
    for key, value in given.items():
        if not Path(value).is_file():
            raise UserError(f"--{key.replace('_', '-')}: {value} is not a file; create a lab's "
                            "certificates with `testbed cluster certs DIR`")
    return ClusterAccess(given.get("tls_ca_file"), given.get("tls_cert"), given.get("tls_key"),
                         insecure)


def split_address(address: str) -> tuple[str, str, int]:
    """``tls://HOST:PORT`` -> (scheme, host, port); IPv6 hosts in brackets."""
    scheme, sep, rest = address.partition("://")
    host, colon, port = rest.rpartition(":")
    if not sep or scheme not in ("tcp", "tls") or not colon or not port.isdigit() or not host:
        raise UserError(f"cluster: {address!r} is not allowed; allowed: tls://HOST:PORT (or "
                        "tcp://HOST:PORT) of a dask scheduler")
    return scheme, host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: another machine, as far as we can tell


def insecure_warning(what: str) -> str:
    return (f"warning: {what} is plain tcp:// beyond this host: unencrypted and "
            "unauthenticated, anyone who can reach it can run code on the workers")


def check_peer(address: str, access: ClusterAccess, *, what: str) -> list[str]:
    """Check a scheduler address against the access (rule 3); warning lines to print."""
    scheme, host, _ = split_address(address)
    if scheme == "tls" and not access.tls:
        raise UserError(f"{what}: {address} is a tls:// address; give --tls-ca-file, "
                        "--tls-cert and --tls-key (or --cluster-config FILE)")
    if scheme == "tcp" and access.tls:
        raise UserError(f"{what}: TLS certificates were given for a tcp:// address; use "
                        f"tls://{address.partition('://')[2]}")
    if scheme == "tcp" and not is_loopback(host):
        if not access.insecure:
            raise UserError(f"{what}: {address} is plain tcp:// to another host (anyone who "
                            "reaches it can run code on the workers); use tls:// with "
                            "certificates (`testbed cluster certs DIR`), or pass --insecure")
        return [insecure_warning(address)]
    return []


def check_listen(host: str, access: ClusterAccess, *, what: str) -> list[str]:
    """A listener on ``host`` (an address; "" for an interface's): rule 3."""
    if access.tls or is_loopback(host):
        return []
    if not access.insecure:
        raise UserError(f"{what}: listening on {host or 'an interface'} without TLS lets "
                        "anyone who reaches it run code here; give --tls-ca-file, --tls-cert "
                        "and --tls-key (or --cluster-config FILE), or pass --insecure")
    return [insecure_warning(f"{what} on {host or 'the interface'}")]


def listen_options(listen: str | None, interface: str | None) -> dict[str, Any]:
    """``host``/``interface`` keywords of a dask Scheduler, Nanny or Worker (rule 1)."""
    if listen is not None and interface is not None:
        raise UserError("--listen and --interface: give one of them, not both")
    if interface is not None:
        return {"host": None, "interface": interface}
    return {"host": listen or LOOPBACK, "interface": None}


def dashboard_address(dashboard: bool, address: str | None) -> str:
    """Where dask's HTTP server listens: the dashboard if asked for, else only its
    health and metrics routes; on loopback unless an address is given (rule 1)."""
    if address is not None:
        return address
    return f"{LOOPBACK}:8787" if dashboard else f"{LOOPBACK}:0"
