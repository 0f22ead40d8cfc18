"""The gRPC servicer: authenticate, validate and route; no protocol logic lives here (docs/design.md §3).

Join admits a party; Pull drains its mailbox; Push reassembles frames into validated messages
and hands each to its job; Offers tells a party agent, by a call it signed, which runs wait for it.
The standard gRPC health service (server/health.py) answers on the same port. Anything malformed
is answered with INVALID_ARGUMENT for that call only; the coordinator goes on serving every other
party and job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health_pb2_grpc

from xclp.crypto.identity import KeyBundle
from xclp.errors import InvalidInput, NotAuthorized, ResourceExhausted, XclpError
from xclp.server import liveness
from xclp.server.config import TlsFiles
from xclp.server.coordinator import Coordinator
from xclp.server.health import serving_health
from xclp.server.mailbox import MAX_PUSH_STREAMS, Superseded
from xclp.server.status import abort, abort_on_error
from xclp.v1 import calls, wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1 import xclp_pb2_grpc as pb_grpc
from xclp.v1.transport import JOB_METADATA, RECEIVED_METADATA, SERVER_OPTIONS, TOKEN_METADATA

log = logging.getLogger("xclp.server")

POLL_SECONDS = 0.5
def _check_client_name(context: grpc.ServicerContext, party_id: str) -> None:
    """With mutual TLS, the client certificate's common name must be the party it speaks for."""
    names = context.auth_context().get("x509_common_name")
    if names and party_id.encode() not in names:
        raise NotAuthorized(f"the client certificate is for {names[0].decode(errors='replace')!r}, not party "
                            f"{party_id!r}")


def _metadata(context: grpc.ServicerContext) -> dict[str, str | bytes]:
    return dict(context.invocation_metadata())


def _received(context: grpc.ServicerContext) -> int:
    """The highest item of its Pull stream a party says it has (a Push call's metadata), or 0."""
    value = _metadata(context).get(RECEIVED_METADATA, "")
    try:
        return max(0, int(value)) if isinstance(value, str) and len(value) <= 20 else 0
    except ValueError:
        return 0


