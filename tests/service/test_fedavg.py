"""Federated training jobs (docs/design.md §7): the secure service against the in-process simulation,
round by round; dropouts; what a hostile coordinator cannot make a party do."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from tests.harness import PARTIES, DiesAt, ManualClock, Recorder, allow_list, coordinator, job, run_parties
from tests.helpers import blobs
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.client.session import PartySession
from xclp.crypto.paillier import PaillierKeypair
from xclp.data.party_table import PartyData
from xclp.errors import ConfigError, InvalidInput
from xclp.fedavg import local_lp_pseudo_labels
from xclp.reference import xclp_reference
from xclp.simulation import run_fedavg
from xclp.simulation.fedavg import round_seed
from xclp.v1 import training
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.fedavg import FedavgJobParams

C, D = 3, 6
TEST_KEYS = PartyPolicy(min_parties=2, insecure_test_keys=True)


def params(pseudo_label: str, **extra) -> dict:
    return {"n_classes": C, "hidden": [8], "rounds": 3, "local_epochs": 2, "batch_size": 8, "learning_rate": 0.1,
            "momentum": 0.5, "pseudo_label": pseudo_label, "k": 5, "lsh_bits": 64, "key_bits": 512,
            "insecure_test_keys": True, **extra}


def secure_run(keys, job_id: str, p: dict, datas: dict[str, PartyData], **kw) -> dict[str, JobResult]:
    with coordinator(allow_list(keys), [job(job_id, "fedavg", p)]) as (_, address):
        results = run_parties(address, job_id, keys, datas, **kw)
    for party, result in results.items():
        assert isinstance(result, JobResult), f"{party}: {result!r}"
    return results  # type: ignore[return-value]


@pytest.fixture(scope="module")
def paillier() -> dict[str, PaillierKeypair]:
    return {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}


@pytest.mark.parametrize(("pseudo_label", "space"), [
    ("none", "embedding"), ("local_lp", "embedding"), ("network", "embedding"), ("xclp", "embedding"),
    ("local_lp", "input"), ("xclp", "input"),
], ids=["none", "local_lp", "network", "xclp", "local_lp-input", "xclp-input"])
def test_secure_run_equals_the_simulation_round_by_round(keys, paillier, pseudo_label: str, space: str) -> None:
    datas = {p: blobs(i) for i, p in enumerate(PARTIES)}
    p = params(pseudo_label, pseudo_label_space=space)
    progress: dict[str, list[str]] = {}
    results = secure_run(keys, f"fedavg-{pseudo_label}", p, datas, policy=TEST_KEYS,
                         paillier=paillier if pseudo_label == "xclp" else None, progress=progress)
    seed = results["a"].seed
    assert all(r.seed == seed for r in results.values())
    sim = run_fedavg({q: (d.X, d.y) for q, d in datas.items()}, FedavgJobParams.parse(p), seed=seed, xclp="secure")
    resolution = 3 * 2.0 ** -24  # each of 3 parties' update is rounded once to 2^-frac_bits
    for party, result in results.items():
        assert [r.round for r in result.rounds] == [0, 1, 2]
        for mine, theirs in zip(result.rounds, sim.rounds):
            # the θ the party received equals the simulation's θ before that round
            np.testing.assert_allclose(mine.model_in, theirs.model_in, rtol=0, atol=resolution * (1 + mine.round))
            expected = theirs.pseudo[party]
            if pseudo_label == "none":
                assert mine.pseudo is None and expected is None
            else:
                assert mine.pseudo is not None and expected is not None
                np.testing.assert_array_equal(mine.pseudo.labels, expected.labels)
                np.testing.assert_allclose(mine.pseudo.confidence, expected.confidence, atol=1e-6)
        np.testing.assert_allclose(result.aggregate, sim.model.flat, rtol=0, atol=4 * resolution)
        # what the party's user (and benchmarks/_fedavg_secure.py) reads of each round
        trained = [m for line in progress[party]
                   if (m := re.fullmatch(r"round (\d+): pseudo-labels in [\d.]+s, trained on (\d+) rows in [\d.]+s; "
                                         r"masked update sent \(\d+ bytes, 3 parties\)", line))]
        assert [(int(m[1]), int(m[2])) for m in trained] == [(r.round, r.rows) for r in result.rounds]
    assert not np.allclose(sim.rounds[0].model_in, sim.model.flat)  # training moved the model
    if (pseudo_label, space) == ("xclp", "input"):  # XCLP on the prepared rows, whatever the model
        order = sorted(PARTIES)
        for t, r in enumerate(results["a"].rounds):
            ref = xclp_reference([(datas[q].X, datas[q].y) for q in order], round_seed(seed, t), C, 64,
                                 FedavgJobParams.parse(p).graph_params)
            unlabeled = datas["a"].y < 0
            assert r.pseudo is not None
            np.testing.assert_array_equal(r.pseudo.labels, ref.labels[ref.party_rows(0)][unlabeled])
    if (pseudo_label, space) == ("local_lp", "input"):  # the prepared rows themselves, whatever the model
        for party in PARTIES:
            alone = local_lp_pseudo_labels(datas[party].X, datas[party].y, C, FedavgJobParams.parse(p).graph_params)
            for r in results[party].rounds:
                assert r.pseudo is not None
                np.testing.assert_array_equal(r.pseudo.labels, alone.labels)
    if pseudo_label == "xclp":  # docs/design.md §7: the secure pseudo-labels are the plaintext XCLP reference's
        ref = run_fedavg({q: (d.X, d.y) for q, d in datas.items()}, FedavgJobParams.parse(p), seed=seed)
        for mine, theirs in zip(sim.rounds, ref.rounds):
            for party in PARTIES:
                np.testing.assert_array_equal(mine.pseudo[party].labels, theirs.pseudo[party].labels)
                np.testing.assert_allclose(mine.pseudo[party].confidence, theirs.pseudo[party].confidence, atol=1e-6)


def test_each_round_runs_on_the_sample_the_parties_drew_from_their_common_seed(keys) -> None:
    parties = ("a", "b", "c", "d")
    datas = {p: blobs(i) for i, p in enumerate(parties)}
    rounds = 8  # 3 of 4 each round: all alike with probability 4/4^8 (with 4 rounds, 1/64: one CI run failed so)
    p = params("none", fraction=0.75, rounds=rounds)
    with coordinator(allow_list(keys), [job("sampled", "fedavg", p, parties=parties)]) as (_, address):
        results = run_parties(address, "sampled", keys, datas)
    seed = results["a"].seed  # type: ignore[union-attr]
    drawn = training.samples_from_payload(training.samples_payload(seed, rounds, parties, 0.75), rounds, parties)
    expected = dict(enumerate(drawn))
    assert all(len(s) == 3 for s in expected.values()) and len(set(expected.values())) > 1
    for party, result in results.items():
        assert isinstance(result, JobResult), result
        assert [r.round for r in result.rounds] == [t for t in range(rounds) if party in expected[t]]
    finals = [r.aggregate for r in results.values()]  # type: ignore[union-attr]
    assert all(np.array_equal(finals[0], f) for f in finals)


def test_a_reveal_that_cannot_complete_skips_the_round_and_those_who_revealed_sum_no_more_over_its_model(
        keys) -> None:
    """c is lost while revealing, and the job's share_threshold = 3 of 3 lets nobody rebuild its seed:
    round 0's sum cannot be opened and θ₀ stays. Round 1 releases θ₀ again among a and b; to a and
    b, who revealed for θ₀ among a, b, c, that looks exactly like a coordinator that opened round 0
    and now wants c's update as the difference: they stop."""
    class Dies(DiesAt):
        at = "r0.update_reveal"

    datas = {p: blobs(50 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("reveal", "fedavg", params("none", share_threshold=3))]) as (coord,
                                                                                                        address):
        results = run_parties(address, "reveal", keys, datas, sessions={"c": Dies})
        state = coord.jobs["reveal"]
    assert state.job.skipped[0] == 0 and state.job.history == [] and state.ledger.recovered == []
    refused = [p for p in "ab" if "releases the model of round 0" in str(results[p])]
    # the other refused too, or (a race) its round-0 reveal was still on the way when the job ended
    assert refused and all(p in refused or "the job is over for this party" in str(results[p]) for p in "ab"), results


