"""The schema is part of the job (`columns`, which `xclp-server federation new` writes): every
party is checked against the job, not against the first party to join. Before, the first party
to join set the column layout, and a correct party joining after a wrong one was blamed ("data has
14 columns but 'store34' has 13")."""

from __future__ import annotations

import dataclasses
import time

import pytest

from tests.harness import admit, allow_list, coordinator, job, party_data, run_parties
from xclp.client.run_config import JobResult
from xclp.data.party_table import PartyData, schema_digest
from xclp.errors import ConfigError, InvalidInput
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.registry import parse_params

COLUMNS = ("age", "income", "dose", "site")
FLYNN = {"n_classes": 3, "m": 64, "s": 2, "rho": 8, "columns": list(COLUMNS)}


def named(seed: int, columns=COLUMNS) -> PartyData:
    base = party_data(seed, d=len(columns))
    return dataclasses.replace(base, columns=tuple(columns))


@pytest.mark.parametrize("wrong", ["missing", "renamed", "reordered"])
def test_a_party_whose_columns_are_not_the_jobs_is_refused_by_name_whoever_joined_first(keys, wrong: str) -> None:
    """b, whose table lacks a column (or names one otherwise, or orders them otherwise), is the one
    refused, with what differs; a and c run. b checks itself before it joins, and declines with
    its reason, so the run does not wait for it."""
    bad = {"missing": COLUMNS[:3], "renamed": ("age", "income", "dose", "clinic"),
           "reordered": ("income", "age", "dose", "site")}[wrong]
    datas = {"a": named(1), "b": named(2, bad), "c": named(3)}
    config = job("f", "flynn", FLYNN, parties=("a", "b", "c"), min_parties=2, join_seconds=60.0)
    began = time.monotonic()
    with coordinator(allow_list(keys), [config]) as (coord, address):
        results = run_parties(address, "f", keys, datas)
        info = coord.run_info(coord.store.runs(job_id="f", limit=1)[0].run_id)
    assert time.monotonic() - began < 30
    assert isinstance(results["b"], InvalidInput), results["b"]
    said = {"missing": "missing 'site'", "renamed": "missing 'site'; not in the job 'clinic'",
            "reordered": "the same names in another order"}[wrong]
    assert f"this party's feature columns are not the job's (columns = [...] in the job file): {said}" in \
        str(results["b"])
    assert all(isinstance(results[p], JobResult) for p in "ac"), results
    assert {p.party_id: p.state for p in info.parties}["b"] == "declined"


def test_the_coordinator_checks_each_summary_against_the_job_not_the_first_to_join(keys) -> None:
    """A party that skips its own check (another version) is refused at Join by the coordinator, by
    the job's schema: joined first, it does not set the layout for the others."""
    config = job("f", "flynn", FLYNN, parties=("a", "b", "c"), min_parties=2)
    wrong = pb.DataSummary(rows=10, dim=3, labeled_rows=5, schema=schema_digest(COLUMNS[:3]))
    right = pb.DataSummary(rows=10, dim=4, labeled_rows=5, schema=schema_digest(COLUMNS))
    with coordinator(allow_list(keys), [config]) as (coord, _):
        run = coord.jobs["f"]
        with pytest.raises(InvalidInput, match="this party's feature columns are not those job 'f' lists"):
            admit(run, keys, "a", wrong)
        admit(run, keys, "b", right)
        admit(run, keys, "c", right)
        assert sorted(run.lobby.parties) == ["b", "c"]


def test_a_schema_is_checked_when_the_job_is_read() -> None:
    parsed = parse_params("flynn", {**FLYNN, "categorical": {"site": ["x", "y"]}})
    assert parsed.feature_columns == ("age", "income", "dose", "site=x", "site=y")
    with pytest.raises(ConfigError, match="distinct, non-empty"):
        parse_params("flynn", {**FLYNN, "columns": ["age", "age"]})
    with pytest.raises(ConfigError, match="categorical names colour, which columns does not list"):
        parse_params("flynn", {**FLYNN, "categorical": {"colour": ["red"]}})
    assert parse_params("flynn", {k: v for k, v in FLYNN.items() if k != "columns"}).feature_columns is None


def test_the_job_names_the_id_column_and_a_party_reading_its_ids_elsewhere_is_told_what_to_pass() -> None:
    """`id_column` in the job: a party that read its ids from another column, or as row numbers, is
    refused before joining with the option to pass. The job never changes how a party reads its
    table (that would rename its data set, docs/privacy.md), it only checks."""
    from xclp.client.run_config import check_schema

    params = parse_params("flynn", {**FLYNN, "id_column": "patient_id"})
    check_schema(dataclasses.replace(named(0), id_column="patient_id"), params)
    with pytest.raises(InvalidInput, match=r"names 'patient_id' as the id column, but this party read its ids from "
                                           r"'row_id': name it with --id-column patient_id"):
        check_schema(dataclasses.replace(named(0), id_column="row_id"), params)
    with pytest.raises(InvalidInput, match="read its ids as row numbers"):
        check_schema(named(0), params)
    with pytest.raises(ConfigError, match="'age' is also in 'columns': the id column is not a feature"):
        parse_params("flynn", {**FLYNN, "id_column": "age"})
    with pytest.raises(ConfigError, match="'id_column' must be a column name"):
        parse_params("flynn", {**FLYNN, "id_column": ""})
