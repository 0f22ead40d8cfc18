"""Shamir t-of-n sharing of 32-byte secrets (crypto/shamir.py): any t shares open the secret,
t − 1 shares are uniform whatever the secret, altered shares and bad input are refused."""

from __future__ import annotations

import itertools
import secrets

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xclp.crypto import shamir
from xclp.errors import InvalidInput


@settings(max_examples=40, deadline=None)
@given(secret=st.binary(min_size=32, max_size=32), n=st.integers(2, 7), data=st.data())
def test_any_t_shares_open_the_secret_and_only_it(secret: bytes, n: int, data) -> None:
    t = data.draw(st.integers(2, n))
    shares = shamir.split(secret, t, range(1, n + 1))
    assert set(shares) == set(range(1, n + 1)) and all(len(s) == shamir.SHARE_BYTES for s in shares.values())
    for subset in itertools.islice(itertools.combinations(shares, t), 10):
        assert shamir.combine({i: shares[i] for i in subset}, t) == secret
    assert shamir.combine(shares, t) == secret  # all of them: consistent


def test_fewer_than_t_shares_open_nothing() -> None:
    shares = shamir.split(secrets.token_bytes(32), 3, range(1, 6))
    with pytest.raises(InvalidInput, match="2 shares cannot open a secret shared 3-of-n"):
        shamir.combine({1: shares[1], 2: shares[2]}, 3)


def high_nibbles(shares: list[bytes]) -> np.ndarray:
    """Bits 516..519 of each share: far above a 256-bit secret, so they come from the randomness."""
    return np.array([s[1] >> 4 for s in shares])


def chi_square_uniform(values: np.ndarray, bins: int) -> float:
    counts = np.bincount(values, minlength=bins)
    expected = len(values) / bins
    return float(((counts - expected) ** 2 / expected).sum())


def test_t_minus_1_shares_look_uniform_whatever_the_secret_and_a_weak_coefficient_fails(monkeypatch) -> None:
    """With t = 3, the two shares at indices 1 and 2 of the all-zero and of the all-one secret both
    spread evenly (χ² over 16 bins, 15 degrees of freedom: the 0.01 % point is 44.3); the same test
    fails when the coefficients come from a small range, as a bug drawing them would."""
    def sample(secret: bytes, n: int = 3000) -> list[bytes]:
        out = []
        for _ in range(n):
            shares = shamir.split(secret, 3, range(1, 4))
            out += [shares[1], shares[2]]
        return out

    for secret in (bytes(32), b"\xff" * 32):
        assert chi_square_uniform(high_nibbles(sample(secret)), 16) < 44.3
    real = secrets.randbelow
    monkeypatch.setattr(shamir.secrets, "randbelow", lambda bound: real(1 << 64))  # a weak draw
    assert chi_square_uniform(high_nibbles(sample(bytes(32), 500)), 16) > 1000


def test_an_altered_share_is_caught_when_there_are_more_than_t() -> None:
    secret = secrets.token_bytes(32)
    shares = shamir.split(secret, 2, range(1, 5))
    forged = dict(shares)
    forged[3] = (int.from_bytes(shares[3], "big") ^ 1).to_bytes(shamir.SHARE_BYTES, "big")
    with pytest.raises(InvalidInput, match="do not lie on one polynomial"):
        shamir.combine(forged, 2)
    with pytest.raises(InvalidInput, match="do not open a 32-byte secret"):  # t shares, one altered
        shamir.combine({1: shares[1], 3: forged[3]}, 2)


@pytest.mark.parametrize(("args", "message"), [
    ((b"short", 2, range(1, 4)), "32 bytes"),
    ((bytes(32), 1, range(1, 4)), "between 2 and the 3 shareholders"),
    ((bytes(32), 4, range(1, 4)), "between 2 and the 3 shareholders"),
    ((bytes(32), 2, [1, 1, 2]), "distinct integers"),
    ((bytes(32), 2, [0, 1, 2]), "distinct integers"),
])
def test_bad_input_is_refused_with_a_clear_error(args, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        shamir.split(*args)


def test_malformed_shares_are_refused() -> None:
    shares = shamir.split(bytes(32), 2, range(1, 3))
    with pytest.raises(InvalidInput, match="66 bytes"):
        shamir.combine({1: shares[1], 2: shares[2][:-1]}, 2)
    with pytest.raises(InvalidInput, match="not an element of the field"):
        shamir.combine({1: shares[1], 2: b"\xff" * 66}, 2)
    with pytest.raises(InvalidInput, match="outside 1 .. p - 1"):
        shamir.combine({0: shares[1], 2: shares[2]}, 2)
