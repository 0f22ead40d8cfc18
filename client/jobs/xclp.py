"""A party's side of the XCLP job (DESIGN §5): reacts to the coordinator's steps and peer messages.

The math is in `client.steps.xclp`; this class keeps what the party holds between messages and
moves payloads (dtypes and shapes as in server/jobs/xclp.py). Heavy Paillier work runs on the
context's executor (client/workers.py). SecureRowSums is the party's masked-sum phase
(client/phases/masked_sum.py), which keeps the party's own masked rows back.

SecureHamming streams (DESIGN §10.1, xclp.v1.secure_hamming_wire): as B this party evaluates A's
slices one piece of A's batches at a time, a bounded window ahead of A's acknowledgements, and
sends the coordinator only a mask seed per pair; as A it decrypts each piece as it arrives and sends
its t on. Neither side keeps a pair's ciphertexts, t or masks beyond the pieces in flight.
A restart (a peer dropped) starts every pair of the rest again with fresh seeds (roles stay as drawn
in the first attempt; A's encrypted slices are kept and sent again): the coordinator keeps no
per-pair state, so the pairs' Paillier work is done again.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Sized
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from xclp import label_dp
from xclp.candidates import PairSchedule, a_slots
from xclp.client.context import PartyContext
from xclp.client.jobs.base import PartyJob
from xclp.client.jobs.estimate import (
    OperationCosts,
    check_memory,
    check_time,
    paillier_seconds,
    party_bytes,
)
from xclp.client.ledger import Release, function_id, responses_name
from xclp.client.phases.centres import CandidateCentres
from xclp.client.phases.masked_sum import MaskedSumParty, Noisy
from xclp.client.steps import xclp as steps
from xclp.client.workers import worker_count
from xclp.crypto.fixedpoint import FixedPoint
from xclp.crypto.paillier import PaillierKeypair, PaillierPublicKey
from xclp.crypto.secure_hamming import EncryptedSlices, SlotLayout, draw_mask_seed
from xclp.errors import InvalidInput, ProtocolError, XclpError
from xclp.party_table import PartyData
from xclp.progress import Meter
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.bundles import paillier_key
from xclp.v1.params import JobParams
from xclp.v1.relay import Relay as Sealed
from xclp.v1.secure_hamming_wire import (
    MAX_IN_FLIGHT,
    HammingUpload,
    Piece,
    Relay,
    Upload,
    all_pairs,
    frame_relay,
    open_relay,
    pieces,
    relay_bytes,
)
from xclp.v1.xclp import (
    GRAPH_MSG,
    HAMMING_STEP,
    INFLUENCE_MSG,
    INTRA_STEP,
    LABELS_STEP,
    LAYOUT_MSG,
    PAIRS_MSG,
    ROWSUMS_PURPOSE,
    ROWSUMS_RESULT_MSG,
    ROWSUMS_STEP,
    XclpJobParams,
    influence_piece_columns,
)
from xclp.v1.xclp_layout import PairTask, RowLayout, parts_of

T = TypeVar("T")


@dataclass
class _AsA:
    """A pair where this party is A: B's pieces arrive in order; `received` of them decrypted and sent on."""

    task: PairTask
    pieces: tuple[Piece, ...]
    index: int  # the pair's position in the pairs message
    meter: Meter  # its pieces decrypted
    received: int = 0


@dataclass
class _AsB:
    """A pair where this party is B: A's slices, then pieces evaluated (`sent`) ahead of A's acknowledgements."""

    task: PairTask
    pieces: tuple[Piece, ...]
    index: int
    seed: bytes  # the pair's mask seed, sent to the coordinator only
    meter: Meter  # its pieces evaluated
    slices: EncryptedSlices | None = None
    a_key: PaillierPublicKey | None = None  # A's key, checked once with its slices
    schedule: PairSchedule | None = None  # on candidate pairs (DESIGN §10.3): what it evaluates
    sent: int = 0
    acked: int = 0


