"""`xclp-client run --validate F` (client/validate.py): the rows held out are hidden from the run
(unlabeled in the table the session gets), stay the whole table's data set in the ledger, and the
comparison afterwards is computed on them; what cannot be validated is refused with its reason.
The real run through the CLIs is tests/service/test_federation_new.py."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from tests.helpers import make_data
from xclp.baselines import per_client_lp
from xclp.client.ledger import data_digest
from xclp.client.run_config import JobResult
from xclp.client.validate import HeldOut
from xclp.data.party_table import PartyData
from xclp.errors import ConfigError, InvalidInput
from xclp.v1.allreduce import FlynnJobParams
from xclp.v1.xclp import XclpJobParams

PARAMS = XclpJobParams(n_classes=3, lsh_bits=64, key_bits=512, insecure_test_keys=True)


def table() -> PartyData:
    X, y = make_data(3, n=60, d=5, unlabeled=10)
    return PartyData(X, y, tuple(f"r{i}" for i in range(60)))


def test_the_held_out_rows_go_in_unlabeled_and_the_table_stays_its_data_set() -> None:
    whole = table()
    held = HeldOut("a", 0.2)
    seen = held.loader(lambda params: whole)(PARAMS)
    assert held.rows is not None and held.truth is not None
    assert held.rows.size == 10 and set(held.rows) <= set(np.flatnonzero(whole.y >= 0))
    assert (seen.y[held.rows] == -1).all() and np.array_equal(held.truth, whole.y[held.rows])
    others = np.setdiff1d(np.arange(60), held.rows)
    assert np.array_equal(seen.y[others], whole.y[others])
    assert data_digest(seen) == data_digest(whole) != data_digest(replace(seen, dataset_digest=None))
    # the same rows on a rerun (a public seed named by the party), others for another party
    again = HeldOut("a", 0.2)
    again.loader(lambda params: whole)(PARAMS)
    other = HeldOut("b", 0.2)
    other.loader(lambda params: whole)(PARAMS)
    assert np.array_equal(again.rows, held.rows) and not np.array_equal(other.rows, held.rows)


def test_the_comparison_is_the_accuracy_of_the_runs_labels_and_of_the_rows_alone_on_the_held_out_rows() -> None:
    whole = table()
    held = HeldOut("a", 0.25)
    seen = held.loader(lambda params: whole)(PARAMS)
    scores = np.eye(3)[np.where(whole.y >= 0, whole.y, 0)]  # a run that gave every row its true label
    assert held.rows is not None
    scores[held.rows[:3]] = np.eye(3)[(whole.y[held.rows[:3]] + 1) % 3]  # three of them wrong
    job = JobResult("xclp", PARAMS, 5, b"", scores, ("a", "b"))
    got = held.compare(job, seen)
    alone = per_client_lp(seen.X, seen.y, 3, PARAMS.graph_params, PARAMS.normalise_labels).labels
    assert got.held_out == held.rows.size
    assert got.federated == pytest.approx(1 - 3 / held.rows.size)
    assert got.alone == pytest.approx(np.mean(alone[held.rows] == whole.y[held.rows])) and got.pooled is None


@pytest.mark.parametrize(("params", "data", "said"), [
    (FlynnJobParams(n_classes=3, m=64, s=3, rho=4), table(), "--validate holds out labels of an XCLP job"),
    (replace(PARAMS, label_dp_epsilon=2.0), table(), "--validate cannot run with label-DP"),
    (PARAMS, replace(table(), y=None), "this table has no label column"),
    (PARAMS, replace(table(), y=np.full(60, -1)), "party 'a' has 0 labeled rows: nothing to hold out"),
])
def test_what_cannot_be_validated_is_refused_when_the_job_is_known(params, data, said) -> None:
    with pytest.raises((ConfigError, InvalidInput), match=re.escape(said)):
        HeldOut("a", 0.2).loader(lambda p: data)(params)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5, 2.0])
def test_a_fraction_outside_zero_to_one_is_refused_before_anything(fraction) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"--validate must be a fraction in (0, 1), got {fraction}")):
        HeldOut("a", fraction)
