"""The party's Python API (client/api.py): every form of a table reads as its CSV does, bad ones
are refused with what is wrong, the party id comes from the allow-list, and three parties run a
real XCLP job and a real FlyNN job through `xclp.client.run` on DataFrames against an in-process
coordinator, getting what `xclp.simulation.simulate` gives for the same seed."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import xclp.client
from tests.harness import PARTIES, allow_list, coordinator, job, on_threads
from tests.helpers import make_data, write_table
from xclp.client.api import _party
from xclp.crypto import identity
from xclp.data import tables
from xclp.errors import ConfigError, InvalidInput, XclpError
from xclp.simulation import simulate


def frame(seed: int, n: int = 40, *, int_ids: bool = False) -> pd.DataFrame:
    X, y = make_data(seed, n=n, d=6, unlabeled=8)
    df = pd.DataFrame(X, columns=[f"f{j}" for j in range(X.shape[1])])
    df.insert(0, "row_id", [1000 * seed + i for i in range(n)] if int_ids else [f"p{seed}-{i}" for i in range(n)])
    df["label"] = pd.array(np.where(y < 0, None, y), dtype="Int64")
    return df


def test_a_dataframe_a_pyarrow_table_a_parquet_file_and_arrays_read_as_the_csv_does(tmp_path) -> None:
    X, y = make_data(3, n=30, d=5, unlabeled=6)
    X[4, 2] = np.nan
    ids = [f"r{i}" for i in range(30)]
    write_table(tmp_path / "t.csv", X, y, ids)
    want = tables.load(tmp_path / "t.csv", id_column="row_id")
    df = pd.DataFrame(X, columns=[f"f{j}" for j in range(5)])
    df.insert(0, "row_id", ids)
    df["label"] = pd.array(np.where(y < 0, None, y), dtype="Int64")
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), tmp_path / "t.parquet")
    forms = {"DataFrame": df, "Table": pa.Table.from_pandas(df), "parquet": str(tmp_path / "t.parquet")}
    for name, form in forms.items():
        got = tables.read_any(form, id_column="row_id")
        np.testing.assert_array_equal(got.X, want.X, err_msg=name)
        np.testing.assert_array_equal(got.with_classes(None).y, want.with_classes(None).y, err_msg=name)
        assert got.ids == want.ids and got.columns == want.columns, name
    arrays = tables.read_any((X, y, ids))
    np.testing.assert_array_equal(arrays.X, want.X)
    np.testing.assert_array_equal(arrays.y, y)
    assert arrays.ids == tuple(ids)
    named = tables.read_any(pd.DataFrame({"x": [1.0, 2.0, 3.0], "label": ["cat", None, "dog"]}))
    assert named.labels is not None and named.labels.values == ("cat", "dog") and named.labeled.tolist() == [1, 0, 1]


@pytest.mark.parametrize("data, message", [
    (pd.DataFrame({"a": ["x", "y"], "label": [0, 1]}), "column 'a' holds .*string, not numbers"),
    (pd.DataFrame({0: [1.0], 1: [2.0]}), "column names must be strings, got 0, 1"),
    ((np.ones((3, 2)), np.array([0.5, 1, 0])), "y must be one integer class number per row"),
    ((np.ones((3, 2)), np.array([0, -2, 1])), "y holds -2: class numbers are 0, 1"),
    ((np.ones((2, 2)), np.array([0, 1]), ["a", "a"]), "row id 'a' appears twice"),
    ((np.ones((2, 2)),), r"arrays are \(X, y\) or \(X, y, ids\)"),
    ((np.array([[1.0, np.inf]]), np.array([0])), "NaN/inf values"),
    ([[1.0, 2.0]], "data must be a path, a pandas DataFrame, a pyarrow Table or arrays"),
    (pd.DataFrame({"a": [1.0]}), "no id column 'pid'"),
])
def test_a_bad_table_is_refused_with_what_is_wrong(data, message) -> None:
    with pytest.raises(InvalidInput, match=message):
        tables.read_any(data, id_column="pid" if "id column" in message else None)


def test_the_party_id_is_the_allow_lists_entry_for_the_identity_key(keys) -> None:
    allow = allow_list(keys)
    assert _party(None, keys["b"], allow) == "b"
    assert _party("b", keys["b"], allow) == "b"
    with pytest.raises(ConfigError, match="not the key the allow-list pins for 'a'"):
        _party("a", keys["b"], allow)
    with pytest.raises(ConfigError, match="pins this identity key for no party"):
        _party(None, identity.generate_identity(), allow)


def _run_all(address: str, job_id: str, keys, frames: dict[str, pd.DataFrame], **options) -> dict[str, object]:
    def go(party: str) -> xclp.client.PartyResult:
        return xclp.client.run(job=job_id, coordinator=address, insecure=True, identity=keys[party],
                               peers=allow_list(keys), data=frames[party], id_column="row_id", connect_timeout=10,
                               progress=lambda line: None, **options)

    return on_threads(frames, go)


def test_three_parties_run_xclp_from_dataframes_and_get_what_the_simulation_gives(keys, tmp_path) -> None:
    """b's ids are integers: its predictions give them back as integers (they came as text)."""
    frames = {p: frame(i, int_ids=p == "b") for i, p in enumerate(PARTIES)}
    params = {"n_classes": 3, "lsh_bits": 256, "k": 4, "key_bits": 512, "insecure_test_keys": True}
    with coordinator(allow_list(keys), [job("api-xclp", "xclp", params)]) as (_, address):
        results = _run_all(address, "api-xclp", keys, frames, paillier_bits=512, insecure_test_keys=True,
                           state=tmp_path / "releases.json")
    assert all(isinstance(r, xclp.client.PartyResult) for r in results.values()), results
    seed = results["a"].job.seed  # type: ignore[union-attr]
    sim = simulate({"type": "xclp", "params": params}, frames, secure=False, seed=seed, id_column="row_id")
    for p, result in results.items():
        got = result.predictions()  # type: ignore[union-attr]
        want = sim[p].predictions()
        assert got["id"].tolist() == frames[p]["row_id"].tolist()
        assert got["id"].dtype == frames[p]["row_id"].dtype
        assert got["label"].tolist() == want["label"].tolist()
        np.testing.assert_allclose(got.filter(like="score_").to_numpy(), want.filter(like="score_").to_numpy(),
                                   atol=1e-6)
        assert result.model is None  # type: ignore[union-attr]
        saved = result.save(tmp_path / p)  # type: ignore[union-attr]
        assert saved is not None and pd.read_csv(saved, dtype=str)["label"].tolist() == want["label"].tolist()


