"""SecureHamming role A (docs/design.md §5.3): encrypt bit slices with the secret key, CRT-decrypt B's evaluation.

A never unpacks what it decrypts: t = (packed H + R) mod N is uniform in [0, N) (docs/secure_hamming.md).
The secret key reaches A's pool workers as ints over the pool's local pipes (same host, same
user); each worker builds its key's fixed-base tables once and caches them.
"""

from __future__ import annotations

from concurrent.futures import Executor
from functools import lru_cache

import numpy as np
from gmpy2 import mpz

from xclp.crypto.paillier import (
    DEFAULT_WINDOW,
    PaillierKeypair,
    PaillierPublicKey,
    SecretKeyEncryptor,
    ciphertexts_to_bytes,
    parse_ciphertexts,
)
from xclp.crypto.pool import run_tasks
from xclp.crypto.secure_hamming.layout import (
    EncryptedSlices,
    EvaluatedDistances,
    Residues,
    SlotLayout,
    code_bits,
    slice_plaintexts,
)
from xclp.errors import InvalidInput, ProtocolError

# ---- encrypt -----------------------------------------------------------------------------


# Per-process caches: a worker builds each key's fixed-base tables once, on its first task. The
# secret key reaches A's workers as ints over the pool's local pipes (same host, same user).
@lru_cache(maxsize=2)
def _keypair(p: int, q: int, h_s: int, exponent_bits: int) -> PaillierKeypair:
    return PaillierKeypair(PaillierPublicKey(p * q, h_s, exponent_bits), p, q)


@lru_cache(maxsize=2)
def _secret_encryptor(p: int, q: int, h_s: int, exponent_bits: int, window: int) -> SecretKeyEncryptor:
    return _keypair(p, q, h_s, exponent_bits).secret_encryptor(window)


def _secret_state(keypair: PaillierKeypair) -> tuple[int, int, int, int]:
    return int(keypair.p), int(keypair.q), int(keypair.public.h_s), keypair.public.exponent_bits


def _encrypt_batch(secret: tuple[int, int, int, int], window: int, bits: bytes, k_b: int, layout: SlotLayout) -> bytes:
    encryptor = _secret_encryptor(*secret, window)
    batch = np.frombuffer(bits, dtype=np.uint8).reshape(k_b, layout.L)
    cts = encryptor.encrypt_many(slice_plaintexts(batch, layout))
    return ciphertexts_to_bytes(cts, encryptor.keypair.public)


def encrypt_bit_slices(
    keypair: PaillierKeypair,
    codes: np.ndarray,
    layout: SlotLayout,
    executor: Executor | None = None,
    *,
    window: int = DEFAULT_WINDOW,
) -> EncryptedSlices:
    """Role A: encrypt bit slices of uint64[n_A, ⌈L/64⌉] codes, K vectors per plaintext."""
    if layout.modulus_bits != keypair.public.modulus_bits:
        raise InvalidInput(f"layout is for a {layout.modulus_bits}-bit modulus, key has {keypair.public.modulus_bits} "
                           f"bits")
    bits = code_bits(codes, layout.L)
    k = layout.slots
    tasks = [
        (_secret_state(keypair), window, bits[g * k : (g + 1) * k].tobytes(), len(bits[g * k : (g + 1) * k]), layout)
        for g in range(layout.batches(len(bits)))
    ]
    return EncryptedSlices(layout, len(bits), b"".join(run_tasks(_encrypt_batch, tasks, executor)))


# ---- decrypt --------------------------------------------------------


_DECRYPT_VALUES = 256  # ciphertexts per decryption task: fine enough to keep every worker busy on one piece


def _decrypt_chunk(secret: tuple[int, int, int, int], data: bytes) -> list[mpz]:
    keypair = _keypair(*secret)
    return [keypair.decrypt(c) for c in parse_ciphertexts(data, keypair.public)]


def decrypt_ciphertexts(keypair: PaillierKeypair, ciphertexts: bytes, executor: Executor | None = None) -> Residues:
    """Role A: CRT-decrypt fixed-width ciphertexts (B's D, any number of them) into t, in order.

    Tasks of `_DECRYPT_VALUES` ciphertexts, so one piece of the streamed SecureHamming spreads over
    every worker. A does not unpack: t is uniform in [0, N) and tells A nothing (module docstring).
    """
    size = 2 * keypair.public.modulus_bits // 8
    if len(ciphertexts) % size:
        raise ProtocolError(f"{len(ciphertexts)} bytes are not a whole number of {size}-byte ciphertexts")
    step = size * _DECRYPT_VALUES
    tasks = [(_secret_state(keypair), ciphertexts[i : i + step]) for i in range(0, len(ciphertexts), step)]
    t = [m for part in run_tasks(_decrypt_chunk, tasks, executor) for m in part]  # each < N (decryption)
    return Residues.from_ints(t, keypair.public.modulus_bits)


def decrypt(
    keypair: PaillierKeypair,
    evaluated: EvaluatedDistances,
    layout: SlotLayout,
    n_A: int,
    executor: Executor | None = None,
) -> Residues:
    """Role A: CRT-decrypt B's ciphertexts into t = (packed H + R) mod N, one value per D, for the coordinator.

    A does not unpack: t is uniform in [0, N) and tells A nothing (module docstring).
    """
    if evaluated.layout != layout or evaluated.n_A != n_A:
        raise ProtocolError(f"B evaluated {evaluated.layout}, n_A={evaluated.n_A}; expected {layout}, n_A={n_A}")
    if layout.modulus_bits != keypair.public.modulus_bits:
        raise InvalidInput(f"layout is for a {layout.modulus_bits}-bit modulus, key has {keypair.public.modulus_bits} "
                           f"bits")
    return decrypt_ciphertexts(keypair, evaluated.ciphertexts, executor)
