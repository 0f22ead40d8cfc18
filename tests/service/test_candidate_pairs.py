"""XCLP on candidate pairs through the service (docs/design.md §10.3): an in-process coordinator, three
party sessions over gRPC, 512-bit test keys. The common seed's centres, the probe table (a
verifiable masked sum), the probes, then SecureHamming on the schedule: every party's scores equal
the plaintext reference's on the same schedule, and the schedule did leave pairs out."""

from __future__ import annotations

import itertools

import numpy as np

from tests.harness import PARTIES, allow_list, coordinator, job, party_data, run_parties
from tests.oracles.party_view import party_view
from xclp import candidates as cd
from xclp.client.policy import PartyPolicy
from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.secure_hamming import SlotLayout
from xclp.errors import InvalidInput
from xclp.graph import GraphParams
from xclp.reference import xclp_reference

L, C = 64, 3
# one probe per row: the budget holds whatever centres the (random) common seed draws
CANDIDATES = {"pair_budget": 0.9, "centres": 4, "probes": 1}
PARAMS = {"n_classes": C, "lsh_bits": L, "k": 5, "key_bits": 512, "insecure_test_keys": True, **CANDIDATES}


def test_secure_xclp_on_candidate_pairs_equals_the_reference_on_the_same_schedule(keys) -> None:
    datas = {p: party_data(40 + i, n=300 + 10 * i) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    progress: dict[str, list[str]] = {}
    with coordinator(allow_list(keys), [job("x", "xclp", PARAMS)]) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier, progress=progress,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        state = coord.jobs["x"].job.xclp
    assert all(not isinstance(r, BaseException) for r in results.values()), results

    # the reference on the same schedule: the same centres, probes and budgets, in plaintext
    seed = results["a"].seed
    unit = {p: cd.unit_rows(datas[p].X) for p in PARTIES}
    centres = cd.initial_centres(seed, 4, unit["a"].shape[1])
    probes = {p: cd.nearest_centres(unit[p], centres, 1) for p in PARTIES}
    pooled = np.sum([cd.probe_table(probes[p], 4) for p in PARTIES], axis=0)
    sizes = {p: datas[p].X.shape[0] for p in PARTIES}
    p_used, budgets, fraction = cd.choose_probes(pooled, sizes, list(itertools.permutations(sizes, 2)),
                                                 SlotLayout(512, L).slots, 1.0, 0.9)
    assert state.candidates is not None and state.candidates.probes == p_used
    assert all(np.array_equal(state.candidates.budgets[p], budgets[p]) for p in PARTIES)
    mask = cd.candidate_mask({p: cd.centre_lists(probes[p], p_used, budgets[p]) for p in PARTIES}, sizes)
    cross = sum(sizes.values()) ** 2 - sum(n * n for n in sizes.values())
    assert mask.sum() - (sum(n * n for n in sizes.values())) < cross  # some pairs were never evaluated
    ref = xclp_reference([(datas[p].X, datas[p].y) for p in PARTIES], seed, C, L, GraphParams(k=5), candidates=mask)
    everything = xclp_reference([(datas[p].X, datas[p].y) for p in PARTIES], seed, C, L, GraphParams(k=5))
    assert (state.W != ref.influence.W).nnz == 0  # the coordinator's graph: the reference's on the schedule
    assert (everything.influence.W != ref.influence.W).nnz  # ... which is not the all-pairs graph
    for j, p in enumerate(PARTIES):
        labels, _, scores = party_view(ref.scores[ref.party_rows(j)], datas[p].y, C)
        np.testing.assert_allclose(results[p].aggregate, scores, rtol=0, atol=1e-6)
        assert np.array_equal(results[p].aggregate.argmax(axis=1), labels)
    assert any("candidate pairs: " in line for line in progress["a"])


def _three_hundred_rows_each(keys, **params):
    """The job with `params` among three parties of 300 rows each: their data, each one's result
    and the coordinator's run."""
    datas = {p: party_data(50 + i, n=300) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    merged = {k: v for k, v in {**PARAMS, **params}.items() if v is not None}  # None: the key left out
    with coordinator(allow_list(keys), [job("x", "xclp", merged)]) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
    return datas, results, coord.jobs["x"]


def test_an_unset_pair_budget_runs_all_pairs_up_to_all_pairs_rows_and_candidate_pairs_above(keys) -> None:
    """No pair_budget in the job file: 3 × 300 rows run all pairs with all_pairs_rows = 900 and one
    probe per row ("auto") with 899; every side resolves it from the roster's row counts alike (a
    party that did not would refuse the coordinator's candidate steps, or wait for them)."""
    unset = {k: v for k, v in PARAMS.items() if k != "pair_budget"}
    for most, candidates in ((900, False), (899, True)):
        _, results, run = _three_hundred_rows_each(keys, **{**unset, "pair_budget": None, "all_pairs_rows": most})
        assert all(not isinstance(r, BaseException) for r in results.values()), results
        state = run.job.xclp
        assert (state.candidates is not None) is candidates, most
        assert run.job.summary()["params"]["pair_budget"] == ("auto" if candidates else 1.0)
        assert {r.params.pair_budget for r in results.values()} == {"auto" if candidates else 1.0}
        if candidates:
            assert state.candidates.probes == 1


def test_a_budget_below_what_candidates_can_reach_is_refused_before_secure_hamming(keys) -> None:
    """One probe per row still costs a batch of K slots per row of B: a budget below that is refused
    once the probe table is open, with the reason, before any Paillier work. (3 × 300 rows, K = 72
    slots, 4 centres: one probe costs at least 0.4 of all pairs' ciphertexts with these sizes.)"""
    _, results, run = _three_hundred_rows_each(keys, pair_budget=0.3)
    assert run.stage.value == "failed" and run.job.xclp.pairs == ()  # SecureHamming never started
    for p in PARTIES:
        assert isinstance(results[p], BaseException), results
        assert "candidate pairs: even one probe per row evaluates" in str(results[p])
        assert "above pair_budget = 0.3" in str(results[p]) and 'set it to "auto"' in str(results[p])


def test_a_budget_no_data_could_meet_is_refused_from_the_sizes_before_the_run_starts(keys) -> None:
    """pair_budget = 0.01 with 3 × 300 rows: whatever the data, each of B's rows is compared with a
    batch of A's, at least 1/⌈300/72⌉ = 0.2 of all pairs' ciphertexts. The coordinator says so as
    soon as the parties have joined (their sizes are public), before the seed or any other step;
    before, the parties drew centres and summed a probe table first."""
    _, results, run = _three_hundred_rows_each(keys, pair_budget=0.01)
    assert run.stage.value == "failed" and not run.ledger.as_dict()  # no step ran, not even the seed
    floor = cd.budget_floor(dict.fromkeys(PARTIES, 300), SlotLayout(512, L).slots, 4, 1.0)
    assert 0.2 <= floor < 0.3
    for p in PARTIES:
        assert isinstance(results[p], InvalidInput), results  # REFUSED: the job cannot run with these data
        assert (f"pair_budget = 0.01 is below what these parties' rows allow: with any data, candidate pairs cost at "
                f"least {floor:.1%}") in str(results[p]) and 'or set it to "auto"' in str(results[p])


def test_pair_budget_auto_runs_one_probe_per_row_and_equals_the_reference(keys) -> None:
    """pair_budget = "auto": one probe per row whatever it costs (here more than the 0.3 the test
    above is refused at), and the coordinator's graph is the reference's on that schedule."""
    datas, results, run = _three_hundred_rows_each(keys, pair_budget="auto", probes=3)
    state = run.job.xclp
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    assert state.candidates is not None and state.candidates.probes == 1 and state.candidates.fraction > 0.3
    seed = results["a"].seed
    unit = {p: cd.unit_rows(datas[p].X) for p in PARTIES}
    centres = cd.initial_centres(seed, 4, unit["a"].shape[1])
    probes = {p: cd.nearest_centres(unit[p], centres, 1) for p in PARTIES}
    sizes = dict.fromkeys(PARTIES, 300)
    pooled = np.sum([cd.probe_table(probes[p], 4) for p in PARTIES], axis=0)
    _, budgets, _ = cd.choose_probes(pooled, sizes, list(itertools.permutations(sizes, 2)),
                                     SlotLayout(512, L).slots, 1.0, "auto")
    mask = cd.candidate_mask({p: cd.centre_lists(probes[p], 1, budgets[p]) for p in PARTIES}, sizes)
    ref = xclp_reference([(datas[p].X, datas[p].y) for p in PARTIES], seed, C, L, GraphParams(k=5), candidates=mask)
    assert (state.W != ref.influence.W).nnz == 0


def _without_c(keys, params: dict, datas, dies):
    """The job run with c's session `dies`: each party's result, and the coordinator's XCLP state;
    c failed and a and b finished."""
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("x", "xclp", params)]) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier, sessions={"c": dies},
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        state = coord.jobs["x"].job.xclp
    assert isinstance(results["c"], BaseException)
    assert all(not isinstance(results[p], BaseException) for p in "ab"), results
    return results, state


