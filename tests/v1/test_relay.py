"""One sealed relay for every peer-to-peer payload (xclp.v1.relay): the coordinator can
drop one, never read, forge, replay, redirect or reflect it."""

from __future__ import annotations

import dataclasses

import pytest

from xclp.crypto.aead import SealBroken
from xclp.v1.relay import Relay

SECRET, SESSION = b"\x05" * 32, b"\x09" * 32
BASE = Relay.of("selfmask-share", "r2.update", 3, ("c", "a", "b"), "a", "b")


def test_a_relay_opens_for_its_recipient_with_the_same_pair_key_from_either_end() -> None:
    sealed = BASE.seal(SECRET, SESSION, b"share")
    assert BASE.open(SECRET, SESSION, sealed) == b"share"
    assert BASE.participants == ("a", "b", "c")
    assert dataclasses.replace(BASE, sender="b", recipient="a").key(SECRET, SESSION) == BASE.key(SECRET, SESSION)


@pytest.mark.parametrize("change", [dict(recipient="c"), dict(sender="b", recipient="a"), dict(attempt=4),
                                    dict(step="r3.update"), dict(purpose="seed"), dict(participants=("a", "b"))],
                         ids=["redirected", "reflected", "other-attempt", "other-step", "other-purpose",
                              "other-participants"])
def test_a_relay_moved_anywhere_else_fails_authentication(change: dict) -> None:
    sealed = BASE.seal(SECRET, SESSION, b"share")
    with pytest.raises(SealBroken):
        dataclasses.replace(BASE, **change).open(SECRET, SESSION, sealed)
    with pytest.raises(SealBroken):
        BASE.open(SECRET, b"\x0a" * 32, sealed)  # another session
