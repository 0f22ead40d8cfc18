"""The coordinator's side of an XCLP job as pure steps (docs/design.md §5, Scott et al. 2023 Alg. 1).

What the coordinator does, in order, and what each function here computes:

1. `secure_hamming_pairs` — which side of each pair holds the Paillier key (§5.3).
2. `check_own_neighbours`, `cross_block`, `NeighbourGraph` — the kNN graph, never H (§10.1): each
   party's own k nearest rows (§5.2) and each pair's unmasked SecureHamming block (t − R) mod N
   (§5.3), validated and folded into per-row top-k candidates as they arrive (`xclp.neighbours`).
3. `influence_blocks` — 𝒲 and influence columns via `xclp.graph`, cut per party (§5.4-5.5).
4. `rowsums_frame`, `sum_row_sums` — the SecureRowSums aggregate cut into row blocks (§5.6).
5. `Membership`, `drop_party`, `rowsums_participants` — dropouts as pure transitions (§5, end): the
   service calls them when a deadline passes (a party lost in SecureHamming: the graph is folded
   again among the rest).

Rows of the graph are ordered by party (the roster's sorted ids), each party's rows in its own order.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from xclp.candidates import DUMMY, PairSchedule
from xclp.crypto.secure_hamming import Residues, SlotLayout, masks_from_seed, unmask_distances
from xclp.errors import InvalidInput, OutOfRange, PeerDropped, ProtocolError
from xclp.graph import DENSE_MAX_NODES, SPARSE_FILL_MAX, GraphParams, InfluenceMethod, influence_of
from xclp.hamming import hamming_dtype
from xclp.lsh import check_lsh_bits
from xclp.memory import INT_OVERHEAD
from xclp.neighbours import TopK
from xclp.v1.secure_hamming_wire import MAX_IN_FLIGHT, PIECE_BYTES, Piece, piece_values
from xclp.v1.xclp import own_neighbours_shape, solve_columns
from xclp.v1.xclp_layout import RowLayout, check_party_ids, secure_hamming_pairs


class XclpStage(enum.Enum):
    """Where an XCLP job is when a party drops (docs/design.md §5, end); the values name it in `drop=`."""

    SETUP = "setup"  # before SecureHamming: as if it never joined
    SECURE_HAMMING = "secure_hamming"  # its rows and columns leave H
    GRAPH = "graph"  # after H, before SecureRowSums: shaped the graph, no labels in or out
    ROW_SUMS = "secure_rowsums"  # SecureRowSums restarts without it under fresh keys


@dataclass(frozen=True)
class Membership:
    """Who takes part in which part of one XCLP job.

    graph: sorted ids whose rows are in H; labels: sorted ids in SecureRowSums (a subset of
    `graph`: they contribute labels and receive their rows of Z); rowsums_attempt: the attempt number
    of SecureRowSums (a restart uses a new attempt, so no mask is ever reused, docs/design.md §4.2).
    """

    graph: tuple[str, ...]
    labels: tuple[str, ...]
    rowsums_attempt: int = 0

    def __post_init__(self) -> None:
        if list(self.graph) != sorted(set(self.graph)) or list(self.labels) != sorted(set(self.labels)):
            raise InvalidInput("membership ids must be unique and sorted")
        if not set(self.labels) <= set(self.graph):
            raise InvalidInput("every SecureRowSums participant must have rows in the graph")
        attempt = self.rowsums_attempt
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
            raise InvalidInput(f"rowsums_attempt must be an integer >= 0, got {self.rowsums_attempt!r}")


def start_membership(party_ids: Sequence[str]) -> Membership:
    """Everyone in the roster takes part in everything, attempt 0."""
    ids = check_party_ids(party_ids)
    return Membership(graph=ids, labels=ids)


def drop_party(membership: Membership, party: str, stage: XclpStage) -> Membership:
    """The membership after `party` missed a deadline in `stage` (docs/design.md §5, Scott et al. 2023 §3.3 Robustness).

    SETUP and SECURE_HAMMING remove it from everything (the coordinator then assembles H without
    its blocks, or cuts them out with `drop_party_from_H`); GRAPH removes it from SecureRowSums only
    (it shaped the graph but contributes no labels and gets none); ROW_SUMS does the same and moves
    to the next attempt, so the restart runs under fresh keys. Raises PeerDropped when nobody is left.
    """
    stage = XclpStage(stage)
    if stage in (XclpStage.SETUP, XclpStage.SECURE_HAMMING):
        if party not in membership.graph:
            raise InvalidInput(f"party {party!r} is not in the graph; cannot drop it in {stage.value}")
        graph = tuple(p for p in membership.graph if p != party)
        labels = tuple(p for p in membership.labels if p != party)
        attempt = membership.rowsums_attempt
    else:
        if party not in membership.labels:
            raise InvalidInput(f"party {party!r} is not in SecureRowSums; cannot drop it in {stage.value}")
        graph = membership.graph
        labels = tuple(p for p in membership.labels if p != party)
        attempt = membership.rowsums_attempt + (1 if stage is XclpStage.ROW_SUMS else 0)
    if not labels:
        raise PeerDropped(
            f"party {party!r} dropped in {stage.value} and no party is left to propagate labels",
            dropped=frozenset({party}),
        )
    return Membership(graph=graph, labels=labels, rowsums_attempt=attempt)


def rowsums_participants(membership: Membership) -> tuple[str, ...]:
    """The participant set of the current SecureRowSums attempt (bound into every mask key)."""
    return membership.labels


def check_own_neighbours(payload: np.ndarray, n_rows: int, k: int, lsh_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """A party's own k nearest rows (docs/design.md §10.1), validated: (candidates int64[n_j, k'], distances).

    uint32[n_j, k', 2] of (own row number, Hamming distance), k' = min(k, n_j − 1): rows in range,
    never the row itself, distinct per row (InvalidInput), distances in [0, L] (OutOfRange).
    """
    lsh_bits = check_lsh_bits(lsh_bits)
    shape = own_neighbours_shape(n_rows, k)
    arr = np.asarray(payload)
    if arr.dtype != np.uint32 or arr.shape != shape:
        raise InvalidInput(f"a party's own nearest rows must be uint32{list(shape)}, got {arr.dtype}{list(arr.shape)}")
    candidates, distances = arr[:, :, 0].astype(np.int64), arr[:, :, 1]
    if candidates.size and int(candidates.max()) >= n_rows:
        raise InvalidInput(f"a party's own nearest rows must be row numbers in 0..{n_rows - 1}")
    if np.any(candidates == np.arange(n_rows)[:, None]):
        raise InvalidInput("a party's own nearest rows must not name the row itself")
    if shape[1] > 1 and np.any(np.diff(np.sort(candidates, axis=1), axis=1) == 0):
        raise InvalidInput("a party's own nearest rows must be distinct")
    _check_range(distances, lsh_bits, "a party's own nearest rows")
    return candidates, distances.astype(hamming_dtype(lsh_bits))


def cross_block(t: np.ndarray, r: np.ndarray, a_modulus: int, n_a: int, n_b: int, lsh_bits: int) -> np.ndarray:
    """One pair's distances H[b rows, a rows] from A's t and B's masks R (docs/design.md §5.3 last step), validated.

    t, r: uint8[⌈n_a/K⌉·n_b, |N|/8], one big-endian value per ciphertext D; a_modulus: A's
    Paillier N (from A's signed key bundle), which fixes |N|, K and the arithmetic mod N.
    Refuses a wrong dtype or shape (InvalidInput) and anything `unmask_distances` finds malformed
    — a value not below N, bits above the last slot, a non-zero padding slot, a distance outside
    [0, L] (OutOfRange).
    """
    lsh_bits = check_lsh_bits(lsh_bits)
    layout = SlotLayout(int(a_modulus).bit_length(), lsh_bits)
    count = layout.values(n_a, n_b)
    t_values = Residues.from_array(t, layout.modulus_bits, count, "SecureHamming t (from A)")
    r_values = Residues.from_array(r, layout.modulus_bits, count, "SecureHamming R (from B)")
    H = unmask_distances(t_values, r_values, a_modulus, layout, n_a, n_b)
    return H.astype(hamming_dtype(lsh_bits))


def check_piece_t(t: bytes, layout: SlotLayout, piece: Piece, n_a: int, what: str = "") -> int:
    """A's rows in `piece` (of its n_a), once t has the piece's size: one |N|/8-byte value per
    ciphertext D (InvalidInput otherwise, about `what`)."""
    rows = piece.a_rows(layout, n_a)
    r_a = rows.stop - rows.start
    if r_a < 1 or layout.batches(r_a) != len(piece.batches) or len(t) != piece.values * layout.value_bytes:
        what = what or f"t of a piece of {len(piece.batches)} batches ({piece.values} values)"
        raise InvalidInput(f"{what} must be {piece.values} values of {layout.value_bytes} bytes, got {len(t)} bytes")
    return r_a


def cross_piece(t: bytes, seed: bytes, a_modulus: int, piece: Piece, n_a: int, n_b: int,
                lsh_bits: int) -> np.ndarray:
    """One piece of a pair (docs/design.md §10.1, xclp.v1.secure_hamming_wire): H[B's rows of the piece, A's
    rows of its batches] from A's t of the piece and B's masks, regenerated from B's seed.

    t: |N|/8-byte big-endian values, one per ciphertext D of the piece, batch-major. Refuses a
    wrong size (InvalidInput) and what `unmask_distances` finds malformed (OutOfRange).
    """
    lsh_bits = check_lsh_bits(lsh_bits)
    layout = SlotLayout(int(a_modulus).bit_length(), lsh_bits)
    r_a = check_piece_t(t, layout, piece, n_a)
    masks = masks_from_seed(seed, a_modulus, piece.first, piece.values)
    H = unmask_distances(Residues(layout.modulus_bits, t), masks, a_modulus, layout, r_a, len(piece.b_rows(n_b)))
    return H.astype(hamming_dtype(lsh_bits))


def scheduled_piece(t: bytes, seed: bytes, a_modulus: int, piece: Piece, schedule: PairSchedule,
                    lsh_bits: int) -> list[tuple[int, range, np.ndarray]]:
    """One piece of a pair on a candidate schedule (xclp.candidates): per batch g of the piece,
    (g, the batch's entries the piece carries, H[those entries, the batch's slots]) from A's t and
    B's masks, regenerated from B's seed. InvalidInput for a wrong size, OutOfRange as
    `unmask_distances` (a padding slot past the lists' end must decrypt to 0)."""
    lsh_bits = check_lsh_bits(lsh_bits)
    layout = SlotLayout(int(a_modulus).bit_length(), lsh_bits)
    counts = schedule.counts()
    if len(t) != piece.values * layout.value_bytes:
        raise InvalidInput(f"t of a piece of {len(piece.batches)} batches must be {piece.values} values of "
                           f"{layout.value_bytes} bytes, got {len(t)} bytes")
    masks = masks_from_seed(seed, a_modulus, piece.first, piece.values)
    occupied = np.count_nonzero(schedule.slot_centre != DUMMY)
    out, at = [], 0
    for g in piece.batches:
        entries = range(int(counts[g])) if piece.entries is None else piece.entries
        m, slots = len(entries), min(layout.slots, int(occupied) - g * layout.slots)
        values = t[at * layout.value_bytes : (at + m) * layout.value_bytes]
        H = unmask_distances(Residues(layout.modulus_bits, values), masks[at : at + m], a_modulus, layout, slots, m)
        out.append((g, entries, H.astype(hamming_dtype(lsh_bits))))
        at += m
    return out


class NeighbourGraph:
    """What the coordinator keeps of H (docs/design.md §10.1): per row of `layout`, the k best candidates,
    from every party's own nearest rows and every pair's cross block, folded as they arrive.

    Kept per source party (`tops[q]`: every row's k best among q's rows), and merged only in
    `adjacency`: the k best of a row are the k best of the union of its per-source k best, so W is
    the same; and when a party drops, the pairs among the others that are folded stay folded
    (`among`): only its own candidates leave, and no candidate it pushed out is lost."""

    def __init__(self, layout: RowLayout, own: Mapping[str, tuple[np.ndarray, np.ndarray]] | None, lsh_bits: int,
                 params: GraphParams) -> None:
        self.layout, self.params = layout, params
        self.lsh_bits = check_lsh_bits(lsh_bits)
        self.tops = {p: TopK(layout.n, self.lsh_bits, params) for p in layout.parties}
        self.pairs: set[frozenset[str]] = set()
        if own is not None:  # None: `among` fills the rows in from an earlier graph
            for p in layout.parties:
                candidates, distances = own[p]
                rows = layout.rows(p)
                self.tops[p].fold_lists(rows, candidates + rows.start, distances)

    @property
    def k(self) -> int:
        return int(self.params.k)

    def among(self, layout: RowLayout, keep: set[frozenset[str]]) -> NeighbourGraph:
        """This graph among `layout`'s parties (a subset, in the same order, after a dropout), keeping
        each party's own candidates and what the pairs of `keep` folded here (whole, or the pieces
        folded so far, which the pair goes on from); every other pair is to be folded again."""
        graph = NeighbourGraph(layout, None, self.lsh_bits, self.params)
        for q in layout.parties:
            old, new = self.tops[q], graph.tops[q]
            shift = layout.rows(q).start - self.layout.rows(q).start  # q's columns move with its rows
            for p in layout.parties:
                if p == q or frozenset((p, q)) in keep:
                    was, now = self.layout.rows(p), layout.rows(p)
                    new.sim[now], new.idx[now] = old.sim[was], np.where(old.idx[was] >= 0, old.idx[was] + shift, -1)
        graph.pairs = {pair for pair in keep & self.pairs if pair <= set(layout.parties)}
        return graph

    def fold_pair(self, a: str, b: str, block: np.ndarray) -> None:
        """One pair's distances H[b rows, a rows] (from `cross_block`), folded both ways, then dropped."""
        ra, rb = self.layout.rows(a), self.layout.rows(b)
        shape = (rb.stop - rb.start, ra.stop - ra.start)
        if block.shape != shape:
            raise InvalidInput(f"cross block ({a}, {b}) must have shape {shape}, got {block.shape}")
        self.fold_piece(a, b, 0, 0, block)
        self.pair_done(a, b)

    def fold_piece(self, a: str, b: str, a_first: int, b_first: int, block: np.ndarray) -> None:
        """A piece of a pair (docs/design.md §10.1): H[b's rows b_first.., a's rows a_first..] (from
        `cross_piece`), folded both ways, then dropped."""
        if frozenset((a, b)) in self.pairs or a == b:
            raise ProtocolError(f"the pair ({a}, {b}) is already folded")
        ra, rb = self.layout.rows(a), self.layout.rows(b)
        if block.ndim != 2 or min(a_first, b_first) < 0 or a_first + block.shape[1] > ra.stop - ra.start \
                or b_first + block.shape[0] > rb.stop - rb.start:
            raise InvalidInput(f"a piece of the pair ({a}, {b}) at rows ({b_first}, {a_first}) of shape {block.shape} "
                               f"does not fit {b}'s {rb.stop - rb.start} x {a}'s {ra.stop - ra.start} rows")
        _check_range(block, self.lsh_bits, f"cross block ({a}, {b})")
        part_a = slice(ra.start + a_first, ra.start + a_first + block.shape[1])
        part_b = slice(rb.start + b_first, rb.start + b_first + block.shape[0])
        self.tops[a].fold_block(part_b, part_a, block)  # b's rows, a's candidates
        self.tops[b].fold_block(part_a, part_b, block.T)

    def fold_scheduled(self, a: str, b: str, slots: np.ndarray, rows: np.ndarray, block: np.ndarray,
                       keep: np.ndarray) -> None:
        """A batch of a pair on a candidate schedule: distances int[m, K'] between B's rows `rows` and
        A's rows in the batch's slots `slots` (own numbering, DUMMY-padded, either may repeat a row
        of two centres), folded both ways where `keep` (xclp.candidates.folded), then dropped."""
        if frozenset((a, b)) in self.pairs or a == b:
            raise ProtocolError(f"the pair ({a}, {b}) is already folded")
        _check_range(block, self.lsh_bits, f"cross block ({a}, {b})")
        x, s = np.nonzero(keep)
        if not x.size:
            return
        ra, rb = self.layout.rows(a), self.layout.rows(b)
        ub, ib = np.unique(rows[x], return_inverse=True)
        ua, ia = np.unique(slots[s], return_inverse=True)
        dense = np.zeros((ub.size, ua.size), dtype=block.dtype)
        kept = np.zeros(dense.shape, dtype=bool)
        dense[ib, ia], kept[ib, ia] = block[x, s], True
        self.tops[a].fold_scattered(ub + rb.start, ua + ra.start, dense, kept)
        self.tops[b].fold_scattered(ua + ra.start, ub + rb.start, dense.T, kept.T)

    def pair_done(self, a: str, b: str) -> None:
        """Every piece of the pair is folded: `adjacency` may count it."""
        if frozenset((a, b)) in self.pairs:
            raise ProtocolError(f"the pair ({a}, {b}) is already folded")
        self.pairs.add(frozenset((a, b)))

    def adjacency(self) -> sp.csr_matrix:
        """W (docs/design.md §5.4) once every pair is folded; PeerDropped naming the parties of missing pairs."""
        missing = {p for task in secure_hamming_pairs(self.layout.parties)
                   if frozenset((task.a, task.b)) not in self.pairs for p in (task.a, task.b)}
        if missing:
            raise PeerDropped(f"Hamming blocks missing for {', '.join(sorted(missing))}", dropped=frozenset(missing))
        top = TopK(self.layout.n, self.lsh_bits, self.params)
        for source in self.tops.values():
            top.merge(0, source.sim, source.idx)
        return top.adjacency()


def influence_columns_of(layout: RowLayout, receivers: Sequence[str], *,
                         labeled: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """Per receiver (in layout order), the global columns of S it gets (docs/design.md §5.5): its labeled
    rows, or with `labeled=None` (hide_label_mask) all its rows. InvalidInput if nobody has a label."""
    out, wanted = {}, set(receivers)
    for p in layout.parties:
        if p in wanted:
            rows = layout.rows(p)
            local = np.arange(rows.stop - rows.start) if labeled is None else _check_local(labeled.get(p), rows, p)
            out[p] = rows.start + local
    if sum(c.size for c in out.values()) == 0:
        raise InvalidInput("no labeled rows among the parties taking part in SecureRowSums; label at least one row")
    return out


def influence_blocks(
    W: sp.csr_matrix,
    layout: RowLayout,
    receivers: Sequence[str],
    params: GraphParams = GraphParams(),
    *,
    labeled: Mapping[str, np.ndarray] | None,
    method: InfluenceMethod = "auto",
    tolerance: float = 0.0,
) -> dict[str, np.ndarray]:
    """What each receiver gets in docs/design.md §5.5: float64[n, l_j] S_L^{(j)}, or float64[n, n_j] when hidden
    (with a tolerance, pushed: xclp.sparse_influence; held dense here, for small runs).

    W: the kNN adjacency over `layout`'s rows (`NeighbourGraph.adjacency`). labeled[j]: int[l_j]
    party j's labeled rows in its own row numbering (the labeled-index sets the coordinator learns,
    docs/design.md §2). `labeled=None` is `hide_label_mask`: every receiver gets the influence columns of
    all its rows and picks its labeled ones itself. Only `receivers` (SecureRowSums participants)
    get columns: a party dropped after the graph gets none (docs/design.md §5 end).
    """
    columns = influence_columns_of(layout, receivers, labeled=labeled)
    influence = influence_of(W, np.concatenate(list(columns.values())), params, method, tolerance)
    cuts = np.cumsum([0, *(c.size for c in columns.values())])
    return {p: influence.S_L[:, cuts[k] : cuts[k + 1]] for k, p in enumerate(columns)}


def rowsums_frame(graph: RowLayout, participants: Sequence[str]) -> RowLayout:
    """The rows SecureRowSums aggregates: those of its participants, in graph order (docs/design.md §5.6).

    Rows of a party that left after H are outside the frame: nobody sends them, so the coordinator
    never learns their (unmasked) sum and their owner gets none (docs/design.md §5 end).
    """
    return graph.restrict(participants)


def sum_row_sums(frame: RowLayout, contributions: Mapping[str, np.ndarray], n_classes: int) -> dict[str, np.ndarray]:
    """Ẑ[R_j] for every participant j: uint64[n_j, C] (Scott et al. 2023 §3.2 SecureRowSums).

    contributions[k]: uint64[n_frame − n_k, C], party k's masked rows of every *other*
    participant in frame order (its own rows R_k never leave it). The coordinator sums mod 2^64;
    block R_j of the sum still carries −M^{(j)}[R_j], which only party j can remove.
    """
    missing = set(frame.parties) - set(contributions)
    if missing:
        names = ", ".join(sorted(missing))
        raise PeerDropped(f"no SecureRowSums contribution from {names}", dropped=frozenset(missing))
    strangers = set(contributions) - set(frame.parties)
    if strangers:
        raise ProtocolError(f"SecureRowSums contributions from non-participants {sorted(strangers)}")
    total = np.zeros((frame.n, n_classes), dtype=np.uint64)
    for k in frame.parties:
        own = frame.rows(k)
        arr = contributions[k]
        shape = (frame.n - (own.stop - own.start), n_classes)
        if not isinstance(arr, np.ndarray) or arr.dtype != np.uint64 or arr.shape != shape:
            got = f"{arr.dtype}{list(arr.shape)}" if isinstance(arr, np.ndarray) else type(arr).__name__
            raise InvalidInput(f"SecureRowSums contribution of {k!r} must be uint64{list(shape)}, got {got}")
        np.add(total[: own.start], arr[: own.start], out=total[: own.start])  # wraps mod 2^64
        np.add(total[own.stop :], arr[own.start :], out=total[own.stop :])
    return {p: total[frame.rows(p)].copy() for p in frame.parties}


INFLUENCE_BACKLOG_BYTES = 16 << 20  # influence bytes left waiting for a party when the next block is solved
PUSH_ENTRIES = 0.1  # a pushed column's entries × its tolerance: 0.06-0.1 (benchmarks/sparse_influence.py)


def coordinator_bytes(sizes: Sequence[int], layout: SlotLayout, k: int, n_classes: int, slots: float = 1.0,
                      tolerance: float = 0.0) -> int:
    """Peak bytes of an XCLP run on the coordinator (docs/design.md §10.5), linear in the rows but for the
    dense solve of a small graph: the graph, and the largest of its steps' working sets.

    - the graph: each party's own nearest rows (10 bytes per candidate), the top-k candidates
      per source party and merged (16 each) and W with its normalisation (about 48): ~(74 + 16·P)·n·k;
    - SecureHamming: relays waiting in mailboxes, one copy of each party's slices (it sends them
      to one B at a time) and MAX_IN_FLIGHT pieces per pair, plus one piece being unmasked (its
      values as Python integers) and folded (blocks of 2^20 distances);
    - the influence solve: dense Cholesky (3·n² floats) up to DENSE_MAX_NODES rows, else the
      larger of a sparse LU (at most SPARSE_FILL_MAX times I − α𝒲's n·(2k + 1) nonzeros, 12 bytes
      each, and its right-hand sides) and conjugate gradients on `solve_columns(n)` columns (at most
      eight float64[n, c] arrays), which it falls back to past that fill; and
      what waits for the parties: the block just solved and the one before it, queued for its
      receiver (the next is solved while that one is sent), and for each party up
      to INFLUENCE_BACKLOG_BYTES in its mailbox (a party that stops reading is sent no more) and
      about as much taken into its gRPC stream and not yet acknowledged (measured, 3 × 4 000 rows:
      292 MB above the process's resident set before work, against 315 MB estimated);
    - pushed instead (a tolerance, §10.7): 8 threads' n-long arrays (33 bytes a row), two blocks of
      `solve_columns(n)` columns of min(n, PUSH_ENTRIES / tolerance) entries (24 bytes each), the backlog;
    - SecureRowSums: the participants' contributions and their sum, uint64[n, C] each.

    `slots`: a party's slots as A per row (XclpJobParams.slots_per_row: more than one on candidate pairs).
    """
    n, parties = int(sum(sizes)), len(sizes)
    graph = (74 + 16 * parties) * n * k
    slices = sum(layout.slices_bytes(math.ceil(slots * m)) for m in sizes) if parties > 1 else 0
    pairs = parties * (parties - 1) // 2
    unmask = piece_values(layout) * (layout.value_bytes + 3 * (layout.value_bytes + INT_OVERHEAD)) + (64 << 20)
    hamming = slices + pairs * MAX_IN_FLIGHT * PIECE_BYTES + unmask
    columns = n if n <= DENSE_MAX_NODES else solve_columns(n)
    lu = SPARSE_FILL_MAX * n * (2 * k + 1) * 12 + 16 * n * columns
    solve = 3 * 8 * n * n if n <= DENSE_MAX_NODES else max(64 * n * columns, lu)
    influence = solve + 2 * 8 * n * columns + parties * 2 * INFLUENCE_BACKLOG_BYTES  # a block queued, one solved
    if tolerance:
        influence = 8 * 33 * n + 48 * solve_columns(n) * min(n, math.ceil(PUSH_ENTRIES / tolerance)) + \
            parties * 2 * INFLUENCE_BACKLOG_BYTES
    rowsums = (parties + 2) * n * n_classes * 8
    return graph + max(hamming, influence, rowsums)


def _check_range(arr: np.ndarray, lsh_bits: int, name: str) -> None:
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > lsh_bits):
        raise OutOfRange(f"{name} has distances outside [0, {lsh_bits}]")


def _check_local(local: np.ndarray | None, rows: slice, party: str) -> np.ndarray:
    n = rows.stop - rows.start
    idx = np.asarray([] if local is None else local)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise InvalidInput(f"labeled rows of {party!r} must be a 1-D integer array")
    idx = idx.astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= n or np.any(np.diff(idx) <= 0)):
        raise InvalidInput(f"labeled rows of {party!r} must be ascending, distinct and in 0..{n - 1}")
    return idx


def unlabeled_rows(n_rows: int, labeled: np.ndarray) -> np.ndarray:
    """int64[u]: a party's rows outside its labeled set, the only rows whose Z it gets (docs/design.md §5.5)."""
    keep = np.ones(int(n_rows), dtype=bool)
    keep[np.asarray(labeled, dtype=np.int64)] = False
    return np.flatnonzero(keep)