def _assert_ab_reference(results, state, datas, mask: np.ndarray) -> None:
    """The coordinator's graph and a's and b's scores are the reference's among a and b on `mask`."""
    ref = xclp_reference([(datas[p].X, datas[p].y) for p in "ab"], results["a"].seed, C, L, GraphParams(k=5),
                         candidates=mask)
    assert (state.W != ref.influence.W).nnz == 0
    for j, p in enumerate("ab"):
        _, _, scores = party_view(ref.scores[ref.party_rows(j)], datas[p].y, C)
        np.testing.assert_allclose(results[p].aggregate, scores, rtol=0, atol=1e-6)


def test_a_party_lost_after_the_probe_table_leaves_the_others_on_their_schedule(keys) -> None:
    """c is lost when the probes step starts (the probe table had all three): a and b
    go on with the budgets every side derived from the three-party table, and get the reference's
    scores among a and b on that schedule."""
    from tests.harness import DiesAt

    class Dies(DiesAt):
        at = "probes"

    datas = {p: party_data(70 + i, n=300) for i, p in enumerate(PARTIES)}
    results, state = _without_c(keys, PARAMS, datas, Dies)
    assert state.membership.graph == ("a", "b")
    seed = results["a"].seed
    unit = {p: cd.unit_rows(datas[p].X) for p in PARTIES}
    centres = cd.initial_centres(seed, 4, unit["a"].shape[1])
    probes = {p: cd.nearest_centres(unit[p], centres, 1) for p in PARTIES}
    pooled = np.sum([cd.probe_table(probes[p], 4) for p in PARTIES], axis=0)
    sizes = dict.fromkeys(PARTIES, 300)
    used, budgets, _ = cd.choose_probes(pooled, sizes, list(itertools.permutations(sizes, 2)),
                                        SlotLayout(512, L).slots, 1.0, 0.9)
    mask = cd.candidate_mask({p: cd.centre_lists(probes[p], used, budgets[p]) for p in "ab"}, dict.fromkeys("ab", 300))
    _assert_ab_reference(results, state, datas, mask)


