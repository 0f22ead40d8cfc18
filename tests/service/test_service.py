"""The coordinator refuses what it must and keeps serving everyone else (docs/design.md §2, §3)."""

from __future__ import annotations

import hashlib
import threading
import time

import grpc
import numpy as np
import pytest

from tests.harness import (
    PARTIES,
    Recorder,
    allow_list,
    challenge,
    coordinator,
    job,
    key_bundle,
    party_data,
    run_parties,
)
from xclp import errors
from xclp.client.connection import ConnectionConfig
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import RunConfig
from xclp.client.session import PartySession
from xclp.crypto import identity, masking
from xclp.server import dev_ca
from xclp.server.config import TlsFiles
from xclp.v1 import status, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1 import xclp_pb2_grpc as pb_grpc
from xclp.v1.registry import parse_params
from xclp.v1.status import EXIT_REFUSED, exit_code

FLYNN = {"n_classes": 3, "m": 256, "s": 3, "rho": 8}


def join_request(stub, key, party, job_id="f", *, signer=None, summary=None, nonce=None) -> pb.JoinRequest:
    """A Join as a party makes it: over this run's nonce and spec from Challenge (or `nonce`)."""
    summary = summary or pb.DataSummary(rows=10, labeled_rows=5, dim=8)
    try:
        asked = challenge(stub, key, party, job_id)
        spec, nonce = asked.spec, asked.run_nonce if nonce is None else nonce
    except grpc.RpcError:
        spec, nonce = None, bytes(16)  # no such job, or not a party of it: the Join is refused anyway
    signs = summary if summary.labeled_rows <= summary.rows else pb.DataSummary(rows=summary.rows, dim=summary.dim)
    bundle = key_bundle(key, party, job_id, spec=spec, nonce=nonce, summary=signs)
    signed = identity.sign_bundle(signer or key, bundle) if signer is None else identity.SignedBundle(
        bundle.canonical_bytes(), signer.sign(bundle.canonical_bytes()))
    return pb.JoinRequest(job_id=job_id, bundle=pb.SignedBundle(bundle=signed.bundle, signature=signed.signature),
                          summary=summary)


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
    assert code_of(stub.Join, join_request(stub, keys["a"], "a", job_id="nope")) == grpc.StatusCode.INVALID_ARGUMENT
    # a stranger hears what a forger hears (tests/threat_model/test_probing.py)
    assert code_of(stub.Join, join_request(stub, keys["mallory"], "mallory")) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(stub.Join, join_request(stub, keys["d"], "d")) == grpc.StatusCode.PERMISSION_DENIED  # not in job f
    # Mallory claims to be "a": with her own key (not a's allow-listed key) or a forged signature.
    assert code_of(stub.Join, join_request(stub, keys["mallory"], "a")) == grpc.StatusCode.UNAUTHENTICATED
    forged = join_request(stub, keys["a"], "a", signer=keys["mallory"])
    assert code_of(stub.Join, forged) == grpc.StatusCode.UNAUTHENTICATED
    garbage = pb.JoinRequest(job_id="f", bundle=pb.SignedBundle(bundle=b"junk", signature=b"x"),
                             summary=pb.DataSummary(rows=1, dim=1))
    assert code_of(stub.Join, garbage) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(stub.Join, pb.JoinRequest(job_id="f")) == grpc.StatusCode.INVALID_ARGUMENT
    bad_summary = pb.DataSummary(rows=5, labeled_rows=9, dim=8)
    bad = join_request(stub, keys["a"], "a", summary=bad_summary)
    assert code_of(stub.Join, bad) == grpc.StatusCode.INVALID_ARGUMENT
    # a's bundle signed over another run's nonce (replayed from an earlier run): refused
    replayed = join_request(stub, keys["a"], "a", nonce=bytes(16))
    assert code_of(stub.Join, replayed) == grpc.StatusCode.FAILED_PRECONDITION
    stub.Join(join_request(stub, keys["a"], "a"))
    assert code_of(stub.Join, join_request(stub, keys["a"], "a")) == grpc.StatusCode.FAILED_PRECONDITION
    other_dim = pb.DataSummary(rows=5, labeled_rows=1, dim=9)
    assert code_of(stub.Join, join_request(stub, keys["b"], "b", summary=other_dim)) == grpc.StatusCode.INVALID_ARGUMENT
    assert set(coord.jobs["f"].parties) == {"a"}


