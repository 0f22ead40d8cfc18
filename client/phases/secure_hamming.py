"""A party's side of SecureHamming (docs/protocol.md, Scott et al. 2023 §3.1): its pairs as A and as B.

Streamed (xclp.v1.secure_hamming_wire): as B this party evaluates A's slices one piece of A's
batches at a time, a bounded window ahead of A's acknowledgements, and sends the coordinator only a
mask seed per pair; as A it decrypts each piece as it arrives and sends its t on. Neither side
keeps a pair's ciphertexts, t or masks beyond the pieces in flight. A restart (a peer dropped, or
the coordinator restarted) goes on with every pair of the rest from the first piece the
coordinator has not folded, with fresh seeds (the pairs-from message says where each starts, or,
from a coordinator of the version before, the kept-pairs message which pairs it skips whole;
roles stay as drawn in the first attempt; A's encrypted slices are kept and sent again). Every
relay is sealed for its pair, attempt and direction (xclp.v1.relay). Heavy Paillier work runs on
the context's executor (xclp/workers.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sized
from concurrent.futures import CancelledError
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from xclp.candidates import PairSchedule, a_slots
from xclp.client.context import PartyContext
from xclp.client.jobs.estimate import check_scheduled_work
from xclp.client.phases.centres import CandidateCentres
from xclp.client.steps import xclp as steps
from xclp.crypto.paillier import PaillierKeypair, PaillierPublicKey
from xclp.crypto.secure_hamming import EncryptedSlices, SlotLayout, draw_mask_seed
from xclp.errors import InvalidInput, ProtocolError, XclpError
from xclp.progress import Meter
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.bundles import paillier_key
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
    piece_values,
    pieces,
    relay_bytes,
)
from xclp.v1.xclp import HAMMING_STEP, PAIRS_DTYPE, PAIRS_KEPT_DTYPE, XclpJobParams
from xclp.v1.xclp_layout import PairTask, pairs_table, parts_of
from xclp.workers import worker_count

T = TypeVar("T")


def _need(value: T | None, what: str) -> T:
    """`value`, or ProtocolError if the coordinator started a step before sending it."""
    if value is None or (isinstance(value, Sized) and len(value) == 0):
        raise ProtocolError(f"the coordinator moved on before sending {what}")
    return value


@dataclass
class _AsA:
    """A pair where this party is A: B's pieces arrive in order; `received` of them decrypted and sent on."""

    task: PairTask
    pieces: tuple[Piece, ...]
    index: int  # the pair's position in the pairs message
    meter: Meter  # its pieces decrypted
    first: int = 0  # the pieces before it were folded in an earlier attempt
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
    schedule: PairSchedule | None = None  # on candidate pairs (docs/design.md §10.3): what it evaluates
    first: int = 0  # the pieces before it were folded in an earlier attempt
    sent: int = 0
    acked: int = 0


