"""The party's side of the phases every job composes (client/phases/): the masked sum and the seed."""

from __future__ import annotations

import gc
import secrets

import numpy as np
import pytest

from xclp.client.context import PartyContext
from xclp.client.phases.masked_sum import MaskedSumParty, SumStage
from xclp.client.phases.seed import SeedParty
from xclp.client.transcript import Transcript
from xclp.crypto.aead import SealBroken
from xclp.crypto.identity import KeyBundle, Roster, generate_identity
from xclp.crypto.identity import public_bytes as public_bytes_ed
from xclp.crypto.masking import PairwiseMasker, generate_x25519, public_bytes, ring_sum, shared_secret
from xclp.data.party_table import PartyData
from xclp.errors import ProtocolError
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.allreduce import FlynnJobParams
from xclp.v1.double_masking import Confirmation, reveal_digest, self_mask, unpack_reveal
from xclp.v1.wire import Message

IDS = ("a", "b", "c")
SESSION = bytes(range(32))


def NOTHING(members: tuple[str, ...]) -> list:
    """What these sums release of a party's data, for its ledger: nothing the tests register."""
    return []


class Sink:
    """What a party pushed: (step, attempt, recipient, payload)."""

    def __init__(self) -> None:
        self.pushed: list[tuple[str, int, str, object]] = []

    def push(self, payload, *, sender: str, step: str, round: int, recipient: str = "") -> int:
        self.pushed.append((step, round, recipient, payload))
        return 0

    def push_all(self, messages, *, sender: str) -> int:
        return sum(self.push(m.payload, sender=sender, step=m.step, round=m.round, recipient=m.recipient)
                   for m in messages)


def pair_secrets() -> dict[str, dict[str, bytes]]:
    keys = {p: generate_x25519() for p in IDS}
    return {p: {q: shared_secret(keys[p], public_bytes(keys[q])) for q in IDS if q != p} for p in IDS}


IDENTITIES = {p: generate_identity() for p in IDS}


def contexts(prefix: str = "", transcripts: dict[str, bytes] | None = None) -> dict[str, tuple[PartyContext, Sink]]:
    """Every party's context; `transcripts`: what each party accepted as public (default: alike)."""
    roster = Roster(tuple(KeyBundle(p, "j", public_bytes_ed(IDENTITIES[p]), secrets.token_bytes(32), bytes(16))
                          for p in IDS), SESSION)
    params = FlynnJobParams(n_classes=2, m=8, s=1, rho=2)
    data = PartyData(np.zeros((1, 1)), None, ("r",))
    out = {}
    for p, pair in pair_secrets().items():
        sink = Sink()
        transcript = Transcript(SESSION)
        transcript.absorb("model", (transcripts or {}).get(p, b"theta"))
        out[p] = (PartyContext(p, params, data, roster, bytes(32), PairwiseMasker(p, pair, SESSION), sink,
                               lambda m: None, prefix=prefix, transcript=transcript, sign=IDENTITIES[p].sign), sink)
    return out


def mask(sums: dict[str, MaskedSumParty], attempt: int, members=IDS) -> None:
    """Each member pushes its masked vector of the attempt; the coordinator relays the sealed seed
    shares each dealt to the others (as the run does, before the confirm step starts)."""
    relays = []
    for p in members:
        sink = sums[p].ctx.conn
        before = len(sink.pushed)
        sums[p].on_step(start(sums[p].name, attempt, members))
        relays += [(p, step, r, to, payload) for step, r, to, payload in sink.pushed[before:] if to]
    for sender, step, r, to, payload in relays:
        sums[to].on_relay(Message("j", sums[to].ctx.prefix + step, r, sender, to, payload))


def contributions(sink: Sink) -> list[tuple[str, int]]:
    """What a party pushed to the coordinator itself (not relayed to a peer): (step, attempt)."""
    return [(step, attempt) for step, attempt, to, _ in sink.pushed if not to]


def confirm(sums: dict[str, MaskedSumParty], attempt: int, members=IDS) -> None:
    """Each member confirms its transcript; the coordinator relays all of them to each, in order."""
    parts = {}
    for p in members:
        sums[p].on_step(start(sums[p].confirm_name, attempt, members))
        parts[p] = sums[p].ctx.conn.pushed[-1][3]
    relayed = b"".join(parts[p] for p in sorted(members))
    for p in members:
        sums[p].on_relay(Message("j", sums[p].ctx.prefix + sums[p].confirm_name, attempt, "", p, relayed))


def start(name: str, attempt: int, members=IDS) -> pb.StepStart:
    return pb.StepStart(step=name, round=attempt, participants=list(members))


