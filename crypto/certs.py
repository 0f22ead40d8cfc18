"""A development certificate authority for TLS between the coordinator and the parties (docs/design.md §2, §8).

Keys are ECDSA P-256; the CA signs a server certificate (serverAuth, SANs = DNS names and IPs)
and party client certificates (clientAuth, CN = party id) for optional mutual TLS. Everything here
takes and gives objects or PEM bytes; `xclp-server ca init`, `cert server` and `cert party` keep
them in files (server/dev_ca.py), so users need no openssl. For production, use your
institution's PKI and point the flags at it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from xclp.errors import ConfigError, InvalidInput


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "xclp"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(days: int) -> tuple[dt.datetime, dt.datetime]:
    if days < 1:
        raise InvalidInput(f"certificate validity must be at least 1 day, got {days}")
    now = dt.datetime.now(dt.UTC)
    return now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)


CertifiedKey = tuple[ec.EllipticCurvePrivateKey, x509.Certificate]


def make_ca(common_name: str = "xclp development CA", days: int = 3650) -> CertifiedKey:
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
    client_too: bool = False,
) -> CertifiedKey:
    """A server (serverAuth, SANs required) or client (clientAuth) certificate signed by the CA;
    `client_too`: a server's that is also a client's (a Dask scheduler's or worker's, which both
    listen and connect)."""
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
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    if client_too or not server:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


# --- PEM -----------------------------------------------------------------------------------------


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The private key as unencrypted PKCS#8 PEM (the caller writes it owner-only)."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def load_ca(cert_data: bytes, key_data: bytes, *, source: str = "the CA") -> CertifiedKey:
    """A CA's key and certificate from their PEM bytes; ConfigError naming `source` otherwise."""
    try:
        cert = x509.load_pem_x509_certificate(cert_data)
        key = serialization.load_pem_private_key(key_data, password=None)
    except ValueError as exc:
        raise ConfigError(f"{source} is not a PEM certificate and private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{source}: the CA key is not an EC private key")
    return key, cert
