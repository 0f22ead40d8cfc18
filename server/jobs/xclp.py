"""The XCLP job on the coordinator (docs/design.md §5, Scott et al. 2023 Alg. 1): its phases and its program.

The math lives in `server.steps.xclp`; the phases here move, check and route payloads, whose
names, dtypes and shapes are the contract's: xclp/v1/xclp.py lists them in the order they happen.

The coordinator never holds H (docs/design.md §10.1): it folds each party's own nearest rows and each
piece of each pair, unmasked as A's t of it arrives, into per-row top-k candidates
(`steps.NeighbourGraph`), and builds the graph from those.

Dropouts (docs/design.md §5, end), as transitions of `server.steps.xclp.Membership`: a party lost in
intra_hamming is as if it never joined; in secure_hamming its rows leave the graph and the step
restarts among the others, every pair from its first piece not folded (roles stay as first drawn;
server/phases/secure_hamming.py); in labeled_sets it shaped the graph but
brings and gets no labels; in rowsums the masked sum restarts without it (MaskedSum).

`xclp_phases` is the whole protocol as a sub-program; the xclp job runs it once among all parties,
a fedavg job with pseudo_label = "xclp" once per training round among the round's parties. A run in
SecureHamming is saved for a coordinator that crashes (`XclpJob.saved`, server/resume.py) and goes
on from there when it starts again (`XclpJob.resumed`, `from_hamming`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from xclp.candidates import AUTO, budget_floor, choose_probes, crowding
from xclp.crypto.secure_hamming import SlotLayout
from xclp.errors import InvalidInput, PeerDropped
from xclp.memory import default_max_memory, gib
from xclp.server.jobs.base import CoordinatorJob
from xclp.server.mailbox import Party
from xclp.server.offload import ClusterSolver, InfluenceProblem, Solver
from xclp.server.phases.base import PhaseFailed, Program, Scope, Work, attempt_after_restart
from xclp.server.phases.each_party import IntraHamming, LabeledSets, Probes
from xclp.server.phases.masked_sum import MaskedSum, SumResult
from xclp.server.phases.secure_hamming import SecureHamming
from xclp.server.phases.xclp_state import CandidateRun, XclpState, step_meter
from xclp.server.steps import xclp as steps
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.centres import PROBE_TABLE_STEP, table_shape
from xclp.v1.influence import empty_piece, pack_pieces
from xclp.v1.xclp import (
    GRAPH_MSG,
    INFLUENCE_MSG,
    LAYOUT_MSG,
    PROBE_TABLE_DTYPE,
    ROW_SUMS_DTYPE,
    ROWSUMS_RESULT_MSG,
    ROWSUMS_STEP,
    SPARSE_INFLUENCE,
    XclpJobParams,
    influence_piece_columns,
    label_dp_line,
    solve_columns,
)

if TYPE_CHECKING:
    from xclp.server.run import Run

log = logging.getLogger("xclp.server")


def xclp_phases(scope: Scope, state: XclpState) -> Program[tuple[str, ...]]:
    """One XCLP run among `state.membership` in `scope`; returns the parties that got their row sums."""
    graph = state.membership.graph
    scope.broadcast(LAYOUT_MSG, 0, state.rows(graph), to=graph)
    yield IntraHamming(scope, state)
    if state.params.candidates:
        yield from _candidates(scope, state)
    return (yield from from_hamming(scope, state, SecureHamming(scope, state)))


def from_hamming(scope: Scope, state: XclpState, hamming: SecureHamming) -> Program[tuple[str, ...]]:
    """The run from SecureHamming on (`hamming`: its phase, new or as a restarted coordinator read it back)."""
    yield hamming
    return (yield from from_labels(scope, state))


def from_labels(scope: Scope, state: XclpState, attempt: int = 0) -> Program[tuple[str, ...]]:
    """The run from the graph SecureHamming folded on: each party's labeled rows (at `attempt`: a
    restarted coordinator's), then `from_graph`."""
    if not state.params.hide_label_mask:
        yield LabeledSets(scope, state, attempt)
    return (yield from from_graph(scope, state))


