"""The party's side of the phases every job composes (client/phases/): the masked sum and the seed."""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from xclp.client.context import PartyContext
from xclp.client.phases.masked_sum import MaskedSumParty
from xclp.client.phases.seed import SeedParty
from xclp.crypto.aead import SealBroken
from xclp.crypto.identity import KeyBundle, Roster
from xclp.crypto.masking import PairwiseMasker, generate_x25519, public_bytes, ring_sum, shared_secret
from xclp.errors import ProtocolError
from xclp.party_table import PartyData
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.allreduce import FlynnJobParams
from xclp.v1.double_masking import reveal_digest, self_mask, unpack_reveal
from xclp.v1.wire import Message

IDS = ("a", "b", "c")
SESSION = bytes(range(32))


class Sink:
    """What a party pushed: (step, attempt, recipient, payload)."""

    def __init__(self) -> None:
        self.pushed: list[tuple[str, int, str, object]] = []

    def push(self, payload, *, sender: str, step: str, round: int, recipient: str = "") -> int:
        self.pushed.append((step, round, recipient, payload))
        return 0


def pair_secrets() -> dict[str, dict[str, bytes]]:
    keys = {p: generate_x25519() for p in IDS}
    return {p: {q: shared_secret(keys[p], public_bytes(keys[q])) for q in IDS if q != p} for p in IDS}


def contexts(prefix: str = "") -> dict[str, tuple[PartyContext, Sink]]:
    roster = Roster(tuple(KeyBundle(p, "j", bytes(32), secrets.token_bytes(32), bytes(16)) for p in IDS), SESSION)
    params = FlynnJobParams(n_classes=2, m=8, s=1, rho=2)
    data = PartyData(np.zeros((1, 1)), None, ("r",))
    out = {}
    for p, pair in pair_secrets().items():
        sink = Sink()
        out[p] = (PartyContext(p, params, data, roster, bytes(32), PairwiseMasker(p, pair, SESSION), sink,
                               lambda m: None, prefix=prefix), sink)
    return out


def start(name: str, attempt: int, members=IDS) -> pb.StepStart:
    return pb.StepStart(step=name, round=attempt, participants=list(members))


def test_what_the_coordinator_opens_is_the_sum_and_nothing_else() -> None:
    values = {p: np.arange(6, dtype=np.uint64) * (i + 1) for i, p in enumerate(IDS)}
    ctxs = contexts()
    sums = {p: MaskedSumParty(ctx, "total", lambda members, p=p: values[p]) for p, (ctx, _) in ctxs.items()}
    for p in IDS:
        sums[p].on_step(start("total", 0))
    masked = {p: ctxs[p][1].pushed[-1][3] for p in IDS}
    assert all(not np.array_equal(masked[p], values[p]) for p in IDS)  # nobody's values travel in the clear
    for p in IDS:
        sums[p].on_step(start("total_reveal", 0))
    seeds = {p: unpack_reveal(ctxs[p][1].pushed[-1][3]) for p in IDS}
    assert all(digest == reveal_digest(SESSION, "total", 0, IDS) for digest, _ in seeds.values())
    opened = ring_sum(masked[p] - self_mask(seeds[p][1], (6,), np.dtype(np.uint64)) for p in IDS)
    np.testing.assert_array_equal(opened, sum(values.values()))
    # without one party's seed the sum is noise
    partial = ring_sum(masked[p] - self_mask(seeds[p][1], (6,), np.dtype(np.uint64)) for p in "ab") + masked["c"]
    assert not np.array_equal(partial, opened)


def test_a_party_reveals_only_its_latest_attempt_for_its_own_participants_and_once() -> None:
    (ctx, sink), *_ = contexts().values()
    ones = MaskedSumParty(ctx, "total", lambda members: np.ones(3, np.uint64))
    with pytest.raises(ProtocolError, match="attempt 0, which this party never masked"):
        ones.on_step(start("total_reveal", 0))
    ones.on_step(start("total", 0))
    ones.on_step(start("total", 1, ("a", "b")))
    with pytest.raises(ProtocolError, match="abandoned for attempt 1"):
        ones.on_step(start("total_reveal", 0))
    with pytest.raises(ProtocolError, match=r"complete for \['a', 'b', 'c'\], but the attempt was among \['a', 'b'\]"):
        ones.on_step(start("total_reveal", 1))
    ones.on_step(start("total_reveal", 1, ("a", "b")))
    with pytest.raises(ProtocolError, match="asked twice"):
        ones.on_step(start("total_reveal", 1, ("a", "b")))
    with pytest.raises(ProtocolError, match="after this party revealed"):
        ones.on_step(start("total", 2, ("a",)))
    assert [(step, attempt) for step, attempt, _, _ in sink.pushed] == [("total", 0), ("total", 1),
                                                                        ("total_reveal", 1)]


def test_withheld_rows_never_leave_the_party_and_come_back_for_the_result() -> None:
    (ctx, sink), *_ = contexts().values()
    kept_back = MaskedSumParty(ctx, "rows", lambda members: np.arange(4, dtype=np.uint64),
                               withhold=lambda masked, members: (masked[1:], masked[:1]))
    kept_back.on_step(start("rows", 0))
    assert sink.pushed[-1][3].shape == (3,) and kept_back.kept[0].shape == (1,)


def test_in_a_round_the_digest_binds_the_scoped_name_unless_told_otherwise() -> None:
    (ctx, sink), *_ = contexts(prefix="r2.").values()
    scoped = MaskedSumParty(ctx, "update", lambda members: np.zeros(2, np.uint64))
    local = MaskedSumParty(ctx, "rowsums", lambda members: np.zeros(2, np.uint64), digest_name="rowsums")
    for phase in (scoped, local):
        phase.on_step(start(phase.name, 0))
        phase.on_step(start(phase.reveal_name, 0))
    assert unpack_reveal(sink.pushed[1][3])[0] == reveal_digest(SESSION, "r2.update", 0, IDS)
    assert unpack_reveal(sink.pushed[3][3])[0] == reveal_digest(SESSION, "rowsums", 0, IDS)


def test_the_leaders_seed_opens_for_each_follower_and_a_forged_seal_does_not() -> None:
    secrets_of = pair_secrets()
    sinks = {p: Sink() for p in IDS}
    seeds = {p: SeedParty(p, SESSION, secrets_of[p], sinks[p], lambda m: None) for p in IDS}
    seeds["a"].on_step(start("seed", 0))
    sealed = {recipient: payload for _, _, recipient, payload in sinks["a"].pushed if recipient}
    assert set(sealed) == {"b", "c"} and seeds["a"].seed is not None
    seeds["b"].on_step(start("seed", 0))
    assert seeds["b"].seed is None  # waits for the leader's seal
    seeds["b"].on_message(Message("j", "seed", 0, "a", "b", sealed["b"]))
    assert seeds["b"].seed == seeds["a"].seed and sinks["b"].pushed[-1][:2] == ("seed", 0)
    seeds["c"].on_message(Message("j", "seed", 0, "a", "c", sealed["b"]))  # b's seal, redirected to c
    with pytest.raises(SealBroken, match="failed authentication"):
        seeds["c"].on_step(start("seed", 0))
    assert seeds["c"].seed is None