def test_the_coordinator_refuses_probes_a_party_could_not_have_sent() -> None:
    """Bad input at the probes step (server/phases/each_party.py Probes.accept): not uint16[n, p], a centre
    past the job's, a centre twice in a row; nothing of it is kept. A good one becomes the lists."""
    from types import SimpleNamespace

    import pytest

    from xclp.errors import InvalidInput
    from xclp.server.phases.each_party import Probes
    from xclp.server.phases.xclp_state import CandidateRun

    run = CandidateRun(2, {"a": np.array([3, 3, 2, 2])}, 0.5)
    phase = Probes(None, SimpleNamespace(sizes={"a": 5}, candidates=run, params=SimpleNamespace(centre_count=4)))
    good = np.array([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2]], dtype=np.uint16)
    for payload, refusal in [(good.astype(np.int64), "must be uint16\\[5, 2\\]"), (good[:4], "must be uint16"),
                             (good[:, :1], "must be uint16"), (np.where(good == 3, 4, good).astype(np.uint16),
                                                                "distinct centres below 4"),
                             (np.array([[1, 1]] + good[1:].tolist(), dtype=np.uint16), "distinct centres")]:
        with pytest.raises(InvalidInput, match=refusal):
            phase.accept(None, "a", payload)
        assert "a" not in run.lists
    phase.accept(None, "a", good)
    assert [x.tolist() for x in run.lists["a"]] == [[0, 4, 3], [1, 0], [2, 1], [3, 2]]  # nearer probes first, cut
