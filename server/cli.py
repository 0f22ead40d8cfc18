"""`xclp-server`: run the coordinator, operate it, and make a development CA and certificates.

    xclp-server ca init --dir ca/
    xclp-server cert server --ca-dir ca/ --out certs/ --dns coordinator.example.org --ip 10.0.0.5
    xclp-server cert party --ca-dir ca/ --out certs/ --party hospital-a       # for mutual TLS
    xclp-server serve --config server.toml            # a long-running service; state in SQLite
    xclp-server serve --listen 0.0.0.0:50051 --allow-list allow.toml --job flynn.toml \\
        --tls-cert certs/server.pem --tls-key certs/server-key.pem --exit-when-done   # one-shot
    xclp-server operator keygen --name alice --out keys/
    xclp-server job submit|list|show|cancel ...       # the Admin API (server/admin_cli.py)
    xclp-server health --coordinator localhost:50051 --ca-cert ca.pem
    xclp-server federation new fed/ --parties a,b,c --data a.csv b.csv c.csv   # all of it, on this machine
    xclp-server allow add hospital-d ed25519:...       # a party's key into allow.toml

Settings come from flags or `--config server.toml` (same names, underscores; flags win); the
operator keys of the Admin API are the config's `[operators]` table (name = "ed25519:...").

The parser imports nothing heavy (server/defaults.py holds what it names); each command imports
what it runs when it runs, so `--help` and the Admin commands start without loading the
coordinator, gRPC's server side or the job types' numerics.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xclp.errors import ConfigError, XclpError
from xclp.memory import limit_malloc_arenas
from xclp.runtime import read_toml
from xclp.server.defaults import DEFAULT_ADMIN_LISTEN, DEFAULT_STATE
from xclp.v1.exits import EXIT_OK, EXIT_UNEXPECTED, exit_code, stdout_closed

if TYPE_CHECKING:
    from xclp.workers import DaskWorkers

log = logging.getLogger("xclp.server")
EXIT_GRACE_SECONDS = 3.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xclp-server", description="The xclp coordinator and its certificate helpers.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the coordinator", description="Run the coordinator: admit allow-listed "
                       "parties, run the configured jobs, relay and aggregate. TLS unless --insecure.")
    s.add_argument("--config", type=Path, help="server TOML file (keys as the flags below, with underscores)")
    s.add_argument("--listen", help="address to listen on, host:port (default 0.0.0.0:50051; port 0 = any free port)")
    s.add_argument("--allow-list", type=Path, help="TOML file: [parties] party-id = \"ed25519:<base64>\"")
    s.add_argument("--job", type=Path, action="append", help="job TOML file to run once at start (repeatable; "
                   "optional: jobs can be submitted at runtime with `xclp-server job submit`)")
    s.add_argument("--state", type=Path, help=f"SQLite file of job definitions and run history (default "
                   f"{DEFAULT_STATE} beside --config, else in the current directory)")
    s.add_argument("--admin-listen", help=f"address of the Admin API (default {DEFAULT_ADMIN_LISTEN}; loopback "
                   "unless TLS; on when the config lists [operators]; 'off' to turn it off)")
    s.add_argument("--metrics-listen", help="serve Prometheus metrics on host:port (default: off)")
    s.add_argument("--tls-cert", type=Path, help="server certificate (PEM)")
    s.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    s.add_argument("--client-ca", type=Path, help="CA certificate (PEM) of party client certificates: turns on mutual "
                                                  "TLS")
    s.add_argument("--insecure", action="store_true", default=None, help="plaintext gRPC (testing only; never across "
                                                                         "networks)")
    s.add_argument("--workers", help="a Dask scheduler of the operator's own, tls://host:port: the XCLP influence "
                   "solve runs on its workers (docs/cluster.md; default: on this machine's cores)")
    s.add_argument("--insecure-workers", action="store_true", default=None,
                   help="allow a tcp:// --workers address (the graph crosses the network in the clear)")
    s.add_argument("--port-file", type=Path, help="write the bound port to this file once listening")
    s.add_argument("--exit-when-done", action="store_true", default=None,
                   help="exit once a run has started and every run is over, none queued (a one-shot coordinator)")
    s.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")

    ca = sub.add_parser("ca", help="development certificate authority").add_subparsers(dest="ca_command", required=True)
    init = ca.add_parser("init", help="create ca.pem and ca-key.pem (0600) in --dir")
    init.add_argument("--dir", type=Path, required=True, help="directory for the CA files")
    init.add_argument("--days", type=int, default=3650, help="validity in days (default 3650)")

    cert = sub.add_parser("cert", help="issue certificates from the development CA").add_subparsers(
        dest="cert_command", required=True)
    srv = cert.add_parser("server", help="server certificate with DNS/IP subject alternative names")
    srv.add_argument("--ca-dir", type=Path, required=True, help="directory holding ca.pem and ca-key.pem")
    srv.add_argument("--out", type=Path, required=True, help="output directory (writes <name>.pem, <name>-key.pem)")
    srv.add_argument("--name", default="server", help="file name and common name (default server)")
    srv.add_argument("--dns", action="append", default=[], help="DNS name the parties dial (repeatable)")
    srv.add_argument("--ip", action="append", default=[], help="IP address the parties dial (repeatable)")
    srv.add_argument("--days", type=int, default=825, help="validity in days (default 825)")
    node = cert.add_parser("node", help="certificate of a node that listens and connects (serverAuth and clientAuth): "
                                        "a Dask scheduler or worker, or a party dialling one (docs/cluster.md)")
    node.add_argument("--ca-dir", type=Path, required=True, help="directory holding ca.pem and ca-key.pem")
    node.add_argument("--out", type=Path, required=True, help="output directory (writes <name>.pem, <name>-key.pem)")
    node.add_argument("--name", required=True, help="file name and common name")
    node.add_argument("--dns", action="append", default=[], help="DNS name it is reached by (repeatable)")
    node.add_argument("--ip", action="append", default=[], help="IP address it is reached by (repeatable)")
    node.add_argument("--days", type=int, default=825, help="validity in days (default 825)")
    party = cert.add_parser("party", help="client certificate for a party (mutual TLS)")
    party.add_argument("--ca-dir", type=Path, required=True, help="directory holding ca.pem and ca-key.pem")
    party.add_argument("--out", type=Path, required=True, help="output directory (writes <party>.pem, <party>-key.pem)")
    party.add_argument("--party", required=True, help="party id (the certificate's common name)")
    party.add_argument("--days", type=int, default=825, help="validity in days (default 825)")

    _admin_parsers(sub)
    fed = sub.add_parser("federation", help="a federation on this machine, from your CSVs").add_subparsers(
        dest="federation_command", required=True)
    new = fed.add_parser("new", help="write the CA, certificates, keys, allow-list, a job and a README",
                         description="Write, in a new directory: a development CA, the coordinator's certificate, "
                         "each party's identity key and settings, the allow-list, one job checked against the "
                         "tables (with --data) and a README with the exact command for each process.")
    new.add_argument("dir", type=Path, help="a new (or empty) directory")
    new.add_argument("--parties", required=True, help="the parties' names, comma-separated (e.g. a,b,c)")
    new.add_argument("--data", type=Path, nargs="+", default=[], help="one table per party, in --parties order")
    new.add_argument("--type", default="xclp", help="the job's type: xclp (default) or flynn")
    new.add_argument("--label-column", default="label", help="the tables' label column (default label)")
    new.add_argument("--id-column", help="the tables' row id column (default: row numbers)")
    allow = sub.add_parser("allow", help="the allow-list").add_subparsers(dest="allow_command", required=True)
    add = allow.add_parser("add", help="add a party's public key (its `xclp-client keygen` line)")
    add.add_argument("name", help="the party's id")
    add.add_argument("pubkey", help='its public key, "ed25519:..." (or the whole line keygen printed)')
    add.add_argument("--allow-list", type=Path, default=Path("allow.toml"), help="the file (default allow.toml)")
    add.add_argument("--replace", action="store_true", help="give a listed party another key")

    h = sub.add_parser("health", help="ask a coordinator's gRPC health service (exit 0 if SERVING)")
    h.add_argument("--coordinator", default="localhost:50051", help="host:port (default localhost:50051)")
    h.add_argument("--ca-cert", type=Path, help="CA of the coordinator's certificate")
    h.add_argument("--server-name", help="TLS name to expect, if not the host in --coordinator")
    h.add_argument("--insecure", action="store_true", help="plaintext gRPC")
    h.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    return p


def _admin_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    op = sub.add_parser("operator", help="operator keys for the Admin API").add_subparsers(dest="operator_command",
                                                                                           required=True)
    kg = op.add_parser("keygen", help="create an operator's Ed25519 key",
                       description="Write <out>/<name>.key (private, 0600) and print the line for the server "
                       "config's [operators] table.")
    kg.add_argument("--name", required=True, help="operator name, e.g. alice")
    kg.add_argument("--out", type=Path, default=Path("."), help="output directory (default: current)")

    job = sub.add_parser("job", help="submit, list, show and cancel runs (the Admin API)")
    jobs = job.add_subparsers(dest="job_command", required=True)
    submit = jobs.add_parser("submit", help="queue a run of a job file", description="Send a job file to the "
                             "coordinator and queue a run of it. A job id already defined with the same text gets "
                             "another run; another text under the same id is refused.")
    submit.add_argument("file", type=Path, nargs="+", help="job TOML file(s) (data sets named by catalogue name)")
    ls = jobs.add_parser("list", help="runs, newest first")
    ls.add_argument("--job", default="", help="only runs of this job id")
    ls.add_argument("--limit", type=int, default=50, help="at most this many runs (default 50)")
    show = jobs.add_parser("show", help="one run: stage, parties, steps, durations and bytes")
    show.add_argument("run", help="run id (from `job list` or `job submit`)")
    cancel = jobs.add_parser("cancel", help="cancel a queued, joining or running run")
    cancel.add_argument("run", help="run id")
    cancel.add_argument("--reason", default="", help="told to the parties (default: cancelled by <operator>)")
    for p in (submit, show):
        p.add_argument("--wait", action="store_true", help="wait until the run is done, failed, cancelled or "
                       "interrupted; exit 0 only if it is done")
        p.add_argument("--timeout", type=float, default=0,
                       help="with --wait: give up after this many seconds (0: never)")
    for p in (submit, ls, show, cancel):
        p.add_argument("--admin", default=os.environ.get("XCLP_ADMIN", DEFAULT_ADMIN_LISTEN),
                       help=f"the coordinator's Admin address (default {DEFAULT_ADMIN_LISTEN} or $XCLP_ADMIN)")
        p.add_argument("--operator", default=os.environ.get("XCLP_OPERATOR"), help="operator name (or $XCLP_OPERATOR)")
        p.add_argument("--operator-key", type=Path, default=os.environ.get("XCLP_OPERATOR_KEY"),
                       help="operator key from `xclp-server operator keygen` (or $XCLP_OPERATOR_KEY)")
        p.add_argument("--ca-cert", type=Path, default=os.environ.get("XCLP_ADMIN_CA"),
                       help="CA of the coordinator's certificate, if --admin is not loopback (or $XCLP_ADMIN_CA)")
        p.add_argument("--server-name", help="TLS name to expect, if not the host in --admin")
        p.add_argument("--json", action="store_true", help="print JSON (one object per run) for scripts")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """Flags over the TOML file; TOML paths are relative to the TOML file."""
    from xclp.crypto.identity import parse_public_key

    merged: dict[str, Any] = {}
    if args.config is not None:
        raw = read_toml(args.config)
        base = args.config.parent
        tls = raw.pop("tls", {})
        operators = raw.pop("operators", {})
        if not isinstance(operators, dict):
            raise ConfigError(f"{args.config}: [operators] must be a table: name = \"ed25519:<base64>\"")
        raw["operators"] = {name: parse_public_key(str(key)) for name, key in operators.items()}
        known = {"listen", "allow_list", "jobs", "insecure", "port_file", "exit_when_done", "state", "admin_listen",
                 "metrics_listen", "operators", "workers", "insecure_workers"}
        extra = sorted(set(raw) - known)
        if extra:
            raise ConfigError(f"{args.config}: unknown key(s) {', '.join(extra)}; known: {', '.join(sorted(known))}, "
                              f"[tls]")
        raw.setdefault("state", DEFAULT_STATE)
        for key in ("allow_list", "port_file", "state"):
            if key in raw:
                raw[key] = base / raw[key]
        if "jobs" in raw:
            raw["job"] = [base / j for j in raw.pop("jobs")]
        for key, flag in (("cert", "tls_cert"), ("key", "tls_key"), ("client_ca", "client_ca")):
            if key in tls:
                raw[flag] = base / tls[key]
        merged.update(raw)
    for key, value in vars(args).items():
        if value is not None:
            merged[key] = value
    return merged


def serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    from xclp.crypto.identity import allow_list
    from xclp.server.admin import build_admin_server
    from xclp.server.config import TlsFiles, read_job
    from xclp.server.coordinator import Coordinator
    from xclp.server.metrics import Metrics
    from xclp.server.resume import Checkpoints
    from xclp.server.service import build_server
    from xclp.server.store import StateStore

    cfg = _settings(args)
    if not cfg.get("allow_list"):
        raise ConfigError("serve needs --allow-list (or allow_list in --config)")
    offload = _offload(cfg)
    insecure = bool(cfg.get("insecure"))
    tls = None
    if not insecure:
        if not cfg.get("tls_cert") or not cfg.get("tls_key"):
            raise ConfigError("TLS needs --tls-cert and --tls-key (make them with `xclp-server cert server`), "
                              "or pass --insecure for a local test")
        tls = TlsFiles(Path(cfg["tls_cert"]), Path(cfg["tls_key"]),
                       None if not cfg.get("client_ca") else Path(cfg["client_ca"]))
    job_files = [Path(p) for p in cfg.get("job") or []]
    read = [read_job(path) for path in job_files]
    state = Path(cfg.get("state") or DEFAULT_STATE)
    store = StateStore(state)
    metrics = Metrics(store) if cfg.get("metrics_listen") else None
    allowed = allow_list(read_toml(cfg["allow_list"]).get("parties"), source=str(cfg["allow_list"]))
    coordinator = Coordinator(allowed, [config for config, _ in read], store=store,
                              metrics=metrics, job_root=state.parent / "jobs",
                              job_texts=[(text, str(path)) for (_, text), path in zip(read, job_files)],
                              checkpoints=Checkpoints(state.parent / "runs"), offload=offload)
    server, port = build_server(coordinator, cfg.get("listen") or "0.0.0.0:50051", tls=tls)
    operators = cfg.get("operators") or {}
    admin_address = cfg.get("admin_listen") or DEFAULT_ADMIN_LISTEN
    admin = None
    if operators and admin_address != "off":
        admin, admin_port = build_admin_server(coordinator, operators, admin_address, tls=tls)
        admin.start()
        log.info("Admin API on %s (port %d) for %d operator(s)", admin_address, admin_port, len(operators))
    elif not job_files:
        log.warning("no job files and no [operators] for the Admin API: nothing can run on this coordinator")
    if metrics is not None:
        _, metrics_port = metrics.serve(cfg["metrics_listen"])
        log.info("Prometheus metrics on %s (port %d)", cfg["metrics_listen"], metrics_port)
    if insecure:
        log.warning("*** INSECURE: serving plaintext gRPC without TLS; session tokens and payloads are exposed "
                    "to the network. Use only on localhost for testing. ***")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server.start()
    coordinator.start()
    mode = "plaintext" if insecure else ("mutual TLS" if tls and tls.client_ca else "TLS")
    log.info("listening on port %d (%s); state %s; runs open: %s", port, mode, state,
             ", ".join(f"{j} (run {job.run_id})" for j, job in coordinator.jobs.items()) or "none")
    if cfg.get("port_file"):
        Path(cfg["port_file"]).write_text(f"{port}\n")
    while not stop.wait(0.5):
        if cfg.get("exit_when_done") and coordinator.all_finished():
            # let the last Pull streams deliver their JobEnd, and `job show --wait` see it
            stop.wait(EXIT_GRACE_SECONDS)
            break
    log.info("shutting down")
    coordinator.stop()
    stop.wait(0.5)  # let the Pull streams deliver the interrupted runs' JobEnd
    if admin is not None:
        admin.stop(grace=1)
    server.stop(grace=2).wait()
    if offload is not None:
        offload.shutdown()
    failed = [j for j, job in coordinator.jobs.items() if job.stage.value == "failed"]
    if failed:
        log.warning("jobs that failed: %s", ", ".join(failed))
    store.close()
    return EXIT_OK


def _offload(cfg: dict[str, Any]) -> DaskWorkers | None:
    """The operator's Dask cluster for the influence solve (server/offload.py), connected now: a
    scheduler that does not answer stops the coordinator before it serves; None without `workers`."""
    from xclp.workers import DaskWorkers, WorkerSpec

    given = cfg.get("workers")
    if not given:
        return None
    spec = WorkerSpec.parse(str(given), insecure=bool(cfg.get("insecure_workers")),
                            carries="the influence solve's tasks carry the graph the coordinator learned")
    if spec.scheduler is None:
        raise ConfigError(f"--workers {given}: give a Dask scheduler address, tls://host:port; the coordinator's "
                          "own solve already uses this machine's cores")
    return DaskWorkers.connect(spec.scheduler, work="the XCLP influence solve")


def health(args: argparse.Namespace) -> int:
    import grpc

    from xclp.server.health import check as check_health

    try:
        status = check_health(args.coordinator, ca=args.ca_cert.read_bytes() if args.ca_cert else None,
                              server_name=args.server_name, insecure=args.insecure, timeout=args.timeout)
    except grpc.RpcError as exc:
        print(f"xclp-server: health: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return EXIT_UNEXPECTED
    print(status)
    return EXIT_OK if status == "SERVING" else EXIT_UNEXPECTED


def federation(args: argparse.Namespace) -> int:
    from xclp.server.federation import allow_add, new_federation

    if args.command == "allow":
        allow_add(args.allow_list, args.name, args.pubkey, replace=args.replace)
        print(f"xclp-server: {args.allow_list} lists {args.name}; a running coordinator reads it again at its next "
              "start", file=sys.stderr)
        return EXIT_OK
    parties = [p.strip() for p in args.parties.split(",") if p.strip()]
    new_federation(args.dir, parties, args.data, job_type=args.type, label_column=args.label_column,
                   id_column=args.id_column, say=lambda line: print(f"xclp-server: {line}", file=sys.stderr))
    print(f"xclp-server: a {args.type} federation of {', '.join(parties)} in {args.dir}; the commands to run are in "
          f"{args.dir / 'README.md'}:\n", file=sys.stderr)
    print((args.dir / "README.md").read_text().split("```sh\n", 1)[1].split("```", 1)[0].rstrip())
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    limit_malloc_arenas()
    logging.basicConfig(level=getattr(args, "log_level", "INFO").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            return serve(args)
        if args.command == "job":
            from xclp.server import admin_cli

            return admin_cli.job_command(args)
        if args.command == "operator":
            from xclp.server import admin_cli

            return admin_cli.operator_keygen(args)
        if args.command == "health":
            return health(args)
        if args.command in ("federation", "allow"):
            return federation(args)
        from xclp.server import dev_ca

        if args.command == "ca":
            issued = dev_ca.init_ca(args.dir, days=args.days)
            print(f"CA certificate: {issued.cert_path}\nCA key (keep private): {issued.key_path}", file=sys.stderr)
            return EXIT_OK
        if args.cert_command in ("server", "node"):
            issued = dev_ca.issue(args.ca_dir, args.out, args.name, server=True, dns_names=tuple(args.dns),
                                 ips=tuple(args.ip), days=args.days, client_too=args.cert_command == "node")
        else:
            issued = dev_ca.issue(args.ca_dir, args.out, args.party, server=False, days=args.days)
        print(f"certificate: {issued.cert_path}\nkey (keep private): {issued.key_path}", file=sys.stderr)
        return EXIT_OK
    except XclpError as exc:
        print(f"xclp-server: error: {exc}", file=sys.stderr)
        return exit_code(exc)
    except BrokenPipeError:
        return stdout_closed()


if __name__ == "__main__":
    sys.exit(main())
