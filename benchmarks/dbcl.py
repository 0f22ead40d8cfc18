"""DBCL against unsketched federated SGD, and the property inference probe (Zhang & Wang 2021; docs/design.md §7).

Accuracy (`xclp.simulation.run_dbcl`, the oracle the secure job equals): digits and breast cancer
(sklearn, bundled), a held-out test set of 20 %, the rest split IID over 5 parties, features
standardised with the training rows' pooled moments. Every variant trains the same network from
the same W₀ with the same batches and coordinator (RMSProp, the paper's Figure 2); they differ
only in the sketch: none (`plain`), CountSketch s = d/2 on every layer (`dbcl`, the job's
default), the same at s = d/4 (`dbcl_quarter`), and s = d/2 on every layer but the output layer
(`dbcl_paper`, the paper's setting, which a party refuses unless --allow-unsketched-layers). Test accuracy
(the coordinator's W, unsketched, as the paper evaluates) is taken every `EVAL_EVERY` rounds;
"converged" is the mean of the last 5 evaluations, "same rounds" the accuracy after a quarter of
the rounds, and "rounds to 95 %" the first evaluation reaching 95 % of the converged accuracy.

Communication: floats a party receives (and returns) per round for the sketched layers' weights,
sketched over unsketched (`bytes_ratio`), and for the whole message (`round_bytes_ratio`).

Probe (Melis et al. 2019, Zhang & Wang 2021 §3): two parties on digits, federated SGD (no momentum, so the
step can be inverted). Each round the victim's batch has the property ("holds 8 rows of class
3") or not (32 rows without class 3), at random. The adversary sees what a party sees: the
released parameters of rounds t and t+1 (and their seeds), its own gradient and the batch sizes.
It estimates the victim's gradient — exactly without sketching (W_t − W_{t+1} = η(g_a + g_v)/Σb);
with DBCL by the paper's unbiased estimate S_t W̃_t − S_{t+1} W̃_{t+1} of W_t − W_{t+1} — and a
logistic regression trained on half the rounds (with the truth, a stronger adversary than
Melis's) predicts the property on the other half. AUC is reported on every parameter the
adversary can estimate (`probe_auc_*`) and on the sketched layers' weights only
(`probe_auc_*_sketched_weights`), mean over seeds.

Secure: 3 parties (digits) through the real CLIs over gRPC+TLS, a few DBCL rounds; seconds per
round from the coordinator's log.

Usage: python benchmarks/dbcl.py [--quick | --smoke] [--no-secure]
Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _data import load_breast_cancer_data, load_digits_data, write_party_csv

from xclp.dbcl import RoundView, ServerOptimiser, draw_sketches, pack, unpack, unsketch_gradient, view_shapes, view_size
from xclp.fedavg import accuracy, initial_network
from xclp.nn import Network
from xclp.seeding import public_rng
from xclp.simulation import run_dbcl
from xclp.simulation.dbcl import simulated_round_seed
from xclp.v1.dbcl import DbclJobParams

EVAL_EVERY = 10
PARTIES = 5
SETTINGS = {  # chosen once for both data sets' scale, the same for every variant
    "digits": {"load": load_digits_data, "hidden": [64, 64], "batch_size": 32, "rounds": 5000, "quick": 400},
    "breast_cancer": {"load": load_breast_cancer_data, "hidden": [32, 16], "batch_size": 16, "rounds": 2000,
                      "quick": 200},
}
# "dbcl" is the default job (every layer sketched, s = d/2); "dbcl_paper" the paper's setting (the
# output layer unsketched: layers 0 and 1 of both networks' two hidden layers + output)
VARIANTS = {"plain": {"sketch": "none"}, "dbcl": {"sketch_ratio": 0.5}, "dbcl_quarter": {"sketch_ratio": 0.25},
            "dbcl_paper": {"sketch_ratio": 0.5, "sketched_layers": [0, 1]}}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def job_params(n_classes: int, setting: dict, rounds: int, **variant) -> DbclJobParams:
    return DbclJobParams.parse({"n_classes": n_classes, "hidden": setting["hidden"], "rounds": rounds,
                                "batch_size": setting["batch_size"], "optimiser": "rmsprop",
                                "learning_rate": 0.001, **variant})


def split(X: np.ndarray, y: np.ndarray, seed: int) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray,
                                                             np.ndarray]:
    rng = public_rng(seed, "benchmark/dbcl/split")
    order = rng.permutation(len(y))
    test, train = order[: len(y) // 5], order[len(y) // 5:]
    mean, std = X[train].mean(axis=0), X[train].std(axis=0)
    keep = std > 0
    Z = (X[:, keep] - mean[keep]) / std[keep]
    parts = np.array_split(train, PARTIES)
    return {f"p{j}": (Z[rows], y[rows]) for j, rows in enumerate(parts)}, Z[test], y[test]


def curve(parties, params: DbclJobParams, X_test, y_test, seed: int) -> tuple[list[int], list[float]]:
    rounds, accs = [], []

    def on_round(record, net: Network) -> None:
        if (record.round + 1) % EVAL_EVERY == 0:
            rounds.append(record.round + 1)
            accs.append(accuracy(net, X_test, y_test))

    run_dbcl(parties, params, seed=seed.to_bytes(8, "big"), on_round=on_round)
    return rounds, accs


def accuracy_table(args: argparse.Namespace) -> dict[str, dict]:
    seeds = [0] if args.quick else [0, 1, 2]
    out: dict[str, dict] = {}
    for name, setting in SETTINGS.items():
        X, y = setting["load"]()
        n_classes = int(y.max()) + 1
        rounds = 2 * EVAL_EVERY if args.smoke else setting["quick"] if args.quick else setting["rounds"]
        same = rounds // 4 // EVAL_EVERY * EVAL_EVERY
        per_variant: dict[str, dict[str, list[float]]] = {v: {"converged": [], "same": [], "to95": []}
                                                          for v in VARIANTS}
        for seed in seeds:
            parties, X_test, y_test = split(X, y, seed)
            for variant, extra in VARIANTS.items():
                started = time.perf_counter()
                at, accs = curve(parties, job_params(n_classes, setting, rounds, seed=seed, **extra), X_test, y_test,
                                 seed)
                final = float(np.mean(accs[-5:]))
                per_variant[variant]["converged"].append(final)
                per_variant[variant]["same"].append(accs[at.index(same)] if same in at else accs[0])
                per_variant[variant]["to95"].append(next(r for r, a in zip(at, accs) if a >= 0.95 * final))
                say(f"{name} seed {seed} {variant}: converged {final:.4f}, after {same} rounds "
                    f"{per_variant[variant]['same'][-1]:.4f}, 95 % at round {per_variant[variant]['to95'][-1]} "
                    f"({time.perf_counter() - started:.1f}s)")
        dim = next(iter(parties.values()))[0].shape[1]
        p = job_params(n_classes, setting, rounds)
        arch = p.architecture(dim)
        sizes = p.sizes(dim)
        sketched_full = sum(arch.sizes[i] * arch.sizes[i + 1] for i in sizes)
        sketched_small = sum(s * arch.sizes[i + 1] for i, s in sizes.items())
        out[name] = {
            "rows": int(len(y)), "features": dim, "layers": list(arch.sizes), "rounds": rounds,
            "same_rounds": same, "bytes_ratio": round(sketched_small / sketched_full, 4),
            "round_bytes_ratio": round(view_size(arch, sizes) / arch.n_params, 4),
            **{f"{v}_accuracy": _mean_std(r["converged"]) for v, r in per_variant.items()},
            **{f"{v}_accuracy_same_rounds": _mean_std(r["same"]) for v, r in per_variant.items()},
            **{f"{v}_rounds_to_95": int(np.mean(r["to95"])) for v, r in per_variant.items()},
        }
    return out


def _mean_std(values: list[float]) -> list[float]:
    return [round(float(np.mean(values)), 4), round(float(np.std(values)), 4)]


# --- the property inference probe ----------------------------------------------------------------


PROPERTY_CLASS = 3
PROBE_LR = 0.05


def probe_features(sketch: str, rounds: int, seed: int, layers: list[int] | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimated victim gradient per round over every parameter, the same on sketched weights only,
    the property per round) as the adversary derives them."""
    X, y = load_digits_data()
    parties, _, _ = split(X, y, seed)
    Xa = np.vstack([parties[f"p{j}"][0] for j in (0, 1)])
    ya = np.concatenate([parties[f"p{j}"][1] for j in (0, 1)])
    Xv = np.vstack([parties[f"p{j}"][0] for j in (2, 3, 4)])
    yv = np.concatenate([parties[f"p{j}"][1] for j in (2, 3, 4)])
    with_c, without_c = np.flatnonzero(yv == PROPERTY_CLASS), np.flatnonzero(yv != PROPERTY_CLASS)
    params = DbclJobParams.parse({"n_classes": 10, "hidden": [64, 64], "rounds": rounds, "batch_size": 32,
                                  "learning_rate": PROBE_LR, "sketch": sketch, "seed": seed,
                                  **({} if layers is None else {"sketched_layers": layers})})
    dim = Xa.shape[1]
    arch, sizes = params.architecture(dim), params.sizes(dim)
    net = initial_network(arch, seed)
    optimiser = ServerOptimiser("sgd", PROBE_LR)
    rng = public_rng(seed, f"benchmark/dbcl/probe/{sketch}")
    shapes = view_shapes(arch, sizes)
    weight_mask = _sketched_weights_mask(arch, {0: 0, 1: 0})  # the first two layers' weights
    features, labels = [], []
    released, sketches, own = None, None, None
    for t in range(rounds + 1):
        sk = draw_sketches(arch, params.layers, params.sketch, sizes, simulated_round_seed(seed.to_bytes(8, "big"), t))
        view = RoundView.release(net, sk)
        if released is not None:  # the adversary's view of the round t − 1 → t change
            change = _difference(sketch, arch, shapes, sketches, released, sk, view.flat())
            features.append(change * 64 / PROBE_LR - own)
        if t == rounds:
            break
        prop = int(rng.integers(0, 2))
        batch = (np.concatenate([rng.choice(with_c, 8, replace=False), rng.choice(without_c, 24, replace=False)])
                 if prop else rng.choice(without_c, 32, replace=False))
        mine = rng.choice(len(ya), 32, replace=False)
        _, dWa, dba = view.loss_and_grad(Xa[mine], ya[mine], np.ones(32))
        _, dWv, dbv = view.loss_and_grad(Xv[batch], yv[batch], np.ones(32))
        ga, gv = 32 * pack(dWa, dba), 32 * pack(dWv, dbv)
        own = _unsketch(net, sk, shapes, ga)  # the adversary maps its own gradient with S_t too
        labels.append(prop)
        released, sketches = view.flat(), sk
        net = optimiser.step(net, _unsketch(net, sk, shapes, (ga + gv) / 64))
    F = np.array(features)
    return F, F[:, weight_mask], np.array(labels)


