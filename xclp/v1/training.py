"""The training rounds on the wire (docs/design.md §7), which fedavg and dbcl share: round scopes, the
samples, the update codec, the model chain, record-level DP (`PrivateTraining`).

Every step and message of training round t is named in the round's scope, "r<t>.<name>"
(`scoped`), and every mask and relay key of round t is derived under the round's session id
(`round_session`: SHA-256 of the job's session id and t). So round t's XCLP, its SecureRowSums
and its update sum are each new steps with fresh masks; a party's restart rules (client/policy.py)
and its one-reveal-per-step rule (docs/design.md §6.1) hold within each round, and the steps of the
XCLP job (§5) run in a round unchanged.

Before the first round, every party announces every round's sample, drawn from the parties'
common seed (which the coordinator never sees, docs/design.md §2.6):
    samples            j -> coordinator      uint8[rounds, m] 1 where party i (roster order) is in P_t
The coordinator goes on only if all announcements agree, and every party refuses a step of round
t naming a party outside P_t.

Round t, for its sampled parties P_t:
    coordinator -> j   "r<t>.model"          float64[n_params]   θ
    (pseudo_label = "xclp": the steps and messages of docs/design.md §5 from "layout" on, scoped)
    r<t>.update        j -> coordinator      uint64[n_params + 1] double-masked: n_j·(θ_j − θ) in
                                             fixed point (2^frac_bits, two's complement), then n_j
    r<t>.update_reveal j -> coordinator      bytes: the round digest ‖ j's self-mask seed
    (fedavg: the sum is verifiable, client/phases/masked_sum.py: every member recomputes it and θ_{t+1})
    r<t>.attest        j -> coordinator      bytes: H(θ_t) ‖ H(θ_{t+1}) ‖ Sig_j(chain(session, t, H(θ_t), H(θ_{t+1})))
    coordinator -> all "r<t>.attested"       bytes: H(θ_t) ‖ H(θ_{t+1}) ‖ signers (a byte per roster party)
                                             ‖ their signatures, to every party of the job
After the last round, to every party: "final_model" float64[n_params] θ.

The model chain (docs/threat-model.md). Every FedAvg party holds the head of the chain:
the digest of the one model it will accept next. It starts at θ₀, which every party computes from
the job's parameters; it moves to θ_{t+1} when the party recomputes round t's opened sum itself,
or when it receives round t's attestation from H(head), signed by members of the round's sample.
A round whose sum did not come back leaves the head where it was. Every model released (whatever
the round, however many rounds were skipped or passed the party by) and the final model must be
the head: the coordinator cannot release a model a hair from one whose sum it opened, and so
cannot difference two sums over (almost) one model among two sets.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import numpy as np

from xclp.crypto.fixedpoint import FixedPoint
from xclp.errors import ConfigError, InvalidInput
from xclp.fedavg import sample_parties
from xclp.privacy.dpsgd import DpPlan, plan
from xclp.v1.double_masking import reveal_step
from xclp.v1.params import MAX_DP_DELTA, JobParams, method, optional_float, param

MODEL_MSG = "model"
SAMPLES_STEP = "samples"
UPDATE_STEP = "update"
UPDATE_REVEAL = reveal_step(UPDATE_STEP)
FINAL_MSG = "final_model"
ATTEST_STEP = "attest"
ATTESTED_MSG = "attested"
UPDATE_PURPOSE = UPDATE_STEP
SIGNATURE_BYTES = 64
DIGEST_BYTES = 32
ATTEST_BYTES = 2 * DIGEST_BYTES + SIGNATURE_BYTES
_CHAIN_TAG = b"xclp/v1/model-chain\x00"
MAX_ROWS = 2**40  # n_j travels as an unsigned integer; the sum of rows stays exact far below 2^64

_SCOPE = re.compile(r"^r(0|[1-9][0-9]{0,8})\.([a-z_]+)$")


def scoped(round: int, name: str) -> str:
    """"r<t>.<name>": step or message `name` of training round t."""
    return f"r{round}.{name}"


def unscope(name: str) -> tuple[int, str] | None:
    """(t, name) of a scoped step or message name, None for an unscoped one."""
    match = _SCOPE.match(name)
    return (int(match.group(1)), match.group(2)) if match else None


def round_session(session_id: bytes, round: int) -> bytes:
    """The session id under which round t derives its masks, relay keys and reveal digests."""
    return hashlib.sha256(b"xclp/v1/fedavg-round\x00" + session_id + round.to_bytes(8, "big")).digest()


def samples_seed(common_seed: bytes) -> bytes:
    """The seed of every round's sample: the parties' common seed, in its own domain."""
    return hashlib.sha256(b"xclp/fedavg/samples/" + common_seed).digest()


def samples_payload(common_seed: bytes, rounds: int, roster: tuple[str, ...], fraction: float) -> np.ndarray:
    """uint8[rounds, m]: row t marks the parties of round t's sample (xclp.fedavg.sample_parties)."""
    ordered = sorted(roster)
    out = np.zeros((rounds, len(ordered)), dtype=np.uint8)
    seed = samples_seed(common_seed)
    for t in range(rounds):
        for p in sample_parties(seed, t, ordered, fraction):
            out[t, ordered.index(p)] = 1
    return out


