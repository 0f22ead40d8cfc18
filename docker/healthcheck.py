"""Docker HEALTHCHECK for xclp containers (copied into the image as /opt/xclp/healthcheck.py).

A container that runs no `xclp-server serve` (a party, an agent, a one-off `ca init`) has no port
and is healthy. A coordinator is asked over gRPC: the standard health service (grpc.health.v1)
must answer SERVING for xclp.v1.Coordinator. TLS is verified against the first CA certificate
found of $XCLP_HEALTH_CA, certs/ca.pem, ca/ca.pem (in the working directory), with the name
$XCLP_HEALTH_SERVER_NAME (default localhost); a coordinator serving --insecure is asked in
plaintext. Without any CA file the check falls back to a TCP connect to the port.

Port: $XCLP_HEALTH_PORT if set, else the port of `serve --listen host:port`, else 50051.
"""

import os
import socket
import sys


def serve_argv():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a.endswith("xclp-server") for a in argv) and "serve" in argv:
            return argv
    return None


def main() -> int:
    argv = serve_argv()
    if argv is None:
        return 0
    port = "50051"
    for i, arg in enumerate(argv):
        if arg == "--listen" and i + 1 < len(argv):
            port = argv[i + 1].rsplit(":", 1)[-1]
        elif arg.startswith("--listen="):
            port = arg.rsplit(":", 1)[-1]
    port = os.environ.get("XCLP_HEALTH_PORT") or port
    candidates = [os.environ.get("XCLP_HEALTH_CA", ""), "certs/ca.pem", "ca/ca.pem"]
    ca = next((c for c in candidates if c and os.path.isfile(c)), None)
    if ca is None and "--insecure" not in argv:
        try:
            socket.create_connection(("127.0.0.1", int(port)), timeout=3).close()
        except (OSError, ValueError) as exc:
            return f"coordinator port {port} does not accept connections: {exc}"
        return 0
    import grpc

    from xclp.server.health import check

    insecure = "--insecure" in argv
    ca_pem = None
    if not insecure:
        with open(ca, "rb") as fh:
            ca_pem = fh.read()
    try:
        status = check(f"localhost:{port}", ca=ca_pem, insecure=insecure, timeout=4,
                       server_name=os.environ.get("XCLP_HEALTH_SERVER_NAME", "localhost"))
    except grpc.RpcError as exc:
        return f"coordinator on port {port} does not answer the gRPC health check: {exc.code().name}: {exc.details()}"
    if status != "SERVING":
        return f"coordinator on port {port} is {status}"
    return 0


if __name__ == "__main__":
    sys.exit(main())
