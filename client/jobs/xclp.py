"""A party's side of the XCLP job (docs/design.md §5): reacts to the coordinator's steps and peer messages.

The math is in `client.steps.xclp`; what the party holds between messages is one staged value,
`stage` (client/jobs/xclp_state.py: Joined, Laid, Receiving, Whole), and this class moves payloads
(names, dtypes and shapes as the contract, xclp/v1/xclp.py, lists them) to the phase that handles them:
SecureHamming, the party's pairs as A and B (client/phases/secure_hamming.py); candidate pairs'
centres (client/phases/centres.py); SecureRowSums, the party's masked-sum phase
(client/phases/masked_sum.py), which keeps the party's own masked rows back.
"""

from __future__ import annotations

import time
from collections.abc import Sized
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from xclp.client import responses
from xclp.client.context import PartyContext, Progress
from xclp.client.jobs import xclp_state
from xclp.client.jobs.base import PartyJob
from xclp.client.jobs.estimate import WorkLimits, check_memory, check_work, party_bytes
from xclp.client.jobs.xclp_state import Joined, Laid, Receiving, Stage, Whole, Zbar
from xclp.client.ledger import Release, function_id
from xclp.client.phases.centres import CandidateCentres
from xclp.client.phases.masked_sum import MaskedSumParty, Noisy
from xclp.client.phases.secure_hamming import SecureHammingParty
from xclp.client.steps import xclp as steps
from xclp.crypto.fixedpoint import FixedPoint
from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.secure_hamming import SlotLayout
from xclp.data.party_table import PartyData
from xclp.errors import InvalidInput, ProtocolError
from xclp.privacy import label_dp
from xclp.progress import Meter
from xclp.v1 import influence as influence_wire
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.params import JobParams
from xclp.v1.xclp import (
    GRAPH_MSG,
    HAMMING_STEP,
    INFLUENCE_MSG,
    INTRA_STEP,
    KEPT_PAIRS_MSG,
    LABELS_STEP,
    LAYOUT_MSG,
    PAIRS_FROM_MSG,
    PAIRS_MSG,
    ROWS_DTYPE,
    ROWSUMS_PURPOSE,
    ROWSUMS_RESULT_MSG,
    ROWSUMS_STEP,
    XclpJobParams,
    influence_piece_columns,
)
from xclp.v1.xclp_layout import RowLayout
from xclp.workers import worker_count

T = TypeVar("T")


