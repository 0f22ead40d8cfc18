"""What an XCLP job will ask of this party, estimated before the work starts (DESIGN §5, §9).

XCLP is quadratic by design: a party holds its own n×n Hamming block, and its Paillier work grows
with n times every peer's rows. A party that joins a job it cannot finish ends in a MemoryError
hours later; so it estimates first and refuses, with the numbers and what to change:

- memory, before joining (only its own row count is needed): the uint16 intra block and its
  kernel buffer, 2 · n² · 2 bytes;
- time, when the coordinator's row layout names every party's rows: for each peer k, encrypting
  its own bit slices (L · ⌈n/K⌉), evaluating the peer's (L/2 · ⌈n_k/K⌉ · n multiplications) and
  decrypting (⌈n/K⌉ · n_k), each priced by timing a few operations with this party's own key,
  over its Paillier workers. This counts both roles of every pair, an upper bound on its share.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass

import gmpy2

from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.secure_hamming import SlotLayout
from xclp.errors import ResourceExhausted

DEFAULT_MAX_PAILLIER_HOURS = 24.0
SAMPLES = 6


def physical_memory() -> int:
    """Bytes of RAM on this machine (0 if unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def default_max_memory() -> int:
    """Three quarters of the RAM, or no limit when it cannot be read."""
    return physical_memory() * 3 // 4


def intra_bytes(n: int) -> int:
    """The intra-party Hamming block (uint16[n, n]) and its kernel buffer."""
    return 2 * n * n * 2


def check_memory(n: int, max_bytes: int) -> None:
    need = intra_bytes(n)
    if max_bytes and need > max_bytes:
        largest = int((max_bytes / 4) ** 0.5)
        raise ResourceExhausted(
            f"XCLP needs about {_gib(need)} for this party's own {n} × {n} distance block, above the limit of "
            f"{_gib(max_bytes)} (--max-memory-gb; default three quarters of the RAM). XCLP is quadratic in the rows: "
            f"subsample to at most about {largest} rows, or split the table over more parties")


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
                     workers: int) -> float:
    total = 0.0
    for n_k in peers.values():
        total += layout.L * layout.batches(n) * costs.encrypt  # our slices, as A
        total += layout.values(n, n_k) * costs.decrypt  # our decryptions, as A
        total += layout.L / 2 * layout.values(n_k, n) * costs.multiply  # evaluating the peer's slices, as B
    return total / max(1, workers)


def check_time(seconds: float, max_seconds: float, n: int, peers: Mapping[str, int], workers: int) -> None:
    if max_seconds and seconds > max_seconds:
        raise ResourceExhausted(
            f"XCLP's Paillier work for this party's {n} rows against {sum(peers.values())} rows of "
            f"{len(peers)} peers is estimated at {seconds / 3600:.1f} hours on {max(1, workers)} workers (timed with "
            f"this key), above the limit of {max_seconds / 3600:.1f} hours (--max-paillier-hours). Subsample the "
            "rows (the work grows with the product of the parties' rows), or run with more workers (--workers)")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
