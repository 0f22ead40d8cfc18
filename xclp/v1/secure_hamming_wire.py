"""The streamed SecureHamming on the wire (docs/design.md §5.3, §10.1): pieces, uploads and relay frames.

A pair (A, B) travels in pieces: piece p covers some of A's ⌈n_A/K⌉ batches and some of the rows
B evaluates them against (`Piece`: all of B's n_B rows, or a candidate schedule's), so that its
ciphertexts D fit `PIECE_BYTES` (several batches with all their rows, or one batch with a slice of
its rows). In order:

    A -> B (relayed)   SLICES: A's encrypted bit slices, once per attempt
    B -> coordinator   upload SEED: B's 32-byte mask seed of the pair (before any piece)
    B -> A (relayed)   PIECE p: B's evaluated ciphertexts of piece p, p = 0, 1, ...
    A -> coordinator   upload T p: t of piece p (A decrypted it), one |N|/8-byte value per D
    A -> B (relayed)   ACK p: A is done with piece p (not for the last piece)

B keeps at most `MAX_IN_FLIGHT` pieces sent and not acknowledged (the coordinator refuses more),
so what the coordinator relays and holds per pair is bounded whatever A's speed. The coordinator
regenerates B's masks of a piece from the seed (crypto.secure_hamming.masks), unmasks t and folds
the piece into the graph at once: it never holds a pair's t, R or distances.

Relay frames are sealed end to end (client/jobs/xclp.py), so their kind and index are
authenticated: a piece dropped, replayed or reordered by the coordinator fails to match the index
its recipient expects. Uploads go over the party's own authenticated channel to the coordinator.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xclp.crypto.secure_hamming import MASK_SEED_BYTES, SlotLayout
from xclp.errors import InvalidInput, ProtocolError

PIECE_BYTES = 4 << 20  # B's evaluated ciphertexts of one piece (at least one batch)
MAX_IN_FLIGHT = 8  # pieces of one pair relayed to A and not yet acknowledged


@dataclass(frozen=True)
class Piece:
    """A's batches `batches`, each against the rows B evaluates it with (the batch's entries: all
    of B's rows, or on a candidate schedule its lists of the batch's centres, xclp.candidates): with
    several batches every entry of each, with one batch its entries `entries` (None: all of them).
    Its ciphertexts D are batch-major and numbered `first`, `first` + 1, ... in the pair (mask i of
    the pair masks D number i); `values` of them."""

    batches: range
    entries: range | None
    first: int
    values: int

    def a_rows(self, layout: SlotLayout, n_a: int) -> slice:
        """A's slots (its rows, in its own numbering, on all pairs) whose distances the piece carries."""
        return slice(self.batches.start * layout.slots, min(n_a, self.batches.stop * layout.slots))

    def b_rows(self, n_b: int) -> range:
        """On all pairs (every batch against all n_b of B's rows): B's rows the piece carries."""
        return range(n_b) if self.entries is None else self.entries


RELAY_SLACK_BYTES = 4096  # a relay's frame header and its sealing (AEAD nonce and tag), generously


