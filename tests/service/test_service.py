"""The coordinator refuses what it must and keeps serving everyone else (DESIGN §2, §3)."""

from __future__ import annotations

import hashlib
import secrets
import threading

import grpc
import numpy as np
import pytest

from xclp.client.connection import ConnectionConfig
from xclp.client.session import PartySession, RunConfig
from xclp.crypto import certs, identity, masking
from xclp.server.config import TlsFiles
from tests.service.conftest import PARTIES, allow_list, coordinator, job, party_data, run_parties
from xclp import errors
from xclp.v1 import status, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1 import xclp_pb2_grpc as pb_grpc
from xclp.v1.jobs import parse_params

FLYNN = {"n_classes": 3, "m": 256, "s": 3, "rho": 8}


def join_request(key, party, job_id="f", *, signer=None, summary=None) -> pb.JoinRequest:
    bundle = identity.KeyBundle(party, job_id, identity.public_bytes(key), secrets.token_bytes(32), secrets.token_bytes(16))
    signed = identity.sign_bundle(signer or key, bundle) if signer is None else identity.SignedBundle(
        bundle.canonical_bytes(), signer.sign(bundle.canonical_bytes()))
    return pb.JoinRequest(job_id=job_id, bundle=pb.SignedBundle(bundle=signed.bundle, signature=signed.signature),
                          summary=summary or pb.DataSummary(rows=10, labeled_rows=5, dim=8))


def code_of(call, *args, **kwargs) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        result = call(*args, **kwargs)
        if hasattr(result, "__iter__") and not isinstance(result, pb.PushAck):
            list(result)
    return info.value.code()


@pytest.fixture
def served(keys):
    jobs = [job("f", "flynn", FLYNN), job("g", "flynn", FLYNN, parties=("d", "a"))]
    with coordinator(allow_list(keys), jobs) as (coord, addr):
        channel = grpc.insecure_channel(addr)
        yield coord, addr, pb_grpc.CoordinatorStub(channel)
        channel.close()


def test_admission_refusals_carry_the_right_status(keys, served):
    coord, _, stub = served
    assert code_of(stub.Join, join_request(keys["a"], "a", job_id="nope")) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(stub.Join, join_request(keys["mallory"], "mallory")) == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(stub.Join, join_request(keys["d"], "d")) == grpc.StatusCode.PERMISSION_DENIED  # not in job f
    # Mallory claims to be "a": with her own key (not a's allow-listed key) or a forged signature.
    assert code_of(stub.Join, join_request(keys["mallory"], "a")) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(stub.Join, join_request(keys["a"], "a", signer=keys["mallory"])) == grpc.StatusCode.UNAUTHENTICATED
    garbage = pb.JoinRequest(job_id="f", bundle=pb.SignedBundle(bundle=b"junk", signature=b"x"),
                             summary=pb.DataSummary(rows=1, dim=1))
    assert code_of(stub.Join, garbage) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(stub.Join, pb.JoinRequest(job_id="f")) == grpc.StatusCode.INVALID_ARGUMENT
    bad_summary = pb.DataSummary(rows=5, labeled_rows=9, dim=8)
    assert code_of(stub.Join, join_request(keys["a"], "a", summary=bad_summary)) == grpc.StatusCode.INVALID_ARGUMENT
    stub.Join(join_request(keys["a"], "a"))
    assert code_of(stub.Join, join_request(keys["a"], "a")) == grpc.StatusCode.FAILED_PRECONDITION
    other_dim = pb.DataSummary(rows=5, labeled_rows=1, dim=9)
    assert code_of(stub.Join, join_request(keys["b"], "b", summary=other_dim)) == grpc.StatusCode.INVALID_ARGUMENT
    assert set(coord.jobs["f"].parties) == {"a"}


