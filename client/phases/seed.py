"""The common seed on the party's side (docs/design.md §4.3); its counterpart is server/phases/seed.py.

The leader (the smallest id of the step's participants) draws 32 bytes from the OS CSPRNG and
seals them to each other participant under the pair's "seed" key (HKDF from the pairwise X25519
secret, bound to the attempt and its participants), with the session id and the step in the AAD;
every other participant opens the leader's seal. Each acknowledges with an empty payload. The
coordinator relays the seals and never learns the seed.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from xclp.client.context import Progress, Pusher
from xclp.errors import ProtocolError
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.relay import Relay
from xclp.v1.steps import SEED_BYTES, SEED_PURPOSE, SEED_STEP


class SeedParty:
    def __init__(self, party_id: str, session_id: bytes, pair_secrets: Mapping[str, bytes], conn: Pusher,
                 progress: Progress) -> None:
        self.party_id = party_id
        self.session_id = session_id
        self.pair_secrets = pair_secrets
        self.conn = conn
        self.progress = progress
        self.step: pb.StepStart | None = None  # the attempt this party waits in for the leader's seal
        self.sealed: dict[tuple[int, str], wire.Payload] = {}  # (attempt, sender) -> seal, until its step starts
        self.seed: bytes | None = None
        self.participants: tuple[str, ...] = ()

    def on_step(self, step: pb.StepStart) -> None:
        self.step = step
        if step.participants[0] == self.party_id:
            self._lead(step)
        else:
            self._try_open()

    def on_message(self, message: wire.Message) -> None:
        self.sealed[(message.round, message.sender)] = message.payload
        self._try_open()

    def _relay(self, step: pb.StepStart, sender: str, recipient: str) -> Relay:
        """The sealed seed's binding (xclp.v1.relay, docs/design.md §2.2)."""
        return Relay.of(SEED_PURPOSE, SEED_STEP, step.round, step.participants, sender, recipient)

    def _lead(self, step: pb.StepStart) -> None:
        seed = secrets.token_bytes(SEED_BYTES)
        for peer in step.participants[1:]:
            sealed = self._relay(step, self.party_id, peer).seal(self.pair_secrets[peer], self.session_id, seed)
            self.conn.push(sealed, sender=self.party_id, step=SEED_STEP, round=step.round, recipient=peer)
        self._have(seed, step)
        self.progress(f"drew the common seed and sent it sealed to {len(step.participants) - 1} parties")

    def _try_open(self) -> None:
        step = self.step
        if step is None:
            return
        leader = step.participants[0]
        sealed = self.sealed.pop((step.round, leader), None)
        if sealed is None:
            return
        if not isinstance(sealed, bytes):
            raise ProtocolError("the sealed seed must be opaque bytes")
        seed = self._relay(step, leader, self.party_id).open(self.pair_secrets[leader], self.session_id, sealed)
        if len(seed) != SEED_BYTES:
            raise ProtocolError(f"the common seed must be {SEED_BYTES} bytes")
        self._have(seed, step)
        self.progress(f"common seed received from {leader}")

    def restore(self, seed: bytes, participants: tuple[str, ...]) -> None:
        """The seed this party had before its process restarted (client/membership.py)."""
        if len(seed) != SEED_BYTES:
            raise ProtocolError(f"the common seed must be {SEED_BYTES} bytes")
        self.seed, self.step, self.participants = seed, None, participants

    def _have(self, seed: bytes, step: pb.StepStart) -> None:
        self.seed, self.step, self.participants = seed, None, tuple(step.participants)
        self.conn.push(b"", sender=self.party_id, step=SEED_STEP, round=step.round)
