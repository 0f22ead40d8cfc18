"""What this party accepted as public, hashed (docs/design.md §2.5): the party's transcript of a scope.

A coordinator that shows parties different public values (specs, layouts, models, seeds) can make
their contributions mean different things, or cancel masks over rows that belong to nobody.
So each party hashes every public value it accepts, and before it releases anything that opens a
sum it signs that hash (client/phases/masked_sum.py) and reveals only if every member of the sum
signed the same one. The hash is also in the HKDF info of every pairwise mask it draws, so parties
with different views never have cancelling masks either.

A transcript starts from its parent's hash (the job's: the run's session id, which binds every
signed key bundle: spec digests and row counts; a training round's: the job's hash when the round
opened) and holds one value per label. It is a hash over the sorted labels, not a chain, so the
order in which messages arrive (a round's seed before or after its model) does not matter; a
label given two different values is refused at once.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from xclp.errors import ProtocolError
from xclp.v1 import wire

_TAG = b"xclp/v1/transcript"


def _field(data: bytes) -> bytes:
    return struct.pack(">Q", len(data)) + data


def payload_digest(payload: wire.Payload) -> bytes:
    """SHA-256 of a payload with its dtype and shape (an array) or as opaque bytes."""
    h = hashlib.sha256()
    if isinstance(payload, np.ndarray):
        h.update(_field(payload.dtype.str.encode()) + _field(struct.pack(f">{payload.ndim}Q", *payload.shape)))
        h.update(np.ascontiguousarray(payload).tobytes())
    else:
        h.update(_field(b"bytes") + bytes(payload))
    return h.digest()


class Transcript:
    def __init__(self, parent: bytes, scope: str = "job") -> None:
        self._base = hashlib.sha256(_TAG + _field(parent) + _field(scope.encode())).digest()
        self._values: dict[str, bytes] = {}

    def absorb(self, label: str, payload: wire.Payload) -> bytes:
        """Accept `payload` as the public value `label` of this scope; returns its digest."""
        digest = payload_digest(payload)
        seen = self._values.setdefault(label, digest)
        if seen != digest:
            raise ProtocolError(f"the coordinator sent two different values of {label!r}")
        return digest

    def state(self) -> dict[str, object]:
        """What `restored` takes back (a party's run state, client/run_state.py)."""
        return {"base": self._base.hex(), "values": {k: v.hex() for k, v in self._values.items()}}

    @classmethod
    def restored(cls, parent: bytes, state: dict[str, object], scope: str = "job") -> Transcript:
        """The transcript `state` describes, checked to start from `parent` in `scope`."""
        out = cls(parent, scope)
        out.take(state)
        return out

    def take(self, state: dict[str, object]) -> None:
        """The values `state` held, checked to be of this transcript's session and scope (a training
        round opened again by a restarted process: what its XCLP absorbed before its update)."""
        values = state.get("values")
        if state.get("base") != self._base.hex() or not isinstance(values, dict):
            raise ProtocolError("a saved transcript of another session")
        self._values = {str(k): bytes.fromhex(v) for k, v in values.items()}

    @property
    def digest(self) -> bytes:
        h = hashlib.sha256(self._base)
        for label in sorted(self._values):
            h.update(_field(label.encode()) + self._values[label])
        return h.digest()

    def child(self, scope: str) -> Transcript:
        """A sub-scope's transcript (a training round), starting from this one's hash now."""
        return Transcript(self.digest, scope)
