"""Reading a party's CSV: the pyarrow reader (xclp.data.tables) against the reader it replaced
(benchmarks/_csv_baseline.py, Python's csv module), on one generated file, side by side.

Full run: a ~200 MB CSV of 500 000 rows (an id, 20 float features printed with 17 digits, an
integer label, some empty: unlabeled); `--quick`: 50 000 rows, ~20 MB. Both
readers read the same file, so it has no empty feature cells (the old reader refuses them). Each reader runs
in its own child process, so the peak resident memory (ru_maxrss) is its own; the float64 feature
matrix is reported beside it as the floor, and what each child holds once its imports are done
(numpy, pyarrow) is subtracted in `*_read_bytes`. `digest_seconds`: naming the data set for the ledger
(xclp.data.identity), which a party with a ledger asks for after the read, timed on its own. Progress on stderr; the
last stdout line is JSON.

Usage: python benchmarks/tables_reader.py [--quick | --smoke] [--rows N] [--keep FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FEATURES = 20

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {here!r})
if {which!r} == "pyarrow":
    from xclp.data.tables import load
    import pyarrow.csv  # noqa: F401 - imported before the clock and the memory baseline
else:
    from _csv_baseline import load
imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
data = load({path!r}, id_column="id")
seconds = time.perf_counter() - start
digest = 0.0
if {which!r} == "pyarrow":  # the data set's name in the ledger (xclp.data.identity), asked only with a ledger
    from xclp.data.identity import data_set_digest
    start = time.perf_counter()
    assert len(data_set_digest(data)) == 32
    digest = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "digest_seconds": digest, "rows": int(data.X.shape[0]),
                  "checksum": float(data.X.sum()),
                  "labeled": int(data.labeled.sum()),
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "import_rss_bytes": imported}}))
"""


def log(message: str) -> None:
    print(f"tables_reader: {message}", file=sys.stderr, flush=True)


def write_csv(path: Path, rows: int, rng: np.random.Generator) -> None:
    """id, f0..f19 (float64 printed with repr's 17 digits), label (10 % empty); written in chunks."""
    with open(path, "w") as fh:
        fh.write("id," + ",".join(f"f{j}" for j in range(FEATURES)) + ",label\n")
        for start in range(0, rows, 50_000):
            n = min(50_000, rows - start)
            X = rng.normal(size=(n, FEATURES)) * 10.0 ** rng.integers(-2, 4, size=FEATURES)
            y = rng.integers(0, 5, size=n)
            lines = []
            for i in range(n):
                label = "" if y[i] == 0 and i % 2 else str(int(y[i]))
                lines.append(f"r{start + i}," + ",".join(map(repr, X[i].tolist())) + f",{label}\n")
            fh.write("".join(lines))


def run(which: str, path: Path) -> dict:
    code = CHILD.format(here=str(HERE), which=which, path=str(path))
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a ~20 MB file")
    p.add_argument("--smoke", action="store_true",
                   help="the smallest run through every part, for CI: proves the benchmark runs; "
                   "its figures mean nothing")
    p.add_argument("--rows", type=int, help="rows to generate (default 500 000, quick 50 000)")
    p.add_argument("--keep", type=Path, help="write the CSV here and keep it")
    args = p.parse_args()
    rows = args.rows or (2000 if args.smoke else 50_000 if args.quick else 500_000)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "party.csv"
        log(f"writing {rows} rows to {path}")
        write_csv(path, rows, np.random.default_rng(0))
        size = path.stat().st_size
        log(f"{size / 1e6:.0f} MB; reading with pyarrow, then with the old reader (each in its own process)")
        new = run("pyarrow", path)
        log(f"pyarrow: {new['seconds']:.2f}s, peak {new['peak_rss_bytes'] / 2**20:.0f} MiB")
        old = run("baseline", path)
        log(f"old csv reader: {old['seconds']:.2f}s, peak {old['peak_rss_bytes'] / 2**20:.0f} MiB")
    assert new["rows"] == old["rows"] == rows and new["labeled"] == old["labeled"]
    assert abs(new["checksum"] - old["checksum"]) <= 1e-9 * abs(old["checksum"]), "the two readers disagree"
    matrix = rows * FEATURES * 8
    print(json.dumps({
        "benchmark": "tables_reader", "quick": args.quick, "rows": rows, "features": FEATURES,
        "file_bytes": size, "matrix_bytes": matrix,
        "pyarrow_seconds": round(new["seconds"], 2), "baseline_seconds": round(old["seconds"], 2),
        "speedup": round(old["seconds"] / new["seconds"], 1),
        "digest_seconds": round(new["digest_seconds"], 3),
        "digest_over_read": round(new["digest_seconds"] / new["seconds"], 3),
        "pyarrow_peak_rss_bytes": new["peak_rss_bytes"], "baseline_peak_rss_bytes": old["peak_rss_bytes"],
        "pyarrow_read_bytes": new["peak_rss_bytes"] - new["import_rss_bytes"],
        "baseline_read_bytes": old["peak_rss_bytes"] - old["import_rss_bytes"],
        "pyarrow_read_over_matrix": round((new["peak_rss_bytes"] - new["import_rss_bytes"]) / matrix, 2),
        "baseline_read_over_matrix": round((old["peak_rss_bytes"] - old["import_rss_bytes"]) / matrix, 2),
        "cpus": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
