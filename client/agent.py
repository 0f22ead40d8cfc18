"""`xclp-client agent`: an institution's always-on party.

    xclp-client agent --config agent.toml

The agent polls the coordinator (`Offers`, a call signed with the party's identity key) for runs
open for joining that name this party, and decides on each by its own configuration, whatever
the coordinator says:

- the job type must be in `policy.job_types`;
- the job must name, for this party, a data set of the agent's catalogue (`[datasets.<name>]`:
  path, label and id columns); jobs name data sets, never paths;
- the party's policy (docs/design.md §2.3) must accept the job: enough parties, DP if required, no
  hidden label mask unless allowed, Paillier keys between `min_key_bits` and `max_key_bits`.

A refused run is logged once, with the reason, and left alone. An accepted run runs on its own
thread with a fresh Paillier key if the job needs one; every key bundle signs the run's nonce,
and the session checks the coordinator still offers the same run with the same spec (the
Challenge's spec must be the Offer's the policy accepted, docs/design.md §2.5). Outputs go to
`<out>/<job>/<run>/` atomically (client/outputs.py). A run that fails or is cancelled leaves
nothing there; the agent logs why and goes on. SIGTERM or SIGINT: the agent stops polling, stops
its runs (their partial outputs are removed) and exits 0. An agent killed in a run (SIGKILL, a
crash) and started again on the same `state` within the job's reconnect_seconds is offered that run
back (Offer.rejoin) and rejoins it from its saved state where `xclp-client run` would. With
`runs = N` (`--runs N`: demos and tests) it stops by itself once it has taken part in N runs, and
then exits 0 only if all of them were done (5 otherwise).

agent.toml (every key is an option of client/options.py, which checks it and names it in an error
as it is written here; docs/cli.md lists where each option may be given):

    party = "hospital-a"
    identity = "keys/hospital-a.key"
    peers = "allow.toml"                 # pinned identity keys (from the operator, authenticated)
    coordinator = "coord.example.org:50051"
    ca_cert = "ca.pem"                   # and client_cert, client_key, server_name, insecure
    out = "runs/"
    poll_seconds = 2.0                   # also: connect_timeout, idle_timeout
    max_runs = 2                         # runs taken part in at once; further offers wait
    join_deadline = 1800                 # seconds a joined run may wait for its roster
    workers = "tls://dask.hospital-a.internal:8786"   # or a number of local processes (default: the cores)
    state = "state/"                     # the privacy ledger (default: <out>/.state/), docs/privacy.md

    [policy]
    job_types = ["xclp", "flynn"]        # default: every type
    min_parties = 3
    min_share_threshold = 2              # the fewest shares that may rebuild a lost self-mask seed
    require_dp = 1.0                     # optional
    require_label_dp = 4.0               # optional: labels DP with ε <= 4 (xclp's label_dp_epsilon)
    allow_hide_label_mask = false
    allow_unsketched_layers = false      # true: DBCL jobs that release some layers unsketched
    allow_non_dp_dbcl = false            # true: DBCL jobs without record-level DP (dp_epsilon)
    min_key_bits = 2048                  # insecure_test_keys = true allows less (tests only)
    max_key_bits = 4096
    max_memory_gb = 16
    max_work_minutes = 600               # Paillier work estimated longer is refused (default 1440)
    allow_rerun = false                  # true: release a data set exactly among another set of parties
    privacy_budget = [10.0, 1e-5]        # each data set's DP budget (ε, δ) over every run

    [datasets.train]
    path = "data/train.csv"
    label_column = "label"
    id_column = "patient_id"             # and delimiter
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from xclp.client import options
from xclp.client.api import read_data, take_part
from xclp.client.connection import Backoff, ConnectionConfig
from xclp.client.jobs.estimate import DEFAULT_MAX_WORK_MINUTES, work_seconds
from xclp.client.ledger import DEFAULT_BUDGET, Budget, Ledger
from xclp.client.options import Source
from xclp.client.outputs import check_dir_name, remove_partial, write_run_dir
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import RunConfig
from xclp.client.run_state import RunStateFile
from xclp.client.session import PartySession
from xclp.crypto import identity
from xclp.crypto.paillier import PaillierKeypair
from xclp.data import tables
from xclp.errors import ConfigError, PolicyRefused, RunCancelled, RunInterrupted, XclpError
from xclp.runtime import check_keys, read_bytes, read_toml
from xclp.v1 import calls, registry
from xclp.v1 import xclp_pb2 as pb
from xclp.v1 import xclp_pb2_grpc as pb_grpc
from xclp.v1.params import JobParams
from xclp.v1.status import error_from_rpc
from xclp.workers import WorkerSpec

log = logging.getLogger("xclp.agent")

DATASET_KEYS = {"path", "label_column", "id_column", "delimiter"}


@dataclass(frozen=True)
class Dataset:
    path: Path
    label_column: str | None = tables.DEFAULT_LABEL  # named in the catalogue: the table must have it
    id_column: str | None = None
    delimiter: str | None = None


@dataclass(frozen=True)
class AgentConfig:
    party: str
    identity: Path
    peers: Path
    connection: ConnectionConfig
    out: Path
    datasets: dict[str, Dataset]
    policy: PartyPolicy = PartyPolicy()
    job_types: frozenset[str] = field(default_factory=lambda: frozenset(registry.names()))
    min_key_bits: int = options.default("min_key_bits")
    max_key_bits: int = options.default("max_key_bits")
    poll_seconds: float = options.default("poll_seconds")
    join_wait: float = options.default("connect_timeout")
    idle_timeout: float = options.default("idle_timeout")
    # a coordinator could make an agent join 20 runs at once (a process pool and the data
    # each), and keep a joined run waiting for its roster forever with status messages
    max_runs: int = options.default("max_runs")  # runs taken part in at once
    join_deadline: float = options.default("join_deadline")  # seconds from Join to the roster
    workers: WorkerSpec = WorkerSpec()
    max_memory_bytes: int | None = None
    max_work_seconds: float = DEFAULT_MAX_WORK_MINUTES * 60
    state: Path | None = None  # the directory of its privacy ledger (client/ledger.py); None: no ledger
    privacy_budget: Budget = DEFAULT_BUDGET  # each data set's DP budget over every run
    allow_rerun: bool = options.default("allow_rerun")  # release a data set exactly among another set of parties

    @classmethod
    def load(cls, path: Path) -> AgentConfig:
        """agent.toml, each setting checked by client/options.py and named in an error as it is
        written there (`max_runs in agent.toml`, `[policy] min_parties in agent.toml`)."""
        raw = read_toml(path)
        base = path.parent
        top = options.read_settings(raw, options.Where(Source.AGENT, path), base=base, also=("policy", "datasets"))
        missing = [k for k in ("party", "identity", "peers", "coordinator", "out") if top.get(k) is None]
        if missing:
            raise ConfigError(f"{path}: missing {', '.join(missing)}")
        table = raw.get("policy", {})
        catalogue = raw.get("datasets", {})
        if not isinstance(table, dict) or not isinstance(catalogue, dict):
            raise ConfigError(f"{path}: [policy] and [datasets.<name>] must be tables")
        policy = options.read_settings(table, options.Where(Source.POLICY, path))
        datasets = {}
        for name, entry in catalogue.items():
            if not isinstance(entry, dict) or "path" not in entry:
                raise ConfigError(f"{path}: [datasets.{name}] needs path = \"<file>\"")
            check_keys(f"{path} [datasets.{name}]", entry, DATASET_KEYS)
            datasets[name] = Dataset(base / entry["path"], entry.get("label_column", tables.DEFAULT_LABEL) or None,
                                     entry.get("id_column") or None, entry.get("delimiter"))
        if not datasets:
            raise ConfigError(f"{path}: the catalogue is empty: add [datasets.<name>] with the path of a table")
        known = registry.names()
        types = policy.get("job_types", sorted(known))
        unknown = sorted(set(types) - set(known))
        if unknown:
            raise ConfigError(f"{path}: [policy] job_types names unknown type(s) {', '.join(unknown)}; "
                              f"known: {', '.join(sorted(known))}")
        identity.check_party_id(top["party"])
        memory = policy.get("max_memory_gb")

        def setting(name: str, settings: dict[str, Any] = top) -> Any:
            return options.value(settings, name)

        return cls(
            party=top["party"], identity=top["identity"], peers=top["peers"], out=top["out"],
            connection=ConnectionConfig(address=top["coordinator"], ca_cert=top.get("ca_cert"),
                                        client_cert=top.get("client_cert"), client_key=top.get("client_key"),
                                        server_name=top.get("server_name"), insecure=setting("insecure")),
            datasets=datasets,
            policy=PartyPolicy.from_settings(policy, named=options.Where(Source.POLICY, path).named),
            job_types=frozenset(types),
            min_key_bits=setting("min_key_bits", policy),
            max_key_bits=setting("max_key_bits", policy),
            poll_seconds=setting("poll_seconds"),
            join_wait=setting("connect_timeout"),
            idle_timeout=setting("idle_timeout"),
            max_runs=setting("max_runs"),
            join_deadline=setting("join_deadline"),
            workers=WorkerSpec.parse(top.get("workers"), insecure=setting("insecure_workers"),
                                     given=f"workers in {path}", insecure_given=f"insecure_workers = true in {path}"),
            max_memory_bytes=None if memory is None else int(memory * 2**30),
            max_work_seconds=work_seconds(policy.get("max_work_minutes"), policy.get("max_paillier_hours")),
            state=top.get("state") or top["out"] / ".state",
            privacy_budget=Budget.of(policy.get("privacy_budget"), f"[policy] privacy_budget in {path}"),
            allow_rerun=setting("allow_rerun", policy))


RunKey = tuple[str, str]  # (job id, run id): run ids are per job, so "1" of two jobs are two runs


@dataclass
class _Active:
    job_id: str
    session: PartySession | None = None
    thread: threading.Thread | None = None


@dataclass
class Agent:
    config: AgentConfig
    say: Callable[[str], None] = field(default=lambda message: log.info("%s", message))

    def __post_init__(self) -> None:
        self.key = identity.load_private_key(read_bytes(self.config.identity, "identity key"),
                                             source=str(self.config.identity))
        self.peers = identity.allow_list(read_toml(self.config.peers).get("parties"), source=str(self.config.peers))
        if self.peers.get(self.config.party) != identity.public_bytes(self.key):
            raise ConfigError(f"the identity key {self.config.identity} is not the key pinned for "
                              f"{self.config.party!r} in {self.config.peers}")
        self.ledger = None if self.config.state is None else Ledger(
            self.config.state, budget=self.config.privacy_budget, allow_rerun=self.config.allow_rerun,
            identity=self.key)
        self.seen: set[RunKey] = set()  # runs decided on
        self.active: dict[RunKey, _Active] = {}
        self.finished: dict[RunKey, bool] = {}  # done (True) or failed or stopped (False)
        self.waiting: set[RunKey] = set()  # offers left for later: max_runs were active
        self.lock = threading.Lock()
        self._last_poll_error = ""
        self._backoff = Backoff(first=self.config.poll_seconds)  # polls of an unreachable coordinator

    # --- the loop ------------------------------------------------------------------------------

    def serve(self, stop: threading.Event, *, runs: int | None = None) -> None:
        """Poll and take part until `stop` is set, or until `runs` runs are over."""
        channel = self.config.connection.channel()
        stub = pb_grpc.CoordinatorStub(channel)
        self.say(f"agent for {self.config.party}: polling {self.config.connection.address} every "
                 f"{self.config.poll_seconds:g} s; catalogue: {', '.join(sorted(self.config.datasets))}; "
                 f"job types: {', '.join(sorted(self.config.job_types))}")
        try:
            while not stop.is_set():
                with self.lock:
                    if runs is not None and len(self.finished) >= runs and not self.active:
                        self.say(f"took part in {runs} run(s); stopping")
                        return
                    busy = runs is not None and len(self.finished) + len(self.active) >= runs
                if not busy:
                    for offer in self.poll(stub):
                        self.consider(offer)
                stop.wait(self._backoff.next() if self._last_poll_error else self.config.poll_seconds)
        finally:
            self.stop_runs()
            channel.close()

    def poll(self, stub: pb_grpc.CoordinatorStub) -> list[pb.Offer]:
        signed = calls.sign_call(self.key, self.config.party, calls.OFFERS, pb.OffersRequest())
        try:
            offers = list(stub.Offers(signed, timeout=30).offers)
        except grpc.RpcError as exc:
            message = str(error_from_rpc(exc))
            if message != self._last_poll_error:  # say it once, not every poll
                self.say(f"polling the coordinator failed: {message}; retrying with back-off (up to "
                         f"{self._backoff.cap:g} s between polls)")
            self._last_poll_error = message
            return []
        if self._last_poll_error:
            self.say("polling the coordinator works again")
            self._last_poll_error = ""
            self._backoff.reset()
        return offers

    def consider(self, offer: pb.Offer) -> None:
        key = (offer.spec.job_id, offer.run_id)
        with self.lock:
            if key in self.seen:
                return
            if len(self.active) >= self.config.max_runs:  # offered again at a later poll
                if key not in self.waiting:
                    self.waiting.add(key)
                    self.say(f"run {offer.run_id} of job {offer.spec.job_id} waits: {len(self.active)} runs are "
                             f"under way (max_runs = {self.config.max_runs})")
                return
            self.waiting.discard(key)
            self.seen.add(key)
        job = offer.spec.job_id
        try:
            params, dataset = self.check(offer)
        except XclpError as exc:
            self.say(f"refused run {offer.run_id} of job {job}: {exc}")
            return
        if offer.rejoin and (self.ledger is None or not RunStateFile(
                self.ledger.directory, self.config.party, job, self.key).path.exists()):
            self.say(f"run {offer.run_id} of job {job} keeps this party's place, but this agent has no saved state "
                     "of it: it cannot rejoin, and the coordinator drops it after the job's reconnect_seconds")
            return
        self.say(f"{'rejoining' if offer.rejoin else 'taking part in'} run {offer.run_id} of job {job} "
                 f"({offer.spec.job_type}) with data set {offer.spec.datasets[self.config.party]!r}")
        active = _Active(job)
        active.thread = threading.Thread(target=self._run, args=(offer, params, dataset, active),
                                         name=f"xclp-run-{offer.run_id}", daemon=True)
        with self.lock:
            self.active[key] = active
        active.thread.start()

    def check(self, offer: pb.Offer) -> tuple[JobParams, Dataset]:
        """This party's own decision on an offered run (raises PolicyRefused or ConfigError)."""
        spec = offer.spec
        check_dir_name(spec.job_id, "job id")  # they name <out>/<job>/<run>/
        check_dir_name(offer.run_id, "run id")
        if spec.job_type not in self.config.job_types:
            raise PolicyRefused(f"job type {spec.job_type!r} is not among this agent's job_types "
                                f"({', '.join(sorted(self.config.job_types))})")
        name = spec.datasets.get(self.config.party)
        if not name:
            raise PolicyRefused("the job names no data set for this party (dataset = \"<catalogue name>\")")
        dataset = self.config.datasets.get(name)
        if dataset is None:
            raise PolicyRefused(f"the job asks for data set {name!r}, which is not in this agent's catalogue "
                                f"({', '.join(sorted(self.config.datasets))})")
        params = registry.params_from_json(spec.job_type, spec.params_json)
        self.config.policy.check_job(spec, params)
        keys = params.paillier
        if keys is not None:
            low = self.config.min_key_bits if not self.config.policy.insecure_test_keys else 0
            if not low <= keys.bits <= self.config.max_key_bits:
                raise PolicyRefused(f"the job uses {keys.bits}-bit Paillier keys; this agent takes "
                                    f"{self.config.min_key_bits} to {self.config.max_key_bits} (min_key_bits, "
                                    f"max_key_bits)")
        return params, dataset

    def _run(self, offer: pb.Offer, params: JobParams, dataset: Dataset, active: _Active) -> None:
        job, run = offer.spec.job_id, offer.run_id
        ok = False
        try:
            paillier, keys = None, params.paillier
            if keys is not None and not offer.rejoin:  # a rejoin has the key of its saved state
                paillier = PaillierKeypair.generate(keys.bits,
                                                    allow_insecure_test_size=self.config.policy.insecure_test_keys)
            config = RunConfig(job_id=job, party_id=self.config.party, identity=self.key,
                               connection=self.config.connection, join_wait_seconds=self.config.join_wait,
                               idle_seconds=self.config.idle_timeout, paillier=paillier, peers=self.peers,
                               policy=self.config.policy, workers=self.config.workers,
                               max_memory_bytes=self.config.max_memory_bytes,
                               max_work_seconds=self.config.max_work_seconds, run_id=run,
                               roster_wait_seconds=self.config.join_deadline,
                               accepted_spec=offer.spec, ledger=self.ledger)
            say = lambda m: self.say(f"[{job} run {run}] {m}")  # noqa: E731
            data = read_data(dataset.path, label_column=dataset.label_column, id_column=dataset.id_column,
                             delimiter=dataset.delimiter, progress=say)
            result = take_part(config, data, progress=say, started=lambda session: setattr(active, "session", session))
            path = write_run_dir(self.config.out, job, run, result)
            self.say(f"run {run} of job {job} done: outputs in {path}")
            ok = True
        except (RunCancelled, RunInterrupted) as exc:
            self.say(f"run {run} of job {job} stopped: {exc}; nothing written")
        except XclpError as exc:
            self.say(f"run {run} of job {job} failed: {exc}; nothing written")
        except Exception:
            log.exception("run %s of job %s failed unexpectedly; nothing written", run, job)
        finally:
            remove_partial(self.config.out, job, run)
            with self.lock:
                self.finished[(job, run)] = ok
                self.active.pop((job, run), None)

    def stop_runs(self, timeout: float = 30.0) -> None:
        with self.lock:
            active = list(self.active.values())
        for a in active:
            if a.session is not None:
                a.session.abort()
        for a in active:
            if a.thread is not None:
                a.thread.join(timeout)