def from_graph(scope: Scope, state: XclpState, going_on: tuple[str, ...] | None = None,
               attempt: int = 0) -> Program[tuple[str, ...]]:
    """The run from the graph on: the influence solve and SecureRowSums, every party's row sums; a
    restarted coordinator's sum among `going_on` (those still in it) from `attempt` on."""
    yield Distribute(scope, state)
    total: SumResult = yield _row_sums(scope, state, going_on, attempt)
    # less any lost before the sum; one lost while revealing is in it (its seed rebuilt) but gets nothing
    got = tuple(p for p in total.participants if p in scope.members)
    state.membership = dataclasses.replace(state.membership, labels=got)
    for pid in got:
        block = total.value[pid]
        # docs/design.md §5.5: Z only for the receiver's unlabeled rows (all rows if the mask is hidden)
        rows = slice(None) if state.params.hide_label_mask else steps.unlabeled_rows(state.sizes[pid],
                                                                                    state.labeled[pid])
        scope.send(pid, ROWSUMS_RESULT_MSG, total.attempt, np.ascontiguousarray(block[rows]))
    return got


def coordinator_memory_limit() -> int:
    """What an XCLP run may use on this coordinator: three quarters of its RAM (0: unknown, no limit)."""
    return default_max_memory()


def _candidates(scope: Scope, state: XclpState) -> Program[None]:
    """Candidate pairs' set-up (docs/design.md §10.3): the centres are drawn from the parties' common seed
    (nothing about them is released, xclp.v1.centres); the pooled probe table, a verifiable masked
    sum (every party recomputes it, so none takes a count on the coordinator's word), from which
    every side picks the same probes and budgets; then each party's probes. A party lost in the sum
    leaves the run."""
    p = state.params
    total: SumResult = yield MaskedSum(scope, PROBE_TABLE_STEP, wire=(PROBE_TABLE_DTYPE,
                                                                      table_shape(p.centre_count, p.probes)),
                                       what="probe table", participants=state.membership.graph, verifiable=True)
    lost = set(state.membership.graph) - set(total.participants)
    if lost:  # its rows leave the run as if it never joined
        state.drop(lost, steps.XclpStage.SETUP)
    sizes = {q: state.sizes[q] for q in state.membership.graph}
    try:
        probes, budgets, fraction = choose_probes(total.value, sizes, list(itertools.permutations(sizes, 2)),
                                                  state.layout.slots, p.budget_slack, p.budget)
    except InvalidInput as exc:
        raise PhaseFailed(f"candidate pairs: {exc}", pb.JobEnd.REFUSED) from None
    state.candidates = CandidateRun(probes, budgets, fraction)
    log.info("job %s: candidate pairs: %d centres, %d probes per row, %.1f%% of all pairs' ciphertexts",
             scope.run.config.job_id, p.centre_count, probes, 100 * fraction)
    crowded = crowding(fraction, p.work_budget(sizes, state.layout.slots), p.centre_count) if p.budget == AUTO else ""
    if crowded:
        log.warning("job %s: candidate pairs: %s", scope.run.config.job_id, crowded)
    yield Probes(scope, state)


