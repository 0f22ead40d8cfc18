"""What a party keeps of a training round to rejoin it (client/jobs/rounds_state.py), taken as its
process would write it at each point of a real FedAvg run and read back into a new job as a
restarted process does: before its sum is opened, the round again with the same update; once it
revealed, never a second masking of that round, whatever the coordinator asks."""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness import PARTIES, allow_list, coordinator, job, party_data, run_parties
from xclp.checkpoint import FORMAT as checkpoint_format
from xclp.checkpoint import Saved
from xclp.client import run_state
from xclp.client.jobs.fedavg import FedavgParty
from xclp.client.policy import PartyPolicy
from xclp.errors import ProtocolError
from xclp.v1 import training, wire
from xclp.v1 import xclp_pb2 as pb

FEDAVG = {"n_classes": 3, "hidden": [4], "rounds": 2, "local_epochs": 1, "batch_size": 8}


@pytest.fixture(scope="module")
def round_zero(keys):
    """(a's session after the run, its round-0 states: once trained, once revealed), as a's
    checkpoints took them (deep copies through the checkpoint format)."""
    taken: dict[str, Saved] = {}
    sessions: list = []
    real = run_state.checkpoint

    def checkpoint(session) -> None:
        job = session.job
        if session.config.party_id == "a" and isinstance(job, FedavgParty) and job.round == 0:
            meta, arrays = job.saved()  # type: ignore[misc]
            when = "revealed" if meta["revealed"] is not None else "trained" if meta["rows"] is not None else ""
            if when and when not in taken:
                taken[when] = Saved.from_bytes(Saved({"format": checkpoint_format, **meta}, arrays).to_bytes())
                sessions[:] = [session]
        real(session)

    mp = pytest.MonkeyPatch()
    mp.setattr(run_state, "checkpoint", checkpoint)
    try:
        datas = {p: party_data(150 + i) for i, p in enumerate(PARTIES)}
        with coordinator(allow_list(keys), [job("t", "fedavg", FEDAVG)]) as (_, addr):
            results = run_parties(addr, "t", keys, datas, policy=PartyPolicy(min_parties=2))
    finally:
        mp.undo()
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    return sessions[0], taken


def model_message(payload: np.ndarray) -> wire.Message:
    return wire.Message("t", training.scoped(0, training.MODEL_MSG), 0, "", "", payload)


def test_a_round_rejoined_before_its_sum_opened_masks_the_same_update(round_zero) -> None:
    session, taken = round_zero
    state = taken["trained"]
    job = FedavgParty.restored(session.context(), state.meta, state.arrays)
    assert job.round == 0 and job.update is not None
    np.testing.assert_array_equal(job.update[0], state.arrays["update"])
    job.on_message(model_message(state.arrays["model"]))  # the coordinator sends the round's model again
    vector = job._update(PARTIES)  # what its next attempt masks: the saved update, not a new training
    np.testing.assert_array_equal(vector, training.encode_update(state.arrays["update"], state.meta["rows"],
                                                                 job.params.frac_bits, 3))
    with pytest.raises(ProtocolError, match="another model than the one released for it"):
        job.on_message(model_message(state.arrays["model"] + 1e-6))


def test_a_round_rejoined_after_revealing_is_never_masked_again(round_zero) -> None:
    session, taken = round_zero
    state = taken["revealed"]
    job = FedavgParty.restored(session.context(), state.meta, state.arrays)
    with pytest.raises(ProtocolError, match="started again after this party revealed its update sum"):
        job.on_message(model_message(state.arrays["model"]))
    assert job.update_sum is not None
    with pytest.raises(ProtocolError, match="after this party revealed its self mask"):
        job.update_sum.on_step(pb.StepStart(step=training.UPDATE_STEP, round=5, participants=list(PARTIES)))
