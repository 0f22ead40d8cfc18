"""The XCLP job on the wire (docs/design.md §5, Scott et al. 2023 Alg. 1): its parameters, its step
and message names in the order they happen, and the dtype and shape of every payload (both ends
build and check payloads with the dtypes below; rows and pairs in xclp.v1.xclp_layout). Per party
j with n_j rows:

    coordinator -> all   "layout"          uint64[P]  rows per roster party (0 = not in the job)
    intra_hamming        j -> coordinator  uint32[n_j, k', 2] own k' = min(k, n_j − 1) nearest rows
                                           (row, distance) per row, never the n_j × n_j block (§10.1)
    coordinator -> all   "pairs"           uint64[m, 2] roster positions (A, B) of every pair (§5.3); with
                                           FINE_PIECES uint64[m, 3], each pair's ciphertexts per piece too
    coordinator -> all   "pairs_from"      uint64[m] before a restart (round = its attempt): per pair the
                                           first piece it does ("pairs_kept", uint8[m], to older parties)
    secure_hamming       streamed per pair in pieces of A's batches (§10.1, xclp.v1.secure_hamming_wire):
                         A -> B (relayed)  sealed bytes: encrypted bit slices of A's codes; then an
                                           acknowledgement per piece
                         B -> coordinator  uint8[16 + 32]: the pair's mask seed (B's masks R derive from it)
                         B -> A (relayed)  sealed bytes: the evaluated ciphertexts of one piece
                         A -> coordinator  uint8[16 + |piece|·|N|/8]: t of one piece, one big-endian
                                           value mod N per ciphertext
    (candidate pairs)    j -> coordinator  "probes" uint16[n_j, p]; the masked sum "probe_table"
                                           uint64[probes, C] (xclp.v1.centres)
    labeled_sets         j -> coordinator  int64[l_j] (skipped with hide_label_mask)    (§5.5)
    coordinator -> j     "graph"           uint64[P]  rows per roster party in H (0 = left)
    coordinator -> j     "influence"       float64[n, c] pieces of ≤ 4 MiB, in j's column order, making up
                                           S_L^{(j)} float64[n, l_j] (float64[n, n_j] if hidden) (§5.5,
                                           §10.2: solved in blocks of columns, never all S_L at once)
    rowsums (masked sum) j -> coordinator  uint64[n_frame − n_j, C] double-masked row sums (§5.6, §6.1)
    coordinator -> j     "rowsums_result"  uint64[u_j, C] for j's u_j unlabeled rows (uint64[n_j, C] if hidden)
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from xclp.candidates import AUTO, spread_fraction
from xclp.crypto.paillier import MIN_SECURE_BITS
from xclp.errors import ConfigError, InvalidInput
from xclp.graph import GraphParams, InfluenceMethod
from xclp.privacy import label_dp
from xclp.v1.params import (
    MAX_DP_DELTA,
    JobParams,
    KeySpec,
    bool_param,
    check_names,
    data_params,
    float_param,
    int_param,
    method,
    n_classes_param,
    optional_float,
    param,
    str_param,
)

# pair_budget unset: all pairs up to this many rows in all, "auto" above (docs/jobs/xclp.md: at 20 000 rows
# one probe per row kept the accuracy within a point of all pairs, whose Paillier work passes hours)
ALL_PAIRS_ROWS = 20_000
AUTO_ESTIMATE = 2.0  # pair_budget = "auto": its work planned at this many times the even spread's cost
# centres unset: about this many rows in all per centre, a power of two in [MIN_AUTO_CENTRES, MAX_AUTO_CENTRES]
# (docs/jobs/xclp.md "How many centres"); set in the job, at most MAX_CENTRES ("Crowded data": a table that
# crowds a few directions needs more than its rows suggest; the probes go as uint16)
AUTO_CENTRE_ROWS, MIN_AUTO_CENTRES, MAX_AUTO_CENTRES, MAX_CENTRES = 200, 64, 4096, 16384
# influence_tolerance unset: exact dense columns up to this many rows in all, pushed to
# AUTO_INFLUENCE_TOLERANCE above (docs/jobs/xclp.md "Sparse influence": measured on Fashion-MNIST and digits)
EXACT_INFLUENCE_ROWS = 20_000
AUTO_INFLUENCE_TOLERANCE = 1e-4
MAX_INFLUENCE_TOLERANCE = 0.01
RESOLVED = ("pair_budget", "centres", "influence_tolerance")  # for_rows' values, kept in a run's state

LAYOUT_MSG = "layout"
PAIRS_MSG = "pairs"
# coordinator -> each graph member before a SecureHamming restart (round = its attempt): uint8[m],
# 1 for the pairs of the pairs message folded in an earlier attempt, which this one skips; sent
# only when every member has the capability KEEPS_PAIRS (else every pair starts again)
KEPT_PAIRS_MSG = "pairs_kept"
KEEPS_PAIRS = "hamming-keeps-pairs"
FINE_PIECES = "hamming-fine-pieces"  # every member has it: the pairs message cuts each pair finely
# ... or, when every member has the capability KEEPS_PIECES, instead: uint64[m], per pair the first
# piece this attempt does (the pieces before it are folded; as many as the pair has: skipped whole)
PAIRS_FROM_MSG = "pairs_from"
KEEPS_PIECES = "hamming-keeps-pieces"
INTRA_STEP = "intra_hamming"
HAMMING_STEP = "secure_hamming"
LABELS_STEP = "labeled_sets"
GRAPH_MSG = "graph"
INFLUENCE_MSG = "influence"
ROWSUMS_STEP = "rowsums"
ROWSUMS_PURPOSE = ROWSUMS_STEP  # the pairwise-mask purpose (HKDF info) of SecureRowSums
ROWSUMS_RESULT_MSG = "rowsums_result"
# The payloads' dtypes (the table above): the coordinator and the party build and check them from here.
ROWS_DTYPE = np.dtype(np.uint64)  # "layout", "graph": rows per roster party
NEIGHBOURS_DTYPE = np.dtype(np.uint32)  # intra_hamming: (own row, distance) per nearest own row
PAIRS_DTYPE = np.dtype(np.uint64)  # "pairs", "pairs_from"
PAIRS_KEPT_DTYPE = np.dtype(np.uint8)  # "pairs_kept"
PROBES_DTYPE = np.dtype(np.uint16)  # "probes": a party's first probes per row (candidate pairs)
PROBE_TABLE_DTYPE = np.dtype(np.uint64)  # "probe_table", a masked sum
LABELED_DTYPE = np.dtype(np.int64)  # labeled_sets: labeled row numbers
INFLUENCE_DTYPE = np.dtype(np.float64)  # "influence" pieces, exact: float64[n, c]
# ... or, with influence_tolerance > 0, sparse: uint32[1 + 2c + 2·nnz] (xclp/v1/influence.py)
SPARSE_INFLUENCE_DTYPE = np.dtype(np.uint32)
# a party's version reads sparse influence pieces: a run whose resolved influence_tolerance is above 0
# starts only when every party said so at Join
SPARSE_INFLUENCE = "sparse-influence"
ROW_SUMS_DTYPE = np.dtype(np.uint64)  # rowsums, "rowsums_result" (fixed point in the ring)
# docs/design.md §10.2: influence columns are solved SOLVE_COLUMNS at a time and travel in pieces of at most
# INFLUENCE_PIECE_BYTES (at least one column each), in the receiver's column order
SOLVE_COLUMNS = 256
SOLVE_BYTES = 256 << 20
INFLUENCE_PIECE_BYTES = 4 << 20


def auto_centres(rows: int) -> int:
    """The centres of a run whose job leaves them unset: the power of two nearest rows /
    AUTO_CENTRE_ROWS, within [MIN_AUTO_CENTRES, MAX_AUTO_CENTRES]. More centres make each centre's lists
    shorter, so each row is compared with fewer of a peer's rows, down to one batch of a ciphertext's
    slots (docs/jobs/xclp.md "How many centres")."""
    want = max(float(rows), 1.0) / AUTO_CENTRE_ROWS
    return int(min(MAX_AUTO_CENTRES, max(MIN_AUTO_CENTRES, 2 ** round(math.log2(max(want, 1.0))))))


def own_neighbours_shape(n_rows: int, k: int) -> tuple[int, int, int]:
    """A party's own k nearest rows on the wire (docs/design.md §10.1): uint32[n_j, min(k, n_j − 1), 2] of
    (own row number, Hamming distance)."""
    return (n_rows, max(0, min(k, n_rows - 1)), 2)


def solve_columns(n_rows: int) -> int:
    """Influence columns solved together over `n_rows` graph rows: SOLVE_COLUMNS, fewer when the
    block's working arrays (about eight float64[n, c] in conjugate gradients) would pass SOLVE_BYTES."""
    return max(1, min(SOLVE_COLUMNS, SOLVE_BYTES // (8 * 8 * max(n_rows, 1))))


def influence_piece_columns(n_rows: int) -> int:
    """Columns of one influence piece over `n_rows` graph rows: float64[n, c] within the piece size."""
    return max(1, INFLUENCE_PIECE_BYTES // (8 * max(n_rows, 1)))

LABEL_NORMS = ("none", "party")
SOLVERS = ("auto", "dense", "sparse", "cg")


@dataclass(frozen=True)
class XclpJobParams(JobParams):
    """XCLP (docs/design.md §5, Scott et al. 2023 Alg. 1): L = lsh_bits LSH bits, graph (k, alpha, power), Paillier
    key size, SecureRowSums fixed point and what the coordinator may learn.

    key_bits below 2048 only with `insecure_test_keys = true` (tests and quick local trials).
    SecureHamming masks are uniform mod N (perfect hiding, crypto/secure_hamming.py), so there is
    no statistical-security parameter σ; a job file naming "sigma" is refused as an unknown key.
    label_norm: "none" = one-hot Y_L (the paper), "party" = each party divides each class column by
    its own count of that class (the authors' code, per party; docs/design.md §5.6). hide_label_mask: the
    coordinator sends every party the influence columns of all its rows, so it never learns which
    rows are labeled (docs/design.md §5.5). solver: "auto" = dense Cholesky for small n, else a sparse LU
    if its fill stays small, else conjugate gradients (xclp.graph); frac_bits: SecureRowSums
    fixed-point scale 2^frac_bits.
    """

    n_classes: int = param("number of classes; labels are 0 .. n_classes − 1 (set by `classes` when that is given)",
                           ">= 2")
    lsh_bits: int = param("L, LSH bits per row (the paper uses 4096); more bits, closer to exact cosine",
                          "multiple of 64", "Scott et al. 2023 §3", default=1024)
    k: int = param("neighbours kept per row of the graph", "1 .. all rows − 1", default=10)
    alpha: float = param("propagation weight α", "(0, 1)", default=0.99)
    power: float = param("similarity exponent p in cos(π H / L)^p (the authors' code: 3; the paper's text: 1)",
                         "> 0", default=3.0)
    key_bits: int = param("Paillier modulus size; every party runs `xclp-client run --paillier-bits` with it",
                          ">= 2048 (smaller with insecure_test_keys)", "docs/protocol.md#securehamming",
                          default=MIN_SECURE_BITS)
    hide_label_mask: bool = param("the coordinator does not learn which rows are labeled; each party then gets "
                                  "the influence columns of all its rows", "true, false",
                                  "docs/protocol.md#hide-label-mask", default=False)
    label_norm: str = param('"none": one-hot labels (the paper); "party": each party divides each class column '
                            'by its own count of that class', '"none", "party"', "docs/protocol.md#label-norm",
                            default="none")
    solver: str = param('influence solve: "dense" Cholesky, "sparse" LU, "cg" conjugate gradients, "auto": dense '
                        "for small graphs, else the sparse LU while its fill stays small, else CG",
                        '"auto", "dense", "sparse", "cg"', default="auto")
    frac_bits: int = param("fractional bits of the SecureRowSums fixed-point ring", "8 .. 48", default=32)
    insecure_test_keys: bool = param("allow key_bits below 2048 (tests and quick trials only)", "true, false",
                                     default=False)
    pair_budget: float | str | None = param("SecureHamming on candidate pairs only: the most its ciphertexts may "
                                            "cost, as a fraction of all pairs' (1.0: all pairs, exact); \"auto\": "
                                            "one probe per row, the least schedule, whatever it costs; unset: all "
                                            "pairs up to all_pairs_rows rows in all, \"auto\" above",
                                            '(0, 1], "auto"', "docs/jobs/xclp.md", default=None)
    all_pairs_rows: int = param("with pair_budget unset: the most rows in all (the parties' on the roster) that "
                                "run SecureHamming on all pairs; above, candidate pairs with pair_budget = \"auto\"",
                                "0 .. 10^9", "docs/jobs/xclp.md", default=ALL_PAIRS_ROWS)
    centres: int | None = param("candidate pairs: directions drawn from the parties' common seed that the rows "
                                "are grouped around (no one's data moves them); unset: a power of two near the "
                                f"rows in all / {AUTO_CENTRE_ROWS}, from {MIN_AUTO_CENTRES} to {MAX_AUTO_CENTRES}",
                                f"2 .. {MAX_CENTRES}", "docs/jobs/xclp.md", default=None)
    probes: int = param("candidate pairs: nearest centres each row lists (the budget picks how many are used)",
                        "1 .. 16", "docs/jobs/xclp.md", default=4)
    budget_slack: float = param("candidate pairs: each party's rows per centre, as a multiple of its share of "
                                "the centre's pooled rows (more: fewer rows cut, more padding)", ">= 1",
                                "docs/jobs/xclp.md", default=1.0)
    influence_tolerance: float | None = param(
        "the influence columns pushed to this tolerance and sent sparse, each with the share of its mass left "
        "out measured (docs/jobs/xclp.md \"Sparse influence\"); 0: exact and dense; unset: exact up to "
        f"{EXACT_INFLUENCE_ROWS} rows in all, {AUTO_INFLUENCE_TOLERANCE:g} above",
        f"0 .. {MAX_INFLUENCE_TOLERANCE:g}", "docs/jobs/xclp.md", default=None)
    label_dp_epsilon: float | None = param("label-DP: the ε each label of each party spends in its SecureRowSums "
                                           "contribution, whatever influence block the coordinator sends (off when "
                                           "unset)", "> 0", "docs/privacy.md", default=None)
    label_dp_mechanism: str = param('label-DP: "response" randomises each label before use (δ = 0); "skellam" adds '
                                    "noise to the row sums calibrated to the block received (needs label_dp_delta)",
                                    '"response", "skellam"', "xclp.privacy.label_dp", default="response")
    label_dp_delta: float | None = param('label-DP with "skellam": the δ of label_dp_epsilon (take 1/n² for n '
                                         "labeled rows)", f"(0, {MAX_DP_DELTA}]", "docs/privacy.md",
                                         default=None)

    def __post_init__(self) -> None:
        if self.n_classes < 2:
            raise ConfigError("n_classes must be >= 2")
        self._check_data(self.n_classes)
        if self.lsh_bits % 64:
            raise ConfigError(f"lsh_bits (L) must be a positive multiple of 64, got {self.lsh_bits}")
        if not 0.0 < self.alpha < 1.0:
            raise ConfigError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.power <= 0:
            raise ConfigError(f"power must be > 0, got {self.power}")
        check_key_bits(self.key_bits, self.insecure_test_keys)
        if self.label_norm not in LABEL_NORMS:
            raise ConfigError(
                f"label_norm must be one of {', '.join(LABEL_NORMS)}, got {self.label_norm!r} "
                "(\"pooled\" needs a secure sum of class counts first and is not offered)"
            )
        if self.solver not in SOLVERS:
            raise ConfigError(f"solver must be one of {', '.join(SOLVERS)}, got {self.solver!r}")
        if not 8 <= self.frac_bits <= 48:
            raise ConfigError(f"frac_bits must be in [8, 48], got {self.frac_bits}")
        if self.pair_budget not in (None, AUTO) and not (isinstance(self.pair_budget, float)
                                                         and 0.0 < self.pair_budget <= 1.0):
            raise ConfigError(f"pair_budget must be in (0, 1] (1.0: all pairs) or \"auto\", got {self.pair_budget!r}")
        if not 0 <= self.all_pairs_rows <= 10**9:
            raise ConfigError(f"all_pairs_rows must be in [0, 10^9], got {self.all_pairs_rows}")
        for name, low, high in (("centres", 2, MAX_CENTRES), ("probes", 1, 16)):
            value = getattr(self, name)
            if value is not None and not low <= value <= high:
                raise ConfigError(f"{name} must be in [{low}, {high}], got {value}")
        if self.probes > (self.centres or MIN_AUTO_CENTRES):
            raise ConfigError(f"probes ({self.probes}) cannot pass centres ({self.centres})")
        if self.budget_slack < 1.0:
            raise ConfigError(f"budget_slack must be >= 1, got {self.budget_slack}")
        tolerance = self.influence_tolerance
        if tolerance is not None and not 0.0 <= tolerance <= MAX_INFLUENCE_TOLERANCE:
            raise ConfigError(f"influence_tolerance must be in [0, {MAX_INFLUENCE_TOLERANCE:g}] (0: exact), got "
                              f"{tolerance!r}")
        method(lambda: self.graph_params)
        self._check_label_dp()

    def _check_label_dp(self) -> None:
        eps, delta, mechanism = self.label_dp_epsilon, self.label_dp_delta, self.label_dp_mechanism
        if mechanism not in label_dp.MECHANISMS:
            raise ConfigError(f"label_dp_mechanism must be one of {', '.join(label_dp.MECHANISMS)}, got {mechanism!r}")
        if eps is None:
            if delta is not None:
                raise ConfigError("label_dp_delta is set but label_dp_epsilon is not: label-DP is off")
            return
        if not 0 < eps < float("inf"):
            raise ConfigError(f"label_dp_epsilon must be finite and > 0, got {eps}")
        if mechanism == "response":
            if delta is not None:
                raise ConfigError('label_dp_mechanism = "response" is ε-DP with δ = 0; label_dp_delta is for '
                                  '"skellam" only')
            return
        if delta is None:
            raise ConfigError('label_dp_mechanism = "skellam" needs label_dp_delta (take 1/n² for n labeled rows)')
        if not 0 < delta <= MAX_DP_DELTA:
            raise ConfigError(f"label_dp_delta must be in (0, {MAX_DP_DELTA}] (the chance the guarantee fails; take "
                              f"1/n² for n labeled rows), got {delta}")
        if self.label_norm != "none":
            raise ConfigError(f'label_dp_mechanism = "skellam" needs label_norm = "none": with label_norm = '
                              f"{self.label_norm!r} one label changes its class count and so the weight of every "
                              'row of that class (randomised response, "response", allows it)')

    @property
    def label_dp(self) -> bool:
        return self.label_dp_epsilon is not None

    @property
    def label_epsilon_total(self) -> float | None:
        return self.label_dp_epsilon

    @property
    def dp_releases(self) -> tuple[tuple[str, float, float], ...]:
        if self.label_dp_epsilon is None:
            return super().dp_releases
        if self.label_dp_mechanism == "response":  # drawn once per data set and ε, reused
            return (*super().dp_releases, ("responses", self.label_dp_epsilon, 0.0))
        return (*super().dp_releases, ("labels", self.label_dp_epsilon, self.label_dp_delta or 0.0))

    def for_rows(self, rows: int) -> XclpJobParams:
        """The parameters a run among parties of `rows` rows in all runs with: an unset pair_budget
        becomes 1.0 (all pairs) up to all_pairs_rows, "auto" above; unset centres, `auto_centres`; an
        unset influence_tolerance 0 (exact) up to EXACT_INFLUENCE_ROWS, AUTO_INFLUENCE_TOLERANCE above.
        Both sides resolve them from the roster's signed row counts, so they agree without a message."""
        budget = self.pair_budget if self.pair_budget is not None else AUTO if rows > self.all_pairs_rows else 1.0
        centres = self.centres if self.centres is not None else auto_centres(rows)
        tolerance = self.influence_tolerance if self.influence_tolerance is not None else \
            AUTO_INFLUENCE_TOLERANCE if rows > EXACT_INFLUENCE_ROWS else 0.0
        if (budget, centres, tolerance) == (self.pair_budget, self.centres, self.influence_tolerance):
            return self
        return replace(self, pair_budget=budget, centres=centres, influence_tolerance=tolerance)

    def resolved(self) -> dict[str, Any]:
        """pair_budget, centres and influence_tolerance as `for_rows` made them."""
        values = {key: getattr(self, key) for key in RESOLVED}
        assert None not in values.values(), "resolve the parameters for the run's rows first (for_rows)"
        return values

    def with_resolved(self, values: Mapping[str, Any]) -> XclpJobParams:
        """These parameters with a run state's `resolved` values: each one the job set must be the job's
        (a state of another job is refused), each one it left unset takes the saved value, checked."""
        if set(values) != set(RESOLVED):
            raise InvalidInput(f"a saved state resolves {sorted(values)}, not {sorted(RESOLVED)}")
        changed = [k for k in RESOLVED if getattr(self, k) is not None and getattr(self, k) != values[k]]
        if changed:
            raise InvalidInput(f"a saved state resolves {', '.join(changed)} otherwise than this job sets")
        try:
            return replace(self, **{k: values[k] for k in RESOLVED})
        except ConfigError as exc:
            raise InvalidInput(f"a saved state resolves a value no job could have: {exc}") from None

    @property
    def tolerance(self) -> float:
        """The resolved influence_tolerance (`for_rows`): 0 for exact dense columns."""
        if self.influence_tolerance is None:
            raise AssertionError("influence_tolerance is unset: resolve it for the run's rows first (for_rows)")
        return self.influence_tolerance

    @property
    def centre_count(self) -> int:
        """The resolved number of centres (`for_rows`)."""
        if self.centres is None:
            raise AssertionError("centres is unset: resolve it for the run's rows first (for_rows)")
        return self.centres

    def work_budget(self, sizes: Mapping[str, int], K: int) -> float:
        """The fraction of all pairs' ciphertexts to plan for (the parties' work estimates): the
        budget, or for "auto" AUTO_ESTIMATE times what one probe costs with rows spread evenly over
        the centres (real data crowd some centres: 1.0-1.5 times that on the data sets of docs/jobs/xclp.md)."""
        budget = self.budget
        if budget != AUTO:
            return float(budget)
        return min(1.0, AUTO_ESTIMATE * spread_fraction(sizes, K, self.centre_count, self.budget_slack))

    @property
    def budget(self) -> float | str:
        """The resolved pair_budget (`for_rows`): a fraction, or "auto"."""
        if self.pair_budget is None:
            raise AssertionError("pair_budget is unset: resolve it for the run's rows first (for_rows)")
        return self.pair_budget

    @property
    def candidates(self) -> bool:
        """SecureHamming on candidate pairs (docs/design.md §10.3) rather than all pairs (of resolved
        parameters, `for_rows`)."""
        return self.budget == AUTO or float(self.budget) < 1.0

    @property
    def slots_per_row(self) -> float:
        """A party's SecureHamming slots as A per row, at most: 1 on all pairs; on candidate pairs its
        rows in each of up to `probes` centre lists ("auto": one), each list at most budget_slack
        times its share."""
        if not self.candidates:
            return 1.0
        return max(1.0, (1 if self.budget == AUTO else self.probes) * self.budget_slack)

    @property
    def graph_params(self) -> GraphParams:
        return GraphParams(self.k, self.alpha, self.power)

    @property
    def influence_method(self) -> InfluenceMethod:
        return cast(InfluenceMethod, self.solver)  # one of SOLVERS, checked in __post_init__

    @property
    def normalise_labels(self) -> bool:
        return self.label_norm == "party"

    @property
    def label_classes(self) -> int:
        return self.n_classes

    @property
    def needs_labels(self) -> bool:
        # under a hidden label mask the coordinator does not know who has labels (docs/design.md §5.5)
        return not self.hide_label_mask

    @property
    def hides_labeled_rows(self) -> bool:
        return self.hide_label_mask

    @property
    def paillier(self) -> KeySpec:
        return KeySpec(self.key_bits, self.insecure_test_keys, "is an xclp job")

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> XclpJobParams:
        removed = sorted(set(raw) & {"kmeans_rounds", "min_centre_rows"})
        if removed:
            raise ConfigError(f"{', '.join(removed)}: candidate pairs no longer run federated k-means. Its exact "
                              "rounds released single rows (consecutive rounds' centre sums differ by the rows that "
                              "moved), so the centres are now drawn from the parties' common seed and never moved; "
                              "remove the key(s) (docs/jobs/xclp.md)")
        check_names(raw, frozenset({"n_classes", "lsh_bits", "k", "alpha", "power", "key_bits", "hide_label_mask",
                                    "label_norm", "solver", "frac_bits", "insecure_test_keys", "pair_budget",
                                    "all_pairs_rows", "centres", "probes", "budget_slack", "influence_tolerance",
                                    "label_dp_epsilon", "label_dp_mechanism", "label_dp_delta"}),
                    "xclp")
        return cls(
            n_classes=n_classes_param(raw), lsh_bits=int_param(raw, "lsh_bits", 1024, low=64),
            k=int_param(raw, "k", 10), alpha=float_param(raw, "alpha", 0.99), power=float_param(raw, "power", 3.0),
            key_bits=int_param(raw, "key_bits", MIN_SECURE_BITS), hide_label_mask=bool_param(raw, "hide_label_mask"),
            label_norm=str_param(raw, "label_norm", "none"), solver=str_param(raw, "solver", "auto"),
            frac_bits=int_param(raw, "frac_bits", 32), insecure_test_keys=bool_param(raw, "insecure_test_keys"),
            pair_budget=AUTO if raw.get("pair_budget") == AUTO else optional_float(raw, "pair_budget"),
            all_pairs_rows=int_param(raw, "all_pairs_rows", ALL_PAIRS_ROWS, low=0),
            centres=None if raw.get("centres") is None else int_param(raw, "centres", MIN_AUTO_CENTRES),
            probes=int_param(raw, "probes", 4), budget_slack=float_param(raw, "budget_slack", 1.0),
            influence_tolerance=optional_float(raw, "influence_tolerance"),
            label_dp_epsilon=optional_float(raw, "label_dp_epsilon"),
            label_dp_mechanism=str_param(raw, "label_dp_mechanism", "response"),
            label_dp_delta=optional_float(raw, "label_dp_delta"),
            **data_params(raw),
        )


def label_dp_line(params: XclpJobParams) -> str:
    """What a label-DP job spends, for the run's summary and `job show`."""
    how = ("each label randomised before use (δ = 0)" if params.label_dp_mechanism == "response" else
           f"δ = {params.label_dp_delta:g}, Skellam noise on the row sums calibrated to each party's influence block")
    return f"label-DP: ε = {params.label_dp_epsilon:g} per label of every party, {how}"


def check_key_bits(key_bits: int, insecure_test_keys: bool) -> None:
    """A Paillier key size a job may ask for (ConfigError otherwise)."""
    if key_bits % 8 or key_bits < 256:
        raise ConfigError(f"key_bits must be a multiple of 8 and >= 256, got {key_bits}")
    if key_bits < MIN_SECURE_BITS and not insecure_test_keys:
        raise ConfigError(
            f"key_bits = {key_bits} is below the secure {MIN_SECURE_BITS}; smaller Paillier keys "
            "are for tests only and need insecure_test_keys = true"
        )
