"""Public, seeded randomness derived from the job's common seed (docs/design.md §2, §4.3).

Every public random structure (LSH projection, FlyHash matrix, RACE hash functions, tie-break
draws) comes from `public_rng(seed, purpose)`: a numpy Generator keyed by SHA-256 of the common
seed and a purpose string, so different structures never share a stream and every party derives
the same one. Never use these generators for keys, masks or noise.
"""

from __future__ import annotations

import hashlib

import numpy as np

from xclp.errors import InvalidInput

Seed = int | bytes


def seed_bytes(seed: Seed) -> bytes:
    """Canonical bytes of a seed: 32-byte common seeds pass through, ints become 8-byte LE."""
    if isinstance(seed, bytes):
        if len(seed) == 0:
            raise InvalidInput("seed must not be empty")
        return seed
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        if seed < 0 or seed >= 2**64:
            raise InvalidInput(f"integer seed must be in [0, 2^64), got {seed}")
        return int(seed).to_bytes(8, "little")
    raise InvalidInput(f"seed must be int or bytes, got {type(seed).__name__}")


def public_rng(seed: Seed, purpose: str) -> np.random.Generator:
    """A Generator for the public structure named `purpose` (e.g. "lsh", "flyhash", "race")."""
    digest = hashlib.sha256(b"xclp/public-rng/" + purpose.encode() + b"\x00" + seed_bytes(seed)).digest()
    words = np.frombuffer(digest, dtype="<u4").tolist()
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))
