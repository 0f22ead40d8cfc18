"""A party's side of the masked all-reduce jobs, FlyNN and RACE (docs/design.md §6): its local array in
the masked sum "sum" (client/phases/masked_sum.py) and the aggregate it gets back.

The arrays are pure functions of (parameters, data, common seed). Wire encodings (xclp.v1.allreduce):
- exact counts: uint32 (counts never exceed the total number of rows);
- DP FlyNN: the paper's per-party release is real-valued (Laplace noise on T chosen entries), so
  it is encoded in fixed point, two's complement in Z_2^64 with `frac_bits` fractional bits
  (crypto/fixedpoint.py, room for τ summands); the decoded sum is the DP model;
- DP RACE: each party adds its discrete-Laplace share (scale R/ε, τ shares) to its integer counts
  and sends int64 two's complement in Z_2^64; only the noised aggregate is ever unmasked.
A restarted round redraws the DP noise for the new number of parties τ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from xclp.client import ledger
from xclp.client.context import PartyContext
from xclp.client.jobs.base import PartyJob
from xclp.client.phases.masked_sum import MaskedSumParty, Noisy
from xclp.crypto.fixedpoint import FixedPoint
from xclp.data.party_table import PartyData
from xclp.errors import InvalidInput, ProtocolError
from xclp.flynn import FlyHash, FlyNNModel, privatise_counts, train_counts
from xclp.race import RaceClassifier, RaceHashes, private_release_share, sketch
from xclp.v1 import registry, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.allreduce import RESULT_MSG, SUM_PURPOSE, SUM_STEP, FlynnJobParams, RaceJobParams

if TYPE_CHECKING:
    from xclp.client.models import ModelFile


def _labeled(data: PartyData) -> tuple[np.ndarray, np.ndarray]:
    mask = data.labeled
    assert data.y is not None or not mask.any()
    return data.X[mask], (data.y[mask] if data.y is not None else np.empty(0, dtype=np.int64))


def flynn_counts(params: FlynnJobParams, data: PartyData, seed: bytes) -> np.ndarray:
    """The party's exact per-class counts, uint32[C, m], under the job's FlyHash (Ram & Sinha 2022 Alg. 2)."""
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


class Release(Protocol):
    """What one all-reduce job type releases: its ring array, and how the aggregate decodes."""

    def wire(self, dim: int) -> tuple[np.dtype[Any], tuple[int, ...]]: ...
    def contribution(self, data: PartyData, seed: bytes, n_parties: int) -> np.ndarray: ...
    def decode(self, aggregate: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class FlynnRelease:
    """FlyNN's per-class counts (Ram & Sinha 2022 Alg. 2), or with ε the paper's per-party DP release."""

    params: FlynnJobParams

    def wire(self, dim: int) -> tuple[np.dtype[Any], tuple[int, ...]]:
        return self.params.wire(dim)

    def contribution(self, data: PartyData, seed: bytes, n_parties: int) -> np.ndarray:
        """The ring array this party adds to the sum (before masking): dtype/shape = params.wire(d)."""
        p = self.params
        dtype, _ = p.wire(data.X.shape[1])
        counts = flynn_counts(p, data, seed)
        if p.epsilon is None or p.T is None:
            return counts.astype(dtype)
        # discrete Laplace on the integer counts: float Laplace leaks through the floating-point
        # representation (Mironov 2012); the integers travel exactly in the fixed-point ring
        released = privatise_counts(counts, p.epsilon, p.T, n_parties, discrete=True)  # int64[C, m]
        return FixedPoint(p.frac_bits, 64).encode(released, n_terms=n_parties).astype(dtype)

    def decode(self, aggregate: np.ndarray) -> np.ndarray:
        """Exact counts as uint32; DP counts decode to float64 >= 0."""
        if not self.params.private:
            return aggregate.astype(np.uint32)
        return np.maximum(FixedPoint(self.params.frac_bits, 64).decode(aggregate.astype(np.uint64)), 0.0)


@dataclass(frozen=True)
class RaceRelease:
    """RACE sketches (Coleman & Shrivastava 2021), or with ε plus this party's share of the distributed noise."""

    params: RaceJobParams

    def wire(self, dim: int) -> tuple[np.dtype[Any], tuple[int, ...]]:
        return self.params.wire(dim)

    def contribution(self, data: PartyData, seed: bytes, n_parties: int) -> np.ndarray:
        p = self.params
        dtype, shape = p.wire(data.X.shape[1])
        counts = race_counts(p, data, seed)
        if p.epsilon is None:
            return counts.astype(dtype)
        shares = [private_release_share(c, p.epsilon, n_parties) for c in counts.reshape(-1, *counts.shape[-2:])]
        return np.stack(shares).reshape(shape).view(np.uint64).astype(dtype)

    def decode(self, aggregate: np.ndarray) -> np.ndarray:
        """Exact sketches as int64; DP sketches as signed int64 (two's complement)."""
        if not self.params.private:
            return aggregate.astype(np.int64)
        return aggregate.astype(np.uint64).view(np.int64)


