"""Paillier keys for SecureHamming: CRT secret-key operations and fixed-base randomness (docs/design.md §5.3).

Encryption is Enc(m) = (1 + m·N) · h_s^a mod N² (Damgård–Jurik–Nielsen, "A generalization of
Paillier's public-key system", §4.1): instead of a fresh r^N with r uniform in Z*_N, the
randomness is h_s^a where h_s = h^N mod N², h = −x² mod N for a random x, is published with the
key and a is a *short* uniform exponent of `exponent_bits` bits. Ciphertexts stay ordinary
Paillier ciphertexts with g = N + 1, so `phe` decrypts them (tests prove it).

Assumption (stated once, relied on everywhere):
  * Against anyone without the factorisation (party B): DCR plus the DJN short-exponent
    assumption — h_s^a with a uniform in [0, 2^exponent_bits) is computationally
    indistinguishable from a uniform element of the subgroup ⟨h_s⟩ of N-th residues.
  * Against the key owner (party A, who knows p and q, docs/design.md §5.3 "fresh randomness is
    mandatory"): D's randomness is h_s^(S_x + a') where S_x = Σ_l ±a_l is computable by A for
    any guess of x and a' is B's fresh exponent. This hiding is computational, not statistical
    (a' is shorter than the group order): testing one guess means deciding whether
    u·h_s^(−S_guess) has a discrete logarithm below 2^exponent_bits in the order ≈2^1023
    subgroups mod p and mod q, and the best known attacks (Pollard kangaroo / van Oorschot–
    Wiener) cost ≈ 2^(exponent_bits/2) group operations per guess.
  Why 448: 2·224 — each guess then costs 2^224 ≫ the ≈2^112 security of a 2048-bit modulus (and
  stays above the ≈2^128 of 3072-bit keys). Real keys (|N| >= 2048) therefore refuse
  exponent_bits < 448; smaller keys and exponents exist for tests only and need
  `allow_insecure_test_size=True`.
  h is not A's choice: x comes from a public hash of N (`derive_h`), so B recomputes h_s = h^N
  mod N² itself and refuses a key whose h_s differs (`PaillierPublicKey.check_h_s`); a malicious
  A cannot pick a weak base (docs/design.md §5.3). The signed key bundle binds h_s to A's identity.

Speed: h_s^a is a product of ⌈exponent_bits/window⌉ entries of a precomputed `FixedBaseTable`.
The key owner keeps tables mod p² and mod q² and recombines by CRT (each half-size product is
~3x cheaper than one mod N², so ~1.4x overall); decryption is CRT too (two half-size powmods).
Ciphertexts travel as fixed-width big-endian bytes, 2·|N|/8 each, concatenated (docs/design.md §3).
"""

from __future__ import annotations

import hashlib
import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import gmpy2
import numpy as np
import phe
from gmpy2 import mpz

from xclp.errors import InvalidInput, ProtocolError

MIN_SECURE_BITS = 2048
MIN_SECURE_EXPONENT_BITS = 448
DEFAULT_WINDOW = 10
_PUBLIC_HEADER = struct.Struct(">HH")  # |N| in bits, exponent_bits


def _check_strength(modulus_bits: int, exponent_bits: int, allow_insecure: bool) -> None:
    if allow_insecure:
        if exponent_bits < 64:
            raise InvalidInput(f"exponent_bits must be >= 64 even for test keys, got {exponent_bits}")
        return
    if modulus_bits < MIN_SECURE_BITS:
        raise InvalidInput(
            f"Paillier modulus of {modulus_bits} bits is too small: use >= {MIN_SECURE_BITS} bits "
            "(smaller keys only in tests, with allow_insecure_test_size=True)"
        )
    if exponent_bits < MIN_SECURE_EXPONENT_BITS:
        raise InvalidInput(
            f"exponent_bits={exponent_bits} is below the {MIN_SECURE_EXPONENT_BITS} bits the "
            "short-exponent assumption needs (see crypto/paillier.py docstring)"
        )


def derive_h(n: mpz | int) -> mpz:
    """h = −x² mod N with x = SHAKE-256("xclp/paillier/h" ‖ N) read as an integer mod N (docs/design.md §5.3):
    public, so both sides compute it, and a unit of Z_N for any N that is a product of two large primes."""
    n = mpz(n)
    width = (int(n).bit_length() + 7) // 8
    counter = 0
    while True:
        digest = hashlib.shake_256(b"xclp/paillier/h" + int(n).to_bytes(width, "big") + bytes([counter]))
        x = mpz(int.from_bytes(digest.digest(width + 16), "big")) % n
        if x > 1 and gmpy2.gcd(x, n) == 1:
            return (-x * x) % n
        counter += 1


