"""The exit codes of xclp-server and xclp-client, and which error exits with which (STYLE §6).

Apart from xclp.v1.status (which re-exports them) so that a command line can name them without
importing gRPC.
"""

from __future__ import annotations

from xclp import errors

# Exit codes of xclp-server and xclp-client.
EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_BAD_INPUT = 2  # fix the data, flags or config file
EXIT_PROTOCOL = 3  # a peer or the coordinator broke the protocol
EXIT_REFUSED = 4  # not admitted / signature or token wrong
EXIT_DROPPED = 5  # this party, a peer or the coordinator dropped or missed a deadline
_EXIT: tuple[tuple[type[errors.XclpError], int], ...] = (
    (errors.NotAuthorized, EXIT_REFUSED),
    (errors.InvalidSignature, EXIT_REFUSED),
    (errors.InvalidInput, EXIT_BAD_INPUT),
    (errors.ProtocolError, EXIT_PROTOCOL),
    (errors.PeerDropped, EXIT_DROPPED),
)


EXIT_STDOUT_CLOSED = 128 + 13  # stdout was closed under us (`| head -1`): as a process killed by SIGPIPE


def stdout_closed() -> int:
    """The reader of stdout went away (`xclp-server job list | head -1`): stop quietly, with no
    traceback at exit either (the interpreter's last flush would hit the closed pipe again)."""
    import os
    import sys

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_STDOUT_CLOSED


def exit_code(exc: BaseException) -> int:
    for cls, code in _EXIT:
        if isinstance(exc, cls):
            return code
    return EXIT_UNEXPECTED
