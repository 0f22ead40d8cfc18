"""How a pair's ciphertexts are cut into pieces (xclp.v1.secure_hamming_wire.pieces): every batch's
every entry once, in order, numbered consecutively, no piece past PIECE_BYTES; all pairs as before."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import xclp.v1.secure_hamming_wire as shw
from xclp.crypto.secure_hamming import SlotLayout

LAYOUT = SlotLayout(512, 64)  # 128-byte ciphertexts


def cover(parts: tuple[shw.Piece, ...], counts: list[int]) -> list[tuple[int, int]]:
    """(batch, entry) of every ciphertext, in the order the pieces carry them; checks the numbering."""
    out, first = [], 0
    for piece in parts:
        assert piece.first == first
        if piece.entries is not None:
            assert len(piece.batches) == 1 and piece.values == len(piece.entries)
            out += [(piece.batches.start, e) for e in piece.entries]
        else:
            assert piece.values == sum(counts[g] for g in piece.batches)
            out += [(g, e) for g in piece.batches for e in range(counts[g])]
        first += piece.values
    return out


@given(st.lists(st.integers(0, 40), min_size=1, max_size=12), st.integers(1, 12))
def test_pieces_carry_every_entry_once_in_order_within_the_piece_size(counts: list[int], per: int) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(shw, "PIECE_BYTES", per * LAYOUT.ciphertext_bytes)
        parts = shw.pieces(LAYOUT, counts)
    assert cover(parts, counts) == [(g, e) for g, c in enumerate(counts) for e in range(c)]
    assert all(p.values <= per for p in parts)
    # a batch that fits is never cut; a cut batch's slices differ by at most one entry
    for g, c in enumerate(counts):
        slices = [p for p in parts if p.entries is not None and p.batches.start == g]
        assert (c > per) == bool(slices)
        assert not slices or max(p.values for p in slices) - min(p.values for p in slices) <= 1


def test_all_pairs_are_the_pieces_they_were(monkeypatch) -> None:
    """Before candidate schedules, a pair was cut by (n_A, n_B): whole batches × all rows when B's
    rows fit a piece, else each batch × near-equal slices of B's rows, mask g·n_B + x for D(g, x)."""
    monkeypatch.setattr(shw, "PIECE_BYTES", 10 * LAYOUT.ciphertext_bytes)
    K = LAYOUT.slots
    small = shw.all_pairs(LAYOUT, 3 * K + 1, 3)  # 4 batches of 3 rows: 3 batches per piece
    assert [(p.batches, p.entries, p.first, p.values) for p in small] == [
        (range(3), None, 0, 9), (range(3, 4), None, 9, 3)]
    large = shw.all_pairs(LAYOUT, K + 1, 25)  # 2 batches of 25 rows: 3 slices each (8, 8, 9)
    assert [(p.batches, p.entries, p.first) for p in large] == [
        (range(1), range(8), 0), (range(1), range(8, 16), 8), (range(1), range(16, 25), 16),
        (range(1, 2), range(8), 25), (range(1, 2), range(8, 16), 33), (range(1, 2), range(16, 25), 41)]
    assert large[4].b_rows(25) == range(8, 16) and small[0].b_rows(3) == range(3)
