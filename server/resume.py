"""A run that survives the coordinator's crash (docs/operating.md "Resume after a crash").

While a run is at a phase its job type can go on from (`CoordinatorJob.saved`: XCLP's
SecureHamming, and from its influence solve until SecureRowSums asks for reveals; a training
round's update sum until it asks for reveals), the coordinator writes a checkpoint at most every
CHECKPOINT_SECONDS: the roster (every party's signed key bundle, data summary and capabilities, and
a hash of its session token), who is in and who dropped, the step ledger, the preparation, and the
job's own part (XCLP: the membership, the pairs' roles, each party's own nearest rows, the
candidate schedule, and the graph's folded candidates with the pieces of each pair folded so far,
O(n·k), never H; past SecureHamming the graph W and the labeled rows; training: the round and its
model, DBCL's with its optimiser state and round seed). One file per run under the state
directory's `runs/`, written whole and renamed into place, 0600; removed as soon as the run leaves
that phase, asks for reveals (`Run.checkpoint_stale`: a sum being opened is never asked for again)
or ends, so a stale one is never read back.

Killed and started again on the same state, the coordinator reads each running run's checkpoint
back (`restore`): it checks every bundle again against its allow-list, this run's nonce and the
job's spec, keeps each party's place for the job's `reconnect_seconds`, and starts the phase's next
attempt (SecureHamming: every pair from its first piece not folded, under fresh mask seeds; past
it, the solve again and SecureRowSums at a later attempt; a round again from its start). The
parties' resumed Pull streams carry on from there; a party that does not come back is dropped as
after any lost connection. A run with no checkpoint, or one that cannot be read back, ends as
interrupted, as before. What goes on disk is what the coordinator holds anyway (the public roster,
row counts, and the candidates it learns by design); never data, keys, masks, seeds or tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from xclp.checkpoint import FORMAT, Saved, scaling_of, with_scaling
from xclp.crypto.identity import SignedBundle, session_id
from xclp.errors import InvalidInput
from xclp.server import liveness
from xclp.server.admission import check_bundle
from xclp.server.config import JobConfig
from xclp.server.events import Observer
from xclp.server.jobs.summary import StepLedger
from xclp.server.mailbox import Party
from xclp.v1 import xclp_pb2 as pb

if TYPE_CHECKING:
    from xclp.server.run import Run

log = logging.getLogger("xclp.server")

CHECKPOINT_SECONDS = 5.0  # at most this often per run: a crash redoes at most what came since
POLL_SECONDS = 1.0  # how often the saver looks for a checkpoint due
MESSAGE_ID_GAP = 1 << 32  # more messages than a run sends between two checkpoints


def snapshot(run: Run, token_hashes: Mapping[str, bytes], definition: tuple[str, str]) -> Saved | None:
    """What `run` needs to go on after a restart, or None where it cannot (its job type's phase, or
    a party that could not reconnect). Under the run's lock; every array a copy."""
    if run.config.reconnect_seconds <= 0 or not all(
            liveness.may_reconnect(run.parties[p], run.config.reconnect_seconds) for p in run.active):
        return None
    part = run.job.saved(run)
    if part is None:
        return None
    job_meta, arrays = part
    parties = {pid: {"bundle": p.signed.bundle.hex(), "signature": p.signed.signature.hex(),
                     "summary": p.summary.SerializeToString().hex(), "capabilities": sorted(p.capabilities),
                     "token": token_hashes.get(pid, b"").hex()} for pid, p in run.parties.items()}
    meta = {"format": FORMAT, "run_id": run.run_id, "job_id": run.config.job_id, "nonce": run.run_nonce.hex(),
            "definition": list(definition), "parties": parties, "active": list(run.active),
            "dropped": sorted(run.dropped), "drop_reasons": dict(run.drop_reasons), "root": list(run.scope.members),
            "past_steps": dict(run.past_steps), "ledger": run.ledger.as_dict(), "next_message": run.post.next_id,
            "elapsed": round(run.clock() - run.started_at, 3),
            "job": job_meta}
    return with_scaling(Saved(meta, arrays), run.scaling)


