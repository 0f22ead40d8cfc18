"""What record-level DP costs the training jobs: DP-DBCL and DP-FedAvg against the
same runs without DP.

Data: sklearn's digits (pixels / 16) and breast cancer (standardised with the training rows' mean
and deviation, outside the DP guarantee: a real job would release DP moments), 70 % train split
over 3 parties (round robin), 30 % test. Each run is the in-process simulation of the job
(xclp.simulation: the parties' own clipping, rounding and Skellam shares, the coordinator's
decoding), which the service equals (tests/service/test_dp_training.py measures the noise of the
service's opened sums against the plan).

One setting per job type and data set, the same with and without DP; no tuning per ε:
- DBCL: RMSProp η = 0.01 at the coordinator, every party's batch its whole training share, one
  local step, 300 rounds (digits) / 200 (breast cancer);
- FedAvg: SGD η = 0.5, batch 256 rows, one local step per round (DP: DP-SGD with the noise shared
  among the round's parties; without DP: one epoch), 300 / 200 rounds.
DP: clip_norm 1, δ = 1/n² (n = training rows), ε ∈ {1, 4, 8} over all rounds, each round charged
in full (no amplification by sampling). Accuracy is the final model's on the test rows, mean over
`--seeds` seeds (the noise is fresh each run).

Label-DP for XCLP (xclp.privacy.label_dp): the demo data (3 hospitals × 500 digit rows, 50 labeled each;
the demo job's L = 1024, k = 5, α = 0.99, p = 3), accuracy on every party's unlabeled rows against
the truth files, plain XCLP against randomised response and Skellam noise on the row sums at
ε ∈ {1, 4} (Skellam: δ = 10⁻⁶), mean over `--seeds` runs. The in-process simulation with 512-bit
test keys (the scores do not depend on the key size; tests check them against the plaintext
reference).

DP moments (xclp.privacy.dp_moments): breast cancer's 30 features span 0.001 to 4254, so its jobs
standardise. DP-DBCL at ε = 4 (as above) with the pooled moments of the training rows released
exactly, against DP moments at moments_epsilon ∈ {1, 4} (δ = 1/n²; the job's total ε is then 5 or
8), the public bounds being each feature's min and max as the data set's documentation (sklearn's
DESCR) lists them. The moments phase is the in-process simulation (xclp.simulation.pooled_scaling:
each party's clipped sums and Skellam share, decoded as both ends decode).

Usage: python benchmarks/dp_training.py [--quick | --smoke] [--seeds N] [--only training|xclp|moments]
--quick: digits only, one seed (no moments part). --only: one of the three parts. Progress on
stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
from _data import load_breast_cancer_data, load_digits_data

from xclp.fedavg import accuracy
from xclp.graph import GraphParams
from xclp.simulation import pooled_scaling, run_dbcl, run_fedavg
from xclp.simulation.xclp import run_xclp_inprocess
from xclp.v1.registry import parse_params

EPSILONS = (1.0, 4.0, 8.0)
SETTINGS = {
    "digits": {"hidden": [32], "rounds": 300},
    "breast_cancer": {"hidden": [16], "rounds": 200},
}


def split(name: str, seed: int, moments_epsilon: float | None = None,
          ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray, int]:
    """3 parties' training rows, the test rows, the training row count. Breast cancer is
    standardised with the training rows' pooled moments: exact, or DP moments at `moments_epsilon`."""
    X, y = load_digits_data() if name == "digits" else load_breast_cancer_data()
    if name == "digits":
        X = X / 16.0
    order = np.random.default_rng(seed).permutation(len(y))
    X, y = X[order], y[order]
    n_train = int(0.7 * len(y))
    if name != "digits":
        if moments_epsilon is None:
            mean, std = X[:n_train].mean(axis=0), X[:n_train].std(axis=0)
            X = (X - mean) / np.where(std > 0, std, 1.0)
        else:
            params = parse_params("race", {"rows": 1, "width": 2, "standardise": True,
                                           "moments_epsilon": moments_epsilon, "moments_delta": 1.0 / n_train**2,
                                           "moments_bounds": documented_ranges()})
            X = pooled_scaling([X[:n_train][i::3] for i in range(3)], params).apply(X)
    parties = {p: (X[:n_train][i::3], y[:n_train][i::3]) for i, p in enumerate("abc")}
    return parties, X[n_train:], y[n_train:], n_train


