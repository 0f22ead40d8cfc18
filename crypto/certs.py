"""A development certificate authority for TLS between the coordinator and the parties (DESIGN §2, §8).

`xclp-server ca init`, `cert server` and `cert party` call these, so users need no openssl.
Keys are ECDSA P-256; the CA signs a server certificate (serverAuth, SANs = DNS names and IPs)
and party client certificates (clientAuth, CN = party id) for optional mutual TLS. Private keys
are written mode 0600. For production, use your institution's PKI and point the flags at it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from xclp.errors import ConfigError, InvalidInput

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"


@dataclass(frozen=True)
class Issued:
    cert_path: Path
    key_path: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "xclp"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(days: int) -> tuple[dt.datetime, dt.datetime]:
    if days < 1:
        raise InvalidInput(f"certificate validity must be at least 1 day, got {days}")
    now = dt.datetime.now(dt.timezone.utc)
    return now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)


def make_ca(common_name: str = "xclp development CA", days: int = 3650) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(_name(common_name))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    common_name: str,
    *,
    server: bool,
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    days: int = 825,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A server (serverAuth, SANs required) or client (clientAuth) certificate signed by the CA."""
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    for ip in ips:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(ip)))
        except ValueError:
            raise InvalidInput(f"{ip!r} is not an IP address") from None
    if server and not sans:
        raise InvalidInput("a server certificate needs at least one DNS name or IP address")
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


# --- files ------------------------------------------------------------------------------------


def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    # O_NOFOLLOW: a symlink planted at `path` must not redirect a private key elsewhere
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    os.chmod(path, 0o600)


def write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def load_ca(ca_dir: str | os.PathLike[str]) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_dir = Path(ca_dir)
    try:
        cert = x509.load_pem_x509_certificate((ca_dir / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((ca_dir / CA_KEY).read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the CA from {ca_dir} (run `xclp-server ca init` first): {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{ca_dir / CA_KEY} is not an EC private key")
    return key, cert


def init_ca(ca_dir: str | os.PathLike[str], *, common_name: str = "xclp development CA", days: int = 3650) -> Issued:
    ca_dir = Path(ca_dir)
    ca_dir.mkdir(parents=True, exist_ok=True)
    if (ca_dir / CA_KEY).exists():
        raise ConfigError(f"{ca_dir / CA_KEY} already exists; refusing to replace a CA")
    key, cert = make_ca(common_name, days)
    write_key(key, ca_dir / CA_KEY)
    write_cert(cert, ca_dir / CA_CERT)
    return Issued(ca_dir / CA_CERT, ca_dir / CA_KEY)


def issue(
    ca_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    name: str,
    *,
    server: bool,
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    days: int = 825,
) -> Issued:
    """Write <out_dir>/<name>.pem and <name>-key.pem signed by the CA in `ca_dir`."""
    ca_key, ca_cert = load_ca(ca_dir)
    key, cert = make_leaf(ca_key, ca_cert, name, server=server, dns_names=dns_names, ips=ips, days=days)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    issued = Issued(out / f"{name}.pem", out / f"{name}-key.pem")
    write_key(key, issued.key_path)
    write_cert(cert, issued.cert_path)
    return issued
