"""A coordinator and its parties as real processes for benchmark scripts (xclp_e2e.py, xclp_scale.py).

    work = deployment("xclp-e2e-", PARTIES)          # dev CA, server certificate, keys/, allow.toml
    (work / "job.toml").write_text(...)               # the benchmark's own job file
    server, port = serve(work, env)                   # `xclp-server serve`, once its port is known
    cmd = run_command(work, port, "e2e", "a", "--data", ...)   # an `xclp-client run` command line
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from xclp.crypto import identity
from xclp.runtime import write_private
from xclp.server import dev_ca


def deployment(prefix: str, parties: Sequence[str]) -> Path:
    """A fresh work directory with a dev CA, the coordinator's certificate, each party's identity
    key (keys/<party>.key) and allow.toml."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    dev_ca.init_ca(work / "ca")
    dev_ca.issue(work / "ca", work / "certs", "server", server=True, dns_names=("localhost",), ips=("127.0.0.1",))
    (work / "keys").mkdir()
    allow = []
    for p in parties:
        key = identity.generate_identity()
        write_private(work / "keys" / f"{p}.key", identity.private_key_pem(key))
        allow.append(f'{p} = "{identity.public_key_text(key)}"')
    (work / "allow.toml").write_text("[parties]\n" + "\n".join(allow) + "\n")
    return work


def serve(work: Path, env: Mapping[str, str], port: int = 0,
          log: str = "coordinator.log") -> tuple[subprocess.Popen, int]:
    """`xclp-server serve` over TLS for work/job.toml (it exits when the job is done), and its port
    (`port`: that one, e.g. to start it again on the same state and port after a crash)."""
    (work / "port").unlink(missing_ok=True)
    (work / "server.toml").write_text(
        f'listen = "127.0.0.1:{port}"\nallow_list = "allow.toml"\nport_file = "port"\njobs = ["job.toml"]\n'
        'exit_when_done = true\n[tls]\ncert = "certs/server.pem"\nkey = "certs/server-key.pem"\n')
    server = subprocess.Popen([sys.executable, "-m", "xclp.server.cli", "serve", "--config", str(work / "server.toml")],
                              stderr=open(work / log, "w"), env=dict(env), cwd=work)
    while not ((work / "port").exists() and (work / "port").read_text().strip()):
        if server.poll() is not None:
            raise SystemExit(f"coordinator exited; see {work / 'coordinator.log'}")
        time.sleep(0.1)
    return server, int((work / "port").read_text())


def run_command(work: Path, port: int, job: str, party: str, *extra: str) -> list[str]:
    """`xclp-client run` of `party` in `job` against the coordinator on `port`, with its key and
    the allow-list of `work`; `extra`: the rest (data, output, ...)."""
    return [sys.executable, "-m", "xclp.client.cli", "run", "--coordinator", f"localhost:{port}",
            "--ca-cert", str(work / "ca" / "ca.pem"), "--job", job, "--party", party,
            "--identity", str(work / "keys" / f"{party}.key"), "--peers", str(work / "allow.toml"), *extra]
