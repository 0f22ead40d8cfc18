"""Data preparation through a real coordinator (docs/design.md §8): the masked moments step, federated
standardisation and imputation, class names, and the bad tables it refuses."""

from __future__ import annotations

import math
import threading
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from tests.harness import PARTIES, Recorder, allow_list, coordinator, job, run_parties
from tests.oracles.party_view import party_view
from xclp.client.policy import PartyPolicy
from xclp.crypto.paillier import PaillierKeypair
from xclp.data.party_table import Labels, PartyData
from xclp.data.prep import local_moments
from xclp.errors import InvalidInput, PolicyRefused
from xclp.flynn import FlyHash, FlyNNParams, train_counts
from xclp.graph import GraphParams
from xclp.reference import xclp_reference
from xclp.v1 import moments
from xclp.v1.double_masking import self_mask, unpack_reveal
from xclp.v1.registry import parse_params

FLYNN = {"n_classes": 3, "m": 512, "s": 2, "rho": 16}
SCALES = np.array([1.0, 1e3, 1e-3, 50.0, 1.0])  # the last column is a constant (7) on every party
COLUMNS = ("age", "income", "ratio", "dose", "site")


def skewed_party(seed: int, n: int = 50, missing: int = 2) -> PartyData:
    """Unscaled features, a label skew (each party mostly one class), a few empty cells."""
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(n) < 0.7, seed % 3, rng.integers(0, 3, n))
    X = (rng.normal(size=(n, 5)) + y[:, None]) * SCALES + [40, 5e4, 0, 300, 0]
    X[:, 4] = 7.0
    X[rng.choice(n, missing, replace=False), rng.integers(0, 4)] = np.nan
    y[: n // 5] = -1
    return PartyData(X, y, tuple(f"p{seed}-{i}" for i in range(n)), COLUMNS)


def pooled_prepared(datas: dict[str, PartyData]) -> np.ndarray:
    """What every party should work on: numpy's pooled mean fills the gaps, numpy's pooled
    (population) std scales, the constant column goes."""
    X = np.vstack([d.X for d in datas.values()])
    mean, std = np.nanmean(X, axis=0), np.nanstd(X, axis=0)
    X = np.where(np.isnan(X), mean, X)
    return (X[:, :4] - mean[:4]) / std[:4]


def test_standardised_imputed_flynn_equals_flynn_on_the_pooled_standardised_table(keys):
    datas = {p: skewed_party(i) for i, p in enumerate(PARTIES)}
    rec = Recorder()
    params = {**FLYNN, "standardise": True, "impute": "mean"}
    with coordinator(allow_list(keys), [job("f", "flynn", params)], observer=rec) as (coord, addr):
        results = run_parties(addr, "f", keys, datas)
        scaling = coord.jobs["f"].scaling
    assert all(not isinstance(r, BaseException) for r in results.values()), results

    # the pooled moments are numpy's on the concatenated table
    X = np.vstack([d.X for d in datas.values()])
    np.testing.assert_allclose(scaling.mean, np.nanmean(X, axis=0), rtol=1e-13)
    np.testing.assert_allclose(scaling.std[:4], np.nanstd(X, axis=0)[:4], rtol=1e-12)
    assert scaling.kept.tolist() == [True, True, True, True, False]  # the constant 'site' dropped alike

    # the federated model is the pooled model on the globally standardised table (FlyNN Theorem 4)
    Xp = pooled_prepared(datas)
    y = np.concatenate([d.y for d in datas.values()])
    seed = results["a"].seed
    fh = FlyHash.from_seed(seed, FlyNNParams(4, FLYNN["m"], FLYNN["s"], FLYNN["rho"]))
    want = train_counts(fh, Xp[y >= 0], y[y >= 0], 3)
    for r in results.values():
        assert r.dim == 4 and np.array_equal(r.aggregate, want)
        np.testing.assert_array_equal(r.scaling.kept, scaling.kept)

    # each masked moments upload is uniform; the coordinator opens only the sum
    uploads = {p: rec.seen[("f", "moments", 0, p)] for p in PARTIES}
    for p, masked in uploads.items():
        assert masked.shape == moments.wire(5)[1]
        own = moments.encode(local_moments(datas[p].X), 3)
        assert np.mean(masked == own) < 0.01
        top = np.bincount((masked.ravel() >> np.uint64(60)).astype(np.int64), minlength=16)
        assert stats.chisquare(top).pvalue > 1e-6  # the digits of the cleartext are all < 2^32
    total = sum(uploads.values())
    for p in PARTIES:
        total -= self_mask(unpack_reveal(rec.seen[("f", "moments_reveal", 0, p)])[1], total.shape, total.dtype)
    want_sums = moments.decode(sum(moments.encode(local_moments(d.X), 3) for d in datas.values()))
    assert moments.decode(total).tolist() == want_sums.tolist()


def test_secure_xclp_with_standardise_equals_the_reference_on_the_standardised_table(keys):
    datas = {p: replace(skewed_party(10 + i, n=24, missing=0)) for i, p in enumerate(PARTIES)}
    params = {"n_classes": 3, "lsh_bits": 128, "k": 5, "key_bits": 512, "insecure_test_keys": True,
              "standardise": True}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("x", "xclp", params)]) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    Xp = pooled_prepared(datas)
    offsets = np.cumsum([0] + [d.X.shape[0] for d in datas.values()])
    parties = [(Xp[offsets[j]:offsets[j + 1]], d.y) for j, d in enumerate(datas.values())]
    ref = xclp_reference(parties, results["a"].seed, 3, 128, GraphParams(k=5))
    for j, p in enumerate(PARTIES):
        labels, _, scores = party_view(ref.scores[ref.party_rows(j)], datas[p].y, 3)
        np.testing.assert_allclose(results[p].aggregate, scores, rtol=0, atol=1e-6)  # fixed point 2^-32 per term
        assert np.array_equal(results[p].aggregate.argmax(axis=1), labels)
    # unscaled, the reference differs: standardising changed the neighbours
    raw = [(d.X, d.y) for d in datas.values()]
    assert not np.array_equal(xclp_reference(raw, results["a"].seed, 3, 128, GraphParams(k=5)).H, ref.H)


