"""Candidate pairs against all pairs (docs/design.md §10.3), on the plaintext reference of the same schedule.

The secure run equals the plaintext reference on the same candidate schedule (the contract of
docs/design.md §10.3), so what candidates cost in accuracy and save in SecureHamming work is measured here
without Paillier: per data set, 3 parties with label skew (Dirichlet 0.5 over the classes), 10 %
of each party's rows labelled, the features standardised on the pooled moments (as the service's
preparation does), L = 1024, k = 10, 2048-bit keys' K = 186 slots per ciphertext. Each party lists
8 probes per row, and for each pair_budget the probes per row are the most that stay within it
(choose_probes). Three centre designs side by side (docs/design.md §10.3), on the same split:

- `seed`: the centres the service uses, C directions drawn from the common seed and never moved
  (xclp.candidates.initial_centres): they depend on no one's data, so nothing is released before
  the probe table.
- `kmeans`: exact federated spherical k-means, 8 rounds (the design before the seeded centres; a centre's sum
  pooled once 20 rows reached it). Consecutive rounds' exact sums differ by the rows that moved, so
  single rows can be read out of it: it is measured here as the baseline and no longer ships.
- `dp-kmeans`: the same rounds with every count and sum noised, as distributed Skellam noise would
  (here Gaussian of the same variance, benchmark-only), calibrated by xclp.privacy.accounting for all 2 · 8
  releases to (epsilon = --kmeans-epsilon, delta = 1e-6) with one row moving between two centres
  (L2 sensitivity √2 for the counts and for the unit rows' sums).

For each data set, centre count and pair_budget (JSON last line): probes, ciphertext_fraction (the
SecureHamming ciphertexts of the schedule, dummies included, over all pairs' — what the secure run's
Paillier time scales with), unpadded_fraction (the same schedule with each party's own counts as its
budgets: what padding to public budgets costs is the ratio), pair_fraction (cross pairs of rows
evaluated over all cross pairs), edge_recall (edges of the all-pairs kNN graph the candidate graph
keeps) and accuracy on the unlabeled rows beside all pairs'.

Data: sklearn's digits (1 797 rows, 64 pixels, 10 classes); UCI's Statlog Satellite (6 435 rows,
36 features, 6 classes) and --rows of UCI's Letter Recognition (20 000 rows, 16 features, 26
classes), both from R's mlbench (Debian's r-cran-mlbench, read with Rscript); --rows of Zalando's
Fashion-MNIST training set (784 pixels, 10 classes; Debian's dataset-fashion-mnist).

Usage: python benchmarks/xclp_candidates.py [--quick | --smoke] [--rows 6000] [--centres 16,32,64]
       [--budgets 0.1,0.2,0.35] [--data digits,satellite,letters,fashion-mnist]
       [--designs seed,kmeans,dp-kmeans] [--kmeans-epsilon 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from _data import dirichlet_split, load_digits_data, load_fashion_mnist, load_mlbench, subsample_labels

from xclp import candidates as cd
from xclp.errors import InvalidInput
from xclp.graph import GraphParams
from xclp.privacy.accounting import skellam_variance
from xclp.reference import xclp_reference
from xclp.seeding import public_rng
from xclp.v1.xclp_layout import secure_hamming_pairs

PARTIES = ("a", "b", "c")
GRAPH = GraphParams(k=10, alpha=0.99, power=3)
L, K, PROBES, ROUNDS, MIN_ROWS, SLACK = 1024, 186, 8, 8, 20, 1.0
SEED = bytes(range(32))


def say(message: str) -> None:
    print(f"xclp_candidates: {message}", file=sys.stderr, flush=True)


def kmeans_counts(Xn: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """int64[C]: a party's rows nearest to each centre (one k-means round's first sum)."""
    return np.bincount(cd.nearest_centres(Xn, centres, 1)[:, 0], minlength=centres.shape[0]).astype(np.int64)


def kmeans_sums(Xn: np.ndarray, centres: np.ndarray, qualified: np.ndarray) -> np.ndarray:
    """float64[C, d]: a party's unit rows summed per nearest centre, zero for the centres not qualified."""
    nearest = cd.nearest_centres(Xn, centres, 1)[:, 0]
    sums = np.zeros_like(centres)
    np.add.at(sums, nearest, Xn)
    sums[~np.asarray(qualified, dtype=bool)] = 0.0
    return sums


