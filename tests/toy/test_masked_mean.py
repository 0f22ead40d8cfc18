"""A job type added as a plug-in (tests/toy/masked_mean.py and its registry entry, nothing else):
it runs end to end over gRPC, survives a dropout through the shared masked-sum phase, and shows up
wherever the registry is read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.harness import PARTIES, Recorder, allow_list, coordinator, job, party_data, run_parties
from tests.toy.masked_mean import ENTRY
from xclp.client.agent import AgentConfig
from xclp.client.run_config import JobResult
from xclp.client.session import PartySession
from xclp.errors import ConfigError
from xclp.server.config import parse_job
from xclp.v1 import registry


@pytest.fixture
def masked_mean():
    with registry.registered(ENTRY):
        yield ENTRY


def test_a_plug_in_job_type_runs_end_to_end_and_gives_the_pooled_mean(keys, masked_mean) -> None:
    datas = {p: party_data(i, n=20 + 10 * i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("mm", "masked_mean", {})]) as (coord, address):
        results = run_parties(address, "mm", keys, datas)
        run = coord.jobs["mm"]
    pooled = np.concatenate([d.X for d in datas.values()]).mean(axis=0)
    for result in results.values():
        assert isinstance(result, JobResult), result
        np.testing.assert_allclose(result.aggregate, pooled, rtol=0, atol=3 * 2.0**-24)
    assert run.stage.value == "done" and run.outcome_reason == "the mean of 3 parties"
    # the masked-sum phase brings its checks along: the transcript confirmation before the reveal (docs/design.md §2.5)
    assert list(run.ledger.steps)[:4] == ["seed", "mean_sum", "mean_sum_confirm", "mean_sum_reveal"]


def test_a_plug_in_job_type_restarts_its_sum_without_a_party_lost_in_it(keys, masked_mean) -> None:
    rec = Recorder()

    class Vanishes(PartySession):
        def on_step(self, step) -> None:
            if step.step == "mean_sum":
                rec.wait_for(("mm", "mean_sum", 0, "a"), ("mm", "mean_sum", 0, "b"))
                raise KeyboardInterrupt("killed in the sum")
            super().on_step(step)

    datas = {p: party_data(10 + i) for i, p in enumerate(PARTIES)}
    with coordinator(allow_list(keys), [job("mm", "masked_mean", {})], observer=rec) as (_, address):
        results = run_parties(address, "mm", keys, datas, sessions={"c": Vanishes})
    assert isinstance(results["c"], KeyboardInterrupt)
    pooled = np.concatenate([datas[p].X for p in "ab"]).mean(axis=0)
    for p in "ab":
        np.testing.assert_allclose(results[p].aggregate, pooled, rtol=0, atol=2 * 2.0**-24)
    assert {k[:3] for k in rec.seen if k[1] == "mean_sum"} == {("mm", "mean_sum", 0), ("mm", "mean_sum", 1)}


def test_the_registry_is_where_everything_learns_of_a_job_type(masked_mean, tmp_path: Path) -> None:
    assert '**`type = "masked_mean"`**' in registry.parameter_reference()
    assert "| `frac_bits` | `24` |" in registry.parameter_reference()
    text = 'job_id = "mm"\ntype = "masked_mean"\nexpected_parties = ["a", "b"]\n[params]\nfrac_bits = 16\n'
    assert parse_job(text, "mm.toml", None).params == ENTRY.params(frac_bits=16)
    with pytest.raises(ConfigError, match="model is not an option of masked_mean jobs"):
        parse_job(text.replace("[params]", 'model = "m.npz"\n[params]'), "mm.toml", tmp_path)
    agent = tmp_path / "agent.toml"
    agent.write_text('party = "a"\nidentity = "a.key"\npeers = "allow.toml"\ncoordinator = "x:1"\nout = "o"\n'
                     '[datasets.d]\npath = "d.csv"\n')
    assert "masked_mean" in AgentConfig.load(agent).job_types


def test_an_unknown_job_type_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown job type 'masked_mean'; known: xclp, flynn, race, fedavg, dbcl"):
        registry.get("masked_mean")
