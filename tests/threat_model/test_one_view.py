"""One view for every party (docs/design.md §2.5): a coordinator that shows parties different job specs.

Each attack is the real coordinator with the spec it shows some parties rewritten
(tests/threat_model/hostile.py), run against real parties. Before the spec was signed in every
key bundle, each of these jobs finished normally, and the attacker had what it wanted (one
party's FlyNN counts in class slots of their own, a DP party adding the noise share of a larger
set, the others' FedAvg updates scaled to nothing, so the sum is one party's update). Now every
party refuses the roster, before the common seed, so nothing is masked, let alone opened.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import grpc
import numpy as np
import pytest

from tests.harness import PARTIES, Recorder, allow_list, challenge, coordinator, job, party_data, run_parties
from tests.helpers import save_identity, write_table
from tests.threat_model.hostile import hostile, with_params, with_spec
from xclp.client.agent import Agent, AgentConfig
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.crypto import identity
from xclp.errors import InvalidSignature, ProtocolError
from xclp.v1 import calls
from xclp.v1 import xclp_pb2 as pb
from xclp.v1 import xclp_pb2_grpc as pb_grpc
from xclp.v1.status import EXIT_REFUSED, exit_code

FLYNN = {"n_classes": 3, "m": 64, "s": 3, "rho": 8, "classes": ["x", "y", "z"]}
RACE_DP = {"rows": 8, "width": 64, "n_classes": 3, "epsilon": 1.0}
FEDAVG = {"n_classes": 3, "hidden": [4], "rounds": 2, "local_epochs": 1, "batch_size": 8}

ATTACKS = {
    # a's labels number the classes in another order: its counts land in slots of their own
    "flynn-classes-order": ("flynn", FLYNN, {"a": with_params(classes=["z", "y", "x"])}),
    # a is told a fourth party takes part: it adds the noise share of four, the sum carries less noise
    "race-dp-noise-share": ("race", RACE_DP, {"a": with_spec(expected_parties=["a", "b", "c", "d"])}),
    # b and c train with a learning rate of 1e-30: the sum of updates is a's update
    "fedavg-learning-rate": ("fedavg", FEDAVG, {p: with_params(learning_rate=1e-30) for p in ("b", "c")}),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_parties_shown_different_specs_refuse_the_roster(keys, monkeypatch, attack: str) -> None:
    job_type, params, views = ATTACKS[attack]
    rec = Recorder()
    datas = {p: party_data(30 + i) for i, p in enumerate(PARTIES)}
    with hostile(monkeypatch, spec_views=views), \
            coordinator(allow_list(keys), [job("t", job_type, params)], observer=rec) as (_, address):
        results = run_parties(address, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    for p in PARTIES:
        assert isinstance(results[p], InvalidSignature), (p, type(results[p]).__name__)
        assert "the coordinator showed the parties different job specs" in str(results[p])
        assert exit_code(results[p]) == EXIT_REFUSED
    told = set(views)
    assert all(set(str(results[p]).split(": ")[1].split(" signed")[0].split(", ")) == told
               for p in PARTIES if p not in told)  # an honest party names the parties told otherwise
    assert rec.seen == {}  # nothing reached the coordinator: no seed, no masked vector


def test_an_agent_runs_only_the_spec_its_policy_accepted(keys, monkeypatch, tmp_path) -> None:
    """Attack: the agent's policy takes FlyNN only; the coordinator offers a FlyNN run, then the
    Challenge of that run says FedAvg. The agent checked the Offer; its session ran whatever the
    Challenge said. Now the session refuses a Challenge whose spec is not the accepted Offer's."""
    save_identity(keys["a"], tmp_path / "a.key")
    allow = "".join(f'{p} = "{identity.public_key_text(keys[p])}"\n' for p in (*PARTIES, "d"))
    (tmp_path / "allow.toml").write_text(f"[parties]\n{allow}")
    data = party_data(1)
    write_table(tmp_path / "a.csv", data.X, data.y, data.ids)
    real = replace(job("t", "fedavg", FEDAVG, join_seconds=5), datasets=dict.fromkeys(PARTIES, "demo"))
    offered = with_spec(job_type="flynn", params_json='{"n_classes": 3, "m": 64, "s": 3, "rho": 8}')
    said: list[str] = []
    with hostile(monkeypatch, offer_views={"a": offered}), coordinator(allow_list(keys), [real]) as (coord, address):
        (tmp_path / "agent.toml").write_text(
            f'party = "a"\nidentity = "a.key"\npeers = "allow.toml"\ncoordinator = "{address}"\ninsecure = true\n'
            'out = "out"\npoll_seconds = 0.05\n[policy]\njob_types = ["flynn"]\nmin_parties = 2\n'
            '[datasets.demo]\npath = "a.csv"\nid_column = "row_id"\n')
        agent = Agent(AgentConfig.load(tmp_path / "agent.toml"), say=said.append)
        done = threading.Thread(target=agent.serve, args=(threading.Event(),), kwargs={"runs": 1})
        done.start()
        done.join(60)
        assert not done.is_alive()
        assert "a" not in coord.jobs["t"].parties  # it never joined
    assert agent.finished == {("t", "1"): False}
    failed = [m for m in said if m.startswith("run 1 of job t failed")]
    assert failed and "names another job spec than the offer this party's policy accepted" in failed[0], said


