"""Development CA and certificates (crypto/certs.py)."""

from __future__ import annotations

import ipaddress
import os
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from xclp.crypto import certs
from xclp.errors import ConfigError, InvalidInput


def test_server_certificate_chains_to_ca_with_requested_sans(tmp_path):
    ca = certs.init_ca(tmp_path / "ca")
    assert stat.S_IMODE(os.stat(ca.key_path).st_mode) == 0o600
    issued = certs.issue(tmp_path / "ca", tmp_path / "out", "server", server=True,
                         dns_names=("localhost", "coord.example.org"), ips=("127.0.0.1", "::1"))
    assert stat.S_IMODE(os.stat(issued.key_path).st_mode) == 0o600
    ca_cert = x509.load_pem_x509_certificate(ca.cert_path.read_bytes())
    cert = x509.load_pem_x509_certificate(issued.cert_path.read_bytes())
    cert.verify_directly_issued_by(ca_cert)  # raises if the signature or issuer is wrong
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "coord.example.org"}
    assert set(san.get_values_for_type(x509.IPAddress)) == {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_party_certificate_is_client_auth_named_after_the_party(tmp_path):
    certs.init_ca(tmp_path)
    issued = certs.issue(tmp_path, tmp_path, "hospital-a", server=False)
    cert = x509.load_pem_x509_certificate(issued.cert_path.read_bytes())
    assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "hospital-a"
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_certificate_signed_by_another_ca_does_not_verify(tmp_path):
    certs.init_ca(tmp_path / "one")
    other_key, other_cert = certs.make_ca("other")
    issued = certs.issue(tmp_path / "one", tmp_path, "server", server=True, dns_names=("localhost",))
    cert = x509.load_pem_x509_certificate(issued.cert_path.read_bytes())
    with pytest.raises(Exception):
        cert.verify_directly_issued_by(other_cert)
    assert isinstance(other_key, ec.EllipticCurvePrivateKey)


def test_bad_requests_fail_with_a_clear_message(tmp_path):
    with pytest.raises(ConfigError, match="ca init"):
        certs.issue(tmp_path / "none", tmp_path, "server", server=True, dns_names=("x",))
    certs.init_ca(tmp_path)
    with pytest.raises(ConfigError, match="refusing to replace"):
        certs.init_ca(tmp_path)
    with pytest.raises(InvalidInput, match="at least one DNS name or IP"):
        certs.issue(tmp_path, tmp_path, "server", server=True)
    with pytest.raises(InvalidInput, match="not an IP"):
        certs.issue(tmp_path, tmp_path, "server", server=True, ips=("300.1.1.1",))
