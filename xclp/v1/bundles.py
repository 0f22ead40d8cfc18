"""The Paillier part of a signed key bundle (docs/design.md §4.1, §5.3): its codec and its checks.

An XCLP party publishes N (|N|/8 bytes, big-endian) and h_s = h^N mod N² (2·|N|/8 bytes) in the
key bundle it signs. The coordinator checks the size when the party joins (so a party started
with the wrong `--paillier-bits` hears it at once); every peer checks the same before using the
key, since it does not trust the coordinator to have checked.
"""

from __future__ import annotations

from gmpy2 import mpz

from xclp.crypto.identity import KeyBundle
from xclp.crypto.paillier import MIN_SECURE_BITS, PaillierPublicKey
from xclp.errors import InvalidInput, ProtocolError


def paillier_fields(public: PaillierPublicKey | None) -> dict[str, bytes]:
    """`paillier_n` and `paillier_hs` for a KeyBundle (empty without a key)."""
    if public is None:
        return {}
    width = public.modulus_bits // 8
    return {"paillier_n": int(public.n).to_bytes(width, "big"),
            "paillier_hs": int(public.h_s).to_bytes(2 * width, "big")}


def check_paillier_size(bundle: KeyBundle, key_bits: int, *, allow_insecure: bool) -> None:
    """Refuse (InvalidInput naming the party) a bundle whose Paillier key does not have exactly
    `key_bits` bits, or has fewer than 2048 without `allow_insecure` (the coordinator's check)."""
    n, hs = bundle.paillier_n, bundle.paillier_hs
    if not n or len(n) * 8 != key_bits or not n[0] & 0x80:
        have = f"a {int.from_bytes(n, 'big').bit_length()}-bit key" if n else "no Paillier key"
        raise InvalidInput(f"{bundle.party_id!r} published {have}; the job uses {key_bits}-bit Paillier keys "
                           f"(`xclp-client run --paillier-bits {key_bits}`)")
    if key_bits < MIN_SECURE_BITS and not allow_insecure:
        raise InvalidInput(f"{bundle.party_id!r} published a {key_bits}-bit Paillier key, below the secure "
                           f"{MIN_SECURE_BITS} bits")
    if len(hs) != 2 * len(n):
        raise InvalidInput(f"{bundle.party_id!r} published an h_s of {len(hs)} bytes; a {key_bits}-bit key needs "
                           f"{2 * len(n)}")


def paillier_key(bundle: KeyBundle, key_bits: int, *, allow_insecure: bool) -> PaillierPublicKey:
    """The bundle's Paillier key as a peer uses it: the size checked, and h_s recomputed from N."""
    check_paillier_size(bundle, key_bits, allow_insecure=allow_insecure)
    n, hs = bundle.paillier_n, bundle.paillier_hs
    key = PaillierPublicKey(mpz(int.from_bytes(n, "big")), mpz(int.from_bytes(hs, "big")))
    try:
        key.check_h_s()  # h from a hash of N, recomputed here: the key owner did not choose it
    except ProtocolError as exc:
        raise InvalidInput(f"{bundle.party_id!r}: {exc}") from None
    return key
