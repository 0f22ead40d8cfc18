"""Fixed-point ring codec (docs/design.md §5.6): round trips, sums, overflow refusal."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from xclp.crypto.fixedpoint import FixedPoint, WideFixedPoint
from xclp.crypto.masking import PairwiseMasker, ring_sum
from xclp.errors import InvalidInput

FP = FixedPoint()


def finite_in(bound: float) -> st.SearchStrategy[float]:
    return st.floats(-bound, bound, allow_nan=False, allow_infinity=False)


@given(hnp.arrays(np.float64, hnp.array_shapes(max_dims=2, max_side=6), elements=finite_in(FP.max_abs)))
def test_round_trip_within_half_ulp_of_the_scale(x: np.ndarray) -> None:
    u = FP.encode(x)
    assert u.dtype == np.uint64 and u.shape == x.shape
    assert np.all(np.abs(FP.decode(u) - x) <= 2.0 ** -(FP.frac_bits + 1))


@given(
    st.integers(0, 30).flatmap(
        lambda f: st.tuples(
            st.just(f),
            hnp.arrays(np.float64, 8, elements=finite_in(FixedPoint(f, 32, 1).max_abs)),
        )
    )
)
def test_round_trip_32_bit_ring(args: tuple[int, np.ndarray]) -> None:
    frac, x = args
    fp = FixedPoint(frac_bits=frac, total_bits=32, headroom_terms=1)
    u = fp.encode(x)
    assert u.dtype == np.uint32
    assert np.all(np.abs(fp.decode(u) - x) <= 2.0 ** -(frac + 1))


def test_encoding_is_twos_complement_of_rounded_scaled_value() -> None:
    fp = FixedPoint(frac_bits=4)
    u = fp.encode(np.array([1.0, -1.0, 0.03125, -0.09375, 0.0]))
    # 1·16 = 16; −16 mod 2^64; 0.5 rounds to even 0; −1.5 rounds to even −2.
    assert u.tolist() == [16, 2**64 - 16, 0, 2**64 - 2, 0]


@settings(max_examples=60)
@given(
    st.integers(1, 12).flatmap(
        lambda n: hnp.arrays(np.float64, (n, 5), elements=finite_in(FixedPoint().max_abs_for(n)))
    )
)
def test_sum_of_encodings_decodes_to_the_sum(x: np.ndarray) -> None:
    n = x.shape[0]
    total = FP.decode(ring_sum(list(FP.encode(x, n_terms=n))))
    # Reference: the exact integer sum of the rounded encodings, rounded once to float64.
    ints = [[int(v) for v in row] for row in np.rint(x * FP.scale)]
    exact = np.array([float(sum(col)) for col in zip(*ints, strict=True)]) / FP.scale
    np.testing.assert_array_equal(total, exact)
    true_sum = np.array([float(sum(map(Fraction, col))) for col in zip(*x.tolist(), strict=True)])
    assert np.all(np.abs(total - true_sum) <= n * 2.0 ** -(FP.frac_bits + 1) + np.spacing(np.abs(true_sum)))


def test_masked_fixed_point_sum_decodes_to_the_sum() -> None:
    # SecureRowSums in miniature (docs/design.md §5.6): encode, mask, sum mod 2^64, decode.
    rng = np.random.default_rng(3)
    ids = ["p1", "p2", "p3"]
    secrets = {(a, b): rng.bytes(32) for a in ids for b in ids if a < b}
    def ss(a: str, b: str) -> bytes:
        return secrets[(min(a, b), max(a, b))]
    x = rng.normal(0, 50, size=(3, 10, 4))
    masked = [
        PairwiseMasker(i, {j: ss(i, j) for j in ids if j != i}, b"sid").apply(
            FP.encode(x[k]), purpose="rowsums", attempt=0, participants=ids
        )
        for k, i in enumerate(ids)
    ]
    np.testing.assert_allclose(FP.decode(ring_sum(masked)), x.sum(axis=0), atol=3 * 2.0**-33)


def test_negative_sums_wrap_back_correctly() -> None:
    parts = [FP.encode(np.array([-3.25])), FP.encode(np.array([1.0])), FP.encode(np.array([-0.5]))]
    assert FP.decode(ring_sum(parts)).tolist() == [-2.75]


def test_overflow_refused_never_wrapped() -> None:
    fp = FixedPoint(frac_bits=32, total_bits=64, headroom_terms=4)
    limit = fp.max_abs
    assert limit == pytest.approx((2**63 - 1) // 4 / 2**32)
    fp.encode(np.array([limit, -limit]))
    with pytest.raises(InvalidInput, match="exceed the fixed-point range"):
        fp.encode(np.array([0.0, limit * 1.0001]))
    with pytest.raises(InvalidInput, match="first at index \\(1,\\)"):
        fp.encode(np.array([0.0, -limit * 1.0001]))
    # Exactly headroom_terms copies of the extreme value still sum without wrapping.
    u = fp.encode(np.array([-limit]))
    assert fp.decode(ring_sum([u] * 4))[0] == pytest.approx(-4 * limit, rel=1e-15)


def test_n_terms_argument_overrides_headroom() -> None:
    fp = FixedPoint(headroom_terms=1)
    big = np.array([2.0**30])
    fp.encode(big)
    with pytest.raises(InvalidInput, match="room for 4 summands"):
        fp.encode(big, n_terms=4)
    assert fp.max_abs_for(4) < fp.max_abs


def test_max_abs_of_full_range() -> None:
    fp = FixedPoint(frac_bits=0, total_bits=64, headroom_terms=1)
    # The largest float64 <= 2^63 − 1 is 2^63 − 1024; 2^63 itself would wrap to −2^63.
    assert fp.max_abs == 2.0**63 - 1024
    assert fp.encode(np.array([fp.max_abs])).view(np.int64)[0] == 2**63 - 1024
    with pytest.raises(InvalidInput):
        fp.encode(np.array([2.0**63]))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_refused(bad: float) -> None:
    with pytest.raises(InvalidInput, match="NaN/inf"):
        FP.encode(np.array([[1.0, bad]]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"total_bits": 48}, "total_bits must be 32 or 64"),
        ({"total_bits": 64.0}, "total_bits must be 32 or 64"),
        ({"frac_bits": 16.0}, "frac_bits must be an integer"),
        ({"frac_bits": 63}, "frac_bits must be in \\[0, 62\\]"),
        ({"frac_bits": -1}, "frac_bits must be in"),
        ({"frac_bits": 31, "total_bits": 32}, "frac_bits must be in \\[0, 30\\]"),
        ({"headroom_terms": 0}, "headroom_terms must be an integer >= 1"),
    ],
)
def test_bad_parameters_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        FixedPoint(**kwargs)


def test_decode_refuses_wrong_dtype() -> None:
    with pytest.raises(InvalidInput, match="uint64"):
        FP.decode(np.zeros(3, dtype=np.int64))
    with pytest.raises(InvalidInput, match="uint32"):
        FixedPoint(16, 32).decode(np.zeros(3, dtype=np.uint64))


# ---- WideFixedPoint: the moments codec (docs/design.md §8) ----------------------------------------------

WIDE = WideFixedPoint()
wide_floats = st.floats(min_value=-1e30, max_value=1e30, allow_nan=False, allow_infinity=False)


@given(st.lists(st.lists(wide_floats, min_size=1, max_size=4), min_size=1, max_size=6))
@example([[0.0, 15969762148353.0], [0.0, 9.999011569650779e29], [0.0, -9.998882084437369e29]])
def test_wide_limb_sums_mod_2_64_decode_to_the_exact_sum_of_the_rounded_values(rows) -> None:
    """Each party's digits summed element-wise mod 2^64 (what the masked sum gives) recombine to
    Σ round(x·2^128) exactly: nothing is lost between parties, whatever their signs."""
    width = min(len(r) for r in rows)
    arrays = [np.array(r[:width]) for r in rows]
    total = np.zeros((width, WIDE.limbs), dtype=np.uint64)
    for arr in arrays:
        total += WIDE.encode(arr, n_terms=len(arrays))  # wraps mod 2^64 like ring_sum
    exact = WIDE.from_limbs(total)
    for j in range(width):
        assert exact[j] == sum(WIDE.scaled(float(a[j])) for a in arrays)
        error = Fraction(exact[j], 2**WIDE.frac_bits) - sum(Fraction(float(a[j])) for a in arrays)
        assert abs(error) <= Fraction(len(arrays), 2 ** (WIDE.frac_bits + 1))  # half a unit of 2^-128 per term
    # against the correctly rounded sum: np.sum's float additions lose everything to cancellation
    # (found by hypothesis: 1.6e13 + 1e30 − 1e30 summed in float64 is off by 2^47)
    correctly_rounded = [math.fsum(float(a[j]) for a in arrays) for j in range(width)]
    np.testing.assert_allclose(WIDE.decode(total), correctly_rounded, rtol=1e-12, atol=1e-30)


def test_wide_digits_are_32_bit_and_values_that_could_wrap_are_refused() -> None:
    encoded = WIDE.encode(np.array([-1.5, 2.0**-128, 3e38]), n_terms=3)
    assert encoded.dtype == np.uint64 and encoded.shape == (3, 12) and int(encoded.max()) < 2**32
    assert WIDE.from_limbs(encoded).tolist() == [-3 * 2**127, 1, WIDE.scaled(3e38)]
    with pytest.raises(InvalidInput, match="exceeds the fixed-point range"):
        WIDE.encode(np.array([1.0, 2.0**254]), n_terms=2)
    with pytest.raises(InvalidInput, match="NaN/inf"):
        WIDE.encode(np.array([np.nan]), n_terms=2)
    with pytest.raises(InvalidInput, match=r"uint64\[..., 12\]"):
        WIDE.decode(np.zeros((3, 11), dtype=np.uint64))
