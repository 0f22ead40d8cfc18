"""The dbcl job on the wire (DESIGN §7, paper 004 §4.2): the round's seed and released parameters.

Rounds are scoped and masked as in the fedavg job (xclp.v1.fedavg: "r<t>.<name>", masks under
`round_session`). Round t, for its sampled parties P_t:
    coordinator -> j   "r<t>.seed"    bytes[32]           the round's fresh seed; S_t of each sketched
                                                          layer is drawn from it (xclp.dbcl.draw_sketches)
    coordinator -> j   "r<t>.model"   float64[n_view]     the released parameters: per layer W̃ = S_tᵀW
                                                          (sketched) or W, then b (xclp.dbcl.view_shapes)
    r<t>.update        j -> coordinator  uint64[n_view + 1]  double-masked: b_j · ∂ℓ/∂(W̃, b) in fixed
                                                          point (2^frac_bits, two's complement), then b_j
    r<t>.update_reveal j -> coordinator  bytes: the round digest ‖ j's self-mask seed
After the last round, to every party: "final_model" float64[n_params] W, or float64[0] when the
job withholds it (withhold_model = true).

A party refuses a round seed it has already seen in the job: with a repeated S the sketches of two
rounds no longer hide the difference of W (paper 004 §4.4), so a coordinator may not reuse one.
"""

from __future__ import annotations

from xclp.errors import InvalidInput
from xclp.v1.fedavg import FINAL_MSG, MODEL_MSG, UPDATE_PURPOSE, UPDATE_REVEAL, UPDATE_STEP

SEED_MSG = "seed"
SEED_BYTES = 32

__all__ = ["FINAL_MSG", "MODEL_MSG", "SEED_BYTES", "SEED_MSG", "UPDATE_PURPOSE", "UPDATE_REVEAL", "UPDATE_STEP",
           "round_seed_payload"]


def round_seed_payload(payload: object, round: int) -> bytes:
    """The seed message of round t as 32 bytes, or InvalidInput."""
    if not isinstance(payload, bytes) or len(payload) != SEED_BYTES:
        raise InvalidInput(f"the seed of round {round} must be {SEED_BYTES} bytes")
    return payload
