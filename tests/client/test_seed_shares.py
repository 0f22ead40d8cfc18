"""The party's Shamir shares of its self-mask seeds (client/phases/seed_shares.py):
dealt sealed with every masked vector, kept, checked before confirming, given only under the rules."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.client.test_phases import IDS, NOTHING, SESSION, confirm, contexts, contributions, mask, start
from xclp.client.phases.masked_sum import MaskedSumParty
from xclp.crypto import shamir
from xclp.crypto.aead import SealBroken
from xclp.errors import PolicyRefused, ProtocolError
from xclp.v1.double_masking import DIGEST_BYTES, SEALED_SHARE_BYTES, recover_digest
from xclp.v1.wire import Message


def parties(prefix: str = "") -> dict[str, MaskedSumParty]:
    return {p: MaskedSumParty(ctx, "total", lambda members: np.ones(4, np.uint64), releases=NOTHING) for p, (ctx, _) in
            contexts(prefix).items()}


def revealed(sums: dict[str, MaskedSumParty], attempt: int, who: str, members=IDS) -> None:
    mask(sums, attempt, members)
    confirm(sums, attempt, members)
    for p in who:
        sums[p].on_step(start("total_reveal", attempt, members))


def test_any_t_holders_shares_rebuild_the_lost_holders_seed_and_bind_the_attempt() -> None:
    sums = parties()
    revealed(sums, 0, "ab")
    answers = {}
    for p in "ab":
        sums[p].on_step(start("total_recover", 0, ("a", "b")))
        answers[p] = sums[p].ctx.conn.pushed[-1][3]
        assert answers[p][:DIGEST_BYTES] == recover_digest(SESSION, "total", 0, IDS, ("a", "b"))
    seed_c = sums["c"].self_masks.attempts[0][0]
    assert shamir.combine({1: answers["a"][DIGEST_BYTES:], 2: answers["b"][DIGEST_BYTES:]}, 2) == seed_c
    assert all(answers[p][DIGEST_BYTES:] != seed_c for p in "ab")  # one share is not the seed


def test_shares_are_given_once_per_attempt_and_only_by_a_party_that_revealed_it() -> None:
    sums = parties()
    revealed(sums, 0, "a")
    with pytest.raises(ProtocolError, match="revealed no seed of its own"):
        sums["b"].on_step(start("total_recover", 0, ("a", "b")))  # b never revealed attempt 0
    sums["a"].on_step(start("total_recover", 0, ("a", "b")))
    with pytest.raises(ProtocolError, match="asked twice for self-mask shares of total attempt 0"):
        sums["a"].shares.give(0, ("a", "b"), sums["a"].self_masks.revealed_attempt)
    assert contributions(sums["a"].ctx.conn)[-1] == ("total_recover", 0)


def test_a_party_confirms_only_once_it_holds_every_other_members_share() -> None:
    """A coordinator that withholds c's share from a would leave a unable to help rebuild c's seed
    (and could aim a recovery at the parties it did give shares to): a refuses to confirm."""
    sums = parties()
    for p in IDS:
        sums[p].on_step(start("total", 0))
    relays = [(p, to, payload) for p in IDS for step, r, to, payload in sums[p].ctx.conn.pushed if to]
    assert len(relays) == 6 and all(len(payload) == SEALED_SHARE_BYTES for _, _, payload in relays)
    for sender, to, payload in relays:
        if (sender, to) != ("c", "a"):
            sums[to].on_relay(Message("j", "total", 0, sender, to, payload))
    with pytest.raises(ProtocolError, match="without relaying the self-mask shares of c"):
        sums["a"].on_step(start("total_confirm", 0))
    sums["b"].on_step(start("total_confirm", 0))  # b has both


def test_a_share_twice_for_another_attempt_from_a_stranger_or_tampered_is_refused() -> None:
    sums = parties()
    for p in IDS:
        sums[p].on_step(start("total", 0))
    share = next(payload for step, r, to, payload in sums["b"].ctx.conn.pushed if to == "a")
    sums["a"].on_relay(Message("j", "total", 0, "b", "a", share))
    with pytest.raises(ProtocolError, match="'b' sent its self-mask share for total attempt 0 twice"):
        sums["a"].on_relay(Message("j", "total", 0, "b", "a", share))
    with pytest.raises(ProtocolError, match="self-mask share for total attempt 1, which this party does not expect"):
        sums["a"].on_relay(Message("j", "total", 1, "b", "a", share))
    with pytest.raises(ProtocolError, match="'d' sent a self-mask share for total attempt 0"):
        sums["a"].on_relay(Message("j", "total", 0, "d", "a", share))
    tampered = share[:-1] + bytes([share[-1] ^ 1])
    with pytest.raises(SealBroken):
        sums["a"].on_relay(Message("j", "total", 0, "c", "a", tampered))


def test_a_sum_of_two_deals_no_shares_and_a_threshold_below_the_partys_minimum_is_refused() -> None:
    sums = parties()
    for p in "ab":
        sums[p].on_step(start("total", 0, ("a", "b")))
    assert all(not to for p in "ab" for _, _, to, _ in sums[p].ctx.conn.pushed)  # t = 2 of 2: nothing to rebuild
    ctx, _ = contexts()["a"]
    strict = {"a": MaskedSumParty(dataclasses.replace(ctx, min_share_threshold=3), "total",
                                  lambda members: np.ones(4, np.uint64), releases=NOTHING)}
    with pytest.raises(PolicyRefused, match=r"total attempt 0 lets 2 of 3 parties rebuild a self-mask seed; this "
                                            r"party requires at least 3 \(--min-share-threshold\)"):
        strict["a"].on_step(start("total", 0))
    assert strict["a"].ctx.conn.pushed == []  # refused before anything was sent