def piece_values(layout: SlotLayout) -> int:
    """Ciphertexts D per piece at most: 2|N|/8 bytes each within PIECE_BYTES (at least one)."""
    return max(1, PIECE_BYTES // layout.ciphertext_bytes)


# With the capability FINE_PIECES (xclp/v1/xclp.py) a pair is cut into at least PIECES_PER_PAIR pieces
# (of at least MIN_FINE_VALUES ciphertexts, at most PIECE_BYTES): pieces fold one after another, so a
# fault half-way through SecureHamming costs the pieces in flight, not the pairs (docs/operating.md).
PIECES_PER_PAIR = 16
MIN_FINE_VALUES = 64


def fine_piece_values(layout: SlotLayout, values: int) -> int:
    """Ciphertexts per piece of a pair of `values` ciphertexts in all, cut finely (FINE_PIECES)."""
    return min(piece_values(layout), max(MIN_FINE_VALUES, -(-int(values) // PIECES_PER_PAIR)))


def relay_bytes(layout: SlotLayout, n_sender: int) -> int:
    """The largest relay a pair's party sends: its bit slices (as A), or one piece (as B); what the
    coordinator accepts and the recipient takes."""
    return max(layout.slices_bytes(n_sender), piece_values(layout) * layout.ciphertext_bytes) + RELAY_SLACK_BYTES


def pieces(layout: SlotLayout, counts: Sequence[int], per: int = 0) -> tuple[Piece, ...]:
    """The pieces of a pair whose batch g is evaluated against counts[g] rows, in order: as many
    whole batches as fit a piece of `per` ciphertexts (0: `piece_values`, as many as fit
    PIECE_BYTES), and a batch too large for one cut in near-equal slices."""
    per, out, first, g = per or piece_values(layout), [], 0, 0
    while g < len(counts):
        if counts[g] > per:
            cuts = -(-counts[g] // per)
            bounds = [counts[g] * i // cuts for i in range(cuts + 1)]
            out += [Piece(range(g, g + 1), range(lo, hi), first + lo, hi - lo) for lo, hi in zip(bounds, bounds[1:])]
            first, g = first + counts[g], g + 1
            continue
        stop, size = g, 0
        while stop < len(counts) and size + counts[stop] <= per:
            size, stop = size + counts[stop], stop + 1
        out.append(Piece(range(g, stop), None, first, size))
        first, g = first + size, stop
    return tuple(out)


def all_pairs(layout: SlotLayout, n_a: int, n_b: int, per: int = 0) -> tuple[Piece, ...]:
    """The pieces of a pair on all pairs: each of A's ⌈n_A/K⌉ batches against all n_B of B's rows."""
    return pieces(layout, [n_b] * layout.batches(n_a), per)


class Upload(enum.IntEnum):
    SEED = 1
    T = 2


_UPLOAD = struct.Struct(">4sBxxxII")  # magic, kind, pair, piece
_UPLOAD_MAGIC = b"XSH1"


@dataclass(frozen=True)
class HammingUpload:
    """What a party sends the coordinator in secure_hamming: B's seed or A's t of one piece of one pair
    (`pair`: its position in the job's pairs message), as uint8[16 + len(data)]."""

    kind: Upload
    pair: int
    piece: int
    data: bytes

    def to_array(self) -> np.ndarray:
        head = _UPLOAD.pack(_UPLOAD_MAGIC, int(self.kind), self.pair, self.piece)
        return np.frombuffer(head + self.data, dtype=np.uint8).copy()

    @classmethod
    def from_array(cls, payload: object) -> HammingUpload:
        """From an untrusted payload; InvalidInput naming what is wrong."""
        if not isinstance(payload, np.ndarray) or payload.dtype != np.uint8 or payload.ndim != 1 \
                or payload.size < _UPLOAD.size:
            raise InvalidInput(f"a secure_hamming upload must be uint8[{_UPLOAD.size} + data]")
        raw = payload.tobytes()
        magic, kind, pair, piece = _UPLOAD.unpack_from(raw)
        if magic != _UPLOAD_MAGIC or kind not in (Upload.SEED, Upload.T):
            raise InvalidInput("a secure_hamming upload has an unknown header")
        data = raw[_UPLOAD.size :]
        if kind == Upload.SEED and (piece != 0 or len(data) != MASK_SEED_BYTES):
            raise InvalidInput(f"a mask seed upload carries {MASK_SEED_BYTES} bytes and piece 0")
        return cls(Upload(kind), pair, piece, data)

    @staticmethod
    def limit(layout: SlotLayout) -> int:
        """The largest upload: t of a full piece."""
        return _UPLOAD.size + max(MASK_SEED_BYTES, piece_values(layout) * layout.value_bytes)


class Relay(enum.IntEnum):
    SLICES = 1
    PIECE = 2
    ACK = 3


_RELAY = struct.Struct(">BI")  # kind, index
RELAY_HEADER_BYTES = _RELAY.size


def frame_relay(kind: Relay, index: int, body: bytes = b"") -> bytes:
    """A relay's plaintext (sealed by the sender): kind, index, body."""
    return _RELAY.pack(int(kind), index) + body


def open_relay(plaintext: bytes) -> tuple[Relay, int, bytes]:
    """(kind, index, body) of an opened relay; ProtocolError if it is not one."""
    if len(plaintext) < _RELAY.size:
        raise ProtocolError("a SecureHamming relay is too short")
    kind, index = _RELAY.unpack_from(plaintext)
    if kind not in (Relay.SLICES, Relay.PIECE, Relay.ACK):
        raise ProtocolError(f"a SecureHamming relay of unknown kind {kind}")
    return Relay(kind), index, plaintext[_RELAY.size :]
