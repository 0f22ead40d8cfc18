"""Packed Paillier SecureHamming: A's bit slices, B's masked evaluation, A's CRT decryption (docs/design.md §5.3).

A packs bit l of K of its vectors into one plaintext of K slots of w bits; B turns the identity
h(x, y) = |x| + Σ_l (1 − 2x_l)·y_l into one ciphertext per (x, batch),

    D = Π_l C_{g,l}^(1−2x_l) · Enc_A(|x|·Σ_{s occupied} 2^(ws) + R)     (fresh randomised encryption)

with one mask R per ciphertext, uniform in [0, N). A decrypts t = (Σ_s h_s·2^(ws) + R) mod N,
uniform whatever h is; the coordinator computes (t − R) mod N = Σ_s h_s·2^(ws) exactly. Paper 003's
per-bit protocol stays as the test oracle and baseline (tests/oracles/literal_hamming.py).

    A: `encrypt_bit_slices` → `EncryptedSlices.to_bytes()` to B
    B: `evaluate` → `EvaluatedDistances.to_bytes()` to A, the masks R (`Residues`) to the coordinator
    A: `decrypt` → t (`Residues`) to the coordinator;  coordinator: `unmask_distances`

Modules: `layout` (slots and the three wire formats), `role_a`, `role_b`, `unmask`. Why it is
exact, who learns what, and what it costs: docs/secure_hamming.md.
"""

from __future__ import annotations

from xclp.crypto.secure_hamming.layout import (
    EncryptedSlices,
    EvaluatedDistances,
    Residues,
    SlotLayout,
    code_bits,
)
from xclp.crypto.secure_hamming.masks import MASK_SEED_BYTES, draw_mask_seed, masks_from_seed
from xclp.crypto.secure_hamming.role_a import decrypt, decrypt_ciphertexts, encrypt_bit_slices
from xclp.crypto.secure_hamming.role_b import (
    choose_group_bits,
    draw_masks,
    evaluate,
    evaluate_batches,
    occupied_ones,
)
from xclp.crypto.secure_hamming.unmask import unmask_distances

__all__ = [
    "MASK_SEED_BYTES",
    "EncryptedSlices",
    "EvaluatedDistances",
    "Residues",
    "SlotLayout",
    "choose_group_bits",
    "code_bits",
    "decrypt",
    "decrypt_ciphertexts",
    "draw_mask_seed",
    "draw_masks",
    "encrypt_bit_slices",
    "evaluate",
    "evaluate_batches",
    "masks_from_seed",
    "occupied_ones",
    "unmask_distances",
]
