"""Federated averaging with pseudo-labels (paper 003 §4.2, Alg. 2; DESIGN §7): the math of one round.

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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xclp.baselines import per_client_lp
from xclp.errors import InvalidInput
from xclp.graph import GraphParams
from xclp.nn import SGD, Architecture, Network
from xclp.propagation import predict
from xclp.seeding import Seed, public_rng, seed_bytes
from xclp.validation import UNLABELED

PSEUDO_LABELS = ("none", "local_lp", "network", "xclp")


@dataclass(frozen=True)
class PseudoLabels:
    """Labels int64[u] and confidences float64[u] in [0, 1] for a party's unlabeled rows, in row order."""

    labels: np.ndarray
    confidence: np.ndarray


def initial_network(arch: Architecture, seed: Seed) -> Network:
    """θ₀ from the job's public seed (every run of the job starts from the same θ₀)."""
    return Network.init(arch, public_rng(seed, "fedavg/init"))


def sample_parties(seed: Seed, round: int, parties: Sequence[str], fraction: float) -> tuple[str, ...]:
    """The ⌈fraction · m⌉ parties of round `round`, sorted: a public draw from the job's seed."""
    ordered = sorted(parties)
    if not 0.0 < fraction <= 1.0:
        raise InvalidInput(f"fraction must be in (0, 1], got {fraction}")
    count = min(len(ordered), max(1, math.ceil(fraction * len(ordered) - 1e-9)))
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


def training_set(X: np.ndarray, y: np.ndarray, pseudo: PseudoLabels | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, labels, weights): labeled rows with weight 1, then the unlabeled ones with their
    pseudo-label and weight ω (Alg. 2 line 3); without pseudo-labels, the labeled rows only."""
    labeled = y != UNLABELED
    Xs, ys, ws = [X[labeled]], [y[labeled]], [np.ones(int(labeled.sum()))]
    if pseudo is not None:
        u = int((~labeled).sum())
        if pseudo.labels.shape != (u,) or pseudo.confidence.shape != (u,):
            raise InvalidInput(f"pseudo-labels for {pseudo.labels.shape[0]} rows, but the party has {u} unlabeled rows")
        keep = pseudo.confidence > 0  # a zero weight trains nothing; n_i counts the rows that weigh
        Xs.append(X[~labeled][keep])
        ys.append(pseudo.labels[keep])
        ws.append(pseudo.confidence[keep])
    return np.concatenate(Xs), np.concatenate(ys).astype(np.int64), np.concatenate(ws)


def client_update(net: Network, X: np.ndarray, y: np.ndarray, w: np.ndarray, opt: SGD,
                  rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """(n_i·(θ_i − θ) float64[n_params], n_i): E epochs of SGD from θ on the party's training set."""
    n = int(X.shape[0])
    if n == 0:
        return np.zeros_like(net.flat), 0
    trained = opt.train(net, X, y, w, rng)
    return n * (trained.flat - net.flat), n


def server_update(net: Network, weighted_delta: np.ndarray, rows: int) -> Network:
    """θ + Σ n_i(θ_i − θ) / Σ n_i; θ unchanged if no sampled party had a row to train on."""
    if rows <= 0:
        return net.copy()
    return Network(net.arch, net.flat + weighted_delta / rows)


def accuracy(net: Network, X: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(net.predict(X) == y)) if len(y) else float("nan")
