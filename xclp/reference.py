"""The plaintext XCLP oracle the secure protocol is checked against (Scott et al. 2023 Alg. 1, docs/design.md §5).

`xclp_reference` runs every step of Algorithm 1 in one process, with no cryptography, on the same
seeded public structure the parties use:

1. LSH codes per party from Π = lsh_projection(seed, L, d)                  (§5.1)
2. the pooled Hamming matrix H, party blocks in party order                 (§5.2-5.3)
3. kNN graph, 𝒲 and the influence columns S_L of all labeled rows          (§5.4)
4. each party's contribution Z̄^{(j)} = S_L^{(j)} Y_L^{(j)} and their sum Z  (§5.6)
5. labels and confidences per row                                           (§5.7)

Correctness contract (docs/design.md §5): a secure run with the same common seed and parameters must give
exactly `H` (integer equality) and the same labels, with scores equal to `scores` up to the
fixed-point error of SecureRowSums. Rows are ordered party 0's rows, then party 1's, and so on;
`party_rows(j)` gives party j's slice.

Label normalisation (`normalise_labels`, see `propagation.label_norm_mode`): False/"none" is one-hot
(the paper). True/"party": party j divides each class column of its own Y_L^{(j)} by its own count
of that class — all a party can compute alone in §5.6. "pooled": every party divides by the class
counts over all parties (the authors' pooled code); a secure run needs those totals from a masked
sum of per-party counts first. Under label skew "pooled" is clearly better than "party"
(benchmarks/xclp_accuracy.py: digits, Dirichlet(0.3) clients, ~0.96 vs ~0.90).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xclp.data.validation import UNLABELED, check_features, check_labels
from xclp.errors import InvalidInput
from xclp.graph import GraphParams, Influence, InfluenceMethod, build_influence
from xclp.hamming import hamming_matrix
from xclp.lsh import check_lsh_bits, lsh_codes, lsh_projection
from xclp.propagation import LabelNorm, label_matrix, label_norm_mode, predict, scores
from xclp.seeding import Seed

Party = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class XclpResult:
    """Everything the plaintext run produces; n = Σ n_j rows in party order, l labeled rows, C classes.

    codes: uint64[n, L/64] LSH codes; H: uint16[n, n] pooled Hamming matrix; offsets: int64[P+1]
    (party j owns rows offsets[j]:offsets[j+1]); influence: graph, 𝒲, labeled (int64[l] global
    indices, ascending) and S_L (float64[n, l]); contributions: per party Z̄^{(j)} float64[n, C];
    scores: Z = Σ_j Z̄^{(j)} float64[n, C]; labels: int64[n]; confidence: float64[n].
    """

    codes: np.ndarray
    H: np.ndarray
    offsets: np.ndarray
    influence: Influence
    contributions: tuple[np.ndarray, ...]
    scores: np.ndarray
    labels: np.ndarray
    confidence: np.ndarray

    def party_rows(self, j: int) -> slice:
        """Party j's rows in the pooled order."""
        if not 0 <= j < len(self.offsets) - 1:
            raise InvalidInput(f"party index {j} out of range 0..{len(self.offsets) - 2}")
        return slice(int(self.offsets[j]), int(self.offsets[j + 1]))

    def party_labeled(self, j: int) -> np.ndarray:
        """Positions (int64[l_j]) within `influence.labeled` / columns of S_L that belong to party j."""
        rows = self.party_rows(j)
        return np.flatnonzero((self.influence.labeled >= rows.start) & (self.influence.labeled < rows.stop))


def _check_parties(parties: Sequence[Party], n_classes: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    if isinstance(parties, (str, bytes)) or not isinstance(parties, Sequence) or len(parties) == 0:
        raise InvalidInput("parties must be a non-empty sequence of (features, labels) pairs, one per party")
    features: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    for j, party in enumerate(parties):
        if not isinstance(party, (tuple, list)) or len(party) != 2:
            raise InvalidInput(f"party {j} must be a (features, labels) pair")
        X = check_features(party[0], name=f"party {j} features")
        if features and X.shape[1] != features[0].shape[1]:
            raise InvalidInput(
                f"party {j} has {X.shape[1]} feature columns but party 0 has {features[0].shape[1]}; "
                "all parties must use the same feature columns in the same order"
            )
        try:
            y = check_labels(party[1], n_classes, n=X.shape[0])
        except InvalidInput as exc:
            raise InvalidInput(f"party {j}: {exc}") from None
        features.append(X)
        labels.append(y)
    if not any(np.any(y != UNLABELED) for y in labels):
        raise InvalidInput("no labeled rows at all: at least one party must label at least one row (labels 0..C-1)")
    return features, labels


def xclp_reference(
    parties: Sequence[Party],
    seed: Seed,
    n_classes: int,
    lsh_bits: int = 1024,
    params: GraphParams = GraphParams(),
    normalise_labels: bool | LabelNorm = False,
    method: InfluenceMethod = "auto",
    candidates: np.ndarray | None = None,
    influence_tolerance: float = 0.0,
) -> XclpResult:
    """Plaintext XCLP over parties [(X_j float[n_j, d], y_j int[n_j], -1 = unlabeled), ...].

    seed: the common seed (docs/design.md §4.3); lsh_bits: L, a positive multiple of 64; normalise_labels:
    False/"none", True/"party" or "pooled" (module docstring); candidates: bool[n, n], the pairs the
    graph may join (xclp.candidates.candidate_mask: SecureHamming on a candidate schedule), all
    pairs if None; influence_tolerance: above 0 the columns are pushed (xclp.sparse_influence). Raises InvalidInput
    on NaN/inf features, parties with different d, labels outside 0..C−1, empty parties, no
    labeled rows at all, k >= n, or a bad L.
    """
    lsh_bits = check_lsh_bits(lsh_bits)
    norm = label_norm_mode(normalise_labels)
    features, labels = _check_parties(parties, n_classes)
    projection = lsh_projection(seed, lsh_bits, features[0].shape[1])
    codes = np.concatenate([lsh_codes(X, projection) for X in features])  # Alg. 1 line 3, per party
    offsets = np.concatenate([[0], np.cumsum([X.shape[0] for X in features])]).astype(np.int64)
    H = hamming_matrix(codes)  # the matrix SecureHamming delivers to the coordinator
    y = np.concatenate(labels)
    influence = build_influence(H, lsh_bits, np.flatnonzero(y != UNLABELED), params, method, candidates,
                                influence_tolerance)

    pooled_counts = np.bincount(y[influence.labeled], minlength=n_classes) if norm == "pooled" else None
    contributions = []
    for j in range(len(features)):
        # Alg. 1 line 10: party j multiplies its own labeled columns with its own labels.
        own = (influence.labeled >= offsets[j]) & (influence.labeled < offsets[j + 1])
        if not own.any():
            contributions.append(np.zeros((H.shape[0], n_classes)))
            continue
        Y_L = label_matrix(y[influence.labeled[own]], n_classes, norm != "none", pooled_counts)
        contributions.append(scores(influence.S_L[:, own], Y_L))
    Z = np.sum(contributions, axis=0)  # what SecureRowSums reveals, row block by row block
    predicted, confidence = predict(Z)
    return XclpResult(
        codes=codes,
        H=H,
        offsets=offsets,
        influence=influence,
        contributions=tuple(contributions),
        scores=Z,
        labels=predicted,
        confidence=confidence,
    )