@dataclass(frozen=True)
class PaillierPublicKey:
    """N and the DJN randomness base h_s = h^N mod N²; `exponent_bits` is the short exponent size."""

    n: mpz
    h_s: mpz
    exponent_bits: int = MIN_SECURE_EXPONENT_BITS

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", mpz(self.n))
        object.__setattr__(self, "h_s", mpz(self.h_s))
        if self.n < 15 or self.n % 2 == 0 or self.n.bit_length() % 8 != 0:
            raise InvalidInput("Paillier modulus N must be odd, >= 15 and a whole number of bytes long")
        if not 1 < self.h_s < self.n * self.n or gmpy2.gcd(self.h_s, self.n) != 1:
            raise InvalidInput("h_s must be a unit of Z_{N^2} other than 1")
        if not 1 <= self.exponent_bits <= 0xFFFF:
            raise InvalidInput(f"exponent_bits must be in [1, 65535], got {self.exponent_bits}")

    @property
    def modulus_bits(self) -> int:
        return int(self.n.bit_length())

    def check_h_s(self) -> None:
        """Refuse (ProtocolError) an h_s other than h^N mod N² for h from the hash of N: the key
        owner must not choose the randomness base of the encryptions B makes (docs/design.md §5.3)."""
        if gmpy2.powmod(derive_h(self.n), self.n, self.nsquare) != self.h_s:
            raise ProtocolError("the Paillier key's h_s is not derived from N (docs/design.md §5.3): refusing a "
                                "chosen base")

    @cached_property
    def nsquare(self) -> mpz:
        return self.n * self.n

    @property
    def ciphertext_bytes(self) -> int:
        """Fixed width of one serialised ciphertext: 2·|N|/8 (docs/design.md §3)."""
        return 2 * self.modulus_bits // 8

    def to_phe(self) -> phe.PaillierPublicKey:
        return phe.PaillierPublicKey(int(self.n))

    def encrypt(self, m: int, table: FixedBaseTable | None = None) -> mpz:
        """Enc(m) = (1 + mN)·h_s^a mod N², a fresh short exponent from `secrets` (DJN §4.1)."""
        if not 0 <= m < self.n:
            raise InvalidInput("plaintext must lie in [0, N)")
        if table is not None:
            rand = table.random_power()
        else:
            rand = gmpy2.powmod(self.h_s, secrets.randbits(self.exponent_bits), self.nsquare)
        return gmpy2.t_mod((1 + mpz(m) * self.n) * rand, self.nsquare)

    def randomness_table(self, window: int = DEFAULT_WINDOW) -> FixedBaseTable:
        return FixedBaseTable(self.h_s, self.nsquare, self.exponent_bits, window)

    def to_bytes(self) -> bytes:
        """Fixed width: 4-byte header (|N|, exponent_bits), N (|N|/8 bytes), h_s (2·|N|/8 bytes)."""
        width = self.modulus_bits // 8
        return (
            _PUBLIC_HEADER.pack(self.modulus_bits, self.exponent_bits)
            + int(self.n).to_bytes(width, "big")
            + int(self.h_s).to_bytes(2 * width, "big")
        )

    @classmethod
    def from_bytes(cls, data: bytes, *, allow_insecure_test_size: bool = False) -> PaillierPublicKey:
        if len(data) < _PUBLIC_HEADER.size:
            raise ProtocolError("Paillier public key bytes are shorter than their header")
        modulus_bits, exponent_bits = _PUBLIC_HEADER.unpack_from(data)
        width = modulus_bits // 8
        if modulus_bits % 8 or len(data) != _PUBLIC_HEADER.size + 3 * width:
            raise ProtocolError(f"Paillier public key of {modulus_bits} bits must be {_PUBLIC_HEADER.size + 3 * width} "
                                f"bytes, got {len(data)}")
        n = mpz(int.from_bytes(data[4 : 4 + width], "big"))
        h_s = mpz(int.from_bytes(data[4 + width :], "big"))
        if n.bit_length() != modulus_bits:
            raise ProtocolError(f"Paillier modulus has {n.bit_length()} bits, header says {modulus_bits}")
        try:
            key = cls(n, h_s, exponent_bits)
            _check_strength(modulus_bits, exponent_bits, allow_insecure_test_size)
        except InvalidInput as exc:
            raise ProtocolError(f"unacceptable Paillier public key: {exc}") from None
        return key


