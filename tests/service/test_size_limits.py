"""XCLP is quadratic: sizes are checked before any work, by the party and by the coordinator,
and every refusal gives the estimate and what to change (issue: 390 000 rows ended in a 283 GiB
allocation and exit 1)."""

from __future__ import annotations

from dataclasses import replace

from tests.harness import PARTIES, allow_list, coordinator, job, party_data, run_parties
from xclp.client.jobs.estimate import OperationCosts, paillier_seconds
from xclp.client.policy import PartyPolicy
from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.secure_hamming import SlotLayout
from xclp.errors import ProtocolError, ResourceExhausted
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


COSTS = OperationCosts(encrypt=1e-3, multiply=2e-6, decrypt=5e-3)  # seconds per operation, fixed


def fixed_costs(monkeypatch) -> None:
    """The estimates from fixed operation costs, so that a test can place a limit between two."""
    monkeypatch.setattr(OperationCosts, "measure", classmethod(lambda cls, keypair: COSTS))


def test_a_party_whose_estimate_passes_its_limit_declines_before_joining_with_both_numbers(keys, monkeypatch):
    """Parties estimated 55-63 min of Paillier work and joined a job that could not give
    them that, without a word. A party now compares before Join (its peers' rows unknown yet, each
    taken to hold as many as its own) and declines; the operator hears why in words."""
    fixed_costs(monkeypatch)
    datas = {p: party_data(i) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("x", "xclp", XCLP, join_seconds=60)]) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier,
                              overrides={"c": {"max_work_seconds": 0.1}},
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        run = coord.jobs["x"]
        assert "c" not in run.parties and run.lobby.declined == {
            "c": "declined: the job needs more time or memory than it allows"}
    assert all(not isinstance(results[p], BaseException) for p in "ab"), results
    message = str(results["c"])
    assert isinstance(results["c"], ResourceExhausted), results["c"]
    seconds = paillier_seconds(COSTS, SlotLayout(512, 128), 60, {"b": 60, "a": 60}, 1)
    assert ("60 rows against 120 rows of 2 peers (before joining: each peer taken to hold 60 rows like this party"
            in message)
    assert f"estimated at {seconds:.2g} s on 1 workers" in message
    assert "above this party's limit of 0.1 s (--max-work-minutes)" in message


def test_a_job_whose_max_run_seconds_is_shorter_than_the_work_is_refused_before_join(keys, monkeypatch):
    fixed_costs(monkeypatch)
    datas = {p: party_data(i) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    config = replace(job("x", "xclp", XCLP, join_seconds=60), max_run_seconds=0.5)
    with coordinator(allow_list(keys), [config]) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        run = coord.jobs["x"]
        # two declines leave the run short of min_parties: it fails at once (the third may come too late)
        assert not run.parties and len(run.lobby.declined) >= 2 and run.stage.value == "failed"
    refused = [p for p in PARTIES if isinstance(results[p], ResourceExhausted)]
    assert len(refused) >= 2, results
    for p in refused:
        assert ("above the job's max_run_seconds = 0.5, after which the coordinator would fail the run"
                in str(results[p]))
    for p in set(PARTIES) - set(refused):  # a third that asked after the run failed hears that (a full run
        # on a loaded machine failed once this way, when the test asked all three to refuse)
        assert isinstance(results[p], ProtocolError) and "has no run open for joining" in str(results[p]) \
            and "at most 1 of the 2 required parties can join" in str(results[p]), results


def test_a_party_refuses_when_the_layout_makes_its_paillier_work_too_long(keys, monkeypatch):
    """c's 20 rows against its peers' 200 each: before Join it takes them to hold 20 each and
    joins; the layout tells it better and it leaves before any Paillier work."""
    fixed_costs(monkeypatch)
    datas = {"a": party_data(0, n=200), "b": party_data(1, n=200), "c": party_data(2, n=20)}
    layout = SlotLayout(512, 128)
    guessed = paillier_seconds(COSTS, layout, 20, {"a": 20, "b": 20}, 1)
    real = paillier_seconds(COSTS, layout, 20, {"a": 200, "b": 200}, 1)
    assert real > 3 * guessed
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("x", "xclp", XCLP)]) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier,
                              overrides={"c": {"max_work_seconds": 2 * guessed}},
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        run = coord.jobs["x"]
        assert "c" in run.parties and "c" not in run.lobby.declined  # it joined
        assert run.job.xclp is None or run.job.xclp.W is None or "c" not in run.active
    assert isinstance(results["c"], ResourceExhausted)
    message = str(results["c"])
    assert "20 rows against 400 rows of 2 peers is estimated at" in message, message
    assert "--max-work-minutes" in message and "before joining" not in message


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
    """docs/design.md §10.5: the coordinator estimates its own peak (server.steps.xclp.coordinator_bytes)
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
