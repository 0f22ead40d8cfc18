"""The paper's literal per-bit SecureHamming — TEST ORACLE AND BENCHMARK BASELINE ONLY.

Paper 003 §3 "PHE-based secure Hamming distance", with only `phe`'s own arithmetic: A encrypts
every bit y_l of every vector with `phe` (one ciphertext per bit); for each pair B computes
Π_l Enc(y_l)^(1−2x_l) · Enc(|x| + r) (phe's `*` by ±1 and `+`), and A decrypts every pair.
Same inputs and outputs as `crypto.secure_hamming` so the two can be compared directly: t and
r are uint64[n_B, n_A] and `unmask_distances(t, r, L)` gives H.

One deliberate change from the paper (DESIGN §5.3 errata): masks r are uniform in
[0, 2^(w−1)) from `secrets`, as in the packed protocol, not in [0, L−1], which would not hide h.
Use the packed protocol in the service: this one costs ~L ciphertexts per vector and one
decryption per pair.
"""

from __future__ import annotations

import numpy as np
import phe

from crypto.secure_hamming import SlotLayout, draw_masks, code_bits

LiteralCiphertexts = list[list[phe.EncryptedNumber]]


def literal_encrypt_bits(public: phe.PaillierPublicKey, codes: np.ndarray, L: int) -> LiteralCiphertexts:
    """Role A (oracle): one phe ciphertext per bit, [n_A][L]."""
    return [[public.encrypt(int(b)) for b in row] for row in code_bits(codes, L).tolist()]


def literal_evaluate(
    public: phe.PaillierPublicKey, encrypted: LiteralCiphertexts, codes_B: np.ndarray, layout: SlotLayout
) -> tuple[list[list[phe.EncryptedNumber]], np.ndarray]:
    """Role B (oracle): Enc(h(x, y) + r) per pair [n_B][n_A] and masks uint64[n_B, n_A]."""
    bits = code_bits(codes_B, layout.L, "codes_B")
    masks = draw_masks((len(bits), len(encrypted)), layout.mask_bits)
    out = []
    for x, mask_row in zip(bits.tolist(), masks.tolist()):
        weight = sum(x)
        row = []
        for y_enc, r in zip(encrypted, mask_row):
            acc = public.encrypt(weight + r)  # fresh encryption of |x| + r (DESIGN §5.3)
            for x_l, c in zip(x, y_enc):
                acc = acc + c * (1 - 2 * x_l)  # paper's identity h = |x| + Σ_l (1 − 2x_l)·y_l
            row.append(acc)
        out.append(row)
    return out, masks


def literal_decrypt(private: phe.PaillierPrivateKey, evaluated: list[list[phe.EncryptedNumber]]) -> np.ndarray:
    """Role A (oracle): decrypt every pair → t: uint64[n_B, n_A]."""
    return np.array([[private.decrypt(c) for c in row] for row in evaluated], dtype=np.uint64)
