"""The model chain on the wire (xclp.v1.training): a member's attestation and the coordinator's relay
of a round's attestations, each packed by one end and unpacked by the other."""

from __future__ import annotations

import pytest

from xclp.errors import InvalidInput
from xclp.v1 import training

BEFORE, AFTER = b"\x01" * 32, b"\x02" * 32


def test_an_attestation_round_trips_and_a_malformed_one_is_refused() -> None:
    one = training.Attestation(BEFORE, AFTER, b"\x03" * 64)
    assert training.Attestation.unpack(one.pack()) == one
    for bad in (one.pack()[:-1], one.pack() + b"\x00", bytearray(one.pack()), None):
        with pytest.raises(InvalidInput, match="an attestation is 128 opaque bytes"):
            training.Attestation.unpack(bad)


def test_the_relayed_attestations_name_their_signers_and_refuse_other_shapes() -> None:
    roster = ("c", "a", "b")
    relayed = training.Attested(BEFORE, AFTER, {"a": b"\x04" * 64, "c": b"\x05" * 64})
    assert training.Attested.unpack(relayed.pack(roster), roster) == relayed
    packed = relayed.pack(roster)
    flags = packed[64:67]
    assert flags == b"\x01\x00\x01"  # a, b, c in sorted order
    for bad in (packed[:-1], packed[:64] + b"\x01\x02\x01" + packed[67:], packed[:64] + b"\x00\x00\x00"):
        with pytest.raises(InvalidInput):
            training.Attested.unpack(bad, roster)
