"""Federated training jobs (`type = "fedavg"`, DESIGN §7, paper 003 Alg. 2) on the coordinator.

After SETUP (and the moments step if the job prepares), rounds t = 0 .. rounds − 1:

    P_t = the job's public sample of round t (xclp.fedavg.sample_parties), less dropped parties
    coordinator -> P_t  "r<t>.model"  θ
    pseudo_label = "xclp" (from warmup_rounds on): one XCLP run among P_t on the parties' embedded
        rows, every step of DESIGN §5 in round t's scope (`RoundXclp`); those that get their row
        sums go on
    r<t>.update --> r<t>.update_reveal --> θ ← θ + Σ n_jΔ_j / Σ n_j (the coordinator opens only the sum)
After the last round: "final_model" θ to every party, then DONE.

Dropouts. A party whose Pull stream ends is dropped from the job (the base). A party that misses
a deadline is left out of that round only, and may be sampled again: in the XCLP run as DESIGN §5
says; in "update" the step restarts without it in its next round (fresh masks, DESIGN §6.1); in
"update_reveal" the round's sum is lost, θ stays, and the job goes on with the next round. A
round left with fewer than min_parties parties is skipped (θ stays); so is one whose XCLP fails.
The coordinator sees θ, the pooled update of each round and who took part; never one party's.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from xclp.crypto.identity import KeyBundle
from xclp.errors import InvalidInput
from xclp.fedavg import initial_network, sample_parties, server_update
from xclp.nn import Network
from xclp.runtime import write_atomic
from xclp.server.config import JobConfig
from xclp.server.jobs.base import Job, Observer, Stage
from xclp.server.jobs.state import Step, check_reveal, open_sum, ring_array
from xclp.server.jobs.xclp import XclpJob
from xclp.v1 import fedavg, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.bundles import check_paillier_size
from xclp.v1.jobs import FedavgJobParams, params_json

log = logging.getLogger("xclp.server")


class RoundXclp(XclpJob):
    """Round t's XCLP run among the round's parties: the XCLP job's steps, routing and checks,
    with names scoped to the round, keys under the round's session id, the job's parties and
    mailboxes, and the end of the run handed back to the training job instead of ending anyone."""

    def __init__(self, parent: FedavgJob, round: int, members: tuple[str, ...]) -> None:
        params = parent.params.xclp_params()
        config = dataclasses.replace(parent.config, job_type="xclp", params=params, min_parties=2,
                                     max_total_rows=0, summary_path=None, debug_dump_dir=None)
        super().__init__(config, parent.allow_list, clock=parent.clock, observer=parent.observer)
        self.lock = parent.lock
        self.parent = parent
        self.round = round
        self.parties = parent.parties  # the same mailboxes
        self.active = list(members)
        self.session_id = fedavg.round_session(parent.session_id, round)
        self.stage = Stage.RUNNING
        self.run_ledger = parent.run_ledger  # the operator sees the round's XCLP steps in the job's

    def wire_name(self, name: str) -> str:
        return fedavg.scoped(self.round, name)

    def finish(self, reason: str = "") -> None:
        self.stage = Stage.DONE
        self.step = None
        self.parent.xclp_done(self)

    def _fail(self, reason: str, outcome: int = pb.JobEnd.FAILED) -> None:
        self.stage = Stage.FAILED
        self.step = None
        self.parent.xclp_failed(self, reason)

    def _end(self, party_id: str, outcome: int, reason: str) -> None:
        """Leaving a round's XCLP run ends nothing: the training job decides (FedavgJob._exclude)."""

    def _after_transition(self) -> None:
        """No run summary of its own; the training job's log has the round."""


