"""xclp.nn: backward against finite differences, the flat parameter vector, training."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xclp.errors import InvalidInput
from xclp.nn import SGD, Architecture, Network, weighted_cross_entropy


def _loss(net: Network, X: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    return net.loss_and_grad(X, y, w)[0]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.integers(1, 6), min_size=1, max_size=3))
def test_gradient_matches_central_finite_differences(seed: int, hidden: list[int]) -> None:
    rng = np.random.default_rng(seed)
    arch = Architecture((4, *hidden, 3))
    net = Network.init(arch, rng)
    net.flat += rng.normal(0, 0.1, arch.n_params)  # nonzero biases, so ReLU kinks are unlikely at 0
    X = rng.normal(size=(7, 4))
    y = rng.integers(0, 3, 7)
    w = rng.uniform(0, 2, 7)
    _, grad = net.loss_and_grad(X, y, w)
    eps = 1e-6
    numeric = np.empty(arch.n_params)
    for i in range(arch.n_params):
        plus, minus = net.copy(), net.copy()
        plus.flat[i] += eps
        minus.flat[i] -= eps
        numeric[i] = (_loss(plus, X, y, w) - _loss(minus, X, y, w)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-7)


def test_cross_entropy_weights_scale_each_example() -> None:
    Z = np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    y = np.array([0, 2])
    one, _ = weighted_cross_entropy(Z[:1], y[:1], np.ones(1))
    two, _ = weighted_cross_entropy(Z[1:], y[1:], np.ones(1))
    both, G = weighted_cross_entropy(Z, y, np.array([1.0, 0.0]))
    assert both == pytest.approx(one / 2)  # the second example weighs nothing; the mean is over 2
    assert np.all(G[1] == 0)
    mixed, _ = weighted_cross_entropy(Z, y, np.array([0.5, 3.0]))
    assert mixed == pytest.approx((0.5 * one + 3.0 * two) / 2)
    assert one == pytest.approx(-np.log(np.exp(2) / (np.exp(2) + 1 + np.exp(-1))))


def test_flat_vector_round_trips_and_layers_are_views() -> None:
    arch = Architecture((5, 4, 3))
    net = Network.init(arch, np.random.default_rng(0))
    assert net.flat.shape == (5 * 4 + 4 + 4 * 3 + 3,) == (arch.n_params,)
    again = Network(arch, net.flat)
    for (W1, b1), (W2, b2) in zip(net.layers, again.layers):
        np.testing.assert_array_equal(W1, W2)
        np.testing.assert_array_equal(b1, b2)
    net.flat[0] = 123.0
    assert net.layers[0][0][0, 0] == 123.0
    assert again.layers[0][0][0, 0] != 123.0  # the constructor copies


def test_embed_is_the_last_hidden_layer() -> None:
    rng = np.random.default_rng(1)
    net = Network.init(Architecture((3, 6, 5, 2)), rng)
    X = rng.normal(size=(4, 3))
    H = net.embed(X)
    assert H.shape == (4, 5) and np.all(H >= 0)
    W, b = net.layers[-1]
    np.testing.assert_allclose(H @ W + b, net.forward(X)[0])


def test_sgd_learns_a_nonlinear_problem_and_is_reproducible() -> None:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(400, 2))
    y = ((X[:, 0] * X[:, 1]) > 0).astype(np.int64)  # XOR of the signs: no linear model does it
    arch = Architecture((2, 16, 2))
    start = Network.init(arch, np.random.default_rng(3))
    opt = SGD(learning_rate=0.2, momentum=0.9, batch=20, epochs=60)
    trained = opt.train(start, X, y, np.ones(400), np.random.default_rng(4))
    assert np.mean(trained.predict(X) == y) > 0.9
    assert np.mean(start.predict(X) == y) < 0.8
    again = opt.train(start, X, y, np.ones(400), np.random.default_rng(4))
    np.testing.assert_array_equal(trained.flat, again.flat)
    assert not np.array_equal(start.flat, trained.flat)  # training returns a copy


def test_zero_weights_leave_the_model_unchanged() -> None:
    net = Network.init(Architecture((2, 3, 2)), np.random.default_rng(0))
    out = SGD().train(net, np.ones((5, 2)), np.zeros(5, dtype=np.int64), np.zeros(5), np.random.default_rng(0))
    np.testing.assert_array_equal(out.flat, net.flat)


@pytest.mark.parametrize("sizes, message", [
    ((3, 2), "at least one hidden layer"),
    ((3, 0, 2), "1.."),
    ((3, 4, 1), "at least 2 classes"),
])
def test_bad_architectures_are_refused(sizes: tuple[int, ...], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        Architecture(sizes)


def test_bad_training_input_is_refused() -> None:
    net = Network.init(Architecture((2, 3, 2)), np.random.default_rng(0))
    rng = np.random.default_rng(0)
    with pytest.raises(InvalidInput, match=r"float\[n, 2\]"):
        SGD().train(net, np.ones((4, 3)), np.zeros(4, dtype=np.int64), np.ones(4), rng)
    with pytest.raises(InvalidInput, match="labels must be in 0..1"):
        SGD().train(net, np.ones((4, 2)), np.full(4, 2), np.ones(4), rng)
    with pytest.raises(InvalidInput, match="weights"):
        SGD().train(net, np.ones((4, 2)), np.zeros(4, dtype=np.int64), -np.ones(4), rng)
    with pytest.raises(InvalidInput, match="NaN"):
        Network(net.arch, np.full(net.arch.n_params, np.nan))
    with pytest.raises(InvalidInput, match="diverged"):
        SGD(learning_rate=1e308).train(net, np.full((4, 2), 1e10), np.zeros(4, dtype=np.int64), np.ones(4), rng)
