"""Packed SecureHamming gives exactly the plaintext Hamming matrix and refuses malformed messages."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import gmpy2
import numpy as np
import pytest
from scipy import stats

from crypto.literal_hamming import literal_decrypt, literal_encrypt_bits, literal_evaluate
from crypto.paillier import PaillierKeypair, ciphertexts_to_bytes, parse_ciphertexts
from crypto.secure_hamming import (
    EncryptedSlices,
    EvaluatedDistances,
    SlotLayout,
    choose_group_bits,
    code_bits,
    decrypt_all,
    decrypt_and_unpack,
    encrypt_bit_slices,
    evaluate,
    unmask_distances,
)
from xclp.errors import InvalidInput, OutOfRange, ProtocolError


@pytest.fixture(scope="module")
def keypair() -> PaillierKeypair:
    return PaillierKeypair.generate(1024, allow_insecure_test_size=True)


def random_codes(rng: np.random.Generator, n: int, L: int) -> np.ndarray:
    """uint64[n, ⌈L/64⌉] with bits beyond L zero."""
    bits = rng.integers(0, 2, size=(n, -(-L // 64) * 64), dtype=np.uint8)
    bits[:, L:] = 0
    return np.packbits(bits, axis=1, bitorder="little").view("<u8").astype(np.uint64)


def plaintext_hamming(codes_B: np.ndarray, codes_A: np.ndarray) -> np.ndarray:
    """Oracle: popcount of XOR on the packed uint64 words, int64[n_B, n_A]."""
    xor = codes_B[:, None, :] ^ codes_A[None, :, :]
    return np.unpackbits(xor.view(np.uint8), axis=2).sum(axis=2).astype(np.int64)


def run_packed(keypair, codes_A, codes_B, L, *, executor=None, group_bits=None, via_bytes=True):  # type: ignore[no-untyped-def]
    layout = SlotLayout.for_key(keypair.public, L)
    slices = encrypt_bit_slices(keypair, codes_A, layout, executor, window=6)
    if via_bytes:  # what really travels between A and B
        slices = EncryptedSlices.from_bytes(slices.to_bytes())
    evaluated, r = evaluate(keypair.public, slices, codes_B, executor, group_bits=group_bits, window=6)
    if via_bytes:
        evaluated = EvaluatedDistances.from_bytes(evaluated.to_bytes())
    t = decrypt_and_unpack(keypair, evaluated, layout, len(codes_A), executor)
    return t, r, unmask_distances(t, r, L)


def test_layout_matches_design_constants() -> None:
    lay = SlotLayout(2048, 1024, 40)
    assert (lay.width, lay.slots) == (52, 39)
    assert SlotLayout(2048, 4096, 40).slots == 37
    # masks are sigma bits wider than any distance: 2^(w−1) >= 2^sigma·(L+1)
    for L in (1, 64, 100, 1023, 1024, 4096, 65535):
        lay = SlotLayout(2048, L, 40)
        assert 2**lay.mask_bits >= 2**40 * (L + 1)
        assert L + 2**lay.mask_bits <= 2**lay.width  # h + r never spills into the next slot
        assert lay.slots * lay.width <= 2048 - 2


def test_layout_refuses_impossible_parameters() -> None:
    with pytest.raises(InvalidInput, match="uint64"):
        SlotLayout(2048, 1024, 60)
    with pytest.raises(InvalidInput, match="cannot hold"):
        SlotLayout(40, 1024, 40)
    with pytest.raises(InvalidInput, match="L"):
        SlotLayout(2048, 0, 40)


def test_group_bits_choice_minimises_products() -> None:
    assert choose_group_bits(1024, 1000) == 8
    assert choose_group_bits(1024, 1) == 1  # one vector: no table pays off
    assert choose_group_bits(64, 10**6) == 11  # 6 groups for g = 11 or 12; g = 11 has smaller tables
    assert choose_group_bits(64, 10**6, max_bits=8) == 8


@pytest.mark.parametrize(
    ("L", "n_A", "n_B", "group_bits"),
    [(64, 23, 4, None), (64, 21, 3, 5), (128, 30, 5, 3), (100, 8, 3, 7), (1024, 25, 3, None), (1024, 20, 2, 11)],
)
def test_packed_protocol_equals_plaintext_hamming(keypair, L, n_A, n_B, group_bits) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(L * 1000 + n_A)
    codes_A, codes_B = random_codes(rng, n_A, L), random_codes(rng, n_B, L)
    _, _, H = run_packed(keypair, codes_A, codes_B, L, group_bits=group_bits)
    assert H.dtype == np.uint16 and H.shape == (n_B, n_A)
    np.testing.assert_array_equal(H, plaintext_hamming(codes_B, codes_A))


def test_all_zero_and_all_one_vectors(keypair) -> None:  # type: ignore[no-untyped-def]
    L = 128
    zeros = np.zeros((1, 2), dtype=np.uint64)
    ones = np.full((1, 2), np.iinfo(np.uint64).max, dtype=np.uint64)
    codes_A = np.vstack([zeros, ones, zeros, ones] * 6)  # 24 rows: one full batch of 21 + 3
    codes_B = np.vstack([zeros, ones])
    _, _, H = run_packed(keypair, codes_A, codes_B, L)
    expected = np.array([[0, L] * 12, [L, 0] * 12])
    np.testing.assert_array_equal(H, expected)


def test_literal_and_packed_agree(keypair) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    L = 64
    codes_A, codes_B = random_codes(rng, 3, L), random_codes(rng, 2, L)
    layout = SlotLayout.for_key(keypair.public, L)
    enc = literal_encrypt_bits(keypair.public.to_phe(), codes_A, L)
    evaluated, r = literal_evaluate(keypair.public.to_phe(), enc, codes_B, layout)
    t = literal_decrypt(keypair.to_phe(), evaluated)
    H_literal = unmask_distances(t, r, L)
    _, _, H_packed = run_packed(keypair, codes_A, codes_B, L)
    np.testing.assert_array_equal(H_literal, H_packed)
    np.testing.assert_array_equal(H_literal, plaintext_hamming(codes_B, codes_A))


def test_decrypt_all_matches_single_decryptions(keypair) -> None:  # type: ignore[no-untyped-def]
    pub = keypair.public
    values = [0, 1, 2**500, int(pub.n) - 1, 12345]
    data = ciphertexts_to_bytes([pub.encrypt(v) for v in values], pub)
    assert decrypt_all(keypair, data, tasks=2) == values


def test_process_pool_gives_the_same_result(keypair) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(11)
    L = 256
    codes_A, codes_B = random_codes(rng, 50, L), random_codes(rng, 6, L)
    with ProcessPoolExecutor(max_workers=2) as pool:
        _, _, H = run_packed(keypair, codes_A, codes_B, L, executor=pool)
    np.testing.assert_array_equal(H, plaintext_hamming(codes_B, codes_A))


def test_masked_slot_values_are_uniform_and_masks_hide_h(keypair) -> None:  # type: ignore[no-untyped-def]
    """A sees t = h + r. With r uniform in [0, 2^(w−1)) the top bits below bit w−1 of t and its low
    bits are uniform whatever h is. Masks come from `secrets`, not a seed, so this test is random:
    each χ² p-value threshold of 1e-6 gives a false-alarm rate of about 1e-6 per run."""
    rng = np.random.default_rng(3)
    L = 64
    layout = SlotLayout.for_key(keypair.public, L)
    codes_A = random_codes(rng, 2 * layout.slots, L)
    codes_A[: layout.slots] = 0  # h = |x| for the first batch
    codes_B = random_codes(rng, 60, L)
    t, r, H = run_packed(keypair, codes_A, codes_B, L, via_bytes=False)
    assert (r < 2**layout.mask_bits).all()
    np.testing.assert_array_equal(H, plaintext_hamming(codes_B, codes_A))
    top = ((t >> np.uint64(layout.mask_bits - 4)) & np.uint64(15)).ravel()  # bits w−5 .. w−2
    low = (t & np.uint64(15)).ravel()
    for sample in (top, low):
        counts = np.bincount(sample.astype(np.int64), minlength=16)
        assert stats.chisquare(counts).pvalue > 1e-6
    # a mask only L wide (the paper's r in [0, L−1]) would leave every top bit zero
    assert np.count_nonzero(top) > len(top) // 2


def test_evaluation_carries_fresh_randomness(keypair) -> None:  # type: ignore[no-untyped-def]
    """A knows its ciphertexts; given x and the masks it must not be able to rebuild D (DESIGN §5.3)."""
    rng = np.random.default_rng(13)
    L = 64
    layout = SlotLayout.for_key(keypair.public, L)
    codes_A, codes_B = random_codes(rng, layout.slots, L), random_codes(rng, 2, L)  # one full batch
    slices = encrypt_bit_slices(keypair, codes_A, layout, window=6)
    evaluated, r = evaluate(keypair.public, slices, codes_B, window=6)
    n, n2 = keypair.public.n, keypair.public.nsquare
    cts = parse_ciphertexts(slices.ciphertexts, keypair.public)
    for x, (bits, masks) in enumerate(zip(code_bits(codes_B, L), r)):
        m = sum((int(bits.sum()) + int(v)) << (layout.width * s) for s, v in enumerate(masks))
        guess = (1 + m * n) % n2
        for bit, c in zip(bits, cts):
            guess = guess * (c if bit == 0 else gmpy2.invert(c, n2)) % n2
        d = parse_ciphertexts(evaluated.batch(0), keypair.public)[x]
        assert keypair.decrypt(d) == keypair.decrypt(guess)  # same plaintext ...
        assert d != guess  # ... but B's fresh factor h_s^a makes it a different ciphertext


def _decrypted_slots(keypair, evaluated, layout):  # type: ignore[no-untyped-def]
    out = []
    for d in parse_ciphertexts(evaluated.ciphertexts, keypair.public):
        m = int(keypair.decrypt(d))
        out.append([(m >> (layout.width * s)) & ((1 << layout.width) - 1) for s in range(layout.slots)])
    return out


def test_padding_slots_are_masked_and_carry_no_weight(keypair, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The unused slots of A's last batch must not show |x|: they hold a uniform mask only."""
    L = 64
    layout = SlotLayout.for_key(keypair.public, L)
    codes_A = np.zeros((1, 1), dtype=np.uint64)  # one real slot, K − 1 padding slots
    codes_B = np.full((3, 1), np.iinfo(np.uint64).max, dtype=np.uint64)  # |x| = L
    slices = encrypt_bit_slices(keypair, codes_A, layout, window=6)
    evaluated, _ = evaluate(keypair.public, slices, codes_B, window=6)
    for slots in _decrypted_slots(keypair, evaluated, layout):
        padding = slots[1:]
        assert len(set(padding)) == len(padding) and max(padding) >= 2 ** (layout.mask_bits - 8)
    # with the masks forced to zero the structure shows: h = L in the real slot, 0 in padding
    import crypto.secure_hamming as sh

    monkeypatch.setattr(sh, "draw_masks", lambda shape, bits: np.zeros(shape, dtype=np.uint64))
    evaluated, _ = evaluate(keypair.public, slices, codes_B, window=6)
    for slots in _decrypted_slots(keypair, evaluated, layout):
        assert slots == [L] + [0] * (layout.slots - 1)


