"""A party's durable run state: what a party whose process was killed in SecureHamming, in XCLP's
SecureRowSums, or in a training round, needs to rejoin its run when started again with the same
command (docs/operating.md "A party killed and restarted").

At every SecureHamming attempt it starts (before it encrypts its bit slices, and again once it
has them), once its Z̄ for SecureRowSums is whole, and in training at every round's model, update,
reveal and model-chain link, the party writes one file under its state directory's `runs/` (next
to its privacy ledger): the run (id, session token, nonce, job spec), its own signed key bundle and
the roster (verified again when read back), its X25519 key (the pairwise secrets and masks follow
from it), the common seed, its step guard and transcript, its ledger account, its Paillier key
pair if it has one, and the job's own part (XCLP: client/jobs/xclp_state.py; training:
client/jobs/rounds_state.py). It is sealed with AES-256-GCM under a key derived by HKDF from the
party's identity key, bound to the party and the job, written whole and renamed into place, 0600;
it is deleted when the run ends (or reaches a step it cannot be rejoined in), whatever the outcome,
and kept only when the process is stopped (SIGTERM, Ctrl-C) or killed, so that the same command
can rejoin within the job's `reconnect_seconds`.

Started again, the party asks the coordinator for the job's run as always; if it is the run its
state names, it reads the state back (its data must be the same table: the digest is checked),
opens its Pull stream with `restarted`, and the coordinator starts the next SecureHamming attempt
with it, every pair from its first piece not folded (SecureRowSums: the sum's next attempt among
the same parties; training: it sends the round's model again and starts the round's update sum
again with it), unless the sum is being opened. A state that names another run, or that cannot be
opened with this identity key, is deleted and the party joins afresh.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from gmpy2 import mpz

from xclp.checkpoint import OtherFormat, Saved, scaling_of, with_scaling
from xclp.client.ledger import Ledger, RunAccount, Spend
from xclp.crypto import aead
from xclp.crypto.kdf import hkdf_sha256
from xclp.crypto.paillier import PaillierKeypair, PaillierPublicKey
from xclp.errors import InvalidInput, ProtocolError
from xclp.runtime import write_atomic
from xclp.v1 import xclp_pb2 as pb

if TYPE_CHECKING:
    from xclp.client.context import PartyContext
    from xclp.client.jobs.base import PartyJob
    from xclp.client.session import PartySession

__all__ = ["FORMAT", "RunStateFile", "Saved", "account_of", "checkpoint", "forget", "kept", "paillier_of",
           "restored_job", "saved_for", "scaling_of", "snapshot"]  # Saved, scaling_of: for the session

RUNS_DIR = "runs"
FORMAT = 2  # 2: XCLP's part is its staged state (client/jobs/xclp_state.py); 1 is refused with that reason
_MAGIC = b"xclp/run-state/v1"


class RunStateFile:
    """The sealed file of one party's run state for one job (module docstring)."""

    def __init__(self, directory: Path, party_id: str, job_id: str, key: Ed25519PrivateKey) -> None:
        # one per party and job: parties sharing a state directory never read each other's
        name = hashlib.sha256(party_id.encode() + b"\x00" + job_id.encode()).hexdigest()[:24]
        self.path = Path(directory) / RUNS_DIR / f"{name}.sealed"
        self._aad = _MAGIC + b"\x00" + party_id.encode() + b"\x00" + job_id.encode()
        raw = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        self._key = hkdf_sha256(raw, salt=b"xclp/run-state", info=_MAGIC)

    def save(self, saved: Saved) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(self.path, aead.seal(self._key, saved.to_bytes(), aad=self._aad))

    def load(self) -> Saved | None:
        """The state, or None if there is none; InvalidInput if it cannot be opened or read."""
        try:
            sealed = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise InvalidInput(f"cannot read the run state {self.path}: {exc.strerror}") from None
        try:
            return Saved.from_bytes(aead.open_sealed(self._key, sealed, aad=self._aad), FORMAT)
        except OtherFormat as exc:
            raise InvalidInput(f"the run state {self.path} was written by another version of xclp-client ({exc}): "
                               "it cannot rejoin that run") from None
        except (aead.SealBroken, InvalidInput) as exc:
            raise InvalidInput(f"the run state {self.path} cannot be opened with this party's identity key for "
                               f"this job ({exc})") from None

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)


