"""XCLP is quadratic: sizes are checked before any work, by the party and by the coordinator,
and every refusal gives the estimate and what to change (issue: 390 000 rows ended in a 283 GiB
allocation and exit 1)."""

from __future__ import annotations

from tests.harness import PARTIES, allow_list, coordinator, job, party_data, run_parties
from xclp.client.policy import PartyPolicy
from xclp.crypto.paillier import PaillierKeypair
from xclp.errors import ResourceExhausted
from xclp.server.config import JobConfig
from xclp.v1.registry import parse_params

XCLP = {"n_classes": 3, "lsh_bits": 128, "k": 3, "key_bits": 512, "insecure_test_keys": True}


def test_a_party_over_its_memory_limit_refuses_before_joining(keys):
    datas = {p: party_data(i) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("x", "xclp", XCLP, join_seconds=3)]) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier, overrides={"b": {"max_memory_bytes": 1000}},
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        assert "b" not in coord.jobs["x"].parties
    assert isinstance(results["b"], ResourceExhausted) and "--max-memory-gb" in str(results["b"])
    assert all(not isinstance(results[p], BaseException) for p in ("a", "c")), results


def test_a_party_refuses_when_the_layout_makes_its_paillier_work_too_long(keys):
    datas = {p: party_data(i) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("x", "xclp", XCLP)]) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier,
                              overrides={"c": {"max_paillier_seconds": 1e-9}},
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        run = coord.jobs["x"]
        assert run.job.xclp is None or run.job.xclp.W is None or "c" not in run.active
    assert isinstance(results["c"], ResourceExhausted)
    assert "--max-paillier-hours" in str(results["c"]) and "120 rows of 2 peers" in str(results["c"])


def test_the_coordinator_refuses_at_join_the_party_that_would_pass_its_row_cap(keys):
    datas = {p: party_data(i) for i, p in enumerate(PARTIES)}  # 60 rows each
    config = JobConfig("f", "flynn", parse_params("flynn", {"n_classes": 3, "m": 256, "s": 2, "rho": 8}), PARTIES, 2,
                       join_seconds=5, max_total_rows=150)
    with coordinator(allow_list(keys), [config]) as (coord, addr):
        results = run_parties(addr, "f", keys, datas)
    refused = [p for p, r in results.items() if isinstance(r, BaseException)]
    assert len(refused) == 1, results
    refusal = str(results[refused[0]])
    assert "at most 150 rows in all (max_total_rows); 120 have joined and this party brings 60" in refusal
    assert JobConfig("x", "xclp", parse_params("xclp", XCLP), PARTIES, 2).max_total_rows == 300_000


def test_the_coordinator_refuses_before_any_work_an_xclp_run_its_memory_cannot_hold(keys, monkeypatch):
    """DESIGN §10.5: the coordinator estimates its own peak (server.steps.xclp.coordinator_bytes)
    from the joined rows and refuses the run, with the estimate and what to change, before the seed."""
    import xclp.server.jobs.xclp as coordinator_xclp

    monkeypatch.setattr(coordinator_xclp, "coordinator_memory_limit", lambda: 2**20)
    datas = {p: party_data(i) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("x", "xclp", XCLP, join_seconds=5)]) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        run = coord.jobs["x"]
        assert run.stage.value == "failed" and run.job.xclp is None  # refused: no phase ever started
    for p in PARTIES:
        assert isinstance(results[p], BaseException), results
        message = str(results[p])
        assert "would need about" in message and "on the coordinator (180 rows of 3 parties, k = 3)" in message
        assert "above its limit of 0.0 GiB" in message and "max_rows_per_party" in message