class XclpParty(PartyJob):
    """The party's XCLP state machine; `on_step` / `on_message` are its transitions."""

    @staticmethod
    def before_join(params: JobParams, data: PartyData, *, max_memory_bytes: int, keypair: PaillierKeypair | None,
                    work_limits: WorkLimits, parties: int, workers: int, progress: Progress) -> None:
        """Refuse, before joining, a job this party's own part of cannot fit in its memory, or whose
        Paillier work, with each of the other expected parties taken to hold as many rows as this
        one, passes its time limits (client/jobs/estimate.py; both are checked again on the layout)."""
        if not isinstance(params, XclpJobParams):
            return
        n = data.X.shape[0]
        params = params.for_rows(n * max(1, parties))  # as after the roster, the others taken as large
        need = party_bytes(n, {}, SlotLayout(params.key_bits, params.lsh_bits), workers=1,
                           n_classes=params.n_classes)
        check_memory(need, max_memory_bytes, n, {})
        if keypair is not None:
            check_work(keypair, params, n, {f"peer {i}": n for i in range(max(0, parties - 1))}, workers,
                       work_limits, progress, assumed=True)

    def __init__(self, ctx: PartyContext) -> None:
        super().__init__(ctx)
        # resolved where the roster was verified (client/session.py: pair_budget from its signed row counts)
        self.params = ctx.params_as(XclpJobParams)
        assert self.params.pair_budget is not None and self.params.influence_tolerance is not None, \
            "pair_budget and influence_tolerance are resolved where the roster is verified"
        if ctx.keypair is None:
            raise InvalidInput(f"an xclp job needs this party's Paillier key (--paillier-bits {self.params.key_bits})")
        self.keypair: PaillierKeypair = ctx.keypair
        self.roster, self.party_id, self.progress = ctx.roster, ctx.party_id, ctx.progress
        self.X, self.y = steps.check_party_data(ctx.data.X, self._labels(), self.params.n_classes)
        self.stage: Stage = Joined()  # where the party is, holding only what is valid there
        # label-DP by randomised response (xclp.privacy.label_dp): the labels as released, drawn once per row
        # of the data set and kept sealed in the ledger, so that every later job releases the same ones
        p = self.params
        self.released_y: np.ndarray | None = None
        if p.label_dp_epsilon is not None and p.label_dp_mechanism == "response":
            epsilon = p.label_dp_epsilon

            def draw() -> np.ndarray:
                return label_dp.randomised_response(self.y, p.n_classes, epsilon, hide_unlabeled=p.hide_label_mask)

            account = ctx.account
            self.released_y = draw() if account is None else responses.released_labels(
                account.ledger, account.data, ctx.data.ids, responses.class_names(p), epsilon, p.hide_label_mask, draw)
        self.started = time.monotonic()
        self.since = "since the seed"  # what `started` is, in progress lines
        # SecureRowSums: its parties bind the unscoped step name in the reveal digest (in a
        # training round too; the round's session id binds the round)
        self.row_sums = MaskedSumParty(ctx, ROWSUMS_STEP, self._encoded_row_sums, purpose=ROWSUMS_PURPOSE,
                                       withhold=self._own_rows, digest_name=ROWSUMS_STEP,
                                       releases=Noisy.DP if self.params.label_dp else self._row_sum_releases)
        # docs/design.md §10.3: SecureHamming on candidate pairs only, around the common seed's centres
        self.candidates = CandidateCentres(ctx, self.params, self.X, lambda: self.sizes, SlotLayout.for_key(
            self.keypair.public, self.params.lsh_bits).slots) if self.params.candidates else None
        self.hamming = SecureHammingParty(ctx, self.params, self.keypair, self.X.shape[0], lambda: self.sizes,
                                          self.candidates, self._elapsed)

    def superseded(self, step: pb.StepStart) -> None:
        self.hamming.superseded(step)

    # --- a restart (client/run_state.py) ------------------------------------------------------

    def saved(self) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """In SecureHamming from its pairs on, or with Z̄ whole until it reveals; None elsewhere
        (client/jobs/xclp_state.py)."""
        stage = self.stage
        if isinstance(stage, Laid):
            hamming = self.hamming.saved()
            return None if hamming is None else xclp_state.laid_saved(stage, hamming)
        if isinstance(stage, Whole) and not self.row_sums.self_masks.revealed:
            return stage.saved()
        return None

    @classmethod
    def restored(cls, ctx: PartyContext, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> XclpParty:
        """The job `saved` described, waiting for the attempt its restart starts; InvalidInput, with
        the reason, for a state another version wrote."""
        job = cls(ctx)
        job.since = "since this process rejoined the run"  # not the seed, which an earlier process took
        if xclp_state.stage_of(meta) == "whole":  # SecureHamming and the influence columns are behind it
            job.stage = Whole.restored(meta, arrays)
            return job
        job.stage = Laid(xclp_state.sizes_of(meta))
        job.hamming.restore(meta["hamming"], arrays, steps.lsh_step(job.X, ctx.seed, job.params.lsh_bits))
        return job

    # --- what the stage holds -------------------------------------------------------------------

    @property
    def sizes(self) -> dict[str, int]:
        """Rows per party from the row layout ({} before it)."""
        return self.stage.sizes or {}

    @property
    def graph(self) -> tuple[tuple[str, int], ...]:
        """(party, rows) in H's order from the graph layout (() before it)."""
        return self.stage.graph or ()

    @property
    def zbar(self) -> Zbar | None:
        """Z̄ once every influence column is in; with label-DP its noisy release, drawn once."""
        return self.stage.zbar if isinstance(self.stage, Whole) else None

    @property
    def influence(self) -> steps.InfluenceScores | None:
        """The influence columns folding into Z̄, while they arrive."""
        return self.stage.scores if isinstance(self.stage, Receiving) else None

    @property
    def approximation(self) -> dict[str, Any] | None:
        return self.stage.approximation if isinstance(self.stage, Whole) else None

    def _check_size(self) -> None:
        """Estimate this party's memory and Paillier work from the layout, before any of it
        (client/jobs/estimate.py)."""
        peers = {p: n for p, n in self.sizes.items() if p != self.party_id}
        workers, n, p = worker_count(self.ctx.executor), self.X.shape[0], self.params
        layout = SlotLayout.for_key(self.keypair.public, p.lsh_bits)
        need = party_bytes(n, peers, layout, workers=workers, n_classes=p.n_classes, slots=p.slots_per_row)
        self.progress(f"estimated memory: {need / 2**30:.2f} GiB beyond the table")
        check_memory(need, self.ctx.max_memory_bytes, n, peers)
        if peers:
            check_work(self.keypair, p, n, peers, workers, self.ctx.work_limits, self.progress)

    def _labels(self) -> np.ndarray:
        data = self.ctx.data
        if data.y is None:
            return np.full(data.X.shape[0], -1, dtype=np.int64)
        return data.y

    @property
    def fixed_point(self) -> FixedPoint:
        return FixedPoint(frac_bits=self.params.frac_bits)

    # --- transitions ------------------------------------------------------------------------

    def phases(self) -> tuple[MaskedSumParty, ...]:
        return (self.row_sums, *(() if self.candidates is None else (self.candidates.table,)))

    def on_step(self, step: pb.StepStart) -> None:
        members = tuple(step.participants)
        if step.step == INTRA_STEP:
            self._need(self.sizes, "the row layout")
            # docs/design.md §5.1
            codes = self.hamming.codes = steps.lsh_step(self.X, self.ctx.seed, self.params.lsh_bits)
            nearest = steps.own_nearest(codes, self.params.lsh_bits, self.params.graph_params)
            self._push(nearest, INTRA_STEP, step.round)
            self.progress(f"LSH ({self.params.lsh_bits} bits) and own {nearest.shape[1]} nearest rows per row sent "
                          f"({self._elapsed()})")
        elif self.candidates is not None and self.candidates.handles(step.step):
            self.candidates.on_step(step)
        elif step.step == HAMMING_STEP:  # what a restarted process rejoins the next attempt with:
            self.ctx.checkpoint()  # before the encryption (minutes at scale) ...
            self.hamming.start(step.round, members)
            self.ctx.checkpoint()  # ... and with its slices
        elif step.step == LABELS_STEP:
            if self.params.hide_label_mask:  # docs/design.md §5.5: the coordinator was not to learn them
                raise ProtocolError("the coordinator asked for the labeled rows of a job that hides the label mask")
            self._push(steps.labeled_rows(self.y, self.params.n_classes), LABELS_STEP, step.round)
            self.progress("labeled row numbers sent")
        elif self.row_sums.handles(step.step):
            if step.step == ROWSUMS_STEP:
                self._need(self.zbar, "the influence block")
            self.row_sums.on_step(step)
            if step.step == self.row_sums.reveal_name:
                self.ctx.checkpoint()  # revealed: a restarted process cannot rejoin this sum (its state goes)
            if step.step == ROWSUMS_STEP:
                self.progress(f"SecureRowSums attempt {step.round}: masked row sums sent ({len(members)} parties)")
        else:
            raise ProtocolError(f"unknown step {step.step!r} for an xclp job")

    def on_message(self, message: wire.Message) -> None:
        if message.sender == "":
            self._from_coordinator(message)
        elif message.step == HAMMING_STEP:
            self.hamming.on_message(message)
        else:
            raise ProtocolError(f"{message.sender!r} sent a {message.step!r} message, which peers never send")

    def payload_limit(self, step: str, sender: str) -> int:
        """What a message of `step` can need (docs/design.md §3), from the roster, the layout, the graph and
        the Paillier slot layout; a message an XCLP party never gets is refused."""
        m, n_self = len(self.roster.party_ids), self.X.shape[0]
        if sender == "":
            if step in (LAYOUT_MSG, GRAPH_MSG):
                return 8 * m
            if step in (PAIRS_MSG, KEPT_PAIRS_MSG, PAIRS_FROM_MSG):
                return 16 * m * m
            if step == INFLUENCE_MSG:  # float64[n, c]: a piece of this party's columns (docs/design.md §10.2)
                influence = self._need(self.influence, "the graph layout")
                n = influence.zbar.shape[0]
                if self.params.tolerance:  # sparse: whole columns within the piece size, or one alone
                    return influence_wire.most_bytes(n)
                return 8 * n * min(influence_piece_columns(n), influence.expected)
            if step == ROWSUMS_RESULT_MSG:
                return 8 * n_self * self.params.n_classes
            raise ProtocolError(f"the coordinator sent an unknown {step!r} message")
        if step != HAMMING_STEP or sender not in self.sizes or sender == self.party_id:
            raise ProtocolError(f"{sender!r} sent a {step!r} message, which peers never send")
        return self.hamming.payload_limit(sender)  # A's slices, or a piece

    # --- layout ------------------------------------------------------------------------------

    def _from_coordinator(self, message: wire.Message) -> None:
        payload = message.payload
        if message.step in (LAYOUT_MSG, GRAPH_MSG):
            rows = self._layout(payload, message.step)
            if message.step == LAYOUT_MSG:
                sizes = {p: n for p, n in rows.items() if n}
                self.stage = Laid(sizes) if isinstance(self.stage, (Joined, Laid)) else replace(self.stage, sizes=sizes)
                self._check_size()
            elif isinstance(self.stage, Joined) or isinstance(self.stage, Laid) and not self.hamming.done:
                raise ProtocolError("the coordinator sent the graph layout before this party's SecureHamming pairs "
                                    "were done")
            else:
                kept = None if isinstance(self.stage, Laid) else self._graph_again()
                graph = tuple((p, n) for p, n in rows.items() if n)
                scores = self._scores_of(self.y, graph)
                # the coordinator solves and sends them block by block (§10.2): the wait is the solve
                self.stage = Receiving(self.stage.sizes, graph, scores, None if self.released_y is None else
                                       self._scores_of(self.released_y, graph),
                                       Meter("influence columns", scores.expected, self.progress,
                                             unit="columns received", lines=4, bar=True), kept)
                self.ctx.checkpoint()  # past SecureHamming: the run state goes
        elif message.step == PAIRS_MSG:
            self.hamming.on_pairs(payload)
        elif message.step == KEPT_PAIRS_MSG:
            self.hamming.on_kept(payload, message.round)
        elif message.step == PAIRS_FROM_MSG:
            self.hamming.on_from(payload, message.round)
        elif message.step == INFLUENCE_MSG:
            self._influence(payload)
        elif message.step == ROWSUMS_RESULT_MSG:
            self._result(payload, message.round)
        else:
            raise ProtocolError(f"the coordinator sent an unknown {message.step!r} message")
        if message.step in (LAYOUT_MSG, GRAPH_MSG, PAIRS_MSG):  # public, one for all
            self.ctx.transcript.absorb(message.step, payload)
        elif message.step in (KEPT_PAIRS_MSG, PAIRS_FROM_MSG):  # one per restart
            self.ctx.transcript.absorb(f"{message.step}.{message.round}", payload)

    def _layout(self, payload: wire.Payload, what: str) -> dict[str, int]:
        ids = self.roster.party_ids
        if not isinstance(payload, np.ndarray) or payload.dtype != ROWS_DTYPE or payload.shape != (len(ids),):
            raise ProtocolError(f"the {what} message must be {ROWS_DTYPE}[{len(ids)}]")
        rows = {p: int(n) for p, n in zip(ids, payload)}
        if rows[self.party_id] != self.X.shape[0]:
            raise ProtocolError(f"the {what} message gives this party {rows[self.party_id]} rows, not "
                                f"{self.X.shape[0]}")
        # docs/design.md §2.5: every party signed its row count in its key bundle; a layout with other counts
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

    # --- influence and SecureRowSums (docs/design.md §5.5-5.7) ------------------------------------------

    def _influence(self, payload: wire.Payload) -> None:
        """One piece of this party's influence columns (docs/design.md §5.5, §10.2), folded into Z̄ at once.
        Only in Receiving: the graph layout came, so SecureHamming is behind (protocol order: no graph
        without this party's distances)."""
        stage = self.stage
        if isinstance(stage, Whole):  # (a party without labeled rows is complete with one empty piece)
            raise ProtocolError("the coordinator sent more influence columns than this party has")
        if not isinstance(stage, Receiving):
            raise ProtocolError("the coordinator sent an influence block before the graph layout, which comes once "
                                "this party's SecureHamming pairs are done")
        influence = stage.scores
        piece = steps.influence_piece(payload, influence.zbar.shape[0], self.params.alpha, self.params.tolerance)
        stage.digest.update(np.ascontiguousarray(payload).tobytes())  # the row sums' definition
        try:
            influence.add(piece)
            if stage.released is not None:
                stage.released.add(piece)
        except InvalidInput as exc:
            raise ProtocolError(f"the coordinator sent a malformed influence block: {exc}") from None
        stage.meter.update(influence.received)
        if not influence.complete:
            return
        block, privacy, approximation = stage.digest.digest(), None, None
        if stage.kept is not None and stage.kept[0] == block:
            zbar = stage.kept[1]  # the same columns again: the same Z̄, label-DP noise included
        elif self.params.label_dp:
            zbar, privacy = xclp_state.label_dp_release(stage, self.params, self.party_id, self.X.shape[0],
                                                        self.ctx.account, self.progress)
        else:
            zbar = influence.zbar
        if self.params.tolerance:
            approximation = {"influence_tolerance": self.params.tolerance, **influence.approximation}
            self.progress(f"influence columns pushed to tolerance {self.params.tolerance:g}: each class of Z̄ keeps "
                          f"at least {1 - influence.dropped[0]:.1%} of its degree-weighted mass")
        self.stage = Whole(stage.sizes, stage.graph, block, zbar, privacy, approximation)
        self.ctx.checkpoint()  # what a restarted process rejoins SecureRowSums with (client/jobs/xclp_state.py)

    def _graph_again(self) -> tuple[bytes, Zbar] | None:
        """A restarted coordinator sends the graph layout again, and solves and sends the influence
        columns again (server/resume.py), before this party revealed its row sums: the columns are
        taken again from the first; if they are the same (their digest), the Z̄ made of them before
        (label-DP noise included) is what SecureRowSums' next attempt masks, under fresh masks."""
        if self.row_sums.self_masks.revealed:
            raise ProtocolError("the coordinator sent the graph layout again after this party revealed its row "
                                "sums: SecureRowSums is opened once")
        self.progress("the graph layout again (the coordinator restarted): its influence columns come again")
        stage = self.stage
        if isinstance(stage, Whole):
            return stage.block, stage.zbar
        return stage.kept if isinstance(stage, Receiving) else None

    def _scores_of(self, y: np.ndarray, graph: tuple[tuple[str, int], ...]) -> steps.InfluenceScores:
        return steps.InfluenceScores(y, self.params.n_classes, sum(n for _, n in graph),
                                     hide_label_mask=self.params.hide_label_mask,
                                     normalise_labels=self.params.normalise_labels,
                                     own=RowLayout.of(graph).rows(self.party_id)
                                     if self.params.label_dp and self.params.label_dp_mechanism == "skellam" else None)

    def privacy(self) -> dict[str, Any] | None:
        """With label-DP: what this party's labels spent (one release; a restart resends it)."""
        stage = self.stage
        if not isinstance(stage, Whole) or stage.label_privacy is None:
            return None
        return {"label_dp": True, "epsilon_budget": self.params.label_dp_epsilon, **stage.label_privacy}

    def _row_sum_releases(self, members: tuple[str, ...]) -> list[Release]:
        """Without label-DP the row sums are exact: Z̄ = S_L Y_L under the influence the coordinator
        sent (its digest names the function; the labels are the data's)."""
        block = self._whole("every influence column").block
        return [Release(function_id("row-sums", block, self.params.label_norm, str(self.params.n_classes)),
                        "XCLP's row sums of its labels under one influence block")]

    def _encoded_row_sums(self, members: tuple[str, ...]) -> np.ndarray:
        """Z̄ on the frame of this attempt's participants, in the ring (docs/design.md §5.6)."""
        stage = self._whole("the influence block")
        return steps.encode_row_sums(stage.zbar, stage.graph, members, self.fixed_point)

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

    def _whole(self, what: str) -> Whole:
        """The Whole stage, or ProtocolError if the coordinator moved on before sending `what`."""
        if not isinstance(self.stage, Whole):
            raise ProtocolError(f"the coordinator moved on before sending {what}")
        return self.stage

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.started:.1f}s {self.since}"


    def predictions(self) -> tuple[np.ndarray, np.ndarray]:
        """Labels int64[n_j] and confidences float64[n_j] (docs/design.md §5.7)."""
        if self.result is None:
            raise ProtocolError("no scores yet")
        return steps.predict(self.result)

