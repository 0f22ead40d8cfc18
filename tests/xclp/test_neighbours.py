"""The kNN graph folded block by block (xclp/neighbours.py, docs/design.md §10.1) against the dense graph of
`xclp.graph.knn_adjacency` on the whole H: exactly equal, ties included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xclp.errors import InvalidInput
from xclp.graph import GraphParams, knn_adjacency, similarity
from xclp.hamming import hamming_matrix
from xclp.lsh import pack_bits
from xclp.neighbours import TopK, own_top_k


def codes(seed: int, n: int, lsh_bits: int, pool: int | None = None) -> np.ndarray:
    """n codes; with `pool`, each a copy of one of `pool` shared codes (seed 0), so distances tie a lot."""
    rng = np.random.default_rng(seed)
    if pool is None:
        return pack_bits(rng.integers(0, 2, size=(n, lsh_bits), dtype=np.uint8))
    shared = np.random.default_rng(0).integers(0, 2, size=(pool, lsh_bits), dtype=np.uint8)
    return pack_bits(shared[rng.integers(0, pool, size=n)])


def folded(parts: list[np.ndarray], lsh_bits: int, params: GraphParams, *, block_rows: int | None = None):
    """W as the coordinator builds it: each party's own top-k, then every cross block (both ways)."""
    sizes = [len(p) for p in parts]
    starts = np.cumsum([0, *sizes])
    top = TopK(int(starts[-1]), lsh_bits, params)
    for j, own in enumerate(parts):
        cand, dist = own_top_k(own, lsh_bits, params)
        top.fold_lists(slice(starts[j], starts[j + 1]), cand.astype(np.int64) + starts[j], dist)
    for a in range(len(parts)):
        for b in range(a + 1, len(parts)):
            block = hamming_matrix(parts[b], parts[a])  # H[b rows, a rows], as a pair is unmasked
            ra, rb = slice(starts[a], starts[a + 1]), slice(starts[b], starts[b + 1])
            step = block_rows or block.shape[0]
            for s in range(0, block.shape[0], step):  # in row pieces, as they arrive
                piece = slice(rb.start + s, min(rb.stop, rb.start + s + step))
                top.fold_block(piece, ra, block[s : s + step])
            top.fold_block(ra, rb, block.T)
    return top.adjacency()


def assert_same(W, ref) -> None:
    assert W.shape == ref.shape
    np.testing.assert_array_equal(W.indptr, ref.indptr)
    np.testing.assert_array_equal(W.indices, ref.indices)
    np.testing.assert_array_equal(W.data, ref.data)  # bit for bit


@pytest.mark.parametrize("pool", [4, None], ids=["ties", "random"])
def test_the_folded_graph_is_the_dense_graph_ties_included(pool: int | None) -> None:
    """90 rows drawn from 4 shared codes: at most 4 distinct distances per row, so nearly every pick
    is a tie the smaller index must win."""
    lsh_bits = 64
    parts = [codes(i, n, lsh_bits, pool) for i, n in enumerate((30, 25, 35))]
    params = GraphParams(k=6, power=3)
    ref = knn_adjacency(hamming_matrix(np.vstack(parts)), lsh_bits, params)
    assert_same(folded(parts, lsh_bits, params, block_rows=7), ref)
    assert ref.nnz > 0


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 12), min_size=2, max_size=4), k=st.integers(1, 6),
       lsh_bits=st.sampled_from([64, 128]), power=st.sampled_from([1, 3, 0.5]), pool=st.sampled_from([2, 5, None]),
       seed=st.integers(0, 2**16))
def test_any_partition_into_parties_gives_the_dense_graph(sizes, k, lsh_bits, power, pool, seed) -> None:
    n = sum(sizes)
    if k >= n:
        return
    parts = [codes(seed + i, m, lsh_bits, pool) for i, m in enumerate(sizes)]
    params = GraphParams(k=k, power=power)
    assert_same(folded(parts, lsh_bits, params), knn_adjacency(hamming_matrix(np.vstack(parts)), lsh_bits, params))


def test_a_partys_own_top_k_is_its_k_nearest_rows_by_the_graphs_rule() -> None:
    own = codes(5, 40, 64, pool=6)
    cand, dist = own_top_k(own, 64, GraphParams(k=4))
    H = hamming_matrix(own)
    sim = similarity(H, 64, 3)
    assert cand.shape == dist.shape == (40, 4) and cand.dtype == np.uint32
    for i in range(40):
        order = sorted((-sim[i, j], j) for j in range(40) if j != i)[:4]  # similarity, then index
        assert [int(c) for c in cand[i]] == [j for _, j in order]
        np.testing.assert_array_equal(dist[i], H[i, cand[i]])
    small_cand, _ = own_top_k(own[:3], 64, GraphParams(k=10))  # fewer own rows than k: all the others
    assert small_cand.shape == (3, 2)
    assert own_top_k(own[:1], 64, GraphParams(k=10))[0].shape == (1, 0)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 40), k=st.integers(1, 12), lsh_bits=st.sampled_from([64, 128]),
       power=st.sampled_from([1, 3, 0.5, 2.5]), pool=st.sampled_from([2, 5, None]), seed=st.integers(0, 2**16))
def test_own_top_k_in_one_pass_picks_what_the_similarities_pick(n, k, lsh_bits, power, pool, seed) -> None:
    """The one-pass kernel orders candidates by their distance's rank among the similarities
    (xclp.neighbours.similarity_ranks), never by a similarity it computes: the same picks, in the
    same order, as sorting max(cos(π·d/L), 0)^p itself, ties (shared codes, and every distance past
    L/2, whose similarity is 0) to the smaller row."""
    own = codes(seed, n, lsh_bits, pool)
    cand, dist = own_top_k(own, lsh_bits, GraphParams(k=k, power=power))
    H = hamming_matrix(own)
    sim = similarity(H, lsh_bits, power)
    kk = min(k, n - 1)
    assert cand.shape == dist.shape == (n, kk)
    for i in range(n):
        order = sorted((-sim[i, j], j) for j in range(n) if j != i)[:kk]
        assert [int(c) for c in cand[i]] == [j for _, j in order]
        np.testing.assert_array_equal(dist[i], H[i, cand[i]])


def test_candidate_lists_are_checked() -> None:
    top = TopK(10, 64, GraphParams(k=2))
    with pytest.raises(InvalidInput, match="never its own neighbour"):
        top.fold_lists(slice(0, 2), np.array([[1, 0], [0, 2]]), np.zeros((2, 2), np.uint16))
    with pytest.raises(InvalidInput, match="distinct"):
        top.fold_lists(slice(0, 1), np.array([[3, 3]]), np.zeros((1, 2), np.uint16))
    with pytest.raises(InvalidInput, match=r"lie in 0\.\.9"):
        top.fold_lists(slice(0, 1), np.array([[3, 10]]), np.zeros((1, 2), np.uint16))
    with pytest.raises(InvalidInput, match="must not overlap"):
        top.fold_block(slice(0, 4), slice(2, 6), np.zeros((4, 4), np.uint16))
    with pytest.raises(InvalidInput, match="needs more than k rows"):
        TopK(3, 64, GraphParams(k=3))
