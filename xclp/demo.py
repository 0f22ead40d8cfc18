"""`xclp-client demo`: XCLP across three institutions on localhost, without Docker (docs/design.md §5, §8).

What it does, as an operator and three institutions would (every role a real process):

1. a throwaway development CA and a server certificate for localhost (`crypto.certs`), one
   Ed25519 identity key per institution and the coordinator's allow-list;
2. `xclp-server serve` with one xclp job (the same job file as xclp/demo_data/xclp-demo.toml,
   with the chosen key size and L) and `--exit-when-done`;
3. `xclp-client run` for hospital-a, -b and -c on the bundled CSVs (features + `label`, empty =
   unlabeled); each writes <work>/out/<party>/predictions.csv atomically;
4. the evaluation each institution could do on its own: accuracy on its unlabeled rows, against
   <party>.truth.csv — a separate file the party process never reads — next to label
   propagation on its own rows alone (`xclp.baselines.per_client_lp`, same k, α, p).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from xclp.baselines import per_client_lp
from xclp.crypto import certs, identity
from xclp.data import tables as party_data
from xclp.errors import ConfigError, InvalidInput, PeerDropped
from xclp.graph import GraphParams
from xclp.runtime import write_atomic, write_private
from xclp.v1.status import EXIT_OK

PARTIES = ("hospital-a", "hospital-b", "hospital-c")
DEMO_DATA = Path(__file__).resolve().parent / "demo_data"
JOB_ID = "xclp-demo"
N_CLASSES = 10
# k = 5 neighbours, p = 3, one-hot labels (label_norm "none", the paper's): on the bundled data
# (3 × 500 rows, 10 % labeled, Dirichlet(0.5) label skew) XCLP beat every institution's own LP
# with the same settings for every one of 12 random common seeds tried (plaintext reference;
# docs/jobs/xclp.md).
GRAPH = GraphParams(k=5, alpha=0.99, power=3)
LABEL_NORM: Literal["none"] = "none"
START_SECONDS = 60.0


@dataclass(frozen=True)
class DemoOptions:
    key_bits: int = 2048
    insecure_test_keys: bool = False
    lsh_bits: int = 1024
    data_dir: Path | None = None
    keep: Path | None = None
    party_flags: tuple[str, ...] = ()  # more `xclp-client run` flags for every party (a benchmark's opt-ins)

    def __post_init__(self) -> None:
        if self.key_bits < 2048 and not self.insecure_test_keys:
            raise ConfigError(f"--key-bits {self.key_bits} is below 2048; add --insecure-test-keys for a quick trial")
        if self.lsh_bits < 64 or self.lsh_bits % 64:
            raise ConfigError(f"--lsh-bits must be a positive multiple of 64, got {self.lsh_bits}")

    @property
    def data(self) -> Path:
        return self.data_dir or DEMO_DATA

    def check_data(self) -> None:
        """Before anything starts: each institution's table and truth file, with the columns the demo
        reads (a --data-dir without row_id failed late, with a traceback)."""
        for party in PARTIES:
            for name, columns in ((f"{party}.csv", ("row_id", "label")),
                                  (f"{party}.truth.csv", ("row_id", "true_label"))):
                path = self.data / name
                try:
                    with open(path, newline="") as fh:
                        header = next(csv.reader(fh), [])
                except OSError as exc:
                    raise InvalidInput(f"--data-dir {self.data}: cannot read {name} ({exc.strerror}); the demo "
                                       f"needs <party>.csv and <party>.truth.csv for {', '.join(PARTIES)}") from None
                missing = [c for c in columns if c not in header]
                if missing:
                    raise InvalidInput(f"--data-dir {self.data}: {name} has no {' or '.join(missing)} column; the demo "
                                       f"reads {', '.join(columns)} from it (its header: {', '.join(header[:8])})")


def job_toml(options: DemoOptions, *, n_classes: int = N_CLASSES, extra: str = "") -> str:
    """The demo's job file (xclp/demo_data/xclp-demo.toml with the chosen key size and L); `extra`
    adds [params] lines (a benchmark's classes and standardise)."""
    insecure = "insecure_test_keys = true\n" if options.insecure_test_keys else ""
    parties = ", ".join(f'"{p}"' for p in PARTIES)
    return (f'job_id = "{JOB_ID}"\ntype = "xclp"\nexpected_parties = [{parties}]\n'
            f'min_parties = 2\nsummary = "summary.json"\n\n[deadlines]\njoin_seconds = 120\nstep_seconds = 300\n\n'
            f"[params]\nn_classes = {n_classes}\nlsh_bits = {options.lsh_bits}\nk = {GRAPH.k}\nalpha = {GRAPH.alpha}\n"
            f'power = {GRAPH.power}\nlabel_norm = "{LABEL_NORM}"\nkey_bits = {options.key_bits}\n{insecure}{extra}')


def _say(message: str) -> None:
    print(f"xclp-demo: {message}", file=sys.stderr, flush=True)


def _prefix_lines(stream: Iterable[str], prefix: str, keep: list[str] | None = None) -> None:
    for line in stream:
        print(f"[{prefix}] {line.rstrip()}", file=sys.stderr, flush=True)
        if keep is not None:
            keep.append(line.rstrip())


def setup(work: Path, options: DemoOptions, job_text: str | None = None) -> None:
    """Dev CA, server certificate for localhost, identity keys, allow-list, job and server files
    (`job_text`: another xclp job file with job_id "xclp-demo", e.g. for a benchmark)."""
    ca_key, ca_cert = certs.make_ca()
    tls_key, cert = certs.make_leaf(ca_key, ca_cert, "server", server=True, dns_names=("localhost",),
                                    ips=("127.0.0.1",))
    (work / "ca").mkdir(parents=True, exist_ok=True)
    (work / "certs").mkdir(parents=True, exist_ok=True)
    write_atomic(work / "ca" / "ca.pem", certs.cert_pem(ca_cert), mode=0o644)  # its key stays in memory
    write_atomic(work / "certs" / "server.pem", certs.cert_pem(cert), mode=0o644)
    write_private(work / "certs" / "server-key.pem", certs.key_pem(tls_key), overwrite=True)
    lines = []
    (work / "keys").mkdir(parents=True, exist_ok=True)
    for party in PARTIES:
        key = identity.generate_identity()
        write_private(work / "keys" / f"{party}.key", identity.private_key_pem(key), overwrite=True)
        lines.append(f'{party} = "{identity.public_key_text(key)}"')
    (work / "allow.toml").write_text("[parties]\n" + "\n".join(lines) + "\n")
    (work / f"{JOB_ID}.toml").write_text(job_text or job_toml(options))
    (work / "server.toml").write_text(
        f'listen = "127.0.0.1:0"\nallow_list = "allow.toml"\nport_file = "port"\njobs = ["{JOB_ID}.toml"]\n'
        'exit_when_done = true\n[tls]\ncert = "certs/server.pem"\nkey = "certs/server-key.pem"\n')


def _wait_port(work: Path, server: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + START_SECONDS
    port_file = work / "port"
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return int(port_file.read_text())
        if server.poll() is not None:
            raise PeerDropped(f"the coordinator exited early; see {work / 'coordinator.log'}")
        time.sleep(0.1)
    raise PeerDropped("the coordinator did not start listening in time")


def _party_cmd(work: Path, port: int, party: str, options: DemoOptions) -> list[str]:
    cmd = [sys.executable, "-m", "xclp.client.cli", "run", "--coordinator", f"localhost:{port}",
           "--ca-cert", str(work / "ca" / "ca.pem"), "--job", JOB_ID, "--party", party,
           "--identity", str(work / "keys" / f"{party}.key"), "--peers", str(work / "allow.toml"),
           "--min-parties", "2",  # the demo job goes on with two institutions if one is lost
           "--data", str(options.data / f"{party}.csv"),
           "--id-column", "row_id", "--paillier-bits", str(options.key_bits), "--out", str(work / "out" / party)]
    return cmd + (["--insecure-test-keys"] if options.insecure_test_keys else []) + list(options.party_flags)


def truth(path: Path, ids: tuple[str, ...]) -> np.ndarray:
    """int64[n] true labels by row id from a demo truth file (row_id, true_label)."""
    try:
        with open(path, newline="") as fh:
            table = {r["row_id"]: int(r["true_label"]) for r in csv.DictReader(fh)}
    except (OSError, KeyError, ValueError) as exc:
        raise InvalidInput(f"cannot read the demo truth file {path}: {exc}") from None
    missing = [i for i in ids if i not in table]
    if missing:
        raise InvalidInput(f"{path} has no true label for row {missing[0]!r}")
    return np.array([table[i] for i in ids], dtype=np.int64)


def predictions(path: Path, ids: tuple[str, ...]) -> np.ndarray:
    """int64[n] XCLP labels of a party's predictions.csv in the order of `ids`; every own row id must
    be there exactly once (ValueError, OSError or KeyError otherwise)."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        ident = (reader.fieldnames or ["id"])[0]  # the id column comes first, under the table's name for it
        rows = {r[ident]: int(r["label"]) for r in reader}
    if sorted(rows) != sorted(ids):
        raise ValueError(f"{path} does not hold exactly the institution's own row ids")
    return np.array([rows[i] for i in ids], dtype=np.int64)


def evaluate(options: DemoOptions, out_dir: Path) -> list[tuple[str, int, float, float]]:
    """Per institution: (party, unlabeled rows, XCLP accuracy, per-client LP accuracy) on its unlabeled rows."""
    table = []
    for party in PARTIES:
        data = party_data.load(options.data / f"{party}.csv", id_column="row_id")
        assert data.y is not None
        labels = truth(options.data / f"{party}.truth.csv", data.ids)
        unlabeled = ~data.labeled
        xclp = predictions(out_dir / party / "predictions.csv", data.ids)
        alone = per_client_lp(data.X, data.y, N_CLASSES, GRAPH, LABEL_NORM).labels
        table.append((party, int(unlabeled.sum()), float(np.mean(xclp[unlabeled] == labels[unlabeled])),
                      float(np.mean(alone[unlabeled] == labels[unlabeled]))))
    return table


def run_processes(work: Path, options: DemoOptions, procs: list[subprocess.Popen[str]],
                  party_lines: dict[str, list[str]] | None = None) -> None:
    """The coordinator and the three institutions as real processes on `work` (after `setup`),
    until all exit; PeerDropped if any party fails. Started processes are appended to `procs`;
    each party's progress lines are also kept in `party_lines[party]` if given."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(work / "coordinator.log", "w") as log:
        serve = [sys.executable, "-m", "xclp.server.cli", "serve", "--config", str(work / "server.toml")]
        server = subprocess.Popen(serve,
                                  stderr=log, stdout=subprocess.DEVNULL, text=True, env=env)
    procs.append(server)
    port = _wait_port(work, server)
    _say(f"coordinator listening on localhost:{port} (TLS); starting {', '.join(PARTIES)} "
         f"({options.key_bits}-bit Paillier keys, L = {options.lsh_bits})")
    readers = []
    parties = []
    for party in PARTIES:
        proc = subprocess.Popen(_party_cmd(work, port, party, options), stderr=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, text=True, env=env)
        procs.append(proc)
        parties.append(proc)
        keep = None if party_lines is None else party_lines.setdefault(party, [])
        reader = threading.Thread(target=_prefix_lines, args=(proc.stderr, party, keep), daemon=True)
        reader.start()
        readers.append(reader)
    codes = [p.wait() for p in parties]
    for reader in readers:
        reader.join(5)
    server.wait(30)
    if any(codes):
        failed = ", ".join(p for p, c in zip(PARTIES, codes) if c)
        raise PeerDropped(f"the job did not complete for {failed}; see the log above and {work / 'coordinator.log'}")


LEARNED = """
What each side learned: the coordinator, each institution's row count, which of its rows are
labeled (not their labels), and every row's k nearest rows (from the Hamming distances between
LSH codes, unmasked pair by pair); each institution, the label scores propagated onto its own
rows. What stayed private: every feature value and every label, the LSH codes, the institutions'
score sums (masked: the coordinator adds them without reading them) and each institution's
predictions. Details: docs/threat-model.md."""


def run_demo(options: DemoOptions) -> int:
    options.check_data()
    work = Path(tempfile.mkdtemp(prefix="xclp-demo-")) if options.keep is None else options.keep
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    procs: list[subprocess.Popen[str]] = []
    try:
        setup(work, options)
        _say(f"work directory {work}; dev CA, server certificate, 3 identity keys and the allow-list made")
        run_processes(work, options, procs)
        table = evaluate(options, work / "out")
    finally:
        for proc in procs:  # nothing outlives the demo, however it ends
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    print(f"\nXCLP on the demo data ({time.monotonic() - started:.1f}s, {options.key_bits}-bit keys, "
          f"L = {options.lsh_bits}): accuracy on each institution's unlabeled rows\n")
    print(f"{'institution':<14}{'unlabeled':>10}{'XCLP (together)':>18}{'alone (own LP)':>17}")
    for party, n, together, alone in table:
        print(f"{party:<14}{n:>10}{together:>18.3f}{alone:>17.3f}")
    print(LEARNED)
    print(f"\nOutputs, kept: {work / 'out'}/<institution>/predictions.csv; run summary: {work / 'summary.json'}; "
          f"logs and the throwaway keys beside them in {work}")
    return EXIT_OK
