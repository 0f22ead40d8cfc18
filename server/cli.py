"""`xclp-server`: run the coordinator, and make a development CA and certificates (DESIGN §8).

    xclp-server ca init --dir ca/
    xclp-server cert server --ca-dir ca/ --out certs/ --dns coordinator.example.org --ip 10.0.0.5
    xclp-server cert party --ca-dir ca/ --out certs/ --party hospital-a       # for mutual TLS
    xclp-server serve --listen 0.0.0.0:50051 --allow-list allow.toml --job flynn.toml \\
        --tls-cert certs/server.pem --tls-key certs/server-key.pem

Settings come from flags or `--config server.toml` (same names, underscores; flags win).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from xclp.crypto import certs
from xclp.runtime import read_toml
from xclp.crypto.identity import load_allow_list
from xclp.server.config import TlsFiles, load_job
from xclp.server.coordinator import Coordinator
from xclp.server.service import build_server
from xclp.errors import ConfigError, XclpError
from xclp.v1.status import EXIT_OK, exit_code

log = logging.getLogger("xclp.server")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xclp-server", description="The xclp coordinator and its certificate helpers.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the coordinator", description="Run the coordinator: admit allow-listed "
                       "parties, run the configured jobs, relay and aggregate. TLS unless --insecure.")
    s.add_argument("--config", type=Path, help="server TOML file (keys as the flags below, with underscores)")
    s.add_argument("--listen", help="address to listen on, host:port (default 0.0.0.0:50051; port 0 = any free port)")
    s.add_argument("--allow-list", type=Path, help="TOML file: [parties] party-id = \"ed25519:<base64>\"")
    s.add_argument("--job", type=Path, action="append", help="job TOML file (repeat for several jobs)")
    s.add_argument("--tls-cert", type=Path, help="server certificate (PEM)")
    s.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    s.add_argument("--client-ca", type=Path, help="CA certificate (PEM) of party client certificates: turns on mutual TLS")
    s.add_argument("--insecure", action="store_true", default=None, help="plaintext gRPC (testing only; never across networks)")
    s.add_argument("--port-file", type=Path, help="write the bound port to this file once listening")
    s.add_argument("--exit-when-done", action="store_true", default=None, help="exit once every job is done or failed")
    s.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")

    ca = sub.add_parser("ca", help="development certificate authority").add_subparsers(dest="ca_command", required=True)
    init = ca.add_parser("init", help="create ca.pem and ca-key.pem (0600) in --dir")
    init.add_argument("--dir", type=Path, required=True, help="directory for the CA files")
    init.add_argument("--days", type=int, default=3650, help="validity in days (default 3650)")

    cert = sub.add_parser("cert", help="issue certificates from the development CA").add_subparsers(dest="cert_command", required=True)
    srv = cert.add_parser("server", help="server certificate with DNS/IP subject alternative names")
    srv.add_argument("--ca-dir", type=Path, required=True, help="directory holding ca.pem and ca-key.pem")
    srv.add_argument("--out", type=Path, required=True, help="output directory (writes <name>.pem, <name>-key.pem)")
    srv.add_argument("--name", default="server", help="file name and common name (default server)")
    srv.add_argument("--dns", action="append", default=[], help="DNS name the parties dial (repeatable)")
    srv.add_argument("--ip", action="append", default=[], help="IP address the parties dial (repeatable)")
    srv.add_argument("--days", type=int, default=825, help="validity in days (default 825)")
    party = cert.add_parser("party", help="client certificate for a party (mutual TLS)")
    party.add_argument("--ca-dir", type=Path, required=True, help="directory holding ca.pem and ca-key.pem")
    party.add_argument("--out", type=Path, required=True, help="output directory (writes <party>.pem, <party>-key.pem)")
    party.add_argument("--party", required=True, help="party id (the certificate's common name)")
    party.add_argument("--days", type=int, default=825, help="validity in days (default 825)")
    return p


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """Flags over the TOML file; TOML paths are relative to the TOML file."""
    merged: dict[str, Any] = {}
    if args.config is not None:
        raw = read_toml(args.config)
        base = args.config.parent
        tls = raw.pop("tls", {})
        known = {"listen", "allow_list", "jobs", "insecure", "port_file", "exit_when_done"}
        extra = sorted(set(raw) - known)
        if extra:
            raise ConfigError(f"{args.config}: unknown key(s) {', '.join(extra)}; known: {', '.join(sorted(known))}, [tls]")
        for key in ("allow_list", "port_file"):
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
    cfg = _settings(args)
    if not cfg.get("allow_list"):
        raise ConfigError("serve needs --allow-list (or allow_list in --config)")
    if not cfg.get("job"):
        raise ConfigError("serve needs at least one --job file (or jobs in --config)")
    insecure = bool(cfg.get("insecure"))
    tls = None
    if not insecure:
        if not cfg.get("tls_cert") or not cfg.get("tls_key"):
            raise ConfigError("TLS needs --tls-cert and --tls-key (make them with `xclp-server cert server`), "
                              "or pass --insecure for a local test")
        tls = TlsFiles(Path(cfg["tls_cert"]), Path(cfg["tls_key"]), None if not cfg.get("client_ca") else Path(cfg["client_ca"]))
    coordinator = Coordinator(load_allow_list(cfg["allow_list"]), [load_job(p) for p in cfg["job"]])
    server, port = build_server(coordinator, cfg.get("listen") or "0.0.0.0:50051", tls=tls)
    if insecure:
        log.warning("*** INSECURE: serving plaintext gRPC without TLS; session tokens and payloads are exposed "
                    "to the network. Use only on localhost for testing. ***")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server.start()
    coordinator.start()
    mode = "plaintext" if insecure else ("mutual TLS" if tls and tls.client_ca else "TLS")
    log.info("listening on port %d (%s); jobs: %s", port, mode, ", ".join(coordinator.jobs))
    if cfg.get("port_file"):
        Path(cfg["port_file"]).write_text(f"{port}\n")
    while not stop.wait(0.5):
        if cfg.get("exit_when_done") and coordinator.all_finished():
            stop.wait(1.0)  # let the last Pull streams deliver their JobEnd
            break
    log.info("shutting down")
    coordinator.stop()
    server.stop(grace=2).wait()
    failed = [j for j, job in coordinator.jobs.items() if job.stage.value == "failed"]
    if failed:
        log.warning("jobs that failed: %s", ", ".join(failed))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "INFO").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            return serve(args)
        if args.command == "ca":
            issued = certs.init_ca(args.dir, days=args.days)
            print(f"CA certificate: {issued.cert_path}\nCA key (keep private): {issued.key_path}", file=sys.stderr)
            return EXIT_OK
        if args.cert_command == "server":
            issued = certs.issue(args.ca_dir, args.out, args.name, server=True, dns_names=tuple(args.dns),
                                 ips=tuple(args.ip), days=args.days)
        else:
            issued = certs.issue(args.ca_dir, args.out, args.party, server=False, days=args.days)
        print(f"certificate: {issued.cert_path}\nkey (keep private): {issued.key_path}", file=sys.stderr)
        return EXIT_OK
    except XclpError as exc:
        print(f"xclp-server: error: {exc}", file=sys.stderr)
        return exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
