"""Federated averaging with pseudo-labels (Scott et al. 2023 §4.2, Alg. 2; docs/design.md §7): the math of one round.

Round t (the coordinator holds θ):
1. sample ⌈fraction · m⌉ of the m parties, a public seeded draw (`sample_parties`) that every
   party can recompute, so a coordinator cannot pick the sets it would like to difference;
2. each sampled party gets θ and, from round `warmup_rounds` on, pseudo-labels its unlabeled rows
   (`pseudo_label`): "xclp" runs XCLP among the sampled parties on the embeddings f_φ(X)
   (Alg. 2 line 3), "local_lp" label propagation on its own embeddings alone, "network" the
   model's own predictions, "none" leaves them out (FedAvg on labeled rows only);
3. ClientUpdate: E epochs of SGD from θ on labeled rows (weight 1) and pseudo-labeled rows
   (weight = confidence ω), giving θ_i; the party contributes n_i·(θ_i − θ) and n_i, the rows
   it trained on (`client_update`);
4. ServerUpdate: θ ← θ + Σ n_i(θ_i − θ) / Σ n_i, the n_i-weighted mean of the θ_i
   (McMahan et al.; the paper's Alg. 2 uses the plain mean) (`server_update`).

Every party's local randomness (batch order) comes from its own generator; the secure service
and `xclp.simulation.run_fedavg` use the same one, so a secure run and the simulation agree
round by round.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from xclp.baselines import per_client_lp
from xclp.data.validation import UNLABELED
from xclp.errors import InvalidInput
from xclp.graph import GraphParams
from xclp.nn import SGD, Architecture, Network, check_examples
from xclp.privacy.dpsgd import DpPlan, private_steps
from xclp.propagation import predict
from xclp.seeding import Seed, public_rng, seed_bytes

PSEUDO_LABELS = ("none", "local_lp", "network", "xclp")
PSEUDO_LABEL_SPACES = ("embedding", "input")  # where xclp and local_lp compare rows


@dataclass(frozen=True)
class PseudoLabels:
    """Labels int64[u] and confidences float64[u] in [0, 1] for a party's unlabeled rows, in row order."""

    labels: np.ndarray
    confidence: np.ndarray


def initial_network(arch: Architecture, seed: Seed) -> Network:
    """θ₀ from the job's public seed (every run of the job starts from the same θ₀)."""
    return Network.init(arch, public_rng(seed, "fedavg/init"))


def sample_size(fraction: float, parties: int) -> int:
    """How many of `parties` a round samples: ⌈fraction · parties⌉, at least one."""
    if not 0.0 < fraction <= 1.0:
        raise InvalidInput(f"fraction must be in (0, 1], got {fraction}")
    return min(parties, max(1, math.ceil(fraction * parties - 1e-9)))


def sample_parties(seed: Seed, round: int, parties: Sequence[str], fraction: float) -> tuple[str, ...]:
    """The ⌈fraction · m⌉ parties of round `round`, sorted: a public draw from the job's seed."""
    ordered = sorted(parties)
    count = sample_size(fraction, len(ordered))
    chosen = public_rng(seed, f"fedavg/sample/{round}").choice(len(ordered), size=count, replace=False)
    return tuple(sorted(ordered[int(i)] for i in chosen))


def round_seed(seed: bytes, round: int) -> bytes:
    """The common seed of round t's XCLP (a fresh LSH every round), from the job's common seed."""
    return hashlib.sha256(b"xclp/fedavg/round/" + seed_bytes(seed) + round.to_bytes(8, "big")).digest()


def local_rng(seed: bytes, party: str, round: int) -> np.random.Generator:
    """The batch order of `party` in round t; keyed by the common seed, which the coordinator lacks."""
    return public_rng(seed, f"fedavg/local/{party}/{round}")


def network_pseudo_labels(net: Network, X: np.ndarray) -> PseudoLabels:
    """The model's own predictions, weighted by ω = 1 − entropy/log C of its softmax (FedAvg+network)."""
    if X.shape[0] == 0:
        return PseudoLabels(np.empty(0, dtype=np.int64), np.empty(0))
    labels, confidence = predict(net.probabilities(X))
    return PseudoLabels(labels, confidence)


def local_lp_pseudo_labels(embedded: np.ndarray, y: np.ndarray, n_classes: int, params: GraphParams) -> PseudoLabels:
    """Label propagation over this party's own embedded rows only (FedAvg + per-client LP)."""
    unlabeled = y == UNLABELED
    if not unlabeled.any():
        return PseudoLabels(np.empty(0, dtype=np.int64), np.empty(0))
    result = per_client_lp(embedded, y, n_classes, params)
    return PseudoLabels(result.labels[unlabeled], result.confidence[unlabeled])


@dataclass(frozen=True)
class TrainingSet:
    """A party's rows for ClientUpdate: labeled (weight 1) and pseudo-labeled (weight ω > 0)."""

    X_labeled: np.ndarray
    y_labeled: np.ndarray
    X_pseudo: np.ndarray
    y_pseudo: np.ndarray
    w_pseudo: np.ndarray

    @property
    def rows(self) -> int:
        """n_j, the rows the party trains on: its weight in the average."""
        return int(self.y_labeled.shape[0] + self.y_pseudo.shape[0])


def neighbour_rows(space: str, net: Network, X: np.ndarray) -> np.ndarray:
    """The rows XCLP and local LP compare in `space` (PSEUDO_LABEL_SPACES): f_φ(X), or X itself."""
    return net.embed(X) if space == "embedding" else X


