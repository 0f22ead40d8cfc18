"""SecureHamming on the coordinator (docs/protocol.md, Scott et al. 2023 §3.1): the phase that relays
every pair's sealed slices and evaluations, takes B's mask seeds and A's t piece by piece, and
folds each piece into the neighbour graph as it arrives (the coordinator never holds H).

A party dropped mid-step restarts the step among the rest. What the pairs among them folded stays
folded (the graph keeps its candidates per source party, steps.NeighbourGraph.among): a pair
folded whole is skipped, and one folded in part goes on from its first piece not folded, with a
fresh mask seed (message PAIRS_FROM_MSG, when every member understands it; to parties of the
version before, KEPT_PAIRS_MSG skips the whole pairs and the others start from their first
piece). A dropout costs the pieces in flight, not every pair."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from xclp.candidates import PairSchedule, a_slots, b_rows, folded
from xclp.errors import InvalidInput, PeerDropped, ResourceExhausted, XclpError
from xclp.progress import Meter
from xclp.server.phases.base import Phase, Scope, Step, attempt_after_restart
from xclp.server.phases.xclp_state import XclpState, step_meter
from xclp.server.steps import xclp as steps
from xclp.v1 import wire
from xclp.v1.secure_hamming_wire import (
    MAX_IN_FLIGHT,
    HammingUpload,
    Piece,
    Upload,
    all_pairs,
    fine_piece_values,
    pieces,
    relay_bytes,
)
from xclp.v1.xclp import (
    FINE_PIECES,
    HAMMING_STEP,
    KEEPS_PAIRS,
    KEEPS_PIECES,
    KEPT_PAIRS_MSG,
    PAIRS_DTYPE,
    PAIRS_FROM_MSG,
    PAIRS_KEPT_DTYPE,
    PAIRS_MSG,
)
from xclp.v1.xclp_layout import PairTask, pairs_table

log = logging.getLogger("xclp.server")


@dataclass
class _PairStream:
    """The coordinator's view of one pair in one attempt (xclp.v1.secure_hamming_wire)."""

    task: PairTask
    pieces: tuple[Piece, ...]
    first: int = 0  # pieces folded in an earlier attempt: this one starts at this piece
    seed: bytes | None = None  # B's mask seed (this attempt's)
    folded: int = 0  # pieces of t unmasked and folded, in order, counting the earlier attempts'
    schedule: PairSchedule | None = None  # on candidate pairs (docs/design.md §10.3): what B evaluates
    slots: np.ndarray | None = None  # ... and A's row in each slot (candidates.a_slots)


