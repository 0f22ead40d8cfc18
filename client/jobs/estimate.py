"""What an XCLP job will ask of this party, estimated before the work starts (DESIGN §5, §9, §10.5).

A party that joins a job it cannot finish ends in a MemoryError or a week of Paillier work; so it
estimates first and refuses, with the numbers and what to change:

- memory (`party_bytes`), before joining from its own rows and again once the coordinator's layout
  names every party's rows: its LSH codes, its own nearest rows (computed in blocks), its encrypted
  bit slices (and the sealed copy it sends), the slices of every peer it evaluates (its pairs run
  at once), a wave of SecureHamming pieces in flight with their Python integers (the streamed
  protocol, §10.1: never a whole pair), and the propagation's n_total × C arrays. Linear in the rows;
- time, from the layout: for each peer k, encrypting its own bit slices (L · ⌈n/K⌉), evaluating
  the peer's (L/2 · ⌈n_k/K⌉ · n multiplications) and decrypting (⌈n/K⌉ · n_k), each priced by timing
  a few operations with this party's own key, over its Paillier workers. This counts both roles of
  every pair, an upper bound on its share.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass

import gmpy2

from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.secure_hamming import SlotLayout
from xclp.errors import ResourceExhausted
from xclp.memory import INT_OVERHEAD, default_max_memory, gib
from xclp.v1.secure_hamming_wire import MAX_IN_FLIGHT, piece_values
from xclp.v1.xclp import INFLUENCE_PIECE_BYTES

__all__ = ["DEFAULT_MAX_PAILLIER_HOURS", "OperationCosts", "check_memory", "check_time", "default_max_memory",
           "paillier_seconds", "party_bytes"]

DEFAULT_MAX_PAILLIER_HOURS = 24.0
SAMPLES = 6
OWN_NEAREST_BYTES = 96 << 20  # own_top_k's blocks of 2^20 distances, similarities and indices, a few at once


def party_bytes(n: int, peers: Mapping[str, int], layout: SlotLayout, *, workers: int, n_classes: int,
                slots: float = 1.0) -> int:
    """Peak bytes of this party's XCLP beyond its table (module docstring); `peers` may be empty
    (before the layout: this party's own part only); `slots`: its slots as A per row
    (XclpJobParams.slots_per_row: more than one on candidate pairs, DESIGN §10.3)."""
    ciphertext = layout.ciphertext_bytes
    # one wave: its ciphertexts as bytes, and per value a mask, a plaintext and a result as Python ints
    per_value = ciphertext + 3 * (ciphertext + INT_OVERHEAD)
    wave = min(MAX_IN_FLIGHT, 2 * max(1, workers)) * piece_values(layout) * per_value
    n_total = n + sum(peers.values())
    propagation = 4 * n_total * n_classes * 8 + INFLUENCE_PIECE_BYTES  # Z̄, the row sums and their masks
    return (n * layout.L // 8 + OWN_NEAREST_BYTES + 2 * layout.slices_bytes(math.ceil(slots * n))
            + sum(layout.slices_bytes(math.ceil(slots * m)) for m in peers.values()) + (wave if peers else 0)
            + propagation)


def check_memory(need: int, max_bytes: int, n: int, peers: Mapping[str, int]) -> None:
    """ResourceExhausted, with the estimate and what to change, when `need` passes `max_bytes` (0: no limit)."""
    if max_bytes and need > max_bytes:
        against = f" against {sum(peers.values())} rows of {len(peers)} peers" if peers else ""
        raise ResourceExhausted(
            f"XCLP needs about {gib(need)} on this party ({n} rows{against}), above the limit of {gib(max_bytes)} "
            "(--max-memory-gb; default three quarters of the RAM). Most of it grows with the rows and the key: "
            "subsample the rows, split the table over more parties, or raise --max-memory-gb on a larger machine")


@dataclass(frozen=True)
class OperationCosts:
    """Seconds per Paillier operation with one key, timed on this machine."""

    encrypt: float
    multiply: float
    decrypt: float

    @classmethod
    def measure(cls, keypair: PaillierKeypair) -> OperationCosts:
        public = keypair.public
        start = time.perf_counter()
        ciphertexts = [public.encrypt(secrets.randbelow(int(public.n))) for _ in range(SAMPLES)]
        encrypt = (time.perf_counter() - start) / SAMPLES
        start = time.perf_counter()
        product = ciphertexts[0]
        for c in ciphertexts * 8:
            product = gmpy2.t_mod(product * c, public.nsquare)
        multiply = (time.perf_counter() - start) / (SAMPLES * 8)
        start = time.perf_counter()
        for c in ciphertexts:
            keypair.decrypt(c)
        decrypt = (time.perf_counter() - start) / SAMPLES
        return cls(encrypt, multiply, decrypt)


def paillier_seconds(costs: OperationCosts, layout: SlotLayout, n: int, peers: Mapping[str, int],
                     workers: int, *, budget: float = 1.0, slots: float = 1.0) -> float:
    """On candidate pairs the ciphertexts are at most `budget` of all pairs' and the slots `slots`
    times the rows (XclpJobParams.slots_per_row): the estimate is the bound the job's pair_budget sets."""
    total = 0.0
    for n_k in peers.values():
        total += layout.L * layout.batches(math.ceil(slots * n)) * costs.encrypt  # our slices, as A
        total += budget * layout.values(n, n_k) * costs.decrypt  # our decryptions, as A
        total += budget * layout.L / 2 * layout.values(n_k, n) * costs.multiply  # evaluating the peer's slices, as B
    return total / max(1, workers)


def check_time(seconds: float, max_seconds: float, n: int, peers: Mapping[str, int], workers: int) -> None:
    if max_seconds and seconds > max_seconds:
        raise ResourceExhausted(
            f"XCLP's Paillier work for this party's {n} rows against {sum(peers.values())} rows of "
            f"{len(peers)} peers is estimated at {seconds / 3600:.1f} hours on {max(1, workers)} workers (timed with "
            f"this key), above the limit of {max_seconds / 3600:.1f} hours (--max-paillier-hours). Subsample the "
            "rows (the work grows with the product of the parties' rows), or run with more workers (--workers)")