@dataclass(frozen=True)
class PaillierKeypair:
    """A's key: the public part plus p, q and the CRT constants (gmpy2 mpz) for fast secret-key ops."""

    public: PaillierPublicKey
    p: mpz
    q: mpz
    p2: mpz = field(init=False, repr=False)
    q2: mpz = field(init=False, repr=False)
    hp: mpz = field(init=False, repr=False)  # L_p(g^(p-1) mod p²)^-1 mod p, g = N + 1
    hq: mpz = field(init=False, repr=False)
    p_inv_q: mpz = field(init=False, repr=False)  # p^-1 mod q: plaintext CRT
    q2_inv_p2: mpz = field(init=False, repr=False)  # (q²)^-1 mod p²: ciphertext CRT

    def __post_init__(self) -> None:
        p, q = mpz(self.p), mpz(self.q)
        if p == q or p * q != self.public.n:
            raise InvalidInput("p·q must equal N with p != q")
        p2, q2 = p * p, q * q
        n = self.public.n
        for name, value in (
            ("p", p), ("q", q), ("p2", p2), ("q2", q2),
            ("hp", gmpy2.invert((gmpy2.powmod(n + 1, p - 1, p2) - 1) // p, p)),
            ("hq", gmpy2.invert((gmpy2.powmod(n + 1, q - 1, q2) - 1) // q, q)),
            ("p_inv_q", gmpy2.invert(p, q)),
            ("q2_inv_p2", gmpy2.invert(q2, p2)),
        ):
            object.__setattr__(self, name, value)

    @classmethod
    def generate(
        cls, bits: int = 2048, *, exponent_bits: int = MIN_SECURE_EXPONENT_BITS, allow_insecure_test_size: bool = False
    ) -> PaillierKeypair:
        """New key via `phe.generate_paillier_keypair`; h = −x² mod N from a hash of N, h_s = h^N mod N² (DJN)."""
        if bits % 8:
            raise InvalidInput(f"key size must be a multiple of 8 bits, got {bits}")
        _check_strength(bits, exponent_bits, allow_insecure_test_size)
        _, private = phe.generate_paillier_keypair(n_length=bits)
        p, q = mpz(private.p), mpz(private.q)
        n = p * q
        h = derive_h(n)
        p2, q2 = p * p, q * q
        h_s = _crt_pair(gmpy2.powmod(h, n, p2), gmpy2.powmod(h, n, q2), p2, q2, gmpy2.invert(q2, p2))
        return cls(PaillierPublicKey(n, h_s, exponent_bits), p, q)

    def decrypt(self, c: mpz) -> mpz:
        """CRT decryption: two half-size powmods (mod p², q²) and a recombination mod N."""
        p, q = self.p, self.q
        mp = (gmpy2.powmod(c, p - 1, self.p2) - 1) // p * self.hp % p
        mq = (gmpy2.powmod(c, q - 1, self.q2) - 1) // q * self.hq % q
        return mp + p * ((mq - mp) * self.p_inv_q % q)

    def secret_encryptor(self, window: int = DEFAULT_WINDOW) -> SecretKeyEncryptor:
        return SecretKeyEncryptor(self, window)

    def to_phe(self) -> phe.PaillierPrivateKey:
        return phe.PaillierPrivateKey(self.public.to_phe(), int(self.p), int(self.q))


def _crt_pair(cp: mpz, cq: mpz, p2: mpz, q2: mpz, q2_inv_p2: mpz) -> mpz:
    """The unique c mod p²q² with c ≡ cp (mod p²), c ≡ cq (mod q²) (Garner)."""
    return cq + q2 * ((cp - cq) * q2_inv_p2 % p2)


class FixedBaseTable:
    """base^a mod m for a < 2^exponent_bits in ⌈exponent_bits/window⌉ multiplications.

    Row i holds base^(j·2^(window·i)) for j in [0, 2^window): the k-ary fixed-base method with
    every window's powers precomputed (Brickell–Gordon–McCurley–Wilson), no squarings at use time.
    """

    def __init__(self, base: mpz, modulus: mpz, exponent_bits: int, window: int = DEFAULT_WINDOW) -> None:
        if not 1 <= window <= 16:
            raise InvalidInput(f"window must be in [1, 16], got {window}")
        self.modulus = mpz(modulus)
        self.exponent_bits = exponent_bits
        self.window = window
        size = 1 << window
        rows: list[list[mpz]] = []
        row_base = mpz(base) % self.modulus
        for _ in range(-(-exponent_bits // window)):
            row = [mpz(1), row_base]
            for _ in range(size - 2):
                row.append(gmpy2.t_mod(row[-1] * row_base, self.modulus))
            rows.append(row)
            row_base = gmpy2.t_mod(row[-1] * row_base, self.modulus)  # base^(2^window) of this row
        self._rows = rows

    def power(self, a: int) -> mpz:
        if not 0 <= a < (1 << self.exponent_bits):
            raise InvalidInput(f"exponent must lie in [0, 2^{self.exponent_bits})")
        mask = (1 << self.window) - 1
        return self.power_digits([(a >> (self.window * i)) & mask for i in range(len(self._rows))])

    def power_digits(self, digits: Sequence[int]) -> mpz:
        """base^a for a = Σ_i digits[i]·2^(window·i), one product per non-zero digit."""
        rows, mod, t_mod = self._rows, self.modulus, gmpy2.t_mod
        acc = rows[0][digits[0]]
        for row, d in zip(rows[1:], digits[1:]):
            if d:
                acc = t_mod(acc * row[d], mod)
        return acc

    def random_digits(self, count: int) -> list[list[int]]:
        """Digits of `count` exponents uniform in [0, 2^exponent_bits), drawn from `secrets` in
        bulk (numpy only reshapes and masks the CSPRNG bytes): each window is uniform on its bits."""
        rows = len(self._rows)
        last_bits = self.exponent_bits - self.window * (rows - 1)
        masks = np.full(rows, (1 << self.window) - 1, dtype=np.uint32)
        masks[-1] = (1 << last_bits) - 1
        raw = np.frombuffer(secrets.token_bytes(4 * count * rows), dtype="<u4").reshape(count, rows)
        return (raw & masks).tolist()

    def random_power(self) -> mpz:
        return self.power_digits(self.random_digits(1)[0])


class SecretKeyEncryptor:
    """A's fast encryption: (1 + mN)·h_s^a computed mod p² and mod q² from two tables, then CRT."""

    def __init__(self, keypair: PaillierKeypair, window: int = DEFAULT_WINDOW) -> None:
        self.keypair = keypair
        pub = keypair.public
        self._table_p = FixedBaseTable(pub.h_s % keypair.p2, keypair.p2, pub.exponent_bits, window)
        self._table_q = FixedBaseTable(pub.h_s % keypair.q2, keypair.q2, pub.exponent_bits, window)

    def encrypt(self, m: int) -> mpz:
        return self.encrypt_many([m])[0]

    def encrypt_many(self, plaintexts: Sequence[int]) -> list[mpz]:
        """One fresh short exponent a per plaintext, shared by the p² and q² halves."""
        kp = self.keypair
        n, p2, q2, t_mod = kp.public.n, kp.p2, kp.q2, gmpy2.t_mod
        if any(not 0 <= m < n for m in plaintexts):
            raise InvalidInput("plaintexts must lie in [0, N)")
        out = []
        for m, digits in zip(plaintexts, self._table_p.random_digits(len(plaintexts))):
            gm = 1 + mpz(m) * n  # g^m = 1 + mN mod N² for g = N + 1
            cp = t_mod(t_mod(gm, p2) * self._table_p.power_digits(digits), p2)
            cq = t_mod(t_mod(gm, q2) * self._table_q.power_digits(digits), q2)
            out.append(_crt_pair(cp, cq, p2, q2, kp.q2_inv_p2))
        return out


def ciphertexts_to_bytes(ciphertexts: Sequence[mpz], public: PaillierPublicKey) -> bytes:
    """Fixed-width big-endian encoding, 2·|N|/8 bytes each, concatenated (docs/design.md §3)."""
    width = public.ciphertext_bytes
    return b"".join(int(c).to_bytes(width, "big") for c in ciphertexts)


def parse_ciphertexts(
    data: bytes, public: PaillierPublicKey, *, count: int | None = None, check_units: bool = True
) -> list[mpz]:
    """Inverse of `ciphertexts_to_bytes`, refusing wrong lengths, values >= N² and non-units.

    `check_units=False` skips the gcd test for callers that invert every ciphertext anyway (the
    inversion then detects non-units and must raise ProtocolError itself).
    """
    width = public.ciphertext_bytes
    if len(data) % width:
        raise ProtocolError(f"ciphertext bytes ({len(data)}) are not a multiple of the {width}-byte width")
    if count is not None and len(data) != count * width:
        raise ProtocolError(f"expected {count} ciphertexts ({count * width} bytes), got {len(data)} bytes")
    n, n2 = public.n, public.nsquare
    out = []
    for i in range(0, len(data), width):
        c = mpz(int.from_bytes(data[i : i + width], "big"))
        if c >= n2:
            raise ProtocolError(f"ciphertext {i // width} is not below N²")
        if check_units and gmpy2.gcd(c, n) != 1:
            raise ProtocolError(f"ciphertext {i // width} is not invertible mod N²")
        out.append(c)
    return out