def documented_ranges() -> list[list[float]]:
    """Each breast cancer feature's [min, max] from the data set's documentation (sklearn's DESCR)."""
    from sklearn.datasets import load_breast_cancer

    ranges = [[float(lo), float(hi)] for lo, hi in
              re.findall(r"^[a-z ]+\([a-z ]+\):\s+([\d.]+)\s+([\d.]+)$", load_breast_cancer().DESCR, re.M)]
    if len(ranges) != 30:
        raise RuntimeError(f"expected 30 documented feature ranges in sklearn's DESCR, found {len(ranges)}")
    return ranges


def run(kind: str, name: str, epsilon: float | None, seed: int,
        moments_epsilon: float | None = None) -> tuple[float, float | None, float]:
    """(test accuracy, ε the accountant gives for the run, seconds)."""
    parties, X_test, y_test, n_train = split(name, seed, moments_epsilon)
    setting = SETTINGS[name]
    n_classes = int(max(int(y.max()) for _, y in parties.values())) + 1
    dp = {} if epsilon is None else {"dp_epsilon": epsilon, "dp_delta": 1.0 / n_train**2, "clip_norm": 1.0}
    common = {"n_classes": n_classes, "hidden": setting["hidden"], "rounds": setting["rounds"], "seed": seed, **dp}
    started = time.perf_counter()
    if kind == "dbcl":
        batch = max(len(y) for _, y in parties.values())
        params = parse_params("dbcl", {**common, "batch_size": batch, "optimiser": "rmsprop", "learning_rate": 0.01})
        model = run_dbcl(parties, params, seed=seed.to_bytes(32, "big")).model
        size = params.update_size(X_test.shape[1])
    else:
        params = parse_params("fedavg", {**common, "batch_size": 256, "learning_rate": 0.5,
                                         **({} if dp else {"local_epochs": 1})})
        model = run_fedavg(parties, params, seed=seed.to_bytes(32, "big")).model
        size = model.arch.n_params
    seconds = time.perf_counter() - started
    plan = params.dp_plan(size)
    spent = None if plan is None else plan.spent(plan.releases)
    return accuracy(model, X_test, y_test), spent, seconds


DEMO = Path(__file__).resolve().parents[1] / "xclp" / "demo_data"
LABEL_DP = {"nonprivate": {}, **{f"label_dp_eps{e:g}": {"label_dp_epsilon": e} for e in (1.0, 4.0)},
            **{f"skellam_eps{e:g}": {"label_dp_epsilon": e, "label_dp_mechanism": "skellam", "label_dp_delta": 1e-6}
               for e in (1.0, 4.0)}}


def demo_parties() -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, np.ndarray]]:
    parties, truth = {}, {}
    for p in ("a", "b", "c"):
        with open(DEMO / f"hospital-{p}.csv") as f:
            rows = list(csv.DictReader(f))
        features = [k for k in rows[0] if k.startswith("px")]
        X = np.array([[float(r[k]) for k in features] for r in rows])
        y = np.array([int(r["label"]) if r["label"] else -1 for r in rows])
        with open(DEMO / f"hospital-{p}.truth.csv") as f:
            truth[p] = np.array([int(r["true_label"]) for r in csv.DictReader(f)])
        parties[p] = (X, y)
    return parties, truth