def test_calls_without_a_valid_token_are_unauthenticated(keys, served):
    _, _, stub = served
    assert code_of(stub.Pull, pb.PullRequest(job_id="f")) == grpc.StatusCode.UNAUTHENTICATED
    bad = (("x-xclp-token-bin", b"\x00" * 32), ("x-xclp-job", "f"))
    assert code_of(stub.Pull, pb.PullRequest(job_id="f"), metadata=bad) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(stub.Push, iter([]), metadata=bad) == grpc.StatusCode.UNAUTHENTICATED
    # A token for job g is no good for job f.
    token = stub.Join(join_request(stub, keys["d"], "d", job_id="g")).session_token
    wrong_job = (("x-xclp-token-bin", token), ("x-xclp-job", "f"))
    assert code_of(stub.Pull, pb.PullRequest(job_id="f"), metadata=wrong_job) == grpc.StatusCode.UNAUTHENTICATED


def test_a_party_may_hold_only_a_few_push_streams_open(keys, served):
    """Attack (memory exhaustion): Push streams per token were unbounded."""
    _, _, stub = served
    token = stub.Join(join_request(stub, keys["d"], "d", job_id="g")).session_token
    md = (("x-xclp-token-bin", token), ("x-xclp-job", "g"))
    release = threading.Event()

    def held():  # a stream that sends nothing until the test lets it end
        release.wait(30)
        return
        yield

    calls = [stub.Push.future(held(), metadata=md) for _ in range(4)]
    try:
        deadline = time.monotonic() + 20
        while coord_pushes(served) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)  # wait for the four streams to be open on the server
        assert coord_pushes(served) == 4
        assert code_of(stub.Push, iter([]), metadata=md) == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        release.set()
        for call in calls:
            call.result(timeout=30)
    assert stub.Push(iter([]), metadata=md).frames == 0  # the streams closed: room again


def coord_pushes(served) -> int:
    coord, _, _ = served
    return coord.jobs["g"].parties["d"].mailbox.pushes


def test_tokens_expire_with_the_partys_place_in_the_job(keys):
    datas = {p: party_data(i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN)]) as (coord, addr):
        tokens = {}

        class Keeper(PartySession):
            def run(self):  # keep the token the party got at Join
                result = super().run()
                tokens[self.config.party_id] = self.conn._token
                return result

        results = run_parties(addr, "f", keys, datas, session=Keeper)
        assert all(not isinstance(r, BaseException) for r in results.values())
        with grpc.insecure_channel(addr) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            md = (("x-xclp-token-bin", tokens["a"]), ("x-xclp-job", "f"))
            assert code_of(stub.Pull, pb.PullRequest(job_id="f"), metadata=md) == grpc.StatusCode.UNAUTHENTICATED


def test_spoofed_sender_oversized_and_garbage_frames_are_refused(keys, served, monkeypatch):
    _, _, stub = served
    token = stub.Join(join_request(stub, keys["d"], "d", job_id="g")).session_token
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
    assert push(good) == grpc.StatusCode.INVALID_ARGUMENT  # job g is still admitting: no step runs
    # a step the job does not have: refused at its first frame, before anything is buffered
    (bogus,) = list(wire.encode(np.zeros(1_000_000, np.uint64), job_id="g", step="nope", round=0, sender="d",
                                recipient="", message_id=2))[:1]
    assert push(bogus) == grpc.StatusCode.INVALID_ARGUMENT
    stub.Join(join_request(stub, keys["a"], "a", job_id="g"))  # all of g's parties are in: the seed step runs
    corrupt = pb.Frame()
    corrupt.CopyFrom(good)
    corrupt.sha256 = hashlib.sha256(b"other").digest()
    assert push(corrupt) == grpc.StatusCode.INVALID_ARGUMENT
    (big,) = list(wire.encode(np.zeros(1_000_000, np.uint64), job_id="g", step="seed", round=0, sender="d",
                              recipient="", message_id=3))[:1]
    assert push(big) == grpc.StatusCode.RESOURCE_EXHAUSTED  # 8 MB declared for a 60-byte step: refused at once
    monkeypatch.setattr(wire, "CHUNK_BYTES", 64)  # (both ends here) so that a seed-sized message takes 2 frames
    half, _ = wire.encode(b"\x01" * 100, job_id="g", step="seed", round=0, sender="d", recipient="", message_id=4)
    assert push(half) == grpc.StatusCode.INVALID_ARGUMENT  # stream ended mid-message
    shape_bomb = pb.Frame()
    shape_bomb.CopyFrom(good)
    shape_bomb.dtype, shape_bomb.total_bytes = "<u8", 0
    del shape_bomb.shape[:]
    shape_bomb.shape.extend([0, 2**63])
    shape_bomb.sha256 = hashlib.sha256(b"").digest()
    assert push(shape_bomb) == grpc.StatusCode.INVALID_ARGUMENT  # used to be INTERNAL (ValueError)


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
    # all refused as bad input; the over-sized ones (a bigger shape, a wider dtype) before any byte is buffered
    assert len(Vandal.refusals) == 6 and all(issubclass(r, errors.InvalidInput) for r in Vandal.refusals)
    assert Vandal.refusals[:2] == [errors.ResourceExhausted] * 2
    for res in (results, other):
        agg = [r.aggregate for r in res.values()]
        assert all(np.array_equal(agg[0], a) for a in agg)
    assert coord.jobs["f"].stage.value == coord.jobs["f2"].stage.value == "done"


