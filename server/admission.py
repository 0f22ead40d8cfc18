"""Who may join a run (docs/design.md §2.1, §4.1): the checks of a party's signed key bundle and of its
data summary, and the lobby where joined parties wait for the others.

The checks run in this order, so that a party that is not allowed at all hears that first,
whatever the run's state: allow-listed, its Paillier key of the job's size, expected in the job,
signed by its allowed identity key, for this job and this run's nonce; then its data summary
against the job and against the parties that joined before it.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Callable, Iterable, Mapping

from xclp.crypto.identity import KeyBundle, SignedBundle, session_id, verify_bundle
from xclp.data.party_table import schema_digest
from xclp.errors import InvalidInput, InvalidSignature, NotAuthorized, ProtocolError, ReplayRefused, ResourceExhausted
from xclp.server.config import JobConfig
from xclp.server.mailbox import Party
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.bundles import check_paillier_size
from xclp.v1.spec import spec_digest
from xclp.v1.wire import MAX_DIM

log = logging.getLogger("xclp.server")
STATUS_SECONDS = 60.0  # how often waiting parties hear how the join is going


# why an expected party may decline a run, as `job show` says it (fixed texts: a party's reasons
# carry nothing of what it released)
DECLINE_REASONS = {pb.DeclineRequest.PRIVACY_BUDGET: "declined: its privacy budget for this data set is spent",
                   pb.DeclineRequest.RESOURCES: "declined: the job needs more time or memory than it allows",
                   pb.DeclineRequest.BAD_DATA: "declined: its data does not fit the job (the party's own output "
                                               "says where)",
                   pb.DeclineRequest.POLICY: "declined: the job is outside its policy (the party's own output says "
                                             "which rule)"}


class Lobby:
    """The parties that joined a run and wait for the others: admission, the join deadline, and
    the JoinStatus every waiting party hears (docs/design.md §9: no guessing why nothing happens)."""

    def __init__(self, config: JobConfig, allow_list: Mapping[str, bytes], clock: Callable[[], float],
                 check: Callable[[pb.DataSummary], None]) -> None:
        self.config, self.allow_list, self.check = config, allow_list, check
        self.run_nonce = secrets.token_bytes(16)  # every key bundle of this run signs it (docs/design.md §2.1)
        self.spec_digest = spec_digest(config.spec(), self.run_nonce)  # and this (docs/design.md §2.5)
        self.parties: dict[str, Party] = {}
        self.declined: dict[str, str] = {}  # expected parties that said they will not join, and why
        self.deadline = clock() + config.join_seconds
        self.status_at = clock()

    def adopt(self, run_nonce: bytes) -> None:
        """The nonce of a run a restarted coordinator reads back (server/resume.py), for its bundles' checks."""
        self.run_nonce, self.spec_digest = run_nonce, spec_digest(self.config.spec(), run_nonce)

    def admit(self, signed: SignedBundle, summary: pb.DataSummary, *, open_: bool, closed: str = "") -> Party:
        """A place for the bundle's party, or the error that refuses it (`closed`: why the run ended)."""
        bundle = check_bundle(self.config, self.allow_list, self.run_nonce, signed)
        self.check_spec(bundle)
        if not open_:
            raise ProtocolError(f"job {self.config.job_id!r} is past admission" + (f" ({closed})" if closed else ""))
        if bundle.party_id in self.parties:
            raise ProtocolError(f"party {bundle.party_id!r} has already joined job {self.config.job_id!r}")
        check_summary(self.config, summary, ((p, q.summary) for p, q in self.parties.items()))
        if (bundle.rows, bundle.labeled_rows, bundle.dim) != (summary.rows, summary.labeled_rows, summary.dim):
            raise InvalidInput(f"the data summary of {bundle.party_id!r} differs from the one its key bundle signs")
        self.check(summary)
        party = self.parties[bundle.party_id] = Party(bundle, signed, summary)
        self.declined.pop(bundle.party_id, None)  # it thought again
        log.info("job %s: %s joined (%d/%d)", self.config.job_id, bundle.party_id, len(self.parties),
                 len(self.config.expected_parties))
        return party

    def check_spec(self, bundle: KeyBundle) -> None:
        """The bundle signs this run's spec as the coordinator sent it (docs/design.md §2.5). The parties
        check it among themselves; this check only tells an honest party early what went wrong."""
        if not hmac.compare_digest(bundle.spec_digest, self.spec_digest):
            # an xclp-client from before unset centres followed the rows reads them as 64 (docs/jobs/xclp.md)
            older = ("; a party of a version before unset XCLP centres followed the rows signs them as 64: set "
                     "centres in the job file to run with it" if getattr(self.config.params, "centres", 0) is None
                     else "")
            raise InvalidInput(f"the key bundle of {bundle.party_id!r} signs another spec than job "
                               f"{self.config.job_id!r} has (is the party's xclp of another version?){older}")

    @property
    def full(self) -> bool:
        """Every expected party that has not declined has joined."""
        return len(self.parties) + len(self.declined) == len(self.config.expected_parties)

    @property
    def possible(self) -> int:
        """How many parties can still be in the run."""
        return len(self.config.expected_parties) - len(self.declined)

    def decline(self, party_id: str, run_nonce: bytes, reason: pb.DeclineRequest.Reason) -> str:
        """An expected party's word (its call verified) that it will not join this run; returns why,
        as the operator reads it."""
        why = DECLINE_REASONS.get(reason)
        if why is None:
            raise InvalidInput(f"unknown reason for declining: {int(reason)}")
        if party_id not in self.config.expected_parties:
            raise NotAuthorized(f"party {party_id!r} is not expected in job {self.config.job_id!r}")
        if not hmac.compare_digest(run_nonce, self.run_nonce):
            raise ProtocolError(f"the decline of {party_id!r} names another run of job {self.config.job_id!r}")
        if party_id in self.parties:
            raise ProtocolError(f"party {party_id!r} has joined job {self.config.job_id!r}: it declines before Join")
        self.declined[party_id] = why
        log.info("job %s: %s declined (%s)", self.config.job_id, party_id, why)
        return why

    def leave(self, party_id: str) -> None:
        """A party left before the roster went out: forget it; it may join again with fresh keys."""
        del self.parties[party_id]
        log.info("job %s: %s left before the roster was sent", self.config.job_id, party_id)

    def send_roster(self) -> bytes:
        """Send every joined party the roster (all signed bundles); returns the run's session id."""
        roster = pb.Roster(bundles=[pb.SignedBundle(bundle=self.parties[p].signed.bundle,
                                                    signature=self.parties[p].signed.signature)
                                    for p in sorted(self.parties)])
        for party in self.parties.values():
            party.mailbox.put(pb.PullItem(roster=roster))
        return session_id(self.parties[p].signed.bundle for p in sorted(self.parties))

    def status(self, now: float) -> None:
        """Tell every joined party who is in and how long the run still waits for the rest."""
        self.status_at = now
        waiting = [p for p in self.config.expected_parties if p not in self.parties and p not in self.declined]
        status = pb.JoinStatus(joined=len(self.parties), expected=len(self.config.expected_parties),
                               min_parties=self.config.min_parties, waiting_for=waiting,
                               join_deadline_seconds=max(0.0, self.deadline - now))
        for party in self.parties.values():
            party.mailbox.put(pb.PullItem(status=status))