def _difference(kind: str, arch, shapes, before_sk, before: np.ndarray, after_sk, after: np.ndarray) -> np.ndarray:
    """The adversary's estimate of W_t − W_{t+1} from two released vectors. Unsketched parts are
    exact. CountSketch: S_t W̃_t − S_{t+1} W̃_{t+1}, the paper's unbiased estimate. Uniform
    sampling (dropout): exact on the input rows kept in both rounds (W̃[col(i)] / value_i), zero
    elsewhere — the overlap attack of Zhang & Wang 2021 §4.4."""
    zeros = Network(arch, np.zeros(arch.n_params))
    (wb, bb), (wa, ba) = unpack(shapes, before), unpack(shapes, after)
    out_w = []
    for i, (Wb, Wa) in enumerate(zip(wb, wa)):
        Sb, Sa = before_sk.get(i), after_sk.get(i)
        if Sb is None:
            out_w.append(Wb - Wa)
        elif kind == "countsketch":
            out_w.append(Sb.left(Wb) - Sa.left(Wa))
        else:
            both = (Sb.column >= 0) & (Sa.column >= 0)
            delta = np.zeros((Sb.d, Wb.shape[1]))
            delta[both] = (Wb[Sb.column[both]] / Sb.value[both, None]) - (Wa[Sa.column[both]] / Sa.value[both, None])
            out_w.append(delta)
    return unsketch_gradient(zeros, {}, out_w, [x - z for x, z in zip(bb, ba)])


