"""The XCLP job on the coordinator (DESIGN §5, paper 003 Alg. 1): its phases and its program.

The math lives in `server.steps.xclp`; the phases here move, check and route payloads. In order
(payload dtype/shape per party j, n_j rows):

    coordinator -> all   "layout"          uint64[P]  rows per roster party (0 = not in the job)
    intra_hamming        j -> coordinator  uint32[n_j, k', 2] own k' = min(k, n_j − 1) nearest rows
                                           (row, distance) per row, never the n_j × n_j block (§10.1)
    coordinator -> all   "pairs"           uint64[m, 2] roster positions (A, B) of every pair (§5.3)
    secure_hamming       streamed per pair in pieces of A's batches (§10.1, xclp.v1.secure_hamming_wire):
                         A -> B (relayed)  sealed bytes: encrypted bit slices of A's codes; then an
                                           acknowledgement per piece
                         B -> coordinator  uint8[16 + 32]: the pair's mask seed (B's masks R derive from it)
                         B -> A (relayed)  sealed bytes: the evaluated ciphertexts of one piece
                         A -> coordinator  uint8[16 + |piece|·|N|/8]: t of one piece, one big-endian
                                           value mod N per ciphertext
    labeled_sets         j -> coordinator  int64[l_j] (skipped with hide_label_mask)    (§5.5)
    coordinator -> j     "graph"           uint64[P]  rows per roster party in H (0 = left)
    coordinator -> j     "influence"       float64[n, c] pieces of ≤ 4 MiB, in j's column order, making up
                                           S_L^{(j)} float64[n, l_j] (float64[n, n_j] if hidden) (§5.5,
                                           §10.2: solved in blocks of columns, never all S_L at once)
    rowsums (masked sum) j -> coordinator  uint64[n_frame − n_j, C] double-masked row sums (§5.6, §6.1)
    coordinator -> j     "rowsums_result"  uint64[u_j, C] for j's u_j unlabeled rows (uint64[n_j, C] if hidden)

The coordinator never holds H (DESIGN §10.1): it folds each party's own nearest rows and each
piece of each pair, unmasked as A's t of it arrives, into per-row top-k candidates
(`steps.NeighbourGraph`), and builds the graph from those.

Dropouts (DESIGN §5, end), as transitions of `server.steps.xclp.Membership`: a party lost in
intra_hamming is as if it never joined; in secure_hamming its rows leave the graph and the step
restarts among the others, every pair afresh (roles stay as first drawn; the coordinator keeps no
per-pair state, so the pairs' Paillier work is done again); in labeled_sets it shaped the graph but
brings and gets no labels; in rowsums the masked sum restarts without it (MaskedSum).

`xclp_phases` is the whole protocol as a sub-program; the xclp job runs it once among all parties,
a fedavg job with pseudo_label = "xclp" once per training round among the round's parties.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from xclp.candidates import PairSchedule, a_slots, b_rows, centre_lists, choose_probes, folded, membership
from xclp.crypto.secure_hamming import SlotLayout
from xclp.errors import InvalidInput, PeerDropped, ResourceExhausted, XclpError
from xclp.graph import InfluenceSolver, SolveStats, normalise
from xclp.memory import default_max_memory, gib
from xclp.progress import Meter
from xclp.server.jobs.base import CoordinatorJob
from xclp.server.mailbox import Party
from xclp.server.phases.base import Phase, PhaseFailed, Program, Scope, Step
from xclp.server.phases.masked_sum import MaskedSum, SumResult, ring_array
from xclp.server.steps import xclp as steps
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.centres import PROBE_TABLE_STEP, PROBES_STEP, table_shape
from xclp.v1.secure_hamming_wire import (
    MAX_IN_FLIGHT,
    HammingUpload,
    Piece,
    Upload,
    all_pairs,
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
    ROWSUMS_RESULT_MSG,
    ROWSUMS_STEP,
    XclpJobParams,
    influence_piece_columns,
    label_dp_line,
    own_neighbours_shape,
    solve_columns,
)
from xclp.v1.xclp_layout import PairTask

if TYPE_CHECKING:
    from xclp.server.run import Run

log = logging.getLogger("xclp.server")
Dump = Callable[[str, np.ndarray], None]  # test hook: what the coordinator saw, by file name


@dataclass
class CandidateRun:
    """Candidate pairs of one run (DESIGN §10.3): the probes per row the pooled table allows, every
    party's public budgets, and, as they arrive, each party's centre lists and centre sets."""

    probes: int
    budgets: dict[str, np.ndarray]
    fraction: float
    lists: dict[str, list[np.ndarray]] = field(default_factory=dict)
    members: dict[str, np.ndarray] = field(default_factory=dict)

    def schedule(self, a: str, b: str, slots: int) -> PairSchedule:
        return PairSchedule.of(self.budgets[a], self.budgets[b], slots)


@dataclass
class XclpState:
    """What one XCLP run holds between its phases."""

    params: XclpJobParams
    roster: tuple[str, ...]  # every party that joined, sorted: layouts and pairs index it
    sizes: dict[str, int]  # rows per roster party
    moduli: dict[str, int]  # each roster party's Paillier N, from its signed bundle
    membership: steps.Membership
    pairs: tuple[PairTask, ...] = ()  # roles drawn once, at the first secure_hamming attempt
    own: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # each party's nearest rows
    graph_layout: steps.RowLayout | None = None  # the rows of the graph, once SecureHamming is done
    W: sp.csr_matrix | None = None  # the kNN adjacency (DESIGN §5.4): n·k entries, never H
    solve: SolveStats | None = None  # how the influence columns were solved (DESIGN §10.2)
    labeled: dict[str, np.ndarray] = field(default_factory=dict)
    dump: Dump | None = None
    dim: int = 0  # the prepared features' dimension (candidate pairs' centres)
    candidates: CandidateRun | None = None  # DESIGN §10.3, once the probe table is pooled

    @classmethod
    def of(cls, params: XclpJobParams, parties: Mapping[str, Party], members: list[str],
           dump: Dump | None = None, dim: int = 0) -> XclpState:
        roster = tuple(sorted(parties))
        return cls(params, roster, {p: int(parties[p].summary.rows) for p in roster},
                   {p: int.from_bytes(parties[p].bundle.paillier_n, "big") for p in roster},
                   steps.start_membership(tuple(members)), dump=dump, dim=dim)

    @property
    def layout(self) -> SlotLayout:
        """The slot layout of every pair: A's key has the job's key_bits (checked at join)."""
        return SlotLayout(self.params.key_bits, self.params.lsh_bits)

    def drop(self, parties: set[str], stage: steps.XclpStage) -> None:
        for pid in sorted(parties):
            self.membership = steps.drop_party(self.membership, pid, stage)  # PeerDropped: nobody left
        log.info("XCLP: %s dropped in %s; graph: %s; labels: %s", ", ".join(sorted(parties)), stage.value,
                 ", ".join(self.membership.graph), ", ".join(self.membership.labels))

    def frame(self, participants: tuple[str, ...]) -> steps.RowLayout:
        """The rows of SecureRowSums among `participants`, in the graph's order (DESIGN §5.6)."""
        assert self.graph_layout is not None
        return steps.rowsums_frame(self.graph_layout, participants)

    def rows(self, parties: tuple[str, ...]) -> np.ndarray:
        """uint64[P] rows per roster party, 0 for those not in `parties` (messages "layout", "graph")."""
        return np.array([self.sizes[p] if p in parties else 0 for p in self.roster], dtype=np.uint64)