def test_only_an_expected_party_reads_a_runs_spec_and_only_its_own_data_set(keys) -> None:
    """Challenge used to answer anyone who reached the port with the run's parameters, its
    expected parties and every party's data set name."""
    real = replace(job("t", "flynn", FLYNN), datasets={"a": "icu-2024", "b": "ward-b", "c": "c"})
    with coordinator(allow_list(keys), [real]) as (_, address), grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        with pytest.raises(grpc.RpcError) as unsigned:
            stub.Challenge(pb.SignedCall(signer="a", call=b"", signature=b""), timeout=10)
        assert unsigned.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for stranger, code in (("mallory", grpc.StatusCode.UNAUTHENTICATED),  # not on the allow-list
                               ("d", grpc.StatusCode.PERMISSION_DENIED)):  # allow-listed, but not in this job
            with pytest.raises(grpc.RpcError) as refused:
                challenge(stub, keys[stranger], stranger, "t")
            assert refused.value.code() == code
        with pytest.raises(grpc.RpcError) as posing:  # b's name, a's key
            stub.Challenge(calls.sign_call(keys["a"], "b", calls.CHALLENGE, pb.ChallengeRequest(job_id="t")))
        assert posing.value.code() == grpc.StatusCode.UNAUTHENTICATED
        spec = challenge(stub, keys["b"], "b", "t").spec
        assert dict(spec.datasets) == {"b": "ward-b"} and spec.job_type == "flynn"


XCLP = {"n_classes": 3, "k": 4, "lsh_bits": 64, "key_bits": 512, "insecure_test_keys": True}