def test_calls_without_a_valid_token_are_unauthenticated(keys, served):
    _, _, stub = served
    assert code_of(stub.Pull, pb.PullRequest(job_id="f")) == grpc.StatusCode.UNAUTHENTICATED
    bad = (("x-xclp-token-bin", b"\x00" * 32), ("x-xclp-job", "f"))
    assert code_of(stub.Pull, pb.PullRequest(job_id="f"), metadata=bad) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(stub.Push, iter([]), metadata=bad) == grpc.StatusCode.UNAUTHENTICATED
    # A token for job g is no good for job f.
    token = stub.Join(join_request(keys["d"], "d", job_id="g")).session_token
    wrong_job = (("x-xclp-token-bin", token), ("x-xclp-job", "f"))
    assert code_of(stub.Pull, pb.PullRequest(job_id="f"), metadata=wrong_job) == grpc.StatusCode.UNAUTHENTICATED


def test_spoofed_sender_oversized_and_garbage_frames_are_refused(keys, served):
    _, _, stub = served
    token = stub.Join(join_request(keys["d"], "d", job_id="g")).session_token
    md = (("x-xclp-token-bin", token), ("x-xclp-job", "g"))

    def push(*frames):
        return code_of(stub.Push, iter(frames), metadata=md)

    (good,) = wire.encode(b"", job_id="g", step="seed", round=0, sender="d", recipient="", message_id=1)
    spoofed = pb.Frame()
    spoofed.CopyFrom(good)
    spoofed.sender = "a"
    assert push(spoofed) == grpc.StatusCode.PERMISSION_DENIED
    huge = pb.Frame(job_id="g", step="seed", sender="d", data=b"\x00" * (5 * 1024 * 1024))
    assert push(huge) == grpc.StatusCode.RESOURCE_EXHAUSTED  # over the explicit 4 MiB message limit
    corrupt = pb.Frame()
    corrupt.CopyFrom(good)
    corrupt.sha256 = hashlib.sha256(b"other").digest()
    assert push(corrupt) == grpc.StatusCode.INVALID_ARGUMENT
    assert push(good) == grpc.StatusCode.FAILED_PRECONDITION  # job g is still admitting: no step runs
    (half,) = list(wire.encode(np.zeros(1_000_000, np.uint64), job_id="g", step="seed", round=0, sender="d",
                               recipient="", message_id=2))[:1]
    assert push(half) == grpc.StatusCode.INVALID_ARGUMENT  # stream ended mid-message


class Vandal(PartySession):
    """Pushes every kind of bad sum message first, then behaves. Records the refusals."""

    refusals: list[type] = []

    def on_step(self, step):
        if step.step == "sum" and step.round == 0:
            d = self.data.X.shape[1]
            dtype, shape = self.params.wire(d)
            tries = [
                dict(payload=np.zeros((shape[0] + 1, shape[1]), dtype), round=0),  # wrong shape
                dict(payload=np.zeros(shape, np.uint64), round=0),  # wrong dtype
                dict(payload=b"opaque", round=0),  # not an array
                dict(payload=np.zeros(shape, dtype), round=5),  # future round
                dict(payload=np.zeros(shape, dtype), round=0, step="result"),  # step not running
                dict(payload=np.zeros(shape, dtype), round=0, recipient="a"),  # sum step relays nothing
            ]
            for t in tries:
                with pytest.raises(errors.XclpError) as info:
                    self.conn.push(t["payload"], sender=self.config.party_id, step=t.get("step", "sum"),
                                   round=t["round"], recipient=t.get("recipient", ""))
                type(self).refusals.append(type(info.value))
        super().on_step(step)


def test_garbage_from_one_party_is_refused_while_jobs_complete(keys):
    datas = {p: party_data(70 + i) for i, p in enumerate(PARTIES)}
    jobs = [job("f", "flynn", FLYNN), job("f2", "flynn", FLYNN)]
    with coordinator(allow_list(keys), jobs) as (coord, addr):
        other: dict = {}
        t = threading.Thread(target=lambda: other.update(run_parties(addr, "f2", keys, datas)))
        t.start()
        results = run_parties(addr, "f", keys, datas, sessions={"c": Vandal})
        t.join()
    assert Vandal.refusals == [errors.InvalidInput] * 6
    for res in (results, other):
        agg = [r.aggregate for r in res.values()]
        assert all(np.array_equal(agg[0], a) for a in agg)
    assert coord.jobs["f"].stage.value == coord.jobs["f2"].stage.value == "done"


