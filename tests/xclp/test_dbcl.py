"""xclp.dbcl: sketched forward and backward against finite differences and the unsketched network."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from xclp.dbcl import RoundView, draw_sketches, unsketch_gradient
from xclp.nn import Architecture, Network


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["countsketch", "uniform"]))
def test_sketched_gradients_match_finite_differences(seed: int, kind: str) -> None:
    rng = np.random.default_rng(seed)
    net = Network.init(Architecture((6, 5, 3)), rng)
    net.flat += rng.normal(0, 0.1, net.arch.n_params)
    view = RoundView.release(net, draw_sketches(net, [0, 1], kind, {0: 3, 1: 2}, seed.to_bytes(8, "big")))
    X, y, w = rng.normal(size=(7, 6)), rng.integers(0, 3, 7), rng.uniform(0, 2, 7)
    _, dWs, dbs = view.loss_and_grad(X, y, w)
    eps = 1e-6
    for layer in (0, 1):
        for target, grad in ((view.weights[layer], dWs[layer]), (view.biases[layer], dbs[layer])):
            numeric = np.zeros_like(target)
            for idx in np.ndindex(target.shape):
                old = target[idx]
                target[idx] = old + eps
                up = view.loss_and_grad(X, y, w)[0]
                target[idx] = old - eps
                down = view.loss_and_grad(X, y, w)[0]
                target[idx] = old
                numeric[idx] = (up - down) / (2 * eps)
            np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-7)


def test_a_full_size_countsketch_changes_nothing() -> None:
    """With s = d a CountSketch is a signed permutation (S Sᵀ = I): the sketched round computes
    the network's own outputs, and S ∂ℓ/∂W̃ is the network's own gradient."""
    rng = np.random.default_rng(3)
    net = Network.init(Architecture((5, 4, 3)), rng)
    def permutation(k: int) -> dict:
        sketches = draw_sketches(net, [0, 1], "countsketch", {0: 5, 1: 4}, k.to_bytes(4, "big"))
        return sketches if all(len(set(S.column)) == S.d for S in sketches.values()) else {}

    sketches = next(s for s in map(permutation, range(10_000)) if s)  # a draw whose h is one-to-one
    view = RoundView.release(net, sketches)
    X, y, w = rng.normal(size=(6, 5)), rng.integers(0, 3, 6), np.ones(6)
    np.testing.assert_allclose(view.forward(X)[0], net.forward(X)[0], atol=1e-12)
    _, dWs, dbs = view.loss_and_grad(X, y, w)
    np.testing.assert_allclose(unsketch_gradient(net, sketches, dWs, dbs), net.loss_and_grad(X, y, w)[1], atol=1e-12)


def test_unsketched_gradient_is_unbiased_for_the_first_layer_in_expectation() -> None:
    """E over sketches of S Sᵀ G is G: the update mapped back from a sketch is unbiased (E[S Sᵀ] = I)."""
    rng = np.random.default_rng(4)
    G = rng.normal(size=(8, 3))
    total = np.zeros_like(G)
    draws = 3000
    for k in range(draws):
        S = draw_sketches(Network.init(Architecture((8, 3, 2)), rng), [0], "countsketch", {0: 4},
                          k.to_bytes(4, "big"))[0]
        total += S.left(S.transpose_left(G))
    # entry (i, j) is G_ij plus Σ_{k≠i} σ_iσ_k[h(i) = h(k)] G_kj: mean 0, variance <= Σ_k G_kj² / s
    stderr = np.sqrt((G ** 2).sum(axis=0).max() / 4 / draws)
    assert np.max(np.abs(total / draws - G)) < 5 * stderr
