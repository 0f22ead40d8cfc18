"""A hostile coordinator for the threat model's tests (docs/design.md §2): the real coordinator over real
gRPC, serving real PartySessions, with the transitions an attacker changes replaced.

Each attack is a keyword of `hostile(...)`; the honest code runs where no attack is named. The
coordinator's own checks of what it was told are switched off with the lie they would catch (an
attacker does not check its own lie); what must stop the attack is what the parties check.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from xclp.crypto.identity import KeyBundle
from xclp.server.admission import Lobby
from xclp.server.coordinator import Coordinator
from xclp.server.run import Run
from xclp.v1 import wire
from xclp.v1 import xclp_pb2 as pb

SpecView = Callable[[pb.JobSpec], pb.JobSpec]
# (party, wire name, payload) -> what that party is sent instead (None: the real payload)
Rewrite = Callable[[str, str, wire.Payload], "wire.Payload | None"]


def with_params(**changes: Any) -> SpecView:
    """A view of the spec with some parameters changed (None removes one)."""
    def view(spec: pb.JobSpec) -> pb.JobSpec:
        params = {k: v for k, v in {**json.loads(spec.params_json), **changes}.items() if v is not None}
        out = pb.JobSpec()
        out.CopyFrom(spec)
        out.params_json = json.dumps(params, sort_keys=True)
        return out
    return view


def with_spec(**fields: Any) -> SpecView:
    """A view of the spec with other top-level fields (job_type, expected_parties, ...)."""
    def view(spec: pb.JobSpec) -> pb.JobSpec:
        out = pb.JobSpec()
        out.CopyFrom(spec)
        for name, value in fields.items():
            if isinstance(value, (list, tuple)):
                out.ClearField(name)
                getattr(out, name).extend(value)
            else:
                setattr(out, name, value)
        return out
    return view


@contextlib.contextmanager
def hostile(monkeypatch: pytest.MonkeyPatch, *, spec_views: Mapping[str, SpecView] | None = None,
            offer_views: Mapping[str, SpecView] | None = None, rewrite: Rewrite | None = None) -> Iterator[None]:
    """Install the attacks for the `with` block.

    spec_views: party id -> the spec that party is shown in its Challenge and Join (others see
    the real one). offer_views: the same for the Offers an agent polls. rewrite: what the
    coordinator sends each party instead of a message of its own (a model, a layout, a result).
    """
    views = dict(spec_views or {})
    offers = dict(offer_views or {})
    if views:
        real_challenge, real_join = Run.challenge, Coordinator.join

        def challenge(self: Run, party_id: str) -> pb.ChallengeResponse:
            response = real_challenge(self, party_id)
            if party_id in views:
                response.spec.CopyFrom(views[party_id](response.spec))
            return response

        def join(self: Coordinator, request: pb.JoinRequest) -> pb.JoinResponse:
            response = real_join(self, request)
            party = KeyBundle.from_bytes(request.bundle.bundle).party_id
            if party in views:
                response.spec.CopyFrom(views[party](response.spec))
            return response

        monkeypatch.setattr(Run, "challenge", challenge)
        monkeypatch.setattr(Coordinator, "join", join)
        monkeypatch.setattr(Lobby, "check_spec", lambda self, bundle: None)
    if offers:
        real_offers = Coordinator.offers

        def offered(self: Coordinator, party_id: str) -> list[pb.Offer]:
            out = real_offers(self, party_id)
            if party_id in offers:
                for offer in out:
                    offer.spec.CopyFrom(offers[party_id](offer.spec))
            return out

        monkeypatch.setattr(Coordinator, "offers", offered)
    if rewrite is not None:
        real_send = Run.send

        def send(self: Run, party_id: str, wire_name: str, attempt: int, payload: wire.Payload, *,
                 ledger_name: str) -> int:
            forged = rewrite(party_id, wire_name, payload)
            return real_send(self, party_id, wire_name, attempt, payload if forged is None else forged,
                             ledger_name=ledger_name)

        monkeypatch.setattr(Run, "send", send)
    yield
