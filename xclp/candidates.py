"""Candidate pairs for SecureHamming (docs/design.md §10.3): evaluate only pairs of rows that can be neighbours.

All-pairs SecureHamming costs n_A·n_B distances per pair of parties; each row needs only its k
nearest. The parties agree on C centres on the unit sphere, drawn from their common seed
(`initial_centres`: they depend on no one's data, so nothing about them is released;
measured them against federated k-means, benchmarks/xclp_candidates.py), and each row lists its
`probes` nearest centres (`nearest_centres`). A pair of rows of two parties is a **candidate** when both
are on the list of a common centre:

- each party's list of centre c holds its rows that probe c, those for which c is a nearer probe
  first (then by row number), cut to a **public budget** of rows (`row_budgets`): a share of the
  centre's pooled count (every party's rows probing c, which all parties see) in proportion to the
  party's rows, times a slack. A peer sees only the budgets, never this party's own per-centre
  counts; a row beyond its centre's budget keeps its other centres;
- as A, a party lays its lists out one after another, each padded to its budget with dummy
  slots, and cuts them into ciphertext batches of K slots, so the slots stay full whatever the
  lists' sizes; as B, it evaluates each batch against its own lists of the centres the batch
  holds, each padded with dummy rows to its budget (`PairSchedule`). The coordinator folds a
  distance only where slot and row are real and of the same centre, and a pair of rows that
  shares several centres only at the first (`folded`).

`candidate_mask` is the set of pairs this evaluates (n × n: for the plaintext reference of the
same schedule, xclp.reference, which holds H anyway). `evaluated_fraction` is its cost against all
pairs, padding included: what `pair_budget` bounds (`choose_probes`, from the pooled `probe_table`).

A ciphertext compares one of B's rows with K of A's, so a row of B is evaluated against at least
one batch per probe: candidates cut the ciphertexts by at most about ⌈n_A/K⌉ / probes, however
few pairs of rows they keep (K = 186 at 2048-bit keys and L = 1024: ~11× at 2 000 rows, ~108× at
20 000).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from xclp.errors import InvalidInput
from xclp.seeding import Seed, public_rng

__all__ = ["AUTO", "DUMMY", "PairSchedule", "a_slots", "b_rows", "budget_floor", "candidate_mask", "centre_lists",
           "choose_probes", "crowding", "evaluated_fraction", "first_shared", "folded", "initial_centres",
           "membership", "nearest_centres", "probe_table",
           "row_budgets", "spread_fraction", "unit_rows"]

DUMMY = -1  # a slot or row that stands for no row: evaluated like any other, discarded by the coordinator
AUTO = "auto"  # pair_budget = "auto": one probe per row, whatever that costs (the least schedule)
_BLOCK_ELEMENTS = 1 << 22  # rows × centres of dot products computed at once


def unit_rows(X: np.ndarray) -> np.ndarray:
    """float64[n, d]: each row over its Euclidean norm (an all-zero row stays zero)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or not np.all(np.isfinite(X)):
        raise InvalidInput(f"rows must be a finite float[n, d], got shape {X.shape}")
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return np.divide(X, norms, out=np.zeros_like(X), where=norms > 0)


def initial_centres(seed: Seed, centres: int, dim: int) -> np.ndarray:
    """float64[C, d]: C directions drawn from the common seed: the centres (no one's data)."""
    if centres < 1 or dim < 1:
        raise InvalidInput(f"k-means needs at least one centre and one feature, got {centres} and {dim}")
    return unit_rows(public_rng(seed, "xclp/centres").standard_normal((centres, dim)))