def xclp_phases(scope: Scope, state: XclpState) -> Program[tuple[str, ...]]:
    """One XCLP run among `state.membership` in `scope`; returns the parties that got their row sums."""
    graph = state.membership.graph
    scope.broadcast(LAYOUT_MSG, 0, state.rows(graph), to=graph)
    yield IntraHamming(scope, state)
    if state.params.candidates:
        yield from _candidates(scope, state)
    yield SecureHamming(scope, state)
    if not state.params.hide_label_mask:
        yield LabeledSets(scope, state)
    _distribute(scope, state)
    total: SumResult = yield _row_sums(scope, state)
    # less any lost before the sum; one lost while revealing is in it (its seed rebuilt) but gets nothing
    got = tuple(p for p in total.participants if p in scope.members)
    state.membership = dataclasses.replace(state.membership, labels=got)
    for pid in got:
        block = total.value[pid]
        # DESIGN §5.5: Z only for the receiver's unlabeled rows (all rows if the mask is hidden)
        rows = slice(None) if state.params.hide_label_mask else steps.unlabeled_rows(state.sizes[pid],
                                                                                    state.labeled[pid])
        scope.send(pid, ROWSUMS_RESULT_MSG, total.attempt, np.ascontiguousarray(block[rows]))
    return got


def coordinator_memory_limit() -> int:
    """What an XCLP run may use on this coordinator: three quarters of its RAM (0: unknown, no limit)."""
    return default_max_memory()


