"""The dbcl job on the wire (docs/design.md §7, Zhang & Wang 2021 §4.2): its parameters, the round's seed and
released parameters.

Rounds are scoped and masked as in the fedavg job (xclp.v1.training: "r<t>.<name>", masks under
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
rounds no longer hide the difference of W (Zhang & Wang 2021 §4.4), so a coordinator may not reuse one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xclp.dbcl import OPTIMISERS, ServerOptimiser, sketch_sizes, view_size
from xclp.errors import ConfigError, InvalidInput
from xclp.nn import Architecture
from xclp.sketch import KINDS as SKETCH_KINDS
from xclp.v1.params import (
    bool_param,
    check_names,
    data_params,
    float_param,
    int_list,
    int_param,
    method,
    n_classes_param,
    param,
    str_param,
)
from xclp.v1.training import DP_KEYS, MAX_DP_PARTIES, PrivateTraining, check_sample, check_training, dp_params

SEED_MSG = "seed"
SEED_BYTES = 32


def round_seed_payload(payload: object, round: int) -> bytes:
    """The seed message of round t as 32 bytes, or InvalidInput."""
    if not isinstance(payload, bytes) or len(payload) != SEED_BYTES:
        raise InvalidInput(f"the seed of round {round} must be {SEED_BYTES} bytes")
    return payload


@dataclass(frozen=True)
class DbclJobParams(PrivateTraining):
    """Double-blind collaborative learning of a small network (docs/design.md §7, Zhang & Wang 2021 §4.2; xclp.dbcl).

    Each round the coordinator draws a fresh seed, sketches each layer in `sketched_layers` with
    S_t ∈ R^{d×s} (s = ⌈sketch_ratio · d⌉) and releases W̃ = S_tᵀW with the seed; every sampled
    party returns b·∂ℓ/∂W̃ on a batch of its labeled rows (or the sum over `local_steps` batches)
    under double masking, and the coordinator steps W with S_t times the mean. sketch = "none"
    runs plain federated SGD (every layer released as it is), the baseline DBCL is measured against.
    """

    n_classes: int = param("number of classes; labels are 0 .. n_classes − 1 (set by `classes` when that is given)",
                           ">= 2")
    hidden: tuple[int, ...] = param("widths of the hidden ReLU layers", "1 to 8 layers of 1 .. 4096", "xclp.nn",
                                 default=(64,))
    rounds: int = param("training rounds (one coordinator step each)", "1 .. 100000", default=200)
    fraction: float = param("fraction of the parties sampled each round (drawn from the parties' common seed)",
                            "(0, 1]",
                         default=1.0)
    batch_size: int = param("labeled rows per party per local step", ">= 1", default=32)
    local_steps: int = param("local steps E per round; between them a party moves its sketched copy as the "
                          "coordinator would move W", ">= 1", default=1)
    optimiser: str = param("the coordinator's step: \"sgd\" (with `momentum`) or \"rmsprop\" (the paper's Fig. 2)",
                        '"sgd", "rmsprop"', default="sgd")
    learning_rate: float = param("step size η of the coordinator (and of local steps)", "> 0", default=0.1)
    momentum: float = param("SGD momentum μ, kept by the coordinator across rounds", "[0, 1)", default=0.0)
    rmsprop_decay: float = param("RMSProp decay ρ of the mean squared gradient", "(0, 1)", default=0.9)
    sketch: str = param('the sketch S_t: "countsketch" (one ±1 per row), "uniform" (sampling: dropout, which the '
                     'paper shows does not stop the probe) or "none" (unsketched federated SGD)',
                     '"countsketch", "uniform", "none"', "Zhang & Wang 2021 §2, §4.4", default="countsketch")
    sketch_ratio: float = param("s/d: each sketched layer with d inputs is released as s = ⌈ratio · d⌉ rows",
                             "(0, 1]", default=0.5)
    sketched_layers: tuple[int, ...] | None = param("which layers are sketched, 0 = the input layer; unset: every "
                                                 "layer (the paper leaves the output layer unsketched, which a "
                                                 "party refuses unless --allow-unsketched-layers)",
                                                 "layer numbers", default=None)
    frac_bits: int = param("fractional bits of the gradient's fixed-point ring (2^-frac_bits resolution)",
                        "8 .. 40", default=24)
    seed: int = param("public seed of the initial model (each round's sample comes from the parties' common "
                      "seed)", ">= 0", default=0)
    withhold_model: bool = param("keep the final W from the parties too (the paper's parties never see W); the "
                              "coordinator writes it to the job's `model` file", "true, false", default=False)

    def __post_init__(self) -> None:
        check_training(self)
        self.check_dp()
        if self.sketch not in (*SKETCH_KINDS, "none"):
            raise ConfigError(f"sketch must be one of countsketch, uniform, none, got {self.sketch!r}")
        if self.optimiser not in OPTIMISERS:
            raise ConfigError(f"optimiser must be one of {', '.join(OPTIMISERS)}, got {self.optimiser!r}")
        method(lambda: self.server_optimiser())
        layers = self.layers
        if len(set(layers)) != len(layers) or any(not 0 <= i <= len(self.hidden) for i in layers):
            raise ConfigError(f"sketched_layers must name distinct layers in 0..{len(self.hidden)} (the network has "
                              f"{len(self.hidden) + 1}), got {list(layers)}")
        method(lambda: sketch_sizes(Architecture((1, *self.hidden, self.n_classes)), layers, self.sketch_ratio))

    @property
    def layers(self) -> tuple[int, ...]:
        """The sketched layers (none when sketch = "none"; every layer when sketched_layers is unset)."""
        if self.sketch == "none":
            return ()
        return tuple(range(len(self.hidden) + 1)) if self.sketched_layers is None else tuple(self.sketched_layers)

    @property
    def unsketched_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(len(self.hidden) + 1) if i not in self.layers)

    @property
    def differenced_without_dp(self) -> str:
        # Parties never see W, so they cannot check what the coordinator releases: a W̃ = 0 round
        # and a random-W̃ round, under sets that differ by one party, difference into that party's
        # per-class feature sums and label counts (docs/threat-model.md). Only DP bounds it.
        if self.private:
            return ""
        return ("DBCL's parties never see the model, so the coordinator may release any sketched weights "
                "each round; two rounds under sets that differ by one party difference into that party's "
                "per-class feature sums and label counts, and only record-level DP (dp_epsilon) bounds that")

    def architecture(self, dim: int) -> Architecture:
        return method(lambda: Architecture((dim, *self.hidden, self.n_classes)))

    def sizes(self, dim: int) -> dict[int, int]:
        """s_ℓ of each sketched layer once the data dimension is known."""
        return sketch_sizes(self.architecture(dim), self.layers, self.sketch_ratio)

    def server_optimiser(self) -> ServerOptimiser:
        """A fresh coordinator optimiser (its state lives for the whole job)."""
        return ServerOptimiser(self.optimiser, self.learning_rate, self.momentum, self.rmsprop_decay)

    @property
    def label_classes(self) -> int:
        return self.n_classes

    @property
    def needs_labels(self) -> bool:
        return True

    def check_roster(self, expected: int, min_parties: int) -> None:
        check_sample(self.fraction, expected, min_parties)

    @property
    def required_files(self) -> dict[str, str]:
        if not self.withhold_model:
            return {}
        return {"model": "withhold_model = true keeps the trained network from the parties, and the coordinator "
                         "writes it to the job's model file"}

    @property
    def dp_steps(self) -> int:
        return self.local_steps

    def update_size(self, dim: int) -> int:
        """Values in one party's update: the released parameters' gradient."""
        return view_size(self.architecture(dim), self.sizes(dim))

    def check_dim(self, dim: int) -> None:
        self.sizes(dim)  # every sketched layer fits the data's columns
        self.check_dp_sum(self.update_size(dim), self.batch_size, MAX_DP_PARTIES)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> DbclJobParams:
        check_names(raw, frozenset({"n_classes", "hidden", "rounds", "fraction", "batch_size", "local_steps",
                                    "optimiser", "learning_rate", "momentum", "rmsprop_decay", "sketch", "sketch_ratio",
                                    "sketched_layers", "frac_bits", "seed", "withhold_model"} | DP_KEYS), "dbcl")
        layers = raw.get("sketched_layers")
        return cls(
            n_classes=n_classes_param(raw), hidden=tuple(int_list(raw, "hidden", [64], "layer widths")),
            rounds=int_param(raw, "rounds", 200), fraction=float_param(raw, "fraction", 1.0),
            batch_size=int_param(raw, "batch_size", 32), local_steps=int_param(raw, "local_steps", 1),
            optimiser=str_param(raw, "optimiser", "sgd"), learning_rate=float_param(raw, "learning_rate", 0.1),
            momentum=float_param(raw, "momentum", 0.0), rmsprop_decay=float_param(raw, "rmsprop_decay", 0.9),
            sketch=str_param(raw, "sketch", "countsketch"), sketch_ratio=float_param(raw, "sketch_ratio", 0.5),
            sketched_layers=None if layers is None else tuple(int_list(raw, "sketched_layers", [], "layer numbers")),
            frac_bits=int_param(raw, "frac_bits", 24), seed=int_param(raw, "seed", 0, low=0),
            withhold_model=bool_param(raw, "withhold_model"), **dp_params(raw), **data_params(raw),
        )