def test_what_the_coordinator_opens_is_the_sum_and_nothing_else() -> None:
    values = {p: np.arange(6, dtype=np.uint64) * (i + 1) for i, p in enumerate(IDS)}
    ctxs = contexts()
    sums = {p: MaskedSumParty(ctx, "total", lambda members, p=p: values[p],
                              releases=NOTHING) for p, (ctx, _) in ctxs.items()}
    mask(sums, 0)
    masked = {p: ctxs[p][1].pushed[-1][3] for p in IDS}
    assert all(not np.array_equal(masked[p], values[p]) for p in IDS)  # nobody's values travel in the clear
    confirm(sums, 0)
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
    ctxs = contexts()
    sink = ctxs["a"][1]
    sums = {p: MaskedSumParty(ctx, "total", lambda members: np.ones(3, np.uint64),
                              releases=NOTHING) for p, (ctx, _) in ctxs.items()}
    ones = sums["a"]
    with pytest.raises(ProtocolError, match="asked to confirm total attempt 0, which this party never masked"):
        ones.on_step(start("total_confirm", 0))
    mask(sums, 0)
    confirm(sums, 0)
    assert ones.self_masks.attempts[0][0] is not None and ones.shares.held[0]
    mask(sums, 1, ("a", "b"))
    # attempt 0 is dead to a: its seed, its masked vector and its shares of the others' seeds are gone,
    # and it confirms attempt 0 no more (a late confirmation would let c open attempt 0 beside attempt 1)
    assert ones.self_masks.attempts[0][0] is None and 0 not in ones.shares.held and ones.stage(0) is None
    with pytest.raises(ProtocolError, match="asked to confirm total attempt 0, which this party left for attempt 1"):
        ones.on_step(start("total_confirm", 0))
    confirm(sums, 1, ("a", "b"))
    with pytest.raises(ProtocolError, match="which this party left for attempt 1"):
        ones.on_step(start("total_reveal", 0))
    with pytest.raises(ProtocolError, match=r"complete for \['a', 'b', 'c'\], but the attempt was among \['a', 'b'\]"):
        ones.on_step(start("total_reveal", 1))
    ones.on_step(start("total_reveal", 1, ("a", "b")))
    with pytest.raises(ProtocolError, match="asked twice"):
        ones.on_step(start("total_reveal", 1, ("a", "b")))
    with pytest.raises(ProtocolError, match="after this party revealed"):
        ones.on_step(start("total", 2, ("a",)))
    assert contributions(sink) == [
        ("total", 0), ("total_confirm", 0), ("total", 1), ("total_confirm", 1), ("total_reveal", 1)]


def test_a_party_reveals_nothing_to_a_coordinator_that_showed_another_party_another_view() -> None:
    """Attack (docs/design.md §2.5): c was sent another model than a and b. c's transcript differs, and so
    do its pairwise keys: the masks would not even cancel. a and b refuse to reveal, and so does c;
    a forged or missing confirmation is refused too."""
    ctxs = contexts(transcripts={"c": b"another theta"})
    sums = {p: MaskedSumParty(ctx, "total", lambda members: np.ones(3, np.uint64),
                              releases=NOTHING) for p, (ctx, _) in ctxs.items()}
    mask(sums, 0)
    masked = {p: ctxs[p][1].pushed[-1][3] for p in IDS}
    with pytest.raises(ProtocolError, match="without relaying every member's signed transcript first"):
        sums["a"].on_step(start("total_reveal", 0))
    confirm(sums, 0)
    for p, other in (("a", "c"), ("b", "c"), ("c", "a, b")):
        with pytest.raises(ProtocolError, match=f"different views before total attempt 0: {other} signed another"):
            sums[p].on_step(start("total_reveal", 0))
    assert all(step != "total_reveal" for _, (_, sink) in ctxs.items() for step, *_ in sink.pushed)
    # even opened with every self mask, the sum is noise: c's pairwise keys bind its other transcript
    seeds = {p: sums[p].self_masks.attempts[0][0] for p in IDS}
    opened = ring_sum(masked[p] - self_mask(seeds[p], (3,), np.dtype(np.uint64)) for p in IDS)
    assert not np.array_equal(opened, np.full(3, 3, np.uint64))
    # a forged confirmation: c's transcript hash replaced by a's, c's signature kept
    ctxs = contexts(transcripts={"c": b"another theta"})
    sums = {p: MaskedSumParty(ctx, "total", lambda members: np.ones(3, np.uint64),
                              releases=NOTHING) for p, (ctx, _) in ctxs.items()}
    mask(sums, 0)
    for p in IDS:
        sums[p].on_step(start("total_confirm", 0))
    parts = [ctxs[p][1].pushed[-1][3] for p in IDS]
    parts[2] = parts[0][:32] + parts[2][32:]
    sums["a"].on_relay(Message("j", "total_confirm", 0, "", "a", b"".join(parts)))
    with pytest.raises(ProtocolError, match="confirmation of 'c' for total attempt 0 does not verify"):
        sums["a"].on_step(start("total_reveal", 0))