def test_an_xclp_party_refuses_a_layout_with_rows_that_belong_to_nobody(keys, monkeypatch) -> None:
    """Attack (the "gap rows" of the one-view issue): a hears that b has 5 rows more than b has,
    while b and c hear the truth. The 5 rows after b's belong to nobody in a's view; a masks them
    and so does everybody, their masks cancel, and an influence block of the coordinator's making
    on those rows reads a's labels. a now checks the layout against the row counts every party
    signed in its key bundle, and refuses before it sends anything of the job."""
    from xclp.crypto.paillier import PaillierKeypair
    from xclp.v1.xclp import LAYOUT_MSG

    datas = {p: party_data(50 + i, n=20 + i) for i, p in enumerate(PARTIES)}

    def lie(party: str, wire_name: str, payload):
        if party == "a" and wire_name == LAYOUT_MSG:
            return payload + np.array([0, 5, 0], dtype=np.uint64)  # roster order a, b, c

    rec = Recorder()
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with hostile(monkeypatch, rewrite=lie), \
            coordinator(allow_list(keys), [job("x", "xclp", XCLP)], observer=rec) as (_, address):
        results = run_parties(address, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
    assert isinstance(results["a"], ProtocolError), results["a"]
    assert "gives 'b' 26 rows, but 'b' signed 21 in its key bundle" in str(results["a"])
    assert not [k for k in rec.seen if k[3] == "a" and k[1] != "seed"]  # nothing of the job from a


FORGED_VIEWS = {
    # a standardises with other pooled moments than b and c (a shifted Σx: another pooled mean)
    "flynn-moments": ("flynn", {**FLYNN, "standardise": True}, "sum",
                      lambda party, name, payload: shifted_sum(payload) if party == "a" and name == "moments_result"
                      else None),
}


def shifted_sum(moments: np.ndarray) -> np.ndarray:
    forged = moments.copy()
    forged[1, :, 4] += np.uint64(1)  # Σx + 1 (the first integer digit): the pooled means move
    return forged


@pytest.mark.parametrize("attack", sorted(FORGED_VIEWS))
def test_a_sum_over_different_views_is_never_opened(keys, monkeypatch, attack: str) -> None:
    """Attack (docs/design.md §2.5): one party is sent another public value than the others (a model, the
    pooled moments). Every party signs the hash of what it accepted before it reveals; the
    coordinator must relay all signatures, and they differ, so nobody reveals its self mask."""
    job_type, params, step, forge = FORGED_VIEWS[attack]
    rec = Recorder()
    datas = {p: party_data(60 + i) for i, p in enumerate(PARTIES)}
    with hostile(monkeypatch, rewrite=forge), \
            coordinator(allow_list(keys), [job("t", job_type, params)], observer=rec) as (_, address):
        results = run_parties(address, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    for p in PARTIES:
        assert isinstance(results[p], ProtocolError), (p, type(results[p]).__name__)
        assert f"the coordinator showed the parties different views before {step} attempt 0" in str(results[p])
    assert {k[3] for k in rec.seen if k[1] == step + "_confirm"} == set(PARTIES)  # the check ran
    assert not [k for k in rec.seen if k[1] == step + "_reveal"]  # and nothing was revealed


def test_a_party_shown_another_model_refuses_it_before_training(keys, monkeypatch) -> None:
    """Attack (docs/design.md §2.5): c is sent another θ in round 0 than a and b (e.g. one that isolates its
    update in the sum). It used to train on it, and the sum's confirmations caught the different
    views; now c refuses the model itself: θ₀ is the head of its model chain, computed from the
    job's parameters (xclp.v1.training), and c sends nothing of the round."""
    rec = Recorder()
    datas = {p: party_data(60 + i) for i, p in enumerate(PARTIES)}
    forge = lambda party, name, payload: payload * 0.5 if party == "c" and name == "r0.model" else None  # noqa: E731
    with hostile(monkeypatch, rewrite=forge), \
            coordinator(allow_list(keys), [job("t", "fedavg", FEDAVG)], observer=rec) as (_, address):
        results = run_parties(address, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    assert isinstance(results["c"], ProtocolError), results["c"]
    assert "the model of round 0 is not the head of the model chain (θ₀ as this party computes it" \
        in str(results["c"])
    assert not [k for k in rec.seen if k[3] == "c" and k[1].startswith("r0.")]


def test_a_party_buffers_no_more_of_a_message_than_its_step_can_need(keys, monkeypatch) -> None:
    """Attack (memory): the coordinator declares a FlyNN result 64 times the aggregate's size; the
    party refuses it at the first frame, before buffering any of it (it used to take up to 512 MiB
    per message and check the shape after)."""
    from xclp.errors import ResourceExhausted

    def bloat(party: str, wire_name: str, payload):
        if party == "a" and wire_name == "result":
            return np.tile(payload, 64)
        return None

    datas = {p: party_data(130 + i) for i, p in enumerate(PARTIES)}
    with hostile(monkeypatch, rewrite=bloat), coordinator(allow_list(keys), [job("t", "flynn", FLYNN)]) as (_, addr):
        results = run_parties(addr, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    assert isinstance(results["a"], ResourceExhausted), results["a"]
    assert "a 'result' message of" in str(results["a"]) and "exceeds the" in str(results["a"])
    assert all(isinstance(results[p], JobResult) for p in "bc")


def test_a_party_refuses_a_message_of_a_step_its_job_never_gets_at_the_first_frame(keys) -> None:
    from xclp.client.connection import ConnectionConfig
    from xclp.client.run_config import RunConfig
    from xclp.client.session import PartySession
    from xclp.v1 import wire

    session = PartySession(RunConfig("t", "a", keys["a"], ConnectionConfig("x:1", insecure=True),
                                     peers=allow_list(keys)), party_data(0), progress=lambda m: None)
    (frame,) = wire.encode(np.zeros(4, np.uint64), job_id="t", step="nope", round=0, sender="", recipient="a",
                           message_id=1)
    with pytest.raises(ProtocolError, match="sent a 'nope' message before the common seed"):
        session.handle(pb.PullItem(frame=frame))


def test_an_xclp_party_bounds_an_influence_block_by_the_graph_and_its_own_rows(keys, monkeypatch) -> None:
    """Attack (memory): a's influence block declared 50 times as wide as its labeled rows; the
    bound is the graph's rows by a's rows, checked at the first frame."""
    from xclp.crypto.paillier import PaillierKeypair
    from xclp.errors import ResourceExhausted
    from xclp.v1.xclp import INFLUENCE_MSG

    def widen(party: str, wire_name: str, payload):
        if party == "a" and wire_name == INFLUENCE_MSG:
            return np.tile(payload, (1, 50))
        return None

    datas = {p: party_data(140 + i, n=20 + i) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with hostile(monkeypatch, rewrite=widen), coordinator(allow_list(keys), [job("x", "xclp", XCLP)]) as (_, address):
        results = run_parties(address, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
    assert isinstance(results["a"], ResourceExhausted), results["a"]
    assert "a 'influence' message of" in str(results["a"]) and "exceeds the" in str(results["a"])