def nearest_centres(Xn: np.ndarray, centres: np.ndarray, probes: int) -> np.ndarray:
    """int64[n, p]: each unit row's `probes` nearest centres (largest dot product, then smaller id), nearest first.

    A row's p largest are partitioned out (O(C) a row, not a sort of all C) and only those are
    ordered; a row whose p-th largest dot product ties with one left out (an all-zero row, whose
    products are all 0) is sorted whole, so ties go to the smaller id exactly as a stable sort does.
    """
    n, C = Xn.shape[0], centres.shape[0]
    p = min(int(probes), C)
    out = np.empty((n, p), dtype=np.int64)
    step = max(1, _BLOCK_ELEMENTS // max(C, 1))
    for start in range(0, n, step):
        out[start : start + step] = _largest_first(Xn[start : start + step] @ centres.T, p)
    return out


def _largest_first(dots: np.ndarray, p: int) -> np.ndarray:
    """int64[m, p]: each row's p largest columns, larger first, then smaller column: the first p of a
    stable argsort of −dots, without sorting all columns."""
    if p >= dots.shape[1]:
        return np.argsort(-dots, axis=1, kind="stable")
    top = np.sort(np.argpartition(-dots, p - 1, axis=1)[:, :p], axis=1)  # ascending ids: ties keep them in order
    values = np.take_along_axis(dots, top, axis=1)
    top = np.take_along_axis(top, np.argsort(-values, axis=1, kind="stable"), axis=1)
    least = values.min(axis=1, keepdims=True)
    ties = np.flatnonzero((dots >= least).sum(axis=1) > p)  # a left-out column as large as the p-th
    if ties.size:
        top[ties] = np.argsort(-dots[ties], axis=1, kind="stable")[:, :p]
    return top


def row_budgets(pooled: np.ndarray, rows: int, total_rows: int, slack: float) -> np.ndarray:
    """int64[C]: a party's rows per centre list, public: ⌈slack · pooled_c · rows / total_rows⌉, at most its rows."""
    pooled = np.asarray(pooled, dtype=np.int64)
    share = np.ceil(float(slack) * pooled * (rows / max(total_rows, 1)) - 1e-9).astype(np.int64)
    return np.minimum(np.maximum(share, 0), rows)


def centre_lists(probes: np.ndarray, p: int, budgets: np.ndarray) -> list[np.ndarray]:
    """Per centre, this party's rows on its list (int64, in order): the rows probing it among their
    first p probes, nearer probes first, then by row number, cut to the centre's budget."""
    probes = np.asarray(probes)[:, :p]
    n = probes.shape[0]
    centre, rank = probes.ravel(), np.tile(np.arange(p), n)
    row = np.repeat(np.arange(n, dtype=np.int64), p)
    order = np.lexsort((row, rank, centre))
    centre, row = centre[order], row[order]
    bounds = np.searchsorted(centre, np.arange(len(budgets) + 1))
    return [row[bounds[c] : bounds[c + 1]][: budgets[c]] for c in range(len(budgets))]


def membership(lists: Sequence[np.ndarray], rows: int, p: int) -> np.ndarray:
    """int64[rows, p]: the centres whose list holds each row (ascending, DUMMY-padded)."""
    out = np.full((rows, p), DUMMY, dtype=np.int64)
    filled = np.zeros(rows, dtype=np.int64)
    for c, members in enumerate(lists):  # ascending c: each row's centres come out sorted
        out[members, filled[members]] = c
        filled[members] += 1
    return out


def first_shared(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """int64[m, r]: for rows with centre sets b[m, p] and a[r, p] (DUMMY-padded), the smallest
    centre both hold (DUMMY where none): the one centre at which their distance is folded."""
    best = np.full((b.shape[0], a.shape[0]), np.iinfo(np.int64).max, dtype=np.int64)
    for j in range(b.shape[1]):
        for i in range(a.shape[1]):
            same = (b[:, j, None] == a[None, :, i]) & (b[:, j, None] != DUMMY)
            np.minimum(best, np.where(same, b[:, j, None], best), out=best)
    best[best == np.iinfo(np.int64).max] = DUMMY
    return best


@dataclass(frozen=True)
class PairSchedule:
    """The SecureHamming ciphertexts of one pair (A, B) on a candidate schedule, from public numbers
    only (the two parties' budgets and K): what A packs, what B evaluates, what the coordinator
    expects, and nothing any party's own counts decide.

    A's slots are its centre lists, each padded to its budget, one after another in centre order
    and cut into batches of K (so the slots stay full whatever the lists' sizes); `slot_centre`
    int64[batches·K] is each slot's centre (DUMMY after the last list). Batch g is evaluated against
    B's lists of the centres its slots hold, each padded to B's budget, in centre order: D number
    `first[g] + j` is batch g against the j-th of those rows (`b_entries(g)`).
    """

    slot_centre: np.ndarray
    b_budgets: np.ndarray
    K: int

    @classmethod
    def of(cls, a_budgets: np.ndarray, b_budgets: np.ndarray, K: int) -> PairSchedule:
        a_budgets, b_budgets = np.asarray(a_budgets, np.int64), np.asarray(b_budgets, np.int64)
        if a_budgets.shape != b_budgets.shape or a_budgets.ndim != 1 or np.any(a_budgets < 0) or np.any(b_budgets < 0):
            raise InvalidInput("the budgets of a pair must be two non-negative int[C] of the same centres")
        centre = np.repeat(np.arange(a_budgets.size, dtype=np.int64), a_budgets)
        slots = np.full(-(-centre.size // K) * K, DUMMY, dtype=np.int64)
        slots[: centre.size] = centre
        return cls(slots, b_budgets, int(K))

    @property
    def batches(self) -> int:
        return self.slot_centre.size // self.K

    def centres(self, g: int) -> np.ndarray:
        """int64: the centres batch g's slots hold, ascending."""
        held = self.slot_centre[g * self.K : (g + 1) * self.K]
        return np.unique(held[held != DUMMY])

    def counts(self) -> np.ndarray:
        """int64[batches]: the ciphertexts of each batch (B's budgets of the centres it holds); computed
        once (every piece of the pair asks for it), a copy each time."""
        return self._counts.copy()

    @functools.cached_property
    def _counts(self) -> np.ndarray:
        return np.array([int(self.b_budgets[self.centres(g)].sum()) for g in range(self.batches)], dtype=np.int64)

    @property
    def values(self) -> int:
        return int(self._counts.sum())

    def b_entries(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """(centre, position) int64[m] of the rows batch g is evaluated against: position j of B's
        padded list of that centre."""
        centres = self.centres(g)
        sizes = self.b_budgets[centres]
        return np.repeat(centres, sizes), np.concatenate([np.arange(s) for s in sizes] or [np.zeros(0, np.int64)])


def a_slots(schedule: PairSchedule, lists: Sequence[np.ndarray]) -> np.ndarray:
    """int64[batches, K]: A's row in each slot of the schedule (DUMMY where its list is shorter than its budget)."""
    out = np.full(schedule.slot_centre.size, DUMMY, dtype=np.int64)
    starts = np.searchsorted(schedule.slot_centre[schedule.slot_centre != DUMMY], np.arange(len(lists)))
    for c, members in enumerate(lists):
        out[starts[c] : starts[c] + members.size] = members
    return out.reshape(schedule.batches, schedule.K)


def b_rows(schedule: PairSchedule, lists: Sequence[np.ndarray], g: int) -> np.ndarray:
    """int64[m]: B's rows batch g is evaluated against (DUMMY where a list is shorter than its budget)."""
    centre, position = schedule.b_entries(g)
    out = np.full(centre.size, DUMMY, dtype=np.int64)
    for i, (c, j) in enumerate(zip(centre.tolist(), position.tolist())):
        if j < lists[c].size:
            out[i] = lists[c][j]
    return out


def folded(schedule: PairSchedule, g: int, slots: np.ndarray, rows: np.ndarray, a_member: np.ndarray,
           b_member: np.ndarray) -> np.ndarray:
    """bool[m, K]: which of batch g's distances the coordinator folds: slot and row both real, the
    slot's centre the row's list's centre, and that centre the first the two rows share (each
    pair of rows once). slots: A's rows of batch g; rows: B's rows evaluated against it;
    a_member/b_member: each party's centre sets (`membership`)."""
    centre, _ = schedule.b_entries(g)
    slot_centre = schedule.slot_centre[g * schedule.K : (g + 1) * schedule.K]
    real = (rows[:, None] != DUMMY) & (slots[None, :] != DUMMY) & (centre[:, None] == slot_centre[None, :])
    shared = first_shared(a_member[np.maximum(slots, 0)], b_member[np.maximum(rows, 0)])
    return real & (shared == centre[:, None])


def candidate_mask(lists: Mapping[str, Sequence[np.ndarray]], sizes: Mapping[str, int]) -> np.ndarray:
    """bool[n, n] over the parties' rows in `sizes`' order: the cross pairs some centre's lists hold
    both of (every pair of a party's own rows is a candidate: the parties compute those in full)."""
    offsets = np.cumsum([0, *sizes.values()])
    n = int(offsets[-1])
    mask = np.zeros((n, n), dtype=bool)
    for i in range(len(sizes)):
        mask[offsets[i] : offsets[i + 1], offsets[i] : offsets[i + 1]] = True
    parties = list(sizes)
    for i, p in enumerate(parties):
        for j, q in enumerate(parties):
            if i < j:
                for a, b in zip(lists[p], lists[q]):
                    mask[np.ix_(offsets[i] + a, offsets[j] + b)] = True
                    mask[np.ix_(offsets[j] + b, offsets[i] + a)] = True
    return mask


def evaluated_fraction(budgets: Mapping[str, np.ndarray], sizes: Mapping[str, int],
                       pairs: Sequence[tuple[str, str]], K: int) -> float:
    """SecureHamming ciphertexts of the candidate schedule (dummies included) over all pairs'
    ciphertexts, `pairs` as (A, B): the cost `pair_budget` bounds."""
    scheduled = sum(PairSchedule.of(budgets[a], budgets[b], K).values for a, b in pairs)
    everything = sum(math.ceil(sizes[a] / K) * sizes[b] for a, b in pairs)
    return scheduled / max(everything, 1)


def probe_table(probes: np.ndarray, centres: int) -> np.ndarray:
    """int64[P, C]: row p − 1 counts this party's rows having each centre among their first p probes
    (its part of the pooled table every party chooses its probes from, `choose_probes`)."""
    return np.cumsum([np.bincount(np.asarray(probes)[:, j], minlength=centres) for j in range(probes.shape[1])],
                     axis=0).astype(np.int64)


def choose_probes(pooled: np.ndarray, sizes: Mapping[str, int], pairs: Sequence[tuple[str, str]], K: int,
                  slack: float, pair_budget: float | str) -> tuple[int, dict[str, np.ndarray], float]:
    """The most probes per row whose schedule stays within `pair_budget` of all pairs' ciphertexts
    (AUTO: one probe): (p, every party's public budgets, the fraction), from the pooled
    `probe_table` alone, so that every party and the coordinator choose the same. InvalidInput if
    one probe is already over."""
    pooled = np.asarray(pooled, dtype=np.int64)
    n = sum(sizes.values())
    fraction = 1.0
    for p in range(1 if pair_budget == AUTO else pooled.shape[0], 0, -1):
        budgets = {q: row_budgets(pooled[p - 1], sizes[q], n, slack) for q in sizes}
        fraction = evaluated_fraction(budgets, sizes, pairs, K)
        if pair_budget == AUTO or fraction <= float(pair_budget):
            return p, budgets, fraction
    raise InvalidInput(f"even one probe per row evaluates {fraction:.1%} of the pairs' ciphertexts, above "
                       f"pair_budget = {pair_budget}: each row is evaluated against at least a batch of {K} of a "
                       "peer's rows per probe, so below about ⌈rows/K⌉ times fewer ciphertexts candidates cannot "
                       "go; raise pair_budget (1.0: all pairs), or set it to \"auto\" (one probe per row, whatever "
                       "that costs)")


def budget_floor(sizes: Mapping[str, int], K: int, centres: int, slack: float) -> float:
    """The least fraction of all pairs' ciphertexts a candidate schedule can cost, whatever the data,
    from the public sizes alone: as B, each of its rows is evaluated against at least one batch of
    A's slots (at least min(slack, 1)·n_B ciphertexts), and A's list of a centre spans at least its
    budget over K batches, each evaluated against B's list there (Σ_c a_c·b_c / K, least when the
    rows fall evenly on the centres: s²·n_A·n_B / (K·C), s = min(slack, 1))."""
    s = min(float(slack), 1.0)
    least = everything = 0.0
    for a, b in itertools.permutations(sizes, 2):
        least += max(s * sizes[b], s * s * sizes[a] * sizes[b] / (K * centres))
        everything += math.ceil(sizes[a] / K) * sizes[b]
    return least / max(everything, 1.0)


def spread_fraction(sizes: Mapping[str, int], K: int, centres: int, slack: float) -> float:
    """What one probe per row costs when the rows fall evenly on the centres: the schedule of a
    pooled table with n/C rows on each (what "auto" is estimated from before the data are seen)."""
    n = sum(sizes.values())
    pooled = np.full(centres, n // centres, dtype=np.int64) + (np.arange(centres) < n % centres)
    budgets = {q: row_budgets(pooled, sizes[q], n, slack) for q in sizes}
    return evaluated_fraction(budgets, sizes, list(itertools.permutations(sizes, 2)), K)


def crowding(fraction: float, planned: float, centres: int) -> str:
    """What to tell the operator when one probe per row costs more than "auto" planned from an even
    spread (`planned`, XclpJobParams.work_budget): the rows crowd a few centres, and more centres
    set in the job file split them ("" when within the plan). 3 x 100 000 flights rows cost 1.29 %
    of all pairs' ciphertexts on the 2 048 centres the sizes give, 0.57 % on 16 384
    (docs/jobs/xclp.md, "Crowded data")."""
    if fraction <= planned:
        return ""
    return (f"the rows crowd the {centres} centres: one probe per row costs {100 * fraction:.2f}% of all pairs' "
            f"ciphertexts, {fraction / max(planned, 1e-12):.1f} times the {100 * planned:.2f}% planned from rows "
            "spread evenly over them; more centres in the job file would cost less (docs/jobs/xclp.md, "
            "\"Crowded data\")")
