"""Masked all-reduce jobs through a real gRPC coordinator in-process, parties on threads (docs/design.md §6)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from scipy import stats

from tests.harness import (
    PARTIES,
    ManualClock,
    Recorder,
    advance_after,
    allow_list,
    coordinator,
    job,
    party_data,
    run_parties,
)
from xclp.client.jobs.allreduce import FlynnRelease, RaceRelease, flynn_counts, race_counts
from xclp.client.policy import PartyPolicy
from xclp.client.session import PartySession
from xclp.flynn import FlyHash, FlyNNParams, train_counts
from xclp.race import RaceHashes, RaceParams, private_release_share, sketch
from xclp.v1.double_masking import self_mask, unpack_reveal
from xclp.v1.registry import parse_params

FLYNN = {"n_classes": 3, "m": 1024, "s": 3, "rho": 16}
RACE = {"rows": 16, "width": 32, "family": "srp", "p": 4}


def pooled_flynn(seed, datas, params=FLYNN):
    X = np.vstack([d.X for d in datas.values()])
    y = np.concatenate([d.y for d in datas.values()])
    fh = FlyHash.from_seed(seed, FlyNNParams(X.shape[1], params["m"], params["s"], params["rho"]))
    return train_counts(fh, X[y >= 0], y[y >= 0], params["n_classes"])


def test_flynn_aggregate_is_pooled_counts_and_masked_uploads_reveal_nothing(keys):
    datas = {p: party_data(i) for i, p in enumerate(PARTIES)}
    rec = Recorder()
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN)], observer=rec) as (coord, addr):
        results = run_parties(addr, "f", keys, datas)
        assert coord.jobs["f"].stage.value == "done"
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    seed = results["a"].seed
    assert all(r.seed == seed for r in results.values())  # the leader's seed reached everyone
    pooled = pooled_flynn(seed, datas)
    for r in results.values():
        assert r.aggregate.dtype == np.uint32 and np.array_equal(r.aggregate, pooled)  # FlyNN Theorem 4

    params = parse_params("flynn", FLYNN)
    uploads = {p: rec.seen[("f", "sum", 0, p)] for p in PARTIES}
    total = np.zeros_like(pooled)
    for p, masked in uploads.items():
        own = flynn_counts(params, datas[p], seed)
        total += masked  # wraps mod 2^32
        # Each upload is uniform in Z_2^32 and independent of the party's counts (docs/design.md §2).
        flat = masked.ravel().astype(np.float64)
        assert abs(stats.pearsonr(flat, own.ravel().astype(np.float64)).statistic) < 5 / np.sqrt(flat.size)
        top_nibbles = np.bincount((masked.ravel() >> 28).astype(np.int64), minlength=16)
        assert stats.chisquare(top_nibbles).pvalue > 1e-6
        assert np.mean(masked < 2**20) < 0.01  # raw counts are all < 2^20
    # The pairwise masks cancel in the sum; each self mask is removed only with its revealed seed.
    assert not np.array_equal(total, pooled)
    seeds = {p: unpack_reveal(rec.seen[("f", "sum_reveal", 0, p)])[1] for p in PARTIES}
    opened = total.copy()
    for seed in seeds.values():
        opened -= self_mask(seed, total.shape, total.dtype)  # wraps mod 2^32
    assert np.array_equal(opened, pooled)


def test_race_kde_and_class_sketches_equal_pooled_sketches(keys):
    datas = {p: party_data(10 + i) for i, p in enumerate(PARTIES)}
    jobs = [job("kde", "race", RACE), job("cls", "race", {**RACE, "n_classes": 3})]
    with coordinator(allow_list(keys), jobs) as (coord, addr):
        kde = run_parties(addr, "kde", keys, datas)
        cls = run_parties(addr, "cls", keys, datas)
    X = np.vstack([d.X for d in datas.values()])
    y = np.concatenate([d.y for d in datas.values()])
    seed = kde["a"].seed
    hashes = RaceHashes.from_seed(seed, RaceParams(16, 32, "srp", 4), X.shape[1])
    for r in kde.values():
        assert np.array_equal(r.aggregate, sketch(hashes, X))
    seed = cls["b"].seed
    want = sum(race_counts(parse_params("race", {**RACE, "n_classes": 3}), d, seed) for d in datas.values())
    for r in cls.values():
        assert r.aggregate.shape == (3, 16, 32) and np.array_equal(r.aggregate, want)
    assert int(want.sum()) == int((y >= 0).sum()) * 16


class Stalling(PartySession):
    """A party that takes the seed, then never answers the sum step (like a hung process)."""

    def on_step(self, step):
        if step.step == "sum":
            self._job()  # it got as far as making its job (which sizes the others' seed shares), then hangs
            return
        super().on_step(step)

    def on_message(self, message):
        if message.step != "sum":  # hung: the others' seed shares are never read
            super().on_message(message)


def test_party_missing_the_deadline_is_dropped_and_sum_restarts_under_fresh_masks(keys):
    datas = {p: party_data(20 + i) for i, p in enumerate(PARTIES)}
    rec, clock = Recorder(), ManualClock()
    # Once a and b have pushed round 0, the step's 30 s pass in an instant; c still owes its array.
    advance_after(clock, 31, lambda: rec.wait_for(("f", "sum", 0, "a"), ("f", "sum", 0, "b")))
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN)], observer=rec, clock=clock) as (coord, addr):
        results = run_parties(addr, "f", keys, datas, sessions={"c": Stalling})
        assert coord.jobs["f"].dropped == {"c"}
    assert "dropped this party: sent nothing for 30 s in step 'sum'" in str(results["c"])
    seed = results["a"].seed
    pooled_ab = pooled_flynn(seed, {p: datas[p] for p in ("a", "b")})
    for p in ("a", "b"):
        assert results[p].participants == ("a", "b")
        assert np.array_equal(results[p].aggregate, pooled_ab)
        # Round 0 (with c's masks) and round 1 (without) used different masks on the same counts.
        r0, r1 = rec.seen[("f", "sum", 0, p)], rec.seen[("f", "sum", 1, p)]
        assert np.mean(r0 == r1) < 0.01


def test_dp_flynn_releases_noisy_fixed_point_counts(keys):
    datas = {p: party_data(30 + i) for i, p in enumerate(PARTIES)}
    params = {**FLYNN, "epsilon": 1.0, "T": 50}
    with coordinator(allow_list(keys), [job("dp", "flynn", params)]) as (coord, addr):
        results = run_parties(addr, "dp", keys, datas)
    agg = results["a"].aggregate
    assert all(np.array_equal(r.aggregate, agg) for r in results.values())
    assert agg.dtype == np.float64 and np.all(agg >= 0)
    assert np.array_equal(agg, np.round(agg))  # discrete Laplace: integer noise (no float leakage, Mironov 2012)
    assert np.count_nonzero(agg) <= 3 * 50  # each party releases at most T entries (Ram & Sinha 2022 Alg. 2)
    assert not np.array_equal(agg, pooled_flynn(results["a"].seed, datas))


def test_dp_race_shares_sum_to_a_noised_sketch(keys):
    """The released sketch carries τ = 3 parties' shares, any two of which are the two-sided
    geometric of scale R/ε (docs/design.md §6): τ/(τ−1) = 1.5 times its variance in all. 16 × 1024 cells pin
    the variance within ±10 % (≈ 6 standard errors), so shares sized for any other τ fail it."""
    datas = {p: party_data(40 + i) for i, p in enumerate(PARTIES)}
    params = {**RACE, "width": 1024, "epsilon": 4.0}
    with coordinator(allow_list(keys), [job("dp", "race", params)]) as (coord, addr):
        results = run_parties(addr, "dp", keys, datas)
    seed = results["a"].seed
    X = np.vstack([d.X for d in datas.values()])
    exact = sketch(RaceHashes.from_seed(seed, RaceParams(16, 1024, "srp", 4), X.shape[1]), X)
    noise = results["a"].aggregate - exact
    assert results["a"].aggregate.dtype == np.int64 and all(np.array_equal(r.aggregate, results["a"].aggregate)
                                                            for r in results.values())
    q = np.exp(-4.0 / 16)  # two-sided geometric P(k) ∝ q^|k| of scale R/ε = 4: variance 2q/(1-q)^2 ≈ 31.5
    variance = 2 * q / (1 - q) ** 2 * 3 / 2

    def in_band(values: np.ndarray) -> bool:
        return 0.9 < values.var() / variance < 1.1

    assert in_band(noise)
    assert abs(noise.mean()) < 5 * np.sqrt(variance / noise.size)
    # the band has teeth: the same 3 shares sized for a wrong τ fall outside it
    zero = np.zeros((16, 1024), dtype=np.int64)
    for wrong_tau in (2, 4):
        rng = np.random.default_rng(wrong_tau)
        assert not in_band(sum(private_release_share(zero, 4.0, wrong_tau, source=rng) for _ in range(3)))


def test_contribution_encodings_match_the_wire_contract():
    data = party_data(0)
    for job_type, params in (("flynn", FLYNN), ("race", RACE), ("flynn", {**FLYNN, "epsilon": 1.0, "T": 5}),
                             ("race", {**RACE, "epsilon": 1.0, "n_classes": 3})):
        p = parse_params(job_type, params)
        release = FlynnRelease(p) if job_type == "flynn" else RaceRelease(p)  # type: ignore[arg-type]
        arr = release.contribution(data, b"s" * 32, 3)
        assert (arr.dtype, arr.shape) == p.wire(data.X.shape[1])


def test_a_party_that_stops_mid_job_says_why_and_is_dropped_at_once(keys):
    """A party that stops mid-job (an error of its own) tells the coordinator why on its way out: it
    is dropped at once, not waited for as a lost connection (60 s here) or at the step deadline."""
    datas = {p: party_data(50 + i) for i, p in enumerate(PARTIES)}

    class Vanishing(PartySession):
        def on_step(self, step):
            if step.step == "sum":
                raise ConnectionAbortedError("simulated crash")  # leaves run(): its channel closes
            super().on_step(step)

    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN, step_seconds=60.0, reconnect_seconds=60.0)]) \
            as (coord, addr):
        results = run_parties(addr, "f", keys, datas, sessions={"b": Vanishing})
        # the type of an error not xclp's own, never its text (which might hold a value or a path)
        assert coord.jobs["f"].drop_reasons == {"b": "left the run (ConnectionAbortedError)"}
    assert isinstance(results["b"], ConnectionAbortedError)
    assert results["a"].participants == ("a", "c")
    assert np.array_equal(results["c"].aggregate, pooled_flynn(results["a"].seed, {p: datas[p] for p in "ac"}))


def test_too_few_parties_fail_the_job_for_everyone(keys):
    datas = {p: party_data(60 + i) for i, p in enumerate(("a", "b"))}
    rec, clock = Recorder(), ManualClock()
    advance_after(clock, 31, lambda: rec.wait_for(("f", "sum", 0, "a")))
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN, parties=("a", "b"))], observer=rec,
                     clock=clock) as (coord, addr):
        results = run_parties(addr, "f", keys, datas, sessions={"b": Stalling})
        assert coord.jobs["f"].stage.value == "failed"
    assert "failed" in str(results["a"]) and "min_parties" in str(results["a"])


class SilentLeader(PartySession):
    """Leads the seed step but never sends the seed; `leading` is set once it has been asked to."""

    leading = threading.Event()

    def on_step(self, step):
        if step.step == "seed" and step.participants[0] == self.config.party_id:
            SilentLeader.leading.set()
            return
        super().on_step(step)


def test_leader_missing_the_seed_deadline_is_replaced_by_the_next_smallest_id(keys):
    datas = {p: party_data(90 + i) for i, p in enumerate(PARTIES)}
    clock = ManualClock()
    SilentLeader.leading.clear()
    advance_after(clock, 31, lambda: SilentLeader.leading.wait(60))  # the seed step has started: let it expire
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN)], clock=clock) as (coord, addr):
        results = run_parties(addr, "f", keys, datas, sessions={"a": SilentLeader})
        assert coord.jobs["f"].dropped == {"a"}
    assert "dropped" in str(results["a"])
    assert results["b"].seed == results["c"].seed and results["b"].participants == ("b", "c")
    assert np.array_equal(results["c"].aggregate, pooled_flynn(results["b"].seed, {p: datas[p] for p in "bc"}))


def test_race_class_model_file_answers_query_and_refuses_predict(keys, tmp_path, capsys):
    import csv

    from xclp.client import cli
    from xclp.client.models import ModelFile
    from xclp.race import RaceClassifier

    datas = {p: party_data(100 + i) for i, p in enumerate(PARTIES)}
    params = {**RACE, "n_classes": 3}
    with coordinator(allow_list(keys), [job("cls", "race", params)]) as (coord, addr):
        r = run_parties(addr, "cls", keys, datas)["a"]
    ModelFile(r.job_type, r.params, r.dim, r.seed, r.aggregate).save(tmp_path / "m.npz")
    queries = tmp_path / "q.csv"
    Xq = party_data(7, n=12).X
    header = ",".join(f"f{j}" for j in range(Xq.shape[1]))
    queries.write_text("\n".join([header] + [",".join(repr(float(v)) for v in row) for row in Xq]))
    model = str(tmp_path / "m.npz")
    assert cli.main(["query", "--model", model, "--data", str(queries), "--out", str(tmp_path / "o.csv")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "o.csv")))
    hashes = RaceHashes.from_seed(r.seed, RaceParams(16, 32, "srp", 4), Xq.shape[1])
    assert [int(row["prediction"]) for row in rows] == RaceClassifier(hashes, r.aggregate).predict(Xq).tolist()
    assert cli.main(["predict", "--model", model, "--data", str(queries), "--out", str(tmp_path / "p.csv")]) == 2
    assert "is a race model: predict takes flynn, fedavg and dbcl models" in capsys.readouterr().err


def test_a_waiting_party_says_who_it_waits_for_and_when_the_join_deadline_is(keys):
    """It used to wait silently for --idle-timeout (15 min by default) when its peers never came."""
    from xclp.client.connection import ConnectionConfig
    from xclp.client.run_config import RunConfig
    from xclp.errors import DeadlineExceeded

    lines: list[str] = []
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN, join_seconds=600)]) as (coord, addr):
        config = RunConfig("f", "a", keys["a"], ConnectionConfig(addr, insecure=True), idle_seconds=0.5,
                           peers=allow_list(keys), policy=PartyPolicy(min_parties=2))
        with pytest.raises(DeadlineExceeded, match="while waiting for b, c to join"):
            PartySession(config, party_data(0), progress=lines.append).run()
    status = [line for line in lines if line.startswith("joined;")]
    assert status == ["joined; 1 of 3 parties so far (the job starts with 2 at its join deadline); "
                      "waiting for b, c; join deadline in 10 min"]


def test_a_joined_party_gives_up_at_its_roster_deadline_whatever_statuses_keep_coming(keys, monkeypatch):
    """Attack: a coordinator keeps a joined party waiting for a roster that never comes,
    with a status now and then, so that --idle-timeout never fires (an agent held a pool and the
    data for each such run). An agent's join_deadline (RunConfig.roster_wait_seconds) bounds it."""
    import time

    from xclp.client.connection import ConnectionConfig
    from xclp.client.run_config import RunConfig
    from xclp.errors import DeadlineExceeded
    from xclp.server import run as server_run

    monkeypatch.setattr(server_run, "STATUS_SECONDS", 0.2)  # news every 0.2 s: never idle
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN, join_seconds=600)]) as (coord, addr):
        config = RunConfig("f", "a", keys["a"], ConnectionConfig(addr, insecure=True), idle_seconds=1.0,
                           roster_wait_seconds=2.0, peers=allow_list(keys), policy=PartyPolicy(min_parties=2))
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match=r"joined 2 s ago and the run has not started \(no roster\)"):
            PartySession(config, party_data(0)).run()
    assert time.monotonic() - started < 30
