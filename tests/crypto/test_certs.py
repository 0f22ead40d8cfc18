"""The development CA's certificates (crypto/certs.py): what they certify, and PEM both ways."""

from __future__ import annotations

import ipaddress

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from xclp.crypto import certs
from xclp.errors import ConfigError, InvalidInput


def test_server_certificate_chains_to_ca_with_requested_sans():
    ca_key, ca_cert = certs.make_ca()
    _, cert = certs.make_leaf(ca_key, ca_cert, "server", server=True,
                              dns_names=("localhost", "coord.example.org"), ips=("127.0.0.1", "::1"))
    cert.verify_directly_issued_by(ca_cert)  # raises if the signature or issuer is wrong
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "coord.example.org"}
    ips = {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    assert set(san.get_values_for_type(x509.IPAddress)) == ips
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_party_certificate_is_client_auth_named_after_the_party():
    ca_key, ca_cert = certs.make_ca()
    _, cert = certs.make_leaf(ca_key, ca_cert, "hospital-a", server=False)
    assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "hospital-a"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_certificate_signed_by_another_ca_does_not_verify():
    ca_key, ca_cert = certs.make_ca()
    other_key, other_cert = certs.make_ca("other")
    _, cert = certs.make_leaf(ca_key, ca_cert, "server", server=True, dns_names=("localhost",))
    with pytest.raises((ValueError, InvalidSignature)):  # another issuer name, or another key's signature
        cert.verify_directly_issued_by(other_cert)
    assert isinstance(other_key, ec.EllipticCurvePrivateKey)


def test_the_ca_round_trips_through_pem_and_anything_else_is_refused():
    key, cert = certs.make_ca()
    loaded_key, loaded_cert = certs.load_ca(certs.cert_pem(cert), certs.key_pem(key))
    assert loaded_cert == cert and loaded_key.private_numbers() == key.private_numbers()
    with pytest.raises(ConfigError, match="the CA in x is not a PEM certificate"):
        certs.load_ca(b"junk", certs.key_pem(key), source="the CA in x")


def test_bad_requests_fail_with_a_clear_message():
    ca_key, ca_cert = certs.make_ca()
    with pytest.raises(InvalidInput, match="at least one DNS name or IP"):
        certs.make_leaf(ca_key, ca_cert, "server", server=True)
    with pytest.raises(InvalidInput, match="not an IP"):
        certs.make_leaf(ca_key, ca_cert, "server", server=True, ips=("300.1.1.1",))
    with pytest.raises(InvalidInput, match="at least 1 day"):
        certs.make_ca(days=0)


def test_a_node_certificate_serves_and_dials(tmp_path):
    """`xclp-server cert node`: a Dask scheduler or worker both listens and connects, and Dask's
    mutual TLS checks the peer's purpose either way: serverAuth and clientAuth, with its SANs."""
    from xclp.server.cli import main

    assert main(["ca", "init", "--dir", str(tmp_path / "ca")]) == 0
    assert main(["cert", "node", "--ca-dir", str(tmp_path / "ca"), "--out", str(tmp_path), "--name", "worker-1",
                 "--dns", "worker-1.internal"]) == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "worker-1.pem").read_bytes())
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["worker-1.internal"]
    assert (tmp_path / "worker-1-key.pem").stat().st_mode & 0o777 == 0o600