def restore(saved: Saved, config: JobConfig, allow_list: Mapping[str, bytes], *, clock: Callable[[], float],
            observer: Observer | None = None) -> tuple[Run, dict[bytes, str]]:
    """The run `saved` describes, going on at its next attempt, and its parties' token hashes;
    InvalidInput if it cannot go on (a bundle no longer allowed or for another spec, a roster that
    does not match its session)."""
    from xclp.server.run import Run  # the run imports what it runs; this module only builds one

    meta = saved.meta
    if meta["job_id"] != config.job_id:
        raise InvalidInput(f"the checkpoint is of job {meta['job_id']!r}, not {config.job_id!r}")
    run = Run(config, allow_list, clock=clock, observer=observer)
    nonce = bytes.fromhex(meta["nonce"])
    run.lobby.adopt(nonce)
    run.run_nonce = nonce
    run.run_id = str(meta["run_id"])
    now, tokens = clock(), {}
    for pid, p in sorted(meta["parties"].items()):
        signed = SignedBundle(bytes.fromhex(p["bundle"]), bytes.fromhex(p["signature"]))
        bundle = check_bundle(config, allow_list, nonce, signed)  # still allow-listed, this job, this run
        run.lobby.check_spec(bundle)  # and the job's spec as it was signed
        if bundle.party_id != pid:
            raise InvalidInput(f"the checkpoint files {bundle.party_id!r}'s bundle under {pid!r}")
        party = run.parties[pid] = Party(bundle, signed, pb.DataSummary.FromString(bytes.fromhex(p["summary"])),
                                         capabilities=frozenset(p["capabilities"]))
        party.mailbox.keeps_sent = party.mailbox.streaming = party.mailbox.renumber = True
        party.heard_at, party.lost_at = now, now  # its place is kept for reconnect_seconds
        if p["token"]:
            tokens[bytes.fromhex(p["token"])] = pid
    run.session_id = session_id(run.parties[p].signed.bundle for p in sorted(run.parties))
    run.active = [p for p in meta["active"] if p in run.parties]
    run.dropped, run.drop_reasons = set(meta["dropped"]), dict(meta["drop_reasons"])
    for pid in sorted(set(run.parties) - set(run.active)):  # dropped: one that comes back hears it again
        run._end(pid, pb.JobEnd.DROPPED, run.drop_reasons.get(pid, "dropped"))
    run.past_steps = {k: int(v) for k, v in meta["past_steps"].items()}
    run.ledger = StepLedger.of(meta["ledger"])
    run.post.skip_ids(int(meta["next_message"]) + MESSAGE_ID_GAP)
    run.started_at = now - float(meta["elapsed"])  # max_run_seconds counts the time before the crash
    run.scaling = scaling_of(saved)
    arrays = {k: v for k, v in saved.arrays.items() if not k.startswith("scaling.")}
    with run.lock:
        run.start_restored(meta["root"], lambda: run.job.resumed(run, meta["job"], arrays))
    return run, tokens


class Checkpoints:
    """The checkpoint files of a coordinator's runs: `directory`/<run id>.ckpt, the coordinator's alone."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()  # a write's rename and a removal, never both
        # per run, how many times its checkpoint was removed: a write of a snapshot taken before the
        # last removal (its phase over since) is not renamed into place
        self._generation: dict[str, int] = {}

    def generation(self, run_id: str) -> int:
        """To take with a snapshot, under the run's lock (as `remove` is called)."""
        with self._lock:
            return self._generation.get(run_id, 0)

    def path(self, run_id: str) -> Path:
        return self.directory / f"{int(run_id)}.ckpt"

    def write(self, run_id: str, saved: Saved, generation: int) -> bool:
        """Write the checkpoint whole, then rename it into place unless `remove` came since the
        snapshot (taken at `generation`); whether it did."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = self.path(run_id)
        tmp = target.with_suffix(f".tmp{threading.get_ident()}")
        data = saved.to_bytes()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            with self._lock:
                if self._generation.get(run_id, 0) != generation:
                    tmp.unlink()
                    return False
                os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return True

    def remove(self, run_id: str) -> None:
        """The run left the phase it was saved in (or ended): its checkpoint is gone, and stays gone."""
        with self._lock:
            self._generation[run_id] = self._generation.get(run_id, 0) + 1
            with contextlib.suppress(FileNotFoundError):
                self.path(run_id).unlink()

    def read(self, run_id: str) -> Saved | None:
        """The run's checkpoint, None if it has none; InvalidInput if it cannot be read."""
        try:
            data = self.path(run_id).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise InvalidInput(f"cannot read {self.path(run_id)}: {exc.strerror}") from None
        return Saved.from_bytes(data)