def authenticated(allow_list: Mapping[str, bytes], signed: SignedBundle) -> KeyBundle:
    """The bundle, if the allow-listed party it names signed it with its allowed identity key. A
    caller who cannot sign as one hears one answer whether the party is unknown or the key another,
    before anything about jobs: nothing tells it who or what is known here."""
    try:
        claimed = KeyBundle.from_bytes(signed.bundle)
    except InvalidInput as exc:
        raise InvalidInput(f"malformed key bundle: {exc}") from None
    allowed = allow_list.get(claimed.party_id)
    try:
        if allowed is None:
            raise InvalidSignature("unknown party")
        return verify_bundle(signed, expected_identity=allowed)
    except InvalidSignature:
        raise InvalidSignature(f"the key bundle of {claimed.party_id!r} does not verify under an identity key on the "
                               "coordinator's allow-list for it (an unknown party, or another key)") from None


def check_bundle(config: JobConfig, allow_list: Mapping[str, bytes], run_nonce: bytes,
                 signed: SignedBundle) -> KeyBundle:
    """The verified bundle of an allow-listed, expected party, for this job and this run."""
    try:
        claimed = KeyBundle.from_bytes(signed.bundle)
    except InvalidInput as exc:
        raise InvalidInput(f"malformed key bundle: {exc}") from None
    allowed = allow_list.get(claimed.party_id)
    if allowed is None:
        raise NotAuthorized(f"party {claimed.party_id!r} is not on the coordinator's allow-list")
    keys = config.params.paillier
    if keys is not None:  # checked before the signature, so a wrong --paillier-bits is heard at once
        try:
            check_paillier_size(claimed, keys.bits, allow_insecure=keys.insecure_test_keys)
        except InvalidInput as exc:
            raise InvalidInput(f"job {config.job_id!r} {keys.why}: {exc}") from None
    if claimed.party_id not in config.expected_parties:
        raise NotAuthorized(f"party {claimed.party_id!r} is not expected in job {config.job_id!r}")
    bundle = verify_bundle(signed, expected_identity=allowed)
    if bundle.job_id != config.job_id:
        raise InvalidInput(f"the key bundle is for job {bundle.job_id!r}, not {config.job_id!r}")
    if not hmac.compare_digest(bundle.nonce, run_nonce):
        raise ReplayRefused(f"the key bundle of {bundle.party_id!r} signs another run's nonce (replayed or "
                            f"stale): ask for this run's challenge and sign a fresh bundle")
    return bundle