def local_pseudo_labels(kind: str, net: Network, X: np.ndarray, y: np.ndarray, n_classes: int,
                        params: GraphParams, space: str = "embedding") -> PseudoLabels | None:
    """The pseudo-labels a party makes alone: "none" (None), "network" or "local_lp" (its rows
    compared in `space`: the embedding f_φ or the input); "xclp" needs the other parties of the
    round and comes from an XCLP run instead."""
    if kind == "none":
        return None
    if kind == "network":
        return network_pseudo_labels(net, X[y == UNLABELED])
    if kind == "local_lp":
        return local_lp_pseudo_labels(neighbour_rows(space, net, X), y, n_classes, params)
    raise InvalidInput(f"{kind!r} pseudo-labels are not made by one party alone")


def training_set(X: np.ndarray, y: np.ndarray, pseudo: PseudoLabels | None) -> TrainingSet:
    """The labeled rows, and the unlabeled ones with their pseudo-label and weight ω (Alg. 2 line 3);
    rows of confidence 0 weigh nothing and are left out. Without pseudo-labels: labeled rows only."""
    labeled = y != UNLABELED
    if pseudo is None:
        empty = np.empty((0, X.shape[1]))
        return TrainingSet(X[labeled], y[labeled], empty, np.empty(0, dtype=np.int64), np.empty(0))
    u = int((~labeled).sum())
    if pseudo.labels.shape != (u,) or pseudo.confidence.shape != (u,):
        raise InvalidInput(f"pseudo-labels for {pseudo.labels.shape[0]} rows, but the party has {u} unlabeled rows")
    keep = pseudo.confidence > 0
    return TrainingSet(X[labeled], y[labeled], X[~labeled][keep], pseudo.labels[keep].astype(np.int64),
                       pseudo.confidence[keep])


def batches(data: TrainingSet, opt: SGD,
            rng: np.random.Generator) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """SGD batches of ClientUpdate (Scott et al. 2023 §A.2): with pseudo-labels, each batch is b = min(batch,
    labeled rows) labeled rows and b pseudo-labeled ones, |B_U| = |B_L|; an epoch passes once over
    the larger set while the smaller one cycles in fresh orders. Without, plain batches of rows."""
    n_l, n_u = data.y_labeled.shape[0], data.y_pseudo.shape[0]
    if n_l == 0 or n_u == 0:
        if n_u == 0:
            yield from opt.batches(data.X_labeled, data.y_labeled, np.ones(n_l), rng)
        else:
            yield from opt.batches(data.X_pseudo, data.y_pseudo, data.w_pseudo, rng)
        return
    b = min(opt.batch, n_l)
    steps = math.ceil(max(n_l, n_u) / b)
    for _ in range(opt.epochs):
        L, U = _cycled(rng, n_l, steps * b), _cycled(rng, n_u, steps * b)
        for s in range(steps):
            rl, ru = L[s * b:(s + 1) * b], U[s * b:(s + 1) * b]
            yield (np.concatenate([data.X_labeled[rl], data.X_pseudo[ru]]),
                   np.concatenate([data.y_labeled[rl], data.y_pseudo[ru]]),
                   np.concatenate([np.ones(b), data.w_pseudo[ru]]))


def _cycled(rng: np.random.Generator, n: int, count: int) -> np.ndarray:
    """`count` row numbers: fresh random orders of 0..n−1, one after another."""
    return np.concatenate([rng.permutation(n) for _ in range(math.ceil(count / n))])[:count]


def client_update(net: Network, data: TrainingSet, opt: SGD, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """(n_j·(θ_j − θ) float64[n_params], n_j): E epochs of SGD from θ on the party's training set."""
    n = data.rows
    if n == 0:
        return np.zeros_like(net.flat), 0
    for X, y, w in ((data.X_labeled, data.y_labeled, np.ones(data.y_labeled.shape[0])),
                    (data.X_pseudo, data.y_pseudo, data.w_pseudo)):
        check_examples(net, X, y, w)
    trained = opt.run(net, batches(data, opt, rng))
    return n * (trained.flat - net.flat), n


def private_client_update(net: Network, data: TrainingSet, learning_rate: float, batch: int, steps: int,
                          dp: DpPlan, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """ClientUpdate with record-level DP (xclp.privacy.dpsgd): `steps` DP-SGD steps of b = min(batch, rows)
    rows from θ; returns the int64 sum of the steps' clipped gradient sums at 2^-g (with the whole
    noise at each step when steps > 1; one step's noise share is added per attempt of the round's
    sum) and b. n_j·(θ_j − θ) is then −η times that sum over 2^g (`FedavgJobParams.weighted_delta`)."""
    X = np.concatenate([data.X_labeled, data.X_pseudo])
    y = np.concatenate([data.y_labeled, data.y_pseudo])
    w = np.concatenate([np.ones(data.y_labeled.shape[0]), data.w_pseudo])
    check_examples(net, X, y, w)
    return private_steps(dp, net.flat, lambda flat: Network(net.arch, flat),
                         lambda flat, mean: flat - learning_rate * mean, X, y, w, batch, steps, rng)


def server_update(net: Network, weighted_delta: np.ndarray, rows: int) -> Network:
    """θ + Σ n_i(θ_i − θ) / Σ n_i; θ unchanged if no sampled party had a row to train on."""
    if rows <= 0:
        return net.copy()
    return Network(net.arch, net.flat + weighted_delta / rows)


def accuracy(net: Network, X: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(net.predict(X) == y)) if len(y) else float("nan")
