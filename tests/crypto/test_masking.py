"""Pairwise masks (docs/design.md §4.2, §5.6, §6): cancellation, uniformity, key freshness, replay refusal,
keystream against AES-CTR and NIST SP 800-38A."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from xclp.crypto.kdf import derive_key
from xclp.crypto.masking import (
    PairwiseMasker,
    generate_x25519,
    keystream,
    public_bytes,
    ring_sum,
    shared_secret,
)
from xclp.errors import InvalidInput, ProtocolError, ReplayRefused

SESSION = b"test-session"


def fixed_key(name: str) -> X25519PrivateKey:
    """Deterministic X25519 keys so statistical tests are reproducible."""
    return X25519PrivateKey.from_private_bytes(hashlib.sha256(b"xclp-test/" + name.encode()).digest())


def maskers(ids: list[str], *, fixed: bool = True) -> dict[str, PairwiseMasker]:
    sks = {i: fixed_key(i) if fixed else generate_x25519() for i in ids}
    pks = {i: public_bytes(sk) for i, sk in sks.items()}
    return {
        i: PairwiseMasker(i, {j: shared_secret(sks[i], pks[j]) for j in ids if j != i}, SESSION) for i in ids
    }


def byte_chi2_pvalue(arr: np.ndarray) -> float:
    counts = np.bincount(arr.view(np.uint8).ravel(), minlength=256)
    return float(stats.chisquare(counts).pvalue)


# --- key agreement -------------------------------------------------------------------------------


def test_x25519_secret_is_symmetric_and_32_bytes() -> None:
    a, b = generate_x25519(), generate_x25519()
    ss = shared_secret(a, public_bytes(b))
    assert len(public_bytes(a)) == 32 and len(ss) == 32
    assert ss == shared_secret(b, public_bytes(a))


def test_x25519_rfc7748_vector() -> None:
    # RFC 7748 §6.1 Diffie-Hellman test vector.
    alice = X25519PrivateKey.from_private_bytes(
        bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    )
    bob_pk = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
    assert public_bytes(alice).hex() == "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
    assert shared_secret(alice, bob_pk).hex() == "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"


@pytest.mark.parametrize("peer", [bytes(31), bytes(33), "not bytes"])
def test_wrong_length_peer_key_refused(peer: object) -> None:
    with pytest.raises(ProtocolError, match="32 bytes"):
        shared_secret(generate_x25519(), peer)  # type: ignore[arg-type]


@pytest.mark.parametrize("low_order", [bytes(32), (1).to_bytes(32, "little")])
def test_low_order_peer_key_refused(low_order: bytes) -> None:
    with pytest.raises(ProtocolError, match="low-order"):
        shared_secret(generate_x25519(), low_order)


# --- keystream -----------------------------------------------------------------------------------


def test_keystream_matches_nist_sp800_38a_f55_ctr_aes256() -> None:
    key = bytes.fromhex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4")
    counter = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")
    plaintext = bytes.fromhex(
        "6bc1bee22e409f96e93d7e117393172a" "ae2d8a571e03ac9c9eb76fac45af8e51"
        "30c81c46a35ce411e5fbc1191a0a52ef" "f69f2445df4f9b17ad2b417be66c3710"
    )
    ciphertext = bytes.fromhex(
        "601ec313775789a5b7a7f504bbf3d228" "f443e3ca4d62b59aca84e990cacaf5c5"
        "2b0930daa23de94ce87017ba2d84988d" "dfc9c58db67aada613c2dd08457941a6"
    )
    ks = keystream(key, 8, np.uint64, counter=counter).astype("<u8").tobytes()
    assert bytes(p ^ k for p, k in zip(plaintext, ks, strict=True)) == ciphertext


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_keystream_is_aes256_ctr_zero_counter_little_endian(dtype: type) -> None:
    key = hashlib.sha256(b"k").digest()
    count = 1001  # not a multiple of the block size
    width = np.dtype(dtype).itemsize
    enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    expected = np.frombuffer(enc.update(bytes(count * width)), dtype=np.dtype(dtype).newbyteorder("<"))
    got = keystream(key, count, dtype)
    assert got.dtype == np.dtype(dtype) and got.shape == (count,)
    np.testing.assert_array_equal(got, expected)
    assert got.flags.writeable


def test_keystream_refuses_bad_arguments() -> None:
    with pytest.raises(InvalidInput, match="32 bytes"):
        keystream(bytes(16), 4, np.uint64)
    with pytest.raises(InvalidInput, match="uint32 or uint64"):
        keystream(bytes(32), 4, np.int64)
    with pytest.raises(InvalidInput, match="count"):
        keystream(bytes(32), -1, np.uint64)
    assert keystream(bytes(32), 0, np.uint32).shape == (0,)


# --- cancellation --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
@pytest.mark.parametrize("n_parties", [3, 4, 5, 7])
def test_masks_cancel_mod_2_bits(dtype: type, n_parties: int) -> None:
    ids = [f"party-{i}" for i in range(n_parties)]
    ms = maskers(ids, fixed=False)
    rng = np.random.default_rng(n_parties)
    info = np.iinfo(dtype)
    raw = [rng.integers(0, info.max, size=(17, 5), dtype=dtype, endpoint=True) for _ in ids]
    masked = [ms[i].apply(x, purpose="rowsums", attempt=0, participants=ids) for i, x in zip(ids, raw, strict=True)]
    for x, y in zip(raw, masked, strict=True):
        assert y.dtype == x.dtype and y.shape == x.shape
        assert not np.array_equal(x, y)
    np.testing.assert_array_equal(ring_sum(masked), ring_sum(raw))
    # The masks themselves sum to zero, with a fresh attempt.
    masks = [ms[i].mask((17, 5), dtype, purpose="rowsums", attempt=1, participants=ids) for i in ids]
    assert not ring_sum(masks).any()


def test_masks_cancel_over_a_subset_after_a_dropout() -> None:
    ids = ["a", "b", "c", "d"]
    ms = maskers(ids)
    survivors = ["a", "c", "d"]  # b dropped; the step restarts without it (docs/design.md §5.6)
    raw = {i: np.full(8, ord(i), dtype=np.uint64) for i in survivors}
    masked = [ms[i].apply(raw[i], purpose="rowsums", attempt=1, participants=survivors) for i in survivors]
    np.testing.assert_array_equal(ring_sum(masked), np.full(8, sum(map(ord, survivors)), dtype=np.uint64))


def test_sign_convention_plus_for_smaller_id() -> None:
    ms = maskers(["a", "b"])
    ss = ms["a"].secrets["b"]
    key = derive_key(ss, session_id=SESSION, purpose="p", attempt=0, participants=["a", "b"])
    ks = keystream(key, 6, np.uint64)
    np.testing.assert_array_equal(ms["a"].mask(6, np.uint64, purpose="p", attempt=0, participants=["a", "b"]), ks)
    np.testing.assert_array_equal(ms["b"].mask(6, np.uint64, purpose="p", attempt=0, participants=["b", "a"]), -ks)


def test_apply_never_mutates_input() -> None:
    ms = maskers(["a", "b"])
    x = np.arange(10, dtype=np.uint32)
    before = x.copy()
    y = ms["a"].apply(x, purpose="p", attempt=0, participants=["a", "b"])
    np.testing.assert_array_equal(x, before)
    assert y is not x


def test_single_participant_mask_is_zero() -> None:
    ms = maskers(["a", "b"])
    assert not ms["a"].mask(5, np.uint64, purpose="p", attempt=0, participants=["a"]).any()


# --- hiding --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_masked_arrays_look_uniform_while_raw_counts_do_not(dtype: type) -> None:
    ids = ["h1", "h2", "h3"]
    ms = maskers(ids)
    counts = np.random.default_rng(7).poisson(3.0, size=50_000).astype(dtype)  # skewed, small counts
    masked = ms["h1"].apply(counts, purpose="flynn", attempt=0, participants=ids)
    assert byte_chi2_pvalue(counts) < 1e-12
    assert byte_chi2_pvalue(masked) > 1e-3
    bits = np.iinfo(dtype).bits
    assert stats.kstest(masked.astype(np.float64) / 2.0**bits, "uniform").pvalue > 1e-3
    assert stats.kstest(counts.astype(np.float64) / 2.0**bits, "uniform").pvalue < 1e-12


def test_different_bindings_give_independent_masks() -> None:
    ids = ["a", "b", "c"]
    shape = 20_000
    variants = [
        ("p", 0, ids),
        ("q", 0, ids),  # other purpose
        ("p", 1, ids),  # other attempt
        ("p", 0, ["a", "b"]),  # other participant set (same peer b!)
    ]
    masks = [maskers(ids)["a"].mask(shape, np.uint64, purpose=p, attempt=r, participants=ps) for p, r, ps in variants]
    for i in range(len(masks)):
        for j in range(i + 1, len(masks)):
            assert byte_chi2_pvalue(masks[i] - masks[j]) > 1e-4
            assert byte_chi2_pvalue(masks[i] ^ masks[j]) > 1e-4


def test_different_sessions_give_different_masks() -> None:
    sks = {i: fixed_key(i) for i in "ab"}
    ss = shared_secret(sks["a"], public_bytes(sks["b"]))
    m1 = PairwiseMasker("a", {"b": ss}, b"s1").mask(64, np.uint64, purpose="p", attempt=0, participants=["a", "b"])
    m2 = PairwiseMasker("a", {"b": ss}, b"s2").mask(64, np.uint64, purpose="p", attempt=0, participants=["a", "b"])
    assert not np.array_equal(m1, m2)


# --- replay and validation -----------------------------------------------------------------------


def test_replay_refused_but_new_attempt_allowed() -> None:
    ms = maskers(["a", "b", "c"])
    x = np.zeros(4, dtype=np.uint64)
    ms["a"].apply(x, purpose="rowsums", attempt=0, participants=["a", "b", "c"])
    with pytest.raises(ReplayRefused, match="new attempt"):
        ms["a"].apply(x + 1, purpose="rowsums", attempt=0, participants=["c", "b", "a"])
    with pytest.raises(ReplayRefused):
        ms["a"].mask(4, np.uint64, purpose="rowsums", attempt=0, participants=["a", "b", "c"])
    ms["a"].apply(x, purpose="rowsums", attempt=1, participants=["a", "b", "c"])
    ms["a"].apply(x, purpose="rowsums", attempt=0, participants=["a", "c"])
    ms["a"].apply(x, purpose="other", attempt=0, participants=["a", "b", "c"])


def test_invalid_call_does_not_consume_the_attempt() -> None:
    ms = maskers(["a", "b"])
    with pytest.raises(InvalidInput):
        ms["a"].apply(np.zeros(3, np.int64), purpose="p", attempt=0, participants=["a", "b"])
    ms["a"].apply(np.zeros(3, np.uint64), purpose="p", attempt=0, participants=["a", "b"])


@pytest.mark.parametrize(
    ("participants", "message"),
    [
        (["b", "c"], "include my own id"),
        (["a", "b", "zed"], "no shared secret with participant\\(s\\) zed"),
        (["a", "b", "b"], "repeated: b"),
        ("ab", "not a single string"),
    ],
)
def test_bad_participants_refused(participants: object, message: str) -> None:
    ms = maskers(["a", "b", "c"])
    with pytest.raises(InvalidInput, match=message):
        ms["a"].apply(np.zeros(2, np.uint64), purpose="p", attempt=0, participants=participants)  # type: ignore[arg-type]


def test_bad_masker_construction_refused() -> None:
    with pytest.raises(InvalidInput, match="my own id"):
        PairwiseMasker("a", {"a": bytes(32)}, SESSION)
    with pytest.raises(InvalidInput, match="32 bytes"):
        PairwiseMasker("a", {"b": bytes(16)}, SESSION)
    with pytest.raises(InvalidInput, match="session_id"):
        PairwiseMasker("a", {"b": bytes(32)}, b"")


def test_masker_keeps_its_own_copy_of_secrets() -> None:
    secrets = {"b": bytes(range(32))}
    m = PairwiseMasker("a", secrets, SESSION)
    secrets["b"] = bytes(32)
    assert m.secrets["b"] == bytes(range(32))
    with pytest.raises(TypeError):
        m.secrets["b"] = bytes(32)  # type: ignore[index]


def test_bad_purpose_refused() -> None:
    ms = maskers(["a", "b"])
    with pytest.raises(InvalidInput, match="'/'"):
        ms["a"].mask(2, np.uint64, purpose="a/b", attempt=0, participants=["a"])


# --- ring_sum ------------------------------------------------------------------------------------


@settings(max_examples=50)
@given(st.lists(st.lists(st.integers(0, 2**64 - 1), min_size=3, max_size=3), min_size=1, max_size=6))
def test_ring_sum_is_python_sum_mod_2_64(rows: list[list[int]]) -> None:
    arrays = [np.array(r, dtype=np.uint64) for r in rows]
    expected = [sum(col) % 2**64 for col in zip(*rows, strict=True)]
    assert ring_sum(arrays).tolist() == expected


def test_ring_sum_refuses_mismatch() -> None:
    with pytest.raises(InvalidInput, match="at least one"):
        ring_sum([])
    with pytest.raises(InvalidInput, match="array 1"):
        ring_sum([np.zeros(3, np.uint64), np.zeros(3, np.uint32)])
    with pytest.raises(InvalidInput, match="array 1"):
        ring_sum([np.zeros(3, np.uint64), np.zeros(4, np.uint64)])
    with pytest.raises(InvalidInput, match="uint32 or uint64"):
        ring_sum([np.zeros(3, np.int64)])
    first = np.ones(3, np.uint32)
    ring_sum([first, first])
    assert first.tolist() == [1, 1, 1]


def test_concurrent_replays_let_exactly_one_call_through() -> None:
    ms = maskers(["a", "b"])
    x = np.zeros(50_000, dtype=np.uint64)

    def attempt(_: int) -> bool:
        try:
            ms["a"].apply(x, purpose="p", attempt=7, participants=["a", "b"])
        except ReplayRefused:
            return False
        return True

    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(attempt, range(8)))
    assert outcomes.count(True) == 1