def test_class_names_map_by_the_declared_order_and_an_undeclared_name_lists_the_declared(keys):
    names = np.array(["malignant", "benign", "", "benign", "malignant", "benign"] * 5)
    def named(seed: int, cells=names) -> PartyData:
        rng = np.random.default_rng(seed)
        values, codes = np.unique(cells, return_inverse=True)
        labels = Labels(codes.astype(np.int32) - 1, tuple(str(v) for v in values[1:]))  # '' sorts first: empty cells
        return PartyData(rng.normal(size=(len(cells), 4)), None, tuple(str(i) for i in range(len(cells))), (),
                         labels)
    datas = {p: named(i) for i, p in enumerate(PARTIES)}
    params = {"m": 256, "s": 2, "rho": 8, "classes": ["benign", "malignant"]}
    # g: c refuses before Join, and a and b wait out a short join deadline (not the harness's 30 s)
    with coordinator(allow_list(keys), [job("f", "flynn", params), job("g", "flynn", params, join_seconds=3)]) \
            as (_, addr):
        results = run_parties(addr, "f", keys, datas)
        assert all(not isinstance(r, BaseException) for r in results.values()), results
        assert results["a"].params.n_classes == 2
        # the counts of class 0 come from the 'benign' rows on every party
        y = np.where(names == "benign", 0, np.where(names == "malignant", 1, -1))
        seed = results["a"].seed
        fh = FlyHash.from_seed(seed, FlyNNParams(4, 256, 2, 8))
        X = np.vstack([d.X for d in datas.values()])
        want = train_counts(fh, X[np.tile(y, 3) >= 0], np.tile(y, 3)[np.tile(y, 3) >= 0], 2)
        assert np.array_equal(results["b"].aggregate, want)

        datas["c"] = named(2, np.where(names == "malignant", "Malignant", names))
        bad = run_parties(addr, "g", keys, datas)
    assert isinstance(bad["c"], InvalidInput)
    assert "label 'Malignant' is not one of the job's classes: 'benign', 'malignant'" in str(bad["c"])


def test_empty_cells_without_impute_are_refused_before_joining_and_point_at_impute(keys):
    datas = {p: skewed_party(i) for i, p in enumerate(PARTIES)}
    config = job("f", "flynn", {**FLYNN, "standardise": True}, join_seconds=3)
    with coordinator(allow_list(keys), [config]) as (c, addr):
        results = run_parties(addr, "f", keys, datas)
        assert not c.jobs["f"].parties  # nobody joined: each refused before Join
    for p in PARTIES:
        assert isinstance(results[p], InvalidInput), results[p]
        assert 'impute = "mean"' in str(results[p]) and "column" in str(results[p])


def test_parties_with_other_feature_columns_are_refused_at_join(keys):
    """The first to join sets the columns; c, with the same names in another order, joins after a
    and b (its session starts once both are in) and is refused."""
    from xclp.client.session import PartySession

    datas = {p: skewed_party(i, missing=0) for i, p in enumerate(PARTIES)}
    datas["c"] = replace(datas["c"], columns=("age", "ratio", "income", "dose", "site"))  # same names, other order
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN, parties=PARTIES, join_seconds=5)]) as (coord, addr):
        joined = threading.Event()

        class Last(PartySession):
            def run(self):
                joined.wait(30)
                return super().run()

        def watch() -> None:
            while len(coord.jobs["f"].parties) < 2:
                coord.jobs["f"].done_event.wait(0.01)
            joined.set()

        threading.Thread(target=watch, daemon=True).start()
        results = run_parties(addr, "f", keys, datas, sessions={"c": Last})
    assert joined.is_set()
    assert isinstance(results["c"], InvalidInput)
    assert "same feature columns in the same order" in str(results["c"])
    assert all(not isinstance(results[p], BaseException) for p in "ab"), results