class XclpJob(CoordinatorJob[XclpJobParams]):
    """One XCLP run among every party of the job."""

    xclp: XclpState | None = None

    def check_start(self, parties: Mapping[str, Party]) -> None:
        """Refuse, before any Paillier work, a job the joined parties' rows cannot run."""
        super().check_start(parties)
        sizes = [int(p.summary.rows) for p in parties.values()]
        # an unset pair_budget from the joined parties' rows, as each party resolves it from the roster
        self.params = self.params.for_rows(sum(sizes))
        rows, p = sum(sizes), self.params
        old = sorted(q for q, party in parties.items() if SPARSE_INFLUENCE not in party.capabilities)
        if p.tolerance and old:
            raise InvalidInput(f"this run sends sparse influence columns (influence_tolerance = {p.tolerance:g}, "
                               f"{rows} rows in all), which the version of {', '.join(old)} does not read: upgrade "
                               "it, or set influence_tolerance = 0 in the job file (exact, dense columns)")
        if p.k > rows - 1:
            raise InvalidInput(f"k = {p.k} neighbours need at least {p.k + 1} rows in all, but the "
                               f"{len(parties)} parties bring {rows}: lower k in the job file")
        layout = SlotLayout(p.key_bits, p.lsh_bits)
        if p.candidates and p.pair_budget != AUTO:
            floor = budget_floor({q: int(party.summary.rows) for q, party in parties.items()}, layout.slots,
                                 p.centre_count, p.budget_slack)
            if float(p.budget) < floor:
                raise InvalidInput(f"pair_budget = {p.pair_budget:g} is below what these parties' rows allow: with "
                                   f"any data, candidate pairs cost at least {floor:.1%} of all pairs' ciphertexts "
                                   f"here (each of a party's rows is compared with at least one batch of "
                                   f"{layout.slots} of a peer's rows); raise pair_budget to {floor:.3g} or more, or "
                                   "set it to \"auto\" (one probe per row)")
        need, limit = steps.coordinator_bytes(sizes, layout, p.k, p.n_classes,
                                              p.slots_per_row, p.tolerance), \
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

    def saved(self, run: Run) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """What a restarted coordinator goes on from (server/resume.py), named by its resume point:
        "hamming", during SecureHamming, the state and the phase's folded pieces; "labels", in the
        labels step, the state and the graph (the labeled rows are asked again); "graph", from the
        influence solve until SecureRowSums asks for reveals, the state and the graph (the solve
        runs again, the sum at a later attempt); else None."""
        phase, step, state = run.phase, run.step, self.xclp
        if phase is None or phase.scope is not run.scope or state is None:
            return None
        if isinstance(phase, SecureHamming) and phase.graph is not None and phase.state is state:
            meta, arrays = state.saved()
            hamming, graph = phase.saved()
            return {"resume": "hamming", "state": meta, "hamming": hamming}, \
                arrays | {f"graph.{k}": v for k, v in graph.items()}
        in_sum = isinstance(phase, MaskedSum) and phase.name == ROWSUMS_STEP and not phase.opening and step is not None
        labels = isinstance(phase, LabeledSets) and step is not None
        if not (isinstance(phase, Distribute) or in_sum or labels):
            return None
        meta, arrays = state.saved()
        graph_meta, graph = state.graph_saved()
        if labels and step is not None:  # the labeled sets are asked again: those in so far are not kept
            W = {k: v for k, v in graph.items() if k.startswith("W.")}
            return {"resume": "labels", "state": meta, "graph": {**graph_meta, "labeled": []},
                    "labels": {"attempt": step.attempt}}, arrays | W
        going_on = {"attempt": step.attempt, "members": list(step.participants)} if in_sum and step else {}
        return {"resume": "graph", "state": meta, "graph": graph_meta, "rowsums": going_on}, arrays | graph

    def resumed(self, run: Run, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Program[str]:
        self.params = self.params.with_resolved(meta["state"]["params"])  # as check_start resolved them
        point = meta["resume"]  # where the run goes on: named when it was saved, never inferred
        if point not in ("hamming", "labels", "graph"):
            raise InvalidInput(f"an XCLP checkpoint names a resume point this version does not have: {point!r}")
        state = self.xclp = XclpState.restored(self.params, run.parties, meta["state"], arrays, self._dump)
        if point == "hamming":
            graph = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith("graph.")}
            hamming = SecureHamming.restored(run.scope, state, meta["hamming"], graph)
            labelled = yield from from_hamming(run.scope, state, hamming)
        elif point == "labels":  # the labeled sets again, past any attempt the parties can have seen since
            state.graph_restored(meta["graph"], arrays)
            attempt = attempt_after_restart(int(meta["labels"]["attempt"]), len(run.parties))
            log.warning("job %s: the graph stands; the labeled rows are asked again at attempt %d",
                        self.config.job_id, attempt)
            labelled = yield from from_labels(run.scope, state, attempt)
        else:  # the solve again, and SecureRowSums past any attempt the parties can have seen since
            state.graph_restored(meta["graph"], arrays)
            sum_ = meta["rowsums"]
            attempt = attempt_after_restart(int(sum_["attempt"]), len(run.parties)) if sum_ else 0
            log.warning("job %s: the influence columns are solved and sent again; SecureRowSums at attempt %d",
                        self.config.job_id, attempt)
            labelled = yield from from_graph(run.scope, state, tuple(sum_["members"]) if sum_ else None, attempt)
        return f"labels propagated for {len(labelled)} parties over {state.frame(labelled).n} rows"

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
                           "pair_budget": p.pair_budget, "influence_tolerance": p.influence_tolerance},
                **({"privacy": {"label_dp_epsilon": p.label_dp_epsilon, "mechanism": p.label_dp_mechanism,
                                "delta": p.label_dp_delta or 0.0, "line": label_dp_line(p)}} if p.label_dp else {})}

    def _dump(self, name: str, arr: np.ndarray) -> None:
        """Test hook (JobConfig refuses it unless XCLP_TESTING=1): what the coordinator saw."""
        directory = self.config.debug_dump_dir
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            np.save(directory / name, arr)


