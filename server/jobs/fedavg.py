"""Federated averaging (`type = "fedavg"`, docs/design.md §7, Scott et al. 2023 Alg. 2) on the coordinator: the
trainer of the rounds engine (server/jobs/training.py).

Round t: "r<t>.model" θ to the round's parties; with pseudo_label = "xclp" (from warmup_rounds
on) one XCLP run among them on their embedded rows (server/jobs/xclp.py, every step of docs/design.md §5
in the round's scope); the parties that got their row sums go on to the update; the opened sum
moves θ ← θ + Σ n_jΔ_j / Σ n_j.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from xclp.errors import InvalidInput
from xclp.fedavg import initial_network, server_update
from xclp.nn import Network
from xclp.server.config import JobConfig
from xclp.server.jobs.training import RoundsJob
from xclp.server.jobs.xclp import XclpState, xclp_phases
from xclp.server.mailbox import Party
from xclp.server.phases.base import PhaseFailed, Program, Scope
from xclp.v1 import training
from xclp.v1.fedavg import FedavgJobParams

log = logging.getLogger("xclp.server")


class FedavgTrainer:
    verifiable = True  # every party sees θ: it checks θ_{t+1} against the sum it opened

    def __init__(self, config: JobConfig) -> None:
        assert isinstance(config.params, FedavgJobParams)
        self.config, self.params = config, config.params
        self.net: Network | None = None

    def check_start(self, parties: Mapping[str, Party]) -> None:
        rows = sorted(int(p.summary.rows) for p in parties.values())
        smallest = sum(rows[: self.config.min_parties])
        if self.params.pseudo_label == "xclp" and self.params.k > smallest - 1:
            raise InvalidInput(f"k = {self.params.k} neighbours need at least {self.params.k + 1} rows among the "
                               f"parties of a round, but the smallest {self.config.min_parties} bring {smallest}")

    def begin(self, dim: int) -> Network:
        self.net = initial_network(self.params.architecture(dim), self.params.seed)
        return self.net

    def round(self, scope: Scope, t: int, *, again: bool = False) -> Program[tuple[str, ...]]:
        assert self.net is not None
        scope.broadcast(training.MODEL_MSG, 0, self.net.flat)
        if again or self.params.pseudo_labels_in(t) != "xclp":  # (again: its XCLP is behind its parties)
            return tuple(scope.members)
        state = XclpState.of(self.params.xclp_params(), scope.run.parties, scope.members)
        try:
            labelled = yield from xclp_phases(scope, state)
        except PhaseFailed as exc:
            raise PhaseFailed(f"its XCLP run failed: {exc.reason}") from None
        members = tuple(p for p in labelled if p in scope.members)
        log.info("job %s: round %d: XCLP pseudo-labels for %d parties", self.config.job_id, t, len(members))
        if len(members) < scope.min_members:
            raise PhaseFailed(f"only {len(members)} parties got XCLP pseudo-labels")
        return members

    def update_size(self) -> int:
        assert self.net is not None
        return self.net.arch.n_params

    def apply(self, total: np.ndarray) -> int:
        assert self.net is not None
        delta, rows = self.params.weighted_delta(total, self.net.arch.n_params)
        self.net = server_update(self.net, delta, rows)
        return rows

    def final_payload(self) -> np.ndarray:
        assert self.net is not None
        return self.net.flat

    def resend(self, scope: Scope, party: str) -> None:
        assert self.net is not None
        scope.send(party, training.MODEL_MSG, 0, self.net.flat)

    def saved(self, t: int) -> dict[str, np.ndarray] | None:
        """θ_t (in a round that ran XCLP, its update sum goes on without it: RoundsJob.saved)."""
        if self.net is None:
            return None
        return {"theta": self.net.flat.copy()}

    def restored(self, dim: int, arrays: Mapping[str, np.ndarray]) -> None:
        self.net = Network(self.params.architecture(dim), arrays["theta"])  # checks its shape and values


def fedavg_job(config: JobConfig) -> RoundsJob:
    return RoundsJob(config, FedavgTrainer(config))
