"""`xclp.simulation.simulate`: a job over local tables with every role in one process. The secure
run equals the plaintext one (XCLP to the fixed-point ring's precision, FlyNN and RACE exactly, as
masks that cancel must), the counts equal those of the pooled table, preparation applies the pooled
scaling, the report says what each role learns with this run's sizes, and bad jobs are refused."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.helpers import make_data
from xclp.errors import ConfigError, InvalidInput
from xclp.flynn import FlyHash, train_counts
from xclp.race import RaceHashes, sketch
from xclp.simulation import simulate
from xclp.simulation.moments import pooled_scaling
from xclp.v1.registry import parse_params

SEED = bytes(range(32))


def parties(n: int = 40, d: int = 6) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {p: make_data(i, n=n, d=d, unlabeled=10) for i, p in enumerate(("a", "b", "c"))}


XCLP = """type = "xclp"
[params]
n_classes = 3
lsh_bits = 256
k = 4
key_bits = 512
insecure_test_keys = true
"""


def test_secure_xclp_gives_the_plaintext_references_labels_and_scores() -> None:
    data = parties()
    secure = simulate(XCLP, data, seed=SEED)
    plain = simulate(XCLP, data, secure=False, seed=SEED)
    for p in data:
        a, b = secure[p].predictions(), plain[p].predictions()
        assert a["label"].tolist() == b["label"].tolist()
        np.testing.assert_allclose(a.filter(like="score_").to_numpy(), b.filter(like="score_").to_numpy(), atol=1e-6)
        labeled = data[p][1] >= 0  # a labeled row keeps its own label
        assert (a["label"].to_numpy()[labeled] == data[p][1][labeled].astype(str)).all()
    assert (secure.details["W"] != plain.details["W"]).nnz == 0
    other = simulate(XCLP, data, secure=False, seed=bytes(32))
    assert any((other[p].predictions()["confidence"] != plain[p].predictions()["confidence"]).any() for p in data)


@pytest.mark.parametrize("job_type, params", [
    ("flynn", {"n_classes": 3, "m": 64, "s": 3, "rho": 8}),
    ("race", {"rows": 20, "width": 4, "p": 2}),
    ("race", {"rows": 20, "width": 4, "p": 2, "n_classes": 3}),
])
def test_masked_counts_cancel_to_the_counts_of_the_pooled_table(job_type, params) -> None:
    data = parties()
    job = {"type": job_type, "params": params}
    secure, plain = simulate(job, data, seed=SEED), simulate(job, data, secure=False, seed=SEED)
    model = secure["a"].model
    assert model is not None and plain["c"].model is not None
    np.testing.assert_array_equal(model.aggregate, plain["c"].model.aggregate)
    X = np.concatenate([X for X, _ in data.values()])
    y = np.concatenate([y for _, y in data.values()])
    p = parse_params(job_type, params)
    if job_type == "flynn":
        pooled = train_counts(FlyHash.from_seed(SEED, p.method_params(X.shape[1])), X[y >= 0], y[y >= 0], 3)
    elif not p.n_classes:
        pooled = sketch(RaceHashes.from_seed(SEED, p.method_params(), X.shape[1]), X)
    else:
        hashes = RaceHashes.from_seed(SEED, p.method_params(), X.shape[1])
        pooled = np.stack([sketch(hashes, X[y == c]) for c in range(3)])
    np.testing.assert_array_equal(model.aggregate, pooled)


def test_a_job_that_standardises_applies_the_pooled_scaling_and_says_what_it_releases() -> None:
    data = parties()
    data["b"] = (data["b"][0] * 10 + 5, data["b"][1])
    params = {"n_classes": 3, "m": 64, "s": 3, "rho": 8, "standardise": True}
    sim = simulate({"type": "flynn", "params": params}, data, seed=SEED)
    want = pooled_scaling([X for X, _ in data.values()], parse_params("flynn", params))
    assert sim["a"].model is not None and sim["a"].model.scaling is not None
    np.testing.assert_allclose(sim["a"].model.scaling.mean, want.mean)
    np.testing.assert_allclose(sim["a"].model.scaling.std, want.std)
    X = np.concatenate([X for X, _ in data.values()])
    y = np.concatenate([y for _, y in data.values()])
    flyhash = FlyHash.from_seed(SEED, parse_params("flynn", params).method_params(X.shape[1]))
    np.testing.assert_array_equal(sim["a"].model.aggregate, train_counts(flyhash, want.apply(X)[y >= 0], y[y >= 0], 3))
    report = sim.report()
    assert "the pooled mean and standard deviation of every feature, exactly" in report
    assert "minus its own, the sum of the others' (2 parties together)" in report


def test_the_report_names_what_each_role_learns_with_this_runs_sizes() -> None:
    data = parties(n=30)
    sim = simulate(XCLP, data, secure=False, seed=SEED)
    assert set(sim.learns) == {"coordinator", "a", "b", "c"}
    coordinator = " ".join(sim.learns["coordinator"])
    assert "90 rows in all" in coordinator and f"({sim.details['edges']} edges)" in coordinator
    assert "which rows are labeled (not the labels)" in coordinator
    assert "the Hamming distance between the LSH codes of every pair of rows of different parties" in coordinator
    assert sim.learns["a"][0].startswith("label scores for its 10 unlabeled rows")
    hidden = simulate(XCLP + "hide_label_mask = true\n", data, secure=False, seed=SEED)
    assert "nothing of which rows are labeled" in " ".join(hidden.learns["coordinator"])
    assert hidden.learns["b"][0].startswith("label scores for its 30 rows")


def test_training_jobs_run_and_a_withheld_model_reaches_no_party() -> None:
    data = {p: (X, y) for p, (X, y) in parties().items()}
    dbcl = {"type": "dbcl", "params": {"n_classes": 3, "hidden": [8], "rounds": 2, "withhold_model": True}}
    sim = simulate(dbcl, data, seed=SEED)
    assert all(sim[p].model is None for p in data)
    assert "nothing of the model: the job withholds it" in sim.report()
    fedavg = simulate({"type": "fedavg", "params": {"n_classes": 3, "hidden": [8], "rounds": 2}}, data, seed=SEED,
                      secure=False)
    new = pd.DataFrame(data["a"][0], columns=[f"x{j}" for j in range(6)])
    assert len(fedavg["a"].predict(new)) == 40


@pytest.mark.parametrize("job, parts, options, error, message", [
    (XCLP, 1, {}, InvalidInput, "at least two parties, got 1"),
    ("type = \"nope\"\n", 3, {}, ConfigError, "unknown job type 'nope'"),
    ("type = ", 3, {}, ConfigError, "not valid TOML"),
    ({"params": {}}, 3, {}, ConfigError, "with type"),
    (XCLP + "label_dp_epsilon = 2.0\n", 3, {"secure": False}, InvalidInput, "simulate it with secure=True"),
    (XCLP + "pair_budget = 0.5\n", 3, {}, InvalidInput, "set pair_budget = 1.0"),
    (XCLP, 3, {"seed": b"short"}, InvalidInput, "seed must be 32 bytes"),
])
def test_a_job_the_simulation_cannot_run_is_refused_with_what_is_wrong(job, parts, options, error, message) -> None:
    data = dict(list(parties(n=20).items())[:parts])
    with pytest.raises(error, match=message):
        simulate(job, data, **options)


def test_a_partys_bad_table_is_named() -> None:
    data = parties(n=20)
    data["b"] = (data["b"][0], np.where(data["b"][1] == 2, 7, data["b"][1]))
    with pytest.raises(InvalidInput, match="party 'b': label 7 at row .* out of range for a 3-class job"):
        simulate(XCLP, data, secure=False)


def test_integer_ids_come_back_as_integers_as_xclp_client_run_gives_them() -> None:
    """A DataFrame's integer id column: `predictions().id` holds the same integers as the column
    (as `xclp.client.run` gives them), so a user can merge the two; before, the simulation gave
    them as text and the merge failed."""
    frames = {}
    for p, (X, y) in parties().items():
        frame = pd.DataFrame(X, columns=[f"x{j}" for j in range(X.shape[1])])
        frame["label"] = pd.array(np.where(y < 0, None, y), dtype="Int64")
        frame["row_id"] = np.arange(len(y)) + 1000 * (ord(p) - ord("a"))
        frames[p] = frame
    sim = simulate(XCLP, frames, id_column="row_id", seed=SEED, secure=False)
    for p, frame in frames.items():
        got = sim[p].predictions()
        assert got["id"].dtype.kind == "i" and got["id"].tolist() == frame["row_id"].tolist()
        assert len(got.merge(frame, left_on="id", right_on="row_id")) == len(frame)


def test_simulate_reads_the_tables_by_the_jobs_id_column(tmp_path) -> None:
    """Without --id-column the id became a feature and the verdict changed; the job's `id_column`
    (which `federation new` writes) is now how simulate reads the tables: the ids come back as the
    predictions' ids, the features are the job's `columns`, and the result equals a run given the id
    column by hand."""
    from tests.helpers import write_table

    paths = {}
    for p, (X, y) in parties().items():
        paths[p] = tmp_path / f"{p}.csv"
        write_table(paths[p], X, y, [f"{p}-{k}" for k in range(len(y))])
    job = XCLP + 'id_column = "row_id"\ncolumns = ["f0", "f1", "f2", "f3", "f4", "f5"]\n'
    sim = simulate(job, paths, seed=SEED, secure=False)
    by_hand = simulate(XCLP, paths, id_column="row_id", seed=SEED, secure=False)
    for p in paths:
        got = sim[p].predictions()
        assert got["id"].tolist() == [f"{p}-{k}" for k in range(40)]
        assert sim[p].job.dim == 6
        np.testing.assert_array_equal(sim[p].job.aggregate, by_hand[p].job.aggregate)
