"""The coordinator's state across jobs: admission tokens, the job registry and the deadline clock.

Authentication choice (DESIGN §2, §3): a party proves who it is once, at Join, with a key bundle
signed by its allow-listed Ed25519 identity key. The coordinator answers with a random 256-bit
session token bound to that (job, party, bundle); every Pull and Push carries it as metadata and
every frame's `sender` must be the party the token belongs to. Over TLS the token is as good as
a per-message signature for the coordinator's purposes (TLS already authenticates and protects
the channel) and costs nothing per 3 MiB chunk; what the *peers* must trust — the key-agreement
keys — stays end-to-end signed and is checked by every party itself (crypto/identity.py).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from xclp.crypto.identity import SignedBundle
from xclp.server.config import JobConfig
from xclp.server.jobs.allreduce import AllReduceJob
from xclp.server.jobs.dbcl import DbclJob
from xclp.server.jobs.fedavg import FedavgJob
from xclp.server.jobs.base import Job, Observer, Stage
from xclp.server.jobs.xclp import XclpJob
from xclp.errors import ConfigError, InvalidInput, InvalidSignature
from xclp.v1 import xclp_pb2 as pb

log = logging.getLogger("xclp.server")

JOB_TYPES: dict[str, type[Job]] = {"flynn": AllReduceJob, "race": AllReduceJob, "xclp": XclpJob, "fedavg": FedavgJob,
                                   "dbcl": DbclJob}
TICK_SECONDS = 0.2


class Coordinator:
    def __init__(self, allow_list: Mapping[str, bytes], jobs: Sequence[JobConfig], *,
                 observer: Observer | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.allow_list = allow_list
        self.jobs: dict[str, Job] = {}
        for config in jobs:
            if config.job_id in self.jobs:
                raise ConfigError(f"two job files define job {config.job_id!r}")
            unknown = sorted(set(config.expected_parties) - set(allow_list))
            if unknown:
                raise ConfigError(f"job {config.job_id!r} expects parties not on the allow-list: {', '.join(unknown)}")
            self.jobs[config.job_id] = JOB_TYPES[config.job_type](config, allow_list, clock=clock, observer=observer)
        self._tokens: dict[bytes, tuple[str, str]] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick_loop, name="xclp-deadlines", daemon=True)

    def start(self) -> None:
        self._ticker.start()

    def stop(self) -> None:
        self._stop.set()

    def all_finished(self) -> bool:
        return all(job.stage in (Stage.DONE, Stage.FAILED) for job in self.jobs.values())

    def job(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise InvalidInput(f"no job {job_id!r} on this coordinator")
        return job

    def challenge(self, request: pb.ChallengeRequest) -> pb.ChallengeResponse:
        return self.job(request.job_id).challenge()

    def join(self, request: pb.JoinRequest) -> pb.JoinResponse:
        job = self.job(request.job_id)
        signed = SignedBundle(request.bundle.bundle, request.bundle.signature)
        bundle = job.join(signed, request.summary)
        token = secrets.token_bytes(32)
        with self._lock:
            self._tokens[hashlib.sha256(token).digest()] = (job.config.job_id, bundle.party_id)
        return pb.JoinResponse(session_token=token, spec=job.spec())

    def authenticate(self, token: bytes | None, job_id: str) -> tuple[Job, str]:
        """(job, party id) the token was issued for; the call must name that job."""
        if not token:
            raise InvalidSignature("missing session token: call Join first and send x-xclp-token-bin")
        with self._lock:
            entry = self._tokens.get(hashlib.sha256(token).digest())
        if entry is None or not hmac.compare_digest(entry[0].encode(), job_id.encode()):
            raise InvalidSignature(f"the session token is not valid for job {job_id!r}")
        job = self.job(entry[0])
        party = job.parties.get(entry[1])
        if party is None or party.end_delivered:  # tokens expire with the party's place in the job
            raise InvalidSignature(f"the session token for job {job_id!r} has expired: the job is over for this party")
        return job, entry[1]

    def _tick_loop(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            now = self._clock()
            for job in self.jobs.values():
                try:
                    job.tick(now)
                except Exception:  # a bug in one job must not stop the others' deadlines
                    log.exception("job %s: deadline handling failed", job.config.job_id)
