"""Federated training jobs (DESIGN §7): the secure service against the in-process simulation,
round by round; dropouts; what a hostile coordinator cannot make a party do."""

from __future__ import annotations

import numpy as np
import pytest

from tests.service.conftest import PARTIES, allow_list, coordinator, job, run_parties
from xclp.client.policy import PartyPolicy
from xclp.client.session import JobResult
from xclp.crypto.paillier import PaillierKeypair
from xclp.fedavg import sample_parties
from xclp.party_table import PartyData
from xclp.simulation import run_fedavg
from xclp.v1.jobs import FedavgJobParams

C, D = 3, 6
TEST_KEYS = PartyPolicy(min_parties=2, insecure_test_keys=True)


def blobs(seed: int, n: int = 40, labeled: int = 8) -> PartyData:
    """Three Gaussian classes in D dimensions, the first `labeled` rows labeled."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    centres = np.random.default_rng(99).normal(0, 3, size=(C, D))
    X = centres[y] + rng.normal(size=(n, D))
    y_partial = np.where(np.arange(n) < labeled, y, -1)
    return PartyData(X, y_partial, tuple(f"r{seed}-{i}" for i in range(n)))


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


@pytest.mark.parametrize("pseudo_label", ["none", "local_lp", "network", "xclp"])
def test_secure_run_equals_the_simulation_round_by_round(keys, paillier, pseudo_label: str) -> None:
    datas = {p: blobs(i) for i, p in enumerate(PARTIES)}
    p = params(pseudo_label)
    results = secure_run(keys, f"fedavg-{pseudo_label}", p, datas, policy=TEST_KEYS,
                         paillier=paillier if pseudo_label == "xclp" else None)
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
    assert not np.allclose(sim.rounds[0].model_in, sim.model.flat)  # training moved the model


def test_sampling_is_public_and_dropped_parties_leave_the_sample(keys) -> None:
    parties = ("a", "b", "c", "d")
    datas = {p: blobs(i) for i, p in enumerate(parties)}
    p = params("none", fraction=0.75, rounds=4)
    with coordinator(allow_list(keys), [job("sampled", "fedavg", p, parties=parties)]) as (_, address):
        results = run_parties(address, "sampled", keys, datas)
    expected = {t: sample_parties(0, t, parties, 0.75) for t in range(4)}
    assert all(len(s) == 3 for s in expected.values()) and len(set(expected.values())) > 1
    for party, result in results.items():
        assert isinstance(result, JobResult), result
        assert [r.round for r in result.rounds] == [t for t in range(4) if party in expected[t]]
    finals = [r.aggregate for r in results.values()]  # type: ignore[union-attr]
    assert all(np.array_equal(finals[0], f) for f in finals)
