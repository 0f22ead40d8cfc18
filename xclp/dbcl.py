"""Double-blind collaborative learning: the math of a round with sketched layers (Zhang & Wang 2021 §2, §4.2;
docs/design.md §7).

Round t: the coordinator holds the network θ (xclp.nn) and draws, from the round's seed, a sketch
S_ℓ ∈ R^{d_ℓ×s_ℓ} (xclp.sketch) for every sketched fully connected layer ℓ with d_ℓ inputs. It
releases W̃_ℓ = S_ℓᵀ W_ℓ (s_ℓ × k_ℓ) for those layers, the others as they are.
A party forward-passes with Z = (X S) W̃ + b, back-propagates G = ∂ℓ/∂Z and gets
    ∂ℓ/∂W̃ = (X S)ᵀ G,   ∂ℓ/∂b = Σ_rows G,   ∂ℓ/∂X = G W̃ᵀ Sᵀ
(`sketched_backward`); it returns the gradients of what it was given (`RoundView.loss_and_grad`).
The coordinator maps the summed sketched gradient back, W ← W − η S Σ_i ∂ℓ/∂W̃_i
(`unsketch_gradient`). Parties never see W; with masking, the coordinator sees only the sum.

A round of the `type = "dbcl"` job (`client_gradient`, `ServerOptimiser`):
- party i draws a batch of b_i of its labeled rows and returns b_i · ∂ℓ/∂(W̃, b) (the gradient of
  the batch's summed loss) and b_i; the coordinator divides the sum by Σ b_i, so the step follows
  the mean loss over every party's batch, whatever the batch sizes;
- with E > 1 local steps the party also steps its copy of the released parameters between
  batches, as the coordinator would: W ← W − η S G̃ becomes W̃ ← SᵀW − η SᵀS G̃ (SᵀS diagonal,
  known from the seed), and it returns the sum of its E scaled gradients;
- the coordinator maps the mean back with S and steps θ with SGD (momentum optional) or
  RMSProp (the optimiser of the paper's Figure 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from xclp.data.validation import UNLABELED
from xclp.errors import InvalidInput
from xclp.nn import Architecture, Network, dense_backward, dense_forward, weighted_cross_entropy
from xclp.privacy.dpsgd import DpPlan, private_steps
from xclp.sketch import Sketch

OPTIMISERS = ("sgd", "rmsprop")


def sketched_forward(X: np.ndarray, S: Sketch, W_sketched: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Z = (X S) W̃ + b: float[n, d] → float64[n, k]."""
    return dense_forward(S.right(X), W_sketched, b)


