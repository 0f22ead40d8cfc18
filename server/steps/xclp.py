"""The coordinator's side of an XCLP job as pure steps (DESIGN §5, paper 003 Alg. 1).

What the coordinator does, in order, and what each function here computes:

1. `secure_hamming_pairs` — which side of each pair holds the Paillier key (§5.3).
2. `check_intra_block`, `cross_block`, `assemble_hamming` — the pooled Hamming matrix H from each
   party's own block (§5.2) and each pair's unmasked SecureHamming block (t − R) mod N (§5.3), validated.
3. `influence_blocks` — graph, 𝒲 and influence columns via `xclp.graph`, cut per party (§5.4-5.5).
4. `rowsums_frame`, `sum_row_sums` — the SecureRowSums aggregate cut into row blocks (§5.6).
5. `Membership`, `drop_party`, `rowsums_participants`, `drop_party_from_H` — dropouts as pure
   transitions (§5, end): the service calls them when a deadline passes.

Rows of H are ordered by party (the roster's sorted ids), each party's rows in its own order.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from xclp.crypto.secure_hamming import Residues, SlotLayout, unmask_distances
from xclp.errors import InvalidInput, OutOfRange, PeerDropped, ProtocolError
from xclp.graph import GraphParams, InfluenceMethod, build_influence
from xclp.hamming import hamming_dtype
from xclp.lsh import check_lsh_bits
from xclp.v1.xclp_layout import RowLayout, check_party_ids, secure_hamming_pairs


class XclpStage(enum.Enum):
    """Where an XCLP job is when a party drops (DESIGN §5, end); the values name it in `drop=`."""

    SETUP = "setup"  # before SecureHamming: as if it never joined
    SECURE_HAMMING = "secure_hamming"  # its rows and columns leave H
    GRAPH = "graph"  # after H, before SecureRowSums: shaped the graph, no labels in or out
    ROW_SUMS = "secure_rowsums"  # SecureRowSums restarts without it under fresh keys


@dataclass(frozen=True)
class Membership:
    """Who takes part in which part of one XCLP job.

    graph: sorted ids whose rows are in H; labels: sorted ids in SecureRowSums (a subset of
    `graph`: they contribute labels and receive their rows of Z); rowsums_attempt: the attempt number
    of SecureRowSums (a restart uses a new attempt, so no mask is ever reused, DESIGN §4.2).
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
    """The membership after `party` missed a deadline in `stage` (DESIGN §5, paper 003 §3.3 Robustness).

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


@dataclass(frozen=True)
class HammingMatrix:
    """The pooled H: uint16[n, n] (int32 for L > 65535), rows and columns in `layout` order."""

    H: np.ndarray
    layout: RowLayout


def check_intra_block(block: np.ndarray, n_rows: int, lsh_bits: int) -> np.ndarray:
    """A party's own Hamming block (DESIGN §5.2), validated: int[n_j, n_j] -> hamming_dtype(L).

    Distances must lie in [0, L] (OutOfRange), the block must be square with the announced row
    count (InvalidInput), symmetric with a zero diagonal (ProtocolError: no honest party sends that).
    """
    lsh_bits = check_lsh_bits(lsh_bits)
    arr = np.asarray(block)
    if arr.dtype.kind not in "iu" or arr.shape != (n_rows, n_rows):
        raise InvalidInput(
            f"intra-party Hamming block must be int[{n_rows}, {n_rows}], got {arr.dtype}{list(arr.shape)}"
        )
    _check_range(arr, lsh_bits, "intra-party Hamming block")
    if not np.array_equal(arr, arr.T) or np.any(np.diagonal(arr) != 0):
        raise ProtocolError("intra-party Hamming block must be symmetric with a zero diagonal")
    return arr.astype(hamming_dtype(lsh_bits))


def cross_block(t: np.ndarray, r: np.ndarray, a_modulus: int, n_a: int, n_b: int, lsh_bits: int) -> np.ndarray:
    """One pair's distances H[b rows, a rows] from A's t and B's masks R (DESIGN §5.3 last step), validated.

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


