"""Signed calls: how an operator (the Admin service) and a party (Offers, Challenge) authenticate a
request without a session (xclp.v1.Admin, docs/operating.md).

The signer serializes a `Call` — the full gRPC method, its clock in milliseconds, 16 fresh random
bytes and the request message — and signs those exact bytes with its Ed25519 key. The verifier
checks, in order: the signer is known, the signature verifies over the bytes received, the call
names this method (a signed List cannot be replayed as a Cancel), the timestamp is within
`window` seconds of the verifier's clock, and the nonce has not been seen in that window (the
caller supplies `remember(nonce, now, expires)`, which must record the nonce durably until
`expires` and say whether it was new).
Only then is the body parsed.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping

from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from google.protobuf.message import DecodeError, Message

from xclp.errors import InvalidInput, InvalidSignature, ReplayRefused
from xclp.v1 import xclp_pb2 as pb

CALL_TAG = b"xclp-call-v1\x00"
NONCE_BYTES = 16
WINDOW_SECONDS = 300.0  # clock skew tolerated; nonces are remembered this long (and a little more)
MAX_CALL_BYTES = 1 << 20  # a job file is a few kB

ADMIN_SUBMIT = "/xclp.v1.Admin/Submit"
ADMIN_LIST = "/xclp.v1.Admin/List"
ADMIN_SHOW = "/xclp.v1.Admin/Show"
ADMIN_CANCEL = "/xclp.v1.Admin/Cancel"
OFFERS = "/xclp.v1.Coordinator/Offers"
CHALLENGE = "/xclp.v1.Coordinator/Challenge"
DECLINE = "/xclp.v1.Coordinator/Decline"


def sign_call(key: Ed25519PrivateKey, signer: str, method: str, body: Message, *,
              clock: Callable[[], float] = time.time) -> pb.SignedCall:
    call = pb.Call(method=method, timestamp_ms=int(clock() * 1000), nonce=secrets.token_bytes(NONCE_BYTES),
                   body=body.SerializeToString(deterministic=True))
    data = call.SerializeToString(deterministic=True)
    return pb.SignedCall(signer=signer, call=data, signature=key.sign(CALL_TAG + data))


class CallVerifier:
    """Checks SignedCalls against `keys` (signer -> 32-byte Ed25519 public key)."""

    def __init__(self, keys: Mapping[str, bytes], remember: Callable[[bytes, float, float], bool], *,
                 window: float = WINDOW_SECONDS, clock: Callable[[], float] = time.time, who: str = "signer",
                 known_as: str = "known to this coordinator") -> None:
        self.keys = keys
        self.remember = remember
        self.window = window
        self.clock = clock
        self.who = who
        self.known_as = known_as

    def open(self, signed: pb.SignedCall, method: str, body: Message) -> str:
        """Verify `signed` as a call of `method`; parse its body into `body`; return the signer."""
        if len(signed.call) > MAX_CALL_BYTES:
            raise InvalidInput(f"the signed call has {len(signed.call)} bytes; at most {MAX_CALL_BYTES}")
        # One answer whether the signer is unknown or the key is another: a caller who
        # cannot sign learns nothing of who is known here.
        public = self.keys.get(signed.signer)
        try:
            if public is None:
                raise _CryptoInvalidSignature
            Ed25519PublicKey.from_public_bytes(public).verify(signed.signature, CALL_TAG + signed.call)
        except _CryptoInvalidSignature:
            raise InvalidSignature(f"the call's signature does not verify under an identity key {self.known_as} "
                                   f"for {self.who} {signed.signer!r} (an unknown {self.who}, or another key)") \
                from None
        call = pb.Call()
        try:
            call.ParseFromString(signed.call)
        except DecodeError:
            raise InvalidInput("the signed call is not a serialized Call") from None
        if call.method != method:
            raise InvalidSignature(f"the call was signed for {call.method!r}, not {method!r}")
        now = self.clock()
        skew = call.timestamp_ms / 1000 - now
        if abs(skew) > self.window:
            raise ReplayRefused(f"the call's timestamp is {skew:+.0f} s from the coordinator's clock (at most "
                                f"±{self.window:.0f} s): check the clocks, and sign a fresh call")
        if len(call.nonce) != NONCE_BYTES:
            raise InvalidInput(f"the call's nonce must be {NONCE_BYTES} bytes")
        if not self.remember(call.nonce, now, now + 2 * self.window):
            raise ReplayRefused("the call's nonce was used before (a replayed call)")
        try:
            body.ParseFromString(call.body)
        except DecodeError:
            raise InvalidInput(f"the body of the {method} call is malformed") from None
        return signed.signer
