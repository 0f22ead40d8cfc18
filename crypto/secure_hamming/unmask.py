"""SecureHamming's last step, on the coordinator (docs/design.md §5.3): H from A's t and B's R, validated.

(t − R) mod N is the packed Σ_s h_s·2^(ws) of each ciphertext D; everything an honest run cannot
produce (a value not below N, bits above the last slot, a non-zero padding slot, a distance above
L) is refused with OutOfRange, so a malformed t or R cannot smuggle garbage into H.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xclp.crypto.paillier import PaillierPublicKey
from xclp.crypto.secure_hamming.layout import Residues, SlotLayout
from xclp.errors import InvalidInput, OutOfRange

_UNPACK_VALUES = 1024  # values unpacked at once: 1024 · K · w · 4 bytes (≈ 8 MiB at |N| = 2048, L = 1024)


def unmask_distances(
    t: Residues, r: Residues | Sequence[int], modulus: PaillierPublicKey | int, layout: SlotLayout, n_A: int, n_B: int
) -> np.ndarray:
    """Coordinator: H as uint16[n_B, n_A] from A's t and B's R, both one value per ciphertext D
    (R as B sent it, or as integers the coordinator regenerated from B's seed, `masks_from_seed`).

    (t − R) mod N is the packed Σ_s h_s·2^(ws) of each D (module docstring). OutOfRange unless t
    and R are below N, no bit above slot K − 1 is set, every padding slot of A's last batch is 0
    and every distance lies in [0, L]: an honest run never fails these checks.
    """
    n = int(modulus.n) if isinstance(modulus, PaillierPublicKey) else int(modulus)
    if n.bit_length() != layout.modulus_bits:
        raise InvalidInput(f"A's modulus has {n.bit_length()} bits but the slot layout is for {layout.modulus_bits}")
    count = layout.values(n_A, n_B)
    for name, values in (("t (from A)", t), ("R (from B)", r)):
        if isinstance(values, Residues) and (values.modulus_bits != layout.modulus_bits or values.count != count):
            raise OutOfRange(
                f"{name} must hold {count} values of {layout.modulus_bits} bits for n_A={n_A}, n_B={n_B}; "
                f"got {values.count} of {values.modulus_bits} bits"
            )
    t_int = t.to_ints()
    r_int = r.to_ints() if isinstance(r, Residues) else [int(v) for v in r]
    if len(r_int) != count:
        raise OutOfRange(f"R (from B) must hold {count} values for n_A={n_A}, n_B={n_B}; got {len(r_int)}")
    for name, ints in (("t (from A)", t_int), ("R (from B)", r_int)):
        if any(v >= n for v in ints):
            raise OutOfRange(f"{name} has a value not below A's modulus N")
    w, k, nbytes = layout.width, layout.slots, layout.value_bytes
    packed = [(a - b) % n for a, b in zip(t_int, r_int)]
    if any(p >> (k * w) for p in packed):
        raise OutOfRange(f"an unmasked plaintext has bits above its last slot (bit {k * w} or higher): t or R is "
                         f"malformed")
    raw = np.frombuffer(b"".join(p.to_bytes(nbytes, "little") for p in packed), dtype=np.uint8).reshape(count, nbytes)
    slots = np.empty((count, k), dtype=np.uint32)
    weights = np.uint32(1) << np.arange(w, dtype=np.uint32)
    for start in range(0, count, _UNPACK_VALUES):  # bit tensors of a few MiB, not w·4 bytes per distance at once
        chunk = raw[start : start + _UNPACK_VALUES]
        bits = np.unpackbits(chunk, axis=1, bitorder="little")[:, : k * w].reshape(chunk.shape[0], k, w)
        slots[start : start + chunk.shape[0]] = bits.astype(np.uint32) @ weights
    n_batches = layout.batches(n_A)
    h = slots.reshape(n_batches, n_B, k).transpose(1, 0, 2).reshape(n_B, n_batches * k)
    if h[:, n_A:].any():
        raise OutOfRange(f"{int(np.count_nonzero(h[:, n_A:]))} padding slots of A's last batch are not 0: t or R is "
                         f"malformed")
    h = h[:, :n_A]
    bad = h > layout.L
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise OutOfRange(f"{int(bad.sum())} unmasked distances lie outside [0, {layout.L}] (first at [{i}, {j}])")
    return h.astype(np.uint16)
