"""Graph step: parameters, similarity, kNN selection with deterministic ties, normalisation, influence."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import xclp.graph as graph
from xclp.errors import InvalidInput
from xclp.graph import (
    SPARSE_FILL_MAX,
    GraphParams,
    InfluenceSolver,
    build_influence,
    influence_columns,
    knn_adjacency,
    normalise,
    similarity,
)
from xclp.hamming import hamming_matrix
from xclp.lsh import lsh_codes, lsh_projection


def random_H(seed: int, n: int, lsh_bits: int = 256) -> np.ndarray:
    X = np.random.default_rng(seed).standard_normal((n, 8))
    return hamming_matrix(lsh_codes(X, lsh_projection(seed, lsh_bits, 8)))


def naive_knn(H: np.ndarray, lsh_bits: int, params: GraphParams) -> np.ndarray:
    """Dense W by a per-row stable sort (ties to the smaller index), the definition in docs/design.md §5.4."""
    n = H.shape[0]
    A = similarity(H, lsh_bits, params.power)
    B = np.zeros((n, n))
    for i in range(n):
        others = [j for j in range(n) if j != i]
        ranked = sorted(others, key=lambda j: (-A[i, j], j))[: params.k]
        B[i, ranked] = A[i, ranked]
    W = B + B.T
    np.fill_diagonal(W, 0.0)
    return W


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"k": 0}, "k"),
        ({"k": 2.5}, "k"),
        ({"alpha": 1.0}, "alpha"),
        ({"alpha": 0.0}, "alpha"),
        ({"power": 0}, "power"),
        ({"power": float("nan")}, "power"),
    ],
)
def test_graph_params_validated(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        GraphParams(**kwargs)


def test_similarity_clips_negative_cosines_and_applies_power() -> None:
    H = np.array([0, 256, 512, 768, 1024])
    np.testing.assert_allclose(similarity(H, 1024, 3), [1.0, np.cos(np.pi / 4) ** 3, 0.0, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(similarity(H, 1024, 1), [1.0, np.cos(np.pi / 4), 0.0, 0.0, 0.0], atol=1e-15)


@pytest.mark.parametrize(("n", "k", "power"), [(12, 1, 3), (30, 4, 1), (40, 10, 3), (25, 24, 2)])
def test_knn_matches_naive_definition(n: int, k: int, power: float) -> None:
    H = random_H(n, n)
    params = GraphParams(k=k, power=power)
    np.testing.assert_allclose(knn_adjacency(H, 256, params).toarray(), naive_knn(H, 256, params), rtol=0, atol=0)


def test_knn_symmetric_zero_diagonal_and_k_respected() -> None:
    H = random_H(3, 60)
    params = GraphParams(k=5)
    W = knn_adjacency(H, 256, params)
    assert (abs(W - W.T)).max() == 0.0
    assert not W.diagonal().any()
    # Every row's own picks number at most k; symmetrisation only adds others' picks.
    A = similarity(H, 256, params.power)
    np.fill_diagonal(A, -np.inf)
    for i in range(H.shape[0]):
        row = W.getrow(i).toarray().ravel()
        assert np.count_nonzero(row) >= min(5, np.count_nonzero(A[i] > 0))
        threshold = np.sort(A[i])[-5]
        mine = np.flatnonzero(row)
        # Neighbours below this row's k-th best weight must have picked i themselves.
        for j in mine[A[i, mine] < threshold]:
            assert i in np.argsort(-A[j], kind="stable")[:5]


def test_ties_go_to_smaller_index() -> None:
    n = 8
    H = np.full((n, n), 100, dtype=np.uint16)  # every pair equally similar
    np.fill_diagonal(H, 0)
    W = knn_adjacency(H, 1024, GraphParams(k=2))
    B_rows = {i: set(np.flatnonzero(W.getrow(i).toarray().ravel())) for i in range(n)}
    # Row 0 picks {1, 2}, row 1 picks {0, 2}, every other row picks {0, 1}.
    assert B_rows[0] == set(range(1, n)) and B_rows[1] == {0} | set(range(2, n))
    assert all(B_rows[i] == {0, 1} for i in range(2, n))
    # Repeated calls are identical (no random tie-breaking).
    np.testing.assert_array_equal(W.toarray(), knn_adjacency(H, 1024, GraphParams(k=2)).toarray())


def test_row_blocking_does_not_change_result(monkeypatch: pytest.MonkeyPatch) -> None:
    H = random_H(9, 50)
    whole = knn_adjacency(H, 256, GraphParams(k=4)).toarray()
    monkeypatch.setattr(graph, "_SIM_BLOCK_ELEMENTS", 7 * 50)  # blocks of 7 rows
    np.testing.assert_array_equal(knn_adjacency(H, 256, GraphParams(k=4)).toarray(), whole)


def test_knn_refuses_bad_input() -> None:
    H = random_H(1, 5)
    with pytest.raises(InvalidInput, match="k = 5 .* n = 5"):
        knn_adjacency(H, 256, GraphParams(k=5))
    with pytest.raises(InvalidInput, match="square"):
        knn_adjacency(H[:4], 256, GraphParams(k=2))
    with pytest.raises(InvalidInput, match=r"\[0, L = 256\]"):
        knn_adjacency(H.astype(np.int32) + 300, 256, GraphParams(k=2))
    with pytest.raises(InvalidInput, match="multiple of 64"):
        knn_adjacency(H, 100, GraphParams(k=2))
    with pytest.raises(InvalidInput, match="integer"):
        knn_adjacency(H.astype(float), 256, GraphParams(k=2))


def test_normalise_by_hand() -> None:
    W = sp.csr_matrix(np.array([[0.0, 2.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    Wn = normalise(W).toarray()
    # degrees 2, 2, 0 -> 1: 2 / sqrt(2·2) = 1; the isolated node stays all zero.
    np.testing.assert_allclose(Wn, [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_dense_influence_solves_the_system() -> None:
    H = random_H(4, 40)
    Wn = normalise(knn_adjacency(H, 256, GraphParams(k=4)))
    labeled = np.array([0, 7, 39])
    S_L = influence_columns(Wn, labeled, 0.9, "dense")
    M = np.eye(40) - 0.9 * Wn.toarray()
    np.testing.assert_allclose(M @ S_L, np.eye(40)[:, labeled], atol=1e-12)
    assert np.all(S_L >= -1e-12)  # (I − α𝒲)^{-1} = Σ αᵗ𝒲ᵗ is entrywise non-negative


def test_dense_and_cg_agree_and_auto_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    H = random_H(6, 300)
    Wn = normalise(knn_adjacency(H, 256, GraphParams(k=10)))
    labeled = np.arange(0, 300, 7)
    dense = influence_columns(Wn, labeled, 0.99, "dense")
    cg = influence_columns(Wn, labeled, 0.99, "cg")
    np.testing.assert_allclose(cg, dense, rtol=0, atol=1e-8)
    sparse = influence_columns(Wn, labeled, 0.99, "sparse")
    np.testing.assert_allclose(sparse, dense, rtol=0, atol=1e-12)
    # auto = the sparse LU above the threshold: identical to the forced sparse run, other bits than dense
    auto = influence_columns(Wn, labeled, 0.99, dense_max_nodes=100)
    np.testing.assert_array_equal(auto, sparse)
    np.testing.assert_array_equal(influence_columns(Wn, labeled, 0.99), dense)
    # ... and CG when the LU's factors would pass fill_max times the matrix's nonzeros
    solver = InfluenceSolver(Wn, 0.99, dense_max_nodes=100, fill_max=1.5)
    np.testing.assert_array_equal(solver.solve(labeled), cg)
    assert solver.stats.method == "cg"
    roomy = InfluenceSolver(Wn, 0.99, dense_max_nodes=100)
    assert roomy.stats.method == "sparse" and 1.5 < roomy.stats.fill <= SPARSE_FILL_MAX


def test_the_sparse_lu_beats_cg_on_a_graph_of_real_data_and_forced_ignores_the_fill_bound() -> None:
    """The kNN graph of 2 000 points near a 3-d manifold in 10 dimensions (real data sits on few
    dimensions): the LU's factors hold a few times the matrix's nonzeros, and a forced "sparse"
    factorises whatever the fill."""
    rng = np.random.default_rng(3)
    X = np.tanh(rng.random((2000, 3)) @ rng.normal(size=(3, 10))) + 1.0 + 0.02 * rng.normal(size=(2000, 10))
    H = hamming_matrix(lsh_codes(X - X.mean(0), lsh_projection(3, 256, 10)))
    Wn = normalise(knn_adjacency(H, 256, GraphParams(k=10)))
    labeled = np.arange(0, 2000, 40)
    auto = InfluenceSolver(Wn, 0.99, dense_max_nodes=100)
    assert auto.stats.method == "sparse" and auto.stats.fill < SPARSE_FILL_MAX
    np.testing.assert_allclose(auto.solve(labeled), influence_columns(Wn, labeled, 0.99, "dense"), rtol=0, atol=1e-11)
    forced = InfluenceSolver(Wn, 0.99, "sparse", fill_max=1.5)
    assert forced.stats.method == "sparse" and forced.stats.fill > 1.5


def test_cg_handles_isolated_nodes() -> None:
    W = sp.csr_matrix(np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    S = influence_columns(normalise(W), np.array([0, 2]), 0.5, "cg")
    expected = np.linalg.solve(np.eye(3) - 0.5 * normalise(W).toarray(), np.eye(3)[:, [0, 2]])
    np.testing.assert_allclose(S, expected, atol=1e-12)


def test_influence_refuses_bad_input() -> None:
    Wn = normalise(knn_adjacency(random_H(2, 10), 256, GraphParams(k=3)))
    with pytest.raises(InvalidInput, match="no labeled rows"):
        influence_columns(Wn, np.array([], dtype=np.int64), 0.9)
    with pytest.raises(InvalidInput, match="0..9"):
        influence_columns(Wn, np.array([3, 10]), 0.9)
    with pytest.raises(InvalidInput, match="repeat"):
        influence_columns(Wn, np.array([3, 3]), 0.9)
    with pytest.raises(InvalidInput, match="method"):
        influence_columns(Wn, np.array([3]), 0.9, "inverse")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="symmetric"):
        influence_columns(sp.csr_matrix(np.triu(np.ones((3, 3)), 1)), np.array([0]), 0.9)
    with pytest.raises(InvalidInput, match="alpha"):
        influence_columns(Wn, np.array([3]), 1.0)


def test_build_influence_chains_the_steps() -> None:
    H = random_H(8, 30)
    params = GraphParams(k=3, alpha=0.95)
    result = build_influence(H, 256, np.array([1, 4, 20]), params)
    np.testing.assert_array_equal(result.W.toarray(), knn_adjacency(H, 256, params).toarray())
    np.testing.assert_array_equal(result.Wn.toarray(), normalise(result.W).toarray())
    np.testing.assert_array_equal(result.S_L, influence_columns(result.Wn, result.labeled, 0.95))
    np.testing.assert_array_equal(result.labeled, [1, 4, 20])


@pytest.mark.parametrize("method", ["dense", "sparse", "cg"])
def test_influence_in_column_blocks_equals_all_columns_at_once_and_reports_its_residual(method: str) -> None:
    """docs/design.md §10.2: S_L solved a few columns at a time (each block sent on and dropped) is the S_L
    of one solve, and the solver reports its iterations and its largest relative residual."""
    H = random_H(6, 300)
    Wn = normalise(knn_adjacency(H, 256, GraphParams(k=10)))
    labeled = np.arange(0, 300, 7)
    whole = influence_columns(Wn, labeled, 0.99, method)
    solver = InfluenceSolver(Wn, 0.99, method)
    blocks = [solver.solve(labeled[i : i + 9]) for i in range(0, labeled.size, 9)]
    np.testing.assert_allclose(np.hstack(blocks), whole, rtol=0, atol=1e-12)
    if method != "dense":  # each column's arithmetic is its own: the same bits in any block
        np.testing.assert_array_equal(np.hstack(blocks), whole)
    stats = solver.stats
    assert (stats.method, stats.columns, stats.blocks) == (method, labeled.size, 5) and stats.seconds > 0
    assert stats.as_dict()["seconds"] == round(stats.seconds, 3)
    assert stats.max_residual <= 1e-6 and (stats.iterations > 10 if method == "cg" else stats.iterations == 0)
    assert solver.solve(np.array([], np.int64)).shape == (300, 0)
    with pytest.raises(InvalidInput, match="alpha"):
        InfluenceSolver(Wn, 1.0)
