"""A party's sealed run state (client/run_state.py): what a party killed in SecureHamming rejoins
its run with. Sealed under its identity key, bound to the party and the job, private, and never
read back for another run or another table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.harness import party_data
from xclp.checkpoint import Saved
from xclp.client import run_state
from xclp.client.connection import ConnectionConfig
from xclp.client.ledger import Ledger, data_digest
from xclp.client.run_config import RunConfig
from xclp.client.run_state import RunStateFile
from xclp.client.session import PartySession
from xclp.errors import InvalidInput
from xclp.v1 import xclp_pb2 as pb

SECRET = b"\x8f" * 24  # stands for the Paillier key, the seed, the X25519 key


def state(meta: dict | None = None) -> Saved:
    return Saved({"format": run_state.FORMAT, "run_id": "7", "nonce": (b"n" * 16).hex(),
                  "spec": pb.JobSpec(job_id="x", job_type="xclp").SerializeToString().hex(), **(meta or {})},
                 {"slices": np.frombuffer(SECRET, dtype=np.uint8)})


def test_the_run_state_is_sealed_private_and_bound_to_the_party_and_the_job(keys, tmp_path: Path) -> None:
    file = RunStateFile(tmp_path, "a", "x", keys["a"])
    file.save(state())
    raw = file.path.read_bytes()
    assert SECRET not in raw and b"run_id" not in raw  # nothing readable at rest
    assert file.path.stat().st_mode & 0o777 == 0o600
    assert file.load().arrays["slices"].tobytes() == SECRET  # type: ignore[union-attr]
    for other in (RunStateFile(tmp_path, "a", "x", keys["b"]),  # another identity key
                  RunStateFile(tmp_path, "b", "x", keys["a"])):  # another party name, the same file
        other.path = file.path
        with pytest.raises(InvalidInput, match="cannot be opened with this party's identity key"):
            other.load()
    assert RunStateFile(tmp_path, "a", "y", keys["a"]).path != file.path  # one file per job ...
    assert RunStateFile(tmp_path, "b", "x", keys["b"]).path != file.path  # ... and party
    file.path.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))  # a flipped bit
    with pytest.raises(InvalidInput, match="cannot be opened"):
        file.load()
    file.delete()
    assert file.load() is None


def session_at(keys, tmp_path: Path, seed: int = 1) -> PartySession:
    config = RunConfig("x", "a", keys["a"], ConnectionConfig("127.0.0.1:1", insecure=True),
                       ledger=Ledger(tmp_path, identity=keys["a"]))
    lines: list[str] = []
    session = PartySession(config, party_data(seed, n=12), progress=lines.append)
    session.data_digest = data_digest(session.data)  # as reading the table does (PartySession._load_data)
    session.said = lines  # type: ignore[attr-defined]
    return session


def challenge(run_id: str = "7") -> pb.ChallengeResponse:
    return pb.ChallengeResponse(run_id=run_id, run_nonce=b"n" * 16, spec=pb.JobSpec(job_id="x", job_type="xclp"))


def test_a_state_of_a_run_that_is_over_is_deleted_and_the_party_joins_afresh(keys, tmp_path: Path) -> None:
    session = session_at(keys, tmp_path)
    file = RunStateFile(tmp_path, "a", "x", keys["a"])
    file.save(state({"data": session.data_digest.hex()}))
    assert run_state.saved_for(session, challenge("8")) is None
    assert not file.path.exists()
    assert any("that run is over" in line for line in session.said)  # type: ignore[attr-defined]
    file.save(state({"data": session.data_digest.hex()}))
    got = run_state.saved_for(session, challenge("7"))  # its own run: read back
    assert got is not None and got.meta["run_id"] == "7"


def test_a_party_restarted_on_another_table_cannot_rejoin(keys, tmp_path: Path) -> None:
    session = session_at(keys, tmp_path)
    file = RunStateFile(tmp_path, "a", "x", keys["a"])
    file.save(state({"data": data_digest(party_data(2, n=12)).hex()}))
    with pytest.raises(InvalidInput, match="table is not the one it ran run 7 with"):
        run_state.saved_for(session, challenge("7"))
    assert not file.path.exists()


def test_a_state_sealed_under_another_identity_is_deleted_and_said(keys, tmp_path: Path) -> None:
    session = session_at(keys, tmp_path)
    other = RunStateFile(tmp_path, "a", "x", keys["b"])
    other.save(state({"data": session.data_digest.hex()}))
    assert run_state.saved_for(session, challenge("7")) is None
    assert not other.path.exists()
    assert any("cannot be opened" in line and "joining afresh" in line
               for line in session.said)  # type: ignore[attr-defined]


def test_the_pooled_scaling_goes_through_a_checkpoint_whole() -> None:
    """The preparation both the coordinator's checkpoint and the party's run state carry
    (xclp/checkpoint.py): read back exactly, and absent when the job prepared nothing."""
    from xclp.checkpoint import scaling_of, with_scaling
    from xclp.data.prep import Scaling

    scaling = Scaling(np.array([0.5, -1.25]), np.array([2.0, 0.125]), np.array([True, False]), True, False)
    back = scaling_of(Saved.from_bytes(with_scaling(state(), scaling).to_bytes(), run_state.FORMAT))
    assert back is not None and (back.standardise, back.impute) == (True, False)
    for part in ("mean", "std", "kept"):
        np.testing.assert_array_equal(getattr(back, part), getattr(scaling, part))
    assert back.kept.dtype == bool
    assert scaling_of(Saved.from_bytes(with_scaling(state(), None).to_bytes(), run_state.FORMAT)) is None


@pytest.mark.parametrize("noisy", [False, True], ids=["exact", "label-dp"])
def test_xclps_row_sums_state_gives_back_the_same_zbar_and_none_once_revealed(keys, tmp_path: Path, noisy) -> None:
    """What an XCLP party keeps for SecureRowSums (client/jobs/xclp_state.Whole), sealed and read back:
    the graph layout, the influence digest and Z̄ as released — with label-DP the noisy release as
    drawn and its plan, so a restarted party masks the same values and draws no fresh noise (a
    second draw would be a second release of its labels). Once it revealed, nothing is kept."""
    from types import SimpleNamespace

    from xclp.client.jobs import xclp_state
    from xclp.client.jobs.xclp import XclpParty
    from xclp.client.steps import xclp as steps
    from xclp.privacy import label_dp

    rng = np.random.default_rng(3)
    graph = (("a", 10), ("b", 15), ("c", 15))
    exact = rng.random((40, 3))
    plan = label_dp.LabelDpPlan(1.0, 1e-6, 1.7, 2.4, 30, 20, 3.5)
    zbar = steps.NoisyRowSums(rng.integers(0, 2**63, size=(40, 3), dtype=np.uint64), plan) if noisy else exact
    privacy = {"mechanism": "skellam", "epsilon_spent": 1.0} if noisy else None
    stage = xclp_state.Whole({"a": 10, "b": 15, "c": 15}, graph, b"\x07" * 32, zbar, privacy,
                             {"influence_tolerance": 1e-4, "columns": 4, "dropped_max": 0.5})
    revealed = SimpleNamespace(revealed=False)
    job = SimpleNamespace(stage=stage, row_sums=SimpleNamespace(self_masks=revealed))
    meta, arrays = XclpParty.saved(job)  # type: ignore[arg-type, misc]
    file = RunStateFile(tmp_path, "a", "x", keys["a"])
    file.save(Saved({"format": run_state.FORMAT, "job": meta}, arrays))
    back = file.load()
    assert back is not None and xclp_state.stage_of(back.meta["job"]) == "whole"
    fresh = xclp_state.Whole.restored(back.meta["job"], back.arrays)
    assert (fresh.graph, fresh.block, fresh.sizes) == (graph, stage.block, stage.sizes)
    assert fresh.label_privacy == privacy
    assert fresh.approximation == stage.approximation  # what a sparse influence left out, reported after a restart
    if noisy:
        assert isinstance(fresh.zbar, steps.NoisyRowSums) and fresh.zbar.plan == plan
        np.testing.assert_array_equal(fresh.zbar.encoded, zbar.encoded)  # type: ignore[union-attr]
    else:
        np.testing.assert_array_equal(fresh.zbar, exact)
    revealed.revealed = True
    assert XclpParty.saved(job) is None  # type: ignore[arg-type]


def test_a_run_state_an_earlier_version_wrote_is_refused_with_its_reason_never_misread(keys, tmp_path: Path) -> None:
    """A state sealed by the version before the staged XCLP state (run-state format 1: the job's
    part a loose table of sizes, graph and Z̄) is refused, saying why, and deleted: read as this
    version's it would be misread (or fail with a KeyError deep in a rejoin). An XCLP part of
    another version inside a current file is refused as well."""
    from xclp.client.jobs import xclp_state

    old = {"format": 1, "run_id": "7", "nonce": (b"n" * 16).hex(),
           "spec": pb.JobSpec(job_id="x", job_type="xclp").SerializeToString().hex(),
           "job": {"sizes": {"a": 10}, "graph": [["a", 10]], "block": "07" * 32, "label_privacy": None}}
    file = RunStateFile(tmp_path, "a", "x", keys["a"])
    file.save(Saved(old, {"zbar": np.zeros((10, 2))}))
    with pytest.raises(InvalidInput, match=r"was written by another version of xclp-client \(a checkpoint of another "
                                           r"format \(1\), written by another version: this version reads "
                                           r"format 2\)"):
        file.load()
    session = session_at(keys, tmp_path)
    challenge = pb.ChallengeResponse(run_id="7", run_nonce=b"n" * 16, spec=pb.JobSpec(job_id="x", job_type="xclp"))
    assert run_state.saved_for(session, challenge) is None  # joins afresh ...
    assert not file.path.exists()  # ... its state deleted,
    assert any("written by another version of xclp-client" in line for line in session.said)  # type: ignore[attr-defined]
    with pytest.raises(InvalidInput, match="saved XCLP run state is of version 1, this xclp-client reads version 2"):
        xclp_state.stage_of(old["job"])
