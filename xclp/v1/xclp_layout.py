"""What both ends of an XCLP job agree on about rows and pairs (docs/design.md §5.2-5.6).

- `secure_hamming_pairs`: every pair of the graph's parties once, with its A (key holder) and B.
- `parts_of`: which pairs' values a party sends in its one secure_hamming contribution, in
  what order (t where it is A, R where it is B, concatenated in pair order).
- `RowLayout`: rows of H by party (sorted ids, each party's rows in its own order), and the
  SecureRowSums frame (the rows of its participants, `restrict`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xclp.errors import InvalidInput


@dataclass(frozen=True)
class PairTask:
    """One SecureHamming pair: `a` holds the Paillier key and decrypts, `b` evaluates (docs/design.md §5.3)."""

    a: str
    b: str
    # ciphertexts per piece the pair is cut into (secure_hamming_wire.fine_piece_values), as the pairs
    # message says; 0: up to PIECE_BYTES a piece, the division of a run without FINE_PIECES
    piece_values: int = 0


def secure_hamming_pairs(party_ids: Sequence[str]) -> tuple[PairTask, ...]:
    """Every pair of the sorted roster once, with balanced roles (docs/design.md §5.3 "roles alternate").

    For sorted positions i < j the A side is i when i + j is even, else j. Each party meets every
    other once, and along its row of the pair table the parity alternates, so a party is A in
    ⌊(P−1)/2⌋ or ⌈(P−1)/2⌉ of its P−1 pairs (with 3 parties every party is A exactly once). A does
    the encryption and decryption, B the (heavier) evaluation.
    """
    ids = check_party_ids(party_ids)
    pairs = []
    for i in range(len(ids)):
        for j in range(i + 1, len(ids)):
            a, b = (i, j) if (i + j) % 2 == 0 else (j, i)
            pairs.append(PairTask(a=ids[a], b=ids[b]))
    return tuple(pairs)


def pairs_table(pairs: Sequence[PairTask], roster: Sequence[str]) -> np.ndarray:
    """The pairs message: uint64[m, 2] roster positions (A, B) of every pair, or uint64[m, 3] with each
    pair's ciphertexts per piece when it is cut finely (FINE_PIECES); what the coordinator sends,
    and what a party keeps of it in its run state."""
    position = {p: i for i, p in enumerate(roster)}
    if any(t.piece_values for t in pairs):
        return np.array([[position[t.a], position[t.b], t.piece_values] for t in pairs], dtype=np.uint64).reshape(-1, 3)
    return np.array([[position[t.a], position[t.b]] for t in pairs], dtype=np.uint64).reshape(-1, 2)


def parts_of(pairs: Sequence[PairTask], party: str, members: Sequence[str]) -> tuple[PairTask, ...]:
    """The pairs of `members` that `party` is in, in pair order: the order of the parts of its
    secure_hamming contribution (t for the pairs where it is A, its masks R where it is B)."""
    keep = set(members)
    return tuple(t for t in pairs if party in (t.a, t.b) and t.a in keep and t.b in keep)


@dataclass(frozen=True)
class RowLayout:
    """Row blocks in party order: party `parties[k]` owns `sizes[k]` consecutive rows."""

    parties: tuple[str, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.parties) != len(self.sizes) or len(set(self.parties)) != len(self.parties):
            raise InvalidInput("a row layout needs one size per distinct party")
        if any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1 for s in self.sizes):
            raise InvalidInput(f"every party must have at least one row, got sizes {self.sizes}")

    @property
    def n(self) -> int:
        return int(sum(self.sizes))

    def rows(self, party: str) -> slice:
        """`party`'s rows in this layout."""
        if party not in self.parties:
            raise InvalidInput(f"party {party!r} has no rows in this layout ({', '.join(self.parties)})")
        k = self.parties.index(party)
        start = int(sum(self.sizes[:k]))
        return slice(start, start + int(self.sizes[k]))

    def restrict(self, parties: Sequence[str]) -> RowLayout:
        """The layout of a subset of the parties, in this layout's order."""
        keep = set(parties)
        unknown = keep - set(self.parties)
        if unknown:
            raise InvalidInput(f"parties {sorted(unknown)} have no rows in this layout")
        pairs = [(p, s) for p, s in zip(self.parties, self.sizes) if p in keep]
        return RowLayout(tuple(p for p, _ in pairs), tuple(s for _, s in pairs))


    @classmethod
    def of(cls, rows: Sequence[tuple[str, int]]) -> RowLayout:
        """From [(party, rows)] in H's order."""
        return cls(tuple(p for p, _ in rows), tuple(int(n) for _, n in rows))


def check_party_ids(party_ids: Sequence[str]) -> tuple[str, ...]:
    if isinstance(party_ids, (str, bytes)):
        raise InvalidInput("party ids must be a collection of ids, not a single string")
    ids = list(party_ids)
    if not ids or any(not isinstance(p, str) or not p for p in ids) or len(set(ids)) != len(ids):
        raise InvalidInput(f"party ids must be distinct non-empty strings, got {ids!r}")
    return tuple(sorted(ids))
