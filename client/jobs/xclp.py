"""A party's side of the XCLP job (DESIGN §5): reacts to the coordinator's steps and peer messages.

The math is in `client.steps.xclp`; this class keeps what the party holds between messages and
moves payloads (dtypes and shapes as in server/jobs/xclp.py). Heavy Paillier work runs on the
context's executor (client/workers.py). SecureRowSums is the party's masked-sum phase
(client/phases/masked_sum.py), which keeps the party's own masked rows back.

SecureHamming restarts (a peer dropped): roles stay as drawn in the first attempt, and this party
re-sends what it already computed (its encrypted slices, its evaluation and masks R for a pair,
its decrypted t) — the same bytes, so a restart reveals nothing new and costs no new Paillier work.
"""

from __future__ import annotations

import time
from collections.abc import Sized
from typing import TypeVar

import numpy as np

from xclp.client.context import PartyContext
from xclp.client.jobs.base import PartyJob
from xclp.client.jobs.estimate import OperationCosts, check_time, paillier_seconds
from xclp.client.phases.masked_sum import MaskedSumParty
from xclp.client.steps import xclp as steps
from xclp.crypto import aead
from xclp.crypto.fixedpoint import FixedPoint
from xclp.crypto.kdf import derive_key
from xclp.crypto.paillier import PaillierKeypair, PaillierPublicKey
from xclp.crypto.secure_hamming import SlotLayout
from xclp.errors import InvalidInput, ProtocolError, XclpError
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.bundles import paillier_key
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
from xclp.v1.xclp_layout import PairTask, parts_of

T = TypeVar("T")
RELAY_SLACK_BYTES = 4096  # a sealed relay's header and AEAD nonce and tag


