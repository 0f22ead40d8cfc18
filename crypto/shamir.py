"""Shamir's t-of-n secret sharing of 32-byte secrets over GF(p), p = 2^521 − 1 (the
self-mask seeds of a masked sum, so that a party lost while revealing does not lose the sum).

A secret s (32 bytes, read as an integer < 2^256 < p) is the constant term of a polynomial
f(x) = s + a_1 x + … + a_{t−1} x^{t−1} over GF(p) with uniform a_k (OS CSPRNG); the share of the
party with index i (1 ≤ i ≤ n < p) is f(i). Any t shares give s by Lagrange interpolation at 0;
any t − 1 are uniform and independent of s (the field is a Mersenne prime of 521 bits, so every
value mod p is as likely).

No library in our dependency list shares secrets (pyca/cryptography has none; PyCryptodome's
`Shamir` shares 16-byte secrets over GF(2^128) and would add a second crypto library for one
function), so it is written here, small, with its own unit and property tests
(tests/crypto/test_shamir.py). Shares travel as fixed-width big-endian bytes (`SHARE_BYTES`).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from xclp.errors import InvalidInput

P = (1 << 521) - 1  # a Mersenne prime
SECRET_BYTES = 32
SHARE_BYTES = 66  # ⌈521 / 8⌉: one element of GF(p)


def split(secret: bytes, threshold: int, indices: range | list[int] | tuple[int, ...]) -> dict[int, bytes]:
    """Shares of `secret` for the parties with these indices (each in 1 .. p − 1): any `threshold`
    of them reconstruct it, fewer tell nothing."""
    if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        raise InvalidInput(f"a shared secret is {SECRET_BYTES} bytes")
    ids = list(indices)
    if len(set(ids)) != len(ids) or any(not isinstance(i, int) or not 0 < i < P for i in ids):
        raise InvalidInput("share indices must be distinct integers in 1 .. p - 1")
    if not 2 <= threshold <= len(ids):
        raise InvalidInput(f"the threshold must be between 2 and the {len(ids)} shareholders, got {threshold}")
    coefficients = [int.from_bytes(secret, "big")] + [secrets.randbelow(P) for _ in range(threshold - 1)]
    return {i: _evaluate(coefficients, i).to_bytes(SHARE_BYTES, "big") for i in ids}


def combine(shares: Mapping[int, bytes], threshold: int) -> bytes:
    """The secret from at least `threshold` shares (index -> share); InvalidInput for fewer, for
    malformed shares, or when the shares are not of one 32-byte secret (a share was altered)."""
    if threshold < 2 or len(shares) < threshold:
        raise InvalidInput(f"{len(shares)} shares cannot open a secret shared {threshold}-of-n")
    points = []
    for i, share in shares.items():
        if not isinstance(i, int) or not 0 < i < P:
            raise InvalidInput(f"share index {i!r} is outside 1 .. p - 1")
        if not isinstance(share, bytes) or len(share) != SHARE_BYTES:
            raise InvalidInput(f"a share is {SHARE_BYTES} bytes")
        y = int.from_bytes(share, "big")
        if y >= P:
            raise InvalidInput("a share is not an element of the field")
        points.append((i, y))
    secret = _interpolate_at_zero(points[:threshold])
    # more shares than needed: every one must lie on the same polynomial (a forged share shows)
    if len(points) > threshold and any(_interpolate_at(points[:threshold], x) != y for x, y in points[threshold:]):
        raise InvalidInput("the shares do not lie on one polynomial: at least one was altered")
    if secret >> (8 * SECRET_BYTES):
        raise InvalidInput("the shares do not open a 32-byte secret: at least one was altered")
    return secret.to_bytes(SECRET_BYTES, "big")


def _evaluate(coefficients: list[int], x: int) -> int:
    y = 0
    for c in reversed(coefficients):  # Horner
        y = (y * x + c) % P
    return y


def _interpolate_at(points: list[tuple[int, int]], x: int) -> int:
    """f(x) for the polynomial of degree < len(points) through `points`."""
    total = 0
    for j, (xj, yj) in enumerate(points):
        num, den = 1, 1
        for m, (xm, _) in enumerate(points):
            if m != j:
                num = num * (x - xm) % P
                den = den * (xj - xm) % P
        total = (total + yj * num * pow(den, -1, P)) % P
    return total


def _interpolate_at_zero(points: list[tuple[int, int]]) -> int:
    return _interpolate_at(points, 0)