def _candidates(scope: Scope, state: XclpState) -> Program[None]:
    """Candidate pairs' set-up (DESIGN §10.3): the centres are drawn from the parties' common seed
    (nothing about them is released, xclp.v1.centres); the pooled probe table, a verifiable masked
    sum (every party recomputes it, so none takes a count on the coordinator's word), from which
    every side picks the same probes and budgets; then each party's probes. A party lost in the sum
    leaves the run."""
    p = state.params
    total: SumResult = yield MaskedSum(scope, PROBE_TABLE_STEP, wire=(np.dtype(np.uint64),
                                                                      table_shape(p.centres, p.probes)),
                                       what="probe table", participants=state.membership.graph, verifiable=True)
    lost = set(state.membership.graph) - set(total.participants)
    if lost:  # its rows leave the run as if it never joined
        state.drop(lost, steps.XclpStage.SETUP)
    sizes = {q: state.sizes[q] for q in state.membership.graph}
    try:
        probes, budgets, fraction = choose_probes(total.value, sizes, list(itertools.permutations(sizes, 2)),
                                                  state.layout.slots, p.budget_slack, p.pair_budget)
    except InvalidInput as exc:
        raise PhaseFailed(f"candidate pairs: {exc}", pb.JobEnd.REFUSED) from None
    state.candidates = CandidateRun(probes, budgets, fraction)
    log.info("job %s: candidate pairs: %d centres, %d probes per row, %.1f%% of all pairs' ciphertexts",
             scope.run.config.job_id, p.centres, probes, 100 * fraction)
    yield Probes(scope, state)


class XclpJob(CoordinatorJob[XclpJobParams]):
    """One XCLP run among every party of the job."""

    xclp: XclpState | None = None

    def check_start(self, parties: Mapping[str, Party]) -> None:
        """Refuse, before any Paillier work, a job the joined parties' rows cannot run."""
        super().check_start(parties)
        sizes = [int(p.summary.rows) for p in parties.values()]
        rows, p = sum(sizes), self.params
        if p.k > rows - 1:
            raise InvalidInput(f"k = {p.k} neighbours need at least {p.k + 1} rows in all, but the "
                               f"{len(parties)} parties bring {rows}: lower k in the job file")
        need, limit = steps.coordinator_bytes(sizes, SlotLayout(p.key_bits, p.lsh_bits), p.k, p.n_classes,
                                              p.slots_per_row), \
            coordinator_memory_limit()
        log.info("XCLP: %d rows of %d parties; the coordinator's estimate is %s", rows, len(sizes), gib(need))
        if limit and need > limit:
            raise InvalidInput(f"this XCLP run would need about {gib(need)} on the coordinator ({rows} rows of "
                               f"{len(sizes)} parties, k = {p.k}), above its limit of {gib(limit)} (three quarters "
                               "of its RAM): fewer rows per party (max_rows_per_party, max_total_rows), a smaller k, "
                               "or a coordinator with more memory")

    def program(self, run: Run) -> Program[str]:
        self.xclp = XclpState.of(self.params, run.parties, run.scope.members, self._dump, run.dim)
        labelled = yield from xclp_phases(run.scope, self.xclp)
        return f"labels propagated for {len(labelled)} parties over {self.xclp.frame(labelled).n} rows"

    def summary(self) -> dict[str, Any]:
        state, p = self.xclp, self.params
        return {"rows": dict(state.sizes) if state else {},
                "graph_parties": list(state.membership.graph) if state else [],
                "label_parties": list(state.membership.labels) if state else [],
                "influence": state.solve.as_dict() if state and state.solve else {},
                "candidates": {"probes": state.candidates.probes, "ciphertext_fraction": state.candidates.fraction}
                if state and state.candidates else {},
                "params": {"lsh_bits": p.lsh_bits, "k": p.k, "key_bits": p.key_bits,
                           "hide_label_mask": p.hide_label_mask, "label_norm": p.label_norm,
                           "pair_budget": p.pair_budget},
                **({"privacy": {"label_dp_epsilon": p.label_dp_epsilon, "mechanism": p.label_dp_mechanism,
                                "delta": p.label_dp_delta or 0.0, "line": label_dp_line(p)}} if p.label_dp else {})}

    def _dump(self, name: str, arr: np.ndarray) -> None:
        """Test hook (JobConfig refuses it unless XCLP_TESTING=1): what the coordinator saw."""
        directory = self.config.debug_dump_dir
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            np.save(directory / name, arr)