def test_unmask_refuses_out_of_range_and_shape_mismatch() -> None:
    r = np.array([[5, 2**51 - 1]], dtype=np.uint64)
    np.testing.assert_array_equal(unmask_distances(r + np.uint64(3), r, 64), [[3, 3]])
    with pytest.raises(OutOfRange, match=r"outside \[0, 64\]"):
        unmask_distances(r + np.uint64(65), r, 64)
    with pytest.raises(OutOfRange, match="outside"):
        unmask_distances(r - np.uint64(1), r, 64)
    with pytest.raises(OutOfRange, match="shape"):
        unmask_distances(r, np.zeros((2, 2), dtype=np.uint64), 64)


def test_malformed_messages_are_refused(keypair) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(5)
    L = 64
    layout = SlotLayout.for_key(keypair.public, L)
    codes_A, codes_B = random_codes(rng, 4, L), random_codes(rng, 2, L)
    slices = encrypt_bit_slices(keypair, codes_A, layout, window=6)
    width = keypair.public.ciphertext_bytes
    data = slices.to_bytes()
    with pytest.raises(ProtocolError, match="bytes"):
        EncryptedSlices.from_bytes(data[:-1])
    with pytest.raises(ProtocolError, match="header"):
        EncryptedSlices.from_bytes(b"XCLPED01" + data[8:])
    zeroed = EncryptedSlices(layout, 4, bytes(width) + slices.ciphertexts[width:])
    with pytest.raises(ProtocolError, match="invertible"):
        evaluate(keypair.public, zeroed, codes_B)
    evaluated, _ = evaluate(keypair.public, slices, codes_B, window=6)
    too_big = EvaluatedDistances(layout, 4, 2, b"\xff" * width + evaluated.ciphertexts[width:])
    with pytest.raises(ProtocolError, match="not below"):
        decrypt_and_unpack(keypair, too_big, layout, 4)
    # a plaintext with bits above the last slot cannot come from an honest evaluation
    overflow = ciphertexts_to_bytes([keypair.public.encrypt(1 << (layout.slots * layout.width))], keypair.public)
    with pytest.raises(OutOfRange, match="above its last slot"):
        decrypt_and_unpack(keypair, EvaluatedDistances(layout, 4, 2, overflow + evaluated.ciphertexts[width:]), layout, 4)
    with pytest.raises(ProtocolError, match="expected"):
        decrypt_and_unpack(keypair, evaluated, layout, 5)


def test_bad_codes_are_refused(keypair) -> None:  # type: ignore[no-untyped-def]
    layout = SlotLayout.for_key(keypair.public, 100)
    with pytest.raises(InvalidInput, match="uint64"):
        encrypt_bit_slices(keypair, np.zeros((2, 2), dtype=np.int64), layout)
    with pytest.raises(InvalidInput, match="words per row"):
        encrypt_bit_slices(keypair, np.zeros((2, 1), dtype=np.uint64), layout)
    beyond = np.zeros((1, 2), dtype=np.uint64)
    beyond[0, 1] = np.uint64(1) << np.uint64(40)  # bit 104 >= L
    with pytest.raises(InvalidInput, match="beyond bit L"):
        code_bits(beyond, 100)
    other = SlotLayout(2048, 100)
    with pytest.raises(InvalidInput, match="modulus"):
        encrypt_bit_slices(keypair, np.zeros((1, 2), dtype=np.uint64), other)