def _unsketch(net: Network, sketches, shapes, flat: np.ndarray) -> np.ndarray:
    weights, biases = unpack(shapes, flat)
    return unsketch_gradient(net, sketches, weights, biases)


def _sketched_weights_mask(arch, sizes) -> np.ndarray:
    mask = []
    for i, (d, k) in enumerate(zip(arch.sizes[:-1], arch.sizes[1:])):
        mask += [i in sizes] * (d * k) + [False] * k
    return np.array(mask)


def probe_auc(F: np.ndarray, labels: np.ndarray, seed: int) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    order = public_rng(seed, "benchmark/dbcl/probe-split").permutation(len(labels))
    train, test = order[: len(order) // 2], order[len(order) // 2:]
    mean, std = F[train].mean(axis=0), F[train].std(axis=0) + 1e-12
    model = LogisticRegression(C=1.0, max_iter=2000)
    model.fit((F[train] - mean) / std, labels[train])
    return float(roc_auc_score(labels[test], model.decision_function((F[test] - mean) / std)))


def probe_table(args: argparse.Namespace) -> dict[str, list[float]]:
    seeds = [0] if args.quick else [0, 1, 2]
    rounds = 10 if args.smoke else 200 if args.quick else 400
    out: dict[str, list[float]] = {}
    for sketch, name, layers in (("none", "plain", None), ("countsketch", "dbcl", None),
                                 ("countsketch", "dbcl_paper", [0, 1]), ("uniform", "dropout", None)):
        full, weights = [], []
        for seed in seeds:
            F, W, labels = probe_features(sketch, rounds, seed, layers)
            full.append(probe_auc(F, labels, seed))
            weights.append(probe_auc(W, labels, seed))
            say(f"probe {name} seed {seed}: AUC {full[-1]:.3f} on every parameter, {weights[-1]:.3f} on the "
                "first two layers' weights")
        out[f"probe_auc_{name}"] = _mean_std(full)
        out[f"probe_auc_{name}_sketched_weights"] = _mean_std(weights)
    return out


# --- secure timing ---------------------------------------------------------------------------------


def secure_seconds(args: argparse.Namespace) -> dict[str, object]:
    from xclp.demo import JOB_ID, DemoOptions, run_processes, setup
    from xclp.demo import PARTIES as NAMES

    rounds = 2 if args.smoke else 5 if args.quick else 20
    X, y = load_digits_data()
    order = public_rng(0, "benchmark/dbcl/secure").permutation(len(y))[:900]
    work = Path(tempfile.mkdtemp(prefix="xclp-dbcl-bench-"))
    try:
        (work / "data").mkdir()
        for name, rows in zip(NAMES, np.array_split(order, 3)):
            write_party_csv(work / "data" / f"{name}.csv", name, X[rows], y[rows])
        # DBCL without record-level DP is a party's explicit opt-in (docs/jobs/dbcl.md): the benchmark's
        # parties give it, since it times the protocol, not a deployment
        options = DemoOptions(key_bits=1024, insecure_test_keys=True, data_dir=work / "data",
                              party_flags=("--allow-non-dp-dbcl",))
        parties = ", ".join(f'"{p}"' for p in NAMES)
        setup(work, options, f'job_id = "{JOB_ID}"\ntype = "dbcl"\nexpected_parties = [{parties}]\nmin_parties = 3\n'
                             f"[deadlines]\njoin_seconds = 120\nstep_seconds = 300\n[params]\nn_classes = 10\n"
                             f'hidden = [64, 64]\nrounds = {rounds}\nbatch_size = 32\noptimiser = "rmsprop"\n'
                             "learning_rate = 0.001\nstandardise = true\n")
        procs: list = []
        started = time.perf_counter()
        try:
            run_processes(work, options, procs, {})
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        total = time.perf_counter() - started
        import re

        line = re.compile(r"round (\d+): model updated from (\d+) parties \((\d+) rows\) in ([\d.]+)s")
        per_round = [float(m.group(4)) for m in line.finditer((work / "coordinator.log").read_text())]
        return {"parties": 3, "rounds": rounds, "seconds_per_round": round(float(np.mean(per_round)), 4),
                "seconds_per_round_after_first": round(float(np.mean(per_round[1:])), 4),
                "total_seconds": round(total, 1)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one seed, fewer rounds")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run through every part, for CI: proves the benchmark runs; "
                        "its figures mean nothing")
    parser.add_argument("--no-secure", action="store_true", help="skip the secure 3-party run over gRPC+TLS")
    args = parser.parse_args()
    args.quick = args.quick or args.smoke
    started = time.perf_counter()
    tables = accuracy_table(args)
    probe = probe_table(args)
    secure = None if args.no_secure else secure_seconds(args)
    digits = tables["digits"]
    out = {
        "plain_accuracy": digits["plain_accuracy"][0], "dbcl_accuracy": digits["dbcl_accuracy"][0],
        "dbcl_quarter_accuracy": digits["dbcl_quarter_accuracy"][0], "bytes_ratio": digits["bytes_ratio"],
        "probe_auc_plain": probe["probe_auc_plain"][0], "probe_auc_dbcl": probe["probe_auc_dbcl"][0],
        "secure_seconds_per_round": None if secure is None else secure["seconds_per_round"],
        "datasets": tables, "probe": probe, "secure": secure, "quick": args.quick,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