# --- the phases ---------------------------------------------------------------------------------


class _EachParty(Phase):
    """One step in which every participant sends one contribution, kept in `received()`. A party
    lost in it leaves the run at `stage`, and the others' contributions stay valid: the step waits
    for the rest only."""

    step_name = ""
    stage = steps.XclpStage.SETUP

    def __init__(self, scope: Scope, state: XclpState) -> None:
        super().__init__(scope)
        self.state = state

    def participants(self) -> tuple[str, ...]:
        return self.state.membership.graph

    def received(self) -> tuple[dict[str, Any], ...]:
        """Where `accept` keeps each sender's contribution (forgotten if the sender is lost)."""
        raise NotImplementedError

    def start(self) -> None:
        self.scope.start_step(self.step_name, self.participants())

    def on_step_complete(self, step: Step) -> None:
        self.done()

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        try:
            self.state.drop(dropped, self.stage)
        except PeerDropped as exc:
            self.fail(str(exc))
            return
        step.pending -= dropped
        for pid in dropped:
            step.received.pop(pid, None)
            for kept in self.received():
                kept.pop(pid, None)
        if not step.pending:
            self.run.end_step(step)
            self.done()


class IntraHamming(_EachParty):
    """Every party's own k nearest rows (DESIGN §5.2, §10.1). A party lost here is as if it never joined."""

    step_name = INTRA_STEP

    def received(self) -> tuple[dict[str, Any], ...]:
        return (self.state.own,)

    def payload_limit(self, sender: str, step: Step, recipient: str) -> int:
        return wire.array_bytes(np.dtype(np.uint32),
                                own_neighbours_shape(self.state.sizes.get(sender, 0), self.state.params.k))

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        if not isinstance(payload, np.ndarray):
            raise InvalidInput(f"the own nearest rows of {sender!r} must be an array")
        state = self.state
        state.own[sender] = steps.check_own_neighbours(payload, state.sizes[sender], state.params.k,
                                                       state.params.lsh_bits)


class Probes(_EachParty):
    """Each party's first p probes per row (DESIGN §10.3): its centre lists and centre sets follow
    from them and the public budgets. A party lost here is as if it never joined."""

    step_name = PROBES_STEP

    def received(self) -> tuple[dict[str, Any], ...]:
        assert self.state.candidates is not None
        return (self.state.candidates.lists, self.state.candidates.members)

    def payload_limit(self, sender: str, step: Step, recipient: str) -> int:
        assert self.state.candidates is not None
        return wire.array_bytes(np.dtype(np.uint16), (self.state.sizes.get(sender, 0), self.state.candidates.probes))

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        state, run = self.state, self.state.candidates
        assert run is not None
        n, want = state.sizes[sender], (state.sizes[sender], run.probes)
        if not isinstance(payload, np.ndarray) or payload.dtype != np.uint16 or payload.shape != want:
            raise InvalidInput(f"the probes of {sender!r} must be uint16{list(want)}")
        probes = payload.astype(np.int64)
        ordered = np.sort(probes, axis=1)
        if probes.size and (probes.max() >= state.params.centres or np.any(ordered[:, 1:] == ordered[:, :-1])):
            raise InvalidInput(f"the probes of {sender!r} must be distinct centres below {state.params.centres}")
        run.lists[sender] = centre_lists(probes, run.probes, run.budgets[sender])
        run.members[sender] = membership(run.lists[sender], n, run.probes)


@dataclass
class _PairStream:
    """The coordinator's view of one pair in one attempt (xclp.v1.secure_hamming_wire)."""

    task: PairTask
    pieces: tuple[Piece, ...]
    seed: bytes | None = None  # B's mask seed
    folded: int = 0  # pieces of t unmasked and folded, in order
    schedule: PairSchedule | None = None  # on candidate pairs (DESIGN §10.3): what B evaluates
    slots: np.ndarray | None = None  # ... and A's row in each slot (candidates.a_slots)


