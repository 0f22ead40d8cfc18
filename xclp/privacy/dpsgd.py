"""Record-level differential privacy for the training jobs (docs/design.md §2 point 7, §7):
per-example clipping, the integer release, the noise plan and its accountant.

The unit is one row of one party. In a round a party contributes the sum of its batch's
per-example gradients, each clipped to L2 norm C (`clipped_gradient_sum`):

    v = Σ_{n ∈ batch} clip_C(∇ℓ_n),   clip_C(g) = g · min(1, C / ‖g‖₂)

Replacing one row changes v by at most 2C in L2 (the batch has a fixed size b, and a row outside
the batch changes nothing). The party releases an integer vector in the ring of the masked sum:

    q = R(v · 2^g) + noise,   R(x) = ⌊x + u⌋ with u ~ U[0, 1) per cell (randomised rounding)

For any two inputs x, x' and the same u, |R(x)_i − R(x')_i| <= |x_i − x'_i| + 1 per cell; the
release is a mixture over u of mechanisms with sensitivity

    Δ₂ = 2C·2^g + √d,   Δ₁ = √d·2C·2^g + d        (d = cells)

and Rényi divergence is jointly quasi-convex, so the mixture is as private as the worst u. The
scale 2^g is chosen so that the rounding's √d is at most 1/64 of 2C·2^g (`scale_bits`).

Noise (`plan`): symmetric Skellam of variance μ per cell, μ the smallest for which the job's
releases compose to the job's ε at its δ (xclp.privacy.accounting, the Skellam mechanism's RDP; no
amplification by sampling is claimed). Where a round's contribution is one sum (one local step)
the noise is distributed: each of the m parties of the update's attempt adds a share of variance
μ/(m − 1) (`RoundNoise`), so the shares of any m − 1 already make μ — against the coordinator, and
against any one party that subtracts its own share. With several local steps a party adds the whole
μ itself to each step's sum (local DP-SGD): the released sum then carries m·E times the noise of
the distributed case, which is what a user pays for local steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from xclp.errors import InvalidInput
from xclp.nn import log_softmax
from xclp.privacy.accounting import repeated_skellam_epsilon, skellam_curve, skellam_variance
from xclp.privacy.noise import skellam_share, uniform_open

SCALE_MARGIN = 64  # 2C·2^g >= 64·√d: the rounding adds at most 1/64 to the sensitivity
MAX_SCALE_BITS = 40
RING_LIMIT = 2**62  # the summed release, tails included, stays inside the signed 64-bit ring with room
TAIL_SIGMAS = 40.0  # noise beyond 40 standard deviations: probability below 10^-340 per cell


class Layered(Protocol):
    """A network whose per-example gradients `clipped_gradient_sum` takes (xclp.nn.Network, the
    released parameters of a DBCL round, xclp.dbcl.RoundView)."""

    @property
    def n_layers(self) -> int: ...

    def forward(self, X: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]: ...

    def layer_input(self, i: int, A: np.ndarray) -> np.ndarray:
        """What layer i multiplies its weights with (a sketched layer: A S)."""

    def input_gradient(self, i: int, G: np.ndarray) -> np.ndarray:
        """∂ℓ/∂A of layer i's input for upstream G = ∂ℓ/∂Z."""


