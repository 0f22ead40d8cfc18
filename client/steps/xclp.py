"""A party's side of an XCLP job as pure steps (docs/design.md §5, Scott et al. 2023 Alg. 1).

Each function maps what the party holds (its data, keys, what arrived) to what it sends. What
travels is always a wire payload (`xclp.v1.wire`: an array of a wire dtype, or opaque bytes):

| docs/design.md step      | function                    | sends                                  | to           |
|--------------------------|-----------------------------|----------------------------------------|--------------|
| §5.1 LSH                 | `lsh_step`                  | —                                      |              |
| §5.2, §10.1 own nearest  | `own_nearest`               | uint32[n_j, k', 2] (row, distance)     | coordinator  |
| §5.3 SecureHamming, A    | `hamming_encrypt`           | bytes: bit-slice ciphertexts           | B            |
| §5.3 SecureHamming, B    | `hamming_evaluate`          | bytes: evaluated ciphertexts; masks R  | A; coord.    |
| §5.3 SecureHamming, A    | `hamming_decrypt`           | masked packed distances t              | coordinator  |
| §5.5 labeled sets        | `labeled_rows`              | int64[l_j] (not with hide_label_mask)  | coordinator  |
| §5.5 influence received  | `influence_piece`, `InfluenceScores` (pieces, §10.2, §10.7); `select_influence` | — |  |
| §5.6 SecureRowSums       | `local_scores`, `encode_row_sums`, | uint64[n_frame − n_j, C]           | coordinator  |
|                          | `released_scores`, `label_dp_release` (label-DP) |                   |              |
|                          | `split_own_rows`            |                                        |              |
| §5.6-5.7 output          | `unmask_row_sums`, `party_scores`, `predict` | —                     |              |

Which side of a pair is A comes from the coordinator's task (`server.steps.xclp.secure_hamming_pairs`).
R and t are one |N|-bit value per ciphertext D (⌈n_A/K⌉·n_B of them), travelling as
uint8[⌈n_A/K⌉·n_B, |N|/8] big-endian rows (`crypto.secure_hamming.Residues`; whole-plaintext
masks mod N, see that module's "Deviation from docs/design.md §5.3").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from xclp.candidates import DUMMY, PairSchedule, b_rows
from xclp.client.steps.influence import InfluenceScores, influence_piece, labeled_rows, select_influence
from xclp.crypto.fixedpoint import FixedPoint
from xclp.crypto.masking import PairwiseMasker
from xclp.crypto.paillier import PaillierKeypair, PaillierPublicKey
from xclp.crypto.secure_hamming import (
    EncryptedSlices,
    EvaluatedDistances,
    SlotLayout,
    decrypt,
    decrypt_ciphertexts,
    encrypt_bit_slices,
    evaluate,
    evaluate_batches,
    masks_from_seed,
)
from xclp.data.validation import UNLABELED, check_features, check_labels
from xclp.errors import InvalidInput, ProtocolError
from xclp.graph import GraphParams
from xclp.lsh import check_lsh_bits, lsh_codes, lsh_projection
from xclp.neighbours import own_top_k
from xclp.privacy import label_dp
from xclp.privacy.label_dp import LabelDpPlan
from xclp.propagation import label_matrix, predict, scores
from xclp.seeding import Seed
from xclp.v1.secure_hamming_wire import Piece
from xclp.v1.xclp import NEIGHBOURS_DTYPE, ROWSUMS_PURPOSE, own_neighbours_shape
from xclp.v1.xclp_layout import RowLayout

__all__ = [
    "InfluenceScores",
    "MaskedRowSums",
    "NoisyRowSums",
    "check_party_data",
    "encode_row_sums",
    "label_dp_release",
    "released_scores",
    "graph_rows_of",
    "hamming_decrypt",
    "hamming_encrypt",
    "hamming_evaluate",
    "decrypt_piece",
    "evaluate_piece",
    "evaluate_scheduled",
    "slot_codes",
    "received_slices",
    "own_nearest",
    "labeled_rows",
    "local_scores",
    "lsh_step",
    "mask_row_sums",
    "predict",
    "party_scores",
    "returned_rows",
    "select_influence",
    "influence_piece",
    "slot_layout",
    "split_own_rows",
    "unmask_row_sums",
]


def lsh_step(X: object, seed: Seed, lsh_bits: int) -> np.ndarray:
    """Packed LSH codes uint64[n_j, L/64] of the party's rows (Alg. 1 lines 2-3, docs/design.md §5.1).

    Π derives from the common seed (docs/design.md §4.3), so every party projects with the same Π.
    """
    X = check_features(X)
    return lsh_codes(X, lsh_projection(seed, check_lsh_bits(lsh_bits), X.shape[1]))


def own_nearest(codes: np.ndarray, lsh_bits: int, params: GraphParams) -> np.ndarray:
    """The party's own k' = min(k, n_j − 1) nearest rows per row, by the graph's rule (docs/design.md §10.1):
    uint32[n_j, k', 2] of (own row number, Hamming distance), best first. Computed in row blocks,
    never the n_j × n_j matrix; the coordinator learns these distances, not the rest of the block.
    uint32 because a party's row numbers pass 65 535 (the distances, at most L, share the array;
    `server.steps.xclp.check_own_neighbours` checks both).
    """
    out = np.empty(own_neighbours_shape(len(codes), params.k), dtype=NEIGHBOURS_DTYPE)
    out[:, :, 0], out[:, :, 1] = own_top_k(codes, lsh_bits, params)
    return out


def slot_layout(public_key: PaillierPublicKey, lsh_bits: int) -> SlotLayout:
    """The packing both sides of a pair derive from A's modulus and L (docs/design.md §5.3 "Slots")."""
    return SlotLayout.for_key(public_key, check_lsh_bits(lsh_bits))