def test_party_refuses_a_roster_with_its_own_entry_swapped(keys):
    params = parse_params("flynn", FLYNN)
    session = PartySession(RunConfig("f", "a", keys["a"], ConnectionConfig("x:1", insecure=True)), party_data(0),
                           progress=lambda m: None)
    session.params = params
    # The coordinator substitutes an X25519 key it controls, re-signed by nobody legitimate.
    forged = identity.KeyBundle("a", "f", identity.public_bytes(keys["a"]),
                                masking.public_bytes(masking.generate_x25519()), secrets.token_bytes(16))
    forged_signed = identity.SignedBundle(forged.canonical_bytes(), keys["mallory"].sign(forged.canonical_bytes()))
    other = identity.sign_bundle(keys["b"], identity.KeyBundle("b", "f", identity.public_bytes(keys["b"]),
                                                               bytes(range(1, 33)), bytes(16)))
    roster = pb.Roster(bundles=[pb.SignedBundle(bundle=forged_signed.bundle, signature=forged_signed.signature),
                                pb.SignedBundle(bundle=other.bundle, signature=other.signature)])
    with pytest.raises(errors.InvalidSignature):
        session.on_roster(roster)


def test_mutual_tls_admits_only_clients_with_a_ca_signed_certificate(keys, tmp_path):
    certs.init_ca(tmp_path)
    server = certs.issue(tmp_path, tmp_path, "server", server=True, dns_names=("localhost",), ips=("127.0.0.1",))
    party = certs.issue(tmp_path, tmp_path, "a", server=False)
    tls = TlsFiles(server.cert_path, server.key_path, tmp_path / certs.CA_CERT)
    datas = {p: party_data(80 + i) for i, p in enumerate(("a", "b"))}
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN, parties=("a", "b"))], tls=tls) as (coord, addr):
        port = addr.rsplit(":", 1)[1]
        no_cert = ConnectionConfig(f"localhost:{port}", ca_cert=tmp_path / certs.CA_CERT)
        refused = run_parties(addr, "f", keys, {"a": datas["a"]}, connection=no_cert, join_wait=0.5)
        assert isinstance(refused["a"], errors.PeerDropped) and not coord.jobs["f"].parties
        mtls = ConnectionConfig(f"localhost:{port}", ca_cert=tmp_path / certs.CA_CERT,
                                client_cert=party.cert_path, client_key=party.key_path)
        results = run_parties(addr, "f", keys, datas, connection=mtls)
    assert np.array_equal(results["a"].aggregate, results["b"].aggregate)


def test_error_mapping_is_total_and_specific():
    assert status.status_code(errors.NotAuthorized("x")) == grpc.StatusCode.PERMISSION_DENIED
    assert status.status_code(errors.InvalidSignature("x")) == grpc.StatusCode.UNAUTHENTICATED
    assert status.status_code(errors.ConfigError("x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert status.status_code(errors.DeadlineExceeded("x")) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert status.status_code(errors.PeerDropped("x")) == grpc.StatusCode.ABORTED
    assert status.status_code(errors.XclpError("x")) == grpc.StatusCode.INTERNAL
    assert status.exit_code(errors.NotAuthorized("x")) == status.EXIT_REFUSED
    assert status.exit_code(errors.ConfigError("x")) == status.EXIT_BAD_INPUT
    assert status.exit_code(errors.DeadlineExceeded("x")) == status.EXIT_DROPPED
    assert status.exit_code(RuntimeError("x")) == status.EXIT_UNEXPECTED