def joined_session(keys, party="a", job_id="f"):
    """A party session as it stands after Join: run nonce known, own bundle signed over it."""
    session = PartySession(RunConfig(job_id, party, keys[party], ConnectionConfig("x:1", insecure=True),
                                     peers=allow_list(keys), policy=PartyPolicy(min_parties=2)), party_data(0),
                           progress=lambda m: None)
    session.params = parse_params("flynn", FLYNN)
    session.run_nonce = RUN_NONCE
    session.signed = bundle_of(keys, party, job_id=job_id, x25519=masking.public_bytes(session.x25519))
    return session


RUN_NONCE = bytes(range(16))


def bundle_of(keys, party, *, signer=None, job_id="f", nonce=RUN_NONCE, x25519=None, spec=None):
    """`party`'s key bundle, signed by `signer`'s identity key (default its own) and naming that key,
    for the spec of job `job_id` (a FlyNN job of PARTIES unless `spec`) and data of 3 rows."""
    signer = signer or party
    spec = spec or job(job_id, "flynn", FLYNN).spec()
    b = key_bundle(keys[signer], party, job_id, spec=spec, nonce=nonce,
                   summary=pb.DataSummary(rows=3, labeled_rows=3, dim=8),
                   x25519=x25519 or masking.public_bytes(masking.generate_x25519()))
    return identity.sign_bundle(keys[signer], b)


def roster_of(*signed):
    return pb.Roster(bundles=[pb.SignedBundle(bundle=s.bundle, signature=s.signature) for s in signed])


def test_party_refuses_a_roster_with_its_own_entry_swapped(keys):
    session = joined_session(keys)
    # The coordinator substitutes an X25519 key it controls, re-signed by nobody legitimate.
    forged = identity.KeyBundle("a", "f", identity.public_bytes(keys["a"]),
                                masking.public_bytes(masking.generate_x25519()), RUN_NONCE)
    forged_signed = identity.SignedBundle(forged.canonical_bytes(), keys["mallory"].sign(forged.canonical_bytes()))
    with pytest.raises(errors.InvalidSignature):
        session.on_roster(roster_of(forged_signed, bundle_of(keys, "b")))


def test_party_refuses_a_roster_where_the_coordinator_swapped_a_peers_keys(keys):
    """Attack (issue: roster MITM, high): the coordinator replaces b's bundle with one it made for
    "b" under its own Ed25519 key (self-consistently signed), so that a would seal the common seed
    and its masks to the coordinator. The bundle verifies under the key it names; only the pinned
    allow-list tells it apart."""
    session = joined_session(keys)
    swapped = bundle_of(keys, "b", signer="mallory")
    with pytest.raises(errors.InvalidSignature,
                       match="party 'b' signed with an identity key other than its allowed one"):
        session.on_roster(roster_of(session.signed, swapped, bundle_of(keys, "c")))
    assert session.member is None  # a refused roster leaves no membership
    stranger = bundle_of(keys, "mallory")  # a party nobody pinned
    with pytest.raises(errors.InvalidSignature, match="'mallory', which is not in the pinned identities"):
        session.on_roster(roster_of(session.signed, bundle_of(keys, "b"), stranger))
    session.on_roster(roster_of(session.signed, bundle_of(keys, "b"), bundle_of(keys, "c")))  # the honest roster
    assert session.member is not None and set(session.member.pair_secrets) == {"b", "c"}


