"""Candidate pairs' set-up on the party's side (docs/design.md §10.3); its counterpart is
server/jobs/xclp.py `_candidates`.

The centres are drawn from the common seed and never moved (xclp.v1.centres: no value about them
is released). The pooled probe table (rows per centre among their first p probes), a verifiable
masked sum: every member recomputes it from all masked vectors and seeds, each seed checked against
the commitment its member signed, so the coordinator's word is taken for none of it; from it every
side picks the same probes per row and the same public budgets (`candidates.choose_probes`). The
table is absorbed into the transcript before the probes go out. Then the party tells the
coordinator its rows' probes, which is what the coordinator learns here besides the table.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

import numpy as np

from xclp import candidates as cd
from xclp.client.context import PartyContext
from xclp.client.ledger import Release, function_id
from xclp.client.phases.masked_sum import MaskedSumParty
from xclp.errors import InvalidInput, ProtocolError
from xclp.v1.centres import PROBE_TABLE_STEP, PROBES_STEP
from xclp.v1.xclp import PROBE_TABLE_DTYPE, PROBES_DTYPE, XclpJobParams
from xclp.v1.xclp_pb2 import StepStart

Members = tuple[str, ...]


class CandidateCentres:
    """This party's probe table and probes; then its centre lists and budgets."""

    def __init__(self, ctx: PartyContext, params: XclpJobParams, X: np.ndarray, sizes: Callable[[], Mapping[str, int]],
                 slots: int) -> None:
        self.ctx, self.params, self.sizes, self.slots = ctx, params, sizes, slots
        self.unit = cd.unit_rows(X)
        self.centres = cd.initial_centres(ctx.seed, params.centre_count, self.unit.shape[1])  # no one's data
        self.probes: np.ndarray | None = None  # int64[n, probes] nearest first
        self.chosen: tuple[int, dict[str, np.ndarray], float] | None = None  # probes, budgets, fraction
        self.own_lists: list[np.ndarray] | None = None  # its centre lists, cut to its budgets
        self.refusal = ""  # why the pooled table allows no schedule within the budget
        self.opened: tuple[np.ndarray, Members] | None = None  # the pooled table and its members, once opened
        table = Release(function_id("probe-table", ctx.seed, str(params.centre_count), str(params.probes)),
                        "the probe table of candidate pairs under this run's centres")
        self.table = MaskedSumParty(ctx, PROBE_TABLE_STEP, self._table, releases=lambda members: [table],
                                    on_opened=self._tabled)

    def handles(self, step: str) -> bool:
        return step == PROBES_STEP or self.table.handles(step)

    def on_step(self, step: StepStart) -> None:
        if step.step == PROBES_STEP:
            if self.refusal:
                raise ProtocolError(f"the coordinator went on past the probe table: {self.refusal}")
            if self.probes is None or self.chosen is None:
                raise ProtocolError("the coordinator asked for the probes before the probe table was opened")
            self.ctx.push(self.probes[:, : self.chosen[0]].astype(PROBES_DTYPE), PROBES_STEP, step.round)
            self.ctx.progress(f"candidate pairs: {self.chosen[0]} probes per row sent "
                              f"({100 * self.chosen[2]:.1f}% of all pairs' ciphertexts)")
            return
        self.table.on_step(step)

    # --- the probe table ------------------------------------------------------------------------

    def _table(self, members: Members) -> np.ndarray:
        self.probes = cd.nearest_centres(self.unit, self.centres, self.params.probes)
        return cd.probe_table(self.probes, self.params.centre_count).astype(PROBE_TABLE_DTYPE)

    def reopen(self, total: np.ndarray, members: Members) -> None:
        """After a restart (client/run_state.py): the table as it was opened, and what follows from it."""
        self._table(members)
        self._tabled(total, 0, members)
        if self.refusal:
            raise ProtocolError(f"the saved probe table allows no schedule: {self.refusal}")

    def _tabled(self, total: np.ndarray, attempt: int, members: Members) -> None:
        self.ctx.transcript.absorb(PROBE_TABLE_STEP, total)  # what this party acts on, in what it signs next
        self.opened = (total, members)
        sizes = {q: self.sizes()[q] for q in members}
        try:
            self.chosen = cd.choose_probes(total.astype(np.int64), sizes, list(itertools.permutations(sizes, 2)),
                                           self.slots, self.params.budget_slack, self.params.budget)
        except InvalidInput as exc:  # the coordinator, which opened the same table, refuses the run
            self.refusal = f"candidate pairs: {exc}"
            return
        assert self.probes is not None
        self.own_lists = cd.centre_lists(self.probes, self.chosen[0], self.budgets(self.ctx.party_id))

    # --- what SecureHamming needs ---------------------------------------------------------------

    def budgets(self, party: str) -> np.ndarray:
        if self.chosen is None:
            raise ProtocolError("SecureHamming on candidate pairs before the probe table was opened")
        budgets = self.chosen[1].get(party)
        if budgets is None:
            raise ProtocolError(f"{party!r} took no part in the probe table")
        return budgets

    def lists(self) -> list[np.ndarray]:
        """This party's centre lists (its rows per centre, cut to its budgets)."""
        if self.own_lists is None:
            raise ProtocolError("SecureHamming on candidate pairs before the probe table was opened")
        return self.own_lists

    def schedule(self, a: str, b: str) -> cd.PairSchedule:
        return cd.PairSchedule.of(self.budgets(a), self.budgets(b), self.slots)

    def slots_of(self, party: str) -> int:
        """A party's slots as A: the sum of its budgets (the last batch's padding after them excluded)."""
        return int(self.budgets(party).sum())