def test_three_parties_train_flynn_from_dataframes_and_the_model_is_the_simulated_one(keys, tmp_path) -> None:
    frames = {p: frame(10 + i) for i, p in enumerate(PARTIES)}
    params = {"n_classes": 3, "m": 64, "s": 3, "rho": 8}
    with coordinator(allow_list(keys), [job("api-flynn", "flynn", params)]) as (_, address):
        results = _run_all(address, "api-flynn", keys, frames)
    assert all(isinstance(r, xclp.client.PartyResult) for r in results.values()), results
    a = results["a"]
    assert isinstance(a, xclp.client.PartyResult) and a.model is not None
    sim = simulate({"type": "flynn", "params": params}, frames, seed=a.job.seed, id_column="row_id")
    np.testing.assert_array_equal(a.model.aggregate, sim["a"].model.aggregate)  # type: ignore[union-attr]
    new = frame(20).drop(columns=["label"])
    predicted = a.predict(new, id_column="row_id")
    assert predicted["prediction"].tolist() == sim["b"].predict(new, id_column="row_id")["prediction"].tolist()
    saved = a.save(f"{tmp_path / 'new'}/")  # a directory not made yet, named as one: it gets model.npz
    assert saved == tmp_path / "new" / "model.npz" and saved.is_file()
    assert a.save(tmp_path / "flynn.npz") == tmp_path / "flynn.npz"
    with pytest.raises(InvalidInput, match="a flynn job gives a model, not predictions"):
        a.predictions()
    with pytest.raises(InvalidInput, match="only RACE models answer a query"):
        a.query(new, id_column="row_id")


def test_a_refused_run_raises_the_projects_exception_before_joining(keys) -> None:
    frames = {p: frame(i) for i, p in enumerate(PARTIES)}
    flynn = job("api-dp", "flynn", {"n_classes": 3, "m": 64, "s": 3, "rho": 8})
    with coordinator(allow_list(keys), [flynn]) as (_, address), \
            pytest.raises(XclpError, match="requires DP with epsilon <= 1"):
        xclp.client.run(job="api-dp", coordinator=address, insecure=True, identity=keys["a"], peers=allow_list(keys),
                        data=frames["a"], id_column="row_id", require_dp=1.0, connect_timeout=5,
                        progress=lambda line: None)


def test_a_paillier_key_is_made_at_the_join_only_for_a_job_that_needs_one(keys) -> None:
    """`paillier_bits` makes the key after the Challenge (a restarted party rejoins with the one it
    had and makes none: tests/service/test_party_restart.py), only for a job that runs XCLP."""
    from xclp.client.before_join import with_paillier_key
    from xclp.client.connection import ConnectionConfig
    from xclp.client.policy import PartyPolicy
    from xclp.client.run_config import RunConfig
    from xclp.v1.registry import parse_params

    said: list[str] = []
    config = RunConfig("x", "a", keys["a"], ConnectionConfig("localhost:1", insecure=True), paillier_bits=512,
                       policy=PartyPolicy(insecure_test_keys=True))
    flynn = parse_params("flynn", {"n_classes": 3, "m": 64, "s": 3, "rho": 8})
    assert with_paillier_key(config, flynn, said.append) is config and not said  # no key for FlyNN
    xclp = parse_params("xclp", {"n_classes": 3, "key_bits": 512, "insecure_test_keys": True})
    made = with_paillier_key(config, xclp, said.append)
    assert made.paillier is not None and made.paillier.public.n.bit_length() == 512
    assert said == ["generating a 512-bit Paillier key for this run"]
    assert with_paillier_key(made, xclp, said.append) is made and len(said) == 1  # one key, once
    with pytest.raises(InvalidInput, match=r"runs XCLP: start the party with a Paillier key \(--paillier-bits 512\)"):
        with_paillier_key(RunConfig("x", "a", keys["a"], ConnectionConfig("localhost:1", insecure=True)), xclp,
                          said.append)


@pytest.mark.parametrize("rejoins", [-1, 1.5, "3", True])
def test_rejoins_that_are_not_a_count_are_refused_before_anything(keys, rejoins) -> None:
    """Before the data is read or the coordinator dialled (there is none at this address), named as
    the API's keyword (not the flag, which a caller of the API never typed)."""
    with pytest.raises(ConfigError, match="^" + re.escape(f"rejoins must be a whole number >= 0, got {rejoins!r}")):
        xclp.client.run(job="f", coordinator="127.0.0.1:9", insecure=True, identity=keys["a"], peers=allow_list(keys),
                        data="no-such-file.csv", rejoins=rejoins, progress=lambda line: None)
