"""An XCLP party's progress as one typed value (STYLE 15; docs/architecture.md "A role's state"):
the stage it is in, each stage holding only what is valid there. `XclpParty.stage` is one of

    Joined ──layout──▶ Laid ──graph layout──▶ Receiving ──last column──▶ Whole ──reveal──▶ (result)
                       SecureHamming runs      the influence columns     SecureRowSums
                       (its own role)          fold into Z̄

and moves only forward, but for a restarted coordinator's graph layout again (Receiving or Whole →
Receiving, keeping the Z̄ made before: the same columns give the same Z̄, label-DP noise included).

What a restarted process goes on from (client/run_state.py seals what `saved` gives, versioned,
and `restored` reads it back; a state of another version is refused with its reason, never misread):
- Laid, in SecureHamming from its pairs on: the row layout and SecureHamming's own part
  (client/phases/secure_hamming.py: the pairs, the attempt, its encrypted bit slices, on candidate
  pairs the opened probe table); everything else is recomputed from the data and the seed. The
  coordinator starts the next attempt with it, every pair from its first piece not folded.
- Whole, until it reveals its row sums: the row layout, the graph layout, Z̄ as it releases it
  (with label-DP, its noisy release as drawn: a restarted party masks the same values again, never
  fresh noise) and the digest of the influence columns Z̄ is a function of (its ledger's name for
  the release). The coordinator starts SecureRowSums' next attempt among the same parties, where it
  masks the same Z̄ under fresh masks. Once it has revealed, nothing is kept: a restarted process
  cannot rejoin a sum it helped open.
- Receiving (the influence columns on their way) keeps nothing: a restart there is a drop.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from xclp.client.context import Progress
from xclp.client.ledger import RunAccount
from xclp.client.steps import xclp as steps
from xclp.crypto.fixedpoint import FixedPoint
from xclp.errors import InvalidInput, ProtocolError
from xclp.privacy import label_dp
from xclp.privacy.label_dp import LabelDpPlan
from xclp.progress import Meter
from xclp.v1.xclp import XclpJobParams

VERSION = 2  # of what `saved` writes; 1 was the loose layout before the stages (refused, with its reason)

Zbar = np.ndarray | steps.NoisyRowSums  # Z̄ float64[n, C], or with label-DP its noisy release
Graph = tuple[tuple[str, int], ...]  # (party, rows) in H's order, the parties with rows


@dataclass(frozen=True)
class Joined:
    """Before the row layout: the party knows its roster and seed, nothing of the run's rows."""

    sizes = None
    graph = None


@dataclass(frozen=True)
class Laid:
    """The row layout is in (rows per party with rows, checked against the roster's signed counts);
    SecureHamming runs in its own role until its pairs are done."""

    sizes: dict[str, int]
    graph = None


def influence_digest() -> hashlib._Hash:
    """A running hash of a party's influence pieces, in order: what its row sums are a function of."""
    return hashlib.sha256(b"xclp/influence")


@dataclass
class Receiving:
    """The graph layout is in, and SecureHamming is behind: the influence columns arrive piece by
    piece and fold into Z̄ (`scores`; with randomised response also into `released`, the Z̄ of the
    labels as released), `digest` running over the pieces in order."""

    sizes: dict[str, int]
    graph: Graph
    scores: steps.InfluenceScores
    released: steps.InfluenceScores | None
    meter: Meter
    kept: tuple[bytes, Zbar] | None = None  # (digest, Z̄) made before a restarted coordinator's graph again
    digest: hashlib._Hash = field(default_factory=influence_digest)