def run_xclp(label_dp: dict, seed: int) -> tuple[float, float]:
    """(accuracy on the unlabeled rows of all parties, seconds)."""
    parties, truth = demo_parties()
    started = time.perf_counter()
    result = run_xclp_inprocess(parties, 10, seed=seed.to_bytes(32, "big"), L=1024, key_bits=512,
                                insecure_test_keys=True, params=GraphParams(5, 0.99, 3.0), **label_dp)
    seconds = time.perf_counter() - started
    right = total = 0
    for p, out in result.outputs.items():
        unlabeled = parties[p][1] < 0
        right += int((out.labels[unlabeled] == truth[p][unlabeled]).sum())
        total += int(unlabeled.sum())
    return right / total, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="digits only, one seed")
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest run through every part, for CI: proves the benchmark runs; "
                    "its figures mean nothing")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--only", choices=("training", "xclp", "moments"), help="run one part only")
    args = ap.parse_args()
    if args.smoke:  # every part, each once: 3 rounds, one ε, two label-DP settings
        for setting in SETTINGS.values():
            setting["rounds"] = 3
    epsilons = EPSILONS[:1] if args.smoke else EPSILONS
    names = [] if args.only in ("xclp", "moments") else ["digits"] if args.quick or args.smoke else list(SETTINGS)
    seeds = range(1 if args.quick or args.smoke else args.seeds)
    out: dict[str, object] = {"quick": args.quick, "seeds": len(seeds), "epsilons": list(EPSILONS), "results": {}}
    results: dict[str, dict[str, dict[str, float | None]]] = {}
    for name in names:
        for kind in ("dbcl", "fedavg"):
            for epsilon in (None, *epsilons):
                label = "nonprivate" if epsilon is None else f"eps{epsilon:g}"
                runs = [run(kind, name, epsilon, s) for s in seeds]
                acc = float(np.mean([r[0] for r in runs]))
                entry = {"accuracy": round(acc, 4), "accuracy_std": round(float(np.std([r[0] for r in runs])), 4),
                         "epsilon_spent": None if runs[0][1] is None else round(runs[0][1], 4),
                         "seconds": round(float(np.mean([r[2] for r in runs])), 2)}
                results.setdefault(name, {})[f"{kind}_{label}"] = entry
                print(f"{name} {kind} {label}: accuracy {acc:.3f} (ε spent {entry['epsilon_spent']}), "
                      f"{entry['seconds']}s", file=sys.stderr, flush=True)
    moments = (None, 1.0) if args.smoke else (None, 1.0, 4.0)
    for moments_epsilon in moments if args.only in (None, "moments") and not args.quick else ():
        label = "exact" if moments_epsilon is None else f"dp_moments_eps{moments_epsilon:g}"
        runs = [run("dbcl", "breast_cancer", 4.0, s, moments_epsilon) for s in seeds]
        entry = {"accuracy": round(float(np.mean([r[0] for r in runs])), 4),
                 "accuracy_std": round(float(np.std([r[0] for r in runs])), 4),
                 "epsilon_total": 4.0 + (moments_epsilon or 0.0) if moments_epsilon else None}
        results.setdefault("moments", {})[f"moments_dbcl_eps4_{label}"] = entry
        print(f"breast cancer dbcl ε = 4, moments {label}: accuracy {entry['accuracy']:.3f}", file=sys.stderr,
              flush=True)
    for key, entry in results.get("moments", {}).items():
        out[key] = entry["accuracy"]
    label_dp = {k: v for k, v in LABEL_DP.items() if not args.smoke or k in ("nonprivate", "skellam_eps1")}
    for label, options in label_dp.items() if args.only not in ("training", "moments") else ():
        runs = [run_xclp(options, s) for s in seeds]
        entry = {"accuracy": round(float(np.mean([r[0] for r in runs])), 4),
                 "accuracy_std": round(float(np.std([r[0] for r in runs])), 4),
                 "seconds": round(float(np.mean([r[1] for r in runs])), 2)}
        results.setdefault("xclp_demo", {})[f"xclp_{label}"] = entry
        print(f"xclp demo {label}: accuracy {entry['accuracy']:.3f}, {entry['seconds']}s", file=sys.stderr, flush=True)
    out["results"] = results
    for key, entry in results.get("xclp_demo", {}).items():
        out[key] = entry["accuracy"]
    digits = results.get("digits")
    if digits and not args.smoke:
        for key in ("dbcl_nonprivate", "dbcl_eps8", "fedavg_nonprivate", "fedavg_eps8"):
            out[key] = digits[key]["accuracy"]
        out["epsilon_spent_dbcl"] = digits["dbcl_eps8"]["epsilon_spent"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
