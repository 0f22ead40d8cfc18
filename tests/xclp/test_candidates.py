"""Candidate pairs (xclp.candidates, docs/design.md §10.3): the schedule evaluates what the reference says,
each pair once, from public numbers only; k-means pools no centre of fewer rows than the minimum."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xclp import candidates as cd
from xclp.errors import InvalidInput
from xclp.graph import GraphParams
from xclp.reference import xclp_reference

SIZES = {"a": 37, "b": 50, "c": 23}
C, P, K = 7, 3, 8


def probes_of(rng: np.random.Generator, n: int) -> np.ndarray:
    """Each row's P distinct centres in a random order (nearest first), skewed towards low ids."""
    weights = np.linspace(2.0, 0.5, C)
    return np.array([rng.choice(C, size=P, replace=False, p=weights / weights.sum()) for _ in range(n)])


def counts(probes: np.ndarray, p: int = P) -> np.ndarray:
    return cd.probe_table(probes, C)[p - 1]


def public_budgets(probes: dict[str, np.ndarray], slack: float = 1.0) -> dict[str, np.ndarray]:
    pooled = np.sum([counts(probes[q]) for q in SIZES], axis=0)
    return {q: cd.row_budgets(pooled, SIZES[q], sum(SIZES.values()), slack) for q in SIZES}


def walk(schedule: cd.PairSchedule, lists_a, lists_b, n_a: int, n_b: int) -> list[tuple[int, int]]:
    """What the coordinator folds, batch by batch, for a pair run on `schedule`: (A's row, B's row)."""
    slots = cd.a_slots(schedule, lists_a)
    a_member, b_member = cd.membership(lists_a, n_a, P), cd.membership(lists_b, n_b, P)
    out = []
    for g in range(schedule.batches):
        rows = cd.b_rows(schedule, lists_b, g)
        assert rows.size == schedule.counts()[g]
        keep = cd.folded(schedule, g, slots[g], rows, a_member, b_member)
        x, s = np.nonzero(keep)
        out += list(zip(slots[g][s].tolist(), rows[x].tolist()))
    return out


@pytest.mark.parametrize("slack", [1.0, 1.5, 3.0])
def test_walking_the_schedule_folds_each_candidate_pair_exactly_once(slack: float) -> None:
    rng = np.random.default_rng(11)
    probes = {q: probes_of(rng, n) for q, n in SIZES.items()}
    budgets = public_budgets(probes, slack)
    lists = {q: cd.centre_lists(probes[q], P, budgets[q]) for q in SIZES}
    if slack == 1.0:  # the proportional share cuts some lists: the reference must see the same cut
        assert any(lists[q][c].size < counts(probes[q])[c] for q in SIZES for c in range(C))
    mask = cd.candidate_mask(lists, SIZES)
    offsets = dict(zip(SIZES, np.cumsum([0, *SIZES.values()])))
    for a, b in itertools.permutations(SIZES, 2):
        schedule = cd.PairSchedule.of(budgets[a], budgets[b], K)
        pairs = walk(schedule, lists[a], lists[b], SIZES[a], SIZES[b])
        assert len(pairs) == len(set(pairs))  # never folded twice
        block = mask[offsets[a] : offsets[a] + SIZES[a], offsets[b] : offsets[b] + SIZES[b]]
        assert set(pairs) == set(zip(*np.nonzero(block))), (a, b)


