"""A Dask scheduler and workers of a test's (or benchmark's) own on 127.0.0.1, over mutual TLS with
a CA of its own (an institution's; crypto/certs.py, as `xclp-server cert node` makes them), or over
plain tcp. Used by tests/client/test_dask_workers.py and benchmarks/secure_hamming.py --workers local."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from xclp.crypto import certs
from xclp.workers import DaskWorkers

DASK = Path(sys.executable).with_name("dask")
STARTUP_SECONDS = 60


class Cluster:
    """A scheduler and workers of the test's own, over TLS (or tcp) on 127.0.0.1."""

    def __init__(self, tmp: Path, protocol: str = "tls") -> None:
        self.tmp, self.protocol = tmp, protocol
        ca_key, ca = certs.make_ca("an institution's CA")
        (tmp / "ca.pem").write_bytes(certs.cert_pem(ca))
        for name in ("scheduler", "worker", "party"):
            key, cert = certs.make_leaf(ca_key, ca, name, server=True, client_too=True, ips=("127.0.0.1",))
            (tmp / f"{name}.pem").write_bytes(certs.cert_pem(cert))
            (tmp / f"{name}.key").write_bytes(certs.key_pem(key))
        self.procs: list[subprocess.Popen] = []
        self.workers: list[subprocess.Popen] = []
        self.address = ""

    def tls(self, name: str) -> list[str]:
        if self.protocol != "tls":
            return []
        return ["--tls-ca-file", str(self.tmp / "ca.pem"), "--tls-cert", str(self.tmp / f"{name}.pem"),
                "--tls-key", str(self.tmp / f"{name}.key")]

    def client_config(self) -> dict[str, str]:
        """The party's side, the Dask way (distributed.comm.tls.*)."""
        return {"distributed.comm.tls.ca-file": str(self.tmp / "ca.pem"),
                "distributed.comm.tls.client.cert": str(self.tmp / "party.pem"),
                "distributed.comm.tls.client.key": str(self.tmp / "party.key")}

    def start(self, workers: int) -> Cluster:
        file = self.tmp / "scheduler.json"
        self.procs.append(self._spawn("scheduler", [str(DASK), "scheduler", "--host", "127.0.0.1", "--port", "0",
                                                    "--protocol", self.protocol, "--scheduler-file", str(file),
                                                    "--no-dashboard", *self.tls("scheduler")]))
        deadline = time.monotonic() + STARTUP_SECONDS
        while not (file.exists() and file.read_text().strip().endswith("}")):
            if time.monotonic() > deadline or self.procs[0].poll() is not None:
                raise RuntimeError(f"the scheduler did not start: {(self.tmp / 'scheduler.log').read_text()}")
            time.sleep(0.05)
        self.address = json.loads(file.read_text())["address"]
        for i in range(workers):
            self.workers.append(self._spawn(f"worker{i}", [str(DASK), "worker", self.address, "--nthreads", "1",
                                                           "--no-nanny", "--no-dashboard", "--name", f"w{i}",
                                                           *self.tls("worker")]))
        self.procs += self.workers
        return self

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = (self.tmp / f"{name}.log").open("w")
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"})

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@contextlib.contextmanager
def cluster(tmp: Path, workers: int = 2, protocol: str = "tls") -> Iterator[Cluster]:
    import dask  # the extra: only once a cluster is wanted

    running = Cluster(tmp, protocol).start(workers)
    try:
        with dask.config.set(running.client_config()):
            if workers:
                with DaskWorkers.connect(running.address) as ready:
                    ready.client.wait_for_workers(workers, timeout=STARTUP_SECONDS)
            yield running
    finally:
        running.stop()


