"""The checkpoint a coordinator writes in a training round (server/jobs/training.py, server/resume.py):
taken while the round's update sum can still start again, never once its holders are asked to
reveal, and read back as the round again from its start, its sum at a later attempt among the same
parties. The checkpoints are taken as the Saver takes them, at each step of round 0's sum of a real
run; `restore` builds the run again as a restarted coordinator does.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness import PARTIES, allow_list, coordinator, job, party_data, run_parties
from xclp.client.policy import PartyPolicy
from xclp.dbcl import RoundView, draw_sketches
from xclp.errors import InvalidInput
from xclp.fedavg import initial_network
from xclp.server.phases.base import attempt_after_restart
from xclp.server.phases.masked_sum import MaskedSum
from xclp.server.resume import Saved, restore, snapshot
from xclp.server.run import Run
from xclp.v1 import dbcl, training, wire
from xclp.v1.registry import parse_params

FEDAVG = {"n_classes": 3, "hidden": [4], "rounds": 2, "local_epochs": 1, "batch_size": 8}
DBCL = {"n_classes": 3, "hidden": [4], "rounds": 2, "batch_size": 8}


def checkpoints_of_round_0(keys, monkeypatch, job_type: str, params: dict):
    """{(step, attempt): the checkpoint taken as it started, or None}, the steps running when the
    run's checkpoint was declared stale, and the job."""
    real_start, real_stale = Run.start_step, Run.checkpoint_stale
    taken: dict[tuple[str, int], Saved | None] = {}
    stale: list[str] = []

    def start_step(self, scope, name, participants, attempt):
        step = real_start(self, scope, name, participants, attempt)
        if step.wire.startswith("r0.update"):
            got = snapshot(self, {}, ("", ""))
            taken[(step.wire, attempt)] = None if got is None else Saved.from_bytes(got.to_bytes())
        return step

    def checkpoint_stale(self):
        stale.append(self.step.wire if self.step is not None else "")
        real_stale(self)

    monkeypatch.setattr(Run, "start_step", start_step)
    monkeypatch.setattr(Run, "checkpoint_stale", checkpoint_stale)
    config = job("t", job_type, params, reconnect_seconds=30.0)
    datas = {p: party_data(130 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [config]) as (_, addr):
        results = run_parties(addr, "t", keys, datas,
                              policy=PartyPolicy(min_parties=2, allow_non_dp_dbcl=True))
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    return taken, stale, config


def test_a_round_is_saved_until_its_sum_is_opened_and_goes_on_from_its_start(keys, monkeypatch) -> None:
    taken, stale, config = checkpoints_of_round_0(keys, monkeypatch, "fedavg", FEDAVG)
    masked, confirm = taken[("r0.update", 0)], taken[("r0.update_confirm", 0)]
    assert masked is not None and confirm is not None
    assert taken[("r0.update_reveal", 0)] is None  # a sum being opened is never asked for again
    assert "r0.update_confirm" in stale  # and the file is removed before any party is asked to reveal
    p = parse_params("fedavg", FEDAVG)
    theta0 = initial_network(p.architecture(8), p.seed).flat
    for saved in (masked, confirm):
        assert {k: saved.meta["job"][k] for k in ("round", "attempt", "members", "skipped", "history")} == \
            {"round": 0, "attempt": 0, "members": list(PARTIES), "skipped": [], "history": []}
        np.testing.assert_array_equal(saved.arrays["theta"], theta0)
    run, _ = restore(masked, config, allow_list(keys), clock=lambda: 0.0)
    assert isinstance(run.phase, MaskedSum) and run.step is not None
    later = attempt_after_restart(0, len(PARTIES))
    assert (run.step.wire, run.step.attempt, run.step.participants) == ("r0.update", later, PARTIES)
    for party in PARTIES:  # the round's model again, then its sum at the later attempt
        mailbox = run.parties[party].mailbox
        items = [mailbox.get(0) for _ in range(3)]
        [message] = [m for i in items if i is not None and i.HasField("frame")
                     and (m := wire.Assembler().add(i.frame)) is not None]
        assert message.step == training.scoped(0, training.MODEL_MSG)
        np.testing.assert_array_equal(message.payload, theta0)
        [start] = [i.step for i in items if i is not None and i.HasField("step")]
        assert (start.step, start.round) == ("r0.update", attempt_after_restart(0, len(PARTIES)))


def test_a_dbcl_round_goes_on_with_its_own_seed_and_view(keys, monkeypatch) -> None:
    """W, the optimiser's state and the round's seed are saved; the round again sends the same seed
    and so the same released view (the parties refuse any other)."""
    taken, stale, config = checkpoints_of_round_0(keys, monkeypatch, "dbcl", {**DBCL, "optimiser": "rmsprop"})
    saved = taken[("r0.update", 0)]
    assert saved is not None and taken[("r0.update_reveal", 0)] is None and "r0.update_confirm" in stale
    assert saved.arrays["seed"].shape == (dbcl.SEED_BYTES,) and saved.arrays["optimiser"].size == 0  # no step yet
    run, _ = restore(saved, config, allow_list(keys), clock=lambda: 0.0)
    assert (run.step.wire, run.step.attempt) == ("r0.update", attempt_after_restart(0, len(PARTIES)))  # type: ignore[union-attr]
    trainer = run.job.trainer
    p = parse_params("dbcl", DBCL)
    net0 = initial_network(p.architecture(8), p.seed)
    np.testing.assert_array_equal(trainer.net.flat, net0.flat)
    view = RoundView.release(net0, draw_sketches(net0.arch, p.layers, p.sketch, p.sizes(8),
                                                 bytes(saved.arrays["seed"]))).flat()
    mailbox = run.parties["a"].mailbox
    items = [mailbox.get(0) for _ in range(4)]
    messages = {m.step: m.payload for i in items if i is not None and i.HasField("frame")
                and (m := wire.Assembler().add(i.frame)) is not None}
    assert bytes(messages[training.scoped(0, dbcl.SEED_MSG)]) == bytes(saved.arrays["seed"])
    np.testing.assert_array_equal(messages[training.scoped(0, training.MODEL_MSG)], view)


def test_a_training_checkpoint_that_does_not_fit_the_job_is_refused(keys, monkeypatch) -> None:
    """A checkpoint whose model, seed or optimiser state does not fit the job's network (another
    version's, or a damaged file) is refused with a reason: the coordinator then marks the run
    interrupted (tests/server/test_checkpoint.py), it never trains on it."""
    taken, _, config = checkpoints_of_round_0(keys, monkeypatch, "dbcl", DBCL)
    saved = taken[("r0.update", 0)]
    assert saved is not None
    for name, bad, why in [("seed", saved.arrays["seed"][:5], "the saved round seed or optimiser state does not fit"),
                           ("optimiser", np.ones(3), "the saved round seed or optimiser state does not fit"),
                           ("theta", saved.arrays["theta"][:-1], "the parameters of a .* network are float64"),
                           ("theta", np.full_like(saved.arrays["theta"], np.nan), "NaN or infinity")]:
        with pytest.raises(InvalidInput, match=why):
            restore(Saved(saved.meta, {**saved.arrays, name: bad}), config, allow_list(keys), clock=lambda: 0.0)
