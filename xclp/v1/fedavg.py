"""The federated training job on the wire (DESIGN §7): its parameters, round scopes, the update
codec, the model.

Every step and message of training round t is named in the round's scope, "r<t>.<name>"
(`scoped`), and every mask and relay key of round t is derived under the round's session id
(`round_session`: SHA-256 of the job's session id and t). So round t's XCLP, its SecureRowSums
and its update sum are each new steps with fresh masks; a party's restart rules (client/policy.py)
and its one-reveal-per-step rule (DESIGN §6.1) hold within each round, and the steps of the
XCLP job (§5) run in a round unchanged.

Before the first round, every party announces every round's sample, drawn from the parties'
common seed (which the coordinator never sees, DESIGN §2.6):
    samples            j -> coordinator      uint8[rounds, m] 1 where party i (roster order) is in P_t
The coordinator goes on only if all announcements agree, and every party refuses a step of round
t naming a party outside P_t.

Round t, for its sampled parties P_t:
    coordinator -> j   "r<t>.model"          float64[n_params]   θ
    (pseudo_label = "xclp": the steps and messages of DESIGN §5 from "layout" on, scoped)
    r<t>.update        j -> coordinator      uint64[n_params + 1] double-masked: n_j·(θ_j − θ) in
                                             fixed point (2^frac_bits, two's complement), then n_j
    r<t>.update_reveal j -> coordinator      bytes: the round digest ‖ j's self-mask seed
    (fedavg: the sum is verifiable, client/phases/masked_sum.py: every member recomputes it and θ_{t+1})
    r<t>.attest        j -> coordinator      bytes: H(θ_t) ‖ H(θ_{t+1}) ‖ Sig_j(chain(session, t, H(θ_t), H(θ_{t+1})))
    coordinator -> all "r<t>.attested"       bytes: H(θ_t) ‖ H(θ_{t+1}) ‖ signers (a byte per roster party)
                                             ‖ their signatures, to every party of the job
After the last round, to every party: "final_model" float64[n_params] θ.

The model chain (issue 45, docs/threat-model.md). Every FedAvg party holds the head of the chain:
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
from xclp.crypto.paillier import MIN_SECURE_BITS
from xclp.dpsgd import DpPlan, plan
from xclp.errors import ConfigError, InvalidInput
from xclp.fedavg import PSEUDO_LABEL_SPACES, PSEUDO_LABELS, neighbour_rows, sample_parties
from xclp.graph import GraphParams
from xclp.nn import SGD, Architecture, Network
from xclp.v1.double_masking import reveal_step
from xclp.v1.params import (
    MAX_DP_DELTA,
    JobParams,
    KeySpec,
    bool_param,
    check_names,
    data_params,
    float_param,
    int_list,
    int_param,
    method,
    n_classes_param,
    optional_float,
    param,
    str_param,
)
from xclp.v1.xclp import XclpJobParams

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
    """Record-level DP of a training job (issue 29, xclp.dpsgd), off unless dp_epsilon is set: each
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
    """A DP update, already integers with their noise (xclp.dpsgd), and its rows -> uint64[n + 1]."""
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