def test_features_constant_on_every_party_are_dropped_and_a_table_of_only_those_is_refused(keys):
    datas = {p: PartyData(np.full((20, 3), 4.0) + [0, 1, 2], np.zeros(20, dtype=np.int64),
                          tuple(map(str, range(20)))) for p in PARTIES}
    with coordinator(allow_list(keys), [job("f", "flynn", {**FLYNN, "s": 1, "standardise": True})]) as (coord, addr):
        results = run_parties(addr, "f", keys, datas)
        assert coord.jobs["f"].stage.value == "failed"
    for p in PARTIES:
        assert isinstance(results[p], InvalidInput)
        assert "all 3 feature columns are constant or empty on every party" in str(results[p])


def test_a_party_requiring_dp_refuses_a_job_that_releases_exact_moments():
    from xclp.v1 import xclp_pb2 as pb
    from xclp.v1.registry import parse_params

    params = parse_params("flynn", {**FLYNN, "epsilon": 1.0, "T": 10, "standardise": True})
    spec = pb.JobSpec(job_id="f", job_type="flynn", expected_parties=list(PARTIES))
    with pytest.raises(PolicyRefused, match="outside the DP guarantee"):
        PartyPolicy(require_dp=2.0).check_job(spec, params)
    PartyPolicy(require_dp=2.0).check_job(spec, replace(params, standardise=False))


def test_a_party_vanishing_in_the_moments_step_leaves_the_others_a_scaling_of_their_own_rows(keys):
    """The moments sum restarts among the rest under fresh masks (docs/design.md §6.1): the scaling and the
    model are those of the two parties left, as if the third had never come."""
    from xclp.client.session import PartySession

    class Vanishing(PartySession):
        def on_step(self, step):
            if step.step == "moments":
                raise ConnectionAbortedError("simulated crash")  # leaves run(): its channel closes
            super().on_step(step)

    datas = {p: skewed_party(20 + i) for i, p in enumerate(PARTIES)}
    params = {**FLYNN, "standardise": True, "impute": "mean"}
    with coordinator(allow_list(keys), [job("f", "flynn", params)]) as (coord, addr):
        results = run_parties(addr, "f", keys, datas, sessions={"c": Vanishing})
        assert coord.jobs["f"].drop_reasons == {"c": "left the run (ConnectionAbortedError)"}
    assert isinstance(results["c"], ConnectionAbortedError)
    left = {p: datas[p] for p in "ab"}
    X = np.vstack([d.X for d in left.values()])
    for p in "ab":
        np.testing.assert_allclose(results[p].scaling.mean, np.nanmean(X, axis=0), rtol=1e-13)
    Xp = pooled_prepared(left)
    y = np.concatenate([d.y for d in left.values()])
    fh = FlyHash.from_seed(results["a"].seed, FlyNNParams(4, FLYNN["m"], FLYNN["s"], FLYNN["rho"]))
    assert np.array_equal(results["b"].aggregate, train_counts(fh, Xp[y >= 0], y[y >= 0], 3))


def test_categorical_columns_read_for_the_job_give_every_party_the_same_one_hot_columns(keys, tmp_path):
    """Each party's CSV meets the sites in another order; the job's declared order numbers the
    one-hot columns alike, so the federated model is the pooled one on the declared encoding."""
    from xclp.data import tables

    sites = ("north", "south", "east")
    rng = np.random.default_rng(5)
    frames = {}
    for i, p in enumerate(PARTIES):
        n = 30
        site = rng.choice(np.roll(sites, i), size=n)  # other frequencies and first appearances per party
        y = rng.integers(0, 3, size=n)
        age = rng.normal(50, 10, size=n) + 5 * y
        path = tmp_path / f"{p}.csv"
        path.write_text("age,site,label\n" + "".join(f"{a!r},{s},{c}\n" for a, s, c in zip(age.tolist(), site, y)))
        frames[p] = (age, site, y, path)
    loaders = {p: (lambda params, path=path: tables.load(path, categorical=params.categorical))
               for p, (_, _, _, path) in frames.items()}
    params = {"n_classes": 3, "m": 256, "s": 2, "rho": 8, "categorical": {"site": list(sites)}}
    with coordinator(allow_list(keys), [job("f", "flynn", params)]) as (_, addr):
        results = run_parties(addr, "f", keys, loaders)
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    X = np.vstack([np.column_stack([age, *(site == s for s in sites)]) for age, site, _, _ in frames.values()])
    y = np.concatenate([f[2] for f in frames.values()])
    fh = FlyHash.from_seed(results["a"].seed, FlyNNParams(4, 256, 2, 8))
    assert results["a"].columns == ("age", "site=north", "site=south", "site=east")
    assert np.array_equal(results["c"].aggregate, train_counts(fh, X.astype(np.float64), y, 3))


