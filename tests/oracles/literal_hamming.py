"""The paper's literal per-bit SecureHamming — TEST ORACLE AND BENCHMARK BASELINE ONLY.

Paper 003 §3 "PHE-based secure Hamming distance", with only `phe`'s own arithmetic: A encrypts
every bit y_l of every vector with `phe` (one ciphertext per bit); for each pair B computes
Π_l Enc(y_l)^(1−2x_l) · Enc(|x| + r) (phe's `*` by ±1 and `+`), and A decrypts every pair.

Masking as in the packed protocol (crypto/secure_hamming.py, "Deviation from docs/design.md §5.3"): one
mask r per ciphertext, uniform in [0, N) from `secrets`, so A's t = (h + r) mod N is uniform and
`literal_unmask` recovers h = (t − r) mod N — not the paper's r in [0, L−1], which would not hide h.
Use the packed protocol in the service: this one costs ~L ciphertexts per vector and one
decryption per pair.
"""

from __future__ import annotations

import secrets

import numpy as np
import phe

from xclp.crypto.secure_hamming import code_bits
from xclp.errors import OutOfRange

LiteralCiphertexts = list[list[phe.EncryptedNumber]]


def literal_encrypt_bits(public: phe.PaillierPublicKey, codes: np.ndarray, L: int) -> LiteralCiphertexts:
    """Role A (oracle): one phe ciphertext per bit, [n_A][L]."""
    return [[public.encrypt(int(b)) for b in row] for row in code_bits(codes, L).tolist()]


def literal_evaluate(
    public: phe.PaillierPublicKey, encrypted: LiteralCiphertexts, codes_B: np.ndarray, L: int
) -> tuple[LiteralCiphertexts, list[list[int]]]:
    """Role B (oracle): Enc((h(x, y) + r) mod N) per pair [n_B][n_A] and the masks r [n_B][n_A]."""
    bits = code_bits(codes_B, L, "codes_B")
    masks = [[secrets.randbelow(public.n) for _ in encrypted] for _ in range(len(bits))]
    out = []
    for x, mask_row in zip(bits.tolist(), masks):
        weight = sum(x)
        row = []
        for y_enc, r in zip(encrypted, mask_row):
            # fresh encryption of |x| + r (docs/design.md §5.3); raw: phe's encode refuses values above N/3
            acc = phe.EncryptedNumber(public, public.raw_encrypt((weight + r) % public.n))
            for x_l, c in zip(x, y_enc):
                acc = acc + c * (1 - 2 * x_l)  # paper's identity h = |x| + Σ_l (1 − 2x_l)·y_l
            row.append(acc)
        out.append(row)
    return out, masks


def literal_decrypt(private: phe.PaillierPrivateKey, evaluated: LiteralCiphertexts) -> list[list[int]]:
    """Role A (oracle): decrypt every pair → t in [0, N), [n_B][n_A]."""
    return [[private.raw_decrypt(c.ciphertext(be_secure=False)) for c in row] for row in evaluated]


def literal_unmask(t: list[list[int]], masks: list[list[int]], n: int, L: int) -> np.ndarray:
    """Coordinator (oracle): h = (t − r) mod N as uint16[n_B, n_A]; OutOfRange outside [0, L]."""
    h = np.array([[(a - b) % n for a, b in zip(t_row, r_row)] for t_row, r_row in zip(t, masks)], dtype=object)
    if h.size and (h > L).any():
        raise OutOfRange(f"unmasked literal distances lie outside [0, {L}]")
    return h.astype(np.uint16)
