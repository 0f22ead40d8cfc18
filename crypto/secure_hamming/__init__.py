"""Packed Paillier SecureHamming: A's bit slices, B's masked evaluation, A's CRT decryption (DESIGN §5.3).

Paper 003 §3 ("PHE-based secure Hamming distance") encrypts every bit and returns one ciphertext
per pair; `tests/oracles/literal_hamming.py` keeps that as oracle and baseline. Here, following DESIGN
§5.3, A packs bit l of K of its vectors into one plaintext of K slots of w bits, and B turns the
identity h(x, y) = |x| + Σ_l (1 − 2x_l)·y_l into one ciphertext per (x, batch):

    D = Π_l C_{g,l}^(1−2x_l) · Enc_A(|x|·Σ_{s occupied} 2^(ws) + R)     (fresh randomised encryption)

with ONE mask R per ciphertext, uniform in [0, N) from `secrets.randbelow`. A decrypts
t = (Σ_s h_s·2^(ws) + R) mod N and sends t to the coordinator; B sends R to the coordinator, which
computes (t − R) mod N = Σ_s h_s·2^(ws) exactly and unpacks it (`unmask_distances`).

Why this is exact: each h_s lies in [0, L] and fits w = ⌈log2(L+1)⌉ bits, and K·w ≤ |N| − 2, so
the packed value is below 2^(|N|−2) < N. Per-slot sums Σ_l (1 − 2x_l)·b_{s,l} may be negative on
the way, but everything is arithmetic mod N and the final value Σ_s h_s·2^(ws) is a non-negative
integer below N, so (t − R) mod N recovers it bit for bit.

Why one mask R per ciphertext (DESIGN §5.3 now says so; its first version masked every slot):
  DESIGN §5.3 masks every slot with its own r_s < 2^(w−1), w = ⌈log2(L+1)⌉ + σ + 1 (52 bits for
  L = 1024, σ = 40). That hides h only statistically (2^−σ) and spends 41 of every 52 slot bits on
  the mask, so a 2048-bit plaintext holds K = 39 slots. One uniform R mod N per ciphertext instead
  hides the whole packed plaintext perfectly (t is uniform in [0, N) whatever h is) and lets a slot
  be just w = ⌈log2(L+1)⌉ bits: K = ⌊(|N| − 2)/w⌋ = 186 for |N| = 2048, L = 1024, i.e. ~4.8× fewer
  ciphertexts each way and ~4.8× less encryption, evaluation and decryption. The price: t and R are
  |N|/8 bytes per ciphertext instead of 8 bytes per distance (256 B per 186 distances here, ~1.4 B
  per distance, less than before), and the coordinator now needs A's N (it has it: every party's
  signed key bundle carries its Paillier N, DESIGN §4.1). The coordinator validates what it unmasks
  (every occupied slot in [0, L], every padding slot of A's last batch exactly 0, no bit above slot
  K − 1) and raises OutOfRange otherwise, so a malformed t or R cannot smuggle garbage into H.

Who learns what (honest-but-curious, DESIGN §2; "learns" = beyond its own inputs and outputs):
  * A alone sees D (decrypting to t) — t is uniform in [0, N) and independent of h, because R is
    uniform and unknown to A: A learns nothing about B's codes. B's fresh encryption (DJN short
    exponent, crypto/paillier.py) stays mandatory: without it D's randomness would be A's own and
    A could test guesses of x against the ciphertext itself.
  * B alone sees only A's ciphertexts (semantic security of Paillier) and its own R.
  * The coordinator alone sees t and R, i.e. exactly the packed H — which it is meant to learn.
  * Coordinator + A hold t and R → only H (what the coordinator learns anyway) and A's own data.
  * Coordinator + B hold t and R → only H, likewise. No coalition of one party with the
    coordinator learns more than H plus its own data, which DESIGN §2 already concedes.

Roles and their calls:
  A: `encrypt_bit_slices` → send `EncryptedSlices.to_bytes()` to B;
  B: `evaluate` → send `EvaluatedDistances.to_bytes()` to A and the masks R (`Residues`) to the coordinator;
  A: `decrypt` → send t (`Residues`) to the coordinator;  coordinator: `unmask_distances`.

Speed (DESIGN §5.3): A encrypts with its secret key (CRT + fixed-base tables, crypto/paillier.py).
B uses Π_l C_l^(1−2x_l) = (Π_l C_l)·Π_{x_l=1} C_l^(−2): the inverses C_l^(−2) come from one
batch (Montgomery) inversion per batch, and the x-dependent product is read from "four Russians"
subset tables over groups of `group_bits` consecutive bits (one multiplication per group and
vector; see `choose_group_bits`), with Π_l C_l folded into the first table. Work is chunked by
batch over a process pool; tasks ship bytes, and tables live in a per-process cache.

Cost per ciphertext D (|N| = 2048, L = 1024, n_B = 1000, g = 8): B does ⌈L/g⌉ − 1 = 127 table
products, 45 fixed-base products for the fresh factor, 2 more, and ~33 table-building products
amortised over its vectors — ≈ 207 products mod N², against two 1024-bit-exponent powmods mod p²,
q² for A's decryption. With K = 186 there are ⌈1000/186⌉ = 6 batches: 6·1000 ciphertexts D and
6·1024 bit-slice ciphertexts per pair.

Modules: `layout` (slots and the three wire formats), `role_a` (encrypt, decrypt), `role_b`
(evaluate), `unmask` (the coordinator's step). The names below are the package's API.
"""

from __future__ import annotations

from xclp.crypto.secure_hamming.layout import (
    EncryptedSlices,
    EvaluatedDistances,
    Residues,
    SlotLayout,
    code_bits,
)
from xclp.crypto.secure_hamming.role_a import decrypt, encrypt_bit_slices
from xclp.crypto.secure_hamming.role_b import choose_group_bits, draw_masks, evaluate, occupied_ones
from xclp.crypto.secure_hamming.unmask import unmask_distances

__all__ = [
    "EncryptedSlices",
    "EvaluatedDistances",
    "Residues",
    "SlotLayout",
    "choose_group_bits",
    "code_bits",
    "decrypt",
    "draw_masks",
    "encrypt_bit_slices",
    "evaluate",
    "occupied_ones",
    "unmask_distances",
]
