"""A crafted influence block routes one party's labels into a colluding party's scores (docs/design.md §2,
"what a crafted computation can still do"): what label-DP buys.

The attack: the coordinator, colluding with party c, sends a an influence block whose column i
(a's i-th labeled row) is 1 on c's unlabeled row i and 0 everywhere else, and b and c blocks of
zeros. Every value is a valid influence value and every shape is the true one, so no check of a's
stops it: c's scores on its row i are then exactly a's i-th label, one-hot, and c reads a's
labels. Only what a does to its own contribution bounds what c reads: randomised labels (c then
reads a label that is a's with probability e^ε/(e^ε + C − 1) and no more) or noise calibrated to
the block a received (here the block's columns have norm 1, so the noise is that of one label).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness import PARTIES, allow_list, coordinator, job, party_data, run_parties
from tests.threat_model.hostile import hostile
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.crypto.paillier import PaillierKeypair
from xclp.privacy import label_dp
from xclp.v1.xclp import INFLUENCE_MSG

C = 3
XCLP = {"n_classes": C, "k": 4, "lsh_bits": 64, "key_bits": 512, "insecure_test_keys": True}
SIZES = {"a": 90, "b": 20, "c": 90}  # a: 80 labeled rows; c: 80 unlabeled ones
READ = 80


def attack(keys, monkeypatch, params: dict) -> tuple[np.ndarray, np.ndarray, dict, dict]:
    """(c's scores on the rows the coordinator routed a's labels to, a's labels, a's result privacy,
    the coordinator's summary)."""
    datas = {p: party_data(300 + i, n=SIZES[p], n_classes=C, unlabeled=READ if p == "c" else 10)
             for i, p in enumerate(PARTIES)}
    c_start = SIZES["a"] + SIZES["b"]  # graph rows are in party order a, b, c
    sent = dict.fromkeys(PARTIES, 0)  # columns of each party's block crafted so far

    def craft(party: str, wire_name: str, payload):
        if wire_name != INFLUENCE_MSG:
            return None
        forged = np.zeros_like(payload)
        if party == "a":
            for j in range(payload.shape[1]):
                column = sent["a"] + j
                if column < READ:
                    forged[c_start + column, j] = 1.0  # a's labeled row `column` -> c's unlabeled row `column`
        sent[party] += payload.shape[1]
        return forged

    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with hostile(monkeypatch, rewrite=craft), \
            coordinator(allow_list(keys), [job("x", "xclp", {**XCLP, **params})]) as (coord, address):
        results = run_parties(address, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        summary = coord.jobs["x"].job.summary()
    for p in PARTIES:
        assert isinstance(results[p], JobResult), (p, results[p])
    c, a = results["c"], results["a"]
    assert isinstance(c, JobResult) and isinstance(a, JobResult)
    y_a = datas["a"].y
    return c.aggregate[:READ], y_a[y_a >= 0][:READ], a.privacy or {}, summary


def test_without_label_dp_the_colluding_party_reads_every_label(keys, monkeypatch) -> None:
    scores, labels, privacy, summary = attack(keys, monkeypatch, {})
    np.testing.assert_allclose(scores, np.eye(C)[labels], atol=1e-6)
    assert privacy == {} and "privacy" not in summary


def test_with_randomised_response_the_colluding_party_reads_no_more_than_the_mechanism_allows(
        keys, monkeypatch) -> None:
    """c still reads a's released labels exactly, one-hot, but each is a's with probability p:
    the agreement of 80 reads lies within 4 binomial standard deviations of p = 0.58 at ε = 1
    (1.0 without label-DP)."""
    scores, labels, privacy, summary = attack(keys, monkeypatch, {"label_dp_epsilon": 1.0})
    assert np.all(np.isclose(scores, 0, atol=1e-6) | np.isclose(scores, 1, atol=1e-6))
    assert np.allclose(scores.sum(axis=1), 1, atol=1e-6)  # one randomised label per read row
    agree = float((scores.argmax(axis=1) == labels).mean())
    p = label_dp.keep_probability(1.0, C)
    assert abs(agree - p) <= 4 * np.sqrt(p * (1 - p) / READ), (agree, p)
    assert privacy["mechanism"] == "response" and privacy["epsilon_spent"] == 1.0
    assert privacy["keep_probability"] == pytest.approx(p)
    assert summary["privacy"]["line"] == ("label-DP: ε = 1 per label of every party, each label randomised before "
                                          "use (δ = 0)")


def test_with_skellam_noise_the_colluding_party_reads_each_label_under_noise_of_the_planned_size(
        keys, monkeypatch) -> None:
    """a's block has columns of norm 1 on the rows it releases, so its plan's noise is that of one
    label at ε = 1, δ = 10⁻⁶ (σ ≈ 5.5 against a signal of 1); c's reads carry exactly that noise:
    the 240 cells' standard deviation is a's σ to within 20 %."""
    scores, labels, privacy, _ = attack(keys, monkeypatch, {"label_dp_epsilon": 1.0, "label_dp_mechanism": "skellam",
                                                         "label_dp_delta": 1e-6})
    error = scores - np.eye(C)[labels]
    sigma = privacy["noise_std"]
    assert privacy["mechanism"] == "skellam" and sigma > 3
    assert error.std() == pytest.approx(sigma, rel=0.2), (error.std(), sigma)
    assert abs(error.mean()) < 4 * sigma / np.sqrt(error.size)