def test_what_a_peer_sees_is_the_same_for_two_partners_with_the_same_public_numbers() -> None:
    """B's view of a pair (A's batches, and how many of its own rows each is evaluated against) is
    a function of the budgets. Two worlds where rows move between a and c (the pooled counts and
    sizes stay, a's own histogram changes): b's view is the same; with each party's own counts as
    its budget (no padding) it is not."""
    rng = np.random.default_rng(5)
    first = {q: probes_of(rng, n) for q, n in SIZES.items()}
    moved = dict(first)
    swap = np.nonzero(first["a"][:, 0] == 0)[0][:5]
    other = np.nonzero(first["c"][:, 0] != 0)[0][: swap.size]
    moved["a"], moved["c"] = first["a"].copy(), first["c"].copy()
    moved["a"][swap], moved["c"][other] = first["c"][other], first["a"][swap]
    assert not np.array_equal(counts(first["a"]), counts(moved["a"]))

    def view(probes: dict[str, np.ndarray], padded: bool) -> tuple[int, list[int]]:
        budgets = public_budgets(probes) if padded else {q: counts(probes[q]) for q in SIZES}
        schedule = cd.PairSchedule.of(budgets["a"], budgets["b"], K)
        return schedule.batches, schedule.counts().tolist()

    assert view(first, padded=True) == view(moved, padded=True)
    assert view(first, padded=False) != view(moved, padded=False)


def test_the_first_shared_centre_is_the_smallest_in_both_sets() -> None:
    rng = np.random.default_rng(3)
    a = np.sort(rng.integers(-1, 9, size=(20, 4)), axis=1)
    b = np.sort(rng.integers(-1, 9, size=(15, 4)), axis=1)
    got = cd.first_shared(a, b)
    for i, j in itertools.product(range(15), range(20)):
        common = (set(b[i]) & set(a[j])) - {cd.DUMMY}
        assert got[i, j] == (min(common) if common else cd.DUMMY)


def test_lists_follow_probe_rank_then_row_within_their_budget() -> None:
    probes = np.array([[2, 0], [0, 2], [2, 1], [0, 1], [1, 2]])
    lists = cd.centre_lists(probes, 2, np.array([1, 2, 3]))
    assert [x.tolist() for x in lists] == [[1], [4, 2], [0, 2, 1]]  # centre 0 cut to one row: 1 probes it first
    assert cd.membership(lists, 5, 2).tolist() == [[2, -1], [0, 2], [1, 2], [-1, -1], [1, -1]]
    assert cd.row_budgets(np.array([0, 10, 100]), 30, 90, 1.0).tolist() == [0, 4, 30]  # ⌈10/3⌉; never above 30


def test_probes_are_chosen_within_the_pair_budget_from_the_pooled_table() -> None:
    rng = np.random.default_rng(9)
    probes = {q: probes_of(rng, n) for q, n in SIZES.items()}
    pooled = np.sum([cd.probe_table(probes[q], C) for q in SIZES], axis=0)
    assert np.array_equal(pooled[1], np.sum([counts(probes[q], 2) for q in SIZES], axis=0))
    pairs = [("a", "b"), ("c", "a"), ("b", "c")]
    p, budgets, fraction = cd.choose_probes(pooled, SIZES, pairs, K, 1.0, 0.9)
    assert fraction <= 0.9 and fraction == cd.evaluated_fraction(budgets, SIZES, pairs, K)
    if p < P:  # one more probe would pass the budget
        more = {q: cd.row_budgets(pooled[p], SIZES[q], sum(SIZES.values()), 1.0) for q in SIZES}
        assert cd.evaluated_fraction(more, SIZES, pairs, K) > 0.9
    with pytest.raises(InvalidInput, match="even one probe per row evaluates .* above pair_budget = 0.01"):
        cd.choose_probes(pooled, SIZES, pairs, K, 1.0, 0.01)


def test_auto_takes_one_probe_whatever_it_costs() -> None:
    rng = np.random.default_rng(9)
    probes = {q: probes_of(rng, n) for q, n in SIZES.items()}
    pooled = np.sum([cd.probe_table(probes[q], C) for q in SIZES], axis=0)
    pairs = list(itertools.permutations(SIZES, 2))
    p, budgets, fraction = cd.choose_probes(pooled, SIZES, pairs, K, 1.0, cd.AUTO)
    one = {q: cd.row_budgets(pooled[0], SIZES[q], sum(SIZES.values()), 1.0) for q in SIZES}
    assert p == 1 and all(np.array_equal(budgets[q], one[q]) for q in SIZES)
    assert fraction == cd.evaluated_fraction(one, SIZES, pairs, K)


