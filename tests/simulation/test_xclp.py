"""XCLP protocol steps with real cryptography, checked against the plaintext oracle (docs/design.md §5).

Small on purpose: 3 parties × 22–30 rows, L = 64, 512-bit Paillier test keys.
"""

from __future__ import annotations

import functools
import hashlib
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from tests.oracles.party_view import party_view
from xclp.client.steps import xclp as party
from xclp.crypto.fixedpoint import FixedPoint
from xclp.crypto.masking import PairwiseMasker
from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.pool import process_pool
from xclp.errors import InvalidInput, OutOfRange, PeerDropped, ProtocolError, ReplayRefused
from xclp.graph import GraphParams
from xclp.hamming import hamming_matrix
from xclp.reference import XclpResult, xclp_reference
from xclp.server.steps import xclp as coord
from xclp.simulation import InProcessResult, run_xclp_inprocess

SEED = hashlib.sha256(b"test_xclp_steps").digest()
L = 64
KEY_BITS = 512
C = 3
PARAMS = GraphParams(k=5)
IDS = ("party-a", "party-b", "party-c")
SIZES = {"party-a": 22, "party-b": 30, "party-c": 26}


@functools.cache
def dataset() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Three Gaussian classes in 10-D spread over three parties; ~40% of rows labeled."""
    rng = np.random.default_rng(7)
    centres = rng.normal(scale=3.0, size=(C, 10))
    out = {}
    for pid in IDS:
        n = SIZES[pid]
        y = rng.integers(0, C, size=n)
        X = centres[y] + rng.normal(size=(n, 10))
        y_seen = np.where(rng.random(n) < 0.4, y, -1)
        y_seen[0] = y[0]  # every party labels at least one row
        out[pid] = (X, y_seen)
    return out


@functools.cache
def run(hide: bool = False, normalise: bool = False, drop: tuple[tuple[str, str], ...] = ()) -> InProcessResult:
    return run_xclp_inprocess(
        dataset(), C, seed=SEED, L=L, key_bits=KEY_BITS, params=PARAMS, hide_label_mask=hide,
        normalise_labels=normalise, drop=dict(drop), insecure_test_keys=True,
    )


def reference(ids: tuple[str, ...] = IDS, unlabeled: tuple[str, ...] = (), normalise: bool = False) -> XclpResult:
    """The oracle on the parties `ids` (sorted order = H's order), with `unlabeled` parties' labels removed."""
    data = dataset()
    parties = [(data[p][0], np.full_like(data[p][1], -1) if p in unlabeled else data[p][1]) for p in ids]
    return xclp_reference(parties, SEED, C, L, PARAMS, normalise_labels=normalise)


def assert_outputs_match(
    result: InProcessResult, ref: XclpResult, ids: tuple[str, ...], receivers: tuple[str, ...], *,
    hide_label_mask: bool = False,
) -> None:
    """Each receiver's output is the reference on its unlabeled rows and its own labels elsewhere."""
    assert set(result.outputs) == set(receivers)
    for j, pid in enumerate(ids):
        if pid not in receivers:
            continue
        labels, confidence, scores = party_view(ref.scores[ref.party_rows(j)], dataset()[pid][1], C,
                                                hide_label_mask=hide_label_mask)
        out = result.outputs[pid]
        np.testing.assert_array_equal(out.labels, labels)
        np.testing.assert_allclose(out.scores, scores, rtol=0, atol=1e-6)
        np.testing.assert_allclose(out.confidence, confidence, rtol=0, atol=1e-6)


# ---- correctness contract (docs/design.md §5) -------------------------------------------------------------


def assert_same_graph(W, ref) -> None:
    """The coordinator's folded W is the plaintext reference's W on the whole H, bit for bit."""
    np.testing.assert_array_equal(W.indptr, ref.indptr)
    np.testing.assert_array_equal(W.indices, ref.indices)
    np.testing.assert_array_equal(W.data, ref.data)


def test_coordinator_graph_equals_the_plaintext_graph_on_the_whole_H() -> None:
    result = run()
    codes = np.concatenate([party.lsh_step(dataset()[p][0], SEED, L) for p in IDS])
    assert result.layout == coord.RowLayout(IDS, tuple(SIZES[p] for p in IDS))
    np.testing.assert_array_equal(reference().H, hamming_matrix(codes))
    assert_same_graph(result.W, reference().influence.W)


def test_process_pool_gives_the_same_H_and_predictions() -> None:
    with process_pool(2) as executor:
        pooled = run_xclp_inprocess(
            dataset(), C, seed=SEED, L=L, key_bits=KEY_BITS, params=PARAMS, insecure_test_keys=True, executor=executor
        )
    assert_same_graph(pooled.W, reference().influence.W)
    assert_outputs_match(pooled, reference(), IDS, IDS)


@pytest.mark.parametrize("hide", [False, True], ids=["label-mask-sent", "hide-label-mask"])
@pytest.mark.parametrize("normalise", [False, True], ids=["one-hot", "class-normalised"])
def test_predictions_equal_reference(hide: bool, normalise: bool) -> None:
    ref = reference(normalise=normalise)
    assert_outputs_match(run(hide, normalise), ref, IDS, IDS, hide_label_mask=hide)
    # the data is not trivial: propagation changes at least one unlabeled row's argmax vs class 0
    assert len(np.unique(ref.labels)) == C


def test_hide_label_mask_sends_all_columns_and_no_labeled_sets() -> None:
    shown, hidden = run(False), run(True)
    n = sum(SIZES.values())
    n_labeled = sum(int((dataset()[p][1] >= 0).sum()) for p in IDS)
    assert "labeled_sets" not in hidden.bytes_sent
    assert shown.bytes_sent["labeled_sets"] == 8 * n_labeled
    assert hidden.bytes_sent["influence"] == 8 * n * n  # every party gets float64[n, n_j]
    assert shown.bytes_sent["influence"] == 8 * n * n_labeled


def test_secure_hamming_bytes_are_ciphertexts_of_the_packed_slices() -> None:
    result = run()
    layout = party.slot_layout(PaillierKeypair.generate(KEY_BITS, allow_insecure_test_size=True).public, L)
    ct = 2 * KEY_BITS // 8
    expected = 0
    for task in coord.secure_hamming_pairs(IDS):
        n_a, n_b = SIZES[task.a], SIZES[task.b]
        batches = math.ceil(n_a / layout.slots)
        expected += 20 + batches * L * ct  # A -> B: header + one ciphertext per (batch, bit)
        expected += 24 + batches * n_b * ct  # B -> A: header + one ciphertext per (batch, B's row)
        expected += 2 * batches * n_b * KEY_BITS // 8  # R from B and t from A: one value mod N per ciphertext
    assert result.bytes_sent["secure_hamming"] == expected


# ---- dropouts (docs/design.md §5, end) --------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["setup", "secure_hamming"])
def test_dropout_before_or_during_secure_hamming_equals_never_joined(stage: str) -> None:
    result = run(drop=(("party-b", stage),))
    without = ("party-a", "party-c")
    ref = reference(without)
    assert result.membership == coord.Membership(graph=without, labels=without, rowsums_attempt=0)
    assert_same_graph(result.W, ref.influence.W)
    assert_outputs_match(result, ref, without, without)


@pytest.mark.parametrize("stage", ["graph", "secure_rowsums"])
def test_dropout_after_H_shapes_graph_but_brings_and_gets_no_labels(stage: str) -> None:
    result = run(drop=(("party-b", stage),))
    ref = reference(IDS, unlabeled=("party-b",))
    assert_same_graph(result.W, reference().influence.W)  # b's rows stay in the graph
    assert_outputs_match(result, ref, IDS, ("party-a", "party-c"))
    # and it matters: with b's labels the answer differs
    assert not np.allclose(ref.scores, reference().scores)


def test_dropout_during_rowsums_restarts_without_it_under_fresh_masks() -> None:
    first, second = run(drop=(("party-b", "secure_rowsums"),)).rowsums_attempts
    assert (first.round, first.participants, first.completed) == (0, IDS, False)
    assert set(first.received) == {"party-a", "party-c"}  # b agreed on masks, then never pushed
    assert (second.round, second.participants, second.completed) == (1, ("party-a", "party-c"), True)
    # a's rows of c in both attempts: same Z̄ underneath, so every difference is the mask
    c_rows_first = first.received["party-a"][SIZES["party-b"] :]
    c_rows_second = second.received["party-a"]
    assert c_rows_first.shape == c_rows_second.shape == (SIZES["party-c"], C)
    assert np.count_nonzero(c_rows_first == c_rows_second) == 0
    # nobody sends b's rows in the restart: c's payload covers a's rows only
    assert second.received["party-c"].shape == (SIZES["party-a"], C)


def test_drop_party_transitions() -> None:
    m = coord.start_membership(["c", "a", "b"])
    assert m == coord.Membership(("a", "b", "c"), ("a", "b", "c"), 0)
    assert coord.drop_party(m, "b", coord.XclpStage.SETUP) == coord.Membership(("a", "c"), ("a", "c"), 0)
    assert coord.drop_party(m, "b", coord.XclpStage.SECURE_HAMMING) == coord.Membership(("a", "c"), ("a", "c"), 0)
    assert coord.drop_party(m, "b", coord.XclpStage.GRAPH) == coord.Membership(("a", "b", "c"), ("a", "c"), 0)
    after = coord.drop_party(m, "b", coord.XclpStage.ROW_SUMS)
    assert after == coord.Membership(("a", "b", "c"), ("a", "c"), 1)
    assert coord.rowsums_participants(after) == ("a", "c")
    with pytest.raises(InvalidInput, match="not in SecureRowSums"):
        coord.drop_party(after, "b", coord.XclpStage.ROW_SUMS)
    alone = coord.Membership(("a", "b"), ("a",), 0)
    with pytest.raises(PeerDropped, match="no party is left") as err:
        coord.drop_party(alone, "a", coord.XclpStage.ROW_SUMS)
    assert err.value.dropped == frozenset({"a"})


def test_a_graph_with_a_missing_pair_names_the_dropped_parties() -> None:
    layout = coord.RowLayout(("a", "b"), (2, 3))
    own = {"a": (np.array([[1], [0]]), np.zeros((2, 1), np.uint16)),
           "b": (np.array([[1], [0], [0]]), np.zeros((3, 1), np.uint16))}
    graph = coord.NeighbourGraph(layout, own, L, GraphParams(k=1))
    with pytest.raises(PeerDropped) as err:
        graph.adjacency()
    assert err.value.dropped == frozenset({"a", "b"})
    block = np.ones((3, 2), np.uint16)
    # roles as they ran may differ from the reduced roster's schedule: either orientation is accepted
    graph.fold_pair("b", "a", block.T)
    assert graph.adjacency().shape == (5, 5)
    with pytest.raises(ProtocolError, match="already folded"):
        graph.fold_pair("a", "b", block)
    with pytest.raises(InvalidInput, match=r"shape \(3, 2\)"):
        coord.NeighbourGraph(layout, own, L, GraphParams(k=1)).fold_pair("a", "b", block.T)
    with pytest.raises(OutOfRange):
        coord.NeighbourGraph(layout, own, L, GraphParams(k=1)).fold_pair("a", "b", block + L)


def test_drop_names_unknown_stage_or_party_helpfully() -> None:
    with pytest.raises(InvalidInput, match="secure_hamming"):
        run_xclp_inprocess(dataset(), C, seed=SEED, L=L, drop={"party-b": "hamming"})
    with pytest.raises(InvalidInput, match="unknown party 'party-z'"):
        run_xclp_inprocess(dataset(), C, seed=SEED, L=L, drop={"party-z": "setup"})


# ---- SecureRowSums (Scott et al. 2023 §3.2) ---------------------------------------------------------------


def fixed_maskers(ids: tuple[str, ...], seed: int) -> dict[str, PairwiseMasker]:
    """Deterministic maskers (seeded pairwise secrets) so the statistical test is reproducible."""
    rng = np.random.default_rng(seed)
    secrets = {frozenset(p): rng.bytes(32) for p in [(a, b) for a in ids for b in ids if a < b]}
    return {
        me: PairwiseMasker(me, {o: secrets[frozenset((me, o))] for o in ids if o != me}, b"session")
        for me in ids
    }


def test_rowsums_payloads_look_uniform_while_the_sum_is_exact() -> None:
    ids = ("a", "b", "c")
    graph_rows = (("a", 300), ("b", 200), ("c", 250))
    n, classes = 750, 4
    rng = np.random.default_rng(11)
    # worst case for hiding: sparse, small, mostly-zero scores
    zbars = {p: np.where(rng.random((n, classes)) < 0.1, rng.random((n, classes)), 0.0) for p in ids}
    maskers = fixed_maskers(ids, seed=5)
    fp = FixedPoint()
    masked = {p: party.mask_row_sums(zbars[p], graph_rows, maskers[p], participants=ids, attempt=0) for p in ids}
    for p in ids:
        words = masked[p].payload.reshape(-1)
        as_bytes = words.view(np.uint8)
        counts = np.bincount(as_bytes, minlength=256)
        assert stats.chisquare(counts).pvalue > 1e-3, p
        bit_ones = ((words[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).sum(axis=0)
        # every bit position is a fair coin: two-sided binomial z-scores, Bonferroni over 64 positions
        z = (bit_ones - words.size / 2) / math.sqrt(words.size / 4)
        assert np.abs(z).max() < stats.norm.isf(1e-3 / 128), p
    frame = coord.rowsums_frame(coord.RowLayout(ids, (300, 200, 250)), ids)
    sums = coord.sum_row_sums(frame, {p: m.payload for p, m in masked.items()}, classes)
    exact = sum(fp.encode(zbars[p], n_terms=3).view(np.int64).astype(object) for p in ids)  # no wrap
    for p in ids:
        rows = frame.rows(p)
        got = (sums[p] + masked[p].kept).view(np.int64).astype(object)
        assert np.array_equal(got, exact[rows]), p  # bit-exact integer sum
        np.testing.assert_allclose(party.unmask_row_sums(sums[p], masked[p].kept), sum(zbars.values())[rows], atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    leave=st.sets(st.integers(0, 4)),
    classes=st.integers(2, 4),
    rnd=st.integers(0, 3),
    data=st.data(),
)
def test_masks_cancel_and_every_participant_reads_its_exact_rows(
    sizes: list[int], leave: set[int], classes: int, rnd: int, data: st.DataObject
) -> None:
    ids = tuple(f"p{i}" for i in range(len(sizes)))
    graph_rows = tuple(zip(ids, sizes))
    participants = tuple(p for i, p in enumerate(ids) if i not in leave) or ids[:1]
    n = sum(sizes)
    values = st.floats(-1e3, 1e3, allow_nan=False)
    zbars = {p: np.array(data.draw(st.lists(values, min_size=n * classes, max_size=n * classes))).reshape(n, classes)
             for p in participants}
    maskers = fixed_maskers(ids, seed=len(sizes) + 100 * rnd)
    masked = {p: party.mask_row_sums(zbars[p], graph_rows, maskers[p], participants=participants, attempt=rnd)
              for p in participants}
    frame = coord.rowsums_frame(coord.RowLayout(ids, tuple(sizes)), participants)
    sums = coord.sum_row_sums(frame, {p: m.payload for p, m in masked.items()}, classes)
    fp = FixedPoint()
    exact = sum(fp.encode(zbars[p], n_terms=len(participants)).view(np.int64).astype(object) for p in participants)
    offsets = dict(zip(ids, np.cumsum([0, *sizes])))
    for p in participants:
        got = (sums[p] + masked[p].kept).view(np.int64).astype(object)
        rows = slice(int(offsets[p]), int(offsets[p]) + dict(graph_rows)[p])
        assert np.array_equal(got, exact[rows])


def test_rowsums_block_is_still_masked_without_the_owners_kept_rows() -> None:
    ids = ("a", "b")
    graph_rows = (("a", 50), ("b", 50))
    maskers = fixed_maskers(ids, seed=6)
    zero = np.zeros((100, 2))
    masked = {p: party.mask_row_sums(zero, graph_rows, maskers[p], participants=ids, attempt=0) for p in ids}
    sums = coord.sum_row_sums(coord.RowLayout(ids, (50, 50)), {p: m.payload for p, m in masked.items()}, 2)
    # the coordinator's block for a is b's masked rows: far from the all-zero answer
    assert np.count_nonzero(sums["a"]) >= 95
    np.testing.assert_array_equal(party.unmask_row_sums(sums["a"], masked["a"].kept), np.zeros((50, 2)))


def test_replay_of_a_rowsums_attempt_is_refused() -> None:
    ids = ("a", "b", "c")
    graph_rows = (("a", 3), ("b", 3), ("c", 3))
    masker = fixed_maskers(ids, seed=8)["a"]
    Z = np.ones((9, 2))
    party.mask_row_sums(Z, graph_rows, masker, participants=ids, attempt=0)
    with pytest.raises(ReplayRefused, match="new attempt"):
        party.mask_row_sums(Z, graph_rows, masker, participants=ids, attempt=0)
    party.mask_row_sums(Z, graph_rows, masker, participants=ids, attempt=1)  # a restart is fine
    party.mask_row_sums(Z, graph_rows, masker, participants=("a", "c"), attempt=1)  # so is a smaller set


def test_sum_row_sums_refuses_bad_contributions() -> None:
    frame = coord.RowLayout(("a", "b"), (2, 3))
    good = {"a": np.zeros((3, 2), np.uint64), "b": np.zeros((2, 2), np.uint64)}
    with pytest.raises(PeerDropped) as err:
        coord.sum_row_sums(frame, {"a": good["a"]}, 2)
    assert err.value.dropped == frozenset({"b"})
    with pytest.raises(InvalidInput, match=r"'a' must be uint64\[3, 2\]"):
        coord.sum_row_sums(frame, {**good, "a": np.zeros((5, 2), np.uint64)}, 2)
    with pytest.raises(ProtocolError, match="non-participants"):
        coord.sum_row_sums(frame, {**good, "z": np.zeros((5, 2), np.uint64)}, 2)
    with pytest.raises(InvalidInput, match="uint64"):
        party.unmask_row_sums(np.zeros((2, 2), np.int64), np.zeros((2, 2), np.uint64))


# ---- SecureHamming roles and the coordinator's checks (docs/design.md §5.2-5.3) ----------------------------


@pytest.mark.parametrize("n_parties", range(2, 9))
def test_secure_hamming_pairs_cover_every_pair_once_with_balanced_roles(n_parties: int) -> None:
    ids = [f"p{i}" for i in range(n_parties)]
    pairs = coord.secure_hamming_pairs(list(reversed(ids)))
    assert sorted(tuple(sorted((t.a, t.b))) for t in pairs) == [(a, b) for a in ids for b in ids if a < b]
    as_a = {p: sum(t.a == p for t in pairs) for p in ids}
    assert set(as_a.values()) <= {(n_parties - 1) // 2, n_parties // 2}


def _masked_block(H: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """t and R as they travel (uint8[⌈n_a/K⌉·n_b, |N|/8]) for one batch of H uint[n_b, n_a] (n_a <= K)."""
    w, width = L.bit_length(), n.bit_length() // 8
    packed = [sum(int(h) << (w * s) for s, h in enumerate(row)) for row in H]
    masks = [int.from_bytes(rng.bytes(width), "big") % n for _ in packed]
    t = [(p + m) % n for p, m in zip(packed, masks)]
    as_rows = lambda vals: np.frombuffer(b"".join(v.to_bytes(width, "big") for v in vals), np.uint8).reshape(-1, width)  # noqa: E731
    return as_rows(t), as_rows(masks)


def test_cross_block_unmasks_mod_N_and_refuses_values_outside_0_L() -> None:
    n = 2**511 + 2**300 + 111  # any 512-bit odd modulus: the coordinator only computes mod N
    rng = np.random.default_rng(4)
    H = np.array([[0, 64, 17], [5, 1, 63]])
    t, r = _masked_block(H, n, rng)
    assert t.shape == (2, 64) and t.dtype == np.uint8  # one 512-bit value per (batch, B row)
    np.testing.assert_array_equal(coord.cross_block(t, r, n, 3, 2, L), H)
    bad_t, _ = _masked_block(np.array([[0, 65, 17], [5, 1, 63]]), n, np.random.default_rng(4))  # same R
    with pytest.raises(OutOfRange, match=r"outside \[0, 64\]"):
        coord.cross_block(bad_t, r, n, 3, 2, L)
    with pytest.raises(OutOfRange):  # a 4th slot would be padding for n_a = 3
        coord.cross_block(*_masked_block(np.array([[0, 1, 2, 3], [1, 1, 1, 1]]), n, rng), n, 3, 2, L)
    with pytest.raises(InvalidInput, match=r"uint8\[2, 64\]"):
        coord.cross_block(t[:1].copy(), r, n, 3, 2, L)
    with pytest.raises(InvalidInput, match=r"uint8\[2, 64\]"):
        coord.cross_block(t.view(np.uint64), r, n, 3, 2, L)
    with pytest.raises(InvalidInput, match=r"uint8\[2, 128\]"):  # A's N fixes the width of t and R
        coord.cross_block(t, r, 2**1023 + 1, 3, 2, L)


def test_own_nearest_rows_checks() -> None:
    ok = np.array([[[1, 3], [2, 5]], [[0, 3], [2, 4]], [[1, 4], [0, 5]]], np.uint32)  # 3 rows, k = 2
    candidates, distances = coord.check_own_neighbours(ok, 3, 2, L)
    assert candidates.dtype == np.int64 and distances.dtype == np.uint16
    assert coord.check_own_neighbours(ok[:, :1], 3, 1, L)[0].shape == (3, 1)
    assert coord.check_own_neighbours(ok, 3, 5, L)[0].shape == (3, 2)  # k' = min(k, n − 1): k = 5 asks the same
    with pytest.raises(InvalidInput, match=r"uint32\[3, 1, 2\]"):
        coord.check_own_neighbours(ok, 3, 1, L)
    with pytest.raises(InvalidInput, match=r"uint32\[4, 2, 2\]"):
        coord.check_own_neighbours(ok, 4, 2, L)
    bad = ok.copy()
    bad[0, 0, 1] = L + 1
    with pytest.raises(OutOfRange):
        coord.check_own_neighbours(bad, 3, 2, L)
    bad = ok.copy()
    bad[1, 0, 0] = 1
    with pytest.raises(InvalidInput, match="not name the row itself"):
        coord.check_own_neighbours(bad, 3, 2, L)
    bad = ok.copy()
    bad[0, 1, 0] = 1
    with pytest.raises(InvalidInput, match="distinct"):
        coord.check_own_neighbours(bad, 3, 2, L)
    bad = ok.copy()
    bad[0, 1, 0] = 3
    with pytest.raises(InvalidInput, match=r"0\.\.2"):
        coord.check_own_neighbours(bad, 3, 2, L)


def test_evaluate_refuses_slices_for_another_row_count() -> None:
    keypair = PaillierKeypair.generate(KEY_BITS, allow_insecure_test_size=True)
    codes = party.lsh_step(dataset()["party-a"][0][:4], SEED, L)
    slices = party.hamming_encrypt(keypair, codes, L)
    with pytest.raises(ProtocolError, match="n_A=4"):
        party.hamming_evaluate(keypair.public, slices, codes, L, n_a=5)
    with pytest.raises(ProtocolError):
        party.hamming_evaluate(keypair.public, slices[:-1], codes, L, n_a=4)


def test_select_influence_picks_labeled_columns_with_hidden_mask() -> None:
    y = np.array([-1, 2, -1, 0])
    S = np.arange(20.0).reshape(5, 4)
    np.testing.assert_array_equal(party.select_influence(S, y, C, hide_label_mask=True), S[:, [1, 3]])
    np.testing.assert_array_equal(party.select_influence(S[:, :2], y, C, hide_label_mask=False), S[:, :2])
    with pytest.raises(InvalidInput, match=r"float64\[n, 2\]"):
        party.select_influence(S, y, C, hide_label_mask=False)


# ---- what a curious party can solve for (docs/design.md §5.5) ---------------------------------------------


def test_a_curious_party_cannot_solve_its_outputs_for_another_partys_labels() -> None:
    """Attack (labels leak to peers): party a knows the influence columns of its labeled rows,
    S[:, L_a], so by symmetry the rows S[L_a, :]. Given Z for its labeled rows it could subtract its
    own part and solve Z[L_a] − S[L_a, L_a]·Y_a = S[L_a, L_b]·Y_b for b's labels. Here b labels all its
    rows and a has more labeled rows than b has rows, so with Z[L_a] the solve is exact; the
    coordinator now returns Z only for a's unlabeled rows, and a's outputs on L_a are its own labels."""
    rng = np.random.default_rng(3)
    centres = rng.normal(scale=3.0, size=(C, 10))
    y = {"a": rng.integers(0, C, size=70), "b": rng.integers(0, C, size=25)}
    X = {p: centres[y[p]] + rng.normal(size=(y[p].size, 10)) for p in y}
    seen_a = np.where(np.arange(70) < 45, y["a"], -1)  # 45 labeled rows > b's 25 rows
    parties = {"a": (X["a"], seen_a), "b": (X["b"], y["b"])}
    result = run_xclp_inprocess(parties, C, seed=SEED, L=L, key_bits=KEY_BITS, params=PARAMS, insecure_test_keys=True)
    L_a = np.flatnonzero(seen_a >= 0)
    block = coord.influence_blocks(result.W, result.layout, ("a", "b"), PARAMS,
                                   labeled={"a": L_a, "b": np.arange(25)})["a"]  # what a received: S[:, L_a]
    S_La = block.T  # S symmetric: the rows of a's labeled rows, over a's 70 then b's 25 graph rows
    Y_a = np.eye(C)[seen_a[L_a]]

    def attack(Z_La: np.ndarray) -> float:
        rhs = Z_La - S_La[:, L_a] @ Y_a
        Y_b, *_ = np.linalg.lstsq(S_La[:, 70:], rhs, rcond=None)
        return float(np.mean(np.argmax(Y_b, axis=1) == y["b"]))

    ref = xclp_reference([parties["a"], parties["b"]], SEED, C, L, PARAMS)
    assert attack(ref.scores[ref.party_rows(0)][L_a]) == 1.0  # what a party given Z[L_a] would recover
    out = result.outputs["a"].scores
    np.testing.assert_array_equal(out[L_a], Y_a)  # a gets its own labels back on L_a, nothing else
    assert attack(out[L_a]) < 0.6  # chance level (measured 0.28 here)
