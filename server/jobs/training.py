"""Training rounds on the coordinator (docs/design.md §7): the engine fedavg and dbcl share.

After the seed (and the moments phase if the job prepares), the parties announce every round's
sample, drawn from their common seed (step "samples"; the coordinator cannot choose them, docs/design.md
§2.6; all announcements must agree), then rounds t = 0 .. rounds − 1, each in its own scope (step
names "r<t>.<name>", masks under the round's session id, xclp.v1.training):

    P_t = the parties' sample of round t, less dropped parties
    the trainer releases the round's model to P_t, and runs what the round needs before the
        update (fedavg with pseudo_label = "xclp": one XCLP run among P_t); it names who goes on
    update (masked sum) --> the trainer moves the model by the opened sum
    attest (fedavg)     --> the members sign the link θ_t → θ_{t+1} each recomputed; every party of
                            the job gets it ("attested"), so that one the round passed by can follow
                            the model chain (xclp.v1.training)
After the last round: "final_model" to every party, and the model to the job's `model` file.

What a trainer is (`Trainer`) is what Flower calls a strategy: fedavg's (server/jobs/fedavg.py)
releases θ and adds the mean update; dbcl's (server/jobs/dbcl.py) releases a fresh sketch of W and
steps W by the mean sketched gradient. The rounds, their sample, their masked sum and their
dropouts are this one engine: a party whose Pull stream ends is dropped from the job; one that
misses a deadline leaves the round only and may be sampled again; a round whose sum cannot be
opened (a party lost while revealing), whose parties fall below min_parties, or whose pseudo-labels
fail, is skipped and the model stays. The coordinator sees the model, the pooled update of each
round and who took part; never one party's update.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from xclp.errors import InvalidInput
from xclp.nn import Network
from xclp.runtime import write_atomic
from xclp.server.config import JobConfig
from xclp.server.jobs.base import CoordinatorJob
from xclp.server.mailbox import Party
from xclp.server.phases.base import Phase, PhaseFailed, Program, Scope, Step, attempt_after_restart
from xclp.server.phases.masked_sum import MaskedSum, SumResult
from xclp.v1 import training, wire
from xclp.v1.dbcl import DbclJobParams
from xclp.v1.fedavg import FedavgJobParams
from xclp.v1.registry import params_json

if TYPE_CHECKING:
    from xclp.server.run import Run

log = logging.getLogger("xclp.server")


class Trainer(Protocol):
    """What a training job does in its rounds."""

    net: Network | None  # the model as it stands
    verifiable: bool  # whether the parties see the model and so recompute it from each opened sum (docs/design.md §2.7)

    def check_start(self, parties: Mapping[str, Party]) -> None:
        """Refuse (InvalidInput) the joined parties' data before any work."""

    def begin(self, dim: int) -> Network:
        """The initial model for data of `dim` features."""

    def round(self, scope: Scope, t: int, *, again: bool = False) -> Program[tuple[str, ...]]:
        """Release round t's model to the scope's members, run what the round needs before the
        update, and return the parties that go on to the update. `again`: a restarted coordinator
        goes on with the round's update sum among the scope's members, who hold their updates: the
        model (and what comes with it) again, and nothing else before the update."""

    def update_size(self) -> int:
        """Values in one party's update before its row count."""

    def apply(self, total: np.ndarray) -> int:
        """Move the model by the opened update sum; returns the rows it came from (InvalidInput:
        the sum decodes to nonsense)."""

    def final_payload(self) -> np.ndarray:
        """What every party gets after the last round."""

    def resend(self, scope: Scope, party: str) -> None:
        """The round's model (and what comes with it) again to `party`, whose process restarted."""

    def saved(self, t: int) -> dict[str, np.ndarray] | None:
        """What round t needs to run again from its start in a restarted coordinator (copies), or None
        where it cannot (its model is not all the round depends on)."""

    def restored(self, dim: int, arrays: Mapping[str, np.ndarray]) -> None:
        """The model (and whatever else) as `saved` gave it, for data of `dim` features."""


