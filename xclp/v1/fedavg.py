"""The federated training job on the wire (DESIGN §7): round scopes, the update codec, the model.

Every step and message of training round t is named in the round's scope, "r<t>.<name>"
(`scoped`), and every mask and relay key of round t is derived under the round's session id
(`round_session`: SHA-256 of the job's session id and t). So round t's XCLP, its SecureRowSums
and its update sum are each new steps with fresh masks; a party's restart rules (client/policy.py)
and its one-reveal-per-step rule (DESIGN §6.1) hold within each round, and the steps of the
XCLP job (§5) run in a round unchanged.

Round t, for its sampled parties P_t:
    coordinator -> j   "r<t>.model"          float64[n_params]   θ
    (pseudo_label = "xclp": the steps and messages of DESIGN §5 from "layout" on, scoped)
    r<t>.update        j -> coordinator      uint64[n_params + 1] double-masked: n_j·(θ_j − θ) in
                                             fixed point (2^frac_bits, two's complement), then n_j
    r<t>.update_reveal j -> coordinator      bytes: the round digest ‖ j's self-mask seed
After the last round, to every party: "final_model" float64[n_params] θ.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

from xclp.crypto.fixedpoint import FixedPoint
from xclp.errors import InvalidInput
from xclp.v1.double_masking import reveal_step

MODEL_MSG = "model"
UPDATE_STEP = "update"
UPDATE_REVEAL = reveal_step(UPDATE_STEP)
FINAL_MSG = "final_model"
UPDATE_PURPOSE = UPDATE_STEP
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


def model_payload(flat: np.ndarray, n_params: int, what: str) -> np.ndarray:
    """A model message as float64[n_params] of finite values, or InvalidInput naming `what`."""
    if not isinstance(flat, np.ndarray) or flat.dtype != np.float64 or flat.shape != (n_params,):
        raise InvalidInput(f"{what} must be float64[{n_params}]")
    if not np.all(np.isfinite(flat)):
        raise InvalidInput(f"{what} contains NaN or infinity")
    return flat
