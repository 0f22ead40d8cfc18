"""Arrays and byte blobs on the wire: chunking, reassembly and validation (docs/design.md §3).

A payload is either a numpy array (raw little-endian bytes + dtype + shape) or opaque bytes
(dtype ""), e.g. an AES-GCM sealed seed. It travels as one or more `Frame`s of at most
`CHUNK_BYTES` data each; every frame repeats the header (dtype, shape, total size, SHA-256 of the
whole payload), so a receiver checks each frame on arrival and the whole payload before use.
Everything a peer sends is untrusted: every check failure raises `InvalidInput`, which the
service answers with INVALID_ARGUMENT.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xclp.errors import InvalidInput, ResourceExhausted
from xclp.v1 import xclp_pb2 as pb

# gRPC messages stay under 4 MiB (docs/design.md §3); 3 MiB of data leaves room for the header.
CHUNK_BYTES = 3 * 1024 * 1024
GRPC_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# One reassembled payload; XCLP ciphertext blocks are tens of MB, counts a few MB.
DEFAULT_MAX_PAYLOAD_BYTES = 512 * 1024 * 1024
MAX_NDIM = 8
MAX_DIM = 2**31 - 1  # no axis longer than this: a shape like [0, 2**63] is refused, not a crash
# Only these dtypes may travel (all fixed-size, little-endian); "" means opaque bytes.
# "<u2" carries XCLP Hamming distances (L <= 65535, docs/design.md §5.2) at half the bytes of uint32.
ARRAY_DTYPES = frozenset({"|u1", "<u2", "<u4", "<u8", "<i4", "<i8", "<f8"})
MAX_ID_CHARS = 128

Payload = np.ndarray | bytes


@dataclass(frozen=True)
class Message:
    """A reassembled, validated payload and its routing header."""

    job_id: str
    step: str
    round: int
    sender: str
    recipient: str
    payload: Payload

    @property
    def nbytes(self) -> int:
        return len(self.payload) if isinstance(self.payload, bytes) else int(self.payload.nbytes)


@dataclass(frozen=True)
class Outgoing:
    """One message a party pushes: its payload, step, attempt (`round`) and, if relayed, recipient."""

    payload: Payload
    step: str
    round: int
    recipient: str = ""


def array_bytes(dtype: np.dtype[Any], shape: tuple[int, ...]) -> int:
    """The bytes of an array of `dtype` and `shape` on the wire: what a step's limit is made of."""
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def payload_bytes(payload: Payload) -> tuple[str, tuple[int, ...], bytes]:
    """(dtype, shape, raw little-endian bytes) of a payload; refuses dtypes the wire does not carry."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        raw = bytes(payload)
        return "", (len(raw),), raw
    arr = np.asarray(payload)
    le = arr.dtype.newbyteorder("<") if arr.dtype.byteorder not in ("|", "<", "=") else arr.dtype
    arr = arr.astype(le, order="C", copy=False)  # ascontiguousarray would turn 0-d into 1-d
    dtype = arr.dtype.str
    if dtype not in ARRAY_DTYPES:
        raise InvalidInput(f"dtype {dtype} cannot travel on the wire; use one of {sorted(ARRAY_DTYPES)}")
    return dtype, tuple(int(s) for s in arr.shape), arr.tobytes()


def encode(
    payload: Payload, *, job_id: str, step: str, round: int, sender: str, recipient: str, message_id: int
) -> Iterator[pb.Frame]:
    """Split a payload into frames of at most CHUNK_BYTES data, each carrying the full header."""
    dtype, shape, raw = payload_bytes(payload)
    digest = hashlib.sha256(raw).digest()
    count = max(1, math.ceil(len(raw) / CHUNK_BYTES))
    view = memoryview(raw)
    for index in range(count):
        yield pb.Frame(
            job_id=job_id, step=step, round=round, sender=sender, recipient=recipient,
            message_id=message_id, chunk_index=index, chunk_count=count, total_bytes=len(raw),
            sha256=digest, dtype=dtype, shape=shape,
            data=bytes(view[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]),
        )


def check_header(frame: pb.Frame, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> None:
    """Validate one frame on its own: ids, sizes, dtype, shape, chunk bounds."""
    for name in ("job_id", "step", "sender", "recipient"):
        value = getattr(frame, name)
        if len(value) > MAX_ID_CHARS or not value.isprintable():
            raise InvalidInput(f"frame field {name} must be printable and at most {MAX_ID_CHARS} characters")
    if not frame.job_id or not frame.step:
        raise InvalidInput("frame must name its job_id and step")
    if frame.total_bytes > max_payload_bytes:
        raise InvalidInput(f"payload of {frame.total_bytes} bytes exceeds the limit of {max_payload_bytes}")
    if len(frame.sha256) != 32:
        raise InvalidInput("frame sha256 must be 32 bytes")
    expected_chunks = max(1, math.ceil(frame.total_bytes / CHUNK_BYTES))
    if frame.chunk_count != expected_chunks or frame.chunk_index >= frame.chunk_count:
        raise InvalidInput(
            f"chunk {frame.chunk_index} of {frame.chunk_count} does not fit a {frame.total_bytes}-byte payload"
        )
    start = frame.chunk_index * CHUNK_BYTES
    if len(frame.data) != min(CHUNK_BYTES, frame.total_bytes - start):
        raise InvalidInput(f"chunk {frame.chunk_index} carries {len(frame.data)} bytes; expected another size")
    if len(frame.shape) > MAX_NDIM:
        raise InvalidInput(f"arrays may have at most {MAX_NDIM} dimensions")
    if any(d > MAX_DIM for d in frame.shape):
        raise InvalidInput(f"shape {list(frame.shape)} has an axis longer than {MAX_DIM}")
    if frame.dtype == "":
        if list(frame.shape) != [frame.total_bytes]:
            raise InvalidInput("a bytes payload must have shape [total_bytes]")
        return
    if frame.dtype not in ARRAY_DTYPES:
        raise InvalidInput(f"dtype {frame.dtype!r} is not allowed on the wire")
    if math.prod(frame.shape) * np.dtype(frame.dtype).itemsize != frame.total_bytes:
        raise InvalidInput(f"shape {list(frame.shape)} of {frame.dtype} does not match {frame.total_bytes} bytes")


@dataclass
class _Partial:
    first: pb.Frame
    chunks: dict[int, bytes] = field(default_factory=dict)
    held: int = 0  # bytes of it in the sender's budget


class PartialBudget:
    """The bytes of incomplete messages one sender has buffered at a receiver, over all its streams:
    a message may be buffered only while the sender's partial bytes stay within twice
    the limit of the step it is for. Without it, one admitted party could open 64 messages on each
    of its Push streams and make the coordinator hold 4 × 64 × the step's limit. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = 0

    def hold(self, n: int, allowance: int, what: str) -> None:
        with self._lock:
            if self.held + n > allowance:
                raise ResourceExhausted(f"{what}: the sender already has {self.held} bytes of incomplete messages "
                                        f"here; this chunk would pass the {allowance} its step allows in flight")
            self.held += n

    def drop(self, n: int) -> None:
        with self._lock:
            self.held -= n


