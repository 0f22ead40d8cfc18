"""The one error hierarchy of xclp.

Every failure a user can cause or meet has its own class. `xclp.v1.status` maps them, in one
place, to gRPC status codes (the coordinator aborts an RPC with one; a party turns one back into
the error) and to the exit codes of both CLIs. Messages say what to fix.
"""

from __future__ import annotations


class XclpError(Exception):
    """Base of every error xclp raises on purpose."""


class InvalidInput(XclpError, ValueError):
    """Data or parameters are malformed: wrong shape, NaN, label out of range, bad option."""


class ConfigError(InvalidInput):
    """A configuration file or command-line setting is wrong."""


class ProtocolError(XclpError):
    """A peer or the coordinator sent something the protocol does not allow."""


class InvalidSignature(ProtocolError):
    """A signed key bundle or roster did not verify under the claimed identity key."""


class NotAuthorized(ProtocolError):
    """A party is not on the coordinator's allow-list, or acts for a party or job it was not admitted to."""


class OutOfRange(ProtocolError):
    """A decrypted or unmasked value lies outside the range the protocol guarantees."""


class PeerDropped(XclpError):
    """A party disconnected or missed a deadline; carries the ids that dropped."""

    def __init__(self, message: str, dropped: frozenset[str] = frozenset()) -> None:
        super().__init__(message)
        self.dropped = dropped


class DeadlineExceeded(PeerDropped):
    """A wait ran past its deadline."""


class ReplayRefused(ProtocolError):
    """A step was asked to run twice with the same round and participant set (fresh masks only)."""


class PolicyRefused(InvalidInput):
    """The job asks for something this party's own policy refuses (docs/design.md §2.3): too few parties,
    no or weaker DP than it requires, a hidden label mask it did not allow, small keys."""


class ResourceExhausted(InvalidInput):
    """A party sent more than the protocol allows it: a payload above the step's size, a second
    relay to the same recipient in a round, too many streams, a full mailbox."""


class RunCancelled(PeerDropped):
    """The coordinator's operator cancelled the run (or the coordinator shut down during it)."""


class RunInterrupted(PeerDropped):
    """The coordinator stopped or restarted while the run was in flight and could not go on with it:
    the run is over. The job's next run, if the coordinator opens one, starts from the beginning."""


def why_leaving(exc: BaseException) -> str:
    """What a party tells the coordinator when an error ends its part in a run: xclp's own message,
    written to name no data (a refusal, a protocol error, a deadline), or only the type of any other
    exception, whose text might hold a value, a path or a row."""
    return f"{type(exc).__name__}: {exc}" if isinstance(exc, XclpError) else type(exc).__name__