def assemble_hamming(
    layout: RowLayout,
    intra: Mapping[str, np.ndarray],
    cross: Mapping[tuple[str, str], np.ndarray],
    lsh_bits: int,
) -> HammingMatrix:
    """H from validated blocks: intra[p] = int[n_p, n_p]; cross[(a, b)] = uint16[n_b, n_a] from `cross_block`.

    Every party of `layout` needs its own block and every pair of them one cross block, keyed
    (A, B) as the pair ran (`secure_hamming_pairs` of the roster at the time, which may include
    parties dropped since); blocks of parties outside `layout` are ignored. A missing block means
    a party dropped (PeerDropped naming the parties of the unfinished pairs).
    """
    lsh_bits = check_lsh_bits(lsh_bits)
    H = np.zeros((layout.n, layout.n), dtype=hamming_dtype(lsh_bits))
    missing: set[str] = set()
    for p in layout.parties:
        if p not in intra:
            missing.add(p)
            continue
        rows = layout.rows(p)
        H[rows, rows] = check_intra_block(intra[p], rows.stop - rows.start, lsh_bits)
    members = set(layout.parties)
    done: set[frozenset[str]] = set()
    for (a, b), block in cross.items():
        if not {a, b} <= members:
            continue
        if frozenset((a, b)) in done or a == b:
            raise ProtocolError(f"more than one cross block for the pair ({a}, {b})")
        done.add(frozenset((a, b)))
        ra, rb = layout.rows(a), layout.rows(b)
        shape = (rb.stop - rb.start, ra.stop - ra.start)
        if block.shape != shape:
            raise InvalidInput(f"cross block ({a}, {b}) must have shape {shape}, got {block.shape}")
        _check_range(block, lsh_bits, f"cross block ({a}, {b})")
        H[rb, ra] = block
        H[ra, rb] = block.T
    for task in secure_hamming_pairs(layout.parties):
        if frozenset((task.a, task.b)) not in done:
            missing.update({task.a, task.b})
    if missing:
        raise PeerDropped(f"Hamming blocks missing for {', '.join(sorted(missing))}", dropped=frozenset(missing))
    return HammingMatrix(H=H, layout=layout)


def drop_party_from_H(hm: HammingMatrix, party: str) -> HammingMatrix:
    """H without `party`'s rows and columns (dropout during SecureHamming, DESIGN §5 end)."""
    rows = hm.layout.rows(party)
    keep = np.r_[0 : rows.start, rows.stop : hm.layout.n]
    remaining = [p for p in hm.layout.parties if p != party]
    if not remaining:
        raise PeerDropped(f"party {party!r} was the last one in the graph", dropped=frozenset({party}))
    return HammingMatrix(H=hm.H[np.ix_(keep, keep)], layout=hm.layout.restrict(remaining))


def influence_blocks(
    hm: HammingMatrix,
    lsh_bits: int,
    receivers: Sequence[str],
    params: GraphParams = GraphParams(),
    *,
    labeled: Mapping[str, np.ndarray] | None,
    method: InfluenceMethod = "auto",
) -> dict[str, np.ndarray]:
    """What each receiver gets in DESIGN §5.5: float64[n, l_j] S_L^{(j)}, or float64[n, n_j] when hidden.

    labeled[j]: int[l_j] party j's labeled rows in its own row numbering (the labeled-index sets the
    coordinator learns, DESIGN §2). `labeled=None` is `hide_label_mask`: every receiver gets the
    influence columns of all its rows and picks its labeled ones itself. Only `receivers`
    (SecureRowSums participants) get columns: a party dropped after H gets none (DESIGN §5 end).
    """
    receivers = [p for p in hm.layout.parties if p in set(receivers)]
    columns: list[np.ndarray] = []
    for p in receivers:
        rows = hm.layout.rows(p)
        local = np.arange(rows.stop - rows.start) if labeled is None else _check_local(labeled.get(p), rows, p)
        columns.append(rows.start + local)
    counts = [c.size for c in columns]
    if sum(counts) == 0:
        raise InvalidInput("no labeled rows among the parties taking part in SecureRowSums; label at least one row")
    influence = build_influence(hm.H, lsh_bits, np.concatenate(columns), params, method)
    cuts = np.cumsum([0, *counts])
    return {p: influence.S_L[:, cuts[k] : cuts[k + 1]] for k, p in enumerate(receivers)}


def rowsums_frame(graph: RowLayout, participants: Sequence[str]) -> RowLayout:
    """The rows SecureRowSums aggregates: those of its participants, in graph order (DESIGN §5.6).

    Rows of a party that left after H are outside the frame: nobody sends them, so the coordinator
    never learns their (unmasked) sum and their owner gets none (DESIGN §5 end).
    """
    return graph.restrict(participants)


def sum_row_sums(frame: RowLayout, contributions: Mapping[str, np.ndarray], n_classes: int) -> dict[str, np.ndarray]:
    """Ẑ[R_j] for every participant j: uint64[n_j, C] (paper 003 §3.2 SecureRowSums).

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
    """int64[u]: a party's rows outside its labeled set, the only rows whose Z it gets (DESIGN §5.5)."""
    keep = np.ones(int(n_rows), dtype=bool)
    keep[np.asarray(labeled, dtype=np.int64)] = False
    return np.flatnonzero(keep)
