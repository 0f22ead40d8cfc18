"""LSH: seeded projection, bit packing contract, and the SimHash cosine estimate."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from xclp.errors import InvalidInput
from xclp.lsh import estimate_cosine, lsh_codes, lsh_projection, pack_bits, unpack_codes


def pair_at_angle(rng: np.random.Generator, d: int, theta: float) -> np.ndarray:
    """float64[2, d]: two rows whose angle is exactly theta."""
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    w = rng.standard_normal(d)
    w -= (w @ u) * u
    w /= np.linalg.norm(w)
    return np.stack([u, np.cos(theta) * u + np.sin(theta) * w])


def test_projection_is_deterministic_per_seed_and_standard_normal() -> None:
    a = lsh_projection(7, 1024, 32)
    assert a.shape == (1024, 32) and a.dtype == np.float64
    np.testing.assert_array_equal(a, lsh_projection(7, 1024, 32))
    assert not np.array_equal(a, lsh_projection(8, 1024, 32))
    # 32768 N(0,1) draws: mean within 4σ/√n, variance within 4·√(2/n) of 1.
    assert abs(a.mean()) < 4 / np.sqrt(a.size)
    assert abs(a.var() - 1.0) < 4 * np.sqrt(2 / a.size)


@pytest.mark.parametrize("bad", [0, -64, 100, 1000, 63])
def test_bits_not_multiple_of_64_refused(bad: int) -> None:
    with pytest.raises(InvalidInput, match="multiple of 64"):
        lsh_projection(1, bad, 4)
    with pytest.raises(InvalidInput, match="multiple of 64"):
        unpack_codes(np.zeros((1, 2), np.uint64), bad)


def test_bad_dimension_refused() -> None:
    with pytest.raises(InvalidInput, match="dimension d"):
        lsh_projection(1, 64, 0)


def test_bit_order_is_lsb_first_within_words() -> None:
    for bit in (0, 1, 63, 64, 65, 127):
        bits = np.zeros((1, 128), np.uint8)
        bits[0, bit] = 1
        codes = pack_bits(bits)
        expected = np.zeros((1, 2), np.uint64)
        expected[0, bit // 64] = np.uint64(1) << np.uint64(bit % 64)
        np.testing.assert_array_equal(codes, expected)


@settings(max_examples=50, deadline=None)
@given(arrays(np.uint8, st.tuples(st.integers(0, 5), st.sampled_from([64, 128, 256])), elements=st.integers(0, 1)))
def test_pack_unpack_roundtrip(bits: np.ndarray) -> None:
    codes = pack_bits(bits)
    assert codes.dtype == np.uint64 and codes.shape == (bits.shape[0], bits.shape[1] // 64)
    np.testing.assert_array_equal(unpack_codes(codes, bits.shape[1]), bits)


def test_codes_are_signs_of_projections() -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 9))
    P = lsh_projection(3, 192, 9)
    bits = unpack_codes(lsh_codes(X, P), 192)
    np.testing.assert_array_equal(bits, (X @ P.T >= 0).astype(np.uint8))


def test_codes_ignore_positive_scaling_and_zero_row_is_all_ones() -> None:
    rng = np.random.default_rng(1)
    X = rng.standard_normal((5, 6))
    P = lsh_projection(2, 128, 6)
    np.testing.assert_array_equal(lsh_codes(X, P), lsh_codes(X * np.array([[3.0], [1e-6], [7.0], [1e4], [0.5]]), P))
    zero = lsh_codes(np.zeros((1, 6)), P)
    np.testing.assert_array_equal(zero, np.full((1, 2), np.iinfo(np.uint64).max, np.uint64))


def test_codes_refuse_nan_and_wrong_width() -> None:
    P = lsh_projection(2, 64, 3)
    with pytest.raises(InvalidInput, match="NaN/inf"):
        lsh_codes(np.array([[1.0, np.nan, 0.0]]), P)
    with pytest.raises(InvalidInput, match="4 columns but 3"):
        lsh_codes(np.ones((2, 4)), P)


@pytest.mark.parametrize("theta", [0.05, 0.4, 1.0, np.pi / 2, 2.2, 3.0])
def test_hamming_of_pair_at_angle_is_binomial_theta_over_pi(theta: float) -> None:
    """Each bit differs w.p. θ/π independently, so H ~ Binomial(L, θ/π): check within 4σ."""
    rng = np.random.default_rng(int(theta * 1000))
    lsh_bits, d = 4096, 16
    p = theta / np.pi
    sigma = np.sqrt(lsh_bits * p * (1 - p))
    for trial in range(10):
        codes = lsh_codes(pair_at_angle(rng, d, theta), lsh_projection(trial, lsh_bits, d))
        h = int(np.unpackbits((codes[0] ^ codes[1]).view(np.uint8)).sum())
        assert abs(h - lsh_bits * p) <= 4 * sigma, (trial, h, lsh_bits * p, sigma)
        # The cosine estimate then lies within the delta-method bound π·sin θ·σ/L (plus slack).
        assert abs(estimate_cosine(h, lsh_bits) - np.cos(theta)) <= 4 * np.pi * sigma / lsh_bits + 1e-12


def test_estimate_cosine_endpoints() -> None:
    np.testing.assert_allclose(estimate_cosine(np.array([0, 512, 1024]), 1024), [1.0, 0.0, -1.0], atol=1e-15)