class SecureHamming(Phase):
    """Paillier SecureHamming of every pair (docs/design.md §5.3), streamed in pieces (§10.1): each piece is
    unmasked with B's seeded masks and folded into the graph as A's t arrives, then dropped."""

    relays = True

    def __init__(self, scope: Scope, state: XclpState) -> None:
        super().__init__(scope)
        self.state = state
        self.attempt = 0
        self.streams: dict[int, _PairStream] = {}  # by the pair's position in state.pairs
        self.graph: steps.NeighbourGraph | None = None
        # by pair position: a piece's values were malformed; the step fails once it is over, unless a
        # restart starts that pair again from its first piece (or leaves it out)
        self.errors: dict[int, str] = {}
        self.meter: Meter | None = None  # pieces folded in this attempt, for job show and the log

    def saved(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """What a restarted coordinator needs to go on (server/resume.py): the attempt, the pieces of
        each pair folded so far and the graph's candidates per source party (O(n·k), never H; copies)."""
        assert self.graph is not None
        kept = {i: s for i, s in self.streams.items() if s.folded and i not in self.errors}
        meta = {"attempt": self.attempt, "folded": {str(i): s.folded for i, s in kept.items()},
                "pieces": {str(i): len(s.pieces) for i, s in kept.items()},
                "whole": [sorted(pair) for pair in self.graph.pairs], "parties": list(self.graph.layout.parties)}
        arrays = {f"{part}.{p}": getattr(top, part).copy() for p, top in self.graph.tops.items()
                  for part in ("sim", "idx")}
        return meta, arrays

    @classmethod
    def restored(cls, scope: Scope, state: XclpState, meta: dict[str, Any],
                 arrays: dict[str, np.ndarray]) -> SecureHamming:
        """The phase `saved` wrote, to start its next attempt from what it had folded, at the attempt
        `attempt_after_restart` gives."""
        phase = cls(scope, state)
        parties = tuple(meta["parties"])
        graph = steps.NeighbourGraph(steps.RowLayout(parties, tuple(state.sizes[p] for p in parties)), None,
                                     state.params.lsh_bits, state.params.graph_params)
        for p, top in graph.tops.items():
            for part in ("sim", "idx"):
                saved = arrays[f"{part}.{p}"]
                if saved.shape != getattr(top, part).shape:
                    raise InvalidInput(f"the saved candidates of {p!r} have shape {saved.shape}, not "
                                       f"{getattr(top, part).shape}")
                getattr(top, part)[...] = saved
        graph.pairs = {frozenset(pair) for pair in meta["whole"]}
        phase.graph = graph
        phase.streams = {int(i): phase._stream_of(state.pairs[int(i)], int(f)) for i, f in meta["folded"].items()}
        for i, stream in phase.streams.items():  # pieces cut as this version cuts them
            if len(stream.pieces) != int(meta["pieces"][str(i)]) or stream.first > len(stream.pieces):
                raise InvalidInput(f"the checkpoint cuts pair {i} into {meta['pieces'][str(i)]} pieces, this "
                                   f"coordinator into {len(stream.pieces)}")
        phase.attempt = attempt_after_restart(int(meta["attempt"]), len(parties))
        return phase

    def start(self) -> None:
        state = self.state
        if not state.pairs:
            pairs = steps.secure_hamming_pairs(state.membership.graph)
            if self.scope.capable(set(state.membership.graph), FINE_PIECES):  # pieces fold one after another
                pairs = tuple(replace(t, piece_values=fine_piece_values(state.layout, self._values(t))) for t in pairs)
            state.pairs = pairs
            self.scope.broadcast(PAIRS_MSG, 0, pairs_table(state.pairs, state.roster), to=state.membership.graph)
        members = set(state.membership.graph)
        carried = self._carried(members)  # pair position -> its pieces folded before this attempt
        among = {i: self._stream_of(t, carried.get(i, 0)) for i, t in enumerate(state.pairs)
                 if t.a in members and t.b in members}
        self.streams = {i: s for i, s in among.items() if s.first < len(s.pieces)}
        self.errors = {}
        layout = steps.RowLayout(state.membership.graph, tuple(state.sizes[p] for p in state.membership.graph))
        keep = {frozenset((state.pairs[i].a, state.pairs[i].b)) for i in carried}
        try:
            self.graph = self.graph.among(layout, keep) if keep and self.graph is not None else steps.NeighbourGraph(
                layout, state.own, state.params.lsh_bits, state.params.graph_params)
        except XclpError as exc:  # k no longer below the rows left
            self.fail(f"the graph cannot be built among {', '.join(layout.parties)}: {exc}")
            return
        if carried:
            whole = len(among) - len(self.streams)
            if self.scope.capable(members, KEEPS_PIECES):
                first = np.array([among[i].first if i in among else 0 for i in range(len(state.pairs))],
                                 dtype=PAIRS_DTYPE)
                self.scope.broadcast(PAIRS_FROM_MSG, self.attempt, first, to=state.membership.graph)
            else:
                flags = np.array([i in among and i not in self.streams for i in range(len(state.pairs))],
                                 dtype=PAIRS_KEPT_DTYPE)
                self.scope.broadcast(KEPT_PAIRS_MSG, self.attempt, flags, to=state.membership.graph)
            log.info("XCLP: SecureHamming attempt %d keeps %d pairs folded whole and %d pieces of %d others",
                     self.attempt, whole, sum(s.first for s in self.streams.values()),
                     sum(s.first > 0 for s in self.streams.values()))
        step = self.scope.start_step(HAMMING_STEP, state.membership.graph, self.attempt)
        busy = {p for s in self.streams.values() for p in (s.task.a, s.task.b)}
        step.pending &= busy  # a member whose pairs are all kept owes nothing (it hears the step, and is done)
        self.meter = step_meter(self.scope, "SecureHamming",
                                sum(len(s.pieces) - s.first for s in self.streams.values()), "pieces folded")
        self.complete_if_done(step)  # every pair kept

    def _carried(self, members: set[str]) -> dict[int, int]:
        """Per pair among `members` (its position), the pieces folded in earlier attempts that this one
        keeps: all of a pair folded whole, and, when every member can go on from a piece, those of a
        pair folded in part; none for parties that can skip no pair."""
        if self.graph is None or not self.scope.capable(members, KEEPS_PAIRS):
            return {}
        by_piece = self.scope.capable(members, KEEPS_PIECES)
        carried = {}
        for i, t in enumerate(self.state.pairs):
            if not {t.a, t.b} <= members:
                continue
            before = self.streams.get(i)
            if i in self.errors:  # what it folded may be wrong: it starts again, its candidates left out
                continue
            if frozenset((t.a, t.b)) in self.graph.pairs:
                carried[i] = len(before.pieces) if before is not None else len(self._stream_of(t).pieces)
            elif by_piece and before is not None and before.folded > 0:
                carried[i] = before.folded
        return carried

    def _stream_of(self, task: PairTask, first: int = 0) -> _PairStream:
        state, layout = self.state, self.state.layout
        if state.candidates is None:
            return _PairStream(task, all_pairs(layout, state.sizes[task.a], state.sizes[task.b], task.piece_values),
                               first, folded=first)
        schedule = state.candidates.schedule(task.a, task.b, layout.slots)
        return _PairStream(task, pieces(layout, schedule.counts().tolist(), task.piece_values), first, folded=first,
                           schedule=schedule, slots=a_slots(schedule, state.candidates.lists[task.a]))

    def _values(self, task: PairTask) -> int:
        """The ciphertexts of a pair in all: ⌈n_A/K⌉·n_B, or its candidate schedule's."""
        state, layout = self.state, self.state.layout
        if state.candidates is None:
            return layout.values(state.sizes[task.a], state.sizes[task.b])
        return int(state.candidates.schedule(task.a, task.b, layout.slots).counts().sum())

    def payload_limit(self, sender: str, step: Step, recipient: str) -> int:
        """Bounds from the row counts (or a candidate schedule's slots) and the slot layout: slices,
        one piece, an acknowledgement."""
        layout, state = self.state.layout, self.state
        if recipient:  # A's slices, or one piece
            rows = state.sizes.get(sender, 0) if state.candidates is None else int(
                state.candidates.budgets.get(sender, np.zeros(1, np.int64)).sum())
            return relay_bytes(layout, rows)
        return HammingUpload.limit(layout)

    def relay_limit(self, step: Step, sender: str, recipient: str) -> int:
        """A to B: the slices and an acknowledgement per piece but the last; B to A: its pieces, at most
        MAX_IN_FLIGHT ahead of A's acknowledgements (so what waits here for A stays bounded)."""
        stream = self._stream(sender, recipient)
        if sender == stream.task.a:
            return len(stream.pieces) - stream.first
        acked = max(0, step.relays[(recipient, sender)] - 1)
        return min(len(stream.pieces) - stream.first, acked + MAX_IN_FLIGHT)

    def check_relay(self, step: Step, sender: str, recipient: str, payload: wire.Payload) -> None:
        """Slices and acknowledgements go from A to B, pieces from B to A (docs/design.md §5.3). A sends its
        slices to one B at a time (§10.1): to the next once the last answered with a piece, so the
        mailboxes hold at most one copy of each party's slices."""
        stream = self._stream(sender, recipient)
        if not isinstance(payload, bytes):
            raise InvalidInput("SecureHamming ciphertexts travel as opaque bytes")
        if sender == stream.task.a and step.relays[(sender, recipient)] == 0:
            unanswered = sorted(self._unanswered(step, sender))
            if unanswered:
                raise ResourceExhausted(f"{sender!r} sent its slices to {recipient!r} before {unanswered[0]!r} "
                                        "answered the slices it has: one B at a time")

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        upload = HammingUpload.from_array(payload)
        stream = self.streams.get(upload.pair)
        if stream is None:
            raise InvalidInput(f"pair {upload.pair} is not a SecureHamming pair of round {step.attempt}")
        task, state = stream.task, self.state
        if upload.kind == Upload.SEED:
            if sender != task.b or stream.seed is not None:
                raise InvalidInput(f"only B ({task.b!r}) sends the mask seed of pair ({task.a}, {task.b}), once")
            stream.seed = upload.data
            return
        if sender != task.a:
            raise InvalidInput(f"only A ({task.a!r}) sends t of pair ({task.a}, {task.b})")
        if stream.seed is None:
            raise InvalidInput(f"t of pair ({task.a}, {task.b}) before B's mask seed")
        if upload.piece != stream.folded or stream.folded >= len(stream.pieces):
            raise InvalidInput(f"piece {upload.piece} of pair ({task.a}, {task.b}) where piece {stream.folded} of "
                               f"{len(stream.pieces)} was due")
        piece, n_a, n_b = stream.pieces[stream.folded], state.sizes[task.a], state.sizes[task.b]
        what = f"t of piece {upload.piece} of pair ({task.a}, {task.b})"
        if stream.schedule is None:  # refused, not counted: A may still send it right
            steps.check_piece_t(upload.data, state.layout, piece, n_a, what)
        elif len(upload.data) != piece.values * state.layout.value_bytes:
            raise InvalidInput(f"{what} must be {piece.values} values of {state.layout.value_bytes} bytes, "
                               f"got {len(upload.data)} bytes")
        stream.folded += 1
        if self.meter is not None:
            self.meter.update(self.meter.done + 1)
        if upload.pair in self.errors or self.graph is None:  # the rest of a pair gone wrong is not folded
            return
        try:
            if stream.schedule is not None:
                self._fold_scheduled(stream, piece, upload.data)
            else:
                block = steps.cross_piece(upload.data, stream.seed, state.moduli[task.a], piece, n_a, n_b,
                                          state.params.lsh_bits)
                self.graph.fold_piece(task.a, task.b, piece.a_rows(state.layout, n_a).start,
                                      piece.b_rows(n_b).start, block)
            if stream.folded == len(stream.pieces):
                self.graph.pair_done(task.a, task.b)
        except XclpError as exc:  # out-of-range distances: nothing a restart would fix
            self.errors[upload.pair] = str(exc)

    def _fold_scheduled(self, stream: _PairStream, piece: Piece, t: bytes) -> None:
        """A piece of a pair on candidate pairs: each batch unmasked, what `folded` keeps folded."""
        state, task, run, graph = self.state, stream.task, self.state.candidates, self.graph
        assert stream.schedule is not None and stream.slots is not None and stream.seed is not None
        assert run is not None and graph is not None
        for g, entries, H in steps.scheduled_piece(t, stream.seed, state.moduli[task.a], piece, stream.schedule,
                                                   state.params.lsh_bits):
            every = b_rows(stream.schedule, run.lists[task.b], g)
            keep = folded(stream.schedule, g, stream.slots[g], every, run.members[task.a], run.members[task.b])
            width = H.shape[1]
            graph.fold_scheduled(task.a, task.b, stream.slots[g][:width], every[entries.start : entries.stop], H,
                                 keep[entries.start : entries.stop, :width])

    def owes(self, step: Step, sender: str) -> bool:
        """A party owes the seeds of its pairs as B and every piece of t of its pairs as A."""
        return any((s.task.b == sender and s.seed is None) or (s.task.a == sender and s.folded < len(s.pieces))
                   for s in self.streams.values())

    def on_step_complete(self, step: Step) -> None:
        state, graph = self.state, self.graph
        assert graph is not None
        try:
            if self.errors:
                raise InvalidInput(next(iter(self.errors.values())))
            state.W = graph.adjacency()
        except XclpError as exc:
            self.fail(f"step {step.wire!r} failed: {exc}")
            return
        state.graph_layout = graph.layout
        if state.dump is not None:  # the test hook: the graph, as csr arrays
            for part in ("data", "indices", "indptr"):
                state.dump(f"W-{part}.npy", getattr(state.W, part))
        log.info("XCLP: graph of %d rows of %d parties folded (%d candidates per row, %d edges)", graph.layout.n,
                 len(graph.layout.parties), graph.k, state.W.nnz)
        self.done()

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        try:
            self.state.drop(dropped, steps.XclpStage.SECURE_HAMMING)
        except PeerDropped as exc:
            self.fail(str(exc))
            return
        self.attempt += 1
        self.start()  # among the rest, the pairs not folded yet

    def on_restarted(self, step: Step, party: str) -> bool:
        """A party restarted from its sealed run state (its Paillier key, slices and seeds): the next
        attempt among the same members, every pair from its first piece not folded."""
        self.attempt += 1
        self.start()
        return True

    def blame(self, step: Step) -> set[str]:
        """Only those who owe the next message of an unfinished pair, not those waiting for them."""
        owes = dict.fromkeys(step.participants, False)
        waits = dict.fromkeys(step.participants, False)
        for s in self.streams.values():
            a, b = s.task.a, s.task.b
            if s.folded == len(s.pieces):
                continue
            if s.seed is None:
                owes[b] = True
            if step.relays[(a, b)] == 0 and self._unanswered(step, a):  # A's slices wait for another B
                waits[a], waits[b] = True, True
            elif step.relays[(a, b)] == 0 or step.relays[(b, a)] > s.folded - s.first:  # A's slices, or a piece at A
                owes[a], waits[b] = True, True
            else:  # B's next piece
                owes[b], waits[a] = True, True
        culprits = {p for p in step.pending if owes[p] or not waits[p]}
        return culprits or set(step.pending)

    def _unanswered(self, step: Step, a: str) -> set[str]:
        """The Bs that have `a`'s slices (relayed) and have not answered with a piece yet."""
        return {s.task.b for s in self.streams.values()
                if s.task.a == a and step.relays[(a, s.task.b)] > 0 and step.relays[(s.task.b, a)] == 0}

    def _stream(self, sender: str, recipient: str) -> _PairStream:
        for s in self.streams.values():
            if {s.task.a, s.task.b} == {sender, recipient}:
                return s
        raise InvalidInput(f"{sender!r} and {recipient!r} are not a SecureHamming pair")
