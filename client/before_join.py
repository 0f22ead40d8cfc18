"""What a party checks before it joins a run, and how it declines.

Before its Join a party knows the job spec, its own data and its own limits, and nothing of the
others: it refuses here what it will not do, so that a run never starts with a party that will
leave it at the first step. Two checks:
- its privacy ledger (client/ledger.py): the job's DP releases must fit the data set's budget;
- the job type's own (`before_join` on its party class; XCLP: the memory of its own part and its
  Paillier work against this party's `--max-work-minutes` and the job's `max_run_seconds`,
  client/jobs/estimate.py).
Every refusal before Join — these two, and the session's own checks of the job against its policy
and of its table against the job — is said to the coordinator with a Decline (a signed call naming
the run and one reason: budget, resources, data or policy): the operator's `job show` says the
party declined and why in words, never the numbers, and the run does not wait its join deadline
for it. The party itself prints the details.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import replace

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from xclp.client import ledger_v1, responses
from xclp.client.budget import job_spends
from xclp.client.connection import Connection
from xclp.client.context import Progress
from xclp.client.jobs.estimate import WorkLimits, default_max_memory
from xclp.client.ledger import Ledger, RunAccount
from xclp.client.run_config import RunConfig
from xclp.crypto import identity, masking
from xclp.crypto.paillier import PaillierKeypair
from xclp.data.party_table import PartyData
from xclp.errors import InvalidInput, PolicyRefused, ResourceExhausted
from xclp.fedavg import sample_size
from xclp.v1 import registry
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.bundles import paillier_fields
from xclp.v1.params import JobParams
from xclp.v1.spec import spec_digest
from xclp.v1.steps import RESUMES, RUN_ALIVE
from xclp.v1.xclp import FINE_PIECES, KEEPS_PAIRS, KEEPS_PIECES, SPARSE_INFLUENCE
from xclp.workers import worker_count

__all__ = ["account_for", "check_job_fits", "decline", "declining", "join_request"]


def account_for(config: RunConfig, conn: Connection, challenge: pb.ChallengeResponse, params: JobParams,
                data: PartyData, digest: bytes, progress: Progress) -> RunAccount | None:
    """This run in the party's ledger, its DP spends checked against the budget of the data set
    `digest` names (client/ledger.py data_digest of `data`)."""
    ledger = config.ledger
    if ledger is None:
        return None
    notice = ledger_v1.release_log_notice(ledger.directory)
    if notice:
        progress(f"WARNING: {notice}")
    if ledger.adopt_legacy(digest, ledger_v1.legacy_digest(data)):
        progress(f"privacy ledger: data set {digest.hex()[:16]} takes over what the previous ledger format recorded "
                 "of this table")
    try:
        check_exact_sets(ledger, params, len(challenge.spec.expected_parties))
        for kind, epsilon, _ in params.dp_releases:
            if kind == "responses":
                responses.check(ledger, digest, epsilon, params.hides_labeled_rows)
    except PolicyRefused:
        decline(config, conn, challenge.run_nonce, pb.DeclineRequest.POLICY, progress)
        raise
    account = RunAccount(ledger, digest, config.job_id, challenge.run_id or challenge.run_nonce.hex(),
                         job_spends(params, data.X.shape[1], ledger.response_draw(digest)))
    try:
        ledger.check_budget(digest, account.spends, config.job_id)
    except PolicyRefused:
        decline(config, conn, challenge.run_nonce, pb.DeclineRequest.PRIVACY_BUDGET, progress)
        raise
    return account


def check_exact_sets(ledger: Ledger, params: JobParams, expected: int) -> None:
    """A training job that samples a fraction of the parties each round, without DP, releases exact
    updates among a different set of parties round after round, which the ledger refuses at the
    first sample other than the data set's set (docs/privacy.md): refused before Join instead."""
    fraction = getattr(params, "fraction", 1.0)
    if ledger.allow_rerun or fraction >= 1.0 or getattr(params, "private", False):
        return
    if sample_size(fraction, expected) >= expected:
        return
    raise PolicyRefused(f"the job samples a fraction {fraction:g} of its {expected} parties each round without DP, so "
                        "each round would release exact updates among another set of parties; this party releases "
                        "a data set exactly among one set only (docs/privacy.md): not joining (ask for fraction = 1 "
                        "or DP training; --allow-rerun to take part anyway)")


