"""What the coordinator keeps per party of a run: its signed bundle, its data summary, and the
mailbox its Pull stream drains (docs/design.md §3); and the post that fills the mailboxes."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from xclp.crypto.identity import KeyBundle, SignedBundle
from xclp.errors import ProtocolError, ResourceExhausted
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb

MAILBOX_MAX_BYTES = 512 * 1024 * 1024  # relayed bytes waiting for one party
MAX_PUSH_STREAMS = 4  # Push calls one party may have open at once
# items a party's Pull stream took and the party has not confirmed, kept for a resume: more than
# gRPC's flow-control windows and the sockets' buffers can hold in flight
REDELIVERY_MAX_BYTES = 64 * 1024 * 1024


class Superseded(Exception):
    """A Pull stream's mailbox was taken over by the party's resumed stream: the old one ends."""


class Mailbox:
    """What the coordinator has for one party, drained by that party's Pull stream.

    Every item gets the next `seq` as it is queued. `queued_bytes` counts the frame data waiting;
    relays from peers are refused once it would pass MAILBOX_MAX_BYTES (a flood by an admitted
    party must not exhaust the coordinator's memory). For a party that can resume (`keeps_sent`),
    the items its stream took are kept until the party says it has them (`confirm`, from its
    Push calls) or until they pass REDELIVERY_MAX_BYTES: a stream lost with items in flight is
    resumed (`attach`) by sending those again, first, in their order.
    """

    def __init__(self) -> None:
        self._items: deque[pb.PullItem] = deque()
        self._sent: deque[pb.PullItem] = deque()  # taken by a stream, not confirmed (keeps_sent)
        self._sent_bytes = 0
        self._cond = threading.Condition()  # notified as items come, streams take them, or a stream resumes
        self._seq = 0
        self.forgotten = 0  # the highest seq dropped from _sent unconfirmed: a resume from before it fails
        self.keeps_sent = False
        # a place read back by a restarted coordinator (server/resume.py): the party's resumed stream
        # names the last item it had of the coordinator before, and what is queued here follows it
        self.renumber = False
        self.stream = 0  # which Pull stream may take items: a resumed stream takes over from the one lost
        self.queued_bytes = 0
        self.streaming = False
        self.pushes = 0  # Push streams of this party open now
        self.partials = wire.PartialBudget()  # bytes of its incomplete messages over all its Push streams
        self.pushed: set[int] = set()  # ids of the messages its Push streams delivered whole

    def first_delivery(self, message_id: int) -> bool:
        """Whether a whole message of the party's is new: a Push sent again after a lost connection
        may carry messages the coordinator already has (the party could not know)."""
        with self._cond:
            if message_id in self.pushed:
                return False
            self.pushed.add(message_id)
            return True

    def put(self, item: pb.PullItem) -> None:
        with self._cond:
            self._seq += 1
            item.seq = self._seq
            self.queued_bytes += _frame_bytes(item)
            self._items.append(item)
            self._cond.notify_all()

    def get(self, timeout: float, stream: int | None = None) -> pb.PullItem | None:
        """The next item, or None after `timeout` seconds; Superseded once `stream` is not the
        mailbox's stream (the party resumed on another)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._items or (stream is not None and stream != self.stream),
                                       timeout):
                return None
            if stream is not None and stream != self.stream:
                raise Superseded
            item = self._items.popleft()
            size = _frame_bytes(item)
            self.queued_bytes -= size
            if self.keeps_sent:
                self._sent.append(item)
                self._sent_bytes += size
                while self._sent_bytes > REDELIVERY_MAX_BYTES:
                    old = self._sent.popleft()
                    self._sent_bytes -= _frame_bytes(old)
                    self.forgotten = old.seq
            self._cond.notify_all()
        return item

    def confirm(self, received: int) -> None:
        """The party has every item up to seq `received`: they are not kept for a resume."""
        with self._cond:
            while self._sent and self._sent[0].seq <= received:
                self._sent_bytes -= _frame_bytes(self._sent.popleft())

    def attach(self, *, resume: bool = False, received: int = 0) -> tuple[int, int]:
        """A Pull stream opens: it becomes the one that takes items (a stream before it ends), and
        for a resume the items after `received` that a lost stream took are queued again, first.
        Returns the stream's number and how many items go again; ProtocolError when some of those
        were not kept, or `received` names an item never sent."""
        with self._cond:
            if resume and self.renumber:  # nothing it had is here: what is queued goes on after it
                for at, item in enumerate(self._items, start=1):
                    item.seq = received + at
                self._seq, self.renumber = received + len(self._items), False
            if resume:
                if received > self._seq:
                    raise ProtocolError(f"a resumed Pull says it has item {received}; only {self._seq} were queued")
                self.confirm(received)
                if self.forgotten > received:
                    raise ProtocolError(f"cannot resume from item {received}: items up to {self.forgotten} were not "
                                        f"kept (more than {REDELIVERY_MAX_BYTES >> 20} MiB unconfirmed)")
                again = list(self._sent)
                self._sent.clear()
                self._sent_bytes = 0
                self._items.extendleft(reversed(again))
                self.queued_bytes += sum(_frame_bytes(i) for i in again)
            else:
                again = []
            self.stream += 1
            self.streaming = True
            self._cond.notify_all()
            return self.stream, len(again)

    def restart(self) -> int:
        """The party's process restarted (PullRequest.restarted): it holds nothing of what was queued
        or sent, and numbers its messages from 1 again. Everything waiting is dropped (a step it can
        go on with starts again, with its own messages); its stream is the new one. Returns its number."""
        with self._cond:
            self._items.clear()
            self._sent.clear()
            self._sent_bytes = self.queued_bytes = 0
            self.pushed.clear()
            self.renumber = False
            self.stream += 1
            self.streaming = True
            self._cond.notify_all()
            return self.stream

    def wait_below(self, limit: int, timeout: float) -> bool:
        """Wait until at most `limit` bytes of frames are waiting (the party's Pull stream took the
        rest), or `timeout` seconds; whether it got there."""
        with self._cond:
            return self._cond.wait_for(lambda: self.queued_bytes <= limit, timeout)


def _frame_bytes(item: pb.PullItem) -> int:
    return len(item.frame.data) if item.HasField("frame") else 0


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
    lost_at: float | None = None  # the run's clock when its Pull stream was lost; None while connected
    restarts: int = 0  # times its process restarted and rejoined (server/liveness.py MAX_RESTARTS)


class Post:
    """Frames into the parties' mailboxes, one message id per message: the coordinator's own
    payloads (sender "") and peers' payloads relayed unread."""

    def __init__(self, job_id: str, parties: Mapping[str, Party]) -> None:
        self.job_id, self.parties = job_id, parties
        self._message_ids = itertools.count(1)
        self.next_id = 1  # the next message id, for a checkpoint (server/resume.py)

    def skip_ids(self, first: int) -> None:
        """Number messages from `first` on: a restarted coordinator's never reuse an id a party may
        still hold part of a message under."""
        self._message_ids = itertools.count(first)

    def send(self, recipient: str, step: str, attempt: int, payload: wire.Payload, sender: str = "") -> int:
        """Queue `payload` for `recipient`; returns the bytes queued."""
        mid, size, mailbox = next(self._message_ids), 0, self.parties[recipient].mailbox
        self.next_id = mid + 1
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