class SlowInRound0(PartySession):
    """Misses the deadline of round 0's XCLP (it waits until the test has moved the clock on)."""

    released = threading.Event()

    def on_step(self, step: pb.StepStart) -> None:
        if step.step == "r0.intra_hamming":
            SlowInRound0.released.wait(60)
        super().on_step(step)


def test_a_party_late_in_a_round_misses_only_that_round_and_is_sampled_again(keys, paillier) -> None:
    datas = {p: blobs(60 + i) for i, p in enumerate(PARTIES)}
    rec, clock = Recorder(), ManualClock()
    SlowInRound0.released.clear()
    with coordinator(allow_list(keys), [job("late", "fedavg", params("xclp"))], observer=rec,
                     clock=clock) as (coord, address):
        def late() -> None:  # once a and b are in, the deadline passes; c goes on once it is left out
            rec.wait_for(("late", "r0.intra_hamming", 0, "a"), ("late", "r0.intra_hamming", 0, "b"))
            clock.advance(31)
            run = coord.jobs["late"]
            with run.lock:
                run.changed.wait_for(lambda: "c" not in run.job.members, timeout=60)
            SlowInRound0.released.set()

        threading.Thread(target=late, daemon=True).start()
        results = run_parties(address, "late", keys, datas, sessions={"c": SlowInRound0}, policy=TEST_KEYS,
                              paillier=paillier)
        state = coord.jobs["late"]
    assert all(isinstance(r, JobResult) for r in results.values()), results
    assert [h["parties"] for h in state.job.history] == [["a", "b"], ["a", "b", "c"], ["a", "b", "c"]]
    assert [r.round for r in results["c"].rounds] == [1, 2]
    assert state.dropped == set()


def test_a_job_whose_sample_is_below_min_parties_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match="fewer than min_parties"):
        job("small", "fedavg", params("none", fraction=0.3), min_parties=2)


def test_a_party_with_a_paillier_key_of_another_size_is_refused_at_join(keys, paillier) -> None:
    other = {**paillier, "c": PaillierKeypair.generate(768, allow_insecure_test_size=True)}
    datas = {p: blobs(80 + i) for i, p in enumerate(PARTIES)}
    config = job("keys", "fedavg", params("xclp", rounds=1), join_seconds=3.0)
    with coordinator(allow_list(keys), [config]) as (_, address):
        results = run_parties(address, "keys", keys, datas, policy=TEST_KEYS, paillier=other)
    assert isinstance(results["c"], InvalidInput)
    assert "pseudo-labels with XCLP" in str(results["c"]) and "768-bit key" in str(results["c"])
    assert isinstance(results["a"], JobResult) and results["a"].participants == ("a", "b")