class SecureHamming(Phase):
    """Paillier SecureHamming of every pair (DESIGN §5.3), streamed in pieces (§10.1): each piece is
    unmasked with B's seeded masks and folded into the graph as A's t arrives, then dropped."""

    relays = True

    def __init__(self, scope: Scope, state: XclpState) -> None:
        super().__init__(scope)
        self.state = state
        self.attempt = 0
        self.streams: dict[int, _PairStream] = {}  # by the pair's position in state.pairs
        self.graph: steps.NeighbourGraph | None = None
        self.error: str | None = None  # a piece's values were malformed: the step fails once it is over
        self.meter: Meter | None = None  # pieces folded in this attempt, for job show and the log

    def start(self) -> None:
        state = self.state
        if not state.pairs:
            state.pairs = steps.secure_hamming_pairs(state.membership.graph)
            position = {p: i for i, p in enumerate(state.roster)}
            table = np.array([[position[t.a], position[t.b]] for t in state.pairs], dtype=np.uint64).reshape(-1, 2)
            self.scope.broadcast(PAIRS_MSG, 0, table, to=state.membership.graph)
        members = set(state.membership.graph)
        self.streams = {i: self._stream_of(t) for i, t in enumerate(state.pairs) if t.a in members and t.b in members}
        self.error = None
        layout = steps.RowLayout(state.membership.graph, tuple(state.sizes[p] for p in state.membership.graph))
        try:  # every attempt folds afresh: a lost party's rows may have pushed others' candidates out
            self.graph = steps.NeighbourGraph(layout, state.own, state.params.lsh_bits, state.params.graph_params)
        except XclpError as exc:  # k no longer below the rows left
            self.fail(f"the graph cannot be built among {', '.join(layout.parties)}: {exc}")
            return
        self.scope.start_step(HAMMING_STEP, state.membership.graph, self.attempt)
        self.meter = _meter(self.scope, "SecureHamming", sum(len(s.pieces) for s in self.streams.values()),
                            "pieces folded")

    def _stream_of(self, task: PairTask) -> _PairStream:
        state, layout = self.state, self.state.layout
        if state.candidates is None:
            return _PairStream(task, all_pairs(layout, state.sizes[task.a], state.sizes[task.b]))
        schedule = state.candidates.schedule(task.a, task.b, layout.slots)
        return _PairStream(task, pieces(layout, schedule.counts().tolist()), schedule=schedule,
                           slots=a_slots(schedule, state.candidates.lists[task.a]))

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
            return len(stream.pieces)
        acked = max(0, step.relays[(recipient, sender)] - 1)
        return min(len(stream.pieces), acked + MAX_IN_FLIGHT)

    def check_relay(self, step: Step, sender: str, recipient: str, payload: wire.Payload) -> None:
        """Slices and acknowledgements go from A to B, pieces from B to A (DESIGN §5.3). A sends its
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
        if self.error is not None or self.graph is None:
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
            self.error = str(exc)

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
            if self.error is not None:
                raise InvalidInput(self.error)
            state.W = graph.adjacency()
        except XclpError as exc:
            self.fail(f"step {step.wire!r} failed: {exc}")
            return
        state.graph_layout = graph.layout
        if state.dump is not None:  # the test hook: the graph, as csr arrays
            for part in ("data", "indices", "indptr"):
                state.dump(f"W-{part}.npy", getattr(state.W, part))
        log.info("XCLP: graph of %d rows of %d parties folded (%d candidates per row, %d edges)", graph.layout.n,
                 len(graph.layout.parties), graph.top.k, state.W.nnz)
        self.done()

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        try:
            self.state.drop(dropped, steps.XclpStage.SECURE_HAMMING)
        except PeerDropped as exc:
            self.fail(str(exc))
            return
        self.attempt += 1
        self.start()  # among the rest, every pair afresh

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
            elif step.relays[(a, b)] == 0 or step.relays[(b, a)] > s.folded:  # A's slices, or a piece at A
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


class LabeledSets(_EachParty):
    """Each party's labeled row numbers (DESIGN §5.5). A party lost here shaped the graph but
    brings and gets no labels."""

    step_name, stage = LABELS_STEP, steps.XclpStage.GRAPH

    def participants(self) -> tuple[str, ...]:
        return self.state.membership.labels

    def received(self) -> tuple[dict[str, Any], ...]:
        return (self.state.labeled,)

    def start(self) -> None:
        self.state.labeled = {}
        super().start()

    def payload_limit(self, sender: str, step: Step, recipient: str) -> int:
        return 8 * self.state.sizes.get(sender, 0)

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        count, n = int(self.run.parties[sender].summary.labeled_rows), self.state.sizes[sender]
        idx = ring_array(payload, np.dtype(np.int64), (count,), f"the labeled rows of {sender!r}")
        if count and (idx[0] < 0 or idx[-1] >= n or np.any(np.diff(idx) <= 0)):
            raise InvalidInput(f"the labeled rows of {sender!r} must be ascending and in 0..{n - 1}")
        self.state.labeled[sender] = idx


def _distribute(scope: Scope, state: XclpState) -> None:
    """The graph layout, then each receiver's S_L^{(j)} (DESIGN §5.4-5.5) solved `solve_columns(n)`
    columns at a time and sent on in pieces as each block is solved (§10.2)."""
    assert state.W is not None and state.graph_layout is not None
    p, membership, layout = state.params, state.membership, state.graph_layout
    started = scope.run.clock()
    labeled = None if p.hide_label_mask else state.labeled
    columns = steps.influence_columns_of(layout, membership.labels, labeled=labeled)
    solver = InfluenceSolver(normalise(state.W), p.graph_params.alpha, p.influence_method)
    scope.broadcast(GRAPH_MSG, 0, state.rows(membership.graph), to=membership.graph)
    piece = influence_piece_columns(layout.n)
    meter = _meter(scope, "influence", sum(c.size for c in columns.values()), "columns solved", work="influence")
    for pid, cols in columns.items():
        if cols.size == 0:  # a receiver without labeled rows still hears that its S_L is empty
            scope.send(pid, INFLUENCE_MSG, 0, np.zeros((layout.n, 0)))
        for start in range(0, cols.size, solve_columns(layout.n)):
            block = solver.solve(cols[start : start + solve_columns(layout.n)])
            for at in range(0, block.shape[1], piece):
                scope.send(pid, INFLUENCE_MSG, 0, np.ascontiguousarray(block[:, at : at + piece]))
            meter.update(meter.done + block.shape[1])
            # the next block once this one is (nearly) on its way: the mailboxes never hold all of S_L
            if not scope.wait_for_delivery(pid, steps.INFLUENCE_BACKLOG_BYTES):
                # not reading for a step's deadline: the rest of its columns are neither solved nor
                # queued, and it will miss SecureRowSums as any silent party does
                log.warning("job %s: party %s is not reading its influence columns; the rest are not sent",
                            scope.run.config.job_id, pid)
                break
    state.solve = solver.stats
    scope.run.ledger.record("graph", scope.run.clock() - started)
    log.info("XCLP: %d influence columns solved (%s, %d blocks, at most %d iterations, residual %.1e)",
             solver.stats.columns, solver.stats.method, solver.stats.blocks, solver.stats.iterations,
             solver.stats.max_residual)


def _meter(scope: Scope, what: str, total: int, unit: str, *, work: str = "") -> Meter:
    """A meter of the coordinator's part of a long step: its progress in `xclp-server job show`
    (the current step's, or `work`'s between steps), a log line at every tenth."""
    job_id = scope.run.config.job_id
    meter = Meter(what, total, lambda line: log.info("job %s: %s", job_id, line), unit=unit,
                  clock=scope.run.clock)
    scope.report(meter.describe, work=work)
    return meter


def _row_sums(scope: Scope, state: XclpState) -> MaskedSum:
    """SecureRowSums (paper 003 §3.2) as a masked sum whose contributions leave out the sender's rows.
    Its reveal digests bind the step's own name in every scope: in a training round the round's
    session id binds the round (client/jobs/xclp.py does the same; v0.1 parties did so)."""
    C = state.params.n_classes

    def shape(sender: str, participants: tuple[str, ...]) -> tuple[np.dtype[Any], tuple[int, ...]]:
        frame = state.frame(participants)
        own = frame.rows(sender)
        return np.dtype(np.uint64), (frame.n - (own.stop - own.start), C)

    def combine(opened: Mapping[str, np.ndarray], participants: tuple[str, ...]) -> dict[str, np.ndarray]:
        if state.dump is not None:
            for pid, arr in opened.items():
                state.dump(f"rowsums-{pid}.npy", arr)
        return steps.sum_row_sums(state.frame(participants), opened, C)

    return MaskedSum(scope, ROWSUMS_STEP, wire=shape, what="row sums", participants=state.membership.labels,
                     combine=combine, digest_name=ROWSUMS_STEP)
