"""xclp.dbcl: sketched forward and backward against finite differences and the unsketched network."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xclp.dbcl import (
    RoundView,
    ServerOptimiser,
    client_gradient,
    draw_sketches,
    pack,
    server_step,
    sketch_sizes,
    unsketch_gradient,
    view_size,
)
from xclp.errors import ConfigError, InvalidInput
from xclp.nn import Architecture, Network
from xclp.v1.dbcl import DbclJobParams
from xclp.v1.registry import parse_params


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["countsketch", "uniform"]))
def test_sketched_gradients_match_finite_differences(seed: int, kind: str) -> None:
    rng = np.random.default_rng(seed)
    net = Network.init(Architecture((6, 5, 3)), rng)
    net.flat += rng.normal(0, 0.1, net.arch.n_params)
    view = RoundView.release(net, draw_sketches(net.arch, [0, 1], kind, {0: 3, 1: 2}, seed.to_bytes(8, "big")))
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
        sketches = draw_sketches(net.arch, [0, 1], "countsketch", {0: 5, 1: 4}, k.to_bytes(4, "big"))
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
        S = draw_sketches(Architecture((8, 3, 2)), [0], "countsketch", {0: 4},
                          k.to_bytes(4, "big"))[0]
        total += S.left(S.transpose_left(G))
    # entry (i, j) is G_ij plus Σ_{k≠i} σ_iσ_k[h(i) = h(k)] G_kj: mean 0, variance <= Σ_k G_kj² / s
    stderr = np.sqrt((G ** 2).sum(axis=0).max() / 4 / draws)
    assert np.max(np.abs(total / draws - G)) < 5 * stderr


# --- a round of the dbcl job ------------------------------------------------------------------


def _net(sizes: tuple[int, ...], seed: int = 0) -> Network:
    return Network.init(Architecture(sizes), np.random.default_rng(seed))


def test_sketch_sizes_default_to_half_the_inputs_and_refuse_what_does_not_exist() -> None:
    arch = Architecture((64, 31, 10))
    assert sketch_sizes(arch, [0, 1], 0.5) == {0: 32, 1: 16}
    assert sketch_sizes(arch, [0], 0.25) == {0: 16}
    assert sketch_sizes(arch, [1], 0.01) == {1: 1}
    assert view_size(arch, {0: 32}) == 32 * 31 + 31 + 31 * 10 + 10
    with pytest.raises(InvalidInput, match="layer 2 does not exist"):
        sketch_sizes(arch, [2], 0.5)
    with pytest.raises(InvalidInput, match=r"ratio s/d must be in \(0, 1\]"):
        sketch_sizes(arch, [0], 0.0)


def test_the_released_vector_round_trips_and_a_wrong_one_is_refused() -> None:
    net = _net((6, 5, 3))
    sketches = draw_sketches(net.arch, [0], "countsketch", {0: 3}, b"s")
    view = RoundView.release(net, sketches)
    flat = view.flat()
    assert flat.shape == (view_size(net.arch, {0: 3}),) == (view.size,)
    again = RoundView.from_flat(net.arch, sketches, flat)
    for a, b in zip(again.weights + again.biases, view.weights + view.biases):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(InvalidInput, match=r"float64\["):
        RoundView.from_flat(net.arch, sketches, flat[:-1])
    bad = flat.copy()
    bad[0] = np.nan
    with pytest.raises(InvalidInput, match="NaN"):
        RoundView.from_flat(net.arch, sketches, bad)


def test_federated_round_equals_one_step_on_the_pooled_batch() -> None:
    """Unsketched: two parties' Σ b_i ∂ℓ_i over Σ b_i is the mean gradient of the union of their
    batches, so the coordinator's SGD step equals a pooled step, whatever the batch sizes."""
    rng = np.random.default_rng(5)
    net = _net((4, 6, 3), 1)
    X1, y1 = rng.normal(size=(9, 4)), rng.integers(0, 3, 9)
    X2, y2 = rng.normal(size=(5, 4)), rng.integers(0, 3, 5)
    view = RoundView.release(net, {})
    g1, b1 = client_gradient(view, X1, y1, 9, 1, 0.1, np.random.default_rng(0))
    g2, b2 = client_gradient(view, X2, y2, 9, 1, 0.1, np.random.default_rng(0))
    assert (b1, b2) == (9, 5)
    stepped = server_step(net, {}, g1 + g2, b1 + b2, ServerOptimiser("sgd", 0.3))
    pooled = net.loss_and_grad(np.vstack([X1, X2]), np.concatenate([y1, y2]), np.ones(14))[1]
    np.testing.assert_allclose(stepped.flat, net.flat - 0.3 * pooled, atol=1e-12)


