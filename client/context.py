"""What a party's job runs with once the roster is verified and the common seed agreed.

A `PartyContext` is the party's side of a scope (server/phases/base.py): its id and the roster,
the job's parameters and the party's prepared data, the scope's seed, the pairwise masker under
the scope's session id, a pusher that names steps in the scope, and where progress lines go. A
training round makes a round context of the job's (`round_scope`); XCLP runs the same code in
either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from xclp.client.jobs.estimate import WorkLimits
from xclp.client.ledger import RunAccount
from xclp.client.transcript import Transcript
from xclp.crypto.identity import Roster
from xclp.crypto.masking import PairwiseMasker
from xclp.crypto.paillier import PaillierKeypair
from xclp.data.party_table import PartyData
from xclp.errors import ProtocolError
from xclp.fedavg import round_seed
from xclp.v1 import training, wire
from xclp.v1.params import JobParams

Progress = Callable[[str], None]
P = TypeVar("P", bound=JobParams)


class RelayedPhase(Protocol):
    """A phase of the party's program that takes messages of its own (a masked sum: the
    coordinator's relays of every member's confirmations, vectors or seeds, and peers' sealed seed
    shares): a job lists them (PartyJob.phases), and the session routes each such message, and its
    payload limit, to the one that `receives` its wire name."""

    def receives(self, step: str) -> bool: ...

    def on_relay(self, message: wire.Message) -> None: ...

    def payload_limit(self, step: str, sender: str) -> int: ...


def _unsigned(data: bytes) -> bytes:
    raise ProtocolError("this party context has no identity key to sign with")


class Pusher(Protocol):
    def push(self, payload: wire.Payload, *, sender: str, step: str, round: int, recipient: str = "") -> int: ...

    def push_all(self, messages: Sequence[wire.Outgoing], *, sender: str) -> int: ...


@dataclass(frozen=True)
class ScopedPusher:
    """Pushes under a scope's step names ("update" -> "r3.update")."""

    conn: Pusher
    prefix: str

    def push(self, payload: wire.Payload, *, sender: str, step: str, round: int, recipient: str = "") -> int:
        return self.conn.push(payload, sender=sender, step=self.prefix + step, round=round, recipient=recipient)

    def push_all(self, messages: Sequence[wire.Outgoing], *, sender: str) -> int:
        return self.conn.push_all([dataclasses.replace(m, step=self.prefix + m.step) for m in messages], sender=sender)


@dataclass(frozen=True)
class PartyContext:
    party_id: str
    params: JobParams
    data: PartyData  # as prepared (docs/design.md §8)
    roster: Roster
    seed: bytes  # the scope's seed: the job's common seed, or a round's (xclp.fedavg.round_seed)
    masker: PairwiseMasker  # pairwise masks under the scope's session id
    conn: Pusher  # names steps in the scope
    progress: Progress
    prefix: str = ""  # the scope's step-name prefix on the wire ("" for the job, "r3." for round 3)
    keypair: PaillierKeypair | None = None  # published in this party's bundle, if the job uses Paillier
    executor: Executor | None = None  # where Paillier work runs (None: in this process)
    work_limits: WorkLimits = WorkLimits()  # refuse Paillier work estimated to take longer
    max_memory_bytes: int = 0  # refuse a layout whose estimated memory is larger (0: no limit)
    # docs/design.md §2.5: the public values this party accepted in the scope, and its identity key's
    # signature (what a masked sum signs before any reveal)
    transcript: Transcript = field(default_factory=lambda: Transcript(b""))
    sign: Callable[[bytes], bytes] = _unsigned
    min_share_threshold: int = 2  # the party's policy: fewest shares that may rebuild its seed
    min_parties: int = 3  # the party's policy: the smallest set it masks with, or follows a model chain link of
    # this run's account in the party's ledger (client/ledger.py; None: no ledger)
    account: RunAccount | None = None
    # the party's sealed run state, written again (client/run_state.py): at each SecureHamming attempt,
    # and at each training round's model, update, reveal and model-chain link
    checkpoint: Callable[[], None] = lambda: None

    @property
    def session_id(self) -> bytes:
        return self.masker.session_id

    def push(self, payload: wire.Payload, step: str, attempt: int, recipient: str = "") -> int:
        """Push a payload of step `step` (named in this scope) and attempt `attempt`; returns its bytes."""
        return self.conn.push(payload, sender=self.party_id, step=step, round=attempt, recipient=recipient)

    def push_all(self, messages: Sequence[wire.Outgoing]) -> int:
        """Push several messages (steps named in this scope) in order, in one round trip; returns their bytes."""
        return self.conn.push_all(messages, sender=self.party_id)

    def params_as(self, schema: type[P]) -> P:
        """The job's parameters as the schema a party job was written for."""
        if not isinstance(self.params, schema):
            raise ProtocolError(f"a {type(self.params).__name__} job cannot run as a {schema.__name__} job")
        return self.params

    def round_scope(self, t: int) -> PartyContext:
        """Training round t: its seed, its masks under the round's session id, its step names."""
        session = training.round_session(self.session_id, t)
        prefix = training.scoped(t, "")
        return dataclasses.replace(self, seed=round_seed(self.seed, t), prefix=prefix,
                                   masker=PairwiseMasker(self.party_id, self.masker.secrets, session),
                                   conn=ScopedPusher(self.conn, prefix), transcript=self.transcript.child(f"round {t}"))

    def with_job(self, params: JobParams, data: PartyData) -> PartyContext:
        """The same scope for another job's parameters and data (a round's XCLP on embedded rows)."""
        return dataclasses.replace(self, params=params, data=data)
