"""Packed SecureHamming gives exactly the plaintext Hamming matrix, hides it perfectly from A, and
the coordinator refuses anything an honest run cannot produce."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import gmpy2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from tests.oracles.decryption_floor import decrypt_all
from tests.oracles.literal_hamming import literal_decrypt, literal_encrypt_bits, literal_evaluate, literal_unmask
from xclp.crypto.paillier import ciphertexts_to_bytes, parse_ciphertexts
from xclp.crypto.secure_hamming import (
    EncryptedSlices,
    EvaluatedDistances,
    Residues,
    SlotLayout,
    choose_group_bits,
    code_bits,
    decrypt,
    encrypt_bit_slices,
    evaluate,
    occupied_ones,
    unmask_distances,
)
from xclp.errors import InvalidInput, OutOfRange, ProtocolError


def random_codes(rng: np.random.Generator, n: int, L: int) -> np.ndarray:
    """uint64[n, ⌈L/64⌉] with bits beyond L zero."""
    bits = rng.integers(0, 2, size=(n, -(-L // 64) * 64), dtype=np.uint8)
    bits[:, L:] = 0
    return np.packbits(bits, axis=1, bitorder="little").view("<u8").astype(np.uint64)


def plaintext_hamming(codes_B: np.ndarray, codes_A: np.ndarray) -> np.ndarray:
    """Oracle: popcount of XOR on the packed uint64 words, int64[n_B, n_A]."""
    xor = codes_B[:, None, :] ^ codes_A[None, :, :]
    return np.unpackbits(xor.view(np.uint8), axis=2).sum(axis=2).astype(np.int64)


def packed_oracle(H: np.ndarray, layout: SlotLayout) -> list[int]:
    """What (t − R) mod N must be, per ciphertext D in batch-major order: Σ_s h_s·2^(ws), padding 0."""
    n_B, n_A = H.shape
    out = []
    for g in range(layout.batches(n_A)):
        cols = H[:, g * layout.slots : (g + 1) * layout.slots]
        for x in range(n_B):
            out.append(sum(int(h) << (layout.width * s) for s, h in enumerate(cols[x])))
    return out


def run_packed(keypair, codes_A, codes_B, L, *, executor=None, group_bits=None, via_bytes=True):  # type: ignore[no-untyped-def]
    """(t, R, H) of one packed run, every message through its wire form when `via_bytes`."""
    layout = SlotLayout.for_key(keypair.public, L)
    slices = encrypt_bit_slices(keypair, codes_A, layout, executor, window=6)
    if via_bytes:  # what really travels between A and B, and to the coordinator
        slices = EncryptedSlices.from_bytes(slices.to_bytes())
    evaluated, r = evaluate(keypair.public, slices, codes_B, executor, group_bits=group_bits, window=6)
    if via_bytes:
        evaluated = EvaluatedDistances.from_bytes(evaluated.to_bytes())
    t = decrypt(keypair, evaluated, layout, len(codes_A), executor)
    if via_bytes:
        count = layout.values(len(codes_A), len(codes_B))
        t = Residues.from_array(t.to_array(), layout.modulus_bits, count)
        r = Residues.from_array(r.to_array(), layout.modulus_bits, count)
    return t, r, unmask_distances(t, r, keypair.public, layout, len(codes_A), len(codes_B))


# ---- layout -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("modulus_bits", "L", "width", "slots"),
    [(2048, 1024, 11, 186), (2048, 64, 7, 292), (2048, 4096, 13, 157),
     (3072, 1024, 11, 279), (3072, 64, 7, 438), (3072, 4096, 13, 236)],
)
def test_layout_numbers(modulus_bits: int, L: int, width: int, slots: int) -> None:
    lay = SlotLayout(modulus_bits, L)
    assert (lay.width, lay.slots, lay.value_bytes) == (width, slots, modulus_bits // 8)
    assert 2 ** (width - 1) <= L < 2**width  # w = ⌈log2(L+1)⌉: the smallest width that holds L
    assert slots * width <= modulus_bits - 2 < (slots + 1) * width  # packed value < 2^(|N|−2) < N, K maximal
    # ~4.8x more slots than the per-slot σ = 40 masks of docs/design.md §5.3 (w = 52, K = 39 for 2048/1024)
    if (modulus_bits, L) == (2048, 1024):
        assert slots / ((2048 - 2) // 52) > 4.7


def test_layout_refuses_impossible_parameters() -> None:
    with pytest.raises(InvalidInput, match="cannot hold"):
        SlotLayout(16, 65535)
    with pytest.raises(InvalidInput, match="L"):
        SlotLayout(2048, 0)
    with pytest.raises(InvalidInput, match="bytes"):
        SlotLayout(2047, 64)


def test_group_bits_choice_minimises_products() -> None:
    assert choose_group_bits(1024, 1000) == 8
    assert choose_group_bits(1024, 1) == 1  # one vector: no table pays off
    assert choose_group_bits(64, 10**6) == 11  # 6 groups for g = 11 or 12; g = 11 has smaller tables
    assert choose_group_bits(64, 10**6, max_bits=8) == 8


# ---- exactness ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("L", "n_A", "n_B", "group_bits"),
    [(64, 147, 3, None), (64, 146, 2, 5), (128, 130, 3, 3), (100, 8, 3, 7), (1024, 95, 3, None),
     (1024, 93, 2, 11), (4096, 80, 2, 8)],
)
def test_packed_protocol_equals_plaintext_hamming(keypair, L, n_A, n_B, group_bits) -> None:  # type: ignore[no-untyped-def]
    """1024-bit key: K = 146 for L = 64 (n_A = 147: a full batch + 1), 127 for L = 128, 92 for
    L = 1024 (93, 95: one slot or three into a second batch), 78 for L = 4096."""
    rng = np.random.default_rng(L * 1000 + n_A)
    codes_A, codes_B = random_codes(rng, n_A, L), random_codes(rng, n_B, L)
    _, _, H = run_packed(keypair, codes_A, codes_B, L, group_bits=group_bits)
    assert H.dtype == np.uint16 and H.shape == (n_B, n_A)
    np.testing.assert_array_equal(H, plaintext_hamming(codes_B, codes_A))


def test_all_zero_and_all_one_vectors(keypair) -> None:  # type: ignore[no-untyped-def]
    """Extreme distances 0 and L in every slot, and the largest |x| = L added to every slot."""
    L = 128
    layout = SlotLayout.for_key(keypair.public, L)
    zeros = np.zeros((1, 2), dtype=np.uint64)
    ones = np.full((1, 2), np.iinfo(np.uint64).max, dtype=np.uint64)
    codes_A = np.vstack([zeros, ones] * ((layout.slots + 3) // 2 + 1))[: layout.slots + 3]  # one batch + 3
    codes_B = np.vstack([zeros, ones])
    _, _, H = run_packed(keypair, codes_A, codes_B, L)
    a_is_one = np.arange(len(codes_A)) % 2 == 1
    np.testing.assert_array_equal(H, np.vstack([np.where(a_is_one, L, 0), np.where(a_is_one, 0, L)]))


def test_literal_and_packed_agree(keypair) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    L = 64
    codes_A, codes_B = random_codes(rng, 3, L), random_codes(rng, 2, L)
    pub = keypair.public.to_phe()
    enc = literal_encrypt_bits(pub, codes_A, L)
    evaluated, r = literal_evaluate(pub, enc, codes_B, L)
    t = literal_decrypt(keypair.to_phe(), evaluated)
    assert all(0 <= v < pub.n for row in t + r for v in row)
    H_literal = literal_unmask(t, r, pub.n, L)
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
    codes_A, codes_B = random_codes(rng, 150, L), random_codes(rng, 6, L)  # K = 113: two batches
    with ProcessPoolExecutor(max_workers=2) as pool:
        _, _, H = run_packed(keypair, codes_A, codes_B, L, executor=pool)
    np.testing.assert_array_equal(H, plaintext_hamming(codes_B, codes_A))


# ---- what A and the coordinator see --------------------------------------------------------------


def test_t_is_uniform_mod_N_whatever_h_is(keypair) -> None:  # type: ignore[no-untyped-def]
    """A sees t = (P + R) mod N, P the packed distances. With R uniform in [0, N), t is uniform in
    [0, N) for every P: bin t·16/N and the low byte and compare to uniform (χ²). R comes from
    `secrets`, so this test is random: each p-value threshold of 1e-6 is a ~1e-6 false alarm."""
    rng = np.random.default_rng(3)
    L = 64
    layout = SlotLayout.for_key(keypair.public, L)
    codes_A = np.zeros((layout.slots, 1), dtype=np.uint64)  # h = |x| in every slot: P as structured as it gets
    codes_B = random_codes(rng, 400, L)
    t, r, H = run_packed(keypair, codes_A, codes_B, L, via_bytes=False)
    np.testing.assert_array_equal(H, plaintext_hamming(codes_B, codes_A))
    n = int(keypair.public.n)
    t_int, r_int = t.to_ints(), r.to_ints()
    assert max(t_int) < n and max(r_int) < n
    high = np.array([v * 16 // n for v in t_int])
    low = np.array([v & 0xFF for v in t_int])
    assert stats.chisquare(np.bincount(high, minlength=16)).pvalue > 1e-6
    assert stats.chisquare(np.bincount(low, minlength=256)).pvalue > 1e-6
    # the test has teeth: unmasked P < 2^(K·w) < N/2, so it never reaches the upper half of [0, N)
    packed = np.array([(a - b) % n * 16 // n for a, b in zip(t_int, r_int)])
    assert packed.max() < 8


def test_t_minus_R_is_exactly_the_packed_distances_with_zero_padding(keypair) -> None:  # type: ignore[no-untyped-def]
    """(t − R) mod N reveals the packed H and nothing else: bits above the last slot and padding slots are 0."""
    rng = np.random.default_rng(17)
    L = 100
    layout = SlotLayout.for_key(keypair.public, L)
    n_A, n_B = layout.slots + 5, 4  # second batch: 5 real slots, K − 5 padding slots
    codes_A, codes_B = random_codes(rng, n_A, L), random_codes(rng, n_B, L)
    t, r, H = run_packed(keypair, codes_A, codes_B, L)
    n = int(keypair.public.n)
    packed = [(a - b) % n for a, b in zip(t.to_ints(), r.to_ints())]
    assert packed == packed_oracle(plaintext_hamming(codes_B, codes_A), layout)
    assert all(p >> (layout.width * 5) == 0 for p in packed[n_B:])  # last batch: nothing past slot 4
    assert occupied_ones(layout, n_A, 1) == sum(1 << (layout.width * s) for s in range(5))


def test_evaluation_carries_fresh_randomness(keypair) -> None:  # type: ignore[no-untyped-def]
    """A knows its ciphertexts; given x and R it must not be able to rebuild D (docs/design.md §5.3)."""
    rng = np.random.default_rng(13)
    L = 64
    layout = SlotLayout.for_key(keypair.public, L)
    codes_A, codes_B = random_codes(rng, layout.slots, L), random_codes(rng, 2, L)  # one full batch
    slices = encrypt_bit_slices(keypair, codes_A, layout, window=6)
    evaluated, r = evaluate(keypair.public, slices, codes_B, window=6)
    n, n2 = keypair.public.n, keypair.public.nsquare
    cts = parse_ciphertexts(slices.ciphertexts, keypair.public)
    ones = occupied_ones(layout, layout.slots, 0)
    for x, (bits, mask) in enumerate(zip(code_bits(codes_B, L), r.to_ints())):
        m = (int(bits.sum()) * ones + mask) % n
        guess = (1 + m * n) % n2
        for bit, c in zip(bits, cts):
            guess = guess * (c if bit == 0 else gmpy2.invert(c, n2)) % n2
        d = parse_ciphertexts(evaluated.batch(0), keypair.public)[x]
        assert keypair.decrypt(d) == keypair.decrypt(guess)  # same plaintext ...
        assert d != guess  # ... but B's fresh factor h_s^a makes it a different ciphertext


def test_masks_are_fresh_for_every_ciphertext(keypair, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """R is drawn per ciphertext from `secrets.randbelow(N)`; with R forced to 0, A would see P itself."""
    import xclp.crypto.secure_hamming.role_b as sh

    L = 64
    layout = SlotLayout.for_key(keypair.public, L)
    codes_A = np.zeros((1, 1), dtype=np.uint64)
    codes_B = np.full((3, 1), np.iinfo(np.uint64).max, dtype=np.uint64)  # |x| = L: h = L for each x
    slices = encrypt_bit_slices(keypair, codes_A, layout, window=6)
    _, r = evaluate(keypair.public, slices, codes_B, window=6)
    assert len(set(r.to_ints())) == 3
    calls: list[int] = []
    monkeypatch.setattr(sh.secrets, "randbelow", lambda bound: calls.append(bound) or 0)
    evaluated, r = evaluate(keypair.public, slices, codes_B, window=6)
    assert calls == [int(keypair.public.n)] * 3 and r.to_ints() == [0, 0, 0]
    assert decrypt(keypair, evaluated, layout, 1).to_ints() == [L, L, L]  # only slot 0; padding 0


# ---- the coordinator's checks ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def honest_run(keypair):  # type: ignore[no-untyped-def]
    """L = 100 (w = 7), n_A = K + 2 (second batch mostly padding), n_B = 3, and the true H."""
    rng = np.random.default_rng(29)
    L = 100
    layout = SlotLayout.for_key(keypair.public, L)
    codes_A, codes_B = random_codes(rng, layout.slots + 2, L), random_codes(rng, 3, L)
    t, r, H = run_packed(keypair, codes_A, codes_B, L)
    return layout, t, r, H


def _with(values: Residues, index: int, new: int) -> Residues:
    ints = values.to_ints()
    ints[index] = new
    return Residues.from_ints(ints, values.modulus_bits)


def _unmask(keypair, layout, t, r):  # type: ignore[no-untyped-def]
    return unmask_distances(t, r, keypair.public, layout, layout.slots + 2, 3)


def test_honest_values_unmask(keypair, honest_run, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    layout, t, r, H = honest_run
    np.testing.assert_array_equal(_unmask(keypair, layout, t, r), H)
    np.testing.assert_array_equal(unmask_distances(t, r, int(keypair.public.n), layout, layout.slots + 2, 3), H)
    from xclp.crypto.secure_hamming import unmask
    monkeypatch.setattr(unmask, "_UNPACK_VALUES", 4)  # 6 values unpacked in chunks of 4 and 2: the same H
    np.testing.assert_array_equal(_unmask(keypair, layout, t, r), H)


@pytest.mark.parametrize("which", ["t", "r"])
@settings(max_examples=25, deadline=None)
@given(bit=st.integers(min_value=14, max_value=1023))
def test_one_flipped_bit_outside_the_real_slots_is_refused(keypair, honest_run, which, bit) -> None:  # type: ignore[no-untyped-def]
    """Flip one bit of t or R of a last-batch ciphertext (2 real slots of w = 7 bits: bits 0..13).
    (t − R) mod N then changes by ±2^bit (mod N), which sets a padding slot, a bit above the last
    slot, or makes the value reach N. (A flip inside a real slot may only move a distance within
    [0, L] and cannot be detected — no masking scheme can; the range test below covers leaving it.)"""
    layout, t, r, _ = honest_run
    assert layout.width == 7
    index = 3 + 1  # batch 1, x = 1
    target = t if which == "t" else r
    tampered = _with(target, index, target.to_ints()[index] ^ (1 << bit))
    with pytest.raises(OutOfRange):
        _unmask(keypair, layout, *((tampered, r) if which == "t" else (t, tampered)))


def test_a_slot_pushed_above_L_is_refused(keypair, honest_run) -> None:  # type: ignore[no-untyped-def]
    layout, t, r, H = honest_run
    n, L, w = int(keypair.public.n), layout.L, layout.width
    s, x = 5, 2  # slot 5 of batch 0 for B's vector 2: distance H[2, 5]
    bump = (L + 1 - int(H[x, s])) << (w * s)  # exactly L + 1, still inside the slot's w bits
    with pytest.raises(OutOfRange, match=r"outside \[0, 100\] \(first at \[2, 5\]\)"):
        _unmask(keypair, layout, _with(t, x, (t.to_ints()[x] + bump) % n), r)
    with pytest.raises(OutOfRange, match="outside"):  # the same through R
        _unmask(keypair, layout, t, _with(r, x, (r.to_ints()[x] - bump) % n))


def test_padding_high_bits_and_range_checks_name_the_problem(keypair, honest_run) -> None:  # type: ignore[no-untyped-def]
    layout, t, r, _ = honest_run
    n, w, k = int(keypair.public.n), layout.width, layout.slots
    last = 3 + 0  # batch 1, x = 0: slots 0 and 1 real, 2.. padding
    with pytest.raises(OutOfRange, match="padding slots"):
        _unmask(keypair, layout, _with(t, last, (t.to_ints()[last] + (1 << (w * 2))) % n), r)
    with pytest.raises(OutOfRange, match="above its last slot"):
        _unmask(keypair, layout, _with(t, 0, (t.to_ints()[0] + (1 << (w * k))) % n), r)
    packed = (t.to_ints()[last] - r.to_ints()[last]) % n
    with pytest.raises(OutOfRange, match="above its last slot"):  # P − (P + 1) wraps to N − 1
        _unmask(keypair, layout, _with(t, last, (t.to_ints()[last] - packed - 1) % n), r)
    with pytest.raises(OutOfRange, match="not below"):
        _unmask(keypair, layout, _with(t, 0, n), r)
    with pytest.raises(OutOfRange, match="not below"):
        _unmask(keypair, layout, t, _with(r, 1, n + 5))
    with pytest.raises(OutOfRange, match="must hold"):
        unmask_distances(t, r, keypair.public, layout, layout.slots + 2, 4)
    with pytest.raises(InvalidInput, match="modulus"):
        unmask_distances(t, r, 2**2047 + 1, layout, layout.slots + 2, 3)


def test_residues_wire_form_is_checked() -> None:
    values = Residues.from_ints([0, 1, 2**63 + 5], 64)
    assert values.data[:8] == bytes(8) and values.data[8:16] == (1).to_bytes(8, "big")  # fixed-width big-endian
    arr = values.to_array()
    assert arr.dtype == np.uint8 and arr.shape == (3, 8)
    assert Residues.from_array(arr, 64, 3) == values
    with pytest.raises(InvalidInput, match=r"uint8\[4, 8\]"):
        Residues.from_array(arr, 64, 4)
    with pytest.raises(InvalidInput, match=r"uint8\[3, 8\]"):
        Residues.from_array(arr.astype(np.uint16), 64, 3)
    with pytest.raises(ProtocolError, match="whole number"):
        Residues(64, bytes(9))
    with pytest.raises(InvalidInput, match="fit"):
        Residues.from_ints([2**64], 64)
    with pytest.raises(InvalidInput, match="fit"):
        Residues.from_ints([-1], 64)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**128 - 1), max_size=20))
def test_residues_round_trip(values: list[int]) -> None:
    packed = Residues.from_ints(values, 128)
    assert packed.count == len(values) and packed.to_ints() == values
    assert Residues.from_array(packed.to_array(), 128, len(values)).to_ints() == values


# ---- malformed messages -----------------------------------------------------------------------------


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
        EncryptedSlices.from_bytes(b"XCLPED02" + data[8:])
    with pytest.raises(ProtocolError, match="header"):  # the per-slot-mask format of before
        EncryptedSlices.from_bytes(b"XCLPSL01" + data[8:])
    zeroed = EncryptedSlices(layout, 4, bytes(width) + slices.ciphertexts[width:])
    with pytest.raises(ProtocolError, match="invertible"):
        evaluate(keypair.public, zeroed, codes_B)
    evaluated, _ = evaluate(keypair.public, slices, codes_B, window=6)
    too_big = EvaluatedDistances(layout, 4, 2, b"\xff" * width + evaluated.ciphertexts[width:])
    with pytest.raises(ProtocolError, match="not below"):
        decrypt(keypair, too_big, layout, 4)
    with pytest.raises(ProtocolError, match="expected"):
        decrypt(keypair, evaluated, layout, 5)
    with pytest.raises(ProtocolError, match="header"):
        EvaluatedDistances.from_bytes(b"XCLPED01" + evaluated.to_bytes()[8:])


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


# ---- B's masks from a seed (streamed SecureHamming, docs/design.md §10.1) ---------------------------------


def _bucket_pvalue(masks: list[int], modulus: int, buckets: int = 16) -> float:
    from scipy import stats

    counts = np.bincount([m * buckets // modulus for m in masks], minlength=buckets)
    return float(stats.chisquare(counts).pvalue)


def test_seeded_masks_are_below_N_the_same_piece_by_piece_and_uniform() -> None:
    from xclp.crypto.secure_hamming import draw_mask_seed, masks_from_seed

    modulus = 3 << 510  # 0.75 · 2^512: reducing a 512-bit value mod N without headroom is visibly biased
    seed = draw_mask_seed()
    whole = masks_from_seed(seed, modulus, 0, 4000)
    assert all(0 <= m < modulus for m in whole)
    assert masks_from_seed(seed, modulus, 1234, 700) == whole[1234:1934]  # any range on its own
    assert masks_from_seed(draw_mask_seed(), modulus, 0, 10) != whole[:10]
    assert _bucket_pvalue(whole, modulus) > 1e-4


def test_the_uniformity_check_catches_masks_reduced_without_headroom(monkeypatch) -> None:
    """The check above can fail: without the 128 extra bits, values below 2^512 − N come twice as often."""
    import xclp.crypto.secure_hamming.masks as masks

    monkeypatch.setattr(masks, "_EXTRA_BYTES", 0)
    modulus = 3 << 510
    assert _bucket_pvalue(masks.masks_from_seed(masks.draw_mask_seed(), modulus, 0, 4000), modulus) < 1e-12


def test_seeded_masks_refuse_a_bad_seed_or_range() -> None:
    from xclp.crypto.secure_hamming import masks_from_seed

    with pytest.raises(InvalidInput, match="32 bytes"):
        masks_from_seed(bytes(16), 101, 0, 1)
    with pytest.raises(InvalidInput, match="non-negative range"):
        masks_from_seed(bytes(32), 101, -1, 1)


def test_evaluate_batches_piece_by_piece_equals_the_whole_evaluation(keypair) -> None:
    """Pieces of A's batches, each masked with its own range of seeded masks, decrypt to the same
    t as one evaluation of every batch with those masks: the streamed protocol computes the same."""
    from xclp.crypto.secure_hamming import decrypt_ciphertexts, evaluate_batches, masks_from_seed

    rng = np.random.default_rng(3)
    L, n_a, n_b = 16, 450, 4  # K = 204 at |N| = 1024: three batches
    layout = SlotLayout(keypair.public.modulus_bits, L)
    codes_a, codes_b = (rng.integers(0, 1 << L, size=(n, 1), dtype=np.uint64) for n in (n_a, n_b))
    slices = encrypt_bit_slices(keypair, codes_a, layout)
    seed, n = bytes(range(32)), int(keypair.public.n)
    total = layout.batches(n_a)
    assert total >= 3
    whole = decrypt_ciphertexts(keypair, evaluate_batches(keypair.public, slices, codes_b, range(total),
                                                          masks_from_seed(seed, n, 0, total * n_b)))
    pieces = b"".join(
        decrypt_ciphertexts(keypair, evaluate_batches(keypair.public, slices, codes_b, range(g, g + 1),
                                                      masks_from_seed(seed, n, g * n_b, n_b), split=2)).data
        for g in range(total))
    assert pieces == whole.data
