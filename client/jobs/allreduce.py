"""A party's side of the masked all-reduce jobs (DESIGN §6): its local array and its model.

Pure functions of (parameters, data, common seed); the session (client/session.py) masks and
moves the arrays. Wire encodings (xclp/v1/jobs.py):
- exact counts: uint32 (counts never exceed the total number of rows);
- DP FlyNN: the paper's per-party release is real-valued (Laplace noise on T chosen entries), so
  it is encoded in fixed point, two's complement in Z_2^64 with `frac_bits` fractional bits
  (crypto/fixedpoint.py, room for τ summands); the decoded sum is the DP model;
- DP RACE: each party adds its discrete-Laplace share (scale R/ε, τ shares) to its integer counts
  and sends int64 two's complement in Z_2^64; only the noised aggregate is ever unmasked.
A restarted round redraws the DP noise for the new number of parties τ.
"""

from __future__ import annotations

import numpy as np

from collections.abc import Callable
from dataclasses import dataclass

from xclp.client.jobs.selfmask import SelfMasks
from xclp.client.jobs.xclp import Pusher
from xclp.crypto.fixedpoint import FixedPoint
from xclp.crypto.masking import PairwiseMasker
from xclp.errors import InvalidInput, ProtocolError
from xclp.flynn import FlyHash, privatise_counts, train_counts
from xclp.race import RaceClassifier, RaceHashes, private_release_share, sketch
from xclp.party_table import PartyData
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.jobs import FlynnJobParams, JobParams, RaceJobParams
from xclp.v1.double_masking import reveal_step
from xclp.v1.steps import RESULT_MSG, SUM_PURPOSE, SUM_STEP


def check_data(params: JobParams, data: PartyData) -> None:
    """Refuse, before joining the sum, data the job cannot use (labels out of range)."""
    n_classes = params.n_classes
    if n_classes and data.y is not None:
        bad = data.y >= n_classes
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise InvalidInput(f"label {int(data.y[row])} at row {row} is out of range for a {n_classes}-class job")
    if isinstance(params, FlynnJobParams) and params.s > data.X.shape[1]:
        raise InvalidInput(f"job parameter s = {params.s} exceeds the data dimension {data.X.shape[1]}")


def _labeled(data: PartyData) -> tuple[np.ndarray, np.ndarray]:
    mask = data.labeled
    assert data.y is not None or not mask.any()
    return data.X[mask], (data.y[mask] if data.y is not None else np.empty(0, dtype=np.int64))


def flynn_counts(params: FlynnJobParams, data: PartyData, seed: bytes) -> np.ndarray:
    """The party's exact per-class counts, uint32[C, m], under the job's FlyHash (paper 001 Alg. 2)."""
    flyhash = FlyHash.from_seed(seed, params.method_params(data.X.shape[1]))
    X, y = _labeled(data)
    if X.shape[0] == 0:
        return np.zeros((params.n_classes, params.m), dtype=np.uint32)
    return train_counts(flyhash, X, y, params.n_classes)


def race_counts(params: RaceJobParams, data: PartyData, seed: bytes) -> np.ndarray:
    """The party's RACE sketch int64[R, W] of all rows, or per class int64[C, R, W] of labeled rows."""
    hashes = RaceHashes.from_seed(seed, params.method_params(), data.X.shape[1])
    if not params.n_classes:
        return sketch(hashes, data.X)
    X, y = _labeled(data)
    if X.shape[0] == 0:
        return np.zeros((params.n_classes, params.rows, params.width), dtype=np.int64)
    return RaceClassifier.fit(hashes, X, y, params.n_classes).sketches.astype(np.int64)