class Distribute(Work):
    """The graph layout, then each receiver's S_L^{(j)} (docs/design.md §5.4-5.5) solved `solve_columns(n)`
    columns at a time and sent on in pieces as each block is solved (§10.2), on the coordinator's
    own thread (a Work phase): a party lost meanwhile is dropped at once and gets nothing more."""

    def __init__(self, scope: Scope, state: XclpState) -> None:
        super().__init__(scope)
        self.state = state

    def on_left(self, gone: set[str]) -> None:
        """Lost while the coordinator solves: it shaped the graph, and brings and gets no labels."""
        try:
            self.state.drop(gone & set(self.state.membership.labels), steps.XclpStage.GRAPH)
        except PeerDropped as exc:
            self.fail(str(exc))

    def work(self) -> None:
        scope, state = self.scope, self.state
        assert state.W is not None and state.graph_layout is not None
        p, membership, layout = state.params, state.membership, state.graph_layout
        started = scope.run.clock()
        labeled = None if p.hide_label_mask else state.labeled
        columns = steps.influence_columns_of(layout, membership.labels, labeled=labeled)
        # exact: the columns of (I − α𝒲)^{-1}, dense; with a tolerance, pushed and sparse (§10.7); on the
        # operator's Dask cluster if the coordinator has one (server/offload.py, §10.8)
        problem = InfluenceProblem(state.W, p.graph_params.alpha, p.influence_method, p.tolerance)
        size = solve_columns(layout.n)  # the blocks each receiver's columns are solved and sent in
        planned = {pid: [cols[at : at + size] for at in range(0, cols.size, size)] for pid, cols in columns.items()}
        solver = problem.solver() if scope.run.offload is None else \
            ClusterSolver(scope.run.offload, problem, [b for blocks in planned.values() for b in blocks],
                          live=self.live)
        try:
            self._send(scope, state, planned, solver)
        finally:
            if isinstance(solver, ClusterSolver):
                solver.close()
        state.solve = solver.stats
        with self.locked:
            scope.run.ledger.record("graph", scope.run.clock() - started)
        stats, where = solver.stats, f" {solver.describe()}" if isinstance(solver, ClusterSolver) else ""
        if p.tolerance:
            log.info("XCLP: %d influence columns pushed in %.1f s%s (tolerance %g, %d entries, a column's mass left "
                     "out: at most %.3f)", stats.columns, stats.seconds, where, p.tolerance, stats.nonzeros,
                     stats.dropped_max)
        else:
            log.info("XCLP: %d influence columns solved in %.1f s%s (%s, %d blocks, at most %d iterations, residual "
                     "%.1e)", stats.columns, stats.seconds, where, stats.method, stats.blocks, stats.iterations,
                     stats.max_residual)

    def _send(self, scope: Scope, state: XclpState, planned: dict[str, list[np.ndarray]],
              solver: Solver | ClusterSolver) -> None:
        """The layout to the graph's parties, then each receiver's columns block by block (`planned`)."""
        p, membership, layout = state.params, state.membership, state.graph_layout
        assert layout is not None
        with self.locked:
            scope.broadcast(GRAPH_MSG, 0, state.rows(membership.graph), to=membership.graph)
            meter = step_meter(scope, "influence", sum(b.size for blocks in planned.values() for b in blocks),
                               "columns solved", work="influence")
        piece = influence_piece_columns(layout.n)
        for pid, blocks in planned.items():
            if not blocks:  # a receiver without labeled rows still hears that its S_L is empty
                with self.locked:
                    scope.broadcast(INFLUENCE_MSG, 0, empty_piece() if p.tolerance else np.zeros((layout.n, 0)),
                                    to=[pid])
            for nth, cols in enumerate(blocks):
                if not self.live() or pid not in scope.members:  # cancelled, or the party is gone
                    break
                # solved while the previous block is on its way, queued once that one (nearly) is: the
                # mailboxes never hold all of S_L, and solving and sending overlap
                block = solver.solve(cols)
                if block is None:  # the run is over (the cluster's solver returns None then)
                    break
                if nth and not scope.wait_for_delivery(pid, steps.INFLUENCE_BACKLOG_BYTES):
                    # not reading for a step's deadline: the rest of its columns are neither sent nor
                    # solved, and it will miss SecureRowSums as any silent party does
                    log.warning("job %s: party %s is not reading its influence columns; the rest are not sent",
                                scope.run.config.job_id, pid)
                    break
                with self.locked:
                    if isinstance(block, np.ndarray):
                        for at in range(0, block.shape[1], piece):
                            scope.broadcast(INFLUENCE_MSG, 0, np.ascontiguousarray(block[:, at : at + piece]),
                                            to=[pid])
                    else:
                        for packed in pack_pieces(block):
                            scope.broadcast(INFLUENCE_MSG, 0, packed, to=[pid])
                meter.update(meter.done + (block.shape[1] if isinstance(block, np.ndarray) else block.columns))