class AllReduceParty(PartyJob):
    """The party's FlyNN / RACE job: its array in the sum, then the aggregate."""

    def __init__(self, ctx: PartyContext, release: Release) -> None:
        super().__init__(ctx)
        self.release = release
        self.sum = MaskedSumParty(ctx, SUM_STEP, self.local_array, purpose=SUM_PURPOSE,
                                  releases=self._releases if ctx.params.release_epsilon is None else Noisy.DP)

    def _releases(self, members: tuple[str, ...]) -> list[ledger.Release]:
        """The counts under this run's hash functions (the common seed and the job's parameters)."""
        kind = registry.of(self.ctx.params).name
        return [ledger.Release(ledger.function_id("counts", kind, self.ctx.seed, registry.params_json(self.ctx.params)),
                               f"the {kind} counts under this run's hash functions")]

    def local_array(self, members: tuple[str, ...]) -> np.ndarray:
        """This party's unmasked ring array for the sum among `members` (docs/design.md §6)."""
        return self.release.contribution(self.ctx.data, self.ctx.seed, len(members))

    def phases(self) -> tuple[MaskedSumParty, ...]:
        return (self.sum,)

    def on_step(self, step: pb.StepStart) -> None:
        if not self.sum.handles(step.step):
            raise ProtocolError(f"unknown step {step.step!r} for an all-reduce job")
        sent = self.sum.on_step(step)
        if step.step == SUM_STEP:
            self.ctx.progress(f"pushed the masked array for attempt {step.round} ({len(step.participants)} parties, "
                              f"{sent} bytes)")

    def payload_limit(self, step: str, sender: str) -> int:
        if step != RESULT_MSG or sender != "":
            raise ProtocolError(f"{sender or 'the coordinator'!r} sent a {step!r} message, which an all-reduce job "
                                "never sends")
        return wire.array_bytes(*self.release.wire(self.ctx.data.X.shape[1]))

    def on_message(self, message: wire.Message) -> None:
        if message.step != RESULT_MSG or message.sender != "":
            raise ProtocolError(f"{message.sender or 'the coordinator'!r} sent a {message.step!r} message, "
                                "which an all-reduce job never sends")
        dtype, shape = self.release.wire(self.ctx.data.X.shape[1])
        payload = message.payload
        if not isinstance(payload, np.ndarray) or payload.dtype != dtype or payload.shape != shape:
            got = f"{payload.dtype}{list(payload.shape)}" if isinstance(payload, np.ndarray) else "opaque bytes"
            raise ProtocolError(f"the aggregate has {got}, expected {dtype}{list(shape)}")
        self.result = self.release.decode(payload)
        self.ctx.progress("aggregate received")


def flynn_party(ctx: PartyContext) -> AllReduceParty:
    return AllReduceParty(ctx, FlynnRelease(ctx.params_as(FlynnJobParams)))


def race_party(ctx: PartyContext) -> AllReduceParty:
    return AllReduceParty(ctx, RaceRelease(ctx.params_as(RaceJobParams)))


# --- the model files of the two types (xclp.v1.registry's model_loader; client/models.py) ------------


@dataclass(frozen=True)
class FlynnPredictor:
    """A FlyNN model file as `predict` uses it."""

    model: FlyNNModel
    tie_seed: int

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, None]:
        return self.model.predict(X, tie_seed=self.tie_seed), None


def flynn_model(file: ModelFile) -> FlynnPredictor:
    p = file.params
    assert isinstance(p, FlynnJobParams)  # the registry's schema of the type
    return FlynnPredictor(FlyNNModel(file.aggregate, p.gamma, FlyHash.from_seed(file.seed, p.method_params(file.dim))),
                          p.tie_seed)


@dataclass(frozen=True)
class RaceModel:
    """A RACE model file as `query` uses it: the hash functions, and the sketch(es)."""

    hashes: RaceHashes
    aggregate: np.ndarray

    def classifier(self) -> RaceClassifier:
        if self.aggregate.ndim != 3:
            raise InvalidInput("this RACE model is a KDE sketch; it was trained without n_classes")
        return RaceClassifier(self.hashes, self.aggregate)


def race_model(file: ModelFile) -> RaceModel:
    p = file.params
    assert isinstance(p, RaceJobParams)  # the registry's schema of the type
    return RaceModel(RaceHashes.from_seed(file.seed, p.method_params(), file.dim), file.aggregate)