def hamming_encrypt(
    keypair: PaillierKeypair, codes: np.ndarray, lsh_bits: int, executor: Executor | None = None
) -> bytes:
    """Side A, message 1: the encrypted bit slices of A's codes, as bytes for B (docs/design.md §5.3)."""
    layout = slot_layout(keypair.public, lsh_bits)
    return encrypt_bit_slices(keypair, codes, layout, executor=executor).to_bytes()


def hamming_evaluate(
    a_public: PaillierPublicKey,
    slices: bytes,
    codes: np.ndarray,
    lsh_bits: int,
    n_a: int,
    executor: Executor | None = None,
) -> tuple[bytes, np.ndarray]:
    """Side B: (evaluated ciphertexts as bytes for A, masks R uint8[⌈n_A/K⌉·n_B, |N|/8] for the coordinator).

    `slices` is untrusted input from A: parsing validates its size against n_A, L and A's modulus.
    """
    received = received_slices(a_public, slices, lsh_bits, n_a)
    evaluated, masks = evaluate(a_public, received, codes, executor=executor)
    return evaluated.to_bytes(), masks.to_array()


def hamming_decrypt(
    keypair: PaillierKeypair, evaluated: bytes, lsh_bits: int, n_a: int, n_b: int, executor: Executor | None = None
) -> np.ndarray:
    """Side A, last step: t = (packed H + R) mod N, uint8[⌈n_A/K⌉·n_B, |N|/8], for the coordinator
    (docs/design.md §5.3)."""
    layout = slot_layout(keypair.public, lsh_bits)
    received = EvaluatedDistances.from_bytes(evaluated)
    if received.n_B != n_b:
        raise ProtocolError(f"B evaluated {received.n_B} vectors but has {n_b} rows")
    return decrypt(keypair, received, layout, n_a, executor).to_array()  # checks layout and n_A


def received_slices(a_public: PaillierPublicKey, slices: bytes, lsh_bits: int, n_a: int) -> EncryptedSlices:
    """Side B: A's bit slices parsed from untrusted bytes, checked against n_A, L and A's modulus."""
    layout = slot_layout(a_public, lsh_bits)
    received = EncryptedSlices.from_bytes(slices)
    if received.layout != layout or received.n_A != n_a:
        raise ProtocolError(
            f"A's bit slices declare {received.layout}, n_A={received.n_A}; expected {layout}, n_A={n_a}"
        )
    return received