class SecureHammingParty:
    """This party's SecureHamming: the pairs message, each attempt's pairs as A and B, the sealed
    relays between them. `sizes` gives the layout's rows per party; `elapsed` says how long the
    job has run (for the progress line when the pairs are done)."""

    def __init__(self, ctx: PartyContext, params: XclpJobParams, keypair: PaillierKeypair, rows: int,
                 sizes: Callable[[], dict[str, int]], candidates: CandidateCentres | None,
                 elapsed: Callable[[], str]) -> None:
        self.ctx, self.params, self.keypair, self.rows, self.progress = ctx, params, keypair, rows, ctx.progress
        self._sizes, self.candidates, self.elapsed = sizes, candidates, elapsed
        self.codes: np.ndarray | None = None  # this party's LSH codes, once computed
        self.pairs: tuple[PairTask, ...] = ()
        # (attempt, pair position -> the piece it starts from, None: skipped whole): the pairs-from or
        # kept-pairs message before a restart
        self.kept: tuple[int, dict[int, int | None]] = (0, {})
        self.skipped: frozenset[int] = frozenset()  # this attempt's pairs skipped whole
        self.attempt: int | None = None
        self.members: tuple[str, ...] = ()
        self.slices: bytes | None = None  # this party's encrypted bit slices, sent to each B of every attempt
        self.as_a: dict[str, _AsA] = {}  # this attempt's pairs where it is A, by B
        self.as_b: dict[str, _AsB] = {}  # ... and where it is B, by A
        self.slices_due: list[str] = []  # Bs of this attempt still to get the slices, one after another
        self.done = False  # every pair of the attempt done here
        self.meter: Meter | None = None  # every piece of the attempt's pairs, evaluated or decrypted here
        self.at_work = False  # evaluating or decrypting a piece (`superseded` may end that work)
        self.superseded_at: int | None = None  # the last attempt a later one made useless (`superseded`)

    @property
    def sizes(self) -> dict[str, int]:
        return self._sizes()

    def payload_limit(self, sender: str) -> int:
        """What a relayed message from `sender` can need: A's slices, or one piece."""
        rows = self.sizes[sender] if self.candidates is None else self.candidates.slots_of(sender)
        return relay_bytes(SlotLayout(self.params.key_bits, self.params.lsh_bits), rows)

    def on_pairs(self, payload: wire.Payload) -> None:
        """The "pairs" message: uint64[m, 2] roster positions (A, B) of every pair, each pair of
        parties once; or uint64[m, 3] with each pair's ciphertexts per piece (FINE_PIECES), at least 1
        and at most a piece of PIECE_BYTES."""
        ids = self.ctx.roster.party_ids
        if (not isinstance(payload, np.ndarray) or payload.dtype != PAIRS_DTYPE or payload.ndim != 2
                or payload.shape[1] not in (2, 3)):
            raise ProtocolError(f"the pairs message must be {PAIRS_DTYPE}[m, 2] or [m, 3]")
        if payload.size and int(payload[:, :2].max()) >= len(ids):
            raise ProtocolError("the pairs message names a party outside the roster")
        most = piece_values(SlotLayout(self.params.key_bits, self.params.lsh_bits))
        if payload.shape[1] == 3 and payload.size and not 1 <= int(payload[:, 2].min()) <= int(payload[:, 2].max()) \
                <= most:
            raise ProtocolError(f"the pairs message cuts a pair into pieces of other than 1 to {most} ciphertexts")
        pairs = tuple(PairTask(ids[int(row[0])], ids[int(row[1])], int(row[2]) if len(row) == 3 else 0)
                      for row in payload)
        unordered = [frozenset((t.a, t.b)) for t in pairs]
        if any(len(u) != 2 for u in unordered) or len(set(unordered)) != len(unordered):
            raise ProtocolError("the pairs message repeats a pair or pairs a party with itself")
        self.pairs = pairs

    def saved(self) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """What a restarted process goes on from (client/jobs/xclp_state.py): from the pairs on, the
        pairs, the attempt, its encrypted bit slices once it has them and, on candidate pairs, the
        opened probe table; None before the pairs, or before that table is opened."""
        if not self.pairs:
            return None
        arrays = {"pairs": pairs_table(self.pairs, self.ctx.roster.party_ids)}
        if self.slices is not None:
            arrays["slices"] = np.frombuffer(self.slices, dtype=np.uint8)
        meta: dict[str, Any] = {"attempt": self.attempt}
        if self.candidates is not None:
            if self.candidates.opened is None:
                return None
            meta["table_members"] = list(self.candidates.opened[1])
            arrays["table"] = self.candidates.opened[0]
        return meta, arrays

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray], codes: np.ndarray) -> None:
        """`saved` read back into this new role with its LSH `codes` (recomputed from the data and
        the seed): waiting for the attempt the restart starts."""
        self.codes = codes
        self.on_pairs(arrays["pairs"])
        self.attempt = None if meta["attempt"] is None else int(meta["attempt"])
        if "slices" in arrays:
            self.slices = arrays["slices"].tobytes()
        if self.candidates is not None:
            self.candidates.reopen(arrays["table"], tuple(meta["table_members"]))

    def on_kept(self, payload: wire.Payload, attempt: int) -> None:
        """The kept-pairs message before restart `attempt`: uint8[m], 1 for the pairs it skips."""
        _need(self.pairs, "the SecureHamming pairs")
        if (not isinstance(payload, np.ndarray) or payload.dtype != PAIRS_KEPT_DTYPE
                or payload.shape != (len(self.pairs),) or int(payload.max(initial=0)) > 1 or attempt < 1):
            raise ProtocolError(f"the kept-pairs message must be {PAIRS_KEPT_DTYPE}[{len(self.pairs)}] of 0 and 1, "
                                "before a restart")
        self.kept = (attempt, dict.fromkeys((int(i) for i in np.flatnonzero(payload)), None))

    def on_from(self, payload: wire.Payload, attempt: int) -> None:
        """The pairs-from message before restart `attempt`: uint64[m], per pair the piece it starts
        from (checked against the pair's pieces at the start)."""
        _need(self.pairs, "the SecureHamming pairs")
        if (not isinstance(payload, np.ndarray) or payload.dtype != PAIRS_DTYPE or payload.shape != (len(self.pairs),)
                or attempt < 1):
            raise ProtocolError(f"the pairs-from message must be {PAIRS_DTYPE}[{len(self.pairs)}], before a restart")
        self.kept = (attempt, {int(i): int(payload[i]) for i in np.flatnonzero(payload)})

    def start(self, attempt: int, members: tuple[str, ...]) -> None:
        """A new attempt: every pair of this party among `members` starts from its first piece.

        As B this party draws a fresh mask seed per pair and sends it to the coordinator first; as
        A it sends its encrypted bit slices (encrypted once, for every attempt) to each B."""
        codes = _need(self.codes, "LSH codes")
        _need(self.pairs, "the SecureHamming pairs")
        self.attempt, self.members, self.done = attempt, members, False
        starts = self.kept[1] if self.kept[0] == attempt else {}
        self.skipped = frozenset(i for i, first in starts.items() if first is None)
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
            parts = all_pairs(layout, self.sizes[t.a], self.sizes[t.b], t.piece_values) if schedule is None else \
                pieces(layout, schedule.counts().tolist(), t.piece_values)
            first = starts.get(index[t]) or 0
            if first > len(parts):
                raise ProtocolError(f"the pairs-from message starts pair {t.a}->{t.b} at piece {first} of "
                                    f"{len(parts)}")
            if first == len(parts):  # folded whole before
                self.skipped |= {index[t]}
                continue
            what = f"SecureHamming pair {t.a}->{t.b}"
            if t.a == self.ctx.party_id:
                self.as_a[t.b] = _AsA(t, parts, index[t], Meter(what, len(parts), self.progress,
                                                                unit="pieces decrypted", lines=4), first, first)
            else:
                self.as_b[t.a] = _AsB(t, parts, index[t], draw_mask_seed(),
                                      Meter(what, len(parts), self.progress, unit="pieces evaluated", lines=4),
                                      schedule=schedule, first=first, sent=first, acked=first)
        mine = self._my_pairs()
        count = sum(len(a.pieces) - a.first for a in self.as_a.values()) + \
            sum(len(b.pieces) - b.first for b in self.as_b.values())
        carried = sum(a.first for a in self.as_a.values()) + sum(b.first for b in self.as_b.values())
        kept = ", ".join(([f"{len(self.skipped)} pairs"] if self.skipped else [])
                         + ([f"{carried} pieces of others"] if carried else []))
        kept = f"; {kept} kept from before" if kept else ""
        self.progress(f"SecureHamming attempt {attempt}: {len(mine)} pairs, A in {len(self.as_a)} "
                      f"({', '.join(f'{t.a}->{t.b}' for t in mine)}); {count} pieces{kept}")
        self.meter = Meter(f"SecureHamming, {len(mine)} pair{'s' * (len(mine) != 1)}", count, self.progress,
                           bar=True)
        if self.candidates is not None:  # the schedule's work, counted now that it is known
            check_scheduled_work(self.keypair, self.params.lsh_bits, self.candidates.slots_of(self.ctx.party_id)
                                 if self.as_a and self.slices is None else 0,
                                 sum(p.values for a in self.as_a.values() for p in a.pieces[a.first:]),
                                 sum(p.values for b in self.as_b.values() for p in b.pieces[b.first:]), self.rows,
                                 {p: n for p, n in self.sizes.items() if p != self.ctx.party_id}, self._workers(),
                                 self.ctx.work_limits, self.progress)
        for pair in self.as_b.values():  # the seeds first: the coordinator unmasks A's t with them
            self.ctx.push(HammingUpload(Upload.SEED, pair.index, 0, pair.seed).to_array(), HAMMING_STEP, attempt)
        if self.as_a:
            if self.slices is None:
                t0 = time.monotonic()
                if self.candidates is not None:  # its centre lists, padded, in full batches (docs/design.md §10.3)
                    slots = self.candidates.slots_of(self.ctx.party_id)
                    schedule = self.candidates.schedule(self.ctx.party_id, self.ctx.party_id)  # its slots alone matter
                    codes = steps.slot_codes(codes, a_slots(schedule, self.candidates.lists()).ravel()[:slots])
                self.slices = steps.hamming_encrypt(self.keypair, codes, self.params.lsh_bits, self.ctx.executor)
                self.progress(f"encrypted {self.params.lsh_bits} bit slices of {self.rows} rows "
                              f"({len(self.slices)} bytes) in {time.monotonic() - t0:.1f}s")
            # one B at a time (docs/design.md §10.1): the next once this one answers with its first piece, so
            # the coordinator holds one copy of the slices in its mailboxes, not one per peer
            self.slices_due = list(self.as_a)
            self._send_slices()
        self._maybe_done()

    def _send_slices(self) -> None:
        if self.slices_due:
            assert self.slices is not None
            self._relay(Relay.SLICES, 0, self.slices, self.slices_due.pop(0))

    def on_message(self, message: wire.Message) -> None:
        if message.round != self.attempt or message.sender not in self.members or (
                self.superseded_at is not None and message.round <= self.superseded_at):
            return  # a message of an abandoned attempt (or of one a later attempt, not begun here yet, ends)
        if not isinstance(message.payload, bytes):
            raise ProtocolError("SecureHamming ciphertexts must be opaque bytes")
        self._pair_with(message.sender)
        # docs/design.md §2.2: from that peer, for us, this attempt; kind and index authenticated with it
        kind, index, body = open_relay(self._open(message.payload, message.round, message.sender))
        self.at_work = True
        try:
            if message.sender in self.as_b:
                self._as_b(self.as_b[message.sender], kind, index, body)
            else:
                self._as_a(self.as_a[message.sender], kind, index, body)
        except (BrokenProcessPool, CancelledError):
            if self.superseded_at is None or message.round > self.superseded_at:
                raise
            self.progress(f"SecureHamming attempt {message.round}: its work in flight ended, a later attempt began")
            return
        finally:
            self.at_work = False
        self._maybe_done()

    def superseded(self, step: pb.StepStart) -> None:
        """From the Pull stream's thread: a later attempt has started (a party dropped or restarted).
        If this party evaluates or decrypts a piece of this one, its Paillier tasks end now
        (LocalPool.abandon), not when done (at 3 x 4 000 rows both cores ran 16-34 s more for a
        dead attempt), and what is still queued for it is skipped rather than evaluated or
        decrypted. Its encryption, which every attempt reuses, is never ended."""
        if step.step != HAMMING_STEP or self.attempt is None or step.round <= self.attempt:
            return
        # every attempt up to this one is over: what is still queued for it is skipped, and a
        # failed task of its is no error
        self.superseded_at = self.attempt
        abandon = getattr(self.ctx.executor, "abandon", None)
        if abandon is not None and self.at_work:
            abandon()

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
        """Evaluate and send the next pieces, up to the window ahead of A's acknowledgements, one piece
        at a time with every worker on it: pieces finish, and the coordinator folds them, one after
        another, so a fault half-way through a pair loses the pieces in flight, not the pair (several
        pieces evaluated together, one worker each, all finished near the end together)."""
        workers, window = self._workers(), self._window()
        while pair.sent < len(pair.pieces) and pair.sent - pair.acked < window:
            codes = _need(self.codes, "LSH codes")
            assert pair.slices is not None and pair.a_key is not None
            piece = pair.pieces[pair.sent]
            if pair.schedule is not None and self.candidates is not None:  # batch by batch
                out = steps.evaluate_scheduled(pair.a_key, pair.slices, codes, pair.schedule, self.candidates.lists(),
                                               piece, pair.seed, self.ctx.executor, split=workers)
            else:  # its batches against all of B's rows, or one batch's slice of them
                rows = piece.b_rows(len(codes))
                out = steps.evaluate_piece(pair.a_key, pair.slices, codes[rows.start : rows.stop], piece.batches,
                                           piece.first, pair.seed, self.ctx.executor,
                                           split=-(-workers // len(piece.batches)))
            self._relay(Relay.PIECE, pair.sent, out, pair.task.a)
            pair.sent += 1
            pair.meter.update(pair.sent)
            self._tell_progress()

    def _as_a(self, pair: _AsA, kind: Relay, index: int, body: bytes) -> None:
        """B's pieces in order: decrypt each into t for the coordinator, then acknowledge it to B."""
        if kind != Relay.PIECE or index != pair.received or index >= len(pair.pieces):
            raise ProtocolError(f"{pair.task.b!r} sent {kind.name} {index} where piece {pair.received} of "
                                f"{len(pair.pieces)} was due: dropped, replayed or reordered on the way")
        if index == pair.first:  # B has the slices: the next B may have them
            self._send_slices()
        t = steps.decrypt_piece(self.keypair, body, pair.pieces[index].values, self.ctx.executor)
        attempt = _need(self.attempt, "the SecureHamming step")
        self.ctx.push(HammingUpload(Upload.T, pair.index, index, t).to_array(), HAMMING_STEP, attempt)
        pair.received += 1
        if pair.received < len(pair.pieces):  # B needs no word about the last one
            self._relay(Relay.ACK, index, b"", pair.task.b)
        pair.meter.update(pair.received)
        self._tell_progress()

    def _tell_progress(self) -> None:
        """The attempt's pieces done here, over all pairs: a bar on a terminal, a line every tenth elsewhere."""
        if self.meter is not None:
            self.meter.update(sum(p.received - p.first for p in self.as_a.values())
                              + sum(p.sent - p.first for p in self.as_b.values()))

    def _workers(self) -> int:
        return worker_count(self.ctx.executor)

    def _window(self) -> int:
        """Pieces of a pair B keeps sent and unacknowledged (A decrypts some while B evaluates the next),
        within the coordinator's bound."""
        return max(1, min(MAX_IN_FLIGHT, 2 * self._workers()))

    def _relay(self, kind: Relay, index: int, body: bytes, peer: str) -> None:
        attempt = _need(self.attempt, "the SecureHamming step")
        self.ctx.push(self._seal(frame_relay(kind, index, body), attempt, peer), HAMMING_STEP, attempt, recipient=peer)

    def _sealed(self, attempt: int, sender: str, recipient: str) -> Sealed:
        """A SecureHamming relay's binding (xclp.v1.relay): the pair's key for this attempt, the
        step, attempt, sender and recipient in the AAD."""
        return Sealed.of(HAMMING_STEP, HAMMING_STEP, attempt, (sender, recipient), sender, recipient)

    def _seal(self, payload: bytes, attempt: int, recipient: str) -> bytes:
        masker = self.ctx.masker
        return self._sealed(attempt, self.ctx.party_id, recipient).seal(masker.secrets[recipient], masker.session_id,
                                                                   payload)

    def _open(self, sealed: bytes, attempt: int, sender: str) -> bytes:
        """The relayed payload, or ProtocolError: the coordinator may drop a relay, never forge,
        replay, reflect or redirect one."""
        masker = self.ctx.masker
        try:
            return self._sealed(attempt, sender, self.ctx.party_id).open(masker.secrets[sender], masker.session_id,
                                                                     sealed)
        except XclpError:
            raise ProtocolError(f"a SecureHamming message said to come from {sender!r} does not open: forged, "
                                "replayed or redirected on the way") from None

    def _maybe_done(self) -> None:
        """Every pair of this attempt is done here: all pieces evaluated (as B) and decrypted (as A)."""
        if self.done or self.attempt is None:
            return
        if any(p.received < len(p.pieces) for p in self.as_a.values()) or \
                any(p.sent < len(p.pieces) for p in self.as_b.values()):
            return
        self.done = True
        self._tell_progress()  # (no pieces at all: still a line that it is done)
        self.progress(f"SecureHamming done ({self.elapsed()})")

    def _my_pairs(self) -> tuple[PairTask, ...]:
        """This party's pairs of the attempt: among its members, but those the coordinator keeps."""
        mine = parts_of(self.pairs, self.ctx.party_id, self.members)
        return mine if not self.skipped else tuple(t for t in mine if self.pairs.index(t) not in self.skipped)

    def _pair_with(self, peer: str) -> PairTask:
        for task in self._my_pairs():
            if peer in (task.a, task.b):
                return task
        raise ProtocolError(f"{peer!r} is not a SecureHamming partner of {self.ctx.party_id!r} in this attempt")

    def _peer_key(self, peer: str) -> PaillierPublicKey:
        try:
            return paillier_key(self.ctx.roster.bundle(peer), self.params.key_bits,
                                allow_insecure=self.params.insecure_test_keys)
        except InvalidInput as exc:
            raise ProtocolError(f"a peer's key bundle is unusable: {exc}") from None
