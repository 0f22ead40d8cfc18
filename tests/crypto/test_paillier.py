"""Paillier keys: CRT ops agree with phe, fixed-base randomness is exact, serialisation is strict."""

from __future__ import annotations

import math

import gmpy2
import phe
import pytest
from gmpy2 import mpz
from hypothesis import given, settings
from hypothesis import strategies as st

from xclp.crypto.paillier import (
    FixedBaseTable,
    PaillierKeypair,
    PaillierPublicKey,
    ciphertexts_to_bytes,
    parse_ciphertexts,
)
from xclp.errors import InvalidInput, ProtocolError


@pytest.fixture(scope="module")
def encryptor(keypair: PaillierKeypair):  # type: ignore[no-untyped-def]
    return keypair.secret_encryptor(window=6)


def test_small_keys_and_short_exponents_need_the_test_flag() -> None:
    with pytest.raises(InvalidInput, match="too small"):
        PaillierKeypair.generate(1024)
    with pytest.raises(InvalidInput, match="448"):
        PaillierKeypair.generate(2048, exponent_bits=256)  # refused before any key is generated
    with pytest.raises(InvalidInput, match="multiple of 8"):
        PaillierKeypair.generate(1020, allow_insecure_test_size=True)


def test_key_holds_crt_constants_as_mpz(keypair: PaillierKeypair) -> None:
    kp = keypair
    assert kp.public.modulus_bits == 1024 and kp.p * kp.q == kp.public.n
    assert all(isinstance(v, type(mpz(0))) for v in (kp.p, kp.q, kp.p2, kp.q2, kp.hp, kp.hq, kp.q2_inv_p2))
    assert kp.p2 * kp.q2 == kp.public.nsquare
    assert kp.q2 * kp.q2_inv_p2 % kp.p2 == 1 and kp.p * kp.p_inv_q % kp.q == 1


def test_h_s_is_an_nth_residue_of_the_djn_form(keypair: PaillierKeypair) -> None:
    # h_s = h^N with h = −x²: every N-th residue mod N² has order dividing λ(N).
    kp = keypair
    lam = math.lcm(int(kp.p) - 1, int(kp.q) - 1)
    assert gmpy2.powmod(kp.public.h_s, lam, kp.public.nsquare) == 1
    assert kp.public.h_s != 1 and gmpy2.gcd(kp.public.h_s, kp.public.n) == 1


@settings(max_examples=25, deadline=None)
@given(a=st.integers(min_value=0, max_value=2**448 - 1))
def test_fixed_base_power_equals_powmod(keypair: PaillierKeypair, a: int) -> None:
    table = _table(keypair)
    assert table.power(a) == gmpy2.powmod(keypair.public.h_s, a, keypair.public.nsquare)


def test_fixed_base_power_edges_and_range(keypair: PaillierKeypair) -> None:
    table = _table(keypair)
    n2, h_s = keypair.public.nsquare, keypair.public.h_s
    assert table.power(0) == 1
    assert table.power(2**448 - 1) == gmpy2.powmod(h_s, 2**448 - 1, n2)
    with pytest.raises(InvalidInput):
        table.power(2**448)


def test_random_digits_form_uniform_short_exponents(keypair: PaillierKeypair) -> None:
    table = _table(keypair)  # window 7: 64 digits of 7 bits = 448 bits exactly
    odd = FixedBaseTable(keypair.public.h_s, keypair.public.nsquare, 100, window=12)  # last digit: 4 bits
    digits = odd.random_digits(400)
    assert all(len(d) == 9 and max(d[:8]) < 2**12 and d[8] < 2**4 for d in digits)
    assert len({d[8] for d in digits}) == 16  # the short top digit still covers its whole range
    for d in table.random_digits(3):
        a = sum(v << (7 * i) for i, v in enumerate(d))
        assert a < 2**448 and table.power_digits(d) == gmpy2.powmod(keypair.public.h_s, a, keypair.public.nsquare)
    # every bit of the exponent is a fair coin: 2000 exponents (from `secrets`, so this is random:
    # 6σ bounds over 448 bits give a false alarm about once in a million runs)
    bits = [sum(v << (7 * i) for i, v in enumerate(d)) for d in table.random_digits(2000)]
    counts = [sum((a >> b) & 1 for a in bits) for b in range(448)]
    assert min(counts) > 1000 - 6 * 23 and max(counts) < 1000 + 6 * 23


_TABLES: dict[int, FixedBaseTable] = {}


def _table(keypair: PaillierKeypair) -> FixedBaseTable:
    key = int(keypair.public.n)
    if key not in _TABLES:
        _TABLES[key] = keypair.public.randomness_table(window=7)
    return _TABLES[key]