def next_centres(centres: np.ndarray, pooled_sums: np.ndarray, qualified: np.ndarray) -> np.ndarray:
    """Each qualified centre moved to the direction of its pooled sum (spherical k-means)."""
    moved = cd.unit_rows(pooled_sums)
    keep = np.asarray(qualified, dtype=bool) & np.any(moved != 0.0, axis=1)
    out = centres.copy()
    out[keep] = moved[keep]
    return out


def kmeans_reference(parts: list[np.ndarray], C: int) -> np.ndarray:
    """Exact federated spherical k-means as the service ran it before the seeded centres (the baseline)."""
    c = cd.initial_centres(SEED, C, parts[0].shape[1])
    for _ in range(ROUNDS):
        qualified = np.sum([kmeans_counts(X, c) for X in parts], axis=0) >= MIN_ROWS
        c = next_centres(c, np.sum([kmeans_sums(X, c, qualified) for X in parts], axis=0), qualified)
    return c


DELTA = 1e-6
SCALE = 1 << 10  # the fixed-point scale the noised sums would travel at (integer sensitivities for the bound)


def dp_kmeans(parts: list[np.ndarray], C: int, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Federated spherical k-means whose pooled counts and sums carry noise of the Skellam variance
    that makes all 2 · ROUNDS releases (epsilon, DELTA)-DP (Gaussian stand-in, benchmark-only)."""
    d = parts[0].shape[1]
    variance = skellam_variance(epsilon, DELTA, np.sqrt(2) * SCALE, 2 * np.sqrt(d) * SCALE, releases=2 * ROUNDS)
    assert variance is not None
    sigma = np.sqrt(variance) / SCALE
    c = cd.initial_centres(SEED, C, d)
    for _ in range(ROUNDS):
        counts = np.sum([kmeans_counts(X, c) for X in parts], axis=0) + rng.normal(0, sigma, C)
        qualified = counts >= MIN_ROWS
        sums = np.sum([kmeans_sums(X, c, np.ones(C, bool)) for X in parts], axis=0)
        sums += rng.normal(0, sigma, sums.shape)
        c = next_centres(c, np.where(qualified[:, None], sums, 0.0), qualified)
    return c


def centres_of(design: str, unit: list[np.ndarray], C: int, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    if design == "seed":
        return cd.initial_centres(SEED, C, unit[0].shape[1])
    if design == "kmeans":
        return kmeans_reference(unit, C)
    return dp_kmeans(unit, C, epsilon, rng)


def one_data_set(name: str, X: np.ndarray, y: np.ndarray, centre_counts: list[int], budgets: list[float | str],
                 designs: list[str], epsilon: float) -> dict:
    rng = public_rng(X.shape[0], f"benchmark/xclp-candidates/{name}")
    n_classes = int(y.max()) + 1
    split = dirichlet_split(y, len(PARTIES), 0.5, rng)
    partial = subsample_labels(y, split, 0.1, rng)
    spread = X.std(axis=0)
    Z = (X - X.mean(axis=0)) / np.where(spread > 0, spread, 1.0)
    parties = [(Z[rows], partial[rows]) for rows in split]
    sizes = {p: rows.size for p, rows in zip(PARTIES, split)}
    truth = np.concatenate([y[rows] for rows in split])
    unlabeled = np.concatenate([partial[rows] for rows in split]) < 0
    started = time.perf_counter()
    exact = xclp_reference(parties, SEED, n_classes, L, GRAPH)
    say(f"{name}: {sum(sizes.values())} rows {sizes}, all pairs in {time.perf_counter() - started:.0f} s")
    accuracy = float(np.mean(exact.labels[unlabeled] == truth[unlabeled]))
    pairs = [(t.a, t.b) for t in secure_hamming_pairs(PARTIES)]
    unit = {p: cd.unit_rows(Z[rows]) for p, rows in zip(PARTIES, split)}
    n = sum(sizes.values())
    cross = n * n - sum(v * v for v in sizes.values())
    runs = []
    for C, design in ((C, design) for C in centre_counts for design in designs):
        centres = centres_of(design, list(unit.values()), C, epsilon, public_rng(C, f"benchmark/dp-kmeans/{name}"))
        probes = {p: cd.nearest_centres(unit[p], centres, PROBES) for p in PARTIES}
        pooled = np.sum([cd.probe_table(probes[q], C) for q in PARTIES], axis=0)
        for budget in budgets:
            try:
                p, public, fraction = cd.choose_probes(pooled, sizes, pairs, K, SLACK, budget)
            except InvalidInput as exc:  # even one probe is over this budget
                say(f"{name}: {design}, C = {C}, pair_budget = {budget}: {exc}")
                continue
            own = {q: cd.probe_table(probes[q], C)[p - 1] for q in PARTIES}
            lists = {q: cd.centre_lists(probes[q], p, public[q]) for q in PARTIES}
            mask = cd.candidate_mask(lists, sizes)
            result = xclp_reference(parties, SEED, n_classes, L, GRAPH, candidates=mask)
            W, W_all = result.influence.W, exact.influence.W
            run = {"design": design, "centres": C, "pair_budget": budget, "probes": p,
                   "ciphertext_fraction": round(fraction, 4),
                   "unpadded_fraction": round(cd.evaluated_fraction(own, sizes, pairs, K), 4),
                   "pair_fraction": round(float(mask.sum() - (n * n - cross)) / cross, 4),
                   "edge_recall": round(float((W.multiply(W_all) != 0).sum() / W_all.nnz), 4),
                   "accuracy": round(float(np.mean(result.labels[unlabeled] == truth[unlabeled])), 4)}
            say(f"{name}: {json.dumps(run)}")
            runs.append(run)
    return {"data": name, "rows": sizes, "all_pairs_accuracy": round(accuracy, 4), "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="digits only, one centre count")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run through every part, for CI: proves the benchmark runs; "
                        "its figures mean nothing")
    parser.add_argument("--rows", type=int, default=6000, help="Fashion-MNIST rows (all three parties)")
    parser.add_argument("--centres", default="16,32,64")
    parser.add_argument("--budgets", default="0.1,0.2,0.35", help="pair_budgets, comma-separated; \"auto\": one "
                        "probe per row, as the service's \"auto\"")
    parser.add_argument("--data", default="digits,satellite,letters,fashion-mnist",
                        help="the data sets to run, of those (--quick: digits)")
    parser.add_argument("--designs", default="seed,kmeans,dp-kmeans", help="centre designs to compare")
    parser.add_argument("--kmeans-epsilon", type=float, default=1.0, help="dp-kmeans: epsilon over all its rounds")
    args = parser.parse_args()
    args.quick = args.quick or args.smoke
    if args.smoke:
        args.centres, args.budgets = "8", "0.35"
    wanted = ["digits"] if args.quick else args.data.split(",")
    centre_counts = [int(c) for c in args.centres.split(",")][: 1 if args.quick else None]
    budgets: list[float | str] = [cd.AUTO if b.strip() == cd.AUTO else float(b) for b in args.budgets.split(",")]
    data = []
    if "digits" in wanted:
        data.append(("digits", *load_digits_data()))
    if "satellite" in wanted:
        data.append(("satellite", *load_mlbench("Satellite", "classes")))
    if "letters" in wanted:
        letters, labels = load_mlbench("LetterRecognition", "lettr")
        pick = np.sort(public_rng(args.rows, "benchmark/letters").choice(labels.size, args.rows, replace=False))
        data.append(("letters", letters[pick], labels[pick]))
    if "fashion-mnist" in wanted:
        data.append(("fashion-mnist", *load_fashion_mnist(args.rows, public_rng(args.rows, "benchmark/fashion"))))
    if not data:
        parser.error(f"--data: none of {args.data!r} is digits, satellite, letters or fashion-mnist")
    designs = args.designs.split(",")
    if not designs or set(designs) - {"seed", "kmeans", "dp-kmeans"}:
        parser.error(f"--designs: {args.designs!r} must name seed, kmeans or dp-kmeans")
    results = [one_data_set(name, X, y, centre_counts, budgets, designs, args.kmeans_epsilon) for name, X, y in data]
    print(json.dumps({"benchmark": "xclp_candidates", "parties": len(PARTIES), "lsh_bits": L, "k": GRAPH.k,
                      "slots_per_ciphertext": K, "kmeans_rounds": ROUNDS,
                      "kmeans_epsilon": args.kmeans_epsilon, "kmeans_delta": DELTA, "min_centre_rows": MIN_ROWS,
                      "slack": SLACK, "data_sets": results}))


if __name__ == "__main__":
    main()
