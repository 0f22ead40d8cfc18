"""xclp.sketch: applying S agrees with the dense matrix, and E[S Sᵀ] = I."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xclp.errors import InvalidInput
from xclp.sketch import KINDS, Sketch


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(KINDS), st.integers(1, 30), st.data())
def test_applying_the_sketch_equals_the_dense_matrix(kind: str, d: int, data: st.DataObject) -> None:
    s = data.draw(st.integers(1, d))
    seed = data.draw(st.integers(0, 2**32))
    S = Sketch.draw(kind, d, s, seed)
    dense = S.dense()
    rng = np.random.default_rng(seed)
    X, W, G = rng.normal(size=(5, d)), rng.normal(size=(d, 3)), rng.normal(size=(s, 3))
    np.testing.assert_allclose(S.right(X), X @ dense, atol=1e-12)
    np.testing.assert_allclose(S.transpose_left(W), dense.T @ W, atol=1e-12)
    np.testing.assert_allclose(S.left(G), dense @ G, atol=1e-12)
    if kind == "countsketch":
        assert np.all(np.count_nonzero(dense, axis=1) == 1) and set(np.unique(dense[dense != 0])) <= {-1.0, 1.0}
    else:
        assert np.count_nonzero(dense) == s


@pytest.mark.parametrize("kind", KINDS)
def test_the_expected_outer_product_is_the_identity(kind: str) -> None:
    d, s, draws = 12, 4, 4000
    total = np.zeros((d, d))
    for seed in range(draws):
        dense = Sketch.draw(kind, d, s, seed).dense()
        total += dense @ dense.T
    mean = total / draws
    # each entry is a mean of `draws` bounded terms; 5 standard errors of the worst entry
    bound = 5 * np.sqrt((d / s) ** 2 / draws)
    assert np.max(np.abs(mean - np.eye(d))) < bound


def test_a_biased_sketch_fails_the_identity_check() -> None:
    """The statistical check can fail: signs that are not random leave E[S Sᵀ] ≠ I."""
    d, s, draws = 12, 4, 4000
    total = np.zeros((d, d))
    for seed in range(draws):
        S = Sketch.draw("countsketch", d, s, seed)
        biased = Sketch(d, s, S.column, np.abs(S.value))
        total += biased.dense() @ biased.dense().T
    assert np.max(np.abs(total / draws - np.eye(d))) > 5 * np.sqrt((d / s) ** 2 / draws)


def test_the_same_seed_gives_the_same_sketch_and_bad_sizes_are_refused() -> None:
    a, b = Sketch.draw("countsketch", 10, 5, 1), Sketch.draw("countsketch", 10, 5, 1)
    np.testing.assert_array_equal(a.dense(), b.dense())
    assert not np.array_equal(a.dense(), Sketch.draw("countsketch", 10, 5, 2).dense())
    with pytest.raises(InvalidInput, match="1..d = 10"):
        Sketch.draw("countsketch", 10, 11, 0)
    with pytest.raises(InvalidInput, match="sketch kind"):
        Sketch.draw("gaussian", 10, 5, 0)
    with pytest.raises(InvalidInput, match=r"\[n, 10\]"):
        a.right(np.ones((3, 9)))
