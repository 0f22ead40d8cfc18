"""Double-blind collaborative learning: the math of a round with sketched layers (paper 004 §2, §4.2;
DESIGN §7).

Round t: the coordinator holds the network θ (xclp.nn) and draws, from the round's seed, a sketch
S_ℓ ∈ R^{d_ℓ×s_ℓ} (xclp.sketch) for every sketched fully connected layer ℓ with d_ℓ inputs. It
releases W̃_ℓ = S_ℓᵀ W_ℓ (s_ℓ × k_ℓ) for those layers, the others as they are.
A party forward-passes with Z = (X S) W̃ + b, back-propagates G = ∂ℓ/∂Z and gets
    ∂ℓ/∂W̃ = (X S)ᵀ G,   ∂ℓ/∂b = Σ_rows G,   ∂ℓ/∂X = G W̃ᵀ Sᵀ
(`sketched_backward`); it returns the gradients of what it was given (`RoundView.loss_and_grad`).
The coordinator maps the summed sketched gradient back, W ← W − η S Σ_i ∂ℓ/∂W̃_i
(`unsketch_gradient`). Parties never see W; with masking, the coordinator sees only the sum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from xclp.errors import InvalidInput
from xclp.nn import Network, dense_backward, dense_forward, weighted_cross_entropy
from xclp.sketch import Sketch


def sketched_forward(X: np.ndarray, S: Sketch, W_sketched: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Z = (X S) W̃ + b: float[n, d] → float64[n, k]."""
    return dense_forward(S.right(X), W_sketched, b)


def sketched_backward(X: np.ndarray, S: Sketch, W_sketched: np.ndarray,
                      G: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(∂ℓ/∂W̃ = (XS)ᵀG, ∂ℓ/∂b = Σ_rows G, ∂ℓ/∂X = G W̃ᵀ Sᵀ) for upstream G = ∂ℓ/∂Z (paper 004 §4.2)."""
    dW, db, dXS = dense_backward(S.right(X), W_sketched, G)
    return dW, db, S.left(dXS.T).T


def draw_sketches(net: Network, layers: Sequence[int], kind: str, sizes: Mapping[int, int],
                  seed: bytes) -> dict[int, Sketch]:
    """A fresh sketch for each sketched layer ℓ (its d_ℓ inputs to sizes[ℓ] columns), from the round's seed."""
    out = {}
    for layer in layers:
        if not 0 <= layer < len(net.layers):
            raise InvalidInput(f"layer {layer} does not exist: the network has layers 0..{len(net.layers) - 1}")
        d = net.arch.sizes[layer]
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

    def forward(self, X: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        A = np.asarray(X, dtype=np.float64)
        inputs = []
        for i, (W, b) in enumerate(zip(self.weights, self.biases)):
            inputs.append(A)
            Z = sketched_forward(A, self.sketches[i], W, b) if i in self.sketches else dense_forward(A, W, b)
            A = np.maximum(Z, 0.0) if i < len(self.weights) - 1 else Z
        return A, inputs

    def loss_and_grad(self, X: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, list[np.ndarray], list[np.ndarray]]:
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