class FedavgJob(Job):
    """Rounds of sampling, optional XCLP pseudo-labels, and one double-masked update sum each.

    The rounds, their dropouts and their update sum are shared with the dbcl job
    (server/jobs/dbcl.py), which overrides what a round releases (`_open_round`), how wide an
    update is (`_update_len`), how the opened sum moves the model (`_apply_sum`) and what the
    parties get at the end (`_final_payload`)."""

    params_type: type = FedavgJobParams

    def __init__(self, config: JobConfig, allow_list: Mapping[str, bytes], *,
                 clock: Callable[[], float] = time.monotonic, observer: Observer | None = None) -> None:
        super().__init__(config, allow_list, clock=clock, observer=observer)
        if not isinstance(config.params, self.params_type):
            raise InvalidInput(f"job {config.job_id!r} is not a {self.params_type.__name__} job")
        self.params: Any = config.params
        per_round = math.ceil(self.params.fraction * len(config.expected_parties) - 1e-9)
        if per_round < config.min_parties:
            raise InvalidInput(f"job {config.job_id!r}: fraction = {self.params.fraction} samples {per_round} of the "
                               f"{len(config.expected_parties)} parties per round, fewer than min_parties = "
                               f"{config.min_parties}; raise fraction or lower min_parties")
        self.net: Network | None = None
        self.round = -1
        self.members: tuple[str, ...] = ()  # this round's parties still in it
        self.round_changed = threading.Condition(self.lock)  # notified when the round or its parties change
        self.xclp: RoundXclp | None = None
        self.masked: Step | None = None  # this round's complete update step, whose self masks are being revealed
        self.skipped: list[int] = []
        self.history: list[dict[str, Any]] = []  # per round: parties, rows, seconds (no parameters)
        self._round_started = 0.0

    # --- admission --------------------------------------------------------------------------

    def check_claimed_bundle(self, claimed: KeyBundle) -> None:
        if self.params.pseudo_label != "xclp":
            return
        try:
            check_paillier_size(claimed, self.params.key_bits, allow_insecure=self.params.insecure_test_keys)
        except InvalidInput as exc:
            raise InvalidInput(f"job {self.config.job_id!r} pseudo-labels with XCLP: {exc}") from None

    def check_start(self) -> None:
        rows = sorted(int(p.summary.rows) for p in self.parties.values())
        if not any(p.summary.labeled_rows for p in self.parties.values()):
            raise InvalidInput("no party brought a labeled row: there is nothing to train on")
        smallest = sum(rows[: self.config.min_parties])
        if self.params.pseudo_label == "xclp" and self.params.k > smallest - 1:
            raise InvalidInput(f"k = {self.params.k} neighbours need at least {self.params.k + 1} rows among the "
                               f"parties of a round, but the smallest {self.config.min_parties} bring {smallest}")

    # --- routing: a round's XCLP steps go to its RoundXclp ---------------------------------

    def payload_limit(self, sender: str, step: str, recipient: str) -> int:
        scope = fedavg.unscope(step)
        if scope is None:
            return super().payload_limit(sender, step, recipient)
        t, name = scope
        if name == fedavg.UPDATE_STEP:
            return 8 * (self._update_len() + 1)
        if name == fedavg.UPDATE_REVEAL:
            return super().payload_limit(sender, name, recipient)
        if self.xclp is not None and t == self.xclp.round:
            return self.xclp.payload_limit(sender, name, recipient)
        return wire.DEFAULT_MAX_PAYLOAD_BYTES

    def message(self, sender: str, msg: wire.Message) -> None:
        with self.lock:
            scope = fedavg.unscope(msg.step)
            if scope is not None and sender in self.active:
                t, name = scope
                if t < self.round or (t == self.round and sender not in self.members):
                    log.info("job %s: ignoring a late %s payload from %s (round %d is over for it)",
                             self.config.job_id, msg.step, sender, t)
                    return
                if name not in (fedavg.UPDATE_STEP, fedavg.UPDATE_REVEAL):
                    if self.xclp is None or t != self.xclp.round or self.xclp.stage is not Stage.RUNNING:
                        raise InvalidInput(f"step {msg.step!r} is not running")
                    self.xclp.message(sender, dataclasses.replace(msg, step=name))
                    return
            super().message(sender, msg)

    def tick(self, now: float) -> None:
        with self.lock:
            sub = self.xclp
            if sub is not None and sub.stage is Stage.RUNNING and sub.step is not None and now >= sub.step.deadline:
                self._exclude(sub.blame(sub.step), f"missed the deadline of step {self.wire_name(sub.step.name)!r}")
            elif self.stage is Stage.RUNNING and self.step is not None and fedavg.unscope(self.step.name) \
                    and now >= self.step.deadline:
                self._exclude(self.blame(self.step), f"missed the deadline of step {self.step.name!r}")
            else:
                super().tick(now)

    def _drop(self, parties: set[str], reason: str) -> None:
        super()._drop(parties, reason)
        sub = self.xclp
        if self.stage is Stage.RUNNING and sub is not None and sub.stage is Stage.RUNNING:
            sub._drop(set(parties) & set(sub.active), reason)

    # --- rounds -----------------------------------------------------------------------------

    def begin(self) -> None:
        self.net = initial_network(self.params.architecture(self.dim), self.params.seed)
        log.info("job %s: training a %s network (%d parameters) for %d rounds", self.config.job_id,
                 "-".join(map(str, self.net.arch.sizes)), self.net.arch.n_params, self.params.rounds)
        self._next_round()

    def _next_round(self) -> None:
        assert self.net is not None
        self.xclp, self.masked = None, None
        self.round += 1
        if self.round == self.params.rounds:
            self._finish_training()
            return
        t = self.round
        roster = sorted(self.parties)
        self.members = tuple(p for p in sample_parties(self.params.seed, t, roster, self.params.fraction)
                             if p in self.active)
        self._round_started = self.clock()
        self.round_changed.notify_all()
        if len(self.members) < self.config.min_parties:
            self._skip(f"only {len(self.members)} of its sampled parties are left")
            return
        self._open_round(t)

    def _open_round(self, t: int) -> None:
        """Send round t's parties θ, then run its XCLP or start its update."""
        assert self.net is not None
        for pid in self.members:
            self.send(pid, fedavg.scoped(t, fedavg.MODEL_MSG), 0, self.net.flat)
        if self.params.pseudo_labels_in(t) == "xclp":
            self.xclp = RoundXclp(self, t, self.members)
            self.xclp.begin()
        else:
            self._start_update(self.members, 0)

    def _start_update(self, members: tuple[str, ...], attempt: int) -> None:
        self.members = members
        self.start_step(fedavg.scoped(self.round, fedavg.UPDATE_STEP), list(members), round=attempt)

    def xclp_done(self, sub: RoundXclp) -> None:
        assert sub.membership is not None
        members = tuple(p for p in sub.membership.labels if p in self.active and p in self.members)
        log.info("job %s: round %d: XCLP pseudo-labels for %d parties", self.config.job_id, sub.round, len(members))
        if len(members) < self.config.min_parties:
            self._skip(f"only {len(members)} parties got XCLP pseudo-labels")
            return
        self._start_update(members, 0)

    def xclp_failed(self, sub: RoundXclp, reason: str) -> None:
        self._skip(f"its XCLP run failed: {reason}")

    def accept(self, step: Step, sender: str, payload: wire.Payload) -> None:
        scope = fedavg.unscope(step.name)
        assert scope is not None
        if scope[1] == fedavg.UPDATE_STEP:
            ring_array(payload, *fedavg.wire(self._update_len()), f"the masked update from {sender!r}")
        elif scope[1] == fedavg.UPDATE_REVEAL:
            check_reveal(payload, fedavg.round_session(self.session_id, self.round),
                         fedavg.scoped(self.round, fedavg.UPDATE_STEP), step, sender)
        else:
            raise InvalidInput(f"step {step.name!r} takes no contributions")

    def on_step_complete(self, step: Step) -> None:
        if step.name == fedavg.scoped(self.round, fedavg.UPDATE_STEP):
            self.masked = step  # DESIGN §6.1: all updates are here; ask each party for its self mask
            self.start_step(fedavg.scoped(self.round, fedavg.UPDATE_REVEAL), list(step.participants), round=step.round)
            return
        assert self.masked is not None and self.net is not None
        total = open_sum(self.masked, step, *fedavg.wire(self._update_len()))
        try:
            rows = self._apply_sum(total)
        except InvalidInput as exc:  # the parties' sum decodes to nonsense (NaN, impossible rows)
            self._skip(f"its update sum is unusable: {exc}")
            return
        self.history.append({"round": self.round, "parties": list(step.participants), "rows": rows,
                             "seconds": round(self.clock() - self._round_started, 3)})
        log.info("job %s: round %d: model updated from %d parties (%d rows) in %.3fs", self.config.job_id,
                 self.round, len(step.participants), rows, self.clock() - self._round_started)
        self._next_round()

    def on_dropped(self, step: Step, dropped: set[str]) -> None:
        """A party left the job during "update": the masks no longer cancel; next attempt without it."""
        self._retry_update(step, dropped)

    def on_reveal_lost(self, step: Step, dropped: set[str]) -> None:
        """The round's sum cannot be opened (DESIGN §6.1); θ stays and the next round starts."""
        self._skip(f"{', '.join(sorted(dropped))} left while revealing self masks, so its update sum is lost")

    # --- internals --------------------------------------------------------------------------

    def _exclude(self, parties: set[str], reason: str) -> None:
        """Leave `parties` out of this round only (they missed a deadline); they may be sampled again."""
        parties = set(parties) & set(self.members)
        if not parties:
            return
        for pid in sorted(parties):
            log.warning("job %s: round %d goes on without %s (%s)", self.config.job_id, self.round, pid, reason)
        self.members = tuple(p for p in self.members if p not in parties)
        self.round_changed.notify_all()
        sub = self.xclp
        step = self.step
        if sub is not None and sub.stage is Stage.RUNNING:
            sub._drop(parties & set(sub.active), reason)
        elif step is not None and step.name == fedavg.scoped(self.round, fedavg.UPDATE_STEP):
            self._retry_update(step, parties)
        elif step is not None and step.name == fedavg.scoped(self.round, fedavg.UPDATE_REVEAL):
            self.on_reveal_lost(step, parties)

    def _retry_update(self, step: Step, gone: set[str]) -> None:
        rest = tuple(p for p in step.participants if p not in gone and p in self.active)
        if len(rest) < self.config.min_parties:
            self._skip(f"only {len(rest)} parties are left for its update")
            return
        self._start_update(rest, step.round + 1)

    def _skip(self, why: str) -> None:
        log.warning("job %s: round %d skipped, the model stays: %s", self.config.job_id, self.round, why)
        self.skipped.append(self.round)
        if self.step is not None:
            self.past_steps.add(self.step.name)
        self.step = None
        self._next_round()

    def _apply_sum(self, total: np.ndarray) -> int:
        """θ ← θ + Σ n_jΔ_j / Σ n_j from the opened sum; returns Σ n_j (InvalidInput: unusable sum)."""
        assert self.net is not None
        delta, rows = fedavg.decode_update(total, self.params.frac_bits)
        self.net = server_update(self.net, delta, rows)
        return rows

    def _final_payload(self) -> np.ndarray:
        assert self.net is not None
        return self.net.flat

    def _finish_training(self) -> None:
        assert self.net is not None
        if self.config.model_path is not None:
            path = save_network(self.config.model_path, self.config.job_type, self.params, self.net)
            log.info("job %s: wrote the trained network to %s", self.config.job_id, path)
        final = self._final_payload()
        for pid in self.active:
            self.send(pid, fedavg.FINAL_MSG, 0, final)
        done = self.params.rounds - len(self.skipped)
        self.finish(f"{done} of {self.params.rounds} rounds trained" +
                    (f"; rounds {', '.join(map(str, self.skipped))} skipped" if self.skipped else ""))

    def _update_len(self) -> int:
        """Values in one party's update before its row count."""
        return self.params.architecture(self.dim).n_params


def save_network(path: Path, job_type: str, params: Any, net: Network) -> Path:
    """The coordinator's copy of a trained network (`model = "…"` in the job file), written atomically:
    job_type, params_json, the layer sizes and θ."""
    buf = io.BytesIO()
    np.savez(buf, job_type=np.array(job_type), params_json=np.array(params_json(params)),
             sizes=np.array(net.arch.sizes, dtype=np.int64), theta=net.flat)
    return write_atomic(path, buf.getvalue())
