"""FedAvg+XCLP against the paper's baselines (Scott et al. 2023 §4.2, Table 4; docs/design.md §7).

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

The paper's regime (Scott et al. 2023 §4.2, Table 4: many clients, only some holding labels, ~2 % of the
rows labelled), `paper_regime` in the JSON (with --quick too): m ∈ {20, 50} clients, m_L = m/2 and
m_L = m of them labelled, 2 % of the training rows labelled in all (spread over the labelled
clients in proportion to their rows, at least one each), i.i.d. (equal random shares) and non-i.i.d.
(Dirichlet(0.5) label skew, every client at least k + 1 rows) splits, digits and UCI Satellite
(6 435 rows, R's mlbench), 3 seeds. The settings (`regime_params`) were chosen once, before any
run, for the scale of these tables: the network and SGD of the 5-party runs above, k = 5 (a
client holds as few as 6 rows), 30 rounds with 10 of warm-up. fedavg_xclp runs in both neighbour
spaces (pseudo_label_space "embedding", the paper's, and "input"); its figure is the better of
the two, named. --quick: digits, m = 20, m_L = 10, non-i.i.d., one seed.

Usage: python benchmarks/fedavg_xclp.py [--quick | --smoke] [--secure] [--rounds N] [--no-regime]
Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from _data import UNLABELED, dirichlet_split, load_digits_data, load_mlbench, subsample_labels

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


REGIME_VARIANTS = (("fedavg_labeled_only", "none", "embedding"), ("fedavg_local_lp", "local_lp", "embedding"),
                   ("fedavg_network", "network", "embedding"), ("fedavg_xclp_embedding", "xclp", "embedding"),
                   ("fedavg_xclp_input", "xclp", "input"))
REGIME_LABELS = 0.02
REGIME_K = 5


def regime_params(pseudo_label: str, space: str, rounds: int) -> FedavgJobParams:
    """One set of settings for every variant, client count and split (module docstring)."""
    return FedavgJobParams(n_classes=N_CLASSES, hidden=(64,), rounds=rounds, fraction=1.0, local_epochs=5,
                           batch_size=32, learning_rate=0.05, momentum=0.9, pseudo_label=pseudo_label,
                           warmup_rounds=rounds // 3, lsh_bits=1024, k=REGIME_K, pseudo_label_space=space)


def regime_split(X: np.ndarray, y: np.ndarray, m: int, m_l: int, iid: bool, seed: int):
    """m clients, m_l of them holding REGIME_LABELS of the training rows' labels; the test set."""
    rng = public_rng(seed, f"benchmark/fedavg-xclp/regime/{m}/{m_l}/{iid}")
    order = rng.permutation(len(y))
    test, train = order[: len(y) // 5], order[len(y) // 5:]
    mean, std = X[train].mean(axis=0), X[train].std(axis=0)
    std[std == 0] = 1.0
    Xs, yt = (X - mean) / std, y[train]
    if iid:
        clients = [np.sort(c) for c in np.array_split(rng.permutation(train.size), m)]
    else:
        clients = dirichlet_split(yt, m, 0.5, rng, min_rows=REGIME_K + 1)
    labelled = rng.choice(m, m_l, replace=False)
    total = max(m_l, round(REGIME_LABELS * train.size))
    sizes = np.array([clients[j].size for j in labelled], dtype=np.float64)
    share = np.maximum(1, np.floor(total * sizes / sizes.sum())).astype(int)
    partial = np.full_like(yt, UNLABELED)
    for j, count in zip(labelled, share):
        keep = rng.choice(clients[j], size=min(int(count), clients[j].size), replace=False)
        partial[keep] = yt[keep]
    parties = {f"client-{j:02d}": (Xs[train][rows], partial[rows]) for j, rows in enumerate(clients)}
    coverage = {"labels": int((partial != UNLABELED).sum()),
                "classes_labelled": int(np.unique(partial[partial != UNLABELED]).size)}
    return parties, Xs[test], y[test], coverage


def paper_regime(args: argparse.Namespace) -> dict[str, object]:
    data = {"digits": load_digits_data}
    if not args.quick:
        data["satellite"] = lambda: load_mlbench("Satellite", "classes")
    configs = ([(20, 10, False)] if args.quick
               else [(m, m_l, iid) for m in (20, 50) for m_l in (m // 2, m) for iid in (True, False)])
    seeds = [0] if args.quick else [0, 1, 2]
    rounds = args.rounds or (12 if args.quick else 30)
    table: list[dict[str, object]] = []
    for name, load in data.items():
        X, y = load()
        for m, m_l, iid in configs:
            accs: dict[str, list[float]] = {v: [] for v, _, _ in REGIME_VARIANTS}
            covered = []
            for seed in seeds:
                parties, X_test, y_test, coverage = regime_split(X, y, m, m_l, iid, seed)
                covered.append(coverage)
                for key, pseudo, space in REGIME_VARIANTS:
                    started = time.perf_counter()
                    run = run_fedavg(parties, regime_params(pseudo, space, rounds), seed=seed.to_bytes(32, "big"))
                    accs[key].append(accuracy(run.model, X_test, y_test))
                    print(f"{name} m={m} m_L={m_l} {'iid' if iid else 'non-iid'} seed {seed} {key}: "
                          f"{accs[key][-1]:.4f} ({time.perf_counter() - started:.1f} s; {coverage['labels']} labels, "
                          f"{coverage['classes_labelled']} classes)", file=sys.stderr, flush=True)
            means = {k: (round(float(np.mean(v)), 4), round(float(np.std(v)), 4)) for k, v in accs.items()}
            space = "input" if means["fedavg_xclp_input"][0] > means["fedavg_xclp_embedding"][0] else "embedding"
            row = {"data": name, "m": m, "m_L": m_l, "split": "iid" if iid else "non-iid", "rounds": rounds,
                   "seeds": len(seeds), "labels": int(np.mean([c["labels"] for c in covered])),
                   **{k: list(v) for k, v in means.items()},
                   "fedavg_xclp": list(means[f"fedavg_xclp_{space}"]), "fedavg_xclp_space": space}
            table.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print("\n| data | m | m_L | split | labels | labeled only | local LP | network | XCLP (space) |", file=sys.stderr)
    print("|---|---|---|---|---|---|---|---|---|", file=sys.stderr)
    for r in table:
        cells = [f"{r[k][0]:.3f} ± {r[k][1]:.3f}" for k in ("fedavg_labeled_only", "fedavg_local_lp", "fedavg_network",
                                                             "fedavg_xclp")]
        print(f"| {r['data']} | {r['m']} | {r['m_L']} | {r['split']} | {r['labels']} | {' | '.join(cells)} "
              f"({r['fedavg_xclp_space']}) |", file=sys.stderr)
    headline = next(r for r in table if (r["data"], r["m"], r["m_L"], r["split"]) == ("digits", 20, 10, "non-iid"))
    return {"paper_regime": {k: headline[k][0] for k in ("fedavg_labeled_only", "fedavg_local_lp", "fedavg_network",
                                                           "fedavg_xclp")}
            | {"fedavg_xclp_space": headline["fedavg_xclp_space"]},
            "paper_regime_table": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one seed, 10 %% labeled, fewer rounds")
    parser.add_argument("--secure", action="store_true", help="3 parties over gRPC+TLS with 2048-bit keys")
    parser.add_argument("--rounds", type=int, default=0, help="training rounds (default 40, quick 12)")
    parser.add_argument("--no-regime", action="store_true", help="leave out the paper's regime")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run through every part (the simulation, the paper's regime and the "
                             "secure run), for CI: proves the benchmark runs; its figures mean nothing")
    args = parser.parse_args()
    if args.smoke:
        from _fedavg_secure import secure_run
        args.quick, args.rounds = True, 2
        print(json.dumps({**simulate(args), **paper_regime(args), "secure": secure_run(args), "smoke": True}))
        return
    if args.secure:
        from _fedavg_secure import secure_run
        out = secure_run(args)
    else:
        out = simulate(args)
        if not args.no_regime:
            out |= paper_regime(args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
