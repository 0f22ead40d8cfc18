"""A small fully connected network in numpy: the model of federated training (docs/design.md §7).

    x → ReLU(x W₁ + b₁) → … → ReLU(· W_h + b_h) → (· W_out + b_out) = logits → softmax

Loss: softmax cross-entropy with a weight per example, averaged over the batch,
ℓ = (1/B) Σ_i w_i · (−log softmax(z_i)[y_i]). Forward and backward are written out per layer
(Zhang & Wang 2021 §2): for a dense layer Z = X W + b with upstream G = ∂ℓ/∂Z,
∂ℓ/∂W = Xᵀ G, ∂ℓ/∂b = Σ_rows G, ∂ℓ/∂X = G Wᵀ; ReLU passes G where its input was > 0.
`dense_forward` / `dense_backward` take the layer's weights as arguments, so a sketched layer
(Zhang & Wang 2021 §4.2: Z = (X S) W̃) can wrap them without touching the rest.

All parameters live in one float64 vector (`Network.flat`, W then b for each layer in order);
the layers are views into it. The last hidden layer's output is the feature extractor f_φ of
Scott et al. 2023 Alg. 2 (`embed`). Training is plain mini-batch SGD with optional momentum, the
ClientUpdate of FedAvg; every random draw comes from a Generator the caller passes (STYLE §5).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from xclp.errors import InvalidInput

MAX_LAYER = 1 << 16


def dense_forward(X: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Z = X W + b: float64[B, d_in] → float64[B, d_out]."""
    return X @ W + b


