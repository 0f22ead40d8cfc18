"""What an XCLP job will ask of this party, estimated before the work starts (docs/design.md §5, §9, §10.5).

A party that joins a job it cannot finish ends in a MemoryError or a week of Paillier work; so it
estimates first and refuses, with the numbers and what to change:

- memory (`party_bytes`), before joining from its own rows and again once the coordinator's layout
  names every party's rows: its LSH codes, its own nearest rows (computed in blocks), its encrypted
  bit slices (and the sealed copy it sends), the slices of every peer it evaluates (its pairs run
  at once), a wave of SecureHamming pieces in flight with their Python integers (the streamed
  protocol, §10.1: never a whole pair), and the propagation's n_total × C arrays. Linear in the rows;
- time: for each peer k, encrypting its own bit slices (L · ⌈n/K⌉), evaluating the peer's
  (L/2 · ⌈n_k/K⌉ · n multiplications) and decrypting (⌈n/K⌉ · n_k), each priced by timing a few
  operations with this party's own key, over its Paillier workers; on candidate pairs the bound
  the job's pair_budget sets. This counts both roles of every pair, an upper bound on its share.
  Checked against this party's limit (`--max-work-minutes`) and the job's `max_run_seconds`
  (the run would fail first) twice: before Join, when the peers' rows are not known yet and each
  peer is taken to hold as many as this party (said so in the message), and again from the layout,
  before any Paillier work.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import gmpy2

from xclp.candidates import AUTO
from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.secure_hamming import SlotLayout
from xclp.errors import ConfigError, ResourceExhausted
from xclp.memory import INT_OVERHEAD, default_max_memory, gib
from xclp.v1.secure_hamming_wire import MAX_IN_FLIGHT, piece_values
from xclp.v1.xclp import INFLUENCE_PIECE_BYTES, XclpJobParams

__all__ = ["DEFAULT_MAX_WORK_MINUTES", "OperationCosts", "WorkLimits", "check_memory", "check_time", "check_work",
           "default_max_memory", "minutes", "paillier_seconds", "party_bytes", "work_seconds"]

DEFAULT_MAX_WORK_MINUTES = 24 * 60.0
SAMPLES = 6
OWN_NEAREST_BYTES = 96 << 20  # own_top_k's blocks of 2^20 distances, similarities and indices, a few at once


def party_bytes(n: int, peers: Mapping[str, int], layout: SlotLayout, *, workers: int, n_classes: int,
                slots: float = 1.0) -> int:
    """Peak bytes of this party's XCLP beyond its table (module docstring); `peers` may be empty
    (before the layout: this party's own part only); `slots`: its slots as A per row
    (XclpJobParams.slots_per_row: more than one on candidate pairs, docs/design.md §10.3)."""
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
    def of(cls, keypair: PaillierKeypair) -> OperationCosts:
        """The key's costs, timed once: the estimate before Join and the one from the layout price
        the work alike (timed twice on a busy machine, the same work came out 40 min and 2.8 hours)."""
        costs = _TIMED.get(keypair.public.n)
        if costs is None:
            if len(_TIMED) >= 16:  # an agent makes a key per run: remember the recent ones only
                _TIMED.clear()
            costs = _TIMED[keypair.public.n] = cls.measure(keypair)
        return costs

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


_TIMED: dict[int, OperationCosts] = {}  # by the key's modulus: a party times its key once per process


def check_work(keypair: PaillierKeypair, params: XclpJobParams, n: int, peers: Mapping[str, int], workers: int,
               limits: WorkLimits, progress: Callable[[str], None], *, assumed: bool = False) -> None:
    """Estimate this party's Paillier work (timed with its key, on candidate pairs the schedule's
    bound), say it, and refuse it past `limits` (`assumed`: before Join, `peers` is a guess)."""
    if not limits.any:
        return
    layout = SlotLayout.for_key(keypair.public, params.lsh_bits)
    budget = params.work_budget({"": n, **peers}, layout.slots)
    seconds = paillier_seconds(OperationCosts.of(keypair), layout, n, peers, workers, budget=budget,
                               slots=params.slots_per_row)
    against = (f"{len(peers)} peers taken to hold as many" if assumed
               else f"{sum(peers.values())} of {len(peers)} peers")
    progress(f"estimated Paillier work{' before joining' if assumed else ''}: {minutes(seconds)} on {workers} "
             f"workers ({n} rows against {against}{candidate_note(params, budget)})")
    check_time(seconds, limits, n, peers, workers, assumed=assumed)


def check_scheduled_work(keypair: PaillierKeypair, lsh_bits: int, encrypt_slots: int, decrypt: int, evaluate: int,
                         n: int, peers: Mapping[str, int], workers: int, limits: WorkLimits,
                         progress: Callable[[str], None]) -> None:
    """On candidate pairs, once an attempt's schedule is known (the probe table opened, the pairs'
    roles drawn): its Paillier work counted exactly, `encrypt_slots` of this party's slots to
    encrypt as A (0: encrypted before), `decrypt` ciphertexts to decrypt as A and `evaluate` to
    evaluate as B, timed with its key; said, and refused past `limits` as the layout's estimate is.
    The layout's estimate was the plan's (rows spread evenly over the centres); real tables crowd
    some centres (3 x 100 000 flights: planned at 0.5 % of all pairs' ciphertexts, scheduled at 1.3 %)."""
    if not limits.any:
        return
    layout, costs = SlotLayout.for_key(keypair.public, lsh_bits), OperationCosts.of(keypair)
    seconds = (layout.L * layout.batches(encrypt_slots) * costs.encrypt + decrypt * costs.decrypt
               + evaluate * layout.L / 2 * costs.multiply) / max(1, workers)
    encrypting = f", {encrypt_slots} slots to encrypt" if encrypt_slots else ""
    progress(f"Paillier work on this attempt's schedule: {minutes(seconds)} on {workers} workers ({evaluate} "
             f"ciphertexts to evaluate, {decrypt} to decrypt{encrypting})")
    check_time(seconds, limits, n, peers, workers)


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


def work_seconds(max_work_minutes: float | None, max_paillier_hours: float | None = None) -> float:
    """This party's limit from `max_work_minutes`, or from its old name and unit `max_paillier_hours`
    (default DEFAULT_MAX_WORK_MINUTES; 0 = no limit)."""
    if max_work_minutes is not None and max_paillier_hours is not None:
        raise ConfigError("give max_work_minutes or its old name max_paillier_hours, not both")
    if max_paillier_hours is not None:
        return float(max_paillier_hours) * 3600
    seconds = float(DEFAULT_MAX_WORK_MINUTES if max_work_minutes is None else max_work_minutes) * 60
    if not seconds >= 0:
        raise ConfigError(f"max_work_minutes must be at least 0 (0: no limit), got {max_work_minutes}")
    return seconds


@dataclass(frozen=True)
class WorkLimits:
    """How long this party's Paillier work may take: its own limit (`--max-work-minutes`) and the
    job's `max_run_seconds` (after which the coordinator fails the run); 0: no limit."""

    party_seconds: float = 0.0
    run_seconds: float = 0.0

    @property
    def any(self) -> bool:
        return bool(self.party_seconds or self.run_seconds)


def minutes(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2g} s"
    return f"{seconds / 60:.1f} min" if seconds < 6000 else f"{seconds / 3600:.1f} hours"


def candidate_note(params: XclpJobParams, budget: float) -> str:
    """What bounds the estimate on candidate pairs, for its message."""
    if not params.candidates:
        return ""
    if params.pair_budget == AUTO:
        return f"; candidate pairs, one probe per row: planned at {budget:.1%} of all pairs' ciphertexts"
    return f"; candidate pairs: at most {budget:g} of all pairs' ciphertexts"


def check_time(seconds: float, limits: WorkLimits, n: int, peers: Mapping[str, int], workers: int, *,
               assumed: bool = False) -> None:
    """ResourceExhausted with both numbers when the estimate passes either limit; `assumed`: the
    peers' rows are this party's guess (before Join), and the message says so."""
    over = [what for limit, what in (
        (limits.party_seconds, f"this party's limit of {minutes(limits.party_seconds)} (--max-work-minutes)"),
        (limits.run_seconds, f"the job's max_run_seconds = {limits.run_seconds:g}"
                             f"{'' if limits.run_seconds < 60 else f' ({minutes(limits.run_seconds)})'}, after which "
                             "the coordinator would fail the run"))
        if limit and seconds > limit]
    if not over:
        return
    guess = (f" (before joining: each peer taken to hold {n} rows like this party; the layout has the real "
             "sizes)") if assumed else ""
    raise ResourceExhausted(
        f"XCLP's Paillier work for this party's {n} rows against {sum(peers.values())} rows of {len(peers)} peers"
        f"{guess} is estimated at {minutes(seconds)} on {max(1, workers)} workers (timed with this key), above "
        f"{' and '.join(over)}. Subsample the rows (the work grows with the product of the "
        "parties' rows), lower the job's pair_budget, run with more workers (--workers), or raise the limit")

