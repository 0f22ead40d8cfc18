"""The party's end of the wire: a TLS channel to the coordinator and the three calls (docs/design.md §3).

Parties only dial out. `Connection.challenge` retries while the coordinator is not reachable yet
(institutions start in any order), backing off exponentially with jitter (`Backoff`) and saying
so once per change of state, until the connect timeout; `Connection.pull` runs the Pull stream on a thread and hands
items over through a queue, so the party's state machine consumes one item at a time with a
deadline; `Connection.push` sends one payload, chunked, in one client-streaming call.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from xclp.errors import ConfigError, DeadlineExceeded, PeerDropped, XclpError, why_leaving
from xclp.v1 import calls, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1 import xclp_pb2_grpc as pb_grpc
from xclp.v1.status import error_from_rpc
from xclp.v1.steps import ALIVE_MAX_BYTES, LEAVE_MSG
from xclp.v1.transport import CHANNEL_OPTIONS, JOB_METADATA, RECEIVED_METADATA, TOKEN_METADATA
from xclp.v1.wire import Outgoing

# a call the transport lost: the coordinator unreachable, or stopping (a server that stops cancels
# the calls in flight); the coordinator itself never aborts with CANCELLED (xclp/v1/status.py)
LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


@dataclass
class Backoff:
    """Waits between retries of an unreachable peer: the k-th is uniform in [d/2, d] with
    d = min(cap, first·2^k) ("equal jitter"), so parties that lost the same coordinator spread
    their retries instead of knocking together; `reset` after a success."""

    first: float = 0.5
    cap: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.first * 2.0 ** min(self.attempt, 64))
        self.attempt += 1
        return ceiling * self.rng.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.attempt = 0


@dataclass(frozen=True)
class ConnectionConfig:
    """How to reach the coordinator. TLS by default; `ca_cert` pins the CA that signed the
    server certificate (else the system roots); `client_cert`/`client_key` for mutual TLS."""

    address: str
    ca_cert: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    server_name: str | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        if not self.address or ":" not in self.address:
            raise ConfigError(f"coordinator address {self.address!r} must be host:port")
        if (self.client_cert is None) != (self.client_key is None):
            raise ConfigError("mutual TLS needs both --client-cert and --client-key")
        if self.insecure and (self.ca_cert or self.client_cert):
            raise ConfigError("--insecure cannot be combined with TLS certificate options")

    def channel(self) -> grpc.Channel:
        options: list[tuple[str, int | str]] = list(CHANNEL_OPTIONS)
        if self.insecure:
            return grpc.insecure_channel(self.address, options=options)

        def read(path: Path | None) -> bytes | None:
            if path is None:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise ConfigError(f"cannot read {path}: {exc.strerror}") from None

        credentials = grpc.ssl_channel_credentials(read(self.ca_cert), read(self.client_key), read(self.client_cert))
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return grpc.secure_channel(self.address, credentials, options=options)


class PullReader:
    """Items of the Pull stream, read on a background thread; errors surface on `next`.

    With `reconnect_seconds` > 0, a stream lost to the transport (UNAVAILABLE: a connection reset,
    a coordinator behind a restarted proxy; CANCELLED: a coordinator that stops) is resumed: the
    thread dials again with `Backoff` for up to that long, asking for what came after the last item
    it has (PullRequest.resume), and the items go on in order, none twice. `say` hears of the loss
    and of the return.
    """

    _END = object()

    def __init__(self, open_stream: Callable[[bool, int], grpc.Call], *, reconnect_seconds: float = 0.0,
                 say: Callable[[str], None] | None = None, backoff: Backoff | None = None,
                 peek: Callable[[pb.PullItem], None] | None = None) -> None:
        self._open, self._peek = open_stream, peek
        self._stream = open_stream(False, 0)
        self.received = 0  # the highest PullItem.seq read
        self.reconnect_seconds, self._say, self._backoff = reconnect_seconds, say, backoff or Backoff(cap=5.0)
        self._closed = threading.Event()
        self._queue: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="xclp-pull", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        lost_at: float | None = None  # since when the stream is lost, until an item comes on a resumed one
        while True:
            try:
                for item in self._stream:
                    if lost_at is not None:
                        self._tell(f"reconnected to the coordinator after {time.monotonic() - lost_at:.1f} s")
                        lost_at = None
                        self._backoff.reset()
                    if 0 < item.seq <= self.received:  # sent again on a resume, and already had
                        continue
                    self.received = max(self.received, item.seq)
                    if self._peek is not None:  # (on this thread: while the party works on the last item)
                        self._peek(item)
                    self._queue.put(item)
            except grpc.RpcError as exc:
                now = time.monotonic()
                if self._closed.is_set() or exc.code() not in LOST or self.reconnect_seconds <= 0 \
                        or (lost_at is not None and now - lost_at > self.reconnect_seconds):
                    self._queue.put(exc)
                    break
                if lost_at is None:
                    lost_at = now
                    self._tell(f"lost the connection to the coordinator ({exc.details() or 'unavailable'}); "
                               f"reconnecting for up to {self.reconnect_seconds:g} s")
                if self._closed.wait(self._backoff.next()):
                    self._queue.put(exc)
                    break
                self._stream = self._open(True, self.received)
                continue
            break
        self._queue.put(self._END)

    def _tell(self, text: str) -> None:
        if self._say is not None:
            self._say(text)

    def next(self, timeout: float) -> pb.PullItem:
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise DeadlineExceeded(f"nothing from the coordinator for {timeout:.0f} s") from None
        if isinstance(item, grpc.RpcError):
            raise error_from_rpc(item)
        if item is self._END:
            raise PeerDropped("the coordinator closed the job stream before the job ended")
        assert isinstance(item, pb.PullItem)
        return item

    def cancel(self) -> None:
        self._closed.set()
        self._stream.cancel()


def untrusted_certificate(details: str, address: str) -> str:
    """What to do when the coordinator's TLS certificate fails this party's check (from gRPC's
    UNAVAILABLE details), or "" for any other failure to connect."""
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return (f"the coordinator at {address} answered with a TLS certificate this party does not trust "
                "(CERTIFICATE_VERIFY_FAILED): pass --ca-cert with the CA that signed it (with a dev CA, its "
                "ca/ca.pem), or --insecure for a coordinator without TLS on a test machine")
    if "Peer name" in details and "not in peer certificate" in details:
        return (f"the coordinator's TLS certificate does not name {address.rsplit(':', 1)[0]}: connect by a name "
                "it has, or pass --server-name with it")
    return ""


class Connection:
    def __init__(self, config: ConnectionConfig, job_id: str) -> None:
        self.config = config
        self.job_id = job_id
        self.channel = config.channel()
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self._token: bytes | None = None
        self._ids = itertools.count(1)
        self.bytes_sent = 0
        self.reconnect_seconds = 0.0  # the job's: how long a lost connection is retried (PullReader)
        self._reader: PullReader | None = None

    def close(self) -> None:
        self.channel.close()

    def _metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        if self._token is None:
            raise XclpError("call join first")
        received = self._reader.received if self._reader is not None else 0
        return ((TOKEN_METADATA, self._token), (JOB_METADATA, self.job_id), (RECEIVED_METADATA, str(received)))

    def challenge(self, key: Ed25519PrivateKey, party_id: str, *, wait_seconds: float = 60.0,
                  say: Callable[[str], None] | None = None, backoff: Backoff | None = None,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> pb.ChallengeResponse:
        """The job's spec and run nonce, asked in a call signed by the party's identity key,
        retrying while the coordinator is unreachable (institutions start in any order), with
        exponential back-off, for up to `wait_seconds` (the connect timeout); then
        DeadlineExceeded. `say` hears each change of state once: unreachable (again with a new
        reason), reached after failures."""
        started = clock()
        give_up = started + wait_seconds
        backoff = backoff or Backoff()
        reason = ""
        while True:
            try:
                call = calls.sign_call(key, party_id, calls.CHALLENGE, pb.ChallengeRequest(job_id=self.job_id))
                response = self.stub.Challenge(call, timeout=30)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise error_from_rpc(exc) from None
                why = exc.details() or "unavailable"
                untrusted = untrusted_certificate(why, self.config.address)
                if untrusted:  # no retry fixes that (it retried for the whole timeout)
                    raise ConfigError(untrusted) from None
                left = give_up - clock()
                if left <= 0:  # the last try was at the timeout: the message's seconds are the timeout's
                    raise DeadlineExceeded(f"the coordinator at {self.config.address} was not reachable for "
                                           f"{clock() - started:.0f} s (connect timeout {wait_seconds:g} s); last "
                                           f"error: {why}") from None
                delay = min(backoff.next(), left)
                if say is not None and why != reason:
                    say(f"the coordinator at {self.config.address} is not reachable ({why}); retrying with back-off "
                        f"for up to {wait_seconds:g} s")
                reason = why
                sleep(delay)
                continue
            if reason and say is not None:
                say(f"reached the coordinator after {clock() - started:.0f} s")
            return response

    def decline(self, key: Ed25519PrivateKey, party_id: str, run_nonce: bytes,
                reason: pb.DeclineRequest.Reason) -> str:
        """Tell the coordinator this party will not join the run (a signed call; the operator's `job
        show` says so). Best effort: returns "" once told, else why not (the party stops either way)."""
        request = pb.DeclineRequest(job_id=self.job_id, run_nonce=run_nonce, reason=reason)
        try:
            self.stub.Decline(calls.sign_call(key, party_id, calls.DECLINE, request), timeout=10)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        return ""

    def join(self, request: pb.JoinRequest) -> pb.JoinResponse:
        try:
            response = self.stub.Join(request, timeout=30)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        self._token = response.session_token
        return response

    @property
    def token(self) -> bytes | None:
        """The session token Join gave (kept in the party's run state, client/run_state.py)."""
        return self._token

    def rejoin(self, token: bytes, reconnect_seconds: float) -> None:
        """Take up the session of a run this party's process joined before it restarted."""
        self._token, self.reconnect_seconds = token, reconnect_seconds

    def pull(self, say: Callable[[str], None] | None = None, *, restarted: bool = False,
             peek: Callable[[pb.PullItem], None] | None = None) -> PullReader:
        """The run's Pull stream, resumed after a lost connection for up to `reconnect_seconds`;
        `restarted`: the first opening says this process restarted (PullRequest.restarted); `peek`
        sees each item as it arrives, on the stream's thread."""
        def open_stream(resume: bool, received: int) -> grpc.Call:  # the first opening is the one not resumed
            request = pb.PullRequest(job_id=self.job_id, resume=resume, received=received,
                                     restarted=restarted and not resume)
            return self.stub.Pull(request, metadata=self._metadata())

        self._reader = PullReader(open_stream, reconnect_seconds=self.reconnect_seconds, say=say, peek=peek)
        return self._reader

    def push(self, payload: wire.Payload, *, sender: str, step: str, round: int, recipient: str = "",
             timeout: float = 300.0) -> int:
        """Send one payload (chunked) to the coordinator or, relayed, to `recipient`; returns bytes sent."""
        return self.push_all([Outgoing(payload, step, round, recipient)], sender=sender, timeout=timeout)

    def push_all(self, messages: Sequence[Outgoing], *, sender: str, timeout: float = 300.0) -> int:
        """Send several messages in order on one Push stream (one round trip); returns bytes sent."""
        frames = [frame for m in messages
                  for frame in wire.encode(m.payload, job_id=self.job_id, step=m.step, round=m.round, sender=sender,
                                           recipient=m.recipient, message_id=next(self._ids))]
        lost_at, backoff = 0.0, Backoff(cap=5.0)
        while True:
            try:
                ack = self.stub.Push(iter(frames), metadata=self._metadata(), timeout=timeout)
            except grpc.RpcError as exc:
                # a lost connection: the same frames again (the coordinator skips whole messages it
                # has, by their ids) while the reconnect window lasts
                now = time.monotonic()
                if lost_at and exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    # sent again, and the party's place has ended meanwhile: its first sending arrived
                    # (the ack was lost) and the run went on to its JobEnd, which the Pull stream brings
                    return 0
                lost_at = lost_at or now
                if exc.code() not in LOST or now - lost_at >= self.reconnect_seconds:
                    raise error_from_rpc(exc) from None
                time.sleep(backoff.next())
                continue
            self.bytes_sent += ack.bytes
            return int(ack.bytes)

    def leave(self, party_id: str, reason: str | BaseException) -> None:
        """Tell the coordinator this party stops (it is dropped at once, not waited for as a lost
        connection), and why: a line, or the error that stopped it (xclp.errors.why_leaving). Best
        effort, bounded: the party stops either way."""
        line = reason if isinstance(reason, str) else why_leaving(reason)
        text = line.encode()[:ALIVE_MAX_BYTES].decode(errors="ignore").encode()  # whole characters
        frames = wire.encode(text, job_id=self.job_id, step=LEAVE_MSG, round=0, sender=party_id, recipient="",
                             message_id=next(self._ids))
        with contextlib.suppress(grpc.RpcError, ValueError, XclpError):  # ValueError: the channel is closed
            self.stub.Push(iter(frames), metadata=self._metadata(), timeout=2.0)

