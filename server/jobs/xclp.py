"""The XCLP job on the coordinator (DESIGN §5, paper 003 Alg. 1): routing, validation, dropouts.

The math lives in `server.steps.xclp`; this class only moves, checks and routes payloads and
keeps the stage machine. Steps after SETUP, in order (payload dtype/shape per party j, n_j rows):

    coordinator -> all   "layout"          uint64[P]  rows per roster party (0 = not in the job)
    coordinator -> all   "pairs"           uint64[m, 2] roster positions (A, B) of every pair (§5.3)
    intra_hamming        j -> coordinator  uint16[n_j, n_j] own Hamming block          (§5.2)
    secure_hamming       A -> B (relayed)  bytes: encrypted bit slices of A's codes     (§5.3)
                         B -> A (relayed)  bytes: evaluated ciphertexts
                         j -> coordinator  uint8[Σ ⌈n_A/K⌉·n_B over j's pairs, |N|/8]: t of the
                                           pairs where j is A, masks R of the pairs where j is B,
                                           in pair order; one big-endian value mod N per ciphertext
    labeled_sets         j -> coordinator  int64[l_j] (skipped with hide_label_mask)    (§5.5)
    coordinator -> j     "graph"           uint64[P]  rows per roster party in H (0 = left)
    coordinator -> j     "influence"       float64[n, l_j] (float64[n, n_j] if hidden)  (§5.5)
    rowsums              j -> coordinator  uint64[n_frame − n_j, C] double-masked row sums (§5.6, §6.1)
    rowsums_reveal       j -> coordinator  bytes: round digest ‖ j's self-mask seed     (§6.1)
    coordinator -> j     "rowsums_result"  uint64[u_j, C] for j's u_j unlabeled rows (uint64[n_j, C] if hidden)

Dropouts (DESIGN §5, end), as transitions of `server.steps.xclp.Membership`: a party lost in
intra_hamming is as if it never joined; in secure_hamming its rows and columns leave H and the
step restarts among the others in the next round (roles stay as first drawn; parties re-send
what they already computed, so finished pairs cost no new Paillier work); in labeled_sets it
shaped the graph but brings and gets no labels; in rowsums the step restarts without it in the
next round, so every mask is fresh (the parties' maskers refuse a repeated round).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xclp.crypto.identity import KeyBundle, SignedBundle
from xclp.crypto.secure_hamming import SlotLayout
from xclp.server.config import JobConfig
from xclp.runtime import write_json_atomic
from xclp.server.jobs.base import Job, Observer
from xclp.server.jobs.state import Step, check_reveal, ring_array
from xclp.server.jobs.summary import StepLedger, log_line
from xclp.server.steps import xclp as steps
from xclp.errors import InvalidInput, PeerDropped, XclpError
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.jobs import XclpJobParams
from xclp.v1.bundles import check_paillier_size
from xclp.v1.double_masking import reveal_step, self_mask, unpack_reveal
from xclp.v1.steps import (GRAPH_MSG, HAMMING_STEP, INFLUENCE_MSG, INTRA_STEP, LABELS_STEP, LAYOUT_MSG, PAIRS_MSG,
                           ROWSUMS_RESULT_MSG, ROWSUMS_STEP, SEED_STEP)
from xclp.v1.xclp_layout import PairTask, parts_of

ROWSUMS_REVEAL = reveal_step(ROWSUMS_STEP)

log = logging.getLogger("xclp.server")



@dataclass
class _Hamming:
    """What secure_hamming has produced so far in the current round."""

    parts: dict[tuple[str, str, str], np.ndarray] = field(default_factory=dict)  # (a, b, "t"|"r") -> uint8[m, |N|/8]


class XclpJob(Job):
    """One XCLP run: H from intra blocks and SecureHamming, influence, SecureRowSums."""

    relay_steps = frozenset({SEED_STEP, HAMMING_STEP})

    def __init__(self, config: JobConfig, allow_list: Mapping[str, bytes], *,
                 clock: Callable[[], float] = time.monotonic, observer: Observer | None = None) -> None:
        super().__init__(config, allow_list, clock=clock, observer=observer)
        if not isinstance(config.params, XclpJobParams):
            raise InvalidInput(f"job {config.job_id!r} is not an xclp job")
        self.params: XclpJobParams = config.params
        self.roster: tuple[str, ...] = ()
        self.sizes: dict[str, int] = {}
        self.moduli: dict[str, int] = {}  # each roster party's Paillier N, from its signed bundle
        self.membership: steps.Membership | None = None
        self.pairs: tuple[PairTask, ...] = ()  # roles drawn once, at the first secure_hamming round
        self.intra: dict[str, np.ndarray] = {}
        self.round_state = _Hamming()
        self.cross: dict[tuple[str, str], np.ndarray] = {}
        self.hamming: steps.HammingMatrix | None = None
        self.labeled: dict[str, np.ndarray] = {}
        self.ledger = StepLedger()
        self.summary_written = False
        self.rowsums: Step | None = None  # the complete SecureRowSums round whose self masks are revealed

    # --- admission: XCLP parties publish a Paillier key in their signed bundle (DESIGN §4.1) ---

    def join(self, signed: SignedBundle, summary: pb.DataSummary) -> KeyBundle:
        bundle = super().join(signed, summary)
        self._after_transition()
        return bundle

    def check_claimed_bundle(self, claimed: KeyBundle) -> None:
        self._check_paillier(claimed)

    def payload_limit(self, sender: str, step: str, recipient: str) -> int:
        """Generous upper bounds from the row counts and the slot layout (DESIGN §5 payloads)."""
        if not self.sizes:
            return super().payload_limit(sender, step, recipient)
        graph = self.membership.graph if self.membership is not None else self.roster
        n, n_j = sum(self.sizes[p] for p in graph), self.sizes.get(sender, 0)
        layout = self._hamming_layout()
        ct = 2 * layout.value_bytes
        if step == INTRA_STEP:
            return 4 * n_j * n_j
        if step == HAMMING_STEP and recipient:
            peer = self.sizes.get(recipient, 0)  # slices: batches(n_A)·L, evaluations: batches(n_A)·n_B
            return 64 + ct * max(layout.batches(n_j) * layout.L, layout.batches(peer) * n_j,
                                 layout.batches(n_j) * peer)
        if step == HAMMING_STEP:
            return layout.value_bytes * sum(layout.values(self.sizes[t.a], self.sizes[t.b])
                                            for t in self.pairs if sender in (t.a, t.b))
        if step == LABELS_STEP:
            return 8 * n_j
        if step == ROWSUMS_STEP:
            return 8 * n * self.params.n_classes
        return super().payload_limit(sender, step, recipient)

    def _check_paillier(self, bundle: KeyBundle) -> None:
        try:
            check_paillier_size(bundle, self.params.key_bits, allow_insecure=self.params.insecure_test_keys)
        except InvalidInput as exc:
            raise InvalidInput(f"job {self.config.job_id!r} is an xclp job: {exc}") from None

    # --- transitions: the base's, plus the run summary once the job has ended ---------------

    def message(self, sender: str, msg: wire.Message) -> None:
        with self.lock:
            step = self.step
            route = (msg.recipient and step is not None and step.name == HAMMING_STEP == msg.step
                     and msg.round == step.round and sender in step.participants)
            if route:
                self._check_route(sender, msg)
            super().message(sender, msg)  # the base relays it once per (sender, recipient) and round
        self._after_transition()

    def disconnected(self, party_id: str) -> None:
        super().disconnected(party_id)
        self._after_transition()

    def tick(self, now: float) -> None:
        super().tick(now)
        self._after_transition()

    # --- the job's steps ----------------------------------------------------------------------

    def check_start(self) -> None:
        """Refuse, before any Paillier work, a job the joined parties' rows cannot run (issue: k >= n
        was found only after SecureHamming)."""
        rows = sum(int(p.summary.rows) for p in self.parties.values())
        if self.params.k > rows - 1:
            raise InvalidInput(f"k = {self.params.k} neighbours need at least {self.params.k + 1} rows in all, but the "
                               f"{len(self.parties)} parties bring {rows}: lower k in the job file")
        if not self.params.hide_label_mask and not any(p.summary.labeled_rows for p in self.parties.values()):
            raise InvalidInput("no party brought a labeled row, so there is nothing to propagate: label some rows")

    def begin(self) -> None:
        # Layouts and pairs index the roster every party holds (all who joined, sorted), with 0 rows
        # for a party no longer active, e.g. one lost in the seed step.
        self.roster = tuple(sorted(self.parties))
        self.sizes = {p: int(self.parties[p].summary.rows) for p in self.roster}
        self.moduli = {p: int.from_bytes(self.parties[p].bundle.paillier_n, "big") for p in self.roster}
        self.membership = steps.start_membership(tuple(self.active))
        self._send_layout(LAYOUT_MSG, self.membership.graph)
        self.start_step(INTRA_STEP)

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        L = self.params.lsh_bits
        if step.name == INTRA_STEP:
            n = self.sizes[sender]
            if not isinstance(payload, np.ndarray) or payload.dtype not in (np.uint16, np.uint32):
                raise InvalidInput(f"the intra-party Hamming block of {sender!r} must be a uint16 or uint32 array")
            self.intra[sender] = steps.check_intra_block(payload, n, L)
        elif step.name == HAMMING_STEP:
            layout = self._hamming_layout()
            parts = [(t, layout.values(self.sizes[t.a], self.sizes[t.b]))
                     for t in parts_of(self.pairs, sender, step.participants)]
            rows = ring_array(payload, np.dtype(np.uint8), (sum(size for _, size in parts), layout.value_bytes),
                              f"the secure_hamming values of {sender!r}")
            start = 0
            for task, size in parts:
                kind = "t" if sender == task.a else "r"
                self.round_state.parts[(task.a, task.b, kind)] = rows[start : start + size]
                start += size
        elif step.name == LABELS_STEP:
            count = int(self.parties[sender].summary.labeled_rows)
            idx = ring_array(payload, np.dtype(np.int64), (count,), f"the labeled rows of {sender!r}")
            if count and (idx[0] < 0 or idx[-1] >= self.sizes[sender] or np.any(np.diff(idx) <= 0)):
                raise InvalidInput(f"the labeled rows of {sender!r} must be ascending and in 0..{self.sizes[sender] - 1}")
            self.labeled[sender] = idx
        elif step.name == ROWSUMS_STEP:
            frame = self._frame(step)
            own = frame.rows(sender)
            shape = (frame.n - (own.stop - own.start), self.params.n_classes)
            ring_array(payload, np.dtype(np.uint64), shape, f"the masked row sums of {sender!r}")
        elif step.name == ROWSUMS_REVEAL:
            check_reveal(payload, self.session_id, ROWSUMS_STEP, step, sender)
        else:
            raise InvalidInput(f"step {step.name!r} takes no contributions")

    def on_step_complete(self, step: Step) -> None:
        self._record(step)
        try:
            if step.name == INTRA_STEP:
                self._start_hamming()
            elif step.name == HAMMING_STEP:
                self._assemble(step)
            elif step.name == LABELS_STEP:
                self._distribute(self.labeled)
            elif step.name == ROWSUMS_STEP:
                # DESIGN §6.1: every participant's rows are here; ask each for its self-mask seed
                self.rowsums = step
                self.start_step(ROWSUMS_REVEAL, list(step.participants), round=step.round)
            elif step.name == ROWSUMS_REVEAL:
                self._return_row_sums(step)
        except XclpError as exc:
            # Out-of-range distances, no labeled rows left, ...: nothing a restart would fix.
            self._fail(f"step {step.name!r} failed: {exc}")

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        assert self.membership is not None
        stage = {INTRA_STEP: steps.XclpStage.SETUP, HAMMING_STEP: steps.XclpStage.SECURE_HAMMING,
                 LABELS_STEP: steps.XclpStage.GRAPH, ROWSUMS_STEP: steps.XclpStage.ROW_SUMS}[step.name]
        try:
            for pid in sorted(dropped):
                self.membership = steps.drop_party(self.membership, pid, stage)
        except PeerDropped as exc:
            self._fail(str(exc))
            return
        log.info("job %s: %s dropped in %s; graph: %s; labels: %s", self.config.job_id, ", ".join(sorted(dropped)),
                 stage.value, ", ".join(self.membership.graph), ", ".join(self.membership.labels))
        if step.name in (INTRA_STEP, LABELS_STEP):
            # The others' contributions stay valid: wait for the rest only.
            step.pending -= dropped
            for pid in dropped:
                step.received.pop(pid, None)
                self.intra.pop(pid, None)
                self.labeled.pop(pid, None)
            if not step.pending:
                self.on_step_complete(step)
        elif step.name == HAMMING_STEP:
            self._record(step)
            self._start_hamming()  # next round, among the rest; parties re-send what they have
        else:
            self._record(step)
            self.start_step(ROWSUMS_STEP, list(self.membership.labels), round=self.membership.rowsums_round)

    def blame(self, step: Step) -> set[str]:
        """secure_hamming: only those who owe the next message, not those waiting for them."""
        if step.name != HAMMING_STEP:
            return super().blame(step)
        owes: dict[str, bool] = {p: False for p in step.participants}
        waits: dict[str, bool] = {p: False for p in step.participants}
        for task in self._round_pairs(step):
            if (task.a, task.b) not in step.relays:
                owes[task.a], waits[task.b] = True, True
            elif (task.b, task.a) not in step.relays:
                owes[task.b], waits[task.a] = True, True
        culprits = {p for p in step.pending if owes[p] or not waits[p]}
        return culprits or set(step.pending)

    # --- internals ----------------------------------------------------------------------------

    def _send_layout(self, name: str, parties: tuple[str, ...]) -> None:
        """uint64[P] rows per roster party, 0 for those not in `parties`, to each of `parties`."""
        rows = np.array([self.sizes[p] if p in parties else 0 for p in self.roster], dtype=np.uint64)
        for pid in parties:
            if pid in self.active:
                self._count_out(name, self.send(pid, name, 0, rows))

    def _start_hamming(self) -> None:
        assert self.membership is not None
        if not self.pairs:
            self.pairs = steps.secure_hamming_pairs(self.membership.graph)
            position = {p: i for i, p in enumerate(self.roster)}
            table = np.array([[position[t.a], position[t.b]] for t in self.pairs], dtype=np.uint64).reshape(-1, 2)
            for pid in self.membership.graph:
                self._count_out(PAIRS_MSG, self.send(pid, PAIRS_MSG, 0, table))
        self.round_state = _Hamming()
        self.start_step(HAMMING_STEP, list(self.membership.graph))

    def _hamming_layout(self) -> SlotLayout:
        """The slot layout of every pair: A's key has the job's key_bits (checked at join)."""
        return SlotLayout(self.params.key_bits, self.params.lsh_bits)

    def _round_pairs(self, step: Step) -> tuple[PairTask, ...]:
        members = set(step.participants)
        return tuple(t for t in self.pairs if t.a in members and t.b in members)

    def _check_route(self, sender: str, msg: wire.Message) -> None:
        """Slices go from A to B, evaluations from B to A (DESIGN §5.3); once per round: the base."""
        pair = {(t.a, t.b) for t in self.pairs} | {(t.b, t.a) for t in self.pairs}
        if (sender, msg.recipient) not in pair:
            raise InvalidInput(f"{sender!r} and {msg.recipient!r} are not a SecureHamming pair")
        if not isinstance(msg.payload, bytes):
            raise InvalidInput("SecureHamming ciphertexts travel as opaque bytes")

    def _assemble(self, step: Step) -> None:
        assert self.membership is not None
        L = self.params.lsh_bits
        for task in self._round_pairs(step):
            t = self.round_state.parts[(task.a, task.b, "t")]
            r = self.round_state.parts[(task.a, task.b, "r")]
            self.cross[(task.a, task.b)] = steps.cross_block(t, r, self.moduli[task.a], self.sizes[task.a],
                                                             self.sizes[task.b], L)
        layout = steps.RowLayout(self.membership.graph, tuple(self.sizes[p] for p in self.membership.graph))
        self.hamming = steps.assemble_hamming(layout, self.intra, self.cross, L)
        log.info("job %s: H assembled for %d rows of %d parties", self.config.job_id, layout.n, len(layout.parties))
        self._dump("H.npy", self.hamming.H)
        if self.params.hide_label_mask:
            self._distribute(None)
        else:
            self.labeled = {}
            self.start_step(LABELS_STEP, list(self.membership.labels))

    def _distribute(self, labeled: Mapping[str, np.ndarray] | None) -> None:
        """Graph, influence and each receiver's S_L block (DESIGN §5.4-5.5); then SecureRowSums."""
        assert self.membership is not None and self.hamming is not None
        p = self.params
        started = self.clock()
        receivers = self.membership.labels
        blocks = steps.influence_blocks(self.hamming, p.lsh_bits, receivers, p.graph_params,
                                        labeled=labeled, method=p.solver)  # type: ignore[arg-type]
        self.ledger.record("graph", self.clock() - started)
        self._send_layout(GRAPH_MSG, self.membership.graph)
        for pid in receivers:
            self._count_out(INFLUENCE_MSG, self.send(pid, INFLUENCE_MSG, 0, np.ascontiguousarray(blocks[pid])))
        self.start_step(ROWSUMS_STEP, list(receivers), round=self.membership.rowsums_round)

    def _frame(self, step: Step) -> steps.RowLayout:
        assert self.hamming is not None
        return steps.rowsums_frame(self.hamming.layout, step.participants)

    def _return_row_sums(self, reveal: Step) -> None:
        step = self.rowsums
        assert step is not None and step.round == reveal.round
        received = {p: np.asarray(step.received[p]) for p in step.participants}
        for pid, arr in received.items():
            self._dump(f"rowsums-{pid}-round{step.round}.npy", arr)
        # each contribution minus its sender's self mask (DESIGN §6.1); the pairwise masks cancel in the sum
        opened = {p: arr - self_mask(unpack_reveal(reveal.received[p])[1], arr.shape, arr.dtype)
                  for p, arr in received.items()}
        sums = steps.sum_row_sums(self._frame(step), opened, self.params.n_classes)
        for pid, block in sums.items():
            # DESIGN §5.5: Z only for the receiver's unlabeled rows (all rows if the mask is hidden)
            rows = (slice(None) if self.params.hide_label_mask
                    else steps.unlabeled_rows(self.sizes[pid], self.labeled[pid]))
            self._count_out(ROWSUMS_RESULT_MSG, self.send(pid, ROWSUMS_RESULT_MSG, step.round,
                                                          np.ascontiguousarray(block[rows])))
        self.finish(f"labels propagated for {len(step.participants)} parties over {self._frame(step).n} rows")

    def _record(self, step: Step) -> None:
        self.ledger.record(step.name, self.clock() - step.started, bytes_in=step.bytes_in,
                           bytes_relayed=step.bytes_relayed)
        log.info("job %s: %s round %d: %.3fs, %d bytes in, %d relayed", self.config.job_id, step.name, step.round,
                 self.clock() - step.started, step.bytes_in, step.bytes_relayed)

    def _count_out(self, name: str, size: int) -> None:
        self.ledger.sent(name, size)

    def _dump(self, name: str, arr: np.ndarray) -> None:
        """Test hook (JobConfig refuses it unless XCLP_TESTING=1): what the coordinator saw."""
        directory = self.config.debug_dump_dir
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            np.save(directory / name, arr)

    # --- run summary (DESIGN §8: per-step durations and bytes; nothing sensitive) ------------

    def summary(self) -> dict[str, Any]:
        m = self.membership
        return {
            "job_id": self.config.job_id, "job_type": self.config.job_type, "outcome": self.stage.value,
            "reason": self.outcome_reason, "total_seconds": round(self.clock() - self.started_at, 6),
            "steps": self.ledger.as_dict(), "bytes_total": self.ledger.bytes_total,
            "rows": {p: self.sizes.get(p, 0) for p in self.roster},
            "graph_parties": list(m.graph) if m else [], "label_parties": list(m.labels) if m else [],
            "dropped": {p: self.drop_reasons.get(p, "never joined") for p in sorted(self.dropped)},
            "params": {"lsh_bits": self.params.lsh_bits, "k": self.params.k, "key_bits": self.params.key_bits,
                       "hide_label_mask": self.params.hide_label_mask, "label_norm": self.params.label_norm},
        }

    def _after_transition(self) -> None:
        with self.lock:
            if self.summary_written or not self.stage.ended:
                return
            self.summary_written = True
            summary = self.summary()
        log.info("job %s: %s", self.config.job_id, log_line(summary))
        if self.config.summary_path is not None:
            write_json_atomic(self.config.summary_path, summary, mode=0o644)

