"""An XCLP job with every party and the coordinator in one process (docs/design.md §4-§5).

`run_xclp_inprocess` runs the party steps (`client.steps.xclp`) and the coordinator steps
(`server.steps.xclp`) in protocol order with real cryptography — Paillier SecureHamming, X25519
pairwise secrets, HKDF-derived AES-CTR masks, the 2^64 fixed-point ring — and sends every message
through the wire encoding (`xclp.v1.wire.payload_bytes`: raw little-endian bytes, dtype, shape),
so the receiver works on exactly the bytes that would travel. It is the reference for the gRPC
wiring, the oracle of tests/service/test_xclp_steps.py, and what benchmarks time as
`in_process_seconds`.

Not modelled here: signatures on key bundles (crypto/identity.py) and the sealed distribution
of the common seed (docs/design.md §4.3) — `seed` is taken as already agreed; deadlines are modelled by
`drop` (a party that drops in a stage sends nothing from that stage on).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import overload

import numpy as np
import scipy.sparse as sp

from xclp.client.phases.masked_sum import SelfMasks
from xclp.client.steps import xclp as party
from xclp.crypto.fixedpoint import FixedPoint
from xclp.crypto.masking import PairwiseMasker, generate_x25519, public_bytes, shared_secret
from xclp.crypto.paillier import MIN_SECURE_BITS, PaillierKeypair, PaillierPublicKey
from xclp.errors import InvalidInput
from xclp.graph import GraphParams
from xclp.privacy import label_dp
from xclp.privacy.label_dp import LabelDpPlan
from xclp.server.steps import xclp as coord
from xclp.v1.double_masking import self_mask, unpack_reveal
from xclp.v1.wire import Payload, payload_bytes


@dataclass(frozen=True)
class PartyOutput:
    """What one party ends with: labels int64[n_j], confidence float64[n_j], scores float64[n_j, C]:
    Z for its unlabeled rows (all rows under hide_label_mask), its own one-hot label on the others."""

    labels: np.ndarray
    confidence: np.ndarray
    scores: np.ndarray


@dataclass(frozen=True)
class RowSumsAttempt:
    """One SecureRowSums attempt as the coordinator saw it: the uint64 payload each party pushed."""

    round: int
    participants: tuple[str, ...]
    received: Mapping[str, np.ndarray]
    completed: bool


@dataclass(frozen=True)
class InProcessResult:
    """outputs: per party that received labels; W: the coordinator's kNN adjacency (it never holds H,
    docs/design.md §10.1) over `layout`'s rows; membership: who ended in the graph / in SecureRowSums;
    seconds and bytes_sent: per step."""

    outputs: Mapping[str, PartyOutput]
    W: sp.csr_matrix
    layout: coord.RowLayout
    membership: coord.Membership
    rowsums_attempts: tuple[RowSumsAttempt, ...]
    seconds: Mapping[str, float]
    bytes_sent: Mapping[str, int]
    label_dp: Mapping[str, LabelDpPlan] = field(default_factory=dict)  # each party's own noise, with label-DP

    @property
    def total_seconds(self) -> float:
        return float(sum(self.seconds.values()))


@dataclass
class _Wire:
    """Serialises each message as it would travel and counts its bytes per step."""

    bytes_sent: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @overload
    def send(self, step: str, payload: bytes) -> bytes: ...
    @overload
    def send(self, step: str, payload: np.ndarray) -> np.ndarray: ...

    def send(self, step: str, payload: Payload) -> Payload:
        """The payload as the receiver reads it off the wire (an array of the same dtype, or bytes)."""
        dtype, shape, raw = payload_bytes(payload)
        self.bytes_sent[step] = self.bytes_sent.get(step, 0) + len(raw)
        if dtype == "":
            return raw
        return np.frombuffer(bytearray(raw), dtype=np.dtype(dtype)).reshape(shape)

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[step] = self.seconds.get(step, 0.0) + time.perf_counter() - start


def run_xclp_inprocess(
    parties: Mapping[str, tuple[object, object]],
    n_classes: int,
    *,
    seed: bytes,
    L: int = 1024,
    key_bits: int = 2048,
    params: GraphParams = GraphParams(),
    hide_label_mask: bool = False,
    normalise_labels: bool = False,
    drop: Mapping[str, str] | None = None,
    executor: Executor | None = None,
    insecure_test_keys: bool = False,
    fixed_point: FixedPoint = FixedPoint(),
    label_dp_epsilon: float | None = None,
    label_dp_mechanism: str = "response",
    label_dp_delta: float | None = None,
    influence_tolerance: float = 0.0,
) -> InProcessResult:
    """Run one XCLP job; parties = {id: (X float[n_j, d], y int[n_j] with -1 = unlabeled)}.

    drop = {id: stage} makes that party miss its deadline in the stage named by an
    `server.steps.xclp.XclpStage` value ("setup", "secure_hamming", "graph", "secure_rowsums");
    the job then goes on as docs/design.md §5 (end) says. `insecure_test_keys` allows Paillier keys below
    2048 bits (tests only). Rows of H are in sorted-id order. `label_dp_epsilon`, `_mechanism`,
    `_delta`: each party releases its row sums with label-DP, as the job parameters of those names
    (xclp.privacy.label_dp). `influence_tolerance`: the influence columns pushed (xclp.sparse_influence).
    """
    data = {pid: party.check_party_data(X, y, n_classes) for pid, (X, y) in _check_parties(parties).items()}
    drops = _check_drop(drop, data)
    wire = _Wire()
    membership = coord.start_membership(list(data))
    for pid, stage in drops.items():
        if stage is coord.XclpStage.SETUP:  # never joined
            membership = coord.drop_party(membership, pid, stage)
    sizes = {pid: data[pid][0].shape[0] for pid in membership.graph}

    with wire.timed("setup"):  # docs/design.md §4.1-4.2: key bundles travel; secrets are pairwise
        session_id = secrets.token_bytes(16)
        x_keys = {pid: generate_x25519() for pid in membership.graph}
        x_public = {pid: wire.send("setup", public_bytes(sk)) for pid, sk in x_keys.items()}
        maskers = {
            pid: PairwiseMasker(
                pid, {q: shared_secret(sk, x_public[q]) for q in membership.graph if q != pid}, session_id
            )
            for pid, sk in x_keys.items()
        }
        pairs = coord.secure_hamming_pairs(membership.graph)
        paillier = {
            pid: PaillierKeypair.generate(key_bits, allow_insecure_test_size=insecure_test_keys)
            for pid in {t.a for t in pairs}
        }
        allow_small = insecure_test_keys and key_bits < MIN_SECURE_BITS
        paillier_public = {
            pid: PaillierPublicKey.from_bytes(
                wire.send("setup", kp.public.to_bytes()), allow_insecure_test_size=allow_small
            )
            for pid, kp in paillier.items()
        }

    with wire.timed("lsh"):  # docs/design.md §5.1-5.2
        codes = {pid: party.lsh_step(data[pid][0], seed, L) for pid in membership.graph}
        own = {pid: coord.check_own_neighbours(wire.send("intra_hamming", party.own_nearest(codes[pid], L, params)),
                                               sizes[pid], params.k, L)
               for pid in membership.graph}

    with wire.timed("secure_hamming"):  # docs/design.md §5.3, one pair at a time
        gone = {pid for pid, stage in drops.items() if stage is coord.XclpStage.SECURE_HAMMING}
        cross: list[tuple[str, str, np.ndarray]] = []
        encrypted: dict[str, bytes] = {}  # A encrypts its slices once and sends them to each of its B's
        for task in pairs:
            if {task.a, task.b} & gone:
                continue  # the pair never completes; the other pairs are unaffected
            n_a, n_b = sizes[task.a], sizes[task.b]
            if task.a not in encrypted:
                encrypted[task.a] = party.hamming_encrypt(paillier[task.a], codes[task.a], L, executor)
            slices = wire.send("secure_hamming", encrypted[task.a])
            evaluated, masks = party.hamming_evaluate(paillier_public[task.a], slices, codes[task.b], L, n_a, executor)
            evaluated = wire.send("secure_hamming", evaluated)
            r = wire.send("secure_hamming", masks)
            t = wire.send("secure_hamming", party.hamming_decrypt(paillier[task.a], evaluated, L, n_a, n_b, executor))
            # The coordinator knows A's N from A's key bundle (docs/design.md §4.1); it unmasks mod N.
            cross.append((task.a, task.b, coord.cross_block(t, r, int(paillier_public[task.a].n), n_a, n_b, L)))
        for pid in sorted(gone):
            membership = coord.drop_party(membership, pid, coord.XclpStage.SECURE_HAMMING)
        layout = coord.RowLayout(membership.graph, tuple(sizes[p] for p in membership.graph))
        graph = coord.NeighbourGraph(layout, own, L, params)
        for a, b, block in cross:
            graph.fold_pair(a, b, block)
        W = graph.adjacency()

    with wire.timed("graph"):  # docs/design.md §5.4-5.5
        for pid, stage in drops.items():
            if stage is coord.XclpStage.GRAPH:
                membership = coord.drop_party(membership, pid, stage)
        labeled = None
        if not hide_label_mask:
            labeled = {
                pid: wire.send("labeled_sets", party.labeled_rows(data[pid][1], n_classes)) for pid in membership.labels
            }
        blocks = coord.influence_blocks(W, layout, membership.labels, params, labeled=labeled,
                                        tolerance=influence_tolerance)
        received = {pid: wire.send("influence", block) for pid, block in blocks.items()}

    with wire.timed("rowsums"):  # docs/design.md §5.6, restarted without a party that misses it
        Zbar: dict[str, np.ndarray | party.NoisyRowSums] = {}
        graph_rows = party.graph_rows_of(sizes, membership.graph)
        plans = {}
        for pid, block in received.items():
            y = data[pid][1]
            Zbar[pid] = scores = party.local_scores(party.select_influence(block, y, n_classes,
                                                                           hide_label_mask=hide_label_mask),
                                                    y, n_classes, normalise_labels=normalise_labels)
            if label_dp_epsilon is None:
                continue
            if label_dp_mechanism == "response":  # the labels randomised once, before any use
                noisy_y = label_dp.randomised_response(y, n_classes, label_dp_epsilon, hide_unlabeled=hide_label_mask)
                released = party.local_scores(party.select_influence(block, noisy_y, n_classes,
                                                                     hide_label_mask=hide_label_mask),
                                              noisy_y, n_classes, normalise_labels=normalise_labels)
                Zbar[pid] = party.released_scores(scores, released, graph_rows, pid)
            else:  # calibrated to the block as received (all of it)
                if label_dp_delta is None:
                    raise InvalidInput('label_dp_mechanism = "skellam" needs label_dp_delta')
                plans[pid] = label_dp.plan(label_dp_epsilon, label_dp_delta,
                                           *label_dp.largest_columns(block, layout.rows(pid)),
                                           layout.n - sizes[pid], fixed_point.frac_bits)
                Zbar[pid] = party.label_dp_release(scores, graph_rows, pid, plans[pid], fixed_point)
        self_masks = {pid: SelfMasks("rowsums", session_id) for pid in membership.graph}
        attempts: list[RowSumsAttempt] = []
        while True:
            participants = coord.rowsums_participants(membership)
            rnd = membership.rowsums_attempt
            masked = {
                pid: party.mask_row_sums(
                    Zbar[pid], graph_rows, maskers[pid], participants=participants, attempt=rnd, fixed_point=fixed_point
                )
                for pid in participants
            }
            pushed = {  # double masking (docs/design.md §6.1): each payload also carries its sender's self mask
                pid: wire.send("rowsums", self_masks[pid].add(m.payload, rnd, participants))
                for pid, m in masked.items()
                if drops.get(pid) is not coord.XclpStage.ROW_SUMS
            }
            frame = coord.rowsums_frame(layout, participants)
            missing = set(participants) - set(pushed)
            if missing:  # the coordinator holds fewer than all: nobody reveals; restart without them
                attempts.append(RowSumsAttempt(rnd, participants, pushed, completed=False))
                for pid in sorted(missing):
                    membership = coord.drop_party(membership, pid, coord.XclpStage.ROW_SUMS)
                continue
            reveals = {pid: wire.send("rowsums_reveal", self_masks[pid].reveal(rnd, participants)) for pid in pushed}
            opened = {pid: arr - self_mask(unpack_reveal(reveals[pid])[1], arr.shape, arr.dtype)
                      for pid, arr in pushed.items()}
            sums = coord.sum_row_sums(frame, opened, n_classes)
            attempts.append(RowSumsAttempt(rnd, participants, pushed, completed=True))
            rows = {pid: party.returned_rows(data[pid][1], n_classes, hide_label_mask=hide_label_mask)
                    for pid in sums}  # the coordinator's choice (docs/design.md §5.5): the unlabeled rows
            returned = {pid: wire.send("rowsums", np.ascontiguousarray(block[rows[pid]]))
                        for pid, block in sums.items()}
            break

    with wire.timed("output"):  # docs/design.md §5.7
        outputs = {}
        for pid, block in returned.items():
            Z = party.party_scores(data[pid][1], n_classes, rows[pid],
                                   party.unmask_row_sums(block, masked[pid].kept[rows[pid]], fixed_point))
            labels, confidence = party.predict(Z)
            outputs[pid] = PartyOutput(labels=labels, confidence=confidence, scores=Z)

    return InProcessResult(
        outputs=outputs,
        W=W,
        layout=layout,
        membership=membership,
        rowsums_attempts=tuple(attempts),
        seconds=dict(wire.seconds),
        bytes_sent=dict(wire.bytes_sent),
        label_dp=plans,
    )


def _check_parties(parties: Mapping[str, tuple[object, object]]) -> dict[str, tuple[object, object]]:
    if not isinstance(parties, Mapping) or not parties:
        raise InvalidInput("parties must be a non-empty mapping {party id: (features, labels)}")
    for pid, value in parties.items():
        if not isinstance(pid, str) or not pid:
            raise InvalidInput(f"party ids must be non-empty strings, got {pid!r}")
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise InvalidInput(f"party {pid!r} must map to a (features, labels) pair")
    return {pid: parties[pid] for pid in sorted(parties)}


def _check_drop(drop: Mapping[str, str] | None, parties: Mapping[str, object]) -> dict[str, coord.XclpStage]:
    out: dict[str, coord.XclpStage] = {}
    for pid, stage in (drop or {}).items():
        if pid not in parties:
            raise InvalidInput(f"drop names unknown party {pid!r}; parties are {', '.join(sorted(parties))}")
        try:
            out[pid] = coord.XclpStage(stage)
        except ValueError:
            allowed = ", ".join(s.value for s in coord.XclpStage)
            raise InvalidInput(f"drop stage {stage!r} for {pid!r} is not one of: {allowed}") from None
    return out
