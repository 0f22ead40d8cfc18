"""One party's run of one job: the party-side state machine (docs/design.md §4, §6; docs/architecture.md).

    (Challenge: the run nonce; a fresh bundle signing it; Join)
    JOINED  --Roster (every key pinned in --peers, every signature and nonce checked, own entry
              unmodified)--> KEYED
    KEYED   --StepStart "seed"--> the seed phase (client/phases/seed.py) --> SEEDED
    SEEDED  --StepStart "moments", message "moments_result" (a job that standardises or imputes,
              docs/design.md §8)--> the preparation (client/phases/prepare.py) prepares the table
    SEEDED  every later step and message goes to the job type's PartyJob (xclp.v1.registry)
    any     --the job's result--> --JobEnd DONE--> DONE (result returned)
    JOINED  --JoinStatus--> tell the user who has joined and when the join deadline is
            --JobEnd FAILED/DROPPED, stream lost past the job's reconnect_seconds (client/connection.py
              resumes it until then), or nothing for `idle_seconds`--> error (the coordinator told why)
            --JobEnd REFUSED (the job cannot run with the parties' data)--> InvalidInput (exit 2)
    any     --JobEnd CANCELLED (the operator cancelled the run)--> RunCancelled; --JobEnd INTERRUPTED (the
              coordinator shut down), or its restart lost the run--> RunInterrupted (xclp.v1.status)

Every StepStart passes the party's own step guard first (client/policy.py): enough participants,
always this party, strictly shrinking restarts, nothing after the result.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import replace

import numpy as np

from xclp.client import run_state
from xclp.client.before_join import account_for, check_job_fits, declining, join_request, with_paillier_key
from xclp.client.connection import Connection
from xclp.client.context import PartyContext, Progress, RelayedPhase
from xclp.client.heartbeat import Heartbeat
from xclp.client.jobs.base import PartyJob
from xclp.client.jobs.estimate import WorkLimits, default_max_memory
from xclp.client.ledger import RunAccount, data_digest
from xclp.client.membership import Membership
from xclp.client.phases.prepare import Preparation
from xclp.client.policy import PartyPolicy, StepGuard
from xclp.client.run_config import JobResult, PartyStage, RunConfig, checked_table, privacy_report
from xclp.crypto import identity, masking
from xclp.data.party_table import PartyData
from xclp.errors import DeadlineExceeded, InvalidInput, PolicyRefused, ProtocolError, RunCancelled
from xclp.progress import Console, duration
from xclp.v1 import moments, registry, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.params import JobParams
from xclp.v1.spec import canonical_spec
from xclp.v1.status import ended_early
from xclp.v1.steps import ALIVE_MSG, MOMENTS_RESULT_MSG, SEED_RELAY_MAX_BYTES, SEED_STEP
from xclp.workers import DaskWorkers, make_executor

DataLoader = Callable[[JobParams], PartyData]  # the party's table, read for the job's parameters
_NOT_LOADED = PartyData(np.zeros((0, 0)), None, ())


# a line per message on stderr; on a terminal also the bar of a long step (xclp.progress)
stderr_progress = Console("xclp-client: ")


class PartySession:
    def __init__(self, config: RunConfig, data: PartyData | DataLoader, *,
                 progress: Progress = stderr_progress) -> None:
        self.config = config
        # a loader reads the table once the job's parameters are known (categorical columns, docs/design.md §8)
        self.loader: DataLoader | None = None if isinstance(data, PartyData) else data
        self.data = data if isinstance(data, PartyData) else _NOT_LOADED
        self.progress = progress
        self.stage = PartyStage.JOINED
        self.x25519 = masking.generate_x25519()
        self.run_nonce, self.run_id, self.spec, self.data_digest = b"", "", pb.JobSpec(), b""  # data_digest: _load_data
        self.signed: identity.SignedBundle | None = None  # signed once the run nonce is known
        self.member: Membership | None = None  # its place in the run, once the roster is verified
        self.params: JobParams | None = None
        self.job_type = ""
        self.participants: tuple[str, ...] = ()
        self.job: PartyJob | None = None
        self.prep: Preparation | None = None
        self.columns = self.data.columns  # as read, before preparation drops any
        self.waiting_for: tuple[str, ...] = ()  # expected parties not joined yet (last JoinStatus)
        self.guard = StepGuard(config.policy, config.party_id)
        self.assembler = wire.Assembler()
        self.account: RunAccount | None = None  # this run in the ledger, once the data is read
        self._executor: Executor | None = None
        self._conn: Connection | None = None
        self._aborted = False
        self._ended = False
        self.state_unsaved = False  # a run state could not be written (said once; client/run_state.py)

    # --- driver -------------------------------------------------------------------------------

    def run(self) -> JobResult:
        conn = Connection(self.config.connection, self.config.job_id)
        self._conn = conn
        try:
            if self._aborted:
                raise RunCancelled("stopped before joining")
            return self._run(conn)
        except Exception:  # a closed channel fails the next call with whatever gRPC raises
            if self._aborted:
                raise RunCancelled("this party stopped during the run") from None
            raise
        finally:
            conn.close()

    def abort(self) -> None:
        """From another thread: stop the run now (the session's thread raises RunCancelled)."""
        self._aborted = True
        if self._conn is not None:
            self._conn.leave(self.config.party_id, "it was stopped")  # dropped at once, not waited for
            self._conn.close()
        if self._executor is not None:  # Paillier work in flight ends now: its thread wakes and unwinds
            self._executor.shutdown(wait=False, cancel_futures=True)

    def start_workers(self, paillier: bool) -> None:
        """Where this run's Paillier work goes (xclp/workers.py), if it has any: before Join, or on a rejoin."""
        self._executor = make_executor(self.config.workers) if paillier else None
        if isinstance(self._executor, DaskWorkers):
            self.progress(self._executor.describe())

    @property
    def conn(self) -> Connection:
        if self._conn is None:
            raise ProtocolError("this session is not connected")
        return self._conn

    @property
    def token(self) -> bytes | None:  # the run's session token once joined (client/run_state.py keeps it)
        return self._conn.token if self._conn is not None else None

    def push(self, payload: wire.Payload, *, sender: str, step: str, round: int, recipient: str = "") -> int:
        """A Pusher for the phases: the session's connection, once it is connected."""
        return self.conn.push(payload, sender=sender, step=step, round=round, recipient=recipient)

    def push_all(self, messages: Sequence[wire.Outgoing], *, sender: str) -> int:
        return self.conn.push_all(messages, sender=sender)

    def _run(self, conn: Connection) -> JobResult:
        self.config.check_identity()
        challenge = conn.challenge(self.config.identity, self.config.party_id,
                                   wait_seconds=self.config.join_wait_seconds, say=self.progress)
        if len(challenge.run_nonce) != 16:
            raise ProtocolError("the coordinator's run nonce must be 16 bytes")
        if self.config.run_id and challenge.run_id != self.config.run_id:
            raise ProtocolError(f"run {self.config.run_id} of job {self.config.job_id!r} is no longer open for joining "
                                f"(the coordinator now offers run {challenge.run_id or 'none'})")
        self.run_nonce, self.run_id, self.spec = challenge.run_nonce, challenge.run_id, challenge.spec
        self.job_type = challenge.spec.job_type
        params = self.params = registry.params_from_json(challenge.spec.job_type, challenge.spec.params_json)
        accepted = self.config.accepted_spec
        if accepted is not None and canonical_spec(accepted) != canonical_spec(challenge.spec):
            raise ProtocolError(f"the coordinator's challenge for run {challenge.run_id} names another job spec than "
                                "the offer this party's policy accepted: not joining")
        refusing = functools.partial(declining, self.config, conn, challenge.run_nonce, progress=self.progress)
        with refusing(pb.DeclineRequest.POLICY, PolicyRefused):  # the coordinator hears at once, not at its deadline
            self.config.policy.check_job(challenge.spec, params)
        self.guard.job_min_parties = challenge.spec.min_parties
        if challenge.spec.min_parties < (mine := self.config.policy.min_parties):
            self.progress(f"note: the job goes on with {challenge.spec.min_parties} parties (its min_parties); this "
                          f"party stops below {mine} ({self.config.policy.named('min_parties')}, "
                          f"default {PartyPolicy.min_parties})")
        with refusing(pb.DeclineRequest.BAD_DATA, InvalidInput):
            self._load_data(params)
        self.work_limits = WorkLimits(self.config.max_work_seconds, challenge.spec.max_run_seconds)
        saved = run_state.saved_for(self, challenge)
        if saved is not None:  # this party's process restarted in the run: it rejoins (client/run_state.py)
            token = self._rejoin(saved)
            conn.rejoin(token, challenge.spec.reconnect_seconds)
            return self._serve(conn, restarted=True)
        self.account = account_for(self.config, conn, challenge, params, self.data, self.data_digest, self.progress)
        keys = params.paillier
        self.config = with_paillier_key(self.config, params, self.progress)  # a rejoin has its own (above)
        self.start_workers(keys is not None)  # before joining: a cluster that does not answer refuses the job here
        try:
            check_job_fits(self.config, conn, challenge, params, self.data, self._executor, self.work_limits,
                           self.progress)
            self.signed, request = join_request(self.config, challenge, params, self.data, self.x25519)
            response = conn.join(request)
            if response.spec != challenge.spec:
                conn.leave(self.config.party_id, "the coordinator answered Join with another spec")
                raise ProtocolError("the coordinator answered Join with another job spec than its Challenge")
        except BaseException:
            if self._executor is not None:
                self._executor.shutdown(cancel_futures=True)
            raise
        self.progress(f"joined job {self.config.job_id} ({self.job_type}) as {self.config.party_id}; "
                      f"{len(response.spec.expected_parties)} parties expected")
        conn.reconnect_seconds = response.spec.reconnect_seconds
        return self._serve(conn)

    def _serve(self, conn: Connection, *, restarted: bool = False) -> JobResult:
        """The run's Pull stream, item by item, until the job's result (or an error)."""
        reader, heartbeat, kept = None, None, False
        try:
            reader = conn.pull(say=self.progress, restarted=restarted, peek=self._peek)
            heartbeat = Heartbeat(lambda text: conn.push(text, sender=self.config.party_id, step=ALIVE_MSG, round=0,
                                                         timeout=30.0))
            joined_at = time.monotonic()
            while self.stage is not PartyStage.DONE:
                wait, roster_due = self._wait(joined_at)
                try:
                    item = reader.next(wait)
                except DeadlineExceeded as exc:
                    if roster_due:
                        raise self._roster_late() from None
                    if self.stage is PartyStage.JOINED and self.waiting_for:
                        raise DeadlineExceeded(f"{exc} while waiting for {', '.join(self.waiting_for)} to join; "
                                               "ask them, or the operator, or raise --idle-timeout") from None
                    raise
                heartbeat.pace(item.step.deadline_seconds if item.HasField("step") else 0.0)
                with heartbeat.busy(item.step.step or item.frame.step or "the run"):  # reports while at work
                    self.handle(item)
        except Exception as exc:  # the coordinator hears why this party stops, and drops it at once
            if not (self._ended or self._aborted):
                conn.leave(self.config.party_id, exc)
            raise
        except BaseException:  # SIGTERM, Ctrl-C: the coordinator keeps its place for reconnect_seconds
            kept = run_state.kept(self)
            raise
        finally:
            if reader is not None:
                reader.cancel()
            if heartbeat is not None:
                heartbeat.stop()
            if self._executor is not None:
                self._executor.shutdown(cancel_futures=True)
            if not kept:
                run_state.forget(self)
        seed = None if self.member is None else self.member.seed.seed
        assert self.job is not None and self.job.result is not None and seed is not None
        assert self.params is not None
        return JobResult(self.job_type, self.params, self.data.X.shape[1], seed, self.job.result,
                         self.participants, self.prep.scaling if self.prep is not None else None, self.columns,
                         self.job.rounds(), privacy_report(self.job.privacy(), self.prep, self.account,
                                                           self.progress), self.job.approximation)

    def _peek(self, item: pb.PullItem) -> None:
        """An item as it arrives (the stream's thread): a later attempt ends this one's work (PartyJob.superseded)."""
        if item.HasField("step") and self.job is not None:
            self.job.superseded(item.step)

    def _wait(self, joined_at: float) -> tuple[float, bool]:
        """How long to wait for the coordinator's next item, and whether that is the roster deadline:
        the idle timeout, and before the roster no later than the roster deadline (a status every
        minute must not keep a party forever)."""
        limit = self.config.roster_wait_seconds
        if self.stage is not PartyStage.JOINED or limit is None:
            return self.config.idle_seconds, False
        left = joined_at + limit - time.monotonic()
        if left <= 0:
            raise self._roster_late()
        return min(self.config.idle_seconds, left), left <= self.config.idle_seconds

    def _roster_late(self) -> DeadlineExceeded:
        return DeadlineExceeded(f"joined {self.config.roster_wait_seconds:.0f} s ago and the run has not started "
                                "(no roster): giving up (an agent's join_deadline)")

    def _load_data(self, params: JobParams) -> None:
        """The party's table, read for the job's parameters and checked before joining; with a ledger, its digest."""
        if self.loader is not None:
            self.data = self.loader(params)
            self.columns = self.data.columns
        read = self.data  # the data set is the table as read, before the job prepares it (xclp.data.identity)
        self.data = checked_table(read, params)
        self.data_digest = data_digest(read) if self.config.ledger is not None else b""

    # --- transitions --------------------------------------------------------------------------

    def handle(self, item: pb.PullItem) -> None:
        kind = item.WhichOneof("item")
        if kind == "roster":
            self.on_roster(item.roster)
        elif kind == "step":
            self.on_step(item.step)
        elif kind == "frame":
            message = self.assembler.add(item.frame, limit=self._payload_limit(item.frame))
            if message is not None:
                self.on_message(message)
        elif kind == "end":
            self.on_end(item.end)
        elif kind == "status":
            self.on_status(item.status)
        elif kind == "alive":  # news that the run goes on (server/liveness.py): the wait for the next starts again
            pass
        else:
            raise ProtocolError("the coordinator sent an empty item")

    def _payload_limit(self, frame: pb.Frame) -> int:
        """What this party will buffer of a message of the frame's step (docs/design.md §3): checked at its
        first frame; a step this party never gets a message of is refused there."""
        step, sender = frame.step, frame.sender
        if step == SEED_STEP:
            return SEED_RELAY_MAX_BYTES
        phase = self._relayed(step)
        if phase is not None:  # a masked sum's relays (client/phases/masked_sum.py)
            return phase.payload_limit(step, sender)
        if step == MOMENTS_RESULT_MSG and sender == "":
            return wire.array_bytes(*moments.wire(self.data.X.shape[1]))
        if self.stage is not PartyStage.SEEDED:
            raise ProtocolError(f"{sender or 'the coordinator'!r} sent a {step!r} message before the common seed")
        return self._job().payload_limit(step, sender)

    def _relayed(self, step: str) -> RelayedPhase | None:
        """The phase under way (the preparation's, or one the job lists) whose messages `step` names."""
        phases = (*(self.prep.phases() if self.prep is not None else ()),
                  *(self.job.phases() if self.job is not None else ()))
        return next((p for p in phases if p.receives(step)), None)

    def on_roster(self, roster: pb.Roster) -> None:
        if self.stage is not PartyStage.JOINED:
            raise ProtocolError("the coordinator sent a second roster")
        assert self.signed is not None and self.params is not None
        member = self.member = Membership.verified(
            [(b.bundle, b.signature) for b in roster.bundles], party_id=self.config.party_id,
            job_id=self.config.job_id, nonce=self.run_nonce, x25519=self.x25519, own=self.signed,
            peers=self.config.peers, pusher=self, progress=self.progress)
        # defaults that follow the run's size, from the signed row counts, as the coordinator's
        self.params = self.params.for_rows(sum(b.rows for b in member.roster.bundles))
        self.stage = PartyStage.KEYED
        self.progress(f"roster verified: {', '.join(member.roster.party_ids)}")

    def on_step(self, step: pb.StepStart) -> None:
        member = self.member
        if member is None:
            raise ProtocolError(f"step {step.step!r} started before the roster")
        members = list(step.participants)
        if self.config.party_id not in members or not set(members) <= set(member.roster.party_ids):
            raise ProtocolError(f"step {step.step!r} names participants outside the roster or without us")
        if members != sorted(set(members)):
            raise ProtocolError("step participants must be sorted and unique")
        self.guard.check_step(step)  # docs/design.md §2.3-2.4: minimum set, shrinking restarts, none after a result
        if step.step == SEED_STEP:  # again if the leader was lost: a new leader, a new seed for all
            if self.job is not None or self.prep is not None:
                raise ProtocolError("the seed step started after the job's first step")
            member.seed.on_step(step)
            self._seeded()
            return
        if self.stage is not PartyStage.SEEDED:
            raise ProtocolError(f"step {step.step!r} started before this party had the common seed")
        if self.params is not None and self.params.prepares and (self.prep is None or self.prep.scaling is None):
            self._preparation().on_step(step)  # the job's first step waits for the pooled moments
        else:
            self._job().on_step(step)
        self.participants = tuple(members)

    def on_message(self, message: wire.Message) -> None:
        phase = self._relayed(message.step)
        if phase is not None:  # a masked sum's relays: confirmations, vectors, seeds, peers' seed shares
            phase.on_relay(message)
            return
        if message.step == SEED_STEP:
            if self.member is None:
                raise ProtocolError("a sealed seed arrived before the roster")
            self.member.seed.on_message(message)
            self._seeded()
            return
        if message.step == MOMENTS_RESULT_MSG:
            prep = self._preparation()
            prep.on_message(message)
            self.data = prep.prepared()
            return
        job = self._job()
        job.on_message(message)
        if job.result is not None:
            self.guard.finished = True

    def on_status(self, status: pb.JoinStatus) -> None:
        if self.stage is not PartyStage.JOINED:
            return  # late news: the job has started
        self.waiting_for = tuple(status.waiting_for)
        waiting = f"; waiting for {', '.join(status.waiting_for)}" if status.waiting_for else ""
        self.progress(f"joined; {status.joined} of {status.expected} parties so far (the job starts with "
                      f"{status.min_parties} at its join deadline){waiting}; "
                      f"join deadline in {duration(status.join_deadline_seconds)}")

    def on_end(self, end: pb.JobEnd) -> None:
        self._ended = True  # the coordinator ended this party's run: nothing to tell it on the way out
        if end.outcome != pb.JobEnd.DONE:
            raise ended_early(end, self.config.party_id)
        if self.job is None or self.job.result is None:
            raise ProtocolError("the job ended without sending this party the aggregate")
        self.stage = PartyStage.DONE
        self.progress(f"job done: {end.reason}")

    def _seeded(self) -> None:
        if self.member is not None and self.member.seed.seed is not None:
            self.participants = self.member.seed.participants
            self.stage = PartyStage.SEEDED

    def context(self) -> PartyContext:
        member = self.member
        assert self.params is not None and member is not None and member.seed.seed is not None
        return PartyContext(self.config.party_id, self.params, self.data, member.roster, member.seed.seed,
                            member.masker, self, self.progress, keypair=self.config.paillier,
                            executor=self._executor, work_limits=self.work_limits,
                            max_memory_bytes=(default_max_memory() if self.config.max_memory_bytes is None
                                              else self.config.max_memory_bytes), transcript=member.transcript,
                            sign=self.config.identity.sign, account=self.account,
                            checkpoint=lambda: run_state.checkpoint(self),
                            min_share_threshold=self.config.policy.min_share_threshold,
                            min_parties=self.config.policy.min_parties)

    def _rejoin(self, saved: run_state.Saved) -> bytes:
        """This session where its run's state was saved (XCLP: SecureHamming; training: a round), as
        its Join and roster made it (client/run_state.py reads the file); the run's session token."""
        meta, config = saved.meta, self.config
        self.config = replace(config, paillier=run_state.paillier_of(meta))
        member = self.member = Membership.restored(meta, party_id=config.party_id, job_id=config.job_id,
                                                   peers=config.peers, pusher=self, progress=self.progress)
        self.run_nonce, self.signed, self.x25519 = member.nonce, member.signed, member.x25519
        self.participants, self.stage = tuple(meta["participants"]), PartyStage.SEEDED
        self.guard.restore(meta["guard"])
        self.params = self.params.with_resolved(meta["params"])  # type: ignore[union-attr]  # as resolved then
        self.account = run_state.account_of(meta, config.ledger, config.job_id, self.data_digest)
        self.start_workers(self.params.paillier is not None)
        if (scaling := run_state.scaling_of(saved)) is not None:
            self.prep = Preparation.restored(self.context(), scaling)
            self.data = self.prep.prepared()
        self.job = run_state.restored_job(self.job_type, self.context(), saved)
        self.progress(f"restarted: rejoining run {self.run_id} of job {config.job_id} from its saved state")
        return bytes.fromhex(meta["token"])

    def _preparation(self) -> Preparation:
        """The moments phase (docs/design.md §8): only for a job that asks for it, before its first step."""
        assert self.params is not None
        if not self.params.prepares:
            raise ProtocolError("the coordinator started the moments step of a job that neither standardises nor "
                                "imputes")
        if self.job is not None or self.stage is not PartyStage.SEEDED:
            raise ProtocolError("the moments step must come after the seed and before the job's first step")
        if self.prep is None:
            self.prep = Preparation(self.context())
        return self.prep

    def _job(self) -> PartyJob:
        """The job type's PartyJob, made once the common seed is here and the data prepared."""
        if self.job is None:
            if self.stage is not PartyStage.SEEDED:
                raise ProtocolError("a job step started before this party had the common seed")
            assert self.params is not None
            if self.params.prepares and (self.prep is None or self.prep.scaling is None):
                raise ProtocolError("the job's first step came before the pooled moments (docs/design.md §8)")
            self.job = registry.get(self.job_type).party_class()(self.context())
        return self.job