def contribution(params: JobParams, data: PartyData, seed: bytes, n_parties: int) -> np.ndarray:
    """The ring array this party adds to the sum (before masking): dtype/shape = params.wire(d)."""
    dtype, shape = params.wire(data.X.shape[1])
    if isinstance(params, FlynnJobParams):
        counts = flynn_counts(params, data, seed)
        if not params.private:
            return counts.astype(dtype)
        assert params.epsilon is not None and params.T is not None
        # discrete Laplace on the integer counts: float Laplace leaks through the floating-point
        # representation (Mironov 2012); the integers travel exactly in the fixed-point ring
        released = privatise_counts(counts, params.epsilon, params.T, n_parties, discrete=True)  # int64[C, m]
        return FixedPoint(params.frac_bits, 64).encode(released, n_terms=n_parties).astype(dtype)
    counts = race_counts(params, data, seed)
    if not params.private:
        return counts.astype(dtype)
    assert params.epsilon is not None
    shared = np.stack([private_release_share(c, params.epsilon, n_parties) for c in counts.reshape(-1, *counts.shape[-2:])])
    return shared.reshape(shape).view(np.uint64).astype(dtype)


def decode_aggregate(params: JobParams, aggregate: np.ndarray) -> np.ndarray:
    """The unmasked ring sum as model values: exact counts stay integers (uint32 FlyNN counts,
    int64 RACE sketches); DP FlyNN decodes to float64 counts >= 0, DP RACE to signed int64."""
    if isinstance(params, FlynnJobParams):
        if not params.private:
            return aggregate.astype(np.uint32)
        return np.maximum(FixedPoint(params.frac_bits, 64).decode(aggregate.astype(np.uint64)), 0.0)
    if not params.private:
        return aggregate.astype(np.int64)
    return aggregate.astype(np.uint64).view(np.int64)


@dataclass
class AllReduceParty:
    """The party's FlyNN / RACE state machine after the seed (DESIGN §6); `on_step` / `on_message`
    are its transitions, like `XclpParty`'s."""

    party_id: str
    params: JobParams
    data: PartyData
    seed: bytes
    masker: PairwiseMasker
    conn: Pusher
    progress: Callable[[str], None]
    result: np.ndarray | None = None
    self_masks: SelfMasks | None = None

    def __post_init__(self) -> None:
        self.self_masks = SelfMasks(SUM_STEP, self.masker.session_id)

    def on_step(self, step: pb.StepStart) -> None:
        assert self.self_masks is not None
        members = list(step.participants)
        if step.step == reveal_step(SUM_STEP):  # DESIGN §6.1: the round is complete, open it
            self.conn.push(self.self_masks.reveal(step.round, members), sender=self.party_id, step=step.step,
                           round=step.round)
            self.progress(f"round {step.round} complete among {len(members)} parties: self mask revealed")
            return
        if step.step != SUM_STEP:
            raise ProtocolError(f"unknown step {step.step!r} for an all-reduce job")
        masked = self.self_masks.add(self.mask(self.local_array(len(members)), step.round, members), step.round, members)
        sent = self.conn.push(masked, sender=self.party_id, step=SUM_STEP, round=step.round)
        self.progress(f"pushed masked array {list(masked.shape)} for round {step.round} "
                      f"({len(members)} parties, {sent} bytes)")

    def local_array(self, n_parties: int) -> np.ndarray:
        """This party's unmasked ring array for the sum step (DESIGN §6)."""
        return contribution(self.params, self.data, self.seed, n_parties)

    def mask(self, local: np.ndarray, round: int, members: list[str]) -> np.ndarray:
        """local + Σ ±PRG(pair keys for this round and participant set) in the ring (DESIGN §4.2)."""
        return self.masker.apply(local, purpose=SUM_PURPOSE, round=round, participants=members)

    def on_message(self, message: wire.Message) -> None:
        if message.step != RESULT_MSG or message.sender != "":
            raise ProtocolError(f"{message.sender or 'the coordinator'!r} sent a {message.step!r} message, "
                                "which an all-reduce job never sends")
        dtype, shape = self.params.wire(self.data.X.shape[1])
        payload = message.payload
        if not isinstance(payload, np.ndarray) or payload.dtype != dtype or payload.shape != shape:
            got = f"{payload.dtype}{list(payload.shape)}" if isinstance(payload, np.ndarray) else "opaque bytes"
            raise ProtocolError(f"the aggregate has {got}, expected {dtype}{list(shape)}")
        self.result = decode_aggregate(self.params, payload)
        self.progress("aggregate received")