@dataclass(frozen=True)
class Whole:
    """Every influence column is in: Z̄ as this party releases it, a function of the columns whose
    digest is `block`; SecureRowSums masks it until it reveals, and the result comes."""

    sizes: dict[str, int]
    graph: Graph
    block: bytes
    zbar: Zbar
    label_privacy: dict[str, Any] | None = None  # with label-DP: what its labels spent
    approximation: dict[str, Any] | None = None  # with sparse influence: what the columns left out

    def saved(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta: dict[str, Any] = {"version": VERSION, "stage": "whole", "sizes": self.sizes,
                                "graph": [[p, n] for p, n in self.graph], "block": self.block.hex(),
                                "label_privacy": self.label_privacy, "approximation": self.approximation}
        if isinstance(self.zbar, steps.NoisyRowSums):
            meta["plan"] = asdict(self.zbar.plan)
            return meta, {"zbar": self.zbar.encoded}
        return meta, {"zbar": self.zbar}

    @classmethod
    def restored(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Whole:
        zbar = arrays["zbar"]
        return cls(sizes_of(meta), tuple((str(p), int(n)) for p, n in meta["graph"]), bytes.fromhex(meta["block"]),
                   steps.NoisyRowSums(zbar, LabelDpPlan(**meta["plan"])) if "plan" in meta else zbar,
                   meta["label_privacy"], meta["approximation"])


Stage = Joined | Laid | Receiving | Whole


def laid_saved(stage: Laid, hamming: tuple[dict[str, Any], dict[str, np.ndarray]]) -> tuple[dict[str, Any],
                                                                                             dict[str, np.ndarray]]:
    """A Laid stage in SecureHamming, with SecureHamming's own saved part."""
    meta, arrays = hamming
    return {"version": VERSION, "stage": "hamming", "sizes": stage.sizes, "hamming": meta}, arrays


def sizes_of(meta: dict[str, Any]) -> dict[str, int]:
    return {str(p): int(n) for p, n in meta["sizes"].items()}


def stage_of(meta: dict[str, Any]) -> str:
    """The saved stage's name ("hamming" or "whole"); InvalidInput, with the reason, for a state
    another version wrote."""
    version = meta.get("version")
    if version != VERSION:
        raise InvalidInput(f"the saved XCLP run state is of version {version or 1}, this xclp-client reads "
                           f"version {VERSION}: it was written by another version of xclp-client")
    if meta.get("stage") not in ("hamming", "whole"):
        raise InvalidInput(f"the saved XCLP run state names no stage this version goes on from ({meta.get('stage')!r})")
    return str(meta["stage"])


def label_dp_release(stage: Receiving, params: XclpJobParams, party_id: str, own_rows: int,
                     account: RunAccount | None, progress: Progress) -> tuple[Zbar, dict[str, Any]]:
    """Z̄ as the party releases it with label-DP (xclp.privacy.label_dp) once `stage` has every
    column: from its randomised labels, or with noise calibrated to the block it received, its own
    `own_rows` exact; and what its labels spent. A Skellam release is charged to `account` (the
    ledger composes runs by RDP)."""
    p, influence = params, stage.scores
    assert p.label_dp_epsilon is not None
    if stage.released is not None:  # randomised response
        values = label_dp.response_values(p.n_classes, hide_unlabeled=p.hide_label_mask)
        spent = {"mechanism": "response", "epsilon_spent": p.label_dp_epsilon, "delta": 0.0,
                 "keep_probability": label_dp.keep_probability(p.label_dp_epsilon, values)}
        progress(f"label-DP ε = {p.label_dp_epsilon:g}: each label was kept with probability "
                 f"{spent['keep_probability']:.3g}, else replaced at random, before use")
        return steps.released_scores(influence.zbar, stage.released.zbar, stage.graph, party_id), spent
    assert p.label_dp_delta is not None
    released = influence.zbar.shape[0] - own_rows
    try:
        plan = label_dp.plan(p.label_dp_epsilon, p.label_dp_delta, *influence.largest_columns, released, p.frac_bits)
        noisy = steps.label_dp_release(influence.zbar, stage.graph, party_id, plan, FixedPoint(frac_bits=p.frac_bits))
        if account is not None:
            account.mechanism("labels", plan.rdp)
    except InvalidInput as exc:
        raise ProtocolError(f"the influence block cannot be released with label-DP: {exc}") from None
    progress(plan.describe())
    return noisy, {"mechanism": "skellam", "epsilon_spent": plan.epsilon, "delta": plan.delta,
                   "noise_std": plan.noise_std, "noise_multiplier": plan.noise_multiplier}