@pytest.mark.parametrize("sizes, K, centres, slack", [
    ({"a": 300, "b": 300, "c": 300}, 72, 4, 1.0),
    ({"a": 2000, "b": 500, "c": 7000}, 186, 64, 1.0),
    ({"a": 18000, "b": 18000, "c": 18000}, 186, 256, 1.5),
    ({"a": 50, "b": 4000}, 186, 16, 0.5),
])
def test_the_floor_from_the_sizes_is_below_every_schedule_any_data_give(sizes, K, centres, slack) -> None:
    """budget_floor is what no data can go below: one probe per row on pooled tables that spread the
    rows evenly, crowd them on one centre, or fall anyhow (Dirichlet weights), all cost at least
    it; and the even spread costs within 2.5 times it (the floor is not vacuous)."""
    rng = np.random.default_rng(5)
    n, pairs = sum(sizes.values()), list(itertools.permutations(sizes, 2))
    floor = cd.budget_floor(sizes, K, centres, slack)
    tables = [np.bincount(rng.choice(centres, size=n, p=rng.dirichlet(np.full(centres, a))), minlength=centres)
              for a in (0.05, 0.5, 5.0, 500.0) for _ in range(5)]
    tables.append(np.eye(centres, dtype=np.int64)[0] * n)  # every row on one centre
    for pooled in tables:
        budgets = {q: cd.row_budgets(pooled, sizes[q], n, slack) for q in sizes}
        assert cd.evaluated_fraction(budgets, sizes, pairs, K) >= floor * (1 - 1e-12)
    even = cd.spread_fraction(sizes, K, centres, slack)
    assert floor <= even <= 2.5 * floor


def test_the_reference_on_every_pair_as_candidates_is_the_all_pairs_reference() -> None:
    rng = np.random.default_rng(1)
    parties = [(rng.normal(size=(n, 6)), np.where(rng.random(n) < 0.3, rng.integers(0, 3, n), -1)) for n in (20, 25)]
    params = GraphParams(k=4)
    full = xclp_reference(parties, b"u" * 32, 3, 64, params)
    same = xclp_reference(parties, b"u" * 32, 3, 64, params, candidates=np.ones((45, 45), dtype=bool))
    assert (full.influence.W != same.influence.W).nnz == 0 and np.array_equal(full.scores, same.scores)
    fewer = xclp_reference(parties, b"u" * 32, 3, 64, params,
                           candidates=cd.candidate_mask({"a": [np.arange(5)], "b": [np.arange(5)]}, {"a": 20, "b": 25}))
    cross = fewer.influence.W[:20, 20:].nonzero()
    assert cross[0].size and cross[0].max() < 5 and cross[1].max() < 5  # cross edges only among the candidates


