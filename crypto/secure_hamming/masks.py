"""B's masks R from one seed per pair (docs/design.md §5.3, §10.1), so that R never has to travel or wait.

In the streamed SecureHamming B does not send its masks: it draws a 32-byte seed per pair from the
OS CSPRNG and sends only the seed to the coordinator. Mask i of the pair (one per ciphertext D, in
D's batch-major order g·n_B + x) is the i-th (|N|/8 + 16)-byte block of the AES-256-CTR keystream
under the seed, read big-endian and reduced mod N: 128 bits more than N, so its distance from
uniform on [0, N) is below 2⁻¹²⁸. Any range of masks is computed on its own (the counter block of
mask i is i·⌈(|N|/8 + 16)/16⌉), so B masks and the coordinator unmasks one piece at a time, and the
coordinator holds nothing per pair but the seed while A decrypts.

A never learns the seed (it goes from B to the coordinator only), so to A each t = h + R mod N is
uniform exactly as with R drawn value by value; the coordinator learns R as before.
"""

from __future__ import annotations

import secrets

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from xclp.errors import InvalidInput

MASK_SEED_BYTES = 32
_EXTRA_BYTES = 16  # 128 bits above |N|: the bias of the reduction mod N is below 2^-128
_BLOCK = 16


def draw_mask_seed() -> bytes:
    """A fresh pair seed from the OS CSPRNG."""
    return secrets.token_bytes(MASK_SEED_BYTES)


def masks_from_seed(seed: bytes, modulus: int, start: int, count: int) -> list[int]:
    """Masks start .. start + count − 1 of the pair whose seed is `seed`, each in [0, modulus)."""
    if not isinstance(seed, bytes) or len(seed) != MASK_SEED_BYTES:
        raise InvalidInput(f"a mask seed must be {MASK_SEED_BYTES} bytes")
    modulus = int(modulus)
    if modulus < 2 or start < 0 or count < 0:
        raise InvalidInput("masks need a modulus >= 2 and a non-negative range")
    width = (modulus.bit_length() + 7) // 8 + _EXTRA_BYTES
    blocks = -(-width // _BLOCK)
    counter = (start * blocks).to_bytes(_BLOCK, "big")
    stream = Cipher(algorithms.AES(seed), modes.CTR(counter)).encryptor().update(bytes(count * blocks * _BLOCK))
    step = blocks * _BLOCK
    return [int.from_bytes(stream[i : i + width], "big") % modulus for i in range(0, count * step, step)]
