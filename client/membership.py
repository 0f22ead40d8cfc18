"""A party's place in one run once the roster is verified (client/session.py's KEYED stage on):
one value, made once from the roster (`Membership.verified`) or from a saved run state
(`Membership.restored`), that saves itself (`saved`).

It holds the run's nonce, this party's X25519 key and signed bundle, the roster as signed and as
verified, the pairwise secrets and the masker made from them, the job's transcript (which the
session id starts) and the common seed's party. A roster that fails a check leaves no membership,
so nothing of it (a secret with a stranger's key) stays behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from xclp.client.context import Progress, Pusher
from xclp.client.phases.seed import SeedParty
from xclp.client.transcript import Transcript
from xclp.crypto import identity, masking
from xclp.errors import InvalidSignature, ProtocolError


@dataclass
class Membership:
    party_id: str
    nonce: bytes
    x25519: X25519PrivateKey
    signed: identity.SignedBundle
    roster_signed: list[tuple[bytes, bytes]]  # the roster as signed, kept for a restart
    roster: identity.Roster
    pair_secrets: dict[str, bytes]
    masker: masking.PairwiseMasker
    transcript: Transcript
    seed: SeedParty

    @classmethod
    def verified(cls, bundles: list[tuple[bytes, bytes]], *, party_id: str, job_id: str, nonce: bytes,
                 x25519: X25519PrivateKey, own: identity.SignedBundle, peers: Mapping[str, bytes] | None,
                 pusher: Pusher, progress: Progress, transcript: Mapping[str, Any] | None = None) -> Membership:
        """The roster `bundles` (bundle, signature), checked (docs/design.md §2.1, §2.5): every key
        the one pinned in this party's own copy of the allow-list (`peers`), every bundle signing
        this run's nonce (no bundle of an earlier run comes back), this party's own entry
        unmodified, one spec signed by all. `transcript`: the state of a saved one (a restart)."""
        signed = [identity.SignedBundle(b, s) for b, s in bundles]
        roster = identity.verify_roster(signed, job_id=job_id, own=own, allowed=peers)
        stale = [b.party_id for b in roster.bundles if b.nonce != nonce]
        if stale:
            raise InvalidSignature(f"the roster carries key bundles of another run for {', '.join(stale)}")
        # a coordinator that showed parties different specs is caught here
        mine = roster.bundle(party_id).spec_digest
        other = [b.party_id for b in roster.bundles if b.spec_digest != mine]
        if other:
            raise InvalidSignature(f"the coordinator showed the parties different job specs: {', '.join(other)} "
                                   f"signed another spec than {party_id!r} (its parameters, parties or run differ "
                                   "from what this party was told): refusing the roster")
        if masking.public_bytes(x25519) != roster.bundle(party_id).x25519_public:
            raise ProtocolError("the roster's key bundle for this party does not carry its own X25519 key")
        secrets = {b.party_id: masking.shared_secret(x25519, b.x25519_public)
                   for b in roster.bundles if b.party_id != party_id}
        # the session id hashes every signed bundle (spec digests, row counts, keys)
        return cls(party_id, nonce, x25519, own, list(bundles), roster, secrets,
                   masking.PairwiseMasker(party_id, secrets, roster.session_id),
                   Transcript(roster.session_id) if transcript is None
                   else Transcript.restored(roster.session_id, dict(transcript)),
                   SeedParty(party_id, roster.session_id, secrets, pusher, progress))

    def saved(self) -> dict[str, Any] | None:
        """What a restart needs of it; None before the common seed (a run state is of no use yet)."""
        if self.seed.seed is None:
            return None
        return {"nonce": self.nonce.hex(), "x25519": self.x25519.private_bytes_raw().hex(),
                "signed": [self.signed.bundle.hex(), self.signed.signature.hex()],
                "roster": [[b.hex(), s.hex()] for b, s in self.roster_signed],
                "transcript": self.transcript.state(), "seed": self.seed.seed.hex(),
                "seed_participants": list(self.seed.participants)}

    @classmethod
    def restored(cls, meta: Mapping[str, Any], *, party_id: str, job_id: str, peers: Mapping[str, bytes] | None,
                 pusher: Pusher, progress: Progress) -> Membership:
        """`saved`'s membership, its roster verified again against the pinned allow-list."""
        own = identity.SignedBundle(*(bytes.fromhex(v) for v in meta["signed"]))
        try:
            member = cls.verified([(bytes.fromhex(b), bytes.fromhex(s)) for b, s in meta["roster"]],
                                  party_id=party_id, job_id=job_id, nonce=bytes.fromhex(meta["nonce"]),
                                  x25519=X25519PrivateKey.from_private_bytes(bytes.fromhex(meta["x25519"])), own=own,
                                  peers=peers, pusher=pusher, progress=progress, transcript=meta["transcript"])
        except (InvalidSignature, ProtocolError) as exc:
            raise ProtocolError(f"the saved run state does not match its own roster ({exc})") from None
        member.seed.restore(bytes.fromhex(meta["seed"]), tuple(meta["seed_participants"]))
        return member
