"""Federated k-means on the wire (DESIGN §10.3): the rounds' masked sums of candidate pairs' centres.

Each round pools, in two verifiable masked sums (DESIGN §2.7: every member recomputes what opens),
the rows nearest to each centre (uint64[C]), then the sums of the unit rows of the centres whose
pooled count reached the minimum (`SUMS`, fixed point in Z_2^64, int64 two's complement: uint64[C, d],
zero for the other centres). `kmeans_reference` is the same rounds in plaintext, ring sums
included, so the secure run's centres equal it bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xclp.candidates import initial_centres, kmeans_counts, kmeans_sums, next_centres
from xclp.crypto.fixedpoint import FixedPoint
from xclp.seeding import Seed

# a party's sum of unit rows has coordinates below its rows (< 2^31), with 24 fractional bits; the
# ring then holds the sum of up to 256 parties' (each value at most 2^63 / 256 / 2^24 = 2^31)
SUMS = FixedPoint(frac_bits=24, total_bits=64, headroom_terms=256)


def encode_sums(sums: np.ndarray) -> np.ndarray:
    """uint64[C, d]: a party's k-means sums in the masked sum's ring."""
    return SUMS.encode(sums)


def decode_sums(pooled: np.ndarray) -> np.ndarray:
    """float64[C, d]: the pooled sums from their ring sum."""
    return SUMS.decode(np.asarray(pooled, dtype=np.uint64))


def kmeans_reference(parts: Sequence[np.ndarray], seed: Seed, centres: int, rounds: int,
                     min_rows: int) -> np.ndarray:
    """The centres federated k-means reaches, in plaintext: `parts` are the parties' unit rows; each
    round pools the counts, then the sums of the centres with at least `min_rows` rows, in the ring."""
    c = initial_centres(seed, centres, parts[0].shape[1])
    for _ in range(rounds):
        counts = np.sum([kmeans_counts(X, c) for X in parts], axis=0)
        qualified = counts >= min_rows
        pooled = np.zeros(c.shape, dtype=np.uint64)
        for X in parts:
            pooled += encode_sums(kmeans_sums(X, c, qualified))  # wraps mod 2^64, as the masked sum does
        c = next_centres(c, decode_sums(pooled), qualified)
    return c


# --- the steps (DESIGN §10.3): round r's two verifiable masked sums, the probe table, the probes ---

PROBE_TABLE_STEP = "probe_table"  # uint64[probes, C]: rows having each centre among their first p probes
PROBES_STEP = "probes"  # a party's first p probes per row, uint16[n_j, p], to the coordinator


def counts_step(r: int) -> str:
    """Round r's first sum: uint64[C], the rows nearest to each centre."""
    return f"centre_counts_{r}"


def sums_step(r: int) -> str:
    """Round r's second sum: uint64[C, d], the unit rows' sums of the centres that reached the minimum."""
    return f"centre_sums_{r}"


COUNTS, SUMS_KIND, TABLE = "counts", "sums", "table"  # what each masked sum of the set-up carries


def candidate_steps(rounds: int) -> tuple[tuple[str, str], ...]:
    """The masked sums of candidate pairs' set-up, in order: (step name, COUNTS | SUMS_KIND | TABLE)."""
    return (*((name, kind) for r in range(rounds) for name, kind in ((counts_step(r), COUNTS),
                                                                      (sums_step(r), SUMS_KIND))),
            (PROBE_TABLE_STEP, TABLE))


def sum_shape(kind: str, centres: int, dim: int, probes: int) -> tuple[int, ...]:
    """uint64 shape of a set-up sum: counts [C], sums [C, d], the probe table [probes, C]."""
    return {COUNTS: (centres,), SUMS_KIND: (centres, dim), TABLE: (probes, centres)}[kind]


def qualified(counts: np.ndarray, min_rows: int) -> np.ndarray:
    """bool[C]: the centres whose pooled count (uint64, from a counts sum) reached the minimum."""
    return np.asarray(counts, dtype=np.uint64).astype(np.int64) >= min_rows
