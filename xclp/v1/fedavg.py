"""The fedavg job's parameters (docs/design.md §7, Scott et al. 2023 §4.2): secure FedAvg, optionally with XCLP
pseudo-labels. Its rounds, their steps and messages, the update codec and the model chain are the
training contract both training jobs share (xclp.v1.training)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from xclp.crypto.paillier import MIN_SECURE_BITS
from xclp.errors import ConfigError
from xclp.fedavg import PSEUDO_LABEL_SPACES, PSEUDO_LABELS, neighbour_rows
from xclp.graph import GraphParams
from xclp.nn import SGD, Architecture, Network
from xclp.v1.params import (
    KeySpec,
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
from xclp.v1.xclp import XclpJobParams


@dataclass(frozen=True)
class FedavgJobParams(PrivateTraining):
    """Secure FedAvg of a small network (docs/design.md §7, Scott et al. 2023 §4.2 Alg. 2; xclp.fedavg, xclp.nn).

    Each round samples ⌈fraction · parties⌉ parties, drawn from the parties' common seed and
    announced by them (the coordinator cannot choose it; every party checks each step), trains
    `local_epochs` of SGD on each and adds n_j·(θ_j − θ) under double masking.
    pseudo_label picks what the unlabeled rows are trained on: "none", "local_lp", "network" or
    "xclp" (one secure XCLP run among the round's parties on the embeddings, docs/design.md §5), from
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
                           "Scott et al. 2023 Alg. 2", default="none")
    warmup_rounds: int = param("rounds on labeled rows only before pseudo-labelling starts", ">= 0", default=0)
    pseudo_label_space: str = param('where "xclp" and "local_lp" look for neighbours: "embedding" (the network\'s '
                                 'last hidden layer f_φ, the paper\'s choice) or "input" (the prepared features)',
                                 '"embedding", "input"', "Scott et al. 2023 §4.2", default="embedding")
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
                             power=self.power, key_bits=self.key_bits, insecure_test_keys=self.insecure_test_keys,
                             pair_budget=1.0, influence_tolerance=0.0)  # all pairs, exact: as the reference

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
