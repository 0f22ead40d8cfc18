"""The one place where xclp errors meet gRPC status codes, and the exit codes (xclp.v1.exits) (STYLE §6).

The coordinator aborts an RPC with `status_code(exc)`; a party turns a failed RPC back into an
xclp error with `error_from_rpc`; both CLIs exit with `exit_code(exc)`.
"""

from __future__ import annotations

import grpc

from xclp import errors
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.exits import (  # noqa: F401 - the exit codes, re-exported where callers look for them
    EXIT_BAD_INPUT,
    EXIT_DROPPED,
    EXIT_OK,
    EXIT_PROTOCOL,
    EXIT_REFUSED,
    EXIT_UNEXPECTED,
    exit_code,
)

# Most specific class first: the first isinstance match wins.
_STATUS: tuple[tuple[type[errors.XclpError], grpc.StatusCode], ...] = (
    (errors.NotAuthorized, grpc.StatusCode.PERMISSION_DENIED),
    (errors.InvalidSignature, grpc.StatusCode.UNAUTHENTICATED),
    (errors.ReplayRefused, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.OutOfRange, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ProtocolError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.PeerDropped, grpc.StatusCode.ABORTED),
)

_FROM_STATUS: dict[grpc.StatusCode, type[errors.XclpError]] = {
    grpc.StatusCode.PERMISSION_DENIED: errors.NotAuthorized,
    grpc.StatusCode.UNAUTHENTICATED: errors.InvalidSignature,
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidInput,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: errors.ProtocolError,
    grpc.StatusCode.NOT_FOUND: errors.InvalidInput,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
    grpc.StatusCode.ABORTED: errors.PeerDropped,
    grpc.StatusCode.CANCELLED: errors.PeerDropped,
    grpc.StatusCode.UNAVAILABLE: errors.PeerDropped,
}

# Classes a status code alone cannot carry: the coordinator names them in the trailing metadata
# (`trailing_metadata`), and a party raises that class rather than the code's.
ERROR_METADATA = "xclp-error"
_NAMED: dict[str, type[errors.XclpError]] = {cls.__name__: cls for cls in (errors.RunInterrupted,)}


def trailing_metadata(exc: errors.XclpError) -> tuple[tuple[str, str], ...]:
    """What the coordinator sends with an abort for `exc`, so that the party can tell it apart."""
    name = type(exc).__name__
    return ((ERROR_METADATA, name),) if _NAMED.get(name) is type(exc) else ()


def status_code(exc: errors.XclpError) -> grpc.StatusCode:
    for cls, code in _STATUS:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def error_from_rpc(exc: grpc.RpcError, *, where: str = "coordinator") -> errors.XclpError:
    """An xclp error carrying the coordinator's message for a failed RPC."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    cls = _FROM_STATUS.get(code, errors.ProtocolError)
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailing or ():
        named = _NAMED.get(value) if key == ERROR_METADATA and isinstance(value, str) else None
        if named is not None and issubclass(named, cls):  # never a class the status code does not allow
            return named(details)  # its message says it all
    if code == grpc.StatusCode.UNAVAILABLE:
        return cls(f"cannot reach the {where}: {details}")
    return cls(f"{where} answered {code.name}: {details}")


def ended_early(end: pb.JobEnd, party_id: str) -> errors.XclpError:
    """The error for a JobEnd other than DONE (client/session.py)."""
    if end.outcome == pb.JobEnd.REFUSED:
        return errors.InvalidInput(f"the job cannot run with the parties' data: {end.reason}")
    if end.outcome == pb.JobEnd.CANCELLED:
        return errors.RunCancelled(f"the run was cancelled: {end.reason}")
    if end.outcome == pb.JobEnd.INTERRUPTED:
        return errors.RunInterrupted(end.reason)
    if end.outcome == pb.JobEnd.DROPPED:
        return errors.PeerDropped(f"the coordinator dropped this party: {end.reason}", frozenset({party_id}))
    return errors.PeerDropped(f"the job failed: {end.reason}")
