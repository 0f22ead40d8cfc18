"""The development CA on disk (`xclp-server ca init`, `cert server`, `cert node`, `cert party`): ca.pem and
ca-key.pem in a directory, and each certificate issued from it as <name>.pem and <name>-key.pem.
Private keys are written mode 0600, never through a symbolic link; crypto/certs.py makes them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from xclp.crypto import certs
from xclp.errors import ConfigError
from xclp.runtime import write_atomic, write_private

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"


@dataclass(frozen=True)
class Issued:
    cert_path: Path
    key_path: Path


def init_ca(ca_dir: str | os.PathLike[str], *, common_name: str = "xclp development CA", days: int = 3650) -> Issued:
    ca_dir = Path(ca_dir)
    ca_dir.mkdir(parents=True, exist_ok=True)
    if (ca_dir / CA_KEY).exists():
        raise ConfigError(f"{ca_dir / CA_KEY} already exists; refusing to replace a CA")
    key, cert = certs.make_ca(common_name, days)
    return _write(ca_dir / CA_CERT, ca_dir / CA_KEY, key, cert)


def load_ca(ca_dir: str | os.PathLike[str]) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_dir = Path(ca_dir)
    try:
        cert, key = (ca_dir / CA_CERT).read_bytes(), (ca_dir / CA_KEY).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot load the CA from {ca_dir} (run `xclp-server ca init` first): {exc}") from None
    return certs.load_ca(cert, key, source=f"the CA in {ca_dir}")


def issue(
    ca_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    name: str,
    *,
    server: bool,
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    days: int = 825,
    client_too: bool = False,
) -> Issued:
    """Write <out_dir>/<name>.pem and <name>-key.pem signed by the CA in `ca_dir` (`client_too`: a
    server's certificate that is also a client's, for a node that listens and connects)."""
    ca_key, ca_cert = load_ca(ca_dir)
    key, cert = certs.make_leaf(ca_key, ca_cert, name, server=server, dns_names=dns_names, ips=ips, days=days,
                                client_too=client_too)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return _write(out / f"{name}.pem", out / f"{name}-key.pem", key, cert)


def _write(cert_path: Path, key_path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> Issued:
    write_private(key_path, certs.key_pem(key), overwrite=True)
    write_atomic(cert_path, certs.cert_pem(cert), mode=0o644)
    return Issued(cert_path, key_path)
