"""Turning xclp errors into gRPC aborts on the coordinator (the mapping itself: xclp/v1/status.py)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

import grpc

from xclp.errors import XclpError
from xclp.v1.status import status_code, trailing_metadata

log = logging.getLogger("xclp.server")
F = TypeVar("F", bound=Callable[..., Any])


def abort(context: grpc.ServicerContext, exc: XclpError) -> None:
    """End the call with `exc`'s status code and message (and, where the code alone cannot say it,
    its class: xclp/v1/status.py); raises, as `context.abort` does."""
    named = trailing_metadata(exc)
    if named:
        context.set_trailing_metadata(named)
    context.abort(status_code(exc), str(exc))


def abort_on_error(method: F) -> F:
    """Wrap a unary handler: an XclpError becomes its status code, anything else INTERNAL.

    The coordinator keeps serving everyone else either way; the message goes only to the caller.
    """

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except XclpError as exc:
            log.warning("%s refused: %s", method.__name__, exc)
            abort(context, exc)
        except Exception:
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, "internal error on the coordinator (see its log)")

    return cast(F, wrapper)  # functools.wraps keeps the signature; mypy cannot see it