def dense_backward(X: np.ndarray, W: np.ndarray, G: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(∂ℓ/∂W = XᵀG, ∂ℓ/∂b = Σ_rows G, ∂ℓ/∂X = G Wᵀ) for upstream G = ∂ℓ/∂Z (Zhang & Wang 2021 §2)."""
    return X.T @ G, G.sum(axis=0), G @ W.T


def log_softmax(Z: np.ndarray) -> np.ndarray:
    shifted = Z - Z.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def weighted_cross_entropy(Z: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
    """(ℓ, ∂ℓ/∂Z) for logits float64[B, C], labels int[B], weights float64[B]: the mean over the batch
    of w_i · (−log softmax(z_i)[y_i]); ∂ℓ/∂z_i = w_i (softmax(z_i) − onehot(y_i)) / B."""
    logp = log_softmax(Z)
    rows = np.arange(Z.shape[0])
    B = max(Z.shape[0], 1)
    loss = float(-(w * logp[rows, y]).sum() / B)
    G = np.exp(logp)
    G[rows, y] -= 1.0
    return loss, G * (w / B)[:, None]


@dataclass(frozen=True)
class Architecture:
    """Layer widths (d_in, h_1, …, h_k, C): k >= 1 hidden ReLU layers and a softmax output."""

    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        sizes = tuple(self.sizes)
        if len(sizes) < 3:
            raise InvalidInput(f"a network needs inputs, at least one hidden layer and outputs, got sizes "
                               f"{list(sizes)}")
        if any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 1 <= s <= MAX_LAYER for s in sizes):
            raise InvalidInput(f"layer sizes must be integers in 1..{MAX_LAYER}, got {list(sizes)}")
        if sizes[-1] < 2:
            raise InvalidInput(f"the output layer needs at least 2 classes, got {sizes[-1]}")
        object.__setattr__(self, "sizes", tuple(int(s) for s in sizes))

    @property
    def n_params(self) -> int:
        return sum((a + 1) * b for a, b in zip(self.sizes[:-1], self.sizes[1:]))

    @property
    def embed_dim(self) -> int:
        return self.sizes[-2]

    def shapes(self) -> list[tuple[tuple[int, int], tuple[int]]]:
        return [((a, b), (b,)) for a, b in zip(self.sizes[:-1], self.sizes[1:])]


class Network:
    """Parameters θ = one flat float64 vector, and the layers as views into it."""

    def __init__(self, arch: Architecture, flat: np.ndarray) -> None:
        flat = np.asarray(flat)
        if flat.dtype != np.float64 or flat.shape != (arch.n_params,):
            raise InvalidInput(f"the parameters of a {list(arch.sizes)} network are float64[{arch.n_params}], "
                               f"got {flat.dtype}{list(flat.shape)}")
        if not np.all(np.isfinite(flat)):
            raise InvalidInput("the network parameters contain NaN or infinity")
        self.arch = arch
        self.flat = np.array(flat, dtype=np.float64)  # owned: the views below write into it
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []
        start = 0
        for (w_shape, b_shape) in arch.shapes():
            size = w_shape[0] * w_shape[1]
            W = self.flat[start:start + size].reshape(w_shape)
            b = self.flat[start + size:start + size + b_shape[0]]
            self.layers.append((W, b))
            start += size + b_shape[0]

    @classmethod
    def init(cls, arch: Architecture, rng: np.random.Generator) -> Network:
        """He-normal weights (ReLU), zero biases."""
        parts = []
        for (fan_in, fan_out), (b,) in arch.shapes():
            parts.append(rng.normal(0.0, np.sqrt(2.0 / fan_in), size=fan_in * fan_out))
            parts.append(np.zeros(b))
        return cls(arch, np.concatenate(parts))

    def copy(self) -> Network:
        return Network(self.arch, self.flat)

    # --- forward and backward -------------------------------------------------------------------

    def _check(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.arch.sizes[0]:
            raise InvalidInput(f"the network takes float[n, {self.arch.sizes[0]}] rows, got shape {list(X.shape)}")
        return X

    def forward(self, X: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """(logits float64[n, C], the input of every layer): what backward needs."""
        A = self._check(X)
        inputs = []
        for i, (W, b) in enumerate(self.layers):
            inputs.append(A)
            Z = dense_forward(A, W, b)
            A = np.maximum(Z, 0.0) if i < len(self.layers) - 1 else Z
        return A, inputs

    def loss_and_grad(self, X: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
        """(ℓ, ∂ℓ/∂θ float64[n_params]) of the weighted cross-entropy on a batch."""
        logits, inputs = self.forward(X)
        loss, G = weighted_cross_entropy(logits, y, w)
        grads: list[np.ndarray] = []
        for i in range(len(self.layers) - 1, -1, -1):
            W, _ = self.layers[i]
            dW, db, G = dense_backward(inputs[i], W, G)
            grads.extend((db, dW.ravel()))
            if i:
                G = G * (inputs[i] > 0.0)  # ReLU of layer i−1: its output is this layer's input
        return loss, np.concatenate(grads[::-1])

    # --- per-example gradients (xclp.privacy.dpsgd.Layered) --------------------------------------------

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def layer_input(self, i: int, A: np.ndarray) -> np.ndarray:
        return A

    def input_gradient(self, i: int, G: np.ndarray) -> np.ndarray:
        return G @ self.layers[i][0].T

    def embed(self, X: np.ndarray) -> np.ndarray:
        """f_φ(X): the last hidden layer's ReLU output, float64[n, h_k] (Scott et al. 2023 Alg. 2 line 3)."""
        A = self._check(X)
        for W, b in self.layers[:-1]:
            A = np.maximum(dense_forward(A, W, b), 0.0)
        return A

    def probabilities(self, X: np.ndarray) -> np.ndarray:
        """softmax(logits), float64[n, C]."""
        return np.exp(log_softmax(self.forward(X)[0]))

    def predict(self, X: np.ndarray) -> np.ndarray:
        """The most probable class per row, int64[n]."""
        return np.argmax(self.forward(X)[0], axis=1).astype(np.int64)


@dataclass(frozen=True)
class SGD:
    """Mini-batch SGD: `epochs` passes over the rows in a fresh random order, `batch` rows a step,
    v ← μ v + g, θ ← θ − η v (μ = momentum; 0 is plain SGD)."""

    learning_rate: float = 0.1
    momentum: float = 0.0
    batch: int = 32
    epochs: int = 1

    def __post_init__(self) -> None:
        if not self.learning_rate > 0 or not np.isfinite(self.learning_rate):
            raise InvalidInput(f"learning rate must be > 0, got {self.learning_rate}")
        if not 0.0 <= self.momentum < 1.0:
            raise InvalidInput(f"momentum must be in [0, 1), got {self.momentum}")
        if self.batch < 1 or self.epochs < 1:
            raise InvalidInput(f"batch and epochs must be >= 1, got {self.batch} and {self.epochs}")

    def train(self, net: Network, X: np.ndarray, y: np.ndarray, w: np.ndarray, rng: np.random.Generator) -> Network:
        """A trained copy of `net` on rows X float[n, d], labels int[n], weights float[n] >= 0:
        `epochs` passes over the rows in a fresh random order, `batch` rows a step."""
        X, y, w = check_examples(net, X, y, w)
        return self.run(net, self.batches(X, y, w, rng))

    def batches(self, X: np.ndarray, y: np.ndarray, w: np.ndarray,
                rng: np.random.Generator) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """`epochs` passes over the rows, each in a fresh random order, `batch` rows at a time."""
        n = y.shape[0]
        for _ in range(self.epochs if n else 0):
            order = rng.permutation(n)
            for start in range(0, n, self.batch):
                rows = order[start:start + self.batch]
                yield X[rows], y[rows], w[rows]

    def run(self, net: Network, batches: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> Network:
        """A trained copy of `net`: one SGD step per (rows, labels, weights) batch, in order."""
        out = net.copy()
        velocity = np.zeros_like(out.flat)
        with np.errstate(over="ignore", invalid="ignore"):  # divergence is reported below, once
            for X, y, w in batches:
                _, grad = out.loss_and_grad(X, y, w)
                velocity = self.momentum * velocity + grad
                out.flat -= self.learning_rate * velocity  # the layer views see the update
        if not np.all(np.isfinite(out.flat)):
            raise InvalidInput("training diverged (NaN or infinite parameters): lower the learning rate")
        return out


def check_examples(net: Network, X: np.ndarray, y: np.ndarray,
                   w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows float64[n, d_in], labels int64[n] in 0..C−1, weights float64[n] finite and >= 0."""
    X = net._check(X)
    y = np.asarray(y, dtype=np.int64)
    w = np.asarray(w, dtype=np.float64)
    n = X.shape[0]
    if y.shape != (n,) or w.shape != (n,):
        raise InvalidInput(f"labels and weights must have one entry per row ({n}), got {y.shape} and {w.shape}")
    if n and (y.min() < 0 or y.max() >= net.arch.sizes[-1]):
        raise InvalidInput(f"labels must be in 0..{net.arch.sizes[-1] - 1}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise InvalidInput("example weights must be finite and >= 0")
    return X, y, w