class Assembler:
    """Reassembles frames into Messages; one per receiver (per Push stream or per Pull stream).
    `budget`: the sender's partial bytes over all its streams (PartialBudget), checked at each chunk
    against twice the frame's `limit`; `close` gives back what an ended stream held."""

    def __init__(self, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES, max_open: int = 64,
                 budget: PartialBudget | None = None) -> None:
        self._max_payload = max_payload_bytes
        self._max_open = max_open
        self._open: dict[tuple[str, int], _Partial] = {}
        self._budget = budget
        self._held = 0  # of this assembler's partial messages, in the budget

    def close(self) -> None:
        """The stream ended: its incomplete messages are dropped, and their bytes given back."""
        self._open.clear()
        self._release(self._held)

    def _release(self, n: int) -> None:
        if self._budget is not None and n:
            self._budget.drop(n)
        self._held -= n

    @property
    def pending(self) -> int:
        """Messages begun but not complete."""
        return len(self._open)

    def add(self, frame: pb.Frame, *, limit: int | None = None) -> Message | None:
        """Take one frame; return the Message when its last chunk arrives, else None.

        `limit`: the most bytes the receiver expects for this frame's step; a message declaring
        more is refused at its first frame, before anything is buffered.
        """
        check_header(frame, max_payload_bytes=self._max_payload)
        key = (frame.sender, frame.message_id)
        part = self._open.get(key)
        if part is None:
            if limit is not None and frame.total_bytes > limit:
                raise ResourceExhausted(f"a {frame.step!r} message of {frame.total_bytes} bytes exceeds the {limit} "
                                        "bytes that step can need")
            if len(self._open) >= self._max_open:
                raise InvalidInput(f"more than {self._max_open} messages in flight at once")
            part = self._open[key] = _Partial(first=frame)
        elif not _same_header(part.first, frame):
            self._forget(key)
            raise InvalidInput(f"chunk {frame.chunk_index} of message {frame.message_id} changes its header")
        if frame.chunk_index in part.chunks:
            self._forget(key)
            raise InvalidInput(f"chunk {frame.chunk_index} of message {frame.message_id} sent twice")
        if len(part.chunks) + 1 < frame.chunk_count:  # it stays buffered: within the sender's budget
            if self._budget is not None:
                allowance = 2 * (self._max_payload if limit is None else limit)
                try:
                    self._budget.hold(len(frame.data), allowance, f"a {frame.step!r} message")
                except ResourceExhausted:
                    self._forget(key)
                    raise
            self._held += len(frame.data)
            part.held += len(frame.data)
        part.chunks[frame.chunk_index] = frame.data
        if len(part.chunks) < frame.chunk_count:
            return None
        self._forget(key)
        return _finish(part)

    def _forget(self, key: tuple[str, int]) -> None:
        part = self._open.pop(key, None)
        if part is not None:
            self._release(part.held)


def _same_header(a: pb.Frame, b: pb.Frame) -> bool:
    fields = ("job_id", "step", "round", "sender", "recipient", "chunk_count", "total_bytes", "sha256", "dtype")
    return all(getattr(a, f) == getattr(b, f) for f in fields) and list(a.shape) == list(b.shape)


def _finish(part: _Partial) -> Message:
    head = part.first
    raw = b"".join(part.chunks[i] for i in range(head.chunk_count))
    if hashlib.sha256(raw).digest() != head.sha256:
        raise InvalidInput(f"payload of message {head.message_id} from {head.sender!r} fails its SHA-256 digest")
    payload: Payload
    if head.dtype == "":
        payload = raw
    else:
        payload = np.frombuffer(bytearray(raw), dtype=np.dtype(head.dtype)).reshape(tuple(head.shape))
    return Message(head.job_id, head.step, head.round, head.sender, head.recipient, payload)