def test_withheld_rows_never_leave_the_party_and_come_back_for_the_result() -> None:
    (ctx, sink), *_ = contexts().values()
    kept_back = MaskedSumParty(ctx, "rows", lambda members: np.arange(4, dtype=np.uint64),
                               withhold=lambda masked, members: (masked[1:], masked[:1]), releases=NOTHING)
    kept_back.on_step(start("rows", 0))
    assert sink.pushed[-1][3].shape == (3,) and kept_back.withheld(0).shape == (1,)


def test_in_a_round_the_digest_binds_the_scoped_name_unless_told_otherwise() -> None:
    ctxs = contexts(prefix="r2.")
    for name, digest_name in (("update", None), ("rowsums", "rowsums")):
        sums = {p: MaskedSumParty(ctx, name, lambda members: np.zeros(2, np.uint64), digest_name=digest_name,
                                  releases=NOTHING)
                for p, (ctx, _) in ctxs.items()}
        mask(sums, 0)
        confirm(sums, 0)
        sums["a"].on_step(start(sums["a"].reveal_name, 0))
        bound = "r2.update" if digest_name is None else "rowsums"
        assert unpack_reveal(ctxs["a"][1].pushed[-1][3])[0] == reveal_digest(SESSION, bound, 0, IDS)


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


def test_each_attempt_moves_through_its_stages_once_and_in_order() -> None:
    """MaskedSumParty's stage per attempt (SumStage): masked, confirmed, revealed; a second
    confirmation (which would sign a second transcript for the attempt) or a second reveal is
    refused with where the attempt is, and an attempt left for a later one has no stage."""
    ctxs = contexts()
    sums = {p: MaskedSumParty(ctx, "total", lambda members: np.ones(3, np.uint64), releases=NOTHING)
            for p, (ctx, _) in ctxs.items()}
    a = sums["a"]
    assert a.stage(0) is None
    mask(sums, 0)
    assert a.stage(0) is SumStage.MASKED
    confirm(sums, 0)
    assert a.stage(0) is SumStage.CONFIRMED
    with pytest.raises(ProtocolError, match=r"to confirm total attempt 0, which is confirmed here \(masked expected\)"):
        a.on_step(start("total_confirm", 0))
    a.on_step(start("total_reveal", 0))
    assert a.stage(0) is SumStage.REVEALED
    with pytest.raises(ProtocolError, match="asked twice for this party.s self mask"):  # SelfMasks says so first
        a.on_step(start("total_reveal", 0))
    fresh = {p: MaskedSumParty(ctx, "again", lambda members: np.ones(3, np.uint64), releases=NOTHING)
             for p, (ctx, _) in contexts().items()}
    mask(fresh, 0)
    mask(fresh, 1, ("a", "b"))
    assert fresh["a"].stage(0) is None and fresh["a"].stage(1) is SumStage.MASKED


def reachable(root: object, skip: frozenset[str]) -> list[object]:
    """Every object reachable from `root`'s attributes but those in `skip` (the context it shares
    with the session, its callbacks), classes and modules aside."""
    seen: dict[int, object] = {}
    todo = [v for k, v in vars(root).items() if k not in skip]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type) or type(obj).__name__ in ("module", "function", "method"):
            continue
        seen[id(obj)] = obj
        todo.extend(gc.get_referents(obj))
    return list(seen.values())


def test_nothing_of_a_left_attempt_is_reachable_through_the_party() -> None:
    """Masking attempt 1 replaces attempt 0's record whole (client/phases/masked_sum.Attempt): not
    cleared field by field, so no value of it can stay behind. Before, the transcript hash a party
    had confirmed for attempt 0 stayed (`confirmed`), beside eight other per-attempt dicts."""
    ctxs = contexts()
    sums = {p: MaskedSumParty(ctx, "total", lambda members: np.ones(3, np.uint64), releases=NOTHING,
                              withhold=lambda masked, members: (masked[1:], masked[:1].copy()))
            for p, (ctx, _) in ctxs.items()}
    a = sums["a"]
    mask(sums, 0)
    confirm(sums, 0)
    confirmed = Confirmation.unpack(next(payload for step, attempt, to, payload in ctxs["a"][1].pushed
                                         if step == "total_confirm" and attempt == 0)).transcript
    withheld = a.withheld(0)
    assert withheld is not None
    skip = frozenset({"ctx", "contribution", "withhold", "on_opened", "releases"})
    # the objects holding attempt 0's confirmed hash (attempt 1 draws the same hash anew: by identity)
    of_attempt_0 = [o for o in reachable(a, skip) if isinstance(o, bytes) and o == confirmed] + [withheld]
    assert len(of_attempt_0) > 1
    mask(sums, 1, ("a", "b"))
    held = {id(o) for o in reachable(a, skip)}
    assert not [o for o in of_attempt_0 if id(o) in held]
    assert a.stage(0) is None and a.withheld(0) is None and a.stage(1) is SumStage.MASKED