@dataclass(frozen=True)
class FedavgJobParams(PrivateTraining):
    """Secure FedAvg of a small network (DESIGN §7, paper 003 §4.2 Alg. 2; xclp.fedavg, xclp.nn).

    Each round samples ⌈fraction · parties⌉ parties, drawn from the parties' common seed and
    announced by them (the coordinator cannot choose it; every party checks each step), trains
    `local_epochs` of SGD on each and adds n_j·(θ_j − θ) under double masking.
    pseudo_label picks what the unlabeled rows are trained on: "none", "local_lp", "network" or
    "xclp" (one secure XCLP run among the round's parties on the embeddings, DESIGN §5), from
    round `warmup_rounds` on. lsh_bits, k, alpha, power, key_bits and insecure_test_keys are the
    XCLP (and local LP) parameters of the xclp job type.
    """

    n_classes: int = param("number of classes; labels are 0 .. n_classes − 1 (set by `classes` when that is given)",
                           ">= 2")
    hidden: tuple[int, ...] = param("widths of the hidden ReLU layers; the last one is the embedding f_φ",
                                 "1 to 8 layers of 1 .. 4096", "xclp.nn", default=(64,))
    rounds: int = param("training rounds", "1 .. 100000", default=20)
    fraction: float = param("fraction of the parties sampled each round (at least one)", "(0, 1]", default=1.0)
    local_epochs: int = param("epochs of local SGD per round (ClientUpdate; the paper: 5)", ">= 1", default=5)
    batch_size: int = param("rows per SGD step", ">= 1", default=32)
    learning_rate: float = param("SGD step size η", "> 0", default=0.1)
    momentum: float = param("SGD momentum μ (0: plain SGD); it restarts every round", "[0, 1)", default=0.0)
    frac_bits: int = param("fractional bits of the update's fixed-point ring (2^-frac_bits resolution)",
                        "8 .. 40", default=24)
    pseudo_label: str = param('what unlabeled rows train on: "none" (left out), "local_lp" (each party\'s own label '
                           'propagation), "network" (the model\'s predictions), "xclp" (secure XCLP among the '
                           'round\'s parties); weight = confidence ω', '"none", "local_lp", "network", "xclp"',
                           "paper 003 Alg. 2", default="none")
    warmup_rounds: int = param("rounds on labeled rows only before pseudo-labelling starts", ">= 0", default=0)
    pseudo_label_space: str = param('where "xclp" and "local_lp" look for neighbours: "embedding" (the network\'s '
                                 'last hidden layer f_φ, the paper\'s choice) or "input" (the prepared features)',
                                 '"embedding", "input"', "paper 003 §4.2", default="embedding")
    seed: int = param("public seed of the initial model (each round's sample comes from the parties' common "
                      "seed)", ">= 0", default=0)
    lsh_bits: int = param("XCLP: L, LSH bits per embedded row", "multiple of 64", default=1024)
    k: int = param("XCLP and local LP: neighbours per row", ">= 1", default=10)
    alpha: float = param("XCLP and local LP: propagation weight α", "(0, 1)", default=0.99)
    power: float = param("XCLP and local LP: similarity exponent", "> 0", default=3.0)
    key_bits: int = param("XCLP: Paillier modulus size (each party's key serves every round)",
                       ">= 2048 (smaller with insecure_test_keys)", default=MIN_SECURE_BITS)
    insecure_test_keys: bool = param("XCLP: allow key_bits below 2048 (tests only)", "true, false", default=False)
    dp_local_steps: int = param("with dp_epsilon: DP-SGD steps of batch_size rows per round, replacing local_epochs "
                                "(1: the round's noise is shared among its parties; more: each party adds all of it "
                                "at every step)", ">= 1", "docs/privacy.md", default=1)

    def __post_init__(self) -> None:
        check_training(self)
        self.check_dp()
        if self.private:
            if self.pseudo_label in ("local_lp", "xclp"):
                raise ConfigError(f"pseudo_label = {self.pseudo_label!r} cannot run with dp_epsilon: one labeled row "
                                  "moves the pseudo-labels of many rows, so clipping each row's gradient bounds "
                                  "nothing; use \"none\" or \"network\"")
            if self.momentum:
                raise ConfigError("momentum cannot run with dp_epsilon: DP-SGD's local steps are plain SGD")
        elif self.dp_local_steps != 1:
            raise ConfigError("dp_local_steps applies only with dp_epsilon (without DP, local_epochs says how much a "
                              "party trains per round)")
        if self.pseudo_label not in PSEUDO_LABELS:
            raise ConfigError(f"pseudo_label must be one of {', '.join(repr(v) for v in PSEUDO_LABELS)}, "
                              f"got {self.pseudo_label!r}")
        if self.pseudo_label_space not in PSEUDO_LABEL_SPACES:
            raise ConfigError(f"pseudo_label_space must be one of {', '.join(repr(v) for v in PSEUDO_LABEL_SPACES)}, "
                              f"got {self.pseudo_label_space!r}")
        method(lambda: self.optimiser)
        if self.pseudo_label == "xclp":
            method(lambda: self.xclp_params())

    @property
    def optimiser(self) -> SGD:
        return SGD(self.learning_rate, self.momentum, self.batch_size, self.local_epochs)

    @property
    def graph_params(self) -> GraphParams:
        return GraphParams(self.k, self.alpha, self.power)

    def architecture(self, dim: int) -> Architecture:
        return method(lambda: Architecture((dim, *self.hidden, self.n_classes)))

    def xclp_params(self) -> XclpJobParams:
        """The parameters of each round's XCLP run (on embeddings, already prepared)."""
        return XclpJobParams(n_classes=self.n_classes, lsh_bits=self.lsh_bits, k=self.k, alpha=self.alpha,
                             power=self.power, key_bits=self.key_bits, insecure_test_keys=self.insecure_test_keys)

    def neighbour_space(self, net: Network, X: np.ndarray) -> np.ndarray:
        """The rows XCLP and local LP compare: f_φ(X), or the prepared X itself."""
        return neighbour_rows(self.pseudo_label_space, net, X)

    def pseudo_labels_in(self, round: int) -> str:
        """The pseudo-labelling of round t: "none" during the warm-up."""
        return "none" if round < self.warmup_rounds else self.pseudo_label

    @property
    def label_classes(self) -> int:
        return self.n_classes

    @property
    def needs_labels(self) -> bool:
        return True

    @property
    def paillier(self) -> KeySpec | None:
        if self.pseudo_label != "xclp":
            return None
        return KeySpec(self.key_bits, self.insecure_test_keys, "pseudo-labels with XCLP")

    def check_roster(self, expected: int, min_parties: int) -> None:
        check_sample(self.fraction, expected, min_parties)

    @property
    def dp_steps(self) -> int:
        return self.dp_local_steps

    def check_dim(self, dim: int) -> None:
        self.check_dp_sum(self.architecture(dim).n_params, self.batch_size, MAX_DP_PARTIES)

    def weighted_delta(self, total: np.ndarray, n_params: int) -> tuple[np.ndarray, int]:
        """An opened update sum as (Σ_j n_j·(θ_j − θ), Σ_j n_j): with DP the parties sum their noisy
        gradient sums, and n_j·(θ_j − θ) = −η times them (xclp.fedavg.private_client_update)."""
        summed, rows = self.decode_sum(total, n_params)
        return (-self.learning_rate * summed if self.private else summed), rows

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> FedavgJobParams:
        check_names(raw, frozenset({"n_classes", "hidden", "rounds", "fraction", "local_epochs", "batch_size",
                                    "learning_rate", "momentum", "frac_bits", "pseudo_label", "warmup_rounds",
                                    "pseudo_label_space", "seed",
                                    "lsh_bits", "k", "alpha", "power", "key_bits", "insecure_test_keys",
                                    "dp_local_steps"} | DP_KEYS), "fedavg")
        if raw.get("dp_epsilon") is not None and raw.get("local_epochs", 5) != 5:  # the spec's JSON has the default
            raise ConfigError("local_epochs does not apply with dp_epsilon: DP-SGD counts steps (dp_local_steps)")
        return cls(
            n_classes=n_classes_param(raw), hidden=tuple(int_list(raw, "hidden", [64], "layer widths")),
            rounds=int_param(raw, "rounds", 20), fraction=float_param(raw, "fraction", 1.0),
            local_epochs=int_param(raw, "local_epochs", 5), batch_size=int_param(raw, "batch_size", 32),
            learning_rate=float_param(raw, "learning_rate", 0.1), momentum=float_param(raw, "momentum", 0.0),
            frac_bits=int_param(raw, "frac_bits", 24), pseudo_label=str_param(raw, "pseudo_label", "none"),
            warmup_rounds=int_param(raw, "warmup_rounds", 0, low=0),
            pseudo_label_space=str_param(raw, "pseudo_label_space", "embedding"), seed=int_param(raw, "seed", 0, low=0),
            lsh_bits=int_param(raw, "lsh_bits", 1024, low=64), k=int_param(raw, "k", 10),
            alpha=float_param(raw, "alpha", 0.99), power=float_param(raw, "power", 3.0),
            key_bits=int_param(raw, "key_bits", MIN_SECURE_BITS),
            insecure_test_keys=bool_param(raw, "insecure_test_keys"),
            dp_local_steps=int_param(raw, "dp_local_steps", 1), **dp_params(raw), **data_params(raw),
        )


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