class RoundsJob(CoordinatorJob[FedavgJobParams | DbclJobParams]):
    def __init__(self, config: JobConfig, trainer: Trainer) -> None:
        super().__init__(config)
        self.trainer = trainer
        self.round = -1
        self.scope: Scope | None = None  # this round's scope
        self.skipped: list[int] = []
        self.samples: tuple[tuple[str, ...], ...] = ()  # every round's sample, as the parties announced them
        self.history: list[dict[str, Any]] = []  # per round: parties, rows, seconds (no parameters)

    @property
    def members(self) -> tuple[str, ...]:
        """This round's parties still in it."""
        return tuple(self.scope.members) if self.scope is not None else ()

    def check_start(self, parties: Mapping[str, Party]) -> None:
        super().check_start(parties)
        self.trainer.check_start(parties)

    def summary(self) -> dict[str, Any]:
        """With record-level DP, the accountant's report (xclp.privacy.dpsgd): the budget, the noise, and
        what each party's rows spent over the rounds whose sum it was in."""
        if self.trainer.net is None or not self.params.private:
            return {}
        size = self.trainer.update_size()
        dp = self.params.dp_plan(size)
        assert dp is not None
        counts = {p: sum(p in h["parties"] for h in self.history) for p in sorted(self.config.expected_parties)}
        spent = {p: round(self.params.epsilon_spent(size, n), 4) for p, n in counts.items()}
        worst = max(spent.values(), default=0.0)
        return {"privacy": {
            "epsilon_budget": dp.epsilon, "delta": dp.delta, "epsilon_spent": spent, "clip_norm": dp.clip,
            "noise_multiplier": round(dp.noise_multiplier, 6), "distributed": dp.distributed,
            "line": (f"record-level DP: ε = {worst:.3g} spent of {dp.epsilon:g} (δ = {dp.delta:g}) by the rows of the "
                     f"party in most rounds; noise multiplier {dp.noise_multiplier:.3g}, rows clipped to {dp.clip:g}, "
                     + ("noise shared among each round's parties" if dp.distributed
                        else "each party's own noise at every local step"))}}

    def program(self, run: Run) -> Program[str]:
        net = self.trainer.begin(run.dim)
        log.info("job %s: training a %s network (%d parameters) for %d rounds", self.config.job_id,
                 "-".join(map(str, net.arch.sizes)), net.arch.n_params, self.params.rounds)
        self.samples = yield Samples(run.scope, self.params.rounds, tuple(sorted(run.parties)))
        return (yield from self._rounds(run, 0))

    def saved(self, run: Run) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """In round t's update sum, until its holders are asked to reveal: round t's model again, its
        sum at a later attempt among the same parties (server/resume.py); else None (a sum that may
        have been opened is never asked for again, and the trainer's own phases, such as a round's
        XCLP, do not resume: the parties hold what came of them once they are in the sum)."""
        phase, step = run.phase, run.step
        if not isinstance(phase, MaskedSum) or self.scope is None or phase.scope is not self.scope or \
                phase.name != training.UPDATE_STEP or phase.opening or step is None:
            return None
        arrays = self.trainer.saved(self.round)
        if arrays is None:
            return None
        return {"round": self.round, "attempt": step.attempt, "members": list(step.participants),
                "samples": [list(s) for s in self.samples], "skipped": list(self.skipped),
                "history": list(self.history)}, arrays

    def resumed(self, run: Run, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Program[str]:
        self.trainer.restored(run.dim, arrays)
        self.samples = tuple(tuple(s) for s in meta["samples"])
        self.skipped, self.history = [int(t) for t in meta["skipped"]], list(meta["history"])
        t = int(meta["round"])
        run.closed_scopes.update(training.scoped(s, "") for s in range(t))  # what comes for them is late
        attempt = attempt_after_restart(int(meta["attempt"]), len(run.parties))
        log.warning("job %s: round %d goes on with its model again, its update sum at attempt %d",
                    self.config.job_id, t, attempt)
        return (yield from self._rounds(run, t, tuple(meta["members"]), attempt))

    def _rounds(self, run: Run, first: int, going_on: tuple[str, ...] | None = None, attempt: int = 0) \
            -> Program[str]:
        """Rounds `first` .. rounds − 1; a restarted coordinator's first round runs among `going_on`
        (those still in its sum) from `attempt` on."""
        for t in range(first, self.params.rounds):
            self.round = t
            sample = going_on if going_on is not None and t == first else self.samples[t]
            scope = self.scope = run.open_scope(training.scoped(t, ""), training.round_session(run.session_id, t),
                                                sample, leave_on_deadline=True)
            run.changed.notify_all()
            started = run.clock()
            try:
                if len(scope.members) < scope.min_members:
                    raise PhaseFailed(f"only {len(scope.members)} of its sampled parties are left")
                members = yield from self.trainer.round(scope, t, again=going_on is not None and t == first)
                total: SumResult = yield UpdateSum(scope, training.UPDATE_STEP, what="update", participants=members,
                                                   wire=training.wire(self.trainer.update_size()),
                                                   verifiable=self.trainer.verifiable,
                                                   first_attempt=attempt if t == first else 0, trainer=self.trainer)
                try:
                    rows = self.trainer.apply(total.value)
                except InvalidInput as exc:
                    raise PhaseFailed(f"its update sum is unusable: {exc}") from None
            except PhaseFailed as exc:
                log.warning("job %s: round %d skipped, the model stays: %s", self.config.job_id, t, exc.reason)
                self.skipped.append(t)
            else:
                self.history.append({"round": t, "parties": list(total.participants), "rows": rows,
                                     "seconds": round(run.clock() - started, 3)})
                log.info("job %s: round %d: model updated from %d parties (%d rows) in %.3fs", self.config.job_id, t,
                         len(total.participants), rows, run.clock() - started)
                if self.trainer.verifiable:
                    try:
                        yield Attest(scope, run.scope, t, total.participants, tuple(sorted(run.parties)))
                    except PhaseFailed as exc:  # the model has moved; a party the round passed by cannot follow
                        log.warning("job %s: round %d's link of the model chain is not attested: %s",
                                    self.config.job_id, t, exc.reason)
            finally:
                run.close_scope(scope)
        self.scope = None
        assert self.trainer.net is not None
        if self.config.model_path is not None:
            path = save_network(self.config.model_path, self.config.job_type, self.params, self.trainer.net)
            log.info("job %s: wrote the trained network to %s", self.config.job_id, path)
        run.scope.broadcast(training.FINAL_MSG, 0, self.trainer.final_payload())
        done = self.params.rounds - len(self.skipped)
        return (f"{done} of {self.params.rounds} rounds trained" +
                (f"; rounds {', '.join(map(str, self.skipped))} skipped" if self.skipped else ""))


class UpdateSum(MaskedSum):
    """A round's update sum. A member whose process restarted (it rejoins from its sealed run state,
    client/jobs/rounds_state.py) gets the round's model again, and the sum starts its next attempt
    among the same parties, where it masks the same update again; once the holders are asked to
    reveal, no attempt follows, and the run drops it as after any lost connection."""

    def __init__(self, scope: Scope, name: str, *, trainer: Trainer, **kw: Any) -> None:
        super().__init__(scope, name, rejoinable=True, **kw)
        self.trainer = trainer

    def resend(self, party: str) -> None:
        self.trainer.resend(self.scope, party)


class Attest(Phase):
    """Round t's members sign the link θ_t → θ_{t+1} each recomputed from the opened sum; the
    coordinator relays the signatures to every party of the job (xclp.v1.training, the model chain).
    Members that left sign nothing; with no signature, or members that disagree, nothing is relayed."""

    def __init__(self, scope: Scope, job: Scope, t: int, members: tuple[str, ...], roster: tuple[str, ...]) -> None:
        super().__init__(scope)
        self.job, self.t, self.roster = job, t, roster
        self.members = tuple(p for p in members if p in scope.members)

    def start(self) -> None:
        if not self.members:
            self.done()
            return
        self.scope.start_step(training.ATTEST_STEP, self.members)

    def payload_limit(self, sender: str, step: Step, recipient: str) -> int:
        return training.ATTEST_BYTES

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        training.Attestation.unpack(payload)

    def on_step_complete(self, step: Step) -> None:
        signed = {p: training.Attestation.unpack(v) for p, v in step.received.items()}
        links = {(a.before, a.after) for a in signed.values()}
        if len(links) == 1:
            before, after = next(iter(links))
            attested = training.Attested(before, after, {p: a.signature for p, a in signed.items()})
            self.job.broadcast(training.scoped(self.t, training.ATTESTED_MSG), 0, attested.pack(self.roster))
        elif links:
            log.warning("job %s: round %d's members attest different models: relaying none", self.run.config.job_id,
                        self.t)
        self.done()

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        step.pending -= dropped  # the others' signatures stand
        self.complete_if_done(step)


class Samples(Phase):
    """Every party announces every round's sample (xclp.v1.training.samples_payload, from the common
    seed); the coordinator takes them only if all announcements agree."""

    def __init__(self, scope: Scope, rounds: int, roster: tuple[str, ...]) -> None:
        super().__init__(scope)
        self.rounds, self.roster = rounds, roster

    def start(self) -> None:
        self.scope.start_step(training.SAMPLES_STEP)

    def payload_limit(self, sender: str, step: Step, recipient: str) -> int:
        return self.rounds * len(self.roster)

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        training.samples_from_payload(payload, self.rounds, self.roster)

    def on_step_complete(self, step: Step) -> None:
        announced = {payload_bytes(p) for p in step.received.values()}
        if len(announced) != 1:
            self.fail("the parties announced different samples of the rounds (their common seeds differ)")
            return
        self.done(training.samples_from_payload(next(iter(step.received.values())), self.rounds, self.roster))

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        step.pending -= dropped  # the others' announcements stand
        self.complete_if_done(step)


def payload_bytes(payload: wire.Payload) -> bytes:
    return payload.tobytes() if isinstance(payload, np.ndarray) else bytes(payload)


def save_network(path: Path, job_type: str, params: FedavgJobParams | DbclJobParams, net: Network) -> Path:
    """The coordinator's copy of a trained network (`model = "…"` in the job file), written atomically:
    job_type, params_json, the layer sizes and θ."""
    buf = io.BytesIO()
    np.savez(buf, job_type=np.array(job_type), params_json=np.array(params_json(params)),
             sizes=np.array(net.arch.sizes, dtype=np.int64), theta=net.flat)
    return write_atomic(path, buf.getvalue())