def token_hash(token: bytes) -> bytes:
    """What the coordinator keeps of a session token, in memory and in a checkpoint."""
    return hashlib.sha256(token).digest()


Saveable = tuple["Run", dict[str, bytes], tuple[str, str]]  # a run, its parties' token hashes, its job file


class Saver(threading.Thread):
    """Writes each running run's checkpoint at most every CHECKPOINT_SECONDS while its program is at
    a phase that can go on after a crash: taken under the run's lock (copies), written outside it,
    and only when something changed. `live` gives (run, its parties' token hashes, its job file)."""

    def __init__(self, checkpoints: Checkpoints, live: Callable[[], list[Saveable]], stop: threading.Event) -> None:
        super().__init__(name="xclp-checkpoints", daemon=True)
        self.checkpoints, self.live, self.stop = checkpoints, live, stop
        self._written: dict[str, tuple[float, str, int]] = {}  # run id -> (when, what its meta said, generation)
        self._failed: set[str] = set()  # runs whose checkpoint failed: said once, not every second

    def run(self) -> None:
        while not self.stop.wait(POLL_SECONDS):
            for job, tokens, definition in self.live():
                try:
                    self.save(job, tokens, definition)
                except Exception:  # a full disk, a state directory it cannot write, a bug: the run goes on
                    if job.run_id not in self._failed:
                        self._failed.add(job.run_id)
                        log.exception("job %s: run %s: its checkpoint cannot be written (said once; the run goes "
                                      "on, and a crash would interrupt it)", job.config.job_id, job.run_id)

    def keep(self, job: Run, tokens: dict[str, bytes], definition: tuple[str, str]) -> bool:
        """At a graceful stop: the run's checkpoint as it stands now, written; False where it cannot go
        on from here (its phase is not saved, or the write failed), and it is to be interrupted."""
        with job.lock:
            saved = None if job.stage.ended or not definition[0] else snapshot(job, tokens, definition)
            generation = self.checkpoints.generation(job.run_id)
        if saved is None or not self.checkpoints.write(job.run_id, saved, generation):
            return False
        log.warning("job %s: run %s is saved, and goes on when the coordinator starts again on this state; its "
                    "parties wait %g s for it", job.config.job_id, job.run_id, job.config.reconnect_seconds)
        return True

    def save(self, job: Run, tokens: dict[str, bytes], definition: tuple[str, str], *, force: bool = False) -> bool:
        """Write `job`'s checkpoint if one is due and something changed (`force`: now); whether it did.
        The first of a phase (its file was removed since the last write) is due at once: a crash
        early in a phase goes on from it too."""
        now = time.monotonic()
        when, last, written = self._written.get(job.run_id, (-CHECKPOINT_SECONDS, "", -1))
        if not definition[0] or (now - when < CHECKPOINT_SECONDS and not force
                                 and self.checkpoints.generation(job.run_id) == written):
            return False
        with job.lock:
            if job.stage.ended:
                return False
            saved = snapshot(job, tokens, definition)
            generation = self.checkpoints.generation(job.run_id)
        if saved is None:
            return False
        said = json.dumps({k: v for k, v in saved.meta.items() if k != "elapsed"}, sort_keys=True)
        if (said == last and generation == written) or not self.checkpoints.write(job.run_id, saved, generation):
            return False
        self._written[job.run_id] = (now, said, generation)
        return True
