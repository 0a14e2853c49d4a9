"""`testbed cluster certs DIR`: a certificate authority and certificates for a lab.

Rules:

- One CA per lab (``ca.pem``; its key ``ca.key`` stays with whoever issues
  certificates), and one certificate + key per role: ``scheduler``, ``worker``,
  ``client`` (dask verifies that a peer's certificate is signed by the CA; it does not
  check host names, so one worker certificate serves every worker host). The
  certificates name the given hosts as subject alternative names anyway.
- Keys are ECDSA P-256, written 0600; certificates are valid for ``days`` days.
- Beside them, one TOML file per role with a ``[cluster]`` section naming its files
  (``--cluster-config DIR/worker.toml``), relative to the directory so it can be
  copied to other hosts whole.
- An existing CA in DIR is reused (new role certificates are signed by it); existing
  role files are refused unless ``force``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from testbed.errors import UserError

ROLES = ("scheduler", "worker", "client")
DEFAULT_DAYS = 365


def _key() -> object:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: object) -> None:
    from cryptography.hazmat.primitives import serialization

    data = key.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_cert(path: Path, cert: object) -> None:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))  # type: ignore[attr-defined]


def _names(hosts: Sequence[str]) -> list[object]:
    from cryptography import x509

    out: list[object] = [x509.DNSName("localhost"),
                         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for host in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def _load_ca(directory: Path) -> tuple[object, object] | None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert_path, key_path = directory / "ca.pem", directory / "ca.key"
    if not cert_path.exists():
        return None
    if not key_path.exists():
        raise UserError(f"certs: {cert_path} exists without ca.key; new certificates need the "
                        "CA's key (or another directory)")
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    return cert, key


def _new_ca(directory: Path, lab: str, days: int) -> tuple[object, object]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{lab} testbed cluster CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key())  # type: ignore[attr-defined]
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))  # type: ignore[arg-type]
    _write_key(directory / "ca.key", key)
    _write_cert(directory / "ca.pem", cert)
    return cert, key


def _issue(directory: Path, role: str, ca: tuple[object, object], hosts: Sequence[str],
           lab: str, days: int) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert, ca_key = ca
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                        f"{lab} testbed {role}")]))
            .issuer_name(ca_cert.subject)  # type: ignore[attr-defined]
            .public_key(key.public_key())  # type: ignore[attr-defined]
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(_names(hosts)),  # type: ignore[arg-type]
                           critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    _write_key(directory / f"{role}.key", key)
    _write_cert(directory / f"{role}.pem", cert)
    (directory / f"{role}.toml").write_text(
        f"# testbed {role}: --cluster-config {directory / f'{role}.toml'}\n"
        "[cluster]\n"
        'tls_ca_file = "ca.pem"\n'
        f'tls_cert = "{role}.pem"\n'
        f'tls_key = "{role}.key"\n')


def make_certs(directory: Path, *, hosts: Sequence[str] = (), lab: str = "lab",
               days: int = DEFAULT_DAYS, force: bool = False) -> list[Path]:
    """Create (or reuse) the CA in ``directory`` and a certificate per role; the files
    written, in order."""
    if days < 1:
        raise UserError(f"--days: {days} is not allowed; allowed: an integer >= 1")
    if directory.exists() and not directory.is_dir():
        raise UserError(f"certs: {directory} is not a directory")
    existing = [directory / f"{r}.pem" for r in ROLES if (directory / f"{r}.pem").exists()]
    if existing and not force:
        raise UserError(f"certs: {existing[0]} exists; pass --force to issue new ones "
                        "(the CA is kept)")
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    ca = _load_ca(directory)
    if ca is None:
        ca = _new_ca(directory, lab, days)
        written += [directory / "ca.pem", directory / "ca.key"]
    for role in ROLES:
        _issue(directory, role, ca, hosts, lab, days)
        written += [directory / f"{role}.{ext}" for ext in ("pem", "key", "toml")]
    return written