def test_local_steps_move_the_view_as_the_coordinator_would_move_w() -> None:
    """E = 2: the party's second batch is evaluated at Sᵀ(W − η S G̃₁), the released view of the
    network the coordinator would hold after the first step (W̃ −= η SᵀS G̃₁)."""
    rng = np.random.default_rng(8)
    net = _net((10, 6, 3), 2)
    sketches = draw_sketches(net.arch, [0, 1], "countsketch", {0: 4, 1: 3}, b"local")
    assert max(S.gram_diagonal().max() for S in sketches.values()) > 1  # SᵀS is not I here
    X, y = rng.normal(size=(12, 10)), rng.integers(0, 3, 12)
    total, b = client_gradient(RoundView.release(net, sketches), X, y, 5, 2, 0.2, np.random.default_rng(1))
    order = np.random.default_rng(1)
    labeled = np.arange(12)
    first, second = order.choice(labeled, 5, replace=False), order.choice(labeled, 5, replace=False)
    view = RoundView.release(net, sketches)
    _, dWs, dbs = view.loss_and_grad(X[first], y[first], np.ones(5))
    moved = Network(net.arch, net.flat - 0.2 * unsketch_gradient(net, sketches, dWs, dbs))
    _, dWs2, dbs2 = RoundView.release(moved, sketches).loss_and_grad(X[second], y[second], np.ones(5))
    np.testing.assert_allclose(total, 5 * (pack(dWs, dbs) + pack(dWs2, dbs2)), atol=1e-10)
    assert b == 5


def test_a_party_without_labeled_rows_contributes_nothing() -> None:
    net = _net((4, 3, 2))
    total, b = client_gradient(RoundView.release(net, {}), np.ones((3, 4)), np.full(3, -1), 8, 1, 0.1,
                               np.random.default_rng(0))
    assert b == 0 and not total.any()
    with pytest.raises(InvalidInput, match="no party trained"):
        server_step(net, {}, total, 0, ServerOptimiser())


def test_rmsprop_and_momentum_follow_their_definitions() -> None:
    net = _net((3, 2, 2))
    g1, g2 = np.linspace(-1, 1, net.arch.n_params), np.linspace(2, -0.5, net.arch.n_params)
    rms = ServerOptimiser("rmsprop", 0.01, decay=0.9)
    after = rms.step(rms.step(net, g1), g2)
    r1 = 0.1 * g1 ** 2
    r2 = 0.9 * r1 + 0.1 * g2 ** 2
    expected = net.flat - 0.01 * g1 / (np.sqrt(r1) + 1e-8) - 0.01 * g2 / (np.sqrt(r2) + 1e-8)
    np.testing.assert_allclose(after.flat, expected, rtol=1e-12)
    sgd = ServerOptimiser("sgd", 0.5, momentum=0.5)
    after = sgd.step(sgd.step(net, g1), g2)
    np.testing.assert_allclose(after.flat, net.flat - 0.5 * g1 - 0.5 * (0.5 * g1 + g2), rtol=1e-12)
    with pytest.raises(InvalidInput, match="optimiser must be one of sgd, rmsprop"):
        ServerOptimiser("adam")


def test_gram_diagonal_is_the_diagonal_of_sts() -> None:
    for kind in ("countsketch", "uniform"):
        S = draw_sketches(Architecture((9, 2, 2)), [0], kind, {0: 4}, b"g")[0]
        D = S.dense()
        np.testing.assert_allclose(np.diag(D.T @ D), S.gram_diagonal())
        np.testing.assert_allclose(D.T @ D, np.diag(S.gram_diagonal()), atol=1e-12)


@pytest.mark.parametrize("params, message", [
    ({"sketch": "gaussian"}, "sketch must be one of countsketch, uniform, none"),
    ({"optimiser": "adam"}, "optimiser must be one of sgd, rmsprop"),
    ({"sketch_ratio": 0}, r"ratio s/d must be in \(0, 1\]"),
    ({"sketch_ratio": 1.5}, r"ratio s/d must be in \(0, 1\]"),
    ({"sketched_layers": [2]}, r"sketched_layers must name distinct layers in 0..1"),
    ({"sketched_layers": [0, 0]}, "distinct layers"),
    ({"sketched_layers": "0"}, "list of layer numbers"),
    ({"rmsprop_decay": 1.0}, "RMSProp decay"),
    ({"learning_rate": 0}, "learning rate"),
    ({"local_steps": 0}, "'local_steps' must be an integer >= 1"),
    ({"withhold": True}, "unknown dbcl job parameter"),
])
def test_bad_dbcl_parameters_are_refused_with_the_reason(params: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_params("dbcl", {"n_classes": 3, **params})


def test_dbcl_params_default_to_every_layer_at_half_size_and_say_which_go_unsketched() -> None:
    """The output layer too, by default: the paper's setting leaves it unsketched, and a
    property probe reads it (README)."""
    p = DbclJobParams.parse({"n_classes": 4, "hidden": [20, 10]})
    assert p.layers == (0, 1, 2) and p.sizes(30) == {0: 15, 1: 10, 2: 5} and p.unsketched_layers == ()
    paper = DbclJobParams.parse({"n_classes": 4, "hidden": [20, 10], "sketched_layers": [0, 1]})
    assert paper.unsketched_layers == (2,)
    plain = DbclJobParams.parse({"n_classes": 4, "sketch": "none"})
    assert plain.layers == () and plain.unsketched_layers == (0, 1)
    assert DbclJobParams.parse({"n_classes": 4, "sketched_layers": [1]}).sizes(9) == {1: 32}
