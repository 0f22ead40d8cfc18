"""A run that sends sparse influence columns (docs/design.md §10.7) starts only among parties whose
version reads them: an older party would meet a piece it cannot read after all of SecureHamming's
Paillier work; the coordinator refuses the run as soon as the parties have joined instead, naming
them and the job parameter that runs without them."""

from __future__ import annotations

from tests.harness import PARTIES, allow_list, coordinator, job, party_data, run_parties
from xclp.client import before_join
from xclp.client.policy import PartyPolicy
from xclp.crypto.paillier import PaillierKeypair
from xclp.errors import InvalidInput

PARAMS = {"n_classes": 3, "lsh_bits": 64, "k": 5, "key_bits": 512, "insecure_test_keys": True,
          "influence_tolerance": 1e-3}


def test_a_party_that_cannot_read_sparse_influence_is_refused_before_any_work(keys, monkeypatch) -> None:
    monkeypatch.setattr(before_join, "SPARSE_INFLUENCE", "an-older-version")  # what such a party says at Join
    datas = {p: party_data(60 + i, n=40) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("x", "xclp", PARAMS)]) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        run = coord.jobs["x"]
    assert run.stage.value == "failed" and not run.ledger.as_dict()  # no step ran, not even the seed
    for p in PARTIES:
        assert isinstance(results[p], InvalidInput), results
        assert ("this run sends sparse influence columns (influence_tolerance = 0.001, 120 rows in all), which the "
                "version of a, b, c does not read") in str(results[p])
        assert "set influence_tolerance = 0 in the job file" in str(results[p])


def _run(keys, tolerance: float) -> dict:
    datas = {p: party_data(60 + i, n=40) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("x", "xclp", {**PARAMS, "influence_tolerance": tolerance})]) \
            as (_, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    return {p: (datas[p], r) for p, r in results.items()}


def test_an_exact_run_needs_no_such_version_and_reports_no_approximation(keys, monkeypatch) -> None:
    monkeypatch.setattr(before_join, "SPARSE_INFLUENCE", "an-older-version")
    assert {r.approximation for _, r in _run(keys, 0.0).values()} == {None}


def test_each_party_reports_what_the_push_left_out_of_its_own_columns(keys) -> None:
    for data, result in _run(keys, 1e-3).values():
        got = result.approximation
        assert got["influence_tolerance"] == 1e-3 and got["columns"] == int((data.y >= 0).sum())
        assert 0 < got["dropped_mean"] <= got["dropped_max"] < 1