class XclpParty(PartyJob):
    """The party's XCLP state machine; `on_step` / `on_message` are its transitions."""

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
        self.slices: bytes | None = None
        self.evaluated: dict[str, tuple[bytes, np.ndarray]] = {}  # by B: (evaluation, R)
        self.t: dict[str, np.ndarray] = {}  # by A: uint8[⌈n_A/K⌉·n_B, |N|/8]
        self.hamming_pushed = False
        self.zbar: np.ndarray | None = None  # Z̄ once every influence column is in
        self.influence: steps.InfluenceScores | None = None
        self.started = time.monotonic()
        # SecureRowSums: its parties bind the unscoped step name in the reveal digest (in a
        # training round too; the round's session id binds the round)
        self.row_sums = MaskedSumParty(ctx, ROWSUMS_STEP, self._encoded_row_sums, purpose=ROWSUMS_PURPOSE,
                                       withhold=self._own_rows, digest_name=ROWSUMS_STEP)

    def _check_size(self) -> None:
        """Estimate this party's Paillier work from the layout, before any of it (client/jobs/estimate.py)."""
        peers = {p: n for p, n in self.sizes.items() if p != self.party_id}
        executor, limit = self.ctx.executor, self.ctx.max_paillier_seconds
        if not peers or not limit:
            return
        workers = getattr(executor, "_max_workers", 1) if executor is not None else 1
        layout = SlotLayout.for_key(self.keypair.public, self.params.lsh_bits)
        seconds = paillier_seconds(OperationCosts.measure(self.keypair), layout, self.X.shape[0], peers, workers)
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
        # A's bit slices (⌈n_A/K⌉·L ciphertexts) or B's evaluation (⌈n_A/K⌉·n_B), 2|N|/8 bytes each
        peer = SlotLayout(self.params.key_bits, L)
        ciphertexts = max(peer.batches(self.sizes[sender]) * L, peer.batches(n_self) * self.sizes[sender])
        return ciphertexts * 2 * peer.value_bytes + RELAY_SLACK_BYTES

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
                self.influence = steps.InfluenceScores(self.y, self.params.n_classes, sum(n for _, n in self.graph),
                                                       hide_label_mask=self.params.hide_label_mask,
                                                       normalise_labels=self.params.normalise_labels)
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
        codes = self._need(self.codes, "LSH codes")
        self._need(self.pairs, "the SecureHamming pairs")
        self.hamming_attempt, self.hamming_members, self.hamming_pushed = attempt, members, False
        mine = self._my_pairs()
        as_a = [t for t in mine if t.a == self.party_id]
        self.progress(f"SecureHamming attempt {attempt}: {len(mine)} pairs, A in {len(as_a)} "
                      f"({', '.join(f'{t.a}->{t.b}' for t in mine)})")
        if as_a:
            if self.slices is None:
                t0 = time.monotonic()
                self.slices = steps.hamming_encrypt(self.keypair, codes, self.params.lsh_bits, self.ctx.executor)
                self.progress(f"encrypted {self.params.lsh_bits} bit slices of {self.X.shape[0]} rows "
                              f"({len(self.slices)} bytes) in {time.monotonic() - t0:.1f}s")
            for task in as_a:
                self._push(self._seal(self.slices, attempt, task.b), HAMMING_STEP, attempt, recipient=task.b)
        self._maybe_push_hamming()

    def _from_peer(self, message: wire.Message) -> None:
        if message.round != self.hamming_attempt or message.sender not in self.hamming_members:
            return  # a message of an abandoned attempt
        if not isinstance(message.payload, bytes):
            raise ProtocolError("SecureHamming ciphertexts must be opaque bytes")
        task = self._pair_with(message.sender)
        payload = self._open(message.payload, message.round, message.sender)  # DESIGN §2.2: from that peer, for us
        L = self.params.lsh_bits
        if task.b == self.party_id:  # we are B: evaluate A's slices (or re-send the evaluation)
            if task.a not in self.evaluated:
                t0 = time.monotonic()
                a_key = self._peer_key(task.a)
                self.evaluated[task.a] = steps.hamming_evaluate(a_key, payload, self._need(self.codes, "LSH codes"), L,
                                                                self.sizes[task.a], self.ctx.executor)
                self.progress(f"SecureHamming pair {task.a}->{task.b}: evaluated {self.X.shape[0]} x "
                              f"{self.sizes[task.a]} distances in {time.monotonic() - t0:.1f}s")
            self._push(self._seal(self.evaluated[task.a][0], message.round, task.a), HAMMING_STEP, message.round,
                       recipient=task.a)
        else:  # we are A: decrypt B's evaluation into t = (packed H + R) mod N
            if task.b not in self.t:
                t0 = time.monotonic()
                self.t[task.b] = steps.hamming_decrypt(self.keypair, payload, L, self.X.shape[0],
                                                       self.sizes[task.b], self.ctx.executor)
                self.progress(f"SecureHamming pair {task.a}->{task.b}: decrypted in {time.monotonic() - t0:.1f}s")
        self._maybe_push_hamming()

    def _relay_key(self, attempt: int, sender: str, recipient: str) -> tuple[bytes, bytes]:
        """(key, AAD) sealing a SecureHamming relay from `sender` to `recipient` (DESIGN §2.2): a pairwise
        HKDF key for this purpose, attempt and direction, with the session and step in the AAD."""
        peer = recipient if sender == self.party_id else sender
        masker = self.ctx.masker
        key = derive_key(masker.secrets[peer], session_id=masker.session_id,
                         purpose=f"relay:{HAMMING_STEP}:{sender}:{recipient}", attempt=attempt,
                         participants=(sender, recipient))
        return key, b"|".join((masker.session_id, HAMMING_STEP.encode(), sender.encode(), recipient.encode()))

    def _seal(self, payload: bytes, attempt: int, recipient: str) -> bytes:
        key, aad = self._relay_key(attempt, self.party_id, recipient)
        return aead.seal(key, payload, aad=aad)

    def _open(self, sealed: bytes, attempt: int, sender: str) -> bytes:
        """The relayed payload, or ProtocolError: the coordinator may drop a relay, never forge,
        replay, reflect or redirect one."""
        key, aad = self._relay_key(attempt, sender, self.party_id)
        try:
            return aead.open_sealed(key, sealed, aad=aad)
        except XclpError:
            raise ProtocolError(f"a SecureHamming message said to come from {sender!r} does not open: forged, "
                                "replayed or redirected on the way") from None

    def _maybe_push_hamming(self) -> None:
        """Once every pair of this attempt has its part here: t (as A) and R (as B), in pair order.

        Each part is uint8[⌈n_A/K⌉·n_B, |N|/8] (one value mod N per ciphertext D); all pairs use
        keys of the job's key_bits, so the parts stack into one uint8[m, key_bits/8] payload.
        """
        if self.hamming_pushed or self.hamming_attempt is None:
            return
        parts = []
        for task in self._my_pairs():
            if task.a == self.party_id:
                part = self.t.get(task.b)
            else:
                part = self.evaluated[task.a][1] if task.a in self.evaluated else None
            if part is None:
                return
            parts.append(np.ascontiguousarray(part, dtype=np.uint8))
        width = self.params.key_bits // 8
        rows = np.concatenate(parts) if parts else np.zeros((0, width), dtype=np.uint8)
        self._push(rows, HAMMING_STEP, self.hamming_attempt)
        self.hamming_pushed = True
        self.progress(f"SecureHamming done: {len(parts)} pairs ({self._elapsed()})")

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
        if influence.complete:
            raise ProtocolError("the coordinator sent more influence columns than this party has")
        if not isinstance(payload, np.ndarray) or payload.dtype != np.float64 or payload.ndim != 2 \
                or payload.shape[0] != n:
            raise ProtocolError(f"an influence piece must be float64[{n}, ...]")
        # S = (I − α𝒲)⁻¹ is entrywise non-negative and at most 1/(1 − α) (‖𝒲‖ ≤ 1)
        bound = 1.0 / (1.0 - self.params.alpha)
        if payload.min(initial=0.0) < 0 or payload.max(initial=0.0) > bound:
            raise ProtocolError(f"the influence block has values outside [0, 1/(1 - alpha)] = [0, {bound:g}]: not "
                                "an influence matrix")
        try:
            influence.add(payload)
        except InvalidInput as exc:
            raise ProtocolError(f"the coordinator sent a malformed influence block: {exc}") from None
        if influence.complete:
            self.zbar = influence.zbar
            self.progress(f"influence columns received: {influence.expected} columns of {n} rows")

    def _encoded_row_sums(self, members: tuple[str, ...]) -> np.ndarray:
        """Z̄ on the frame of this attempt's participants, in the ring (DESIGN §5.6)."""
        assert self.zbar is not None
        return steps.encode_row_sums(self.zbar, self.graph, members, self.fixed_point)

    def _own_rows(self, masked: np.ndarray, members: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        return steps.split_own_rows(masked, self.graph, members, self.party_id)

    def _result(self, payload: wire.Payload, attempt: int) -> None:
        kept = self.row_sums.kept.get(attempt)
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
