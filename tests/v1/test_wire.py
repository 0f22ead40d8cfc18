"""Chunking, reassembly and validation of payloads on the wire (xclp/v1/wire.py, docs/design.md §3)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from xclp.errors import InvalidInput
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb

HEADER = dict(job_id="j", step="sum", round=3, sender="a", recipient="", message_id=7)


def frames(payload):
    return list(wire.encode(payload, **HEADER))


def assemble(fs, **kw):
    asm = wire.Assembler(**kw)
    out = [asm.add(f) for f in fs]
    assert all(m is None for m in out[:-1])
    return out[-1]


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(st.sampled_from([np.uint32, np.uint64, np.int64, np.float64, np.uint8, np.int32]),
                  hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)))
def test_arrays_round_trip_with_dtype_and_shape(arr):
    msg = assemble(frames(arr))
    assert msg.payload.dtype == arr.dtype.newbyteorder("<") and msg.payload.shape == arr.shape
    np.testing.assert_array_equal(msg.payload, arr)
    assert (msg.job_id, msg.step, msg.round, msg.sender) == ("j", "sum", 3, "a")


@given(st.binary(max_size=100))
def test_bytes_round_trip(blob):
    assert assemble(frames(blob)).payload == blob


def test_big_payload_is_chunked_under_the_grpc_limit_and_reassembles_in_any_order():
    arr = np.arange(2_000_000, dtype=np.uint64)  # 16 MB
    fs = frames(arr)
    assert len(fs) == 6 and all(f.ByteSize() < wire.GRPC_MAX_MESSAGE_BYTES for f in fs)
    np.testing.assert_array_equal(assemble(fs[::-1]).payload, arr)


def test_big_endian_input_travels_little_endian():
    arr = np.arange(5, dtype=">u4")
    (f,) = frames(arr)
    assert f.dtype == "<u4" and f.data == np.arange(5, dtype="<u4").tobytes()


def test_disallowed_dtypes_are_refused_at_the_sender():
    with pytest.raises(InvalidInput, match="cannot travel"):
        frames(np.array(["x"]))
    with pytest.raises(InvalidInput, match="cannot travel"):
        frames(np.zeros(3, dtype=np.float32))


def _mutate(frame: pb.Frame, **changes) -> pb.Frame:
    out = pb.Frame()
    out.CopyFrom(frame)
    for k, v in changes.items():
        if k == "shape":
            del out.shape[:]
            out.shape.extend(v)
        else:
            setattr(out, k, v)
    return out


@pytest.mark.parametrize("changes, match", [
    (dict(data=b"\x00" * 24), "SHA-256"),
    (dict(dtype="<f4"), "not allowed"),
    (dict(dtype="O"), "not allowed"),
    (dict(shape=[4, 2]), "does not match"),
    (dict(shape=[1] * 9), "at most 8"),
    (dict(total_bytes=10**12), "exceeds the limit"),
    (dict(sha256=b"short"), "32 bytes"),
    (dict(chunk_count=2), "does not fit"),
    (dict(chunk_index=1), "does not fit"),
    (dict(data=b"\x00" * 23), "expected another size"),
    (dict(job_id=""), "job_id"),
    (dict(sender="a\nb"), "printable"),
])
def test_malformed_frames_are_refused_with_a_reason(changes, match):
    (good,) = frames(np.arange(6, dtype=np.uint32))
    with pytest.raises(InvalidInput, match=match):
        assemble([_mutate(good, **changes)])


def test_consistent_forgery_with_correct_digest_still_needs_matching_shape():
    data = np.arange(6, dtype="<u4").tobytes()
    forged = pb.Frame(job_id="j", step="s", sender="a", message_id=1, chunk_count=1, total_bytes=len(data),
                      sha256=hashlib.sha256(data).digest(), dtype="<u8", shape=[6], data=data)
    with pytest.raises(InvalidInput, match="does not match"):
        assemble([forged])


def test_duplicate_or_inconsistent_chunks_are_refused():
    fs = frames(np.arange(1_000_000, dtype=np.uint64))
    asm = wire.Assembler()
    asm.add(fs[0])
    with pytest.raises(InvalidInput, match="sent twice"):
        asm.add(fs[0])
    asm = wire.Assembler()
    asm.add(fs[0])
    with pytest.raises(InvalidInput, match="changes its header"):
        asm.add(_mutate(fs[1], step="other"))


def test_too_many_open_messages_are_refused():
    asm = wire.Assembler(max_open=2)
    for mid in (1, 2):
        asm.add(list(wire.encode(np.zeros(1_000_000, np.uint64), **{**HEADER, "message_id": mid}))[0])
    assert asm.pending == 2
    with pytest.raises(InvalidInput, match="in flight"):
        asm.add(list(wire.encode(np.zeros(1_000_000, np.uint64), **{**HEADER, "message_id": 3}))[0])


def test_payload_limit_is_configurable():
    with pytest.raises(InvalidInput, match="exceeds the limit"):
        assemble(frames(np.zeros(100, np.uint64)), max_payload_bytes=799)


def test_a_senders_incomplete_messages_over_all_its_streams_stay_within_twice_the_steps_limit():
    """Attack (memory): one admitted party opens many messages on each of its Push streams
    and never finishes them; the coordinator held 4 streams × 64 messages × the step's limit. Now
    its partial bytes over all its streams are one budget: within 2 × the limit, then refused."""
    from xclp.errors import ResourceExhausted

    budget = wire.PartialBudget()
    payload = np.zeros(1_000_000, np.uint64)  # 8 MB: two 4 MiB chunks... and a third
    limit = payload.nbytes
    streams = [wire.Assembler(budget=budget) for _ in range(4)]
    held = 0
    with pytest.raises(ResourceExhausted, match="incomplete messages"):
        for i in range(64):
            first = list(wire.encode(payload, **{**HEADER, "message_id": i}))[0]
            streams[i % 4].add(first, limit=limit)
            held += len(first.data)
    assert budget.held == held <= 2 * limit and held > limit  # a few messages in flight, never 64 × 4
    # a complete message passes through whatever is held, and leaves nothing behind
    done = [streams[0].add(f, limit=limit) for f in wire.encode(np.ones(10, np.uint64), **{**HEADER, "message_id": 99})]
    assert done[-1] is not None and budget.held == held
    for asm in streams:  # the streams end: everything they held is given back
        asm.close()
    assert budget.held == 0
