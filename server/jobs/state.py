"""What a coordinator job's state is made of: each party's mailbox and place, each step attempt,
and the checks every job type applies to what parties send (DESIGN §3, §6.1)."""

from __future__ import annotations

import hmac
import queue
import threading
from dataclasses import dataclass, field

import numpy as np

from xclp.crypto.identity import KeyBundle, SignedBundle
from xclp.crypto.masking import ring_sum
from xclp.errors import InvalidInput
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.double_masking import round_digest, self_mask, unpack_reveal


class Mailbox:
    """What the coordinator has for one party, drained by that party's Pull stream.

    `queued_bytes` counts the frame data waiting; relays from peers are refused once it would pass
    base.MAILBOX_MAX_BYTES (a flood by an admitted party must not exhaust the coordinator's memory).
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[pb.PullItem] = queue.Queue()
        self._lock = threading.Lock()
        self.queued_bytes = 0
        self.streaming = False
        self.pushes = 0  # Push streams of this party open now

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
        return item


@dataclass
class Party:
    bundle: KeyBundle
    signed: SignedBundle
    summary: pb.DataSummary
    mailbox: Mailbox = field(default_factory=Mailbox)
    ended: bool = False  # its JobEnd is queued; a later disconnect is not a dropout
    end_delivered: bool = False  # its Pull stream carried the JobEnd; no further Pull is opened


@dataclass
class Step:
    """One attempt at one step: who takes part, who still owes a contribution, until when."""

    name: str
    round: int
    participants: tuple[str, ...]
    started: float
    deadline: float
    pending: set[str]
    received: dict[str, wire.Payload] = field(default_factory=dict)
    bytes_in: int = 0
    bytes_relayed: int = 0
    relays: set[tuple[str, str]] = field(default_factory=set)  # (sender, recipient) relayed this round


def check_reveal(payload: wire.Payload, session: bytes, masked_step: str, step: Step, sender: str) -> None:
    """A self-mask reveal (DESIGN §6.1) must be 64 bytes and bind this round and participant set."""
    digest, _ = unpack_reveal(payload)
    if not hmac.compare_digest(digest, round_digest(session, masked_step, step.round, step.participants)):
        raise InvalidInput(f"the self-mask reveal of {sender!r} is for another session, round or participant set")


def open_sum(masked: Step, reveal: Step, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The aggregate of a double-masked step (DESIGN §6.1): the ring sum of the masked arrays, where
    the pairwise masks cancel, less each participant's self mask expanded from its revealed seed."""
    total = ring_sum(np.asarray(masked.received[p]) for p in reveal.participants)
    return total - ring_sum(self_mask(unpack_reveal(reveal.received[p])[1], shape, dtype) for p in reveal.participants)


def ring_array(payload: wire.Payload, dtype: np.dtype, shape: tuple[int, ...], what: str) -> np.ndarray:
    """The payload as an array of exactly `dtype`/`shape`, or InvalidInput naming what differs."""
    if not isinstance(payload, np.ndarray):
        raise InvalidInput(f"{what} must be an array, got opaque bytes")
    if payload.dtype != dtype or payload.shape != shape:
        raise InvalidInput(f"{what} must be {dtype.str}{list(shape)}, got {payload.dtype.str}{list(payload.shape)}")
    return payload