def evaluate_piece(a_public: PaillierPublicKey, slices: EncryptedSlices, codes: np.ndarray, batches: range,
                   first: int, seed: bytes, executor: Executor | None = None, *, split: int = 1) -> bytes:
    """Side B, pieces of the streamed SecureHamming (docs/design.md §10.1): D for A's `batches`, each against
    the rows whose `codes` are given, masked with the pair's seeded masks from mask `first` on, as
    bytes for A, batch-major."""
    masks = masks_from_seed(seed, int(a_public.n), first, len(batches) * len(codes))
    return evaluate_batches(a_public, slices, codes, batches, masks, executor, split=split)


def slot_codes(codes: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The codes of `rows` (xclp.candidates: A's slots or B's entries), all zero for a DUMMY: a dummy
    is evaluated like any row, and nobody but the coordinator, which discards it, knows which it is."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.zeros((rows.size, codes.shape[1]), dtype=codes.dtype)
    real = rows != DUMMY
    out[real] = codes[rows[real]]
    return out


def evaluate_scheduled(a_public: PaillierPublicKey, slices: EncryptedSlices, codes: np.ndarray,
                       schedule: PairSchedule, lists: Sequence[np.ndarray], piece: Piece, seed: bytes,
                       executor: Executor | None = None, *, split: int = 1) -> bytes:
    """Side B of a pair on a candidate schedule: the piece's ciphertexts, batch by batch, each batch
    against this party's padded lists of the centres it holds (`candidates.b_rows`)."""
    out, first = [], piece.first
    for g in piece.batches:
        rows = b_rows(schedule, lists, g)
        if piece.entries is not None:
            rows = rows[piece.entries.start : piece.entries.stop]
        out.append(evaluate_piece(a_public, slices, slot_codes(codes, rows), range(g, g + 1), first, seed, executor,
                                  split=split))
        first += rows.size
    return b"".join(out)


def decrypt_piece(keypair: PaillierKeypair, ciphertexts: bytes, count: int, executor: Executor | None = None) -> bytes:
    """Side A, one piece: t = (packed H + R) mod N of each of B's `count` ciphertexts, |N|/8 bytes
    each, for the coordinator. ProtocolError if B sent another number of ciphertexts."""
    size = 2 * keypair.public.modulus_bits // 8
    if len(ciphertexts) != count * size:
        raise ProtocolError(f"a SecureHamming piece must carry {count} ciphertexts of {size} bytes, got "
                            f"{len(ciphertexts)} bytes")
    return decrypt_ciphertexts(keypair, ciphertexts, executor).data


def local_scores(S_L: np.ndarray, y: object, n_classes: int, *, normalise_labels: bool) -> np.ndarray:
    """Z̄^{(j)} = S_L^{(j)} Y_L^{(j)}: float64[n, C] (Alg. 1 line 10).

    Y_L is one-hot, or each class column divided by the party's own count of that class
    (`normalise_labels`, the authors' code; per party as in xclp.reference).
    """
    labels = check_labels(y, n_classes)
    labeled = labels[labels != UNLABELED]
    if labeled.size == 0:
        return np.zeros((S_L.shape[0], n_classes))
    return scores(S_L, label_matrix(labeled, n_classes, normalise_labels))


def released_scores(own: np.ndarray, released: np.ndarray, graph_rows: Sequence[tuple[str, int]],
                    me: str) -> np.ndarray:
    """float64[n, C]: Z̄ from the randomised labels (label-DP "response") on every graph row but this
    party's, where it keeps Z̄ from its true labels (those rows are never sent)."""
    rows = RowLayout.of(graph_rows).rows(me)
    out = np.array(released, dtype=np.float64)
    out[rows] = own[rows]
    return out


@dataclass(frozen=True)
class NoisyRowSums:
    """Party j's Z̄ with its label-DP noise (xclp.privacy.label_dp), in the ring: uint64[n, C] over the graph
    rows, its own rows exact and never sent. Drawn once, so every SecureRowSums attempt sends the
    same values."""

    encoded: np.ndarray
    plan: LabelDpPlan


def label_dp_release(Zbar: np.ndarray, graph_rows: Sequence[tuple[str, int]], me: str, plan: LabelDpPlan,
                     fixed_point: FixedPoint = FixedPoint()) -> NoisyRowSums:
    """`NoisyRowSums` of Z̄ float64[n, C] over the graph rows: every row but this party's own gets
    the plan's noise. The headroom is for every graph party summing, the largest frame."""
    graph = RowLayout.of(graph_rows)
    Zbar = np.asarray(Zbar, dtype=np.float64)
    if Zbar.ndim != 2 or Zbar.shape[0] != graph.n:
        raise InvalidInput(f"Z̄ must be float64[{graph.n}, C] over the graph rows, got shape {Zbar.shape}")
    own, terms = graph.rows(me), len(graph.parties)
    others = np.concatenate([Zbar[: own.start], Zbar[own.stop :]])
    noisy = label_dp.release(others, plan, fixed_point.frac_bits, fixed_point.max_encoded(terms))
    noisy = noisy.astype(fixed_point.signed_dtype).view(fixed_point.ring_dtype)
    exact = fixed_point.encode(Zbar[own], n_terms=terms)
    return NoisyRowSums(np.concatenate([noisy[: own.start], exact, noisy[own.start :]]), plan)


def encode_row_sums(Zbar: np.ndarray | NoisyRowSums, graph_rows: Sequence[tuple[str, int]],
                    participants: Sequence[str], fixed_point: FixedPoint = FixedPoint()) -> np.ndarray:
    """Z̄ on the SecureRowSums frame (the rows of `participants`), encoded in Z_{2^64}: uint64[n_frame, C].

    Zbar: float64[n, C] over the graph rows (graph_rows = [(party, n_party), ...] in H's order), or
    its label-DP release over them. Rows outside the frame (a party that left after H) are not
    sent: with nobody withholding a mask there, the coordinator would see their unmasked sum.
    """
    graph = RowLayout.of(graph_rows)
    frame = graph.restrict(participants)
    if isinstance(Zbar, NoisyRowSums):
        if Zbar.encoded.shape[0] != graph.n:
            raise InvalidInput(f"the noisy row sums cover {Zbar.encoded.shape[0]} rows, the graph {graph.n}")
        return np.concatenate([Zbar.encoded[graph.rows(p)] for p in frame.parties])
    Zbar = np.asarray(Zbar, dtype=np.float64)
    if Zbar.ndim != 2 or Zbar.shape[0] != graph.n:
        raise InvalidInput(f"Z̄ must be float64[{graph.n}, C] over the graph rows, got shape {Zbar.shape}")
    rows = np.concatenate([Zbar[graph.rows(p)] for p in frame.parties])
    return fixed_point.encode(rows, n_terms=len(frame.parties))  # headroom for summing every participant


def split_own_rows(masked: np.ndarray, graph_rows: Sequence[tuple[str, int]], participants: Sequence[str],
                   me: str) -> tuple[np.ndarray, np.ndarray]:
    """(payload uint64[n_frame − n_j, C], kept uint64[n_j, C]): the masked frame rows of every other
    participant, sent, and party j's own masked rows R_j, never sent. Ẑ^{(j)} in the paper zeroes
    R_j; not sending them is the same sum with fewer bytes. The coordinator's block R_j so misses
    exactly M^{(j)}[R_j], and only j can read it."""
    frame = RowLayout.of(graph_rows).restrict(participants)
    if me not in frame.parties:
        raise InvalidInput(f"party {me!r} is not a SecureRowSums participant")
    own = frame.rows(me)
    return np.concatenate([masked[: own.start], masked[own.stop :]]), masked[own].copy()


@dataclass(frozen=True)
class MaskedRowSums:
    """One SecureRowSums attempt of party j: `payload` sent to the coordinator, `kept` never sent
    (`split_own_rows`)."""

    payload: np.ndarray
    kept: np.ndarray


def mask_row_sums(
    Zbar: np.ndarray | NoisyRowSums,
    graph_rows: Sequence[tuple[str, int]],
    masker: PairwiseMasker,
    *,
    participants: Sequence[str],
    attempt: int,
    fixed_point: FixedPoint = FixedPoint(),
) -> MaskedRowSums:
    """Party j's SecureRowSums message (Scott et al. 2023 §3.2, docs/design.md §5.6) without the self mask, as the
    in-process simulation sends it: `encode_row_sums`, the pairwise masks M^{(j)} = Σ_{k≠j}
    ±PRG(key_jk) for (ROWSUMS_PURPOSE, attempt, participants), then `split_own_rows`. (The service's
    parties do the same through their masked-sum phase, client/phases/masked_sum.py.) The masker
    refuses a second use of the same attempt and participant set (ReplayRefused).
    """
    frame = RowLayout.of(graph_rows).restrict(participants)
    if masker.my_id not in frame.parties:
        raise InvalidInput(f"party {masker.my_id!r} is not a SecureRowSums participant")
    encoded = encode_row_sums(Zbar, graph_rows, participants, fixed_point)
    masked = masker.apply(encoded, purpose=ROWSUMS_PURPOSE, attempt=attempt, participants=list(frame.parties))
    return MaskedRowSums(*split_own_rows(masked, graph_rows, participants, masker.my_id))


def returned_rows(y: object, n_classes: int, *, hide_label_mask: bool) -> np.ndarray:
    """int64[m]: the party's rows whose scores the coordinator returns (docs/design.md §5.5): its unlabeled
    rows only, so that no party learns Z for its labeled rows, which (S being symmetric) would let
    it solve for other parties' labels; all rows under `hide_label_mask`, where the coordinator does
    not know which are labeled (every party must opt in to that)."""
    labels = check_labels(y, n_classes)
    return np.arange(labels.size) if hide_label_mask else np.flatnonzero(labels == UNLABELED)


def party_scores(y: object, n_classes: int, rows: np.ndarray, Z_rows: np.ndarray) -> np.ndarray:
    """float64[n_j, C]: Z for `rows`, and the party's own one-hot label on every other (labeled) row."""
    labels = check_labels(y, n_classes)
    scores = np.zeros((labels.size, n_classes))
    labeled = labels != UNLABELED
    scores[np.flatnonzero(labeled), labels[labeled]] = 1.0
    scores[rows] = Z_rows
    return scores


def unmask_row_sums(returned: np.ndarray, kept: np.ndarray, fixed_point: FixedPoint = FixedPoint()) -> np.ndarray:
    """Z[R_j] = Ẑ[R_j] + Z̃^{(j)}[R_j] decoded: float64[n_j, C] (Scott et al. 2023 §3.2 last step).

    returned: uint64[n_j, C] from the coordinator (untrusted: shape and dtype checked).
    """
    if not isinstance(returned, np.ndarray) or returned.dtype != np.uint64 or returned.shape != kept.shape:
        got = f"{returned.dtype}{list(returned.shape)}" if isinstance(returned, np.ndarray) else type(returned).__name__
        raise InvalidInput(f"SecureRowSums result must be uint64{list(kept.shape)}, got {got}")
    return fixed_point.decode(returned + kept)  # uint64 addition wraps mod 2^64


def check_party_data(X: object, y: object, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """A party's (features float64[n, d], labels int64[n]) checked once before the job."""
    X = check_features(X)
    return X, check_labels(y, n_classes, n=X.shape[0])


def graph_rows_of(sizes: Mapping[str, int], graph: Sequence[str]) -> tuple[tuple[str, int], ...]:
    """[(party, rows)] for the graph's parties in sorted order (H's row order, docs/design.md §5.2)."""
    return tuple((p, int(sizes[p])) for p in sorted(graph))