def check_summary(config: JobConfig, summary: pb.DataSummary, joined: Iterable[tuple[str, pb.DataSummary]]) -> None:
    """A data summary the job can take next to those of the parties that joined before."""
    joined = list(joined)
    if summary.rows < 1 or summary.dim < 1:
        raise InvalidInput("the data summary must report at least one row and one column")
    if summary.rows > config.max_rows_per_party:
        raise InvalidInput(f"the data summary reports {summary.rows} rows; job {config.job_id!r} takes at "
                           f"most {config.max_rows_per_party} per party (max_rows_per_party)")
    cap = config.max_total_rows
    rows = sum(int(other.rows) for _, other in joined)
    if cap and rows + summary.rows > cap:
        raise ResourceExhausted(f"job {config.job_id!r} takes at most {cap} rows in all (max_total_rows); "
                                f"{rows} have joined and this party brings {summary.rows}: subsample, or ask "
                                "the operator to raise the cap if the coordinator has the memory")
    if summary.dim > MAX_DIM:
        raise InvalidInput(f"the data summary reports {summary.dim} columns; at most {MAX_DIM}")
    try:
        config.params.check_table(int(summary.dim))
    except InvalidInput as exc:
        raise InvalidInput(f"job {config.job_id!r} cannot use data of {summary.dim} columns: {exc}") from None
    if summary.labeled_rows > summary.rows:
        raise InvalidInput("the data summary reports more labeled rows than rows")
    want = config.params.feature_columns
    if want is not None:  # the job's schema: each party against it, whoever joined first
        if len(want) != summary.dim or summary.schema != schema_digest(want):
            raise InvalidInput(f"this party's feature columns are not those job {config.job_id!r} lists (columns = "
                               f"[...], {len(want)} of them; this party has {summary.dim}): every party needs the "
                               "job's columns, in its order")
        return
    for pid, other in joined:
        if other.dim != summary.dim:
            raise InvalidInput(f"data has {summary.dim} columns but {pid!r} has {other.dim}; all parties must agree")
        if other.schema and summary.schema and other.schema != summary.schema:
            raise InvalidInput(f"the data's feature columns have other names, or another order, than those of "
                               f"{pid!r}; every party needs the same feature columns in the same order")
