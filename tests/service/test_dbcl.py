"""DBCL jobs (docs/design.md §7, Zhang & Wang 2021 §4.2): the secure service against the in-process simulation,
round by round; dropouts; a withheld model; what a hostile coordinator cannot make a party do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.harness import PARTIES, allow_list, coordinator, job, run_parties
from tests.helpers import blobs
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.dbcl import RoundView, draw_sketches, view_size
from xclp.errors import ConfigError, PolicyRefused, ProtocolError
from xclp.fedavg import initial_network
from xclp.server.config import JobConfig
from xclp.simulation import run_dbcl
from xclp.v1.dbcl import DbclJobParams

C, D = 3, 6


def params(**extra) -> dict:
    return {"n_classes": C, "hidden": [8], "rounds": 4, "batch_size": 6, "learning_rate": 0.05, **extra}


def secure_run(keys, job_id: str, p: dict, datas, **kw) -> tuple[dict[str, JobResult], object]:
    """The job among the parties of `datas`; they take part in jobs releasing unsketched layers
    unless `policy` says otherwise (the parity tests cover the paper's setting and plain SGD)."""
    kw.setdefault("policy", PartyPolicy(min_parties=2, allow_unsketched_layers=True, allow_non_dp_dbcl=True))
    with coordinator(allow_list(keys), [job(job_id, "dbcl", p)], **kw.pop("coord", {})) as (coord, address):
        results = run_parties(address, job_id, keys, datas, **kw)
        state = coord.jobs[job_id]
    return results, state  # type: ignore[return-value]


@pytest.mark.parametrize("variant", [
    {"sketch": "countsketch", "optimiser": "rmsprop", "local_steps": 2, "sketched_layers": [0, 1]},
    {"sketch": "countsketch", "optimiser": "sgd", "momentum": 0.5, "sketch_ratio": 0.25},
    {"sketch": "none", "optimiser": "sgd"},
], ids=["countsketch-rmsprop-E2", "countsketch-momentum-quarter", "unsketched"])
def test_secure_run_equals_the_simulation_round_by_round(keys, variant: dict) -> None:
    datas = {p: blobs(i) for i, p in enumerate(PARTIES)}
    p = params(**variant)
    results, state = secure_run(keys, "dbcl-parity", p, datas)
    assert all(isinstance(r, JobResult) for r in results.values()), results
    a = results["a"]
    seeds = [r.seed for r in a.rounds]
    assert len(set(seeds)) == 4 and all(len(s) == 32 for s in seeds)  # a fresh random seed every round
    assert all([r.seed for r in res.rounds] == seeds for res in results.values())
    sim = run_dbcl({q: (d.X, d.y) for q, d in datas.items()}, DbclJobParams.parse(p), seed=a.seed, round_seeds=seeds)
    resolution = 3 * 2.0 ** -24  # each of 3 parties' gradient is rounded once to 2^-frac_bits
    lr = p["learning_rate"] * (1 / (1 - variant.get("momentum", 0.0)) if variant["optimiser"] == "sgd" else 1e4)
    for result in results.values():
        assert [r.round for r in result.rounds] == [0, 1, 2, 3]
        for mine, theirs in zip(result.rounds, sim.rounds):
            # what the party was released equals the simulation's released parameters
            np.testing.assert_allclose(mine.model_in, theirs.released, rtol=0, atol=lr * resolution * (1 + mine.round))
        np.testing.assert_allclose(result.aggregate, sim.model.flat, rtol=0, atol=lr * resolution * 5)
    assert [h["rows"] for h in state.job.history] == [r.rows for r in sim.rounds]
    dim = datas["a"].X.shape[1]
    params_ = DbclJobParams.parse(p)
    n_view = view_size(params_.architecture(dim), params_.sizes(dim))
    assert a.rounds[0].model_in.shape == (n_view,)
    if variant["sketch"] != "none":
        assert n_view < params_.architecture(dim).n_params
        net0 = initial_network(params_.architecture(dim), params_.seed)
        # round 0 released S_0ᵀW₀, not W₀: the parties never hold W
        sketches = draw_sketches(net0.arch, params_.layers, params_.sketch, params_.sizes(dim), seeds[0])
        np.testing.assert_array_equal(a.rounds[0].model_in, RoundView.release(net0, sketches).flat())
    assert not np.allclose(sim.model.flat, initial_network(params_.architecture(dim), params_.seed).flat)


def test_a_party_refuses_layers_released_unsketched_unless_it_opts_in(keys) -> None:
    """By default every layer is sketched and parties take part; the paper's setting (output layer
    unsketched) and plain federated SGD are refused before Join by a party's default policy, with
    the layers and the way out."""
    datas = {p: blobs(i) for i, p in enumerate(PARTIES)}
    strict = PartyPolicy(min_parties=2, allow_non_dp_dbcl=True)  # strict about layers (DP: test_dp_differencing)
    results, _ = secure_run(keys, "dbcl-default", params(), datas, policy=strict)
    assert all(isinstance(r, JobResult) for r in results.values()), results
    for extra, layers in [({"sketched_layers": [0]}, "layer(s) 1"), ({"sketch": "none"}, "layer(s) 0, 1")]:
        results, state = secure_run(keys, "dbcl-leaky", params(**extra), datas, policy=strict)
        for p in PARTIES:
            assert isinstance(results[p], PolicyRefused), results[p]
            assert f"releases the gradients of {layers} unsketched" in str(results[p])
            assert "--allow-unsketched-layers" in str(results[p])
        assert not state.parties  # nobody joined


def test_a_party_refuses_a_reused_sketch_seed(keys, monkeypatch) -> None:
    """A coordinator that sends the same sketch twice (so W̃ could be differenced) is refused."""
    from xclp.server.jobs.dbcl import DbclTrainer

    monkeypatch.setattr(DbclTrainer, "fresh_seed", lambda self, t: b"\x07" * 32)
    datas = {p: blobs(60 + i) for i, p in enumerate(PARTIES)}
    results, _ = secure_run(keys, "replay", params(rounds=2), datas)
    for party in PARTIES:
        assert isinstance(results[party], ProtocolError), results[party]
        assert "reuses the sketch seed of an earlier round" in str(results[party])


def test_a_party_refuses_released_parameters_of_the_wrong_shape(keys, monkeypatch) -> None:
    """A coordinator that releases W itself where the job says W̃ = SᵀW is refused."""
    from xclp.server.jobs import dbcl as server_dbcl

    monkeypatch.setattr(server_dbcl.RoundView, "release", classmethod(lambda cls, net, sketches: cls(
        [W.copy() for W, _ in net.layers], [b.copy() for _, b in net.layers], {})))
    datas = {p: blobs(65 + i) for i, p in enumerate(PARTIES)}
    results, _ = secure_run(keys, "unsketched", params(rounds=1), datas)
    assert all(isinstance(r, ProtocolError) and "released parameters of round 0" in str(r) for r in results.values())


def test_a_withheld_model_reaches_only_the_coordinators_file(keys, tmp_path: Path) -> None:
    datas = {p: blobs(70 + i) for i, p in enumerate(PARTIES)}
    p = DbclJobParams.parse(params(rounds=2, withhold_model=True))
    with pytest.raises(ConfigError, match="must name model"):
        JobConfig("withheld", "dbcl", p, PARTIES, 2)
    config = JobConfig("withheld", "dbcl", p, PARTIES, 2, 30.0, 30.0, model_path=tmp_path / "w.npz")
    with coordinator(allow_list(keys), [config]) as (coord, address):
        results = run_parties(address, "withheld", keys, datas,
                              policy=PartyPolicy(min_parties=2, allow_non_dp_dbcl=True))
        state = coord.jobs["withheld"]
    for result in results.values():
        assert isinstance(result, JobResult) and result.aggregate.shape == (0,)
    with np.load(tmp_path / "w.npz") as saved:
        assert str(saved["job_type"]) == "dbcl" and list(saved["sizes"]) == [D, 8, C]
        np.testing.assert_array_equal(saved["theta"], state.job.trainer.net.flat)
    assert (tmp_path / "w.npz").stat().st_mode & 0o077 == 0