class XclpParty(PartyJob):
    """The party's XCLP state machine; `on_step` / `on_message` are its transitions."""

    @staticmethod
    def before_join(params: JobParams, data: PartyData, max_memory_bytes: int) -> None:
        """Refuse, before joining, a job this party's own part of cannot fit in its memory (the
        whole layout is checked again once it is known)."""
        if not isinstance(params, XclpJobParams):
            return
        n = data.X.shape[0]
        need = party_bytes(n, {}, SlotLayout(params.key_bits, params.lsh_bits), workers=1,
                           n_classes=params.n_classes)
        check_memory(need, max_memory_bytes, n, {})

    def __init__(self, ctx: PartyContext) -> None:
        super().__init__(ctx)
        self.params = ctx.params_as(XclpJobParams)
        if ctx.keypair is None:
            raise InvalidInput(f"an xclp job needs this party's Paillier key (--paillier-bits {self.params.key_bits})")
        self.keypair: PaillierKeypair = ctx.keypair
        self.roster, self.party_id, self.progress = ctx.roster, ctx.party_id, ctx.progress
        self.X, self.y = steps.check_party_data(ctx.data.X, self._labels(), self.params.n_classes)
        self.sizes: dict[str, int] = {}  # rows per party from "layout"
        self.graph: tuple[tuple[str, int], ...] = ()  # (party, rows) in H's order, from "graph"
        self.codes: np.ndarray | None = None
        self.pairs: tuple[PairTask, ...] = ()
        self.hamming_attempt: int | None = None
        self.hamming_members: tuple[str, ...] = ()
        self.slices: bytes | None = None  # this party's encrypted bit slices, sent to each B of every attempt
        self.as_a: dict[str, _AsA] = {}  # this attempt's pairs where it is A, by B
        self.as_b: dict[str, _AsB] = {}  # ... and where it is B, by A
        self.slices_due: list[str] = []  # Bs of this attempt still to get the slices, one after another
        self.hamming_pushed = False  # every pair of the attempt done here
        self.meter: Meter | None = None  # every piece of the attempt's pairs, evaluated or decrypted here
        # Z̄ once every influence column is in; with label-DP its noisy release, drawn once
        self.zbar: np.ndarray | steps.NoisyRowSums | None = None
        self.influence: steps.InfluenceScores | None = None
        # label-DP by randomised response (xclp.label_dp): the labels as released, drawn once per data
        # set and ε and kept sealed in the ledger, so that every later run releases the same ones
        p = self.params
        self.released_y: np.ndarray | None = None
        if p.label_dp_epsilon is not None and p.label_dp_mechanism == "response":
            epsilon = p.label_dp_epsilon

            def draw() -> np.ndarray:
                return label_dp.randomised_response(self.y, p.n_classes, epsilon, hide_unlabeled=p.hide_label_mask)

            account = ctx.account
            self.released_y = draw() if account is None else account.responses(
                responses_name(epsilon, p.n_classes, p.hide_label_mask), draw)
        self.released: steps.InfluenceScores | None = None  # Z̄ of the released labels
        self.influence_digest = hashlib.sha256(b"xclp/influence")  # of the pieces received, in order
        self.label_privacy: dict[str, Any] | None = None
        self.influence_meter: Meter | None = None
        self.started = time.monotonic()
        # SecureRowSums: its parties bind the unscoped step name in the reveal digest (in a
        # training round too; the round's session id binds the round)
        self.row_sums = MaskedSumParty(ctx, ROWSUMS_STEP, self._encoded_row_sums, purpose=ROWSUMS_PURPOSE,
                                       withhold=self._own_rows, digest_name=ROWSUMS_STEP,
                                       releases=Noisy.DP if self.params.label_dp else self._row_sum_releases)
        # DESIGN §10.3: SecureHamming on candidate pairs only, around the common seed's centres
        self.candidates = CandidateCentres(ctx, self.params, self.X, lambda: self.sizes, SlotLayout.for_key(
            self.keypair.public, self.params.lsh_bits).slots) if self.params.candidates else None

    def _check_size(self) -> None:
        """Estimate this party's memory and Paillier work from the layout, before any of it
        (client/jobs/estimate.py)."""
        peers = {p: n for p, n in self.sizes.items() if p != self.party_id}
        limit, workers = self.ctx.max_paillier_seconds, self._workers()
        layout = SlotLayout.for_key(self.keypair.public, self.params.lsh_bits)
        n = self.X.shape[0]
        p = self.params
        slots, budget = p.slots_per_row, p.pair_budget
        need = party_bytes(n, peers, layout, workers=workers, n_classes=p.n_classes, slots=slots)
        self.progress(f"estimated memory: {need / 2**30:.2f} GiB beyond the table")
        check_memory(need, self.ctx.max_memory_bytes, n, peers)
        if not peers or not limit:
            return
        seconds = paillier_seconds(OperationCosts.measure(self.keypair), layout, self.X.shape[0], peers, workers,
                                   budget=budget, slots=slots)
        self.progress(f"estimated Paillier work: {seconds / 60:.1f} min on {workers} workers "
                      f"({self.X.shape[0]} rows against {sum(peers.values())} of {len(peers)} peers)")
        check_time(seconds, limit, self.X.shape[0], peers, workers)

    def _labels(self) -> np.ndarray:
        data = self.ctx.data
        if data.y is None:
            return np.full(data.X.shape[0], -1, dtype=np.int64)
        return data.y

    @property
    def fixed_point(self) -> FixedPoint:
        return FixedPoint(frac_bits=self.params.frac_bits)

    # --- transitions ------------------------------------------------------------------------

    def on_step(self, step: pb.StepStart) -> None:
        members = tuple(step.participants)
        if step.step == INTRA_STEP:
            self._need(self.sizes, "the row layout")
            self.codes = steps.lsh_step(self.X, self.ctx.seed, self.params.lsh_bits)  # DESIGN §5.1
            nearest = steps.own_nearest(self.codes, self.params.lsh_bits, self.params.graph_params)
            self._push(nearest, INTRA_STEP, step.round)
            self.progress(f"LSH ({self.params.lsh_bits} bits) and own {nearest.shape[1]} nearest rows per row sent "
                          f"({self._elapsed()})")
        elif self.candidates is not None and self.candidates.handles(step.step):
            self.candidates.on_step(step)
        elif step.step == HAMMING_STEP:
            self._start_hamming(step.round, members)
        elif step.step == LABELS_STEP:
            if self.params.hide_label_mask:  # DESIGN §5.5: the coordinator was not to learn them
                raise ProtocolError("the coordinator asked for the labeled rows of a job that hides the label mask")
            self._push(steps.labeled_rows(self.y, self.params.n_classes), LABELS_STEP, step.round)
            self.progress("labeled row numbers sent")
        elif self.row_sums.handles(step.step):
            if step.step == ROWSUMS_STEP:
                self._need(self.zbar, "the influence block")
            self.row_sums.on_step(step)
            if step.step == ROWSUMS_STEP:
                self.progress(f"SecureRowSums attempt {step.round}: masked row sums sent ({len(members)} parties)")
        else:
            raise ProtocolError(f"unknown step {step.step!r} for an xclp job")

    def on_message(self, message: wire.Message) -> None:
        if message.sender == "":
            self._from_coordinator(message)
        elif message.step == HAMMING_STEP:
            self._from_peer(message)
        else:
            raise ProtocolError(f"{message.sender!r} sent a {message.step!r} message, which peers never send")

    def payload_limit(self, step: str, sender: str) -> int:
        """What a message of `step` can need (DESIGN §3), from the roster, the layout, the graph and
        the Paillier slot layout; a message an XCLP party never gets is refused."""
        m, n_self, L = len(self.roster.party_ids), self.X.shape[0], self.params.lsh_bits
        if sender == "":
            if step in (LAYOUT_MSG, GRAPH_MSG):
                return 8 * m
            if step == PAIRS_MSG:
                return 16 * m * m
            if step == INFLUENCE_MSG:  # float64[n, c]: a piece of this party's columns (DESIGN §10.2)
                influence = self._need(self.influence, "the graph layout")
                n = influence.zbar.shape[0]
                return 8 * n * min(influence_piece_columns(n), influence.expected)
            if step == ROWSUMS_RESULT_MSG:
                return 8 * n_self * self.params.n_classes
            raise ProtocolError(f"the coordinator sent an unknown {step!r} message")
        if step != HAMMING_STEP or sender not in self.sizes or sender == self.party_id:
            raise ProtocolError(f"{sender!r} sent a {step!r} message, which peers never send")
        rows = self.sizes[sender] if self.candidates is None else self.candidates.slots_of(sender)
        return relay_bytes(SlotLayout(self.params.key_bits, L), rows)  # A's slices, or a piece

    # --- layout ------------------------------------------------------------------------------

    def _from_coordinator(self, message: wire.Message) -> None:
        payload = message.payload
        if message.step in (LAYOUT_MSG, GRAPH_MSG):
            rows = self._layout(payload, message.step)
            if message.step == LAYOUT_MSG:
                self.sizes = {p: n for p, n in rows.items() if n}
                self._check_size()
            elif not self.hamming_pushed:
                raise ProtocolError("the coordinator sent the graph layout before this party's SecureHamming pairs "
                                    "were done")
            else:
                self.graph = tuple((p, n) for p, n in rows.items() if n)
                influence = self.influence = self._scores_of(self.y)
                if self.released_y is not None:
                    self.released = self._scores_of(self.released_y)
                # the coordinator solves and sends them block by block (§10.2): the wait is the solve
                self.influence_meter = Meter("influence columns", influence.expected, self.progress,
                                             unit="columns received", lines=4, bar=True)
        elif message.step == PAIRS_MSG:
            self.pairs = self._pairs(payload)
        elif message.step == INFLUENCE_MSG:
            self._influence(payload)
        elif message.step == ROWSUMS_RESULT_MSG:
            self._result(payload, message.round)
        else:
            raise ProtocolError(f"the coordinator sent an unknown {message.step!r} message")
        if message.step in (LAYOUT_MSG, GRAPH_MSG, PAIRS_MSG):  # public, one for all, checked (DESIGN §2.5)
            self.ctx.transcript.absorb(message.step, payload)

    def _layout(self, payload: wire.Payload, what: str) -> dict[str, int]:
        ids = self.roster.party_ids
        if not isinstance(payload, np.ndarray) or payload.dtype != np.uint64 or payload.shape != (len(ids),):
            raise ProtocolError(f"the {what} message must be uint64[{len(ids)}]")
        rows = {p: int(n) for p, n in zip(ids, payload)}
        if rows[self.party_id] != self.X.shape[0]:
            raise ProtocolError(f"the {what} message gives this party {rows[self.party_id]} rows, not "
                                f"{self.X.shape[0]}")
        # DESIGN §2.5: every party signed its row count in its key bundle; a layout with other counts
        # would give some rows to nobody in somebody's view (rows every party masks and nobody owns)
        signed = {p: n for p, n in rows.items() if n and n != self.roster.bundle(p).rows}
        if signed:
            p, n = next(iter(signed.items()))
            raise ProtocolError(f"the {what} message gives {p!r} {n} rows, but {p!r} signed "
                                f"{self.roster.bundle(p).rows} in its key bundle")
        for p, n in rows.items():
            if n and self.sizes and self.sizes.get(p) != n:
                raise ProtocolError(f"the {what} message changes the row count of {p!r}")
        return rows

    def _pairs(self, payload: wire.Payload) -> tuple[PairTask, ...]:
        """uint64[m, 2] roster positions (A, B) of every pair, each pair of parties once."""
        ids = self.roster.party_ids
        if (not isinstance(payload, np.ndarray) or payload.dtype != np.uint64 or payload.ndim != 2
                or payload.shape[1] != 2):
            raise ProtocolError("the pairs message must be uint64[m, 2]")
        if payload.size and int(payload.max()) >= len(ids):
            raise ProtocolError("the pairs message names a party outside the roster")
        pairs = tuple(PairTask(ids[int(a)], ids[int(b)]) for a, b in payload)
        unordered = [frozenset((t.a, t.b)) for t in pairs]
        if any(len(u) != 2 for u in unordered) or len(set(unordered)) != len(unordered):
            raise ProtocolError("the pairs message repeats a pair or pairs a party with itself")
        return pairs

    # --- SecureHamming (DESIGN §5.3) ----------------------------------------------------------

    def _start_hamming(self, attempt: int, members: tuple[str, ...]) -> None:
        """A new attempt: every pair of this party among `members` starts from its first piece.

        As B this party draws a fresh mask seed per pair and sends it to the coordinator first; as
        A it sends its encrypted bit slices (encrypted once, for every attempt) to each B."""
        codes = self._need(self.codes, "LSH codes")
        self._need(self.pairs, "the SecureHamming pairs")
        self.hamming_attempt, self.hamming_members, self.hamming_pushed = attempt, members, False
        mine = self._my_pairs()
        rowless = sorted({p for t in mine for p in (t.a, t.b)} - set(self.sizes))
        if rowless:
            raise ProtocolError(f"the pairs message pairs this party with {', '.join(rowless)}, to which the layout "
                                "gives no rows")
        index = {task: i for i, task in enumerate(self.pairs)}
        layout = SlotLayout(self.params.key_bits, self.params.lsh_bits)

        self.as_a, self.as_b = {}, {}
        for t in mine:  # each pair's meter: a line every quarter of it (on a terminal, when it is done)
            schedule = None if self.candidates is None else self.candidates.schedule(t.a, t.b)
            parts = all_pairs(layout, self.sizes[t.a], self.sizes[t.b]) if schedule is None else pieces(
                layout, schedule.counts().tolist())
            what = f"SecureHamming pair {t.a}->{t.b}"
            if t.a == self.party_id:
                self.as_a[t.b] = _AsA(t, parts, index[t], Meter(what, len(parts), self.progress,
                                                                unit="pieces decrypted", lines=4))
            else:
                self.as_b[t.a] = _AsB(t, parts, index[t], draw_mask_seed(),
                                      Meter(what, len(parts), self.progress, unit="pieces evaluated", lines=4),
                                      schedule=schedule)
        count = sum(len(a.pieces) for a in self.as_a.values()) + sum(len(b.pieces) for b in self.as_b.values())
        self.progress(f"SecureHamming attempt {attempt}: {len(mine)} pairs, A in {len(self.as_a)} "
                      f"({', '.join(f'{t.a}->{t.b}' for t in mine)}); {count} pieces")
        self.meter = Meter(f"SecureHamming, {len(mine)} pair{'s' * (len(mine) != 1)}", count, self.progress, bar=True)
        for pair in self.as_b.values():  # the seeds first: the coordinator unmasks A's t with them
            self._push(HammingUpload(Upload.SEED, pair.index, 0, pair.seed).to_array(), HAMMING_STEP, attempt)
        if self.as_a:
            if self.slices is None:
                t0 = time.monotonic()
                if self.candidates is not None:  # its centre lists, padded, in full batches (DESIGN §10.3)
                    slots = self.candidates.slots_of(self.party_id)
                    schedule = self.candidates.schedule(self.party_id, self.party_id)  # its slots alone matter
                    codes = steps.slot_codes(codes, a_slots(schedule, self.candidates.lists()).ravel()[:slots])
                self.slices = steps.hamming_encrypt(self.keypair, codes, self.params.lsh_bits, self.ctx.executor)
                self.progress(f"encrypted {self.params.lsh_bits} bit slices of {self.X.shape[0]} rows "
                              f"({len(self.slices)} bytes) in {time.monotonic() - t0:.1f}s")
            # one B at a time (DESIGN §10.1): the next once this one answers with its first piece, so
            # the coordinator holds one copy of the slices in its mailboxes, not one per peer
            self.slices_due = list(self.as_a)
            self._send_slices()
        self._maybe_done()

    def _send_slices(self) -> None:
        if self.slices_due:
            assert self.slices is not None
            self._relay(Relay.SLICES, 0, self.slices, self.slices_due.pop(0))

    def _from_peer(self, message: wire.Message) -> None:
        if message.round != self.hamming_attempt or message.sender not in self.hamming_members:
            return  # a message of an abandoned attempt
        if not isinstance(message.payload, bytes):
            raise ProtocolError("SecureHamming ciphertexts must be opaque bytes")
        self._pair_with(message.sender)
        # DESIGN §2.2: from that peer, for us, this attempt; kind and index authenticated with it
        kind, index, body = open_relay(self._open(message.payload, message.round, message.sender))
        if message.sender in self.as_b:
            self._as_b(self.as_b[message.sender], kind, index, body)
        else:
            self._as_a(self.as_a[message.sender], kind, index, body)
        self._maybe_done()

    def _as_b(self, pair: _AsB, kind: Relay, index: int, body: bytes) -> None:
        """A's slices (first), then A's acknowledgements in piece order; evaluate what the window allows."""
        if pair.slices is None:
            if kind != Relay.SLICES:
                raise ProtocolError(f"{pair.task.a!r} sent a {kind.name} before its bit slices")
            pair.a_key = self._peer_key(pair.task.a)
            slots = self.sizes[pair.task.a] if self.candidates is None else self.candidates.slots_of(pair.task.a)
            pair.slices = steps.received_slices(pair.a_key, body, self.params.lsh_bits, slots)
        elif kind != Relay.ACK or index != pair.acked or index >= pair.sent:
            raise ProtocolError(f"{pair.task.a!r} sent {kind.name} {index} where acknowledgement {pair.acked} of "
                                f"{pair.sent} sent pieces was due: dropped, replayed or reordered on the way")
        else:
            pair.acked += 1
        self._evaluate(pair)

    def _evaluate(self, pair: _AsB) -> None:
        """Evaluate and send the next pieces: up to the window ahead of A's acknowledgements, in waves
        that keep every worker busy (a wave waits for enough acknowledgements unless none is out)."""
        workers, window = self._workers(), self._window()
        while pair.sent < len(pair.pieces):
            free, left = window - (pair.sent - pair.acked), len(pair.pieces) - pair.sent
            wave = min(free, left)
            if wave <= 0 or (wave < min(workers, left) and pair.sent > pair.acked):
                return
            codes = self._need(self.codes, "LSH codes")
            if pair.schedule is not None and self.candidates is not None:  # a piece at a time, batch by batch
                assert pair.slices is not None and pair.a_key is not None
                piece = pair.pieces[pair.sent]
                out = steps.evaluate_scheduled(pair.a_key, pair.slices, codes, pair.schedule, self.candidates.lists(),
                                               piece, pair.seed, self.ctx.executor, split=workers)
                self._relay(Relay.PIECE, pair.sent, out, pair.task.a)
                pair.sent += 1
                pair.meter.update(pair.sent)
                self._tell_progress()
                continue
            todo = pair.pieces[pair.sent : pair.sent + wave]
            if todo[0].entries is not None:  # slices of one batch's rows: one batch per wave
                todo = tuple(p for p in todo if p.batches == todo[0].batches)
            else:  # whole batches: up to the first slice of a batch
                todo = tuple(itertools.takewhile(lambda p: p.entries is None, todo))
            assert pair.slices is not None and pair.a_key is not None
            # the wave at once: its batches (all rows), or one batch's consecutive row slices
            batches = range(todo[0].batches.start, todo[-1].batches.stop)
            rows = todo[0].b_rows(len(codes)) if len(batches) > 1 else range(
                todo[0].b_rows(len(codes)).start, todo[-1].b_rows(len(codes)).stop)
            out = steps.evaluate_piece(pair.a_key, pair.slices, codes[rows.start : rows.stop], batches,
                                       todo[0].first, pair.seed, self.ctx.executor,
                                       split=-(-workers // len(batches)))
            at, size = 0, pair.slices.layout.ciphertext_bytes  # bytes of one D
            for piece in todo:
                self._relay(Relay.PIECE, pair.sent, out[at : at + piece.values * size], pair.task.a)
                at += piece.values * size
                pair.sent += 1
            pair.meter.update(pair.sent)
            self._tell_progress()

    def _as_a(self, pair: _AsA, kind: Relay, index: int, body: bytes) -> None:
        """B's pieces in order: decrypt each into t for the coordinator, then acknowledge it to B."""
        if kind != Relay.PIECE or index != pair.received or index >= len(pair.pieces):
            raise ProtocolError(f"{pair.task.b!r} sent {kind.name} {index} where piece {pair.received} of "
                                f"{len(pair.pieces)} was due: dropped, replayed or reordered on the way")
        if index == 0:  # B has the slices: the next B may have them
            self._send_slices()
        t = steps.decrypt_piece(self.keypair, body, pair.pieces[index].values, self.ctx.executor)
        attempt = self._need(self.hamming_attempt, "the SecureHamming step")
        self._push(HammingUpload(Upload.T, pair.index, index, t).to_array(), HAMMING_STEP, attempt)
        pair.received += 1
        if pair.received < len(pair.pieces):  # B needs no word about the last one
            self._relay(Relay.ACK, index, b"", pair.task.b)
        pair.meter.update(pair.received)
        self._tell_progress()

    def _tell_progress(self) -> None:
        """The attempt's pieces done here, over all pairs: a bar on a terminal, a line every tenth elsewhere."""
        if self.meter is not None:
            self.meter.update(sum(p.received for p in self.as_a.values()) + sum(p.sent for p in self.as_b.values()))

    def _workers(self) -> int:
        return worker_count(self.ctx.executor)

    def _window(self) -> int:
        """Pieces of a pair B keeps sent and unacknowledged: enough for two waves, within the coordinator's bound."""
        return max(1, min(MAX_IN_FLIGHT, 2 * self._workers()))

    def _relay(self, kind: Relay, index: int, body: bytes, peer: str) -> None:
        attempt = self._need(self.hamming_attempt, "the SecureHamming step")
        self._push(self._seal(frame_relay(kind, index, body), attempt, peer), HAMMING_STEP, attempt, recipient=peer)

    def _sealed(self, attempt: int, sender: str, recipient: str) -> Sealed:
        """A SecureHamming relay's binding (xclp.v1.relay): the pair's key for this attempt, the
        step, attempt, sender and recipient in the AAD."""
        return Sealed.of(HAMMING_STEP, HAMMING_STEP, attempt, (sender, recipient), sender, recipient)

    def _seal(self, payload: bytes, attempt: int, recipient: str) -> bytes:
        masker = self.ctx.masker
        return self._sealed(attempt, self.party_id, recipient).seal(masker.secrets[recipient], masker.session_id,
                                                                   payload)

    def _open(self, sealed: bytes, attempt: int, sender: str) -> bytes:
        """The relayed payload, or ProtocolError: the coordinator may drop a relay, never forge,
        replay, reflect or redirect one."""
        masker = self.ctx.masker
        try:
            return self._sealed(attempt, sender, self.party_id).open(masker.secrets[sender], masker.session_id,
                                                                     sealed)
        except XclpError:
            raise ProtocolError(f"a SecureHamming message said to come from {sender!r} does not open: forged, "
                                "replayed or redirected on the way") from None

    def _maybe_done(self) -> None:
        """Every pair of this attempt is done here: all pieces evaluated (as B) and decrypted (as A)."""
        if self.hamming_pushed or self.hamming_attempt is None:
            return
        if any(p.received < len(p.pieces) for p in self.as_a.values()) or \
                any(p.sent < len(p.pieces) for p in self.as_b.values()):
            return
        self.hamming_pushed = True
        self._tell_progress()  # (no pieces at all: still a line that it is done)
        self.progress(f"SecureHamming done ({self._elapsed()})")

    def _my_pairs(self) -> tuple[PairTask, ...]:
        return parts_of(self.pairs, self.party_id, self.hamming_members)

    def _pair_with(self, peer: str) -> PairTask:
        for task in self._my_pairs():
            if peer in (task.a, task.b):
                return task
        raise ProtocolError(f"{peer!r} is not a SecureHamming partner of {self.party_id!r} in this attempt")

    def _peer_key(self, peer: str) -> PaillierPublicKey:
        try:
            return paillier_key(self.roster.bundle(peer), self.params.key_bits,
                                allow_insecure=self.params.insecure_test_keys)
        except InvalidInput as exc:
            raise ProtocolError(f"a peer's key bundle is unusable: {exc}") from None

    # --- influence and SecureRowSums (DESIGN §5.5-5.7) ------------------------------------------

    def _influence(self, payload: wire.Payload) -> None:
        """One piece of this party's influence columns (DESIGN §5.5, §10.2), folded into Z̄ at once."""
        self._need(self.graph, "the graph layout")
        if not self.hamming_pushed:  # protocol order: no graph without this party's distances
            raise ProtocolError("the coordinator sent an influence block before this party's SecureHamming pairs "
                                "were done")
        influence = self._need(self.influence, "the graph layout")  # made with the graph layout
        n = influence.zbar.shape[0]
        if self.zbar is not None:  # (a party without labeled rows is complete with one empty piece)
            raise ProtocolError("the coordinator sent more influence columns than this party has")
        if not isinstance(payload, np.ndarray) or payload.dtype != np.float64 or payload.ndim != 2 \
                or payload.shape[0] != n:
            raise ProtocolError(f"an influence piece must be float64[{n}, ...]")
        # S = (I − α𝒲)⁻¹ is entrywise non-negative and at most 1/(1 − α) (‖𝒲‖ ≤ 1)
        bound = 1.0 / (1.0 - self.params.alpha)
        if payload.min(initial=0.0) < 0 or payload.max(initial=0.0) > bound:
            raise ProtocolError(f"the influence block has values outside [0, 1/(1 - alpha)] = [0, {bound:g}]: not "
                                "an influence matrix")
        self.influence_digest.update(np.ascontiguousarray(payload).tobytes())  # the row sums' definition
        try:
            influence.add(payload)
            if self.released is not None:
                self.released.add(payload)
        except InvalidInput as exc:
            raise ProtocolError(f"the coordinator sent a malformed influence block: {exc}") from None
        if self.influence_meter is not None:
            self.influence_meter.update(influence.received)
        if influence.complete:
            self.zbar = influence.zbar if not self.params.label_dp else self._label_dp_release(influence)

    def _scores_of(self, y: np.ndarray) -> steps.InfluenceScores:
        return steps.InfluenceScores(y, self.params.n_classes, sum(n for _, n in self.graph),
                                     hide_label_mask=self.params.hide_label_mask,
                                     normalise_labels=self.params.normalise_labels,
                                     own=RowLayout.of(self.graph).rows(self.party_id)
                                     if self.params.label_dp and self.params.label_dp_mechanism == "skellam" else None)

    def _label_dp_release(self, influence: steps.InfluenceScores) -> np.ndarray | steps.NoisyRowSums:
        """Z̄ as this party releases it with label-DP (xclp.label_dp): from its randomised labels, or
        with noise calibrated to the block it received; its own rows exact."""
        p = self.params
        assert p.label_dp_epsilon is not None
        if self.released is not None:  # randomised response
            values = label_dp.response_values(p.n_classes, hide_unlabeled=p.hide_label_mask)
            self.label_privacy = {"mechanism": "response", "epsilon_spent": p.label_dp_epsilon, "delta": 0.0,
                                  "keep_probability": label_dp.keep_probability(p.label_dp_epsilon, values)}
            self.progress(f"label-DP ε = {p.label_dp_epsilon:g}: each label was kept with probability "
                          f"{self.label_privacy['keep_probability']:.3g}, else replaced at random, before use")
            return steps.released_scores(influence.zbar, self.released.zbar, self.graph, self.party_id)
        assert p.label_dp_delta is not None
        released = influence.zbar.shape[0] - self.X.shape[0]
        try:
            plan = label_dp.plan(p.label_dp_epsilon, p.label_dp_delta, *influence.largest_columns, released,
                                 p.frac_bits)
            noisy = steps.label_dp_release(influence.zbar, self.graph, self.party_id, plan, self.fixed_point)
            if self.ctx.account is not None:  # the ledger composes runs by RDP
                self.ctx.account.mechanism("labels", plan.rdp)
        except InvalidInput as exc:
            raise ProtocolError(f"the influence block cannot be released with label-DP: {exc}") from None
        self.label_privacy = {"mechanism": "skellam", "epsilon_spent": plan.epsilon, "delta": plan.delta,
                              "noise_std": plan.noise_std, "noise_multiplier": plan.noise_multiplier}
        self.progress(plan.describe())
        return noisy

    def privacy(self) -> dict[str, Any] | None:
        """With label-DP: what this party's labels spent (one release; a restart resends it)."""
        if self.label_privacy is None:
            return None
        return {"label_dp": True, "epsilon_budget": self.params.label_dp_epsilon, **self.label_privacy}

    def _row_sum_releases(self, members: tuple[str, ...]) -> list[Release]:
        """Without label-DP the row sums are exact: Z̄ = S_L Y_L under the influence the coordinator
        sent (its digest names the function; the labels are the data's)."""
        block = self.influence_digest.digest()
        return [Release(function_id("row-sums", block, self.params.label_norm, str(self.params.n_classes)),
                        "XCLP's row sums of its labels under one influence block")]

    def _encoded_row_sums(self, members: tuple[str, ...]) -> np.ndarray:
        """Z̄ on the frame of this attempt's participants, in the ring (DESIGN §5.6)."""
        assert self.zbar is not None
        return steps.encode_row_sums(self.zbar, self.graph, members, self.fixed_point)

    def _own_rows(self, masked: np.ndarray, members: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        return steps.split_own_rows(masked, self.graph, members, self.party_id)

    def _result(self, payload: wire.Payload, attempt: int) -> None:
        kept = self.row_sums.withheld(attempt)
        if kept is None:
            raise ProtocolError(f"row sums returned for attempt {attempt}, which this party never sent")
        if not isinstance(payload, np.ndarray):
            raise ProtocolError("the row sums must be an array")
        rows = steps.returned_rows(self.y, self.params.n_classes, hide_label_mask=self.params.hide_label_mask)
        try:
            Z = steps.unmask_row_sums(payload, kept[rows], self.fixed_point)
        except InvalidInput as exc:
            raise ProtocolError(str(exc)) from None
        # the result: this party's rows of the propagated scores Z, float64[n_j, C]
        self.result = steps.party_scores(self.y, self.params.n_classes, rows, Z)
        self.progress(f"scores for {self.result.shape[0]} rows received ({self._elapsed()})")

    # --- helpers ----------------------------------------------------------------------------

    def _push(self, payload: wire.Payload, step: str, attempt: int, recipient: str = "") -> int:
        return self.ctx.push(payload, step, attempt, recipient)

    def _need(self, value: T | None, what: str) -> T:
        """`value`, or ProtocolError if the coordinator started a step before sending it."""
        if value is None or (isinstance(value, Sized) and len(value) == 0):
            raise ProtocolError(f"the coordinator moved on before sending {what}")
        return value

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.started:.1f}s since the seed"


    def predictions(self) -> tuple[np.ndarray, np.ndarray]:
        """Labels int64[n_j] and confidences float64[n_j] (DESIGN §5.7)."""
        if self.result is None:
            raise ProtocolError("no scores yet")
        return steps.predict(self.result)
