"""The operator's API (`xclp.v1.Admin`) on its own listen address, loopback by default.

Every call is a SignedCall (xclp.v1.calls) by an operator key listed in the server config's
`[operators]` table: the signature covers the method, a timestamp within ±5 minutes and a nonce
the coordinator keeps (in the state store) until the timestamp could no longer pass, so a call
cannot be replayed, even across a restart. Errors go back to the caller only; the coordinator
logs who asked for what, never a job's parameters.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import grpc

from xclp.errors import ConfigError, InvalidInput
from xclp.server.config import TlsFiles
from xclp.server.coordinator import Coordinator
from xclp.server.status import abort_on_error
from xclp.v1 import calls
from xclp.v1 import xclp_pb2 as pb
from xclp.v1 import xclp_pb2_grpc as pb_grpc

log = logging.getLogger("xclp.server")
MAX_LIST = 1000


class AdminService(pb_grpc.AdminServicer):
    def __init__(self, coordinator: Coordinator, operators: Mapping[str, bytes]) -> None:
        self.coordinator = coordinator
        self.verifier = calls.CallVerifier(operators, coordinator.store.remember_nonce, who="operator")

    @abort_on_error
    def Submit(self, request: pb.SignedCall, context: grpc.ServicerContext) -> pb.RunInfo:
        body = pb.SubmitRequest()
        operator = self.verifier.open(request, calls.ADMIN_SUBMIT, body)
        run_id = self.coordinator.submit(body.job_toml, body.file_name or "submitted job", operator)
        return self.coordinator.run_info(run_id)

    @abort_on_error
    def List(self, request: pb.SignedCall, context: grpc.ServicerContext) -> pb.RunList:
        body = pb.ListRequest()
        self.verifier.open(request, calls.ADMIN_LIST, body)
        return pb.RunList(runs=self.coordinator.list_runs(body.job_id, min(body.limit or 50, MAX_LIST)))

    @abort_on_error
    def Show(self, request: pb.SignedCall, context: grpc.ServicerContext) -> pb.RunInfo:
        body = pb.ShowRequest()
        self.verifier.open(request, calls.ADMIN_SHOW, body)
        return self.coordinator.run_info(body.run_id)

    @abort_on_error
    def Cancel(self, request: pb.SignedCall, context: grpc.ServicerContext) -> pb.RunInfo:
        body = pb.CancelRequest()
        operator = self.verifier.open(request, calls.ADMIN_CANCEL, body)
        if len(body.reason) > 500:
            raise InvalidInput("the cancel reason is limited to 500 characters")
        self.coordinator.cancel(body.run_id, operator, body.reason)
        log.info("operator %s cancelled run %s", operator, body.run_id)
        return self.coordinator.run_info(body.run_id)


def is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_admin_server(coordinator: Coordinator, operators: Mapping[str, bytes], address: str, *,
                       tls: TlsFiles | None) -> tuple[grpc.Server, int]:
    """The Admin service on `address`: plaintext on loopback; anywhere else only with TLS."""
    if not operators:
        raise ConfigError("the Admin API needs at least one operator key: add [operators] name = \"ed25519:...\" "
                          "to the server config (make a key with `xclp-server operator keygen`)")
    server = grpc.server(ThreadPoolExecutor(max_workers=8, thread_name_prefix="xclp-admin"))
    pb_grpc.add_AdminServicer_to_server(AdminService(coordinator, operators), server)
    if is_loopback(address):
        port = server.add_insecure_port(address)
    elif tls is None:
        raise ConfigError(f"--admin-listen {address} is not a loopback address: the Admin API leaves the host "
                          "only over TLS (give --tls-cert and --tls-key)")
    else:
        key, cert, _ = tls.read()
        port = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
    if port == 0:
        raise ConfigError(f"cannot listen on {address}")
    return server, port
