"""What the coordinator keeps per party of a run: its signed bundle, its data summary, and the
mailbox its Pull stream drains (DESIGN §3); and the post that fills the mailboxes."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from xclp.crypto.identity import KeyBundle, SignedBundle
from xclp.errors import ResourceExhausted
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb

MAILBOX_MAX_BYTES = 512 * 1024 * 1024  # relayed bytes waiting for one party
MAX_PUSH_STREAMS = 4  # Push calls one party may have open at once


class Mailbox:
    """What the coordinator has for one party, drained by that party's Pull stream.

    `queued_bytes` counts the frame data waiting; relays from peers are refused once it would pass
    MAILBOX_MAX_BYTES (a flood by an admitted party must not exhaust the coordinator's memory).
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[pb.PullItem] = queue.Queue()
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)  # notified as the Pull stream takes frames
        self.queued_bytes = 0
        self.streaming = False
        self.pushes = 0  # Push streams of this party open now
        self.partials = wire.PartialBudget()  # bytes of its incomplete messages over all its Push streams

    def put(self, item: pb.PullItem) -> None:
        with self._lock:
            self.queued_bytes += len(item.frame.data) if item.HasField("frame") else 0
        self._queue.put(item)

    def get(self, timeout: float) -> pb.PullItem | None:
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        with self._lock:
            self.queued_bytes -= len(item.frame.data) if item.HasField("frame") else 0
            self._drained.notify_all()
        return item

    def wait_below(self, limit: int, timeout: float) -> bool:
        """Wait until at most `limit` bytes of frames are waiting (the party's Pull stream took the
        rest), or `timeout` seconds; whether it got there."""
        with self._lock:
            return self._drained.wait_for(lambda: self.queued_bytes <= limit, timeout)


@dataclass
class Party:
    bundle: KeyBundle
    signed: SignedBundle
    summary: pb.DataSummary
    mailbox: Mailbox = field(default_factory=Mailbox)
    ended: bool = False  # its JobEnd is queued; a later disconnect is not a dropout
    end_delivered: bool = False  # its Pull stream carried the JobEnd; no further Pull is opened
    heard_at: float = 0.0  # the run's clock when a frame or progress report last came from it (server/liveness.py)
    activity: str = ""  # what its last progress report said it was doing
    news_at: float = 0.0  # the run's clock when it was last sent a RunAlive (server/liveness.py)
    capabilities: frozenset[str] = frozenset()  # what its version understands (JoinRequest.capabilities)


class Post:
    """Frames into the parties' mailboxes, one message id per message: the coordinator's own
    payloads (sender "") and peers' payloads relayed unread."""

    def __init__(self, job_id: str, parties: Mapping[str, Party]) -> None:
        self.job_id, self.parties = job_id, parties
        self._message_ids = itertools.count(1)

    def send(self, recipient: str, step: str, attempt: int, payload: wire.Payload, sender: str = "") -> int:
        """Queue `payload` for `recipient`; returns the bytes queued."""
        mid, size, mailbox = next(self._message_ids), 0, self.parties[recipient].mailbox
        for frame in wire.encode(payload, job_id=self.job_id, step=step, round=attempt, sender=sender,
                                 recipient=recipient, message_id=mid):
            size += len(frame.data)
            mailbox.put(pb.PullItem(frame=frame))
        return size

    def relay(self, sender: str, msg: wire.Message) -> None:
        """A peer's message, refused while the recipient has MAILBOX_MAX_BYTES waiting."""
        mailbox = self.parties[msg.recipient].mailbox
        if mailbox.queued_bytes + msg.nbytes > MAILBOX_MAX_BYTES:
            raise ResourceExhausted(f"{msg.recipient!r} has {mailbox.queued_bytes} bytes waiting; "
                                    "the coordinator will not queue more for it")
        self.send(msg.recipient, msg.step, msg.round, msg.payload, sender)