def samples_from_payload(payload: object, rounds: int, roster: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """Every round's sample from an announcement; InvalidInput if it is not one."""
    ordered = sorted(roster)
    if (not isinstance(payload, np.ndarray) or payload.dtype != np.uint8 or payload.shape != (rounds, len(ordered))
            or int(payload.max(initial=0)) > 1):
        raise InvalidInput(f"a samples announcement is uint8[{rounds}, {len(ordered)}] of 0 and 1")
    return tuple(tuple(p for p, bit in zip(ordered, row) if bit) for row in payload)


def wire(n_params: int) -> tuple[np.dtype, tuple[int]]:
    """dtype and shape of every party's update payload."""
    return np.dtype("<u8"), (n_params + 1,)


def encode_update(weighted_delta: np.ndarray, rows: int, frac_bits: int, n_parties: int) -> np.ndarray:
    """n_j·(θ_j − θ) float64[n_params] and n_j -> uint64[n_params + 1]; InvalidInput if a value
    could wrap once `n_parties` of them are summed (a diverging model: lower the learning rate)."""
    if not 0 <= rows <= MAX_ROWS:
        raise InvalidInput(f"a party trains on 0..{MAX_ROWS} rows, got {rows}")
    try:
        values = FixedPoint(frac_bits, 64).encode(weighted_delta, n_terms=max(n_parties, 1))
    except InvalidInput as exc:
        raise InvalidInput(f"the model update does not fit the fixed-point ring: {exc}") from None
    return np.concatenate([values, np.array([rows], dtype=np.uint64)])


def decode_update(total: np.ndarray, frac_bits: int) -> tuple[np.ndarray, int]:
    """The unmasked sum -> (Σ n_j·(θ_j − θ) float64[n_params], Σ n_j)."""
    if total.dtype != np.uint64 or total.ndim != 1 or total.shape[0] < 2:
        raise InvalidInput("an update sum is uint64[n_params + 1]")
    rows = int(total[-1])
    if rows > MAX_ROWS * 2**16:
        raise InvalidInput(f"the summed row count {rows} is impossible: the sum was not unmasked correctly")
    return FixedPoint(frac_bits, 64).decode(np.ascontiguousarray(total[:-1])), rows


def model_digest(flat: np.ndarray) -> bytes:
    """H(θ): SHA-256 of a model's float64 values, little-endian (the chain's links)."""
    return hashlib.sha256(b"xclp/v1/model\x00" + np.ascontiguousarray(flat, dtype="<f8").tobytes()).digest()


def chain_message(session_id: bytes, round: int, before: bytes, after: bytes) -> bytes:
    """What a member of round t signs once it recomputed the round's opened sum: θ_t led to θ_{t+1}."""
    if len(before) != DIGEST_BYTES or len(after) != DIGEST_BYTES:
        raise InvalidInput(f"a model digest is {DIGEST_BYTES} bytes")
    return _CHAIN_TAG + hashlib.sha256(session_id).digest() + round.to_bytes(8, "big") + before + after


@dataclass(frozen=True)
class Attestation:
    """One member's attestation of round t (step "r<t>.attest"): H(θ_t) ‖ H(θ_{t+1}) ‖ its signature
    of chain_message."""

    before: bytes
    after: bytes
    signature: bytes

    def pack(self) -> bytes:
        return self.before + self.after + self.signature

    @classmethod
    def unpack(cls, payload: object) -> Attestation:
        if not isinstance(payload, bytes) or len(payload) != ATTEST_BYTES:
            raise InvalidInput(f"an attestation is {ATTEST_BYTES} opaque bytes (two model digests and a signature)")
        return cls(payload[:DIGEST_BYTES], payload[DIGEST_BYTES:2 * DIGEST_BYTES], payload[2 * DIGEST_BYTES:])


@dataclass(frozen=True)
class Attested:
    """Round t's link of the chain as the coordinator relays it: H(θ_t), H(θ_{t+1}), who signed it."""

    before: bytes
    after: bytes
    signatures: dict[str, bytes]  # signer -> its signature of chain_message

    def pack(self, roster: tuple[str, ...]) -> bytes:
        ordered = sorted(roster)
        flags = bytes(int(p in self.signatures) for p in ordered)
        return self.before + self.after + flags + b"".join(self.signatures[p] for p in ordered if p in self.signatures)

    @classmethod
    def unpack(cls, payload: object, roster: tuple[str, ...]) -> Attested:
        ordered = sorted(roster)
        head = 2 * DIGEST_BYTES + len(ordered)
        if not isinstance(payload, bytes) or len(payload) < head:
            raise InvalidInput(f"an attestation is at least {head} opaque bytes")
        flags = payload[2 * DIGEST_BYTES:head]
        if any(f > 1 for f in flags):
            raise InvalidInput("an attestation's signer flags are 0 or 1")
        signers = [p for p, f in zip(ordered, flags) if f]
        if not signers or len(payload) != head + SIGNATURE_BYTES * len(signers):
            raise InvalidInput(f"an attestation carries {SIGNATURE_BYTES} bytes of signature for each of its "
                               "signers, and at least one")
        sigs = payload[head:]
        return cls(payload[:DIGEST_BYTES], payload[DIGEST_BYTES:2 * DIGEST_BYTES],
                   {p: sigs[i * SIGNATURE_BYTES:(i + 1) * SIGNATURE_BYTES] for i, p in enumerate(signers)})

    @staticmethod
    def limit(roster: int) -> int:
        return 2 * DIGEST_BYTES + roster + SIGNATURE_BYTES * roster


def model_payload(flat: object, n_params: int, what: str) -> np.ndarray:
    """A model message as float64[n_params] of finite values, or InvalidInput naming `what`."""
    if not isinstance(flat, np.ndarray) or flat.dtype != np.float64 or flat.shape != (n_params,):
        raise InvalidInput(f"{what} must be float64[{n_params}]")
    if not np.all(np.isfinite(flat)):
        raise InvalidInput(f"{what} contains NaN or infinity")
    return flat


DP_KEYS = frozenset({"dp_epsilon", "dp_delta", "clip_norm"})
MAX_DP_PARTIES = 4096  # the ring's headroom is checked for this many parties in one sum


@dataclass(frozen=True)
class PrivateTraining(JobParams):
    """Record-level DP of a training job (xclp.privacy.dpsgd), off unless dp_epsilon is set: each
    party's rows enter every round as a sum of per-example gradients clipped to clip_norm, released
    as integers with Skellam noise sized so that all the job's rounds spend at most (ε, δ); with
    one local step each round's noise is shared among its parties (any m − 1 shares make it), with
    several each party adds it all to each of its steps."""

    dp_epsilon: float | None = param("record-level DP: the ε every party's rows spend over all the job's rounds "
                                     "(off when unset; needs dp_delta and clip_norm)", "> 0",
                                     "docs/privacy.md", default=None, kw_only=True)
    dp_delta: float | None = param("record-level DP: the δ of dp_epsilon (take 1/n² for n rows)", "(0, 0.01]",
                                   "docs/privacy.md", default=None, kw_only=True)
    clip_norm: float | None = param("record-level DP: every row's gradient is clipped to this L2 norm", "> 0",
                                    "docs/privacy.md", default=None, kw_only=True)

    @property
    def private(self) -> bool:
        return self.dp_epsilon is not None

    @property
    def release_epsilon(self) -> float | None:
        return self.dp_epsilon

    @property
    def release_delta(self) -> float:
        return self.dp_delta or 0.0

    @property
    def dp_steps(self) -> int:
        """Noisy sums a party adds per round: 1 is the distributed case."""
        raise NotImplementedError

    def dp_plan(self, update_dim: int) -> DpPlan | None:
        """The noise for updates of `update_dim` values (None without DP); the same on every end."""
        if self.dp_epsilon is None or self.dp_delta is None or self.clip_norm is None:
            return None
        steps = self.dp_steps
        return method(lambda: _plan(self.dp_epsilon, self.dp_delta, self.clip_norm,
                                    self.rounds * steps, update_dim, steps == 1))

    def epsilon_spent(self, update_dim: int, rounds: int) -> float:
        """ε the accountant gives the rows of a party whose updates went into `rounds` opened sums
        (each round's local steps are releases of their own when the noise is local)."""
        dp = self.dp_plan(update_dim)
        if dp is None or not rounds:
            return 0.0
        return dp.spent(rounds * self.dp_steps)

    def check_dp(self) -> None:
        given = [k for k in ("dp_epsilon", "dp_delta", "clip_norm") if getattr(self, k) is not None]
        if given and len(given) != 3:
            raise ConfigError(f"record-level DP needs dp_epsilon, dp_delta and clip_norm together; got only "
                              f"{', '.join(given)}")
        if not given:
            return
        assert self.dp_epsilon is not None and self.dp_delta is not None and self.clip_norm is not None
        if not self.dp_epsilon > 0:
            raise ConfigError(f"dp_epsilon must be > 0, got {self.dp_epsilon}")
        if not 0 < self.dp_delta <= MAX_DP_DELTA:
            raise ConfigError(f"dp_delta must be in (0, {MAX_DP_DELTA}] (the chance the guarantee fails; take 1/n² "
                              f"for n rows), got {self.dp_delta}")
        if not self.clip_norm > 0:
            raise ConfigError(f"clip_norm must be > 0, got {self.clip_norm}")

    def check_dp_sum(self, update_dim: int, batch: int, parties: int) -> None:
        """Refuse (ConfigError) DP parameters whose summed update could wrap the ring."""
        dp = self.dp_plan(update_dim)
        if dp is not None:
            method(lambda: dp.check_headroom(batch, self.dp_steps, parties))

    def decode_sum(self, total: np.ndarray, update_dim: int) -> tuple[np.ndarray, int]:
        """An opened update sum as (Σ_j of the parties' float vectors, Σ_j of their rows): fixed
        point at 2^-frac_bits, or with DP the noisy integer sums at the plan's 2^-g."""
        dp = self.dp_plan(update_dim)
        return decode_update(total, self.frac_bits if dp is None else dp.scale_bits)

    @property
    def rounds(self) -> int:
        raise NotImplementedError

    @property
    def frac_bits(self) -> int:
        raise NotImplementedError


def private_training(params: object) -> PrivateTraining:
    """A training job's parameters as the DP schema they all extend."""
    if not isinstance(params, PrivateTraining):
        raise InvalidInput(f"{type(params).__name__} is not a training job's parameters")
    return params


@lru_cache(maxsize=64)
def _plan(epsilon: float, delta: float, clip: float, releases: int, dim: int, distributed: bool) -> DpPlan:
    return plan(epsilon, delta, clip, releases, dim, distributed=distributed)


def dp_params(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `PrivateTraining`'s fields from a [params] table."""
    return {k: optional_float(raw, k) for k in DP_KEYS}


def encode_private_update(q: np.ndarray, rows: int) -> np.ndarray:
    """A DP update, already integers with their noise (xclp.privacy.dpsgd), and its rows -> uint64[n + 1]."""
    if not 0 <= rows <= MAX_ROWS:
        raise InvalidInput(f"a party trains on 0..{MAX_ROWS} rows, got {rows}")
    return np.concatenate([np.asarray(q, dtype=np.int64).view(np.uint64), np.array([rows], dtype=np.uint64)])


class TrainingParams(Protocol):
    """What the rounds of a training job (fedavg, dbcl) read from its parameters."""

    @property
    def n_classes(self) -> int: ...
    @property
    def hidden(self) -> tuple[int, ...]: ...
    @property
    def rounds(self) -> int: ...
    @property
    def fraction(self) -> float: ...
    @property
    def frac_bits(self) -> int: ...
    @property
    def seed(self) -> int: ...
    def _check_data(self, n_classes: int) -> None: ...


def check_training(p: TrainingParams) -> None:
    """What the fedavg and dbcl schemas share: classes, data preparation, the network, the rounds."""
    if p.n_classes < 2:
        raise ConfigError("n_classes must be >= 2")
    p._check_data(p.n_classes)
    if not 1 <= len(p.hidden) <= 8 or any(isinstance(h, bool) or not isinstance(h, int) or not 1 <= h <= 4096
                                          for h in p.hidden):
        raise ConfigError(f"hidden must be a list of 1 to 8 layer widths in 1..4096, got {list(p.hidden)}")
    if not 1 <= p.rounds <= 100_000:
        raise ConfigError(f"rounds must be in 1..100000, got {p.rounds}")
    if not 0.0 < p.fraction <= 1.0:
        raise ConfigError(f"fraction must be in (0, 1], got {p.fraction}")
    if not 8 <= p.frac_bits <= 40:
        raise ConfigError(f"frac_bits must be in [8, 40], got {p.frac_bits}")


def check_sample(fraction: float, expected: int, min_parties: int) -> None:
    """Refuse a sampling fraction whose rounds would have fewer than min_parties parties."""
    per_round = math.ceil(fraction * expected - 1e-9)
    if per_round < min_parties:
        raise ConfigError(f"fraction = {fraction} samples {per_round} of the {expected} parties per round, fewer "
                          f"than min_parties = {min_parties}; raise fraction or lower min_parties")