def test_the_coordinators_fold_of_the_schedule_is_the_reference_graph_on_the_same_schedule() -> None:
    """What the coordinator does with a candidate run's distances: each party's own nearest rows,
    then every pair's batches folded both ways where `folded` says; its W equals the plaintext
    reference's kNN graph among the candidates, exactly (ties included: 16-bit codes tie often)."""
    from xclp.graph import knn_adjacency
    from xclp.hamming import hamming_matrix
    from xclp.neighbours import TopK, own_top_k
    from xclp.v1.xclp_layout import secure_hamming_pairs

    rng = np.random.default_rng(8)
    L, params = 64, GraphParams(k=5)
    codes = {q: rng.integers(0, 2**16, size=(n, 1), dtype=np.uint64) for q, n in SIZES.items()}  # 16 of 64 bits
    probes = {q: probes_of(rng, n) for q, n in SIZES.items()}
    budgets = public_budgets(probes)
    lists = {q: cd.centre_lists(probes[q], P, budgets[q]) for q in SIZES}
    members = {q: cd.membership(lists[q], SIZES[q], P) for q in SIZES}
    offsets = dict(zip(SIZES, np.cumsum([0, *SIZES.values()]).tolist()))
    H = hamming_matrix(np.vstack(list(codes.values())))
    top = TopK(sum(SIZES.values()), L, params)
    for q in SIZES:
        candidates, distances = own_top_k(codes[q], L, params)
        top.fold_lists(slice(offsets[q], offsets[q] + SIZES[q]), candidates.astype(np.int64) + offsets[q], distances)
    for task in secure_hamming_pairs(tuple(SIZES)):
        a, b = task.a, task.b
        schedule = cd.PairSchedule.of(budgets[a], budgets[b], K)
        slots = cd.a_slots(schedule, lists[a])
        for g in range(schedule.batches):
            rows = cd.b_rows(schedule, lists[b], g)
            keep = cd.folded(schedule, g, slots[g], rows, members[a], members[b])
            x, s = np.nonzero(keep)
            if not x.size:
                continue
            ga, gb = slots[g][s] + offsets[a], rows[x] + offsets[b]
            # one batch's kept distances, by (B's row, A's row): unique pairs, folded both ways
            ub, ib = np.unique(gb, return_inverse=True)
            ua, ia = np.unique(ga, return_inverse=True)
            block, mask = np.zeros((ub.size, ua.size), dtype=H.dtype), np.zeros((ub.size, ua.size), dtype=bool)
            block[ib, ia], mask[ib, ia] = H[gb, ga], True
            top.fold_scattered(ub, ua, block, mask)
            top.fold_scattered(ua, ub, block.T, mask.T)
    reference = knn_adjacency(H, L, params, cd.candidate_mask(lists, SIZES))
    assert (top.adjacency() != reference).nnz == 0
    assert (reference != knn_adjacency(H, L, params)).nnz  # the schedule did leave pairs out


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(1, 9), st.integers(1, 6), st.integers(0, 3))
def test_the_nearest_centres_are_the_first_of_a_stable_sort_of_all_of_them(seed, n, C, probes, levels) -> None:
    """nearest_centres partitions out each row's p largest instead of sorting all C: it must give
    what a stable sort of every centre gives, ties to the smaller id, nearest first. Few levels of
    integer features make ties common (levels 0: every row all zero, every product a tie)."""
    rng = np.random.default_rng(seed)
    X = rng.integers(-levels, levels + 1, size=(n, 3)).astype(np.float64)
    centres = rng.integers(-2, 3, size=(C, 3)).astype(np.float64)
    expected = np.argsort(-(X @ centres.T), axis=1, kind="stable")[:, :min(probes, C)]
    assert np.array_equal(cd.nearest_centres(X, centres, probes), expected)


def test_the_operator_hears_when_the_rows_crowd_the_centres_past_the_plan() -> None:
    """"auto" is planned at twice what rows spread evenly cost; the flights crowded 2 048 centres to
    1.29 % of all pairs' ciphertexts against 0.5 % planned. A table whose rows fall on a sixteenth of
    the centres is told so, with the way out; one spread evenly is not."""
    from xclp.v1.registry import parse_params

    sizes, K = {"a": 6000, "b": 6000, "c": 6000}, 186
    params = parse_params("xclp", {"n_classes": 2, "pair_budget": "auto"}).for_rows(sum(sizes.values()))
    C, planned = params.centre_count, params.work_budget(sizes, K)  # type: ignore[attr-defined]
    pairs, n = list(itertools.permutations(sizes, 2)), sum(sizes.values())
    even = np.full(C, n // C) + (np.arange(C) < n % C)
    crowded = np.zeros(C, dtype=np.int64)
    crowded[: C // 16] = n // (C // 16)
    crowded[0] += n - crowded.sum()
    notes = {}
    for name, pooled in (("even", even), ("crowded", crowded)):
        _, _, fraction = cd.choose_probes(pooled[None, :], sizes, pairs, K, 1.0, cd.AUTO)
        notes[name] = cd.crowding(fraction, planned, C)
    assert notes["even"] == ""
    assert notes["crowded"].startswith(f"the rows crowd the {C} centres: one probe per row costs ")
    assert "more centres in the job file would cost less" in notes["crowded"]
