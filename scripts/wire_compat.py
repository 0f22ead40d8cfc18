"""Wire compatibility: a coordinator of one version with parties of both versions, every job type.

    python scripts/wire_compat.py NEW_BIN OLD_BIN new|old WORKDIR

NEW_BIN and OLD_BIN hold each version's console scripts; the third argument says whose coordinator
runs. Parties a and c run the other version, b the coordinator's. Each job type runs once (flynn
with the preparation's masked moments, DP race, xclp, fedavg with XCLP pseudo-labels, dbcl); the
last line is JSON with every party's exit code. scripts/wire-compat sets both versions up.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

NEW, OLD, COORD, WORK = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
WORK.mkdir(parents=True, exist_ok=True)
D = 6
coord_bin = NEW if COORD == "new" else OLD
other_bin = OLD if COORD == "new" else NEW
party_bins = {"a": other_bin, "b": coord_bin, "c": other_bin}


def run(b: Path, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(b / args[0]), *args[1:]], capture_output=True, text=True, timeout=300, cwd="/tmp", **kw)


lines = []
for p in "abc":
    out = run(NEW, "xclp-client", "keygen", "--party", p, "--out", str(WORK / "keys"))
    assert out.returncode == 0, out.stderr
    lines.append(out.stdout.strip())
(WORK / "allow.toml").write_text("[parties]\n" + "\n".join(lines) + "\n")
rng = np.random.default_rng(0)
centres = rng.normal(0, 3, size=(3, D))
for i, p in enumerate("abc"):
    r = np.random.default_rng(i)
    y = r.integers(0, 3, 40)
    X = centres[y] + r.normal(size=(40, D))
    y[20:] = -1
    np.savez(WORK / f"{p}.npz", X=X, y=y, ids=np.array([f"{p}{k}" for k in range(40)]))
JOBS = {
    "flynn": 'type = "flynn"\n[params]\nn_classes = 3\nm = 64\ns = 2\nrho = 4\nstandardise = true\n',
    "race": 'type = "race"\n[params]\nrows = 8\nwidth = 8\np = 2\nepsilon = 2.0\n',
    "xclp": 'type = "xclp"\n[params]\nn_classes = 3\nk = 4\nlsh_bits = 64\nkey_bits = 512\ninsecure_test_keys = true\n',
    "fedavg": ('type = "fedavg"\n[params]\nn_classes = 3\nhidden = [5]\nrounds = 2\nlocal_epochs = 1\nbatch_size = 8\n'
               'pseudo_label = "xclp"\nk = 4\nlsh_bits = 64\nkey_bits = 512\ninsecure_test_keys = true\n'),
    "dbcl": 'type = "dbcl"\n[params]\nn_classes = 3\nhidden = [5]\nrounds = 3\nbatch_size = 8\n',
}
names = []
for job, body in JOBS.items():
    head, params = body.split("[params]")
    (WORK / f"{job}.toml").write_text(f'job_id = "{job}"\n{head}expected_parties = ["a", "b", "c"]\n'
                                      f'[deadlines]\njoin_seconds = 120\nstep_seconds = 60\n[params]{params}')
    names += ["--job", str(WORK / f"{job}.toml")]
server_log = open(WORK / "server.log", "w")  # noqa: SIM115 - the coordinator's stderr while it runs
server = subprocess.Popen([str(coord_bin / "xclp-server"), "serve", "--listen", "127.0.0.1:0", "--insecure",
                           "--allow-list", str(WORK / "allow.toml"), "--state", str(WORK / "state.db"),
                           "--port-file", str(WORK / "port"), "--exit-when-done", "--admin-listen", "off", *names],
                          stderr=server_log, cwd="/tmp")
started = time.monotonic()
while not (WORK / "port").exists() or not (WORK / "port").read_text().strip():
    if server.poll() is not None or time.monotonic() - started > 120:  # a coordinator that fails to start
        server.kill()
        server_log.close()
        sys.exit(f"the coordinator did not start ({COORD}): {(WORK / 'server.log').read_text()[-1500:]}")
    time.sleep(0.1)
port = (WORK / "port").read_text().strip()
results = {}
for job in JOBS:
    procs = {}
    for p in "abc":
        args = ["xclp-client", "run", "--coordinator", f"127.0.0.1:{port}", "--insecure", "--job", job, "--party", p,
                "--identity", str(WORK / "keys" / f"{p}.key"), "--peers", str(WORK / "allow.toml"),
                "--data", str(WORK / f"{p}.npz"), "--out", str(WORK / f"{job}-{p}" / ""), "--min-parties", "2",
                "--insecure-test-keys", "--workers", "0",
                # a ledger of its own: the user's would keep what every earlier check released (DP race
                # spends the same data set's budget each time, and the fifth check would decline)
                "--state", str(WORK / "state" / p)]
        if job in ("xclp", "fedavg"):
            args += ["--paillier-bits", "512"]
        if job == "dbcl":  # exact DBCL is opt-in: the parties opt in here
            args += ["--allow-non-dp-dbcl"]
        procs[p] = subprocess.Popen([str(party_bins[p] / args[0]), *args[1:]], stderr=subprocess.PIPE, text=True,
                                    cwd="/tmp")
    for p, proc in procs.items():
        err = proc.communicate(timeout=600)[1]
        results[(job, p)] = proc.returncode
        if proc.returncode:
            print(f"{job} {p} ({'new' if party_bins[p] == NEW else 'old'}) exit {proc.returncode}:\n{err[-1500:]}")
server.wait(timeout=60)
server_log.close()
print(json.dumps({"coordinator": COORD, "exits": {f"{j}/{p}": c for (j, p), c in results.items()}}))
sys.exit(1 if any(results.values()) else 0)