class CoordinatorService(pb_grpc.CoordinatorServicer):
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.offer_calls = calls.CallVerifier(coordinator.allow_list, coordinator.store.remember_nonce, who="party",
                                              known_as="on the coordinator's allow-list")

    @abort_on_error
    def Offers(self, request: pb.SignedCall, context: grpc.ServicerContext) -> pb.OfferList:
        party_id = self.offer_calls.open(request, calls.OFFERS, pb.OffersRequest())
        _check_client_name(context, party_id)
        return pb.OfferList(offers=self.coordinator.offers(party_id))

    @abort_on_error
    def Challenge(self, request: pb.SignedCall, context: grpc.ServicerContext) -> pb.ChallengeResponse:
        body = pb.ChallengeRequest()
        party_id = self.offer_calls.open(request, calls.CHALLENGE, body)
        _check_client_name(context, party_id)
        return self.coordinator.challenge(party_id, body)

    @abort_on_error
    def Decline(self, request: pb.SignedCall, context: grpc.ServicerContext) -> pb.DeclineAck:
        body = pb.DeclineRequest()
        party_id = self.offer_calls.open(request, calls.DECLINE, body)
        _check_client_name(context, party_id)
        self.coordinator.decline(party_id, body)
        return pb.DeclineAck()

    @abort_on_error
    def Join(self, request: pb.JoinRequest, context: grpc.ServicerContext) -> pb.JoinResponse:
        if not request.HasField("bundle") or not request.HasField("summary"):
            raise InvalidInput("Join needs a signed key bundle and a data summary")
        _check_client_name(context, KeyBundle.from_bytes(request.bundle.bundle).party_id)
        return self.coordinator.join(request)

    def Pull(self, request: pb.PullRequest, context: grpc.ServicerContext) -> Iterator[pb.PullItem]:
        try:
            token = _metadata(context).get(TOKEN_METADATA)
            job, party_id = self.coordinator.authenticate(token if isinstance(token, bytes) else None, request.job_id)
            _check_client_name(context, party_id)
            party, stream = liveness.attach(job, party_id, resume=request.resume, received=request.received,
                                            restarted=request.restarted)
        except XclpError as exc:
            abort(context, exc)
        # The RPC ending for any reason other than our JobEnd is a disconnect: a dropout, or, for a
        # party that can resume, a lost connection it has reconnect_seconds to come back from.
        context.add_callback(lambda: job.disconnected(party_id, stream))
        metrics = self.coordinator.metrics
        if metrics is not None:
            metrics.connected.inc()
            context.add_callback(metrics.connected.dec)
        mailbox = party.mailbox
        while context.is_active():
            try:
                item = mailbox.get(POLL_SECONDS, stream)
            except Superseded:  # the party resumed on a new stream: this one is over, and no dropout
                return
            if item is None:
                continue
            if item.HasField("end"):
                party.end_delivered = True  # before the yield: the client may cancel as soon as it has it
                yield item
                return
            yield item

    def Push(self, request_iterator: Iterator[pb.Frame], context: grpc.ServicerContext) -> pb.PushAck:
        try:
            job_id = _metadata(context).get(JOB_METADATA, "")
            token = _metadata(context).get(TOKEN_METADATA)
            job, party_id = self.coordinator.authenticate(
                token if isinstance(token, bytes) else None, job_id if isinstance(job_id, str) else ""
            )
            _check_client_name(context, party_id)
            party = job.parties.get(party_id)
            if party is None:
                raise NotAuthorized(f"party {party_id!r} has no open place in job {job.config.job_id!r}")
            mailbox = party.mailbox
            mailbox.confirm(_received(context))
            with job.lock:
                if mailbox.pushes >= MAX_PUSH_STREAMS:
                    raise ResourceExhausted(f"party {party_id!r} already has {MAX_PUSH_STREAMS} Push streams open")
                mailbox.pushes += 1
            try:
                assembler = wire.Assembler(budget=mailbox.partials)
                frames = total = 0
                for frame in request_iterator:
                    if frame.job_id != job.config.job_id:
                        raise InvalidInput(f"frame for job {frame.job_id!r} on a Push stream of job "
                                           f"{job.config.job_id!r}")
                    if frame.sender != party_id:
                        raise NotAuthorized(f"party {party_id!r} may not send frames as {frame.sender!r}")
                    frames += 1
                    total += len(frame.data)
                    party.heard_at = job.clock()  # a sign of life, however long its message (server/liveness.py)
                    if frame.message_id in mailbox.pushed:  # sent again after a lost connection: it has it
                        continue
                    message = assembler.add(frame, limit=job.payload_limit(party_id, frame.step, frame.recipient,
                                                                             frame.round))
                    if message is not None and mailbox.first_delivery(frame.message_id):
                        job.message(party_id, message)
                if assembler.pending:
                    raise InvalidInput(f"the Push stream ended with {assembler.pending} incomplete message(s)")
                return pb.PushAck(frames=frames, bytes=total)
            finally:
                assembler.close()
                with job.lock:
                    mailbox.pushes -= 1
        except XclpError as exc:
            log.warning("Push refused: %s", exc)
            abort(context, exc)
        except grpc.RpcError:  # the transport ended the call (e.g. a frame over the message size limit)
            log.warning("a Push stream was ended by the transport (a frame over the size limit, or the party left)")
            return pb.PushAck()
        except Exception:
            log.exception("Push failed")
            context.abort(grpc.StatusCode.INTERNAL, "internal error on the coordinator (see its log)")
        raise AssertionError("unreachable")


def build_server(coordinator: Coordinator, address: str, *, tls: TlsFiles | None,
                 max_workers: int = 64) -> tuple[grpc.Server, int]:
    """A gRPC server bound to `address` (port 0 = any free port); returns it and the bound port.

    `tls=None` means plaintext — only for `--insecure`, which the CLI logs loudly.
    """
    server = grpc.server(ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="xclp-rpc"),
                         options=SERVER_OPTIONS)
    pb_grpc.add_CoordinatorServicer_to_server(CoordinatorService(coordinator), server)
    health_pb2_grpc.add_HealthServicer_to_server(serving_health(), server)
    if tls is None:
        port = server.add_insecure_port(address)
    else:
        key, cert, client_ca = tls.read()
        credentials = grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )
        port = server.add_secure_port(address, credentials)
    if port == 0:
        raise InvalidInput(f"cannot listen on {address}")
    return server, port

