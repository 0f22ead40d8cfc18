"""The coordinator's gRPC health (grpc.health.v1): what it serves, and the one check that
`xclp-server health` and the Docker health check (docker/healthcheck.py) make of it."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVICE = "xclp.v1.Coordinator"


def serving_health() -> health.HealthServicer:
    """SERVING for the server as a whole ("") and for the Coordinator service."""
    servicer = health.HealthServicer()
    for service in ("", SERVICE):
        servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    return servicer


def check(target: str, *, ca: bytes | None, server_name: str | None = None, insecure: bool = False,
          timeout: float = 5.0) -> str:
    """The Coordinator's serving status at `target` ("SERVING", ...); grpc.RpcError if it does not answer.
    TLS unless `insecure`, verified with `ca` (None: the system roots) for `server_name`."""
    if insecure:
        channel = grpc.insecure_channel(target)
    else:
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(ca), options=options)
    try:
        request = health_pb2.HealthCheckRequest(service=SERVICE)
        reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout)
    finally:
        channel.close()
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
