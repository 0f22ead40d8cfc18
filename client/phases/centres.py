"""Candidate pairs' set-up on the party's side (DESIGN §10.3); its counterpart is
server/jobs/xclp.py `_candidates`.

Federated spherical k-means from centres drawn from the common seed: round r pools, in two
verifiable masked sums, the rows nearest to each centre, then the unit rows' sums of the centres
whose pooled count reached `min_centre_rows` (a smaller centre's sum never leaves the party).
Every member recomputes each opened sum from all masked vectors and seeds (the coordinator's word
is taken for none of it), and moves the centres itself. Then the pooled probe table (rows per
centre among their first p probes), from which every side picks the same probes per row and the
same public budgets (`candidates.choose_probes`); then the party tells the coordinator its rows'
probes, which is what the coordinator learns here besides the pooled counts and sums.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

import numpy as np

from xclp import candidates as cd
from xclp.client.context import PartyContext
from xclp.client.phases.masked_sum import MaskedSumParty
from xclp.errors import InvalidInput, ProtocolError
from xclp.v1.centres import (
    COUNTS,
    PROBES_STEP,
    SUMS_KIND,
    TABLE,
    candidate_steps,
    decode_sums,
    encode_sums,
    qualified,
)
from xclp.v1.xclp import XclpJobParams
from xclp.v1.xclp_pb2 import StepStart

Members = tuple[str, ...]


class CandidateCentres:
    """This party's k-means rounds, probe table and probes; then its centre lists and budgets."""

    def __init__(self, ctx: PartyContext, params: XclpJobParams, X: np.ndarray, sizes: Callable[[], Mapping[str, int]],
                 slots: int) -> None:
        self.ctx, self.params, self.sizes, self.slots = ctx, params, sizes, slots
        self.unit = cd.unit_rows(X)
        self.centres: np.ndarray | None = None  # drawn from the common seed at the first round
        self.qualified: np.ndarray | None = None  # the current round's centres whose sum is pooled
        self.counted_by: Members = ()  # ... by the members over whom their counts were opened
        self.probes: np.ndarray | None = None  # int64[n, probes] nearest first, once k-means is done
        self.chosen: tuple[int, dict[str, np.ndarray], float] | None = None  # probes, budgets, fraction
        self.own_lists: list[np.ndarray] | None = None  # its centre lists, cut to its budgets
        self.refusal = ""  # why the pooled table allows no schedule within the budget
        self.sums: dict[str, MaskedSumParty] = {}
        kinds = {COUNTS: (self._counts, self._counted), SUMS_KIND: (self._sums, self._summed),
                 TABLE: (self._table, self._tabled)}
        for name, kind in candidate_steps(params.kmeans_rounds):
            make, opened = kinds[kind]
            self.sums[name] = MaskedSumParty(ctx, name, make, exact=True, on_opened=opened)

    def handles(self, step: str) -> bool:
        return step == PROBES_STEP or any(s.handles(step) for s in self.sums.values())

    def on_step(self, step: StepStart) -> None:
        if step.step == PROBES_STEP:
            if self.refusal:
                raise ProtocolError(f"the coordinator went on past the probe table: {self.refusal}")
            if self.probes is None or self.chosen is None:
                raise ProtocolError("the coordinator asked for the probes before the probe table was opened")
            self.ctx.push(self.probes[:, : self.chosen[0]].astype(np.uint16), PROBES_STEP, step.round)
            self.ctx.progress(f"candidate pairs: {self.chosen[0]} probes per row sent "
                              f"({100 * self.chosen[2]:.1f}% of all pairs' ciphertexts)")
            return
        for s in self.sums.values():
            if s.handles(step.step):
                s.on_step(step)
                return

    # --- the sums' contributions and openings ---------------------------------------------------

    def _current(self) -> np.ndarray:
        if self.centres is None:
            self.centres = cd.initial_centres(self.ctx.seed, self.params.centres, self.unit.shape[1])
        return self.centres

    def _counts(self, members: Members) -> np.ndarray:
        return cd.kmeans_counts(self.unit, self._current()).astype(np.uint64)

    def _counted(self, total: np.ndarray, attempt: int, members: Members) -> None:
        self.qualified, self.counted_by = qualified(total, self.params.min_centre_rows), members

    def _pooled(self, members: Members) -> np.ndarray:
        """The centres whose sums this round pools among `members`: those whose count over the same
        members reached the minimum. A member lost since the counts opened (the sum restarted without
        it) leaves none: its rows may be what brought a centre to the minimum, and the sum of the rest
        would open fewer rows than min_centre_rows. The centres then stay for this round."""
        if self.qualified is None:
            raise ProtocolError("the coordinator asked for the centres' sums before their counts were opened")
        return self.qualified if members == self.counted_by else np.zeros_like(self.qualified)

    def _sums(self, members: Members) -> np.ndarray:
        return encode_sums(cd.kmeans_sums(self.unit, self._current(), self._pooled(members)))

    def _summed(self, total: np.ndarray, attempt: int, members: Members) -> None:
        self.centres = cd.next_centres(self._current(), decode_sums(total), self._pooled(members))
        self.qualified = None

    def _table(self, members: Members) -> np.ndarray:
        self.probes = cd.nearest_centres(self.unit, self._current(), self.params.probes)
        return cd.probe_table(self.probes, self.params.centres).astype(np.uint64)

    def _tabled(self, total: np.ndarray, attempt: int, members: Members) -> None:
        sizes = {q: self.sizes()[q] for q in members}
        try:
            self.chosen = cd.choose_probes(total.astype(np.int64), sizes, list(itertools.permutations(sizes, 2)),
                                           self.slots, self.params.budget_slack, self.params.pair_budget)
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
