"""Pooled moments and the preparation every party applies (xclp.data.prep, xclp.v1.moments, docs/design.md §8)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xclp.crypto.masking import PairwiseMasker, ring_sum
from xclp.data.prep import Scaling, local_moments
from xclp.errors import InvalidInput
from xclp.v1 import moments


def pooled(parts, *, standardise=True, impute=True) -> Scaling:
    """The scaling from the masked moments sum of `parts`, as the coordinator opens it."""
    secrets = {p: {q: (min(p, q) + max(p, q)).encode() * 16 for q in parts if q != p} for p in parts}
    members = sorted(parts)
    uploads = [PairwiseMasker(p, secrets[p], b"s").apply(moments.encode(local_moments(X), len(parts)),
                                                          purpose="moments", attempt=0, participants=members)
               for p, X in parts.items()]
    return Scaling.from_sums(moments.decode(ring_sum(uploads)), moments.FRAC_BITS, standardise=standardise,
                             impute=impute)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 30), st.floats(-1e9, 1e9), st.floats(1e-6, 1e6))
def test_pooled_moments_equal_numpy_on_the_concatenated_table(seed, n, loc, scale):
    rng = np.random.default_rng(seed)
    parts = {p: rng.normal(loc, scale, size=(n + k, 3)) for k, p in enumerate("abc")}
    for X in parts.values():
        X[rng.random(X.shape) < 0.1] = np.nan
    X = np.vstack(list(parts.values()))
    s = pooled(parts)
    for j in range(3):
        column = [Fraction(v) for v in X[:, j] if not np.isnan(v)]
        if not column:
            assert not s.kept[j]
            continue
        mean = sum(column) / len(column)
        var = sum((v - mean) ** 2 for v in column) / len(column)
        # exact rational statistics of the pooled floats (numpy's own nanstd is off by (δ/σ)² when
        # its float mean misses by δ, so it is no oracle for a large mean and a small spread)
        assert s.mean[j] == pytest.approx(float(mean), rel=1e-15, abs=1e-13 * float(var) ** 0.5)
        assert s.std[j] == pytest.approx(float(var) ** 0.5, rel=1e-12, abs=1e-300)


def test_a_large_mean_keeps_the_digits_of_a_small_spread():
    """Σx² in float64 would lose the spread of values near 1e9 (a timestamp); the centred, exact sum
    keeps it to numpy's precision."""
    rng = np.random.default_rng(1)
    parts = {p: 1.7e9 + rng.normal(size=(1000, 1)) for p in "abc"}
    X = np.vstack(list(parts.values()))
    np.testing.assert_allclose(pooled(parts).std, X.std(axis=0), rtol=1e-9)
    naive = np.sqrt((X**2).mean(axis=0) - X.mean(axis=0) ** 2)
    assert abs(naive[0] / X.std() - 1) > 1e-6  # what one float64 sum of squares gives


def test_apply_imputes_then_scales_and_drops_constant_or_empty_columns_alike():
    a = np.array([[1.0, 5.0, np.nan, 2.0], [3.0, 5.0, np.nan, np.nan]])
    b = np.array([[5.0, 5.0, np.nan, 4.0]])
    s = pooled({"a": a, "b": b})
    assert s.kept.tolist() == [True, False, False, True] and s.dim == 2
    assert s.dropped(("x", "c", "e", "z")) == ["c", "e"]
    np.testing.assert_allclose(s.apply(a), [[-1.224744871391589, -1.0], [0.0, 0.0]])  # (2 − 3) / 1; NaN -> mean
    np.testing.assert_allclose(s.apply(b), [[1.224744871391589, 1.0]])
    assert np.isnan(a).sum() == 3  # the caller's table is not changed
    only_impute = pooled({"a": a, "b": b}, standardise=False)
    np.testing.assert_allclose(only_impute.apply(a), [[1.0, 2.0], [3.0, 3.0]])
    with pytest.raises(InvalidInput, match="computed for 4"):
        s.apply(a[:, :3])


def test_model_file_arrays_round_trip():
    s = pooled({"a": np.arange(6.0).reshape(3, 2), "b": np.ones((2, 2))})
    back = Scaling.from_arrays(s.to_arrays())
    assert back is not None and np.array_equal(back.mean, s.mean) and np.array_equal(back.kept, s.kept)
    assert Scaling.from_arrays({}) is None


def test_overflowing_squares_are_refused_with_the_column():
    with pytest.raises(InvalidInput, match="column 2 has values too large to standardise"):
        local_moments(np.array([[1.0, 1e200], [2.0, -1e200]]))
