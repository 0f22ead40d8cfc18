"""The test harness: an in-process coordinator on a free port, parties on threads, and the hooks
end-to-end tests use to watch and steer them (what the coordinator accepted, its clock, a party
that dies at a step)."""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from xclp.client.connection import ConnectionConfig
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult, RunConfig
from xclp.client.session import PartySession
from xclp.crypto import identity
from xclp.data.party_table import PartyData
from xclp.server.config import JobConfig, TlsFiles
from xclp.server.coordinator import Coordinator
from xclp.server.service import build_server
from xclp.v1 import calls
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.registry import parse_params
from xclp.v1.spec import spec_digest

PARTIES = ("a", "b", "c")
T = TypeVar("T")


def allow_list(keys, parties=(*PARTIES, "d")) -> dict[str, bytes]:
    return {p: identity.public_bytes(keys[p]) for p in parties}


def job(job_id: str, job_type: str, params: dict, parties=PARTIES, min_parties: int = 2,
        step_seconds: float = 30.0, join_seconds: float = 30.0, reconnect_seconds: float = 1.0) -> JobConfig:
    """A job as the tests run it: a party whose connection is lost (one that dies, DiesAt) is dropped
    after 1 s rather than the 30 s a real deployment gives it to come back."""
    return JobConfig(job_id, job_type, parse_params(job_type, params), tuple(parties), min_parties,
                     join_seconds, step_seconds, reconnect_seconds=reconnect_seconds)


def challenge(stub, key, party: str, job_id: str) -> pb.ChallengeResponse:
    """A Challenge as a party asks it: a call signed with its identity key."""
    return stub.Challenge(calls.sign_call(key, party, calls.CHALLENGE, pb.ChallengeRequest(job_id=job_id)), timeout=10)


def key_bundle(key, party: str, job_id: str, *, spec: pb.JobSpec | None, nonce: bytes,
               summary: pb.DataSummary, x25519: bytes | None = None, **extra) -> identity.KeyBundle:
    """The bundle a party signs for a run: its keys, the run nonce, the spec digest (of `spec`;
    none without one) and its data summary."""
    return identity.KeyBundle(party, job_id, identity.public_bytes(key), x25519 or secrets.token_bytes(32), nonce,
                              spec_digest=b"" if spec is None else spec_digest(spec, nonce), rows=summary.rows,
                              labeled_rows=summary.labeled_rows, dim=summary.dim, **extra)


def admit(run, keys, party: str, summary: pb.DataSummary, *, job_id: str | None = None, **extra):
    """`party` joins `run` in process, as its session would: a bundle over the run's nonce and spec
    and `summary`, signed with its key."""
    bundle = key_bundle(keys[party], party, job_id or run.config.job_id, spec=run.config.spec(), nonce=run.run_nonce,
                        summary=summary, **extra)
    return run.join(identity.sign_bundle(keys[party], bundle), summary)


def party_data(seed: int, n: int = 60, d: int = 8, n_classes: int = 3, unlabeled: int = 5) -> PartyData:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) + rng.integers(0, n_classes, size=(n, 1))
    y = rng.integers(0, n_classes, size=n)
    y[:unlabeled] = -1
    return PartyData(X, y, tuple(f"p{seed}-{i}" for i in range(n)))


@dataclass
class Recorder:
    """Observer hook: every contribution the coordinator accepted, by (job, step, round, sender)."""

    seen: dict[tuple[str, str, int, str], object] = field(default_factory=dict)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def __call__(self, job_id, step, round, sender, payload) -> None:
        with self.changed:
            self.seen[(job_id, step, round, sender)] = payload
            self.changed.notify_all()

    def wait_for(self, *keys: tuple[str, str, int, str], timeout: float = 60.0) -> None:
        """Block until the coordinator has accepted every contribution named in `keys`."""
        with self.changed:
            if not self.changed.wait_for(lambda: all(k in self.seen for k in keys), timeout):
                raise TimeoutError(f"the coordinator never accepted {sorted(set(keys) - set(self.seen))}")


class ManualClock:
    """The coordinator's clock in deadline tests: time moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def advance_after(clock: ManualClock, seconds: float, wait: Callable[[], object]) -> threading.Thread:
    """On a thread: once `wait()` returns (an event the test names), move the clock past a deadline."""
    def go() -> None:
        wait()
        clock.advance(seconds)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def coordinator(allow, jobs, *, observer=None, tls: TlsFiles | None = None, clock: Callable[[], float] | None = None,
                store=None, offload=None) -> Iterator[tuple[Coordinator, str]]:
    coord = Coordinator(allow, jobs, observer=observer, store=store, offload=offload,
                        **({"clock": clock} if clock else {}))
    server, port = build_server(coord, "127.0.0.1:0", tls=tls)
    server.start()
    coord.start()
    try:
        yield coord, f"127.0.0.1:{port}"
    finally:
        coord.stop()
        server.stop(0).wait()


def run_parties(address: str, job_id: str, keys, datas: dict[str, PartyData], *,
                session: Callable[..., PartySession] = PartySession, connection=None,
                sessions: dict[str, Callable[..., PartySession]] | None = None, join_wait: float = 10.0,
                policy: PartyPolicy | None = None, paillier=None,
                overrides: dict[str, dict] | None = None,
                progress: dict[str, list[str]] | None = None) -> dict[str, JobResult | BaseException]:
    """Run one session per party on threads; each result is a JobResult or the exception raised;
    `progress` collects each party's progress lines."""
    def go(party: str) -> JobResult:
        factory = (sessions or {}).get(party, session)
        conn = (connection.get(party) if isinstance(connection, dict) else connection) \
            or ConnectionConfig(address, insecure=True)
        # each party pins the allow-list (with every party running), and (for imposter tests) the key
        # it runs with as its own
        peers = {**allow_list(keys), **allow_list(keys, tuple(datas)), party: identity.public_bytes(keys[party])}
        config = RunConfig(job_id, party, keys[party], conn, join_wait_seconds=join_wait, idle_seconds=60,
                           peers=peers, policy=policy or PartyPolicy(min_parties=2),
                           paillier=(paillier or {}).get(party), workers=0)
        config = replace(config, **(overrides or {}).get(party, {}))
        lines = progress.setdefault(party, []) if progress is not None else []
        return factory(config, datas[party], progress=lines.append).run()

    return on_threads(datas, go)


def on_threads(names: Iterable[str], work: Callable[[str], T], timeout: float = 120.0) -> dict[str, T | BaseException]:
    """`work(name)` on a thread of its own for each name, all at once; each name's result, or the
    exception it raised."""
    results: dict[str, T | BaseException] = {}

    def go(name: str) -> None:
        try:
            results[name] = work(name)
        except BaseException as exc:
            results[name] = exc

    threads = [threading.Thread(target=go, args=(name,)) for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results


class DiesAt(PartySession):
    """A party whose process dies when the step named `at` starts (its Pull stream ends), once
    `first()` returns (what the others must have done by then)."""

    at = ""
    first: Callable[[], object] = staticmethod(lambda: None)

    def on_step(self, step: pb.StepStart) -> None:
        if step.step == self.at:
            type(self).first()
            raise KeyboardInterrupt(f"killed at {step.step}")
        super().on_step(step)