def test_dp_moments_open_to_the_clipped_sums_plus_noise_that_any_two_of_three_parties_make(keys, monkeypatch,
                                                                                             tmp_path):
    """moments_epsilon (xclp.privacy.dp_moments) through the service, with parties that --require-dp: the
    coordinator's opened moments are the parties' clipped integer sums plus noise of variance
    μ·3/2 per cell (three shares of which any two make μ; shares sized so that all three make μ
    would give a third less: 900 cells, a standard error of 5 %). Every party applies the
    coordinator's scaling, hears what the moments spent, and its ledger holds no exact release and
    the DP charges of the moments and the counts."""
    from xclp.client.ledger import Ledger, data_digest
    from xclp.privacy import dp_moments
    from xclp.privacy.accounting import composed_epsilon, pure_rdp

    opened: list[np.ndarray] = []
    real = moments.pooled_scaling

    def pooled_scaling(params, sums, dim):
        opened.append(sums.copy())
        return real(params, sums, dim)

    monkeypatch.setattr(moments, "pooled_scaling", pooled_scaling)
    d = 300
    rng = np.random.default_rng(7)
    datas = {}
    for i, p in enumerate(PARTIES):
        X = rng.normal(size=(20, d)) * 2 + i
        X[rng.random(X.shape) < 0.05] = np.nan
        datas[p] = PartyData(X, rng.integers(0, 3, 20), tuple(f"{p}{r}" for r in range(20)))
    params = {**FLYNN, "epsilon": 2.0, "T": 5, "standardise": True, "impute": "mean", "moments_epsilon": 1.0,
              "moments_delta": 1e-6, "moments_bounds": [-4.0, 6.0]}
    ledgers = {p: Ledger(tmp_path / p) for p in PARTIES}
    logs = {p: {"ledger": ledgers[p]} for p in PARTIES}
    with coordinator(allow_list(keys), [job("f", "flynn", params)]) as (coord, addr):
        results = run_parties(addr, "f", keys, datas, policy=PartyPolicy(require_dp=3.0), overrides=logs)
        scaling = coord.jobs["f"].scaling
        summary = coord.jobs["f"].summary()
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    job_params = parse_params("flynn", params)
    plan, bounds = job_params.moments_plan(d), job_params.moments_ranges(d)
    assert plan is not None and plan.noisy_counts
    shift = moments.FRAC_BITS - plan.scale_bits
    total = np.array([[int(v) >> shift for v in row] for row in opened[0]], dtype=np.int64)
    clipped = sum(dp_moments.local_sums(data.X, bounds, plan.scale_bits) for data in datas.values())
    residual = (total - clipped).ravel().astype(np.float64)
    assert residual.var() == pytest.approx(plan.variance * 3 / 2, rel=0.2)
    assert abs(residual.mean()) < 5 * math.sqrt(plan.variance * 3 / 2 / residual.size)
    for p, result in results.items():
        np.testing.assert_array_equal(result.scaling.mean, scaling.mean)
        np.testing.assert_array_equal(result.scaling.std, scaling.std)
        assert result.privacy is not None and result.privacy["moments"]["epsilon_spent"] == 1.0
        # noisy sums: nothing to difference exactly; ε charged, the moments' and the counts' RDP curves
        # composed at the budget's δ = 10⁻⁵ (2.88, below basic composition's ε = 3 at δ = 10⁻⁶)
        (entry,) = ledgers[p].summary().values()
        spent = composed_epsilon([plan.rdp, pure_rdp(2.0)], 1e-5)
        assert spent < 3.0 and entry["exact"] == [] and entry["spent"] == {"epsilon": spent, "delta": 1e-5}
        assert ledgers[p].spent(data_digest(datas[p])) == (spent, 1e-5)
        assert result.privacy["ledger"] == {"data_set": data_digest(datas[p]).hex()[:16],  # what run.json says
                                            "spent": {"epsilon": spent, "delta": 1e-5},
                                            "left": {"epsilon": 10.0 - spent, "delta": 0.0}, "composition": "rdp"}
    kept = scaling.kept  # 60 rows against a noise of σ ≈ 160 on each count: some counts fall below one row
    assert ((scaling.mean[kept] >= -4.0) & (scaling.mean[kept] <= 6.0)).all() and (scaling.std[kept] <= 5.0).all()
    assert summary["privacy"]["line"].startswith("DP moments: ε = 1, δ = 1e-06")