def sketched_backward(X: np.ndarray, S: Sketch, W_sketched: np.ndarray,
                      G: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(∂ℓ/∂W̃ = (XS)ᵀG, ∂ℓ/∂b = Σ_rows G, ∂ℓ/∂X = G W̃ᵀ Sᵀ) for upstream G = ∂ℓ/∂Z (Zhang & Wang 2021 §4.2)."""
    dW, db, dXS = dense_backward(S.right(X), W_sketched, G)
    return dW, db, S.left(dXS.T).T


def draw_sketches(arch: Architecture, layers: Sequence[int], kind: str, sizes: Mapping[int, int],
                  seed: bytes) -> dict[int, Sketch]:
    """A fresh sketch for each sketched layer ℓ (its d_ℓ inputs to sizes[ℓ] columns), from the round's seed."""
    out = {}
    n_layers = len(arch.sizes) - 1
    for layer in layers:
        if not 0 <= layer < n_layers:
            raise InvalidInput(f"layer {layer} does not exist: the network has layers 0..{n_layers - 1}")
        d = arch.sizes[layer]
        out[layer] = Sketch.draw(kind, d, sizes[layer], seed, purpose=f"dbcl/layer/{layer}")
    return out


@dataclass
class RoundView:
    """What a party holds in a round: per layer its weights (W̃ = SᵀW if sketched, else W) and bias."""

    weights: list[np.ndarray]
    biases: list[np.ndarray]
    sketches: dict[int, Sketch]

    @classmethod
    def release(cls, net: Network, sketches: Mapping[int, Sketch]) -> RoundView:
        """The coordinator's broadcast: sketched layers as SᵀW, the others as they are."""
        weights = [sketches[i].transpose_left(W) if i in sketches else W.copy() for i, (W, _) in enumerate(net.layers)]
        return cls(weights, [b.copy() for _, b in net.layers], dict(sketches))

    @classmethod
    def from_flat(cls, arch: Architecture, sketches: Mapping[int, Sketch], flat: np.ndarray) -> RoundView:
        """A party's view from the released vector (`flat`); InvalidInput unless it fits exactly."""
        weights, biases = unpack(view_shapes(arch, {i: S.s for i, S in sketches.items()}), flat)
        return cls(weights, biases, dict(sketches))

    @classmethod
    def from_flat_shapes(cls, shapes: Sequence[tuple[int, int]], sketches: Mapping[int, Sketch],
                         flat: np.ndarray) -> RoundView:
        weights, biases = unpack(shapes, flat)
        return cls(weights, biases, dict(sketches))

    def flat(self) -> np.ndarray:
        """The released parameters as one float64 vector: per layer W (or W̃) row-major, then b."""
        return pack(self.weights, self.biases)

    def descend(self, dWs: Sequence[np.ndarray], dbs: Sequence[np.ndarray], learning_rate: float) -> None:
        """Move this copy as the coordinator would move W by the gradient (dWs, dbs) of what is
        held: W ← W − η S G̃ is W̃ ← W̃ − η SᵀS G̃ (SᵀS diagonal), other layers − η G."""
        for i, (dW, db) in enumerate(zip(dWs, dbs)):
            step = self.sketches[i].gram_diagonal()[:, None] * dW if i in self.sketches else dW
            self.weights[i] = self.weights[i] - learning_rate * step
            self.biases[i] = self.biases[i] - learning_rate * db

    @property
    def size(self) -> int:
        return sum(W.size + b.size for W, b in zip(self.weights, self.biases))

    def copy(self) -> RoundView:
        return RoundView([W.copy() for W in self.weights], [b.copy() for b in self.biases], self.sketches)

    def forward(self, X: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        A = np.asarray(X, dtype=np.float64)
        inputs = []
        for i, (W, b) in enumerate(zip(self.weights, self.biases)):
            inputs.append(A)
            Z = sketched_forward(A, self.sketches[i], W, b) if i in self.sketches else dense_forward(A, W, b)
            A = np.maximum(Z, 0.0) if i < len(self.weights) - 1 else Z
        return A, inputs

    # --- per-example gradients (xclp.privacy.dpsgd.Layered) --------------------------------------------

    @property
    def n_layers(self) -> int:
        return len(self.weights)

    def layer_input(self, i: int, A: np.ndarray) -> np.ndarray:
        return self.sketches[i].right(A) if i in self.sketches else A

    def input_gradient(self, i: int, G: np.ndarray) -> np.ndarray:
        dX = G @ self.weights[i].T
        return self.sketches[i].left(dX.T).T if i in self.sketches else dX

    def loss_and_grad(self, X: np.ndarray, y: np.ndarray,
                      w: np.ndarray) -> tuple[float, list[np.ndarray], list[np.ndarray]]:
        """(ℓ, ∂ℓ/∂weights as held, ∂ℓ/∂biases) on a batch."""
        logits, inputs = self.forward(X)
        loss, G = weighted_cross_entropy(logits, np.asarray(y, dtype=np.int64), np.asarray(w, dtype=np.float64))
        dWs: list[np.ndarray] = [np.empty(0)] * len(self.weights)
        dbs: list[np.ndarray] = [np.empty(0)] * len(self.weights)
        for i in range(len(self.weights) - 1, -1, -1):
            if i in self.sketches:
                dWs[i], dbs[i], G = sketched_backward(inputs[i], self.sketches[i], self.weights[i], G)
            else:
                dWs[i], dbs[i], G = dense_backward(inputs[i], self.weights[i], G)
            if i:
                G = G * (inputs[i] > 0.0)
        return loss, dWs, dbs


def unsketch_gradient(net: Network, sketches: Mapping[int, Sketch], dWs: Sequence[np.ndarray],
                      dbs: Sequence[np.ndarray]) -> np.ndarray:
    """The gradient in θ's flat layout: S_ℓ ∂ℓ/∂W̃_ℓ for sketched layers, ∂ℓ/∂W_ℓ for the others."""
    parts = []
    for i in range(len(net.layers)):
        parts.append((sketches[i].left(dWs[i]) if i in sketches else np.asarray(dWs[i])).ravel())
        parts.append(np.asarray(dbs[i]))
    flat = np.concatenate(parts)
    if flat.shape != net.flat.shape:
        raise InvalidInput(f"the gradients do not fit the network: {flat.shape[0]} values for {net.flat.shape[0]}")
    return flat


# --- a round of the dbcl job --------------------------------------------------------------------


def sketch_sizes(arch: Architecture, layers: Sequence[int], ratio: float) -> dict[int, int]:
    """s_ℓ = ⌈ratio · d_ℓ⌉ (at least 1) for each sketched layer ℓ with d_ℓ inputs (paper: ratio ½)."""
    if not 0.0 < ratio <= 1.0:
        raise InvalidInput(f"the sketch ratio s/d must be in (0, 1], got {ratio}")
    n_layers = len(arch.sizes) - 1
    out = {}
    for layer in layers:
        if not 0 <= layer < n_layers:
            raise InvalidInput(f"layer {layer} does not exist: the network has layers 0..{n_layers - 1}")
        out[layer] = max(1, math.ceil(ratio * arch.sizes[layer] - 1e-9))
    return out


def view_shapes(arch: Architecture, sizes: Mapping[int, int]) -> list[tuple[int, int]]:
    """The weight shapes a party holds: (s_ℓ, k_ℓ) for sketched layers, (d_ℓ, k_ℓ) for the others."""
    return [(sizes.get(i, d), k) for i, (d, k) in enumerate(zip(arch.sizes[:-1], arch.sizes[1:]))]


def view_size(arch: Architecture, sizes: Mapping[int, int]) -> int:
    """Floats released (and gradients returned) per party per round."""
    return sum(rows * k + k for rows, k in view_shapes(arch, sizes))


def pack(weights: Sequence[np.ndarray], biases: Sequence[np.ndarray]) -> np.ndarray:
    parts = [part for W, b in zip(weights, biases) for part in (np.ravel(W), np.ravel(b))]
    return np.concatenate(parts).astype(np.float64)


def unpack(shapes: Sequence[tuple[int, int]], flat: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    flat = np.asarray(flat)
    total = sum(r * k + k for r, k in shapes)
    if flat.dtype != np.float64 or flat.shape != (total,):
        raise InvalidInput(f"the sketched parameters are float64[{total}], got {flat.dtype}{list(flat.shape)}")
    if not np.all(np.isfinite(flat)):
        raise InvalidInput("the sketched parameters contain NaN or infinity")
    weights, biases, start = [], [], 0
    for rows, k in shapes:
        weights.append(flat[start:start + rows * k].reshape(rows, k).copy())
        biases.append(flat[start + rows * k:start + rows * k + k].copy())
        start += rows * k + k
    return weights, biases


def client_gradient(view: RoundView, X: np.ndarray, y: np.ndarray, batch: int, steps: int, learning_rate: float,
                    rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """(Σ over `steps` batches of b · ∂ℓ/∂(released parameters), b): the party's contribution.

    Each batch is b = min(batch, labeled rows) labeled rows drawn without replacement from `rng`;
    ℓ is the batch's mean cross-entropy, so b · ∂ℓ is the gradient of its summed loss. Between
    steps the party moves its copy as the coordinator would move W (W̃ −= η SᵀS G̃, others −= η G).
    A party without labeled rows contributes zeros and b = 0.
    """
    labeled = np.flatnonzero(np.asarray(y) != UNLABELED)
    total = np.zeros(view.size)
    if labeled.size == 0:
        return total, 0
    b = min(batch, labeled.size)
    work = view.copy() if steps > 1 else view
    for step in range(steps):
        rows = rng.choice(labeled, size=b, replace=False)
        _, dWs, dbs = work.loss_and_grad(X[rows], y[rows], np.ones(b))
        total += b * pack(dWs, dbs)
        if step < steps - 1:
            work.descend(dWs, dbs, learning_rate)
    return total, b


def private_client_gradient(view: RoundView, X: np.ndarray, y: np.ndarray, batch: int, steps: int,
                            learning_rate: float, dp: DpPlan, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """`client_gradient` with record-level DP (xclp.privacy.dpsgd): the int64 sum over `steps` batches of
    b labeled rows of their per-example gradients clipped to C, randomly rounded at 2^-g (and, with
    several steps, each with the whole noise; one step's noise share is added per attempt of the
    round's sum), and b. Between steps the copy moves by the mean noisy gradient."""
    labeled = np.flatnonzero(np.asarray(y) != UNLABELED)
    shapes = [W.shape for W in view.weights]

    def model(flat: np.ndarray) -> RoundView:
        return RoundView.from_flat_shapes(shapes, view.sketches, flat)

    def move(flat: np.ndarray, mean: np.ndarray) -> np.ndarray:
        work = model(flat)
        dWs, dbs = unpack(shapes, mean)
        work.descend(dWs, dbs, learning_rate)
        return work.flat()

    return private_steps(dp, view.flat(), model, move, X[labeled], y[labeled], np.ones(labeled.size), batch, steps,
                         rng)


@dataclass
class ServerOptimiser:
    """The coordinator's step on θ from the mean unsketched gradient g.

    "sgd": v ← μ v + g, θ ← θ − η v (μ = 0: plain SGD).
    "rmsprop": r ← ρ r + (1 − ρ) g², θ ← θ − η g / (√r + ε) (Tieleman and Hinton; Zhang & Wang 2021 Fig. 2).
    """

    kind: str = "sgd"
    learning_rate: float = 0.1
    momentum: float = 0.0
    decay: float = 0.9
    eps: float = 1e-8
    state: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in OPTIMISERS:
            raise InvalidInput(f"optimiser must be one of {', '.join(OPTIMISERS)}, got {self.kind!r}")
        if not self.learning_rate > 0.0:
            raise InvalidInput(f"the learning rate must be > 0, got {self.learning_rate}")
        if not 0.0 <= self.momentum < 1.0 or not 0.0 < self.decay < 1.0:
            raise InvalidInput("momentum must be in [0, 1) and the RMSProp decay in (0, 1)")

    def step(self, net: Network, gradient: np.ndarray) -> Network:
        g = np.asarray(gradient, dtype=np.float64)
        if g.shape != net.flat.shape or not np.all(np.isfinite(g)):
            raise InvalidInput(f"the gradient must be finite float64[{net.flat.shape[0]}]")
        if self.state is None:
            self.state = np.zeros_like(g)
        if self.kind == "sgd":
            self.state = self.momentum * self.state + g
            move = self.state
        else:
            self.state = self.decay * self.state + (1.0 - self.decay) * g * g
            move = g / (np.sqrt(self.state) + self.eps)
        return Network(net.arch, net.flat - self.learning_rate * move)


def server_step(net: Network, sketches: Mapping[int, Sketch], summed: np.ndarray, rows: int,
                optimiser: ServerOptimiser) -> Network:
    """θ after a round: the parties' summed view gradient over Σ b_i rows, mapped back with S, one optimiser step."""
    if rows <= 0:
        raise InvalidInput("no party trained on a labeled row this round")
    shapes = view_shapes(net.arch, {i: S.s for i, S in sketches.items()})
    dWs, dbs = unpack(shapes, np.asarray(summed, dtype=np.float64) / rows)
    return optimiser.step(net, unsketch_gradient(net, sketches, dWs, dbs))
