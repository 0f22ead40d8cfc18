"""The development CA on disk (server/dev_ca.py, `xclp-server ca init` / `cert`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cryptography import x509

from xclp.errors import ConfigError
from xclp.server import dev_ca


def test_keys_are_owner_only_and_certificates_chain_to_the_ca(tmp_path: Path) -> None:
    ca = dev_ca.init_ca(tmp_path / "ca")
    assert stat.S_IMODE(os.stat(ca.key_path).st_mode) == 0o600
    issued = dev_ca.issue(tmp_path / "ca", tmp_path / "out", "server", server=True, dns_names=("localhost",))
    assert stat.S_IMODE(os.stat(issued.key_path).st_mode) == 0o600
    assert issued == dev_ca.Issued(tmp_path / "out" / "server.pem", tmp_path / "out" / "server-key.pem")
    cert = x509.load_pem_x509_certificate(issued.cert_path.read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_path.read_bytes()))


def test_a_missing_ca_and_a_second_init_are_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ca init"):
        dev_ca.issue(tmp_path / "none", tmp_path, "server", server=True, dns_names=("x",))
    dev_ca.init_ca(tmp_path)
    with pytest.raises(ConfigError, match="refusing to replace"):
        dev_ca.init_ca(tmp_path)