def test_party_refuses_a_roster_carrying_a_bundle_of_an_earlier_run(keys):
    """Attack (replayed bundles): b's correctly signed bundle from an earlier run of the same job."""
    session = joined_session(keys)
    old = bundle_of(keys, "b", nonce=bytes(16))
    with pytest.raises(errors.InvalidSignature, match="key bundles of another run for b"):
        session.on_roster(roster_of(session.signed, old, bundle_of(keys, "c")))


def test_coordinator_refuses_a_replayed_bundle_and_admits_the_real_party(keys):
    """A bundle of an earlier run (another nonce) used to be admitted, and the real party was then
    refused as "already joined"."""
    from xclp.server.run import Run

    job_ = Run(job("f", "flynn", FLYNN), allow_list(keys))
    summary = pb.DataSummary(rows=3, labeled_rows=3, dim=8)
    with pytest.raises(errors.ReplayRefused, match="another run's nonce"):
        job_.join(bundle_of(keys, "b", nonce=bytes(16)), summary)
    job_.join(bundle_of(keys, "b", nonce=job_.run_nonce), summary)
    assert set(job_.parties) == {"b"}


def test_a_hostile_coordinator_swapping_a_key_gets_no_seed(keys, monkeypatch):
    """End to end: a coordinator whose roster carries its own key for c. Every honest party refuses
    the roster (exit 4), so the leader never seals the common seed to the coordinator's key."""
    from dataclasses import replace

    from xclp.server.jobs.allreduce import AllReduceJob
    from xclp.v1 import registry

    class Swapping(AllReduceJob):
        def check_start(self, parties) -> None:  # just before the roster goes out
            fake = identity.KeyBundle("c", "f", identity.public_bytes(keys["mallory"]),
                                      masking.public_bytes(masking.generate_x25519()),
                                      parties["c"].bundle.nonce)
            parties["c"].signed = identity.sign_bundle(keys["mallory"], fake)

    rec = Recorder()
    datas = {p: party_data(i) for i, p in enumerate(("a", "b", "c"))}
    with registry.registered(replace(registry.get("flynn"), coordinator=Swapping), replacing=True), \
            coordinator(allow_list(keys), [job("f", "flynn", FLYNN, step_seconds=30)], observer=rec) as (coord, addr):
        results = run_parties(addr, "f", keys, datas)
    for p in ("a", "b", "c"):  # c too: its own entry was modified
        assert isinstance(results[p], errors.InvalidSignature), results[p]
        assert exit_code(results[p]) == EXIT_REFUSED
    assert "party 'c' signed with an identity key other than its allowed one" in str(results["a"])
    assert not [k for k in rec.seen if k[1] == "seed"]  # no acknowledgement: nobody got a seed
    assert coord.jobs["f"].step is None or coord.jobs["f"].step.bytes_relayed == 0


def test_mutual_tls_admits_only_clients_with_a_ca_signed_certificate(keys, tmp_path):
    dev_ca.init_ca(tmp_path)
    server = dev_ca.issue(tmp_path, tmp_path, "server", server=True, dns_names=("localhost",), ips=("127.0.0.1",))
    issued = {p: dev_ca.issue(tmp_path, tmp_path, p, server=False) for p in ("a", "b")}
    tls = TlsFiles(server.cert_path, server.key_path, tmp_path / dev_ca.CA_CERT)
    datas = {p: party_data(80 + i) for i, p in enumerate(("a", "b"))}
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN, parties=("a", "b"))], tls=tls) as (coord, addr):
        port = addr.rsplit(":", 1)[1]
        no_cert = ConnectionConfig(f"localhost:{port}", ca_cert=tmp_path / dev_ca.CA_CERT)
        refused = run_parties(addr, "f", keys, {"a": datas["a"]}, connection=no_cert, join_wait=0.5)
        assert isinstance(refused["a"], errors.PeerDropped) and not coord.jobs["f"].parties
        def mtls(cert_of: str) -> ConnectionConfig:
            return ConnectionConfig(f"localhost:{port}", ca_cert=tmp_path / dev_ca.CA_CERT,
                                    client_cert=issued[cert_of].cert_path, client_key=issued[cert_of].key_path)

        # b with a's certificate: the certificate's common name must be the party id
        wrong = run_parties(addr, "f", keys, {"b": datas["b"]}, connection={"b": mtls("a")})
        assert isinstance(wrong["b"], errors.NotAuthorized)
        assert "certificate is for 'a', not party 'b'" in str(wrong["b"])
        assert not coord.jobs["f"].parties
        results = run_parties(addr, "f", keys, datas, connection={p: mtls(p) for p in ("a", "b")})
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