def snapshot(session: PartySession, token: bytes) -> Saved | None:
    """What `session` needs to rejoin its run, or None where its job cannot go on from here: the
    values' own saved parts (its membership, step guard, job, ledger account), sealed together."""
    job, member, keypair, account = session.job, session.member, session.config.paillier, session.account
    if job is None or member is None or session.params is None:
        return None
    keys, part = member.saved(), job.saved()
    if keys is None or part is None:
        return None
    job_meta, arrays = part
    meta: dict[str, Any] = {
        "format": FORMAT, "run_id": session.run_id, "token": token.hex(),
        "spec": session.spec.SerializeToString().hex(), **keys, "participants": list(session.participants),
        "guard": session.guard.saved(), "data": session.data_digest.hex(),
        "params": session.params.resolved(),  # what the roster's row counts made concrete, never resolved again
        "paillier": None if keypair is None else {
            "n": str(keypair.public.n), "h_s": str(keypair.public.h_s), "exponent_bits": keypair.public.exponent_bits,
            "p": str(keypair.p), "q": str(keypair.q)},
        "job": job_meta}
    if account is not None:
        meta["account"] = {"run": account.run, "charged": account.charged,
                           "spends": [{**asdict(s), "rdp": list(s.rdp) if s.rdp is not None else None}
                                      for s in account.spends],
                           "curves": {k: list(v) for k, v in account.curves.items()}}
    return with_scaling(Saved(meta, arrays), session.prep.scaling if session.prep is not None else None)


def paillier_of(meta: dict[str, Any]) -> PaillierKeypair | None:
    k = meta["paillier"]
    if k is None:  # a job without XCLP
        return None
    public = PaillierPublicKey(mpz(k["n"]), mpz(k["h_s"]), int(k["exponent_bits"]))
    return PaillierKeypair(public, mpz(k["p"]), mpz(k["q"]))


def account_of(meta: dict[str, Any], ledger: Ledger | None, job_id: str, data: bytes) -> RunAccount | None:
    """The run's ledger account as it was (its charge keys and whether they were charged: a
    restarted party never charges its run twice)."""
    saved = meta.get("account")
    if saved is None or ledger is None:
        return None
    spends = tuple(Spend(**{**s, "rdp": tuple(s["rdp"]) if s["rdp"] is not None else None}) for s in saved["spends"])
    return RunAccount(ledger, data, job_id, saved["run"], spends, bool(saved["charged"]),
                      {k: tuple(v) for k, v in saved["curves"].items()})


def restored_job(job_type: str, ctx: PartyContext, saved: Saved) -> PartyJob:
    """The job's part of `saved`, read back by the job type's own `restored`."""
    from xclp.v1 import registry

    restored = getattr(registry.get(job_type).party_class(), "restored", None)
    if restored is None:
        raise ProtocolError(f"a {job_type} job does not resume")
    return restored(ctx, saved.meta["job"], saved.arrays)


def spec_of(meta: dict[str, Any]) -> pb.JobSpec:
    spec = pb.JobSpec()
    spec.ParseFromString(bytes.fromhex(meta["spec"]))
    return spec


def _file(session: PartySession) -> RunStateFile | None:
    """Where the session's run state goes: beside its privacy ledger (none without one)."""
    config = session.config
    if config.ledger is None:
        return None
    return RunStateFile(config.ledger.directory, config.party_id, config.job_id, config.identity)


def checkpoint(session: PartySession) -> None:
    """Write the session's run state again (its job asks, PartyContext.checkpoint), or delete it
    once its job can no longer go on from where it is. Never fails the run: a state that cannot
    be written is said once, and the run goes on without it."""
    file = _file(session)
    token = session.token
    if file is None or token is None:
        return
    try:
        saved = snapshot(session, token)
        if saved is None:
            file.delete()
        else:
            file.save(saved)
    except OSError as exc:
        if not session.state_unsaved:
            session.progress(f"WARNING: cannot write the run state {file.path} ({exc.strerror}): if this process "
                             "is killed it cannot rejoin the run")
        session.state_unsaved = True


def kept(session: PartySession) -> bool:
    """The process is stopped (SIGTERM, Ctrl-C) while its run goes on: the state stays, said so."""
    file = _file(session)
    if file is None or not file.path.exists():
        return False
    session.progress(f"the run state is kept in {file.path}: the same command within the job's reconnect_seconds "
                     "rejoins the run")
    return True


def forget(session: PartySession) -> None:
    """The run is over for this party (done, failed, or it stopped with an error): its state goes."""
    file = _file(session)
    if file is not None:
        file.delete()


def saved_for(session: PartySession, challenge: pb.ChallengeResponse) -> Saved | None:
    """The saved state of the run the coordinator offers, if this party has one; a state of another
    run, or one that cannot be opened, is deleted (said so) and the party joins afresh."""
    file = _file(session)
    if file is None:
        return None
    try:
        saved = file.load()
    except InvalidInput as exc:
        session.progress(f"WARNING: {exc}: deleted; joining afresh")
        file.delete()
        return None
    if saved is None:
        return None
    if saved.meta.get("run_id") != challenge.run_id or bytes.fromhex(saved.meta["nonce"]) != challenge.run_nonce \
            or spec_of(saved.meta) != challenge.spec:
        session.progress(f"a saved state of run {saved.meta.get('run_id')!r} is here, but that run is over (the "
                         f"coordinator offers run {challenge.run_id or 'none'}): deleted; joining afresh")
        file.delete()
        return None
    if saved.meta["data"] != session.data_digest.hex():
        file.delete()
        raise InvalidInput(f"this party's table is not the one it ran run {challenge.run_id} with: it cannot rejoin "
                           "that run (its state is deleted); the coordinator drops it after reconnect_seconds")
    return saved
