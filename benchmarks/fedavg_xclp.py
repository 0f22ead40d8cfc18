"""FedAvg+XCLP against the paper's baselines (paper 003 §4.2, Table 4; DESIGN §7).

Digits (sklearn, bundled): a held-out test set of 20 %, the rest split over 5 parties with
Dirichlet(0.3) label skew, 5 % and 10 % of each party's rows labeled, 3 seeds. Features are
standardised with the training rows' pooled mean and std (what `standardise = true` gives).
Every variant trains the same network from the same θ₀ with the same rounds, sampling and SGD
settings (`job_params`); they differ only in `pseudo_label`:
- fedavg_labeled_only ("none"), fedavg_local_lp ("local_lp"), fedavg_network ("network"),
  fedavg_xclp ("xclp", with the plaintext XCLP reference that the secure protocol equals).
Reports the test accuracy after the last round, mean and std over seeds, and seconds per round.

`--secure` instead runs 3 parties × ~300 rows through the real CLIs over gRPC+TLS with 2048-bit
Paillier keys for a few rounds of pseudo_label = "xclp", and reports seconds per round split into
XCLP and training (from the parties' progress lines).

Usage: python benchmarks/fedavg_xclp.py [--quick] [--secure] [--rounds N]
Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from _data import dirichlet_split, load_digits_data, subsample_labels

from xclp.fedavg import accuracy
from xclp.seeding import public_rng
from xclp.simulation import run_fedavg
from xclp.v1.fedavg import FedavgJobParams

VARIANTS = {"fedavg_labeled_only": "none", "fedavg_local_lp": "local_lp", "fedavg_network": "network",
            "fedavg_xclp": "xclp"}
N_CLASSES = 10


def job_params(pseudo_label: str, rounds: int) -> FedavgJobParams:
    """One set of training settings for every variant (chosen once, not per variant)."""
    return FedavgJobParams(n_classes=N_CLASSES, hidden=(64,), rounds=rounds, fraction=1.0, local_epochs=5,
                           batch_size=32, learning_rate=0.05, momentum=0.9, pseudo_label=pseudo_label,
                           warmup_rounds=rounds // 4, lsh_bits=1024, k=10)


def split(seed: int, label_fraction: float) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    X, y = load_digits_data()
    rng = public_rng(seed, "benchmark/fedavg-xclp/split")
    order = rng.permutation(len(y))
    test, train = order[: len(y) // 5], order[len(y) // 5:]
    mean, std = X[train].mean(axis=0), X[train].std(axis=0)
    std[std == 0] = 1.0
    Xs = (X - mean) / std
    clients = dirichlet_split(y[train], 5, 0.3, rng)
    partial = subsample_labels(y[train], clients, label_fraction, rng)
    parties = {f"party-{j}": (Xs[train][rows], partial[rows]) for j, rows in enumerate(clients)}
    return parties, Xs[test], y[test]


def simulate(args: argparse.Namespace) -> dict[str, float]:
    seeds = [0] if args.quick else [0, 1, 2]
    fractions = [0.1] if args.quick else [0.05, 0.1]
    rounds = args.rounds or (12 if args.quick else 40)
    results: dict[tuple[str, float], list[float]] = {}
    seconds: list[float] = []
    for fraction in fractions:
        for seed in seeds:
            parties, X_test, y_test = split(seed, fraction)
            for key, pseudo in VARIANTS.items():
                started = time.perf_counter()
                run = run_fedavg(parties, job_params(pseudo, rounds), seed=seed.to_bytes(32, "big"))
                elapsed = time.perf_counter() - started
                acc = accuracy(run.model, X_test, y_test)
                results.setdefault((key, fraction), []).append(acc)
                if key == "fedavg_xclp":
                    seconds.append(elapsed / rounds)
                print(f"labeled {fraction:.0%} seed {seed} {key}: test accuracy {acc:.4f} ({elapsed:.1f} s)",
                      file=sys.stderr, flush=True)
    out: dict[str, float] = {"rounds": rounds, "seeds": len(seeds)}
    print(f"\n| variant | {' | '.join(f'{f:.0%} labeled' for f in fractions)} |", file=sys.stderr)
    print("|---|" + "---|" * len(fractions), file=sys.stderr)
    for key in VARIANTS:
        cells = []
        for fraction in fractions:
            acc = np.array(results[(key, fraction)])
            suffix = "" if fraction == 0.1 else f"_{round(fraction * 100)}pct"
            out[key + suffix], out[key + suffix + "_std"] = round(float(acc.mean()), 4), round(float(acc.std()), 4)
            cells.append(f"{acc.mean():.4f} ± {acc.std():.4f}")
        print(f"| {key} | {' | '.join(cells)} |", file=sys.stderr)
    out["seconds_per_round"] = round(float(np.mean(seconds)), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one seed, 10 %% labeled, fewer rounds")
    parser.add_argument("--secure", action="store_true", help="3 parties over gRPC+TLS with 2048-bit keys")
    parser.add_argument("--rounds", type=int, default=0, help="training rounds (default 40, quick 12)")
    args = parser.parse_args()
    if args.secure:
        from _fedavg_secure import secure_run
        out = secure_run(args)
    else:
        out = simulate(args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