def per_example_parts(model: Layered, X: np.ndarray, y: np.ndarray,
                      w: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer (A, G): the rows layer i multiplied and each example's own ∂ℓ_n/∂Z, where ℓ_n =
    w_n · (−log softmax(z_n)[y_n]); example n's gradient of layer i is (A_n ⊗ G_n, G_n)."""
    logits, inputs = model.forward(X)
    G = np.exp(log_softmax(logits))
    G[np.arange(G.shape[0]), y] -= 1.0
    G *= np.asarray(w, dtype=np.float64)[:, None]
    parts: list[tuple[np.ndarray, np.ndarray]] = [(np.empty(0), np.empty(0))] * model.n_layers
    for i in range(model.n_layers - 1, -1, -1):
        parts[i] = (model.layer_input(i, inputs[i]), G)
        if i:
            G = model.input_gradient(i, G) * (inputs[i] > 0.0)
    return parts


def clipped_gradient_sum(model: Layered, X: np.ndarray, y: np.ndarray, w: np.ndarray,
                         clip: float) -> tuple[np.ndarray, np.ndarray]:
    """(Σ_n clip_C(∇ℓ_n) float64[n_params] in the model's flat layout (per layer W then b), the
    per-example norms ‖∇ℓ_n‖₂ before clipping).

    The norms come without forming a per-example gradient: ‖A_n ⊗ G_n‖² = ‖A_n‖²·‖G_n‖², so
    ‖∇ℓ_n‖² = Σ_i (‖A_n‖² + 1)·‖G_n‖² over layers i (Goodfellow 2015). Scaling example n's loss by
    its clip factor scales every layer's G_n by it, so one pass gives the clipped sum."""
    if not clip > 0 or not math.isfinite(clip):
        raise InvalidInput(f"the clipping norm must be finite and > 0, got {clip!r}")
    parts = per_example_parts(model, X, y, w)
    squared = sum(((A * A).sum(axis=1) + 1.0) * (G * G).sum(axis=1) for A, G in parts)
    norms = np.sqrt(np.asarray(squared, dtype=np.float64))
    with np.errstate(divide="ignore"):
        factor = np.minimum(1.0, clip / norms)
    out: list[np.ndarray] = []
    for A, G in parts:
        clipped = G * factor[:, None]
        out.extend(((A.T @ clipped).ravel(), clipped.sum(axis=0)))
    return np.concatenate(out), norms


def scale_bits(clip: float, dim: int) -> int:
    """g: the smallest >= 0 with 2C·2^g >= SCALE_MARGIN·√d (InvalidInput if above MAX_SCALE_BITS)."""
    need = SCALE_MARGIN * math.sqrt(dim) / (2 * clip)
    g = max(0, math.ceil(math.log2(need))) if need > 1 else 0
    if g > MAX_SCALE_BITS:
        raise InvalidInput(f"a clipping norm of {clip:g} is too small for {dim} values (it would need 2^{g} "
                           "resolution); raise clip_norm")
    return g


@dataclass(frozen=True)
class DpPlan:
    """The noise of a DP training job, the same on every party and the coordinator.

    epsilon, delta: the job's budget for all its rounds. releases: the noisy sums a party's rows go
    into if it takes part in every round (rounds, times local steps when local). dim: cells of one
    release. distributed: one local step (the parties share the noise) or local DP-SGD.
    scale_bits: g of the integer release. variance: μ, the Skellam variance per cell of each
    release (distributed: from any m − 1 of its m parties)."""

    epsilon: float
    delta: float
    clip: float
    releases: int
    dim: int
    distributed: bool
    scale_bits: int
    variance: float

    @property
    def scale(self) -> float:
        return float(2**self.scale_bits)

    @property
    def l2(self) -> float:
        """Δ₂ of one release in ring units: replacing a row, plus the randomised rounding."""
        return 2 * self.clip * self.scale + math.sqrt(self.dim)

    @property
    def l1(self) -> float:
        return math.sqrt(self.dim) * 2 * self.clip * self.scale + self.dim

    @property
    def noise_multiplier(self) -> float:
        """σ / C: the noise's standard deviation per cell over the clipping norm (the number
        DP-SGD papers quote; add-or-remove sensitivity C)."""
        return math.sqrt(self.variance) / self.scale / self.clip

    @property
    def rdp(self) -> tuple[float, ...]:
        """The RDP curve (xclp.privacy.accounting.ORDERS) of all the job's releases of a party's rows, which
        the party's ledger composes across runs."""
        return skellam_curve(self.l2, self.l1, self.variance, self.releases)

    def spent(self, releases: int) -> float:
        """ε of a party whose rows went into `releases` of the job's noisy sums."""
        return repeated_skellam_epsilon(releases, self.l2, self.l1, self.variance, self.delta)[0]

    def check_headroom(self, batch: int, steps: int, parties: int) -> None:
        """Refuse (InvalidInput) a job whose summed release could wrap the ring: `parties` sums of
        `steps` clipped batch sums of `batch` rows, with their noise out to 40 σ."""
        signal = parties * steps * (batch * self.clip * self.scale + 1)
        noise_variance = (self.variance * parties / max(parties - 1, 1) if self.distributed
                          else self.variance * parties * steps)
        bound = signal + TAIL_SIGMAS * math.sqrt(noise_variance)
        if bound >= RING_LIMIT:
            raise InvalidInput(f"a DP update sum of {parties} parties could reach {bound:.3g}, beyond the ring's "
                               f"2^62: lower batch_size or clip_norm, or raise dp_epsilon")

    def describe(self) -> str:
        how = "shared among each round's parties" if self.distributed else "each party's own, at every local step"
        return (f"ε = {self.epsilon:g}, δ = {self.delta:g} over {self.releases} release(s); noise multiplier "
                f"{self.noise_multiplier:.3g} ({how}); rows clipped to {self.clip:g}")


def plan(epsilon: float, delta: float, clip: float, releases: int, dim: int, *, distributed: bool) -> DpPlan:
    """The smallest Skellam variance whose `releases` compose to at most (ε, δ)
    (`xclp.privacy.accounting.skellam_variance`); InvalidInput if it cannot be sampled exactly (μ > 2^50)."""
    for name, value in (("epsilon", epsilon), ("clip_norm", clip)):
        if not math.isfinite(value) or value <= 0:
            raise InvalidInput(f"{name} must be finite and > 0, got {value!r}")
    if not 0 < delta < 1:
        raise InvalidInput(f"delta must be in (0, 1), got {delta!r}")
    if releases < 1 or dim < 1:
        raise InvalidInput(f"a plan needs at least one release of one value, got {releases} of {dim}")
    g = scale_bits(clip, dim)
    probe = DpPlan(epsilon, delta, clip, releases, dim, distributed, g, 1.0)
    variance = skellam_variance(epsilon, delta, probe.l2, probe.l1, releases)
    if variance is None:
        raise InvalidInput(f"ε = {epsilon:g} over {releases} release(s) of {dim} values needs more noise than "
                           "can be drawn exactly: raise dp_epsilon, or train fewer rounds or a smaller network")
    return DpPlan(epsilon, delta, clip, releases, dim, distributed, g, variance)


def randomised_round(x: np.ndarray) -> np.ndarray:
    """int64 ⌊x + u⌋, u ~ U[0, 1) per cell from the OS CSPRNG: unbiased, and never off by more
    than 1 from x (module docstring)."""
    return np.floor(x + uniform_open(x.shape)).astype(np.int64)


class Noisy(Protocol):
    """A noise plan: μ, the Skellam variance per cell that any m − 1 of a sum's m shares make
    (DpPlan, xclp.privacy.dp_moments.MomentsPlan)."""

    @property
    def variance(self) -> float: ...


class RoundNoise:
    """This party's noise share for a round's update sum (or the DP moments' sum), the same across
    the sum's attempts: a restart with fewer parties tops it up so that any m − 1 of the m shares
    still make μ (the draws are independent Skellam, so the sum of the share and the top-up is one
    share of the new size). Reusing it means a restarted sum never adds a fresh, independent view
    of this party."""

    def __init__(self, plan: Noisy, dim: int) -> None:
        self.plan, self.dim = plan, dim
        self.share: np.ndarray | None = None
        self.variance = 0.0  # of the share as it stands

    def for_members(self, members: int) -> np.ndarray:
        if members < 2:
            raise InvalidInput("a distributed noise share needs at least 2 parties in the sum")
        needed = self.plan.variance / (members - 1)
        if self.share is None:
            self.share = skellam_share(needed, 1, (self.dim,))
            self.variance = needed
        elif needed > self.variance:
            self.share = self.share + skellam_share(needed - self.variance, 1, (self.dim,))
            self.variance = needed
        return self.share


def private_steps(plan: DpPlan, start: np.ndarray, model: Callable[[np.ndarray], Layered],
                  move: Callable[[np.ndarray, np.ndarray], np.ndarray], X: np.ndarray, y: np.ndarray, w: np.ndarray,
                  batch: int, steps: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """(Σ_e q_e int64[dim], b): `steps` clipped batch sums from the parameters `start`, each
    released as R(v_e · 2^g) (plus, when local, the whole noise μ), b = min(batch, rows) rows drawn
    without replacement from `rng` per step. Between steps the party moves its copy by the mean
    noisy gradient, `move(params, mean) -> params`; `model(params)` is the network to differentiate.
    A party without rows returns zeros and b = 0 (its noise share still goes into the sum)."""
    n = y.shape[0]
    total = np.zeros(start.shape[0], dtype=np.int64)
    if n == 0:
        return total, 0
    b = min(batch, n)
    params = start
    for step in range(steps):
        rows = rng.choice(n, size=b, replace=False)
        v, _ = clipped_gradient_sum(model(params), X[rows], y[rows], w[rows], plan.clip)
        q = randomised_round(v * plan.scale)
        if not plan.distributed:
            q = q + skellam_share(plan.variance, 1, q.shape)
        total += q
        if step < steps - 1:
            params = move(params, q / (plan.scale * b))
    return total, b