@settings(max_examples=20, deadline=None)
@given(m=st.integers(min_value=0))
def test_crt_encryption_decrypts_with_phe(keypair: PaillierKeypair, encryptor, m: int) -> None:  # type: ignore[no-untyped-def]
    m %= int(keypair.public.n)
    c = encryptor.encrypt(m)
    assert 0 < c < keypair.public.nsquare
    phe_private = keypair.to_phe()
    assert phe_private.raw_decrypt(int(c)) == m
    # interoperable: a phe EncryptedNumber built from our ciphertext decrypts to the same value
    number = phe.EncryptedNumber(keypair.public.to_phe(), int(c))
    assert phe_private.decrypt(number) == (m if m <= phe_private.public_key.max_int else m - int(keypair.public.n))
    assert keypair.decrypt(c) == m


@settings(max_examples=20, deadline=None)
@given(m=st.integers(min_value=0, max_value=2**1000))
def test_crt_decryption_agrees_with_phe_encrypt(keypair: PaillierKeypair, m: int) -> None:
    c = keypair.public.to_phe().raw_encrypt(m)
    assert keypair.decrypt(mpz(c)) == m


def test_public_key_encryption_with_and_without_table(keypair: PaillierKeypair) -> None:
    pub = keypair.public
    table = _table(keypair)
    c1, c2 = pub.encrypt(12345, table), pub.encrypt(12345)
    assert c1 != c2  # fresh randomness each time
    assert keypair.decrypt(c1) == keypair.decrypt(c2) == 12345
    with pytest.raises(InvalidInput):
        pub.encrypt(int(pub.n))


def test_secret_encryptions_are_randomised(keypair: PaillierKeypair, encryptor) -> None:  # type: ignore[no-untyped-def]
    assert len({encryptor.encrypt(7) for _ in range(5)}) == 5


def test_homomorphic_product_is_plaintext_sum(keypair: PaillierKeypair, encryptor) -> None:  # type: ignore[no-untyped-def]
    c = encryptor.encrypt(40) * gmpy2.invert(encryptor.encrypt(2), keypair.public.nsquare) % keypair.public.nsquare
    assert keypair.decrypt(c) == 38


def test_public_key_bytes_roundtrip_and_fixed_width(keypair: PaillierKeypair) -> None:
    data = keypair.public.to_bytes()
    assert len(data) == 4 + 3 * 1024 // 8
    assert PaillierPublicKey.from_bytes(data, allow_insecure_test_size=True) == keypair.public
    with pytest.raises(ProtocolError, match="too small"):
        PaillierPublicKey.from_bytes(data)
    with pytest.raises(ProtocolError, match="bytes"):
        PaillierPublicKey.from_bytes(data[:-1], allow_insecure_test_size=True)
    bad_h = data[: 4 + 128] + int(keypair.p * 5).to_bytes(256, "big")  # h_s sharing a factor with N
    with pytest.raises(ProtocolError, match="unit"):
        PaillierPublicKey.from_bytes(bad_h, allow_insecure_test_size=True)


@settings(max_examples=10, deadline=None)
@given(values=st.lists(st.integers(min_value=1, max_value=2**64), min_size=0, max_size=5))
def test_ciphertext_bytes_roundtrip(keypair: PaillierKeypair, values: list[int]) -> None:
    cts = [keypair.public.encrypt(v, _table(keypair)) for v in values]
    data = ciphertexts_to_bytes(cts, keypair.public)
    assert len(data) == len(cts) * 2 * 1024 // 8
    assert parse_ciphertexts(data, keypair.public, count=len(cts)) == cts


def test_malformed_ciphertext_bytes_are_refused(keypair: PaillierKeypair) -> None:
    pub = keypair.public
    good = ciphertexts_to_bytes([pub.encrypt(1, _table(keypair))], pub)
    with pytest.raises(ProtocolError, match="multiple"):
        parse_ciphertexts(good[:-1], pub)
    with pytest.raises(ProtocolError, match="expected 2"):
        parse_ciphertexts(good, pub, count=2)
    with pytest.raises(ProtocolError, match="not below"):
        parse_ciphertexts(b"\xff" * pub.ciphertext_bytes, pub)
    not_unit = int(keypair.q * 3).to_bytes(pub.ciphertext_bytes, "big")
    with pytest.raises(ProtocolError, match="invertible"):
        parse_ciphertexts(good + not_unit, pub)
    with pytest.raises(ProtocolError, match="invertible"):
        parse_ciphertexts(bytes(pub.ciphertext_bytes), pub)


def test_h_s_is_derived_from_N_and_a_chosen_base_is_refused(keypair) -> None:  # type: ignore[no-untyped-def]
    """docs/design.md §5.3: h = −x² mod N with x from a public hash of N, so B recomputes h_s; a malicious A
    could otherwise pick a weak base (e.g. one of small order) for B's encryption randomness."""
    from xclp.crypto.paillier import PaillierPublicKey, derive_h
    from xclp.errors import ProtocolError

    pub = keypair.public
    assert gmpy2.powmod(derive_h(pub.n), pub.n, pub.nsquare) == pub.h_s
    pub.check_h_s()
    chosen = PaillierPublicKey(pub.n, gmpy2.powmod(pub.h_s, 2, pub.nsquare), pub.exponent_bits)
    with pytest.raises(ProtocolError, match="not derived from N"):
        chosen.check_h_s()