def check_job_fits(config: RunConfig, conn: Connection, challenge: pb.ChallengeResponse, params: JobParams,
                   data: PartyData, executor: Executor | None, work_limits: WorkLimits, progress: Progress) -> None:
    """The job type's own check of what this party can do (XCLP: memory and Paillier time)."""
    before_join = getattr(registry.get(challenge.spec.job_type).party_class(), "before_join", None)
    if before_join is None:
        return
    memory = default_max_memory() if config.max_memory_bytes is None else config.max_memory_bytes
    try:
        before_join(params, data, max_memory_bytes=memory, keypair=config.paillier,
                    work_limits=work_limits,
                    parties=len(challenge.spec.expected_parties), workers=worker_count(executor), progress=progress)
    except ResourceExhausted:
        decline(config, conn, challenge.run_nonce, pb.DeclineRequest.RESOURCES, progress)
        raise


def decline(config: RunConfig, conn: Connection, nonce: bytes, reason: pb.DeclineRequest.Reason,
            progress: Progress) -> None:
    """Tell the coordinator this party will not join the run, and why in one word (never the numbers
    or the rows: what exactly is said only on `progress`, to this party's own user)."""
    unsaid = conn.decline(config.identity, config.party_id, nonce, reason)
    if unsaid:
        progress(f"could not tell the coordinator that this party declines ({unsaid})")


@contextlib.contextmanager
def declining(config: RunConfig, conn: Connection, nonce: bytes, reason: pb.DeclineRequest.Reason,
              refused: type[BaseException], *, progress: Progress) -> Iterator[None]:
    """The block's `refused` errors are declined with `reason` (`decline`), then raised."""
    try:
        yield
    except refused:
        decline(config, conn, nonce, reason, progress)
        raise


def join_request(config: RunConfig, challenge: pb.ChallengeResponse, params: JobParams, data: PartyData,
                 x25519: X25519PrivateKey) -> tuple[identity.SignedBundle, pb.JoinRequest]:
    """The party's signed key bundle for the run (docs/design.md §4.1) and its Join: the bundle, its data
    summary and what its version understands."""
    keys = params.paillier
    # when the job hides the label mask the coordinator does not even learn how many rows are labeled
    summary = pb.DataSummary(rows=data.X.shape[0], dim=data.X.shape[1],
                             labeled_rows=0 if params.hides_labeled_rows else int(data.labeled.sum()),
                             schema=data.schema_digest)
    signed = identity.sign_bundle(config.identity, identity.KeyBundle(
        party_id=config.party_id, job_id=config.job_id, identity_public=identity.public_bytes(config.identity),
        x25519_public=masking.public_bytes(x25519), nonce=challenge.run_nonce,
        spec_digest=spec_digest(challenge.spec, challenge.run_nonce), rows=summary.rows,
        labeled_rows=summary.labeled_rows, dim=summary.dim,
        **paillier_fields(config.paillier.public if config.paillier and keys else None)))
    request = pb.JoinRequest(job_id=config.job_id, summary=summary,
                             capabilities=[RUN_ALIVE, KEEPS_PAIRS, KEEPS_PIECES, RESUMES, SPARSE_INFLUENCE,
                                           FINE_PIECES],
                             bundle=pb.SignedBundle(bundle=signed.bundle, signature=signed.signature))
    return signed, request


def with_paillier_key(config: RunConfig, params: JobParams, progress: Progress) -> RunConfig:
    """`config` with its Paillier key, made now (`paillier_bits`) if the job needs one and none was
    given: after the Challenge, so that a restarted party, which rejoins with the key it had, makes
    none. InvalidInput if the job needs a key and the party was started without one."""
    keys = params.paillier
    if keys is None or config.paillier is not None:
        return config
    if not config.paillier_bits:
        raise InvalidInput(f"job {config.job_id!r} runs XCLP: start the party with a Paillier key "
                           f"(--paillier-bits {keys.bits})")
    progress(f"generating a {config.paillier_bits}-bit Paillier key for this run")
    return replace(config, paillier=PaillierKeypair.generate(
        config.paillier_bits, allow_insecure_test_size=config.policy.insecure_test_keys))
