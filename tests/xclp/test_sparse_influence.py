"""Sparse influence (docs/design.md §10.7): the push against the exact solve on small graphs, its stated
bound (never above the exact column; the share of mass left out measured exactly), and the wire
form of its pieces (xclp.v1.influence)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tests.helpers import knn_graph
from xclp.errors import InvalidInput
from xclp.graph import GraphParams, PushSolver, influence_columns, influence_of, normalise
from xclp.propagation import label_matrix
from xclp.sparse_influence import SparseColumns, push_columns
from xclp.v1.influence import pack_pieces, unpack_piece
from xclp.v1.xclp import SPARSE_INFLUENCE_DTYPE

ALPHA = 0.99
F32 = 2.0**-23  # the values travel as float32: each within this relative rounding of the push's float64


def degrees(W: sp.csr_matrix) -> np.ndarray:
    d = np.asarray(W.sum(axis=1)).ravel()
    d[d == 0] = 1.0
    return d


@pytest.mark.parametrize("tolerance", [1e-3, 1e-4, 1e-6])
def test_the_push_is_below_the_exact_column_by_exactly_the_mass_it_reports(tolerance: float) -> None:
    W = knn_graph(300)
    columns = np.array([0, 17, 150, 299, 42])
    exact = influence_columns(normalise(W), columns, ALPHA, "dense")
    pushed = push_columns(W, columns, ALPHA, tolerance)
    got = pushed.dense()
    # never above the exact column (but for the float32 rounding of what it sends)
    assert np.all(got <= exact * (1 + F32) + 1e-300)
    # the degree-weighted mass left out is dropped·√d_l/(1 − α) of the column's √d_l/(1 − α), the
    # push's stated bound (to the float32 rounding of the values sent)
    root = np.sqrt(degrees(W))
    total = root[columns] / (1 - ALPHA)
    np.testing.assert_allclose(root @ exact, total, rtol=1e-9)
    assert np.all(np.abs(root @ (exact - got) - pushed.dropped * total) <= 2 * F32 * total)
    assert np.all((pushed.dropped >= 0) & (pushed.dropped <= 1))


def test_a_smaller_tolerance_leaves_out_less_and_reaches_the_exact_columns() -> None:
    W = knn_graph(200, seed=3)
    columns = np.arange(0, 200, 9)
    exact = influence_columns(normalise(W), columns, ALPHA, "dense")
    dropped, errors = [], []
    for tolerance in (1e-2, 1e-3, 1e-4, 1e-5, 1e-7, 1e-9):
        pushed = push_columns(W, columns, ALPHA, tolerance)
        dropped.append(pushed.dropped.max())
        errors.append(np.abs(exact - pushed.dense()).max())
    assert dropped == sorted(dropped, reverse=True) and errors == sorted(errors, reverse=True)
    assert dropped[-1] < 1e-4 and errors[-1] < 1e-5 * exact.max()


def test_every_class_of_zbar_keeps_all_but_the_largest_dropped_share_of_its_mass() -> None:
    W = knn_graph(240, seed=5)
    rng = np.random.default_rng(5)
    labeled = np.sort(rng.choice(240, 40, replace=False))
    Y = label_matrix(rng.integers(0, 3, 40), 3)
    exact = influence_columns(normalise(W), labeled, ALPHA, "dense") @ Y
    pushed = push_columns(W, labeled, ALPHA, 1e-4)
    zbar = pushed.matrix() @ Y
    root = np.sqrt(degrees(W))
    kept = (root @ zbar) / (root @ exact)
    assert np.all(kept >= 1 - pushed.dropped.max() - 1e-6)
    assert np.all(zbar <= exact * (1 + F32) + 1e-300)


def test_columns_are_the_same_in_any_block_and_order() -> None:
    W = knn_graph(150, seed=2)
    columns = np.array([5, 90, 3, 149, 60, 61])
    together = push_columns(W, columns, ALPHA, 1e-4)
    for j, c in enumerate(columns):
        alone = push_columns(W, np.array([c]), ALPHA, 1e-4)
        lo, hi = together.indptr[j], together.indptr[j + 1]
        assert np.array_equal(alone.indices, together.indices[lo:hi])
        assert np.array_equal(alone.values, together.values[lo:hi])
        assert alone.dropped[0] == together.dropped[j]


def test_an_isolated_row_keeps_its_own_unit_column_exactly() -> None:
    W = sp.lil_matrix((4, 4))
    W[0, 1] = W[1, 0] = 0.5
    W[1, 2] = W[2, 1] = 0.25
    pushed = push_columns(W.tocsr(), np.array([3, 0]), ALPHA, 1e-6)
    assert np.array_equal(pushed.dense()[:, 0], [0, 0, 0, 1]) and pushed.dropped[0] == 0.0
    exact = influence_columns(normalise(W.tocsr()), np.array([0]), ALPHA, "dense")[:, 0]
    assert pushed.dense()[3, 1] == 0.0 and np.all(pushed.dense()[:, 1] <= exact * (1 + F32))


def test_the_push_refuses_what_is_not_a_graph_or_a_tolerance() -> None:
    W = knn_graph(30)
    with pytest.raises(InvalidInput, match="tolerance must be in"):
        push_columns(W, np.array([0]), ALPHA, 0.0)
    with pytest.raises(InvalidInput, match="alpha must be strictly between"):
        push_columns(W, np.array([0]), 1.0, 1e-4)
    with pytest.raises(InvalidInput, match="non-negative weights"):
        push_columns(-W, np.array([0]), ALPHA, 1e-4)
    with pytest.raises(InvalidInput, match="row indices in 0..29"):
        push_columns(W, np.array([30]), ALPHA, 1e-4)


def test_the_solver_reports_what_it_left_out() -> None:
    W = knn_graph(120)
    solver = PushSolver(W, ALPHA, 1e-4)
    first, second = solver.solve(np.arange(10)), solver.solve(np.arange(10, 15))
    stats = solver.stats.as_dict()
    assert stats["method"] == "push" and stats["columns"] == 15 and stats["blocks"] == 2
    assert stats["nonzeros"] == first.indices.size + second.indices.size
    both = np.concatenate([first.dropped, second.dropped])
    assert stats["dropped_max"] == round(float(both.max()), 4)
    assert stats["dropped_mean"] == round(float(both.mean()), 4)


def test_the_reference_with_a_tolerance_is_the_push() -> None:
    W = knn_graph(100)
    labeled = np.array([1, 50, 99])
    ref = influence_of(W, labeled, GraphParams(alpha=ALPHA), tolerance=1e-4)
    assert np.array_equal(ref.S_L, push_columns(W, labeled, ALPHA, 1e-4).dense())


# --- the wire (xclp.v1.influence) ------------------------------------------------------------------


def pushed(n: int = 200, columns: int = 12) -> SparseColumns:
    return push_columns(knn_graph(n), np.arange(columns) * 3, ALPHA, 1e-4)


def test_pieces_carry_the_columns_exactly_within_the_piece_size() -> None:
    cols = pushed()
    pieces = list(pack_pieces(cols, piece_bytes=1024))
    assert len(pieces) > 2 and all(p.dtype == SPARSE_INFLUENCE_DTYPE for p in pieces)
    assert all(p.nbytes <= 1024 for p in pieces if p[0] > 1)  # a column larger than a piece travels alone
    back = [unpack_piece(p, cols.n, 1 / (1 - ALPHA)) for p in pieces]
    assert sum(b.columns for b in back) == cols.columns
    assert np.array_equal(np.hstack([b.dense() for b in back]), cols.dense())  # float32 values: no loss
    np.testing.assert_allclose(np.concatenate([b.dropped for b in back]), cols.dropped, rtol=F32)


def test_a_receiver_without_labeled_rows_gets_an_empty_piece() -> None:
    empty = unpack_piece(np.zeros(1, dtype=SPARSE_INFLUENCE_DTYPE), 10, 100.0)
    assert empty.columns == 0 and empty.dense().shape == (10, 0)


def malformed() -> list[tuple[str, object]]:
    good = next(pack_pieces(pushed(columns=3)))
    c = int(good[0])
    nnz = (good.size - 1 - 2 * c) // 2
    rows_at, values_at = 1 + 2 * c, 1 + 2 * c + nnz
    cases: list[tuple[str, object]] = [("a non-empty 1-D uint32", good.astype(np.uint64)),
                                       ("a non-empty 1-D uint32", good.reshape(1, -1)),
                                       ("a non-empty 1-D uint32", bytes(good)),
                                       ("cannot hold", good[:3]),
                                       ("must be", good[:-1])]
    swapped = good.copy()
    swapped[rows_at], swapped[rows_at + 1] = good[rows_at + 1], good[rows_at]
    cases.append(("ascend within each column", swapped))
    beyond = good.copy()
    beyond[rows_at] = 200
    cases.append(("beyond the graph's 200", beyond))
    for value in (-0.5, 0.0, 100.5, np.nan, np.inf):
        bad = good.copy()
        bad[values_at] = np.array([value], dtype="<f4").view(np.uint32)[0]
        cases.append(("values outside", bad))
    for share in (-0.1, 1.5, np.nan):
        bad = good.copy()
        bad[1 + c] = np.array([share], dtype="<f4").view(np.uint32)[0]
        cases.append(("dropped shares", bad))
    return cases


@pytest.mark.parametrize("match, payload", malformed())
def test_a_malformed_piece_is_refused_with_its_reason(match: str, payload: object) -> None:
    with pytest.raises(InvalidInput, match=match):
        unpack_piece(payload, 200, 1 / (1 - ALPHA))


def test_label_dp_calibrates_to_sparse_columns_as_to_the_same_columns_dense() -> None:
    """xclp.privacy.label_dp: the Skellam noise follows the largest column norms over the rows released;
    a sparse block gives the norms its dense form gives."""
    from xclp.privacy.label_dp import largest_columns

    cols = pushed(columns=7)
    for own in (slice(0, 50), slice(80, 200), slice(0, 0)):
        sparse_norms = largest_columns(cols.matrix(), own)
        dense_norms = largest_columns(cols.dense(), own)
        np.testing.assert_allclose(sparse_norms, dense_norms, rtol=1e-12)
    assert largest_columns(cols.matrix()[:, :0], slice(0, 10)) == (0.0, 0.0)
