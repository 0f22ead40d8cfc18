"""XCLP's one-contribution-per-party steps on the coordinator (docs/protocol.md): every party's own
nearest rows (intra_hamming), its probes on candidate pairs, its labeled rows. A party lost in one
leaves the run at the phase's stage; the others' contributions stay valid."""

from __future__ import annotations

from typing import Any

import numpy as np

from xclp.candidates import centre_lists, membership
from xclp.errors import InvalidInput, PeerDropped
from xclp.server.phases.base import Phase, Scope, Step
from xclp.server.phases.masked_sum import ring_array
from xclp.server.phases.xclp_state import XclpState
from xclp.server.steps import xclp as steps
from xclp.v1 import wire
from xclp.v1.centres import PROBES_STEP
from xclp.v1.xclp import (
    INTRA_STEP,
    LABELED_DTYPE,
    LABELS_STEP,
    NEIGHBOURS_DTYPE,
    PROBES_DTYPE,
    own_neighbours_shape,
)


class EachParty(Phase):
    """One step in which every participant sends one contribution, kept in `received()`. A party
    lost in it leaves the run at `stage`, and the others' contributions stay valid: the step waits
    for the rest only."""

    step_name = ""
    stage = steps.XclpStage.SETUP

    def __init__(self, scope: Scope, state: XclpState, attempt: int = 0) -> None:
        super().__init__(scope)
        self.state, self.attempt = state, attempt  # a later attempt: a restarted coordinator's

    def participants(self) -> tuple[str, ...]:
        return self.state.membership.graph

    def received(self) -> tuple[dict[str, Any], ...]:
        """Where `accept` keeps each sender's contribution (forgotten if the sender is lost)."""
        raise NotImplementedError

    def start(self) -> None:
        self.scope.start_step(self.step_name, self.participants(), self.attempt)

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


class IntraHamming(EachParty):
    """Every party's own k nearest rows (docs/design.md §5.2, §10.1). A party lost here is as if it never joined."""

    step_name = INTRA_STEP

    def received(self) -> tuple[dict[str, Any], ...]:
        return (self.state.own,)

    def payload_limit(self, sender: str, step: Step, recipient: str) -> int:
        return wire.array_bytes(NEIGHBOURS_DTYPE,
                                own_neighbours_shape(self.state.sizes.get(sender, 0), self.state.params.k))

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        if not isinstance(payload, np.ndarray):
            raise InvalidInput(f"the own nearest rows of {sender!r} must be an array")
        state = self.state
        state.own[sender] = steps.check_own_neighbours(payload, state.sizes[sender], state.params.k,
                                                       state.params.lsh_bits)


class Probes(EachParty):
    """Each party's first p probes per row (docs/design.md §10.3): its centre lists and centre sets follow
    from them and the public budgets. A party lost here is as if it never joined."""

    step_name = PROBES_STEP

    def received(self) -> tuple[dict[str, Any], ...]:
        assert self.state.candidates is not None
        return (self.state.candidates.lists, self.state.candidates.members)

    def payload_limit(self, sender: str, step: Step, recipient: str) -> int:
        assert self.state.candidates is not None
        return wire.array_bytes(PROBES_DTYPE, (self.state.sizes.get(sender, 0), self.state.candidates.probes))

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        state, run = self.state, self.state.candidates
        assert run is not None
        n, want = state.sizes[sender], (state.sizes[sender], run.probes)
        if not isinstance(payload, np.ndarray) or payload.dtype != PROBES_DTYPE or payload.shape != want:
            raise InvalidInput(f"the probes of {sender!r} must be {PROBES_DTYPE}{list(want)}")
        probes = payload.astype(np.int64)
        ordered = np.sort(probes, axis=1)
        if probes.size and (probes.max() >= state.params.centre_count or np.any(ordered[:, 1:] == ordered[:, :-1])):
            raise InvalidInput(f"the probes of {sender!r} must be distinct centres below {state.params.centre_count}")
        run.lists[sender] = centre_lists(probes, run.probes, run.budgets[sender])
        run.members[sender] = membership(run.lists[sender], n, run.probes)


class LabeledSets(EachParty):
    """Each party's labeled row numbers (docs/design.md §5.5). A party lost here shaped the graph but
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
        idx = ring_array(payload, LABELED_DTYPE, (count,), f"the labeled rows of {sender!r}")
        if count and (idx[0] < 0 or idx[-1] >= n or np.any(np.diff(idx) <= 0)):
            raise InvalidInput(f"the labeled rows of {sender!r} must be ascending and in 0..{n - 1}")
        self.state.labeled[sender] = idx