def _row_sums(scope: Scope, state: XclpState, going_on: tuple[str, ...] | None = None, attempt: int = 0) -> MaskedSum:
    """SecureRowSums (Scott et al. 2023 §3.2) as a masked sum whose contributions leave out the sender's rows.
    Its reveal digests bind the step's own name in every scope: in a training round the round's
    session id binds the round (client/jobs/xclp.py does the same; v0.1 parties did so)."""
    C = state.params.n_classes

    def shape(sender: str, participants: tuple[str, ...]) -> tuple[np.dtype[Any], tuple[int, ...]]:
        frame = state.frame(participants)
        own = frame.rows(sender)
        return ROW_SUMS_DTYPE, (frame.n - (own.stop - own.start), C)

    def combine(opened: Mapping[str, np.ndarray], participants: tuple[str, ...]) -> dict[str, np.ndarray]:
        if state.dump is not None:
            for pid, arr in opened.items():
                state.dump(f"rowsums-{pid}.npy", arr)
        return steps.sum_row_sums(state.frame(participants), opened, C)

    members = state.membership.labels if going_on is None else tuple(p for p in going_on if p in scope.members)
    # a party restarted in it rejoins with its Z̄ (client/jobs/xclp_state.py); not in a training round's
    # XCLP, whose run state a party keeps only between rounds
    return MaskedSum(scope, ROWSUMS_STEP, wire=shape, what="row sums", participants=members,
                     combine=combine, digest_name=ROWSUMS_STEP, first_attempt=attempt,
                     rejoinable=scope is scope.run.scope)
