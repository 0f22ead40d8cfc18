"""Hamming matrices equal a naive loop over unpacked bits; shapes and dtypes are checked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from xclp.errors import InvalidInput
from xclp.hamming import hamming_dtype, hamming_matrix
from xclp.lsh import pack_bits, unpack_codes

ALL_ONES = np.iinfo(np.uint64).max


def naive_hamming(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    a_bits = unpack_codes(A, 64 * A.shape[1])
    b_bits = unpack_codes(B, 64 * B.shape[1])
    out = np.zeros((A.shape[0], B.shape[0]), np.int64)
    for i in range(A.shape[0]):
        for j in range(B.shape[0]):
            out[i, j] = sum(int(x != y) for x, y in zip(a_bits[i], b_bits[j]))
    return out


def random_codes(rng: np.random.Generator, n: int, words: int) -> np.ndarray:
    return rng.integers(0, 2**64, size=(n, words), dtype=np.uint64, endpoint=False)


@pytest.mark.parametrize(("n_a", "n_b", "words"), [(1, 1, 1), (7, 13, 2), (33, 5, 3), (65, 1, 16)])
def test_random_codes_match_naive_loop(n_a: int, n_b: int, words: int) -> None:
    rng = np.random.default_rng(n_a * 100 + n_b)
    A, B = random_codes(rng, n_a, words), random_codes(rng, n_b, words)
    np.testing.assert_array_equal(hamming_matrix(A, B), naive_hamming(A, B))


def test_all_zero_and_all_one_codes() -> None:
    zeros = np.zeros((3, 4), np.uint64)
    ones = np.full((2, 4), ALL_ONES, np.uint64)
    np.testing.assert_array_equal(hamming_matrix(zeros, ones), np.full((3, 2), 256))
    np.testing.assert_array_equal(hamming_matrix(zeros), np.zeros((3, 3)))
    np.testing.assert_array_equal(hamming_matrix(ones), np.zeros((2, 2)))


def test_self_matrix_is_symmetric_with_zero_diagonal_and_uint16() -> None:
    A = random_codes(np.random.default_rng(5), 50, 16)
    H = hamming_matrix(A)
    assert H.dtype == np.uint16 and H.shape == (50, 50)
    np.testing.assert_array_equal(H, H.T)
    assert not H.diagonal().any()
    np.testing.assert_array_equal(H[:20, 30:], hamming_matrix(A[:20], A[30:]))


def test_output_dtype_widens_beyond_uint16() -> None:
    assert hamming_dtype(1024) == np.uint16 and hamming_dtype(65535) == np.uint16
    assert hamming_dtype(65536) == np.int32
    A = np.zeros((1, 1024), np.uint64)
    B = np.full((2, 1024), ALL_ONES, np.uint64)
    H = hamming_matrix(A, B)
    assert H.dtype == np.int32
    np.testing.assert_array_equal(H, [[65536, 65536]])


@settings(max_examples=40, deadline=None)
@given(
    arrays(np.uint8, st.tuples(st.integers(1, 6), st.sampled_from([64, 128, 192])), elements=st.integers(0, 1)),
    st.data(),
)
def test_matches_naive_on_arbitrary_bits(bits_a: np.ndarray, data: st.DataObject) -> None:
    bits_b = data.draw(arrays(np.uint8, (data.draw(st.integers(1, 6)), bits_a.shape[1]), elements=st.integers(0, 1)))
    expected = (bits_a[:, None, :] != bits_b[None, :, :]).sum(axis=2)
    np.testing.assert_array_equal(hamming_matrix(pack_bits(bits_a), pack_bits(bits_b)), expected)


def test_bad_inputs_are_refused_with_clear_messages() -> None:
    ok = np.zeros((2, 2), np.uint64)
    with pytest.raises(InvalidInput, match="dtype uint64"):
        hamming_matrix(np.zeros((2, 2), np.int64))
    with pytest.raises(InvalidInput, match="2-D"):
        hamming_matrix(np.zeros(4, np.uint64))
    with pytest.raises(InvalidInput, match="same code length"):
        hamming_matrix(ok, np.zeros((2, 3), np.uint64))
    with pytest.raises(InvalidInput, match="zero words"):
        hamming_matrix(np.zeros((2, 0), np.uint64))


def test_empty_side_gives_empty_matrix() -> None:
    assert hamming_matrix(np.zeros((0, 2), np.uint64), np.zeros((3, 2), np.uint64)).shape == (0, 3)
