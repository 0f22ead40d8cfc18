"""Verdicts with their uncertainty (xclp.validation) and the local baseline beside them
(xclp.baselines.logistic_baseline): `simulate` and `run --validate` print each accuracy with its
95 % Wilson interval, and say a verdict only where the intervals say one."""

from __future__ import annotations

import numpy as np
import pytest

from xclp.baselines import logistic_baseline
from xclp.validation import Comparison, table, wilson


def test_wilson_intervals_match_published_values() -> None:
    # Brown, Cai and DasGupta (2001), and the closed form: 8 of 10, and 0 of 20
    low, high = wilson(0.8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    low, high = wilson(0.0, 20)
    assert low == 0.0 and high == pytest.approx(0.1611, abs=1e-4)
    assert wilson(0.5, 0) == (0.0, 1.0)


def test_a_verdict_is_said_only_where_the_intervals_do_not_overlap() -> None:
    few = Comparison("few", 12, alone=9 / 12, federated=10 / 12)  # overlapping
    many = Comparison("many", 400, alone=0.75, federated=0.83)  # the same rates on 400 rows: apart
    worse = Comparison("worse", 400, alone=0.83, federated=0.75)
    same = Comparison("same", 50, alone=0.9, federated=0.9)
    local = Comparison("local", 300, alone=0.63, federated=0.70, baseline=0.84)
    text = table([few, many, worse, same, local])
    assert "few                    12  0.750 [0.47, 0.91]  0.833 [0.55, 0.95]" in text
    assert "note: for few, 12 held-out rows are too few to tell federated from alone (0.833 against 0.750" in text
    assert many.helps and "for many" not in text
    assert worse.hurts and "WARNING: for worse, federating is worse than its own rows alone" in text
    assert "note: for same, federating does not change its accuracy (0.900 on 50 held-out rows)" in text
    assert ("note: for local, a logistic regression on its own labeled rows does better than federated label "
            "propagation (0.840 against 0.700)") in text
    assert "logistic" not in table([few])  # no baseline column where none was measured


def test_the_baseline_is_a_logistic_regression_as_scikit_learns() -> None:
    """An independent fit: scikit-learn's multinomial LogisticRegression with C = 1/l2 on the
    standardised labeled rows; the two agree on (nearly) every row."""
    sklearn = pytest.importorskip("sklearn.linear_model")
    rng = np.random.default_rng(3)
    centres = rng.normal(scale=1.5, size=(3, 5))
    y = rng.integers(0, 3, size=400)
    X = centres[y] + rng.normal(size=(400, 5)) * [1, 10, 0.1, 1, 1]
    seen = np.where(rng.random(400) < 0.5, y, -1)
    mine = logistic_baseline(X, seen, 3, l2=1.0)
    train = seen >= 0
    Z = (X - X[train].mean(axis=0)) / X[train].std(axis=0)
    theirs = sklearn.LogisticRegression(C=1.0, max_iter=2000).fit(Z[train], seen[train]).predict(Z)
    assert np.mean(mine == theirs) >= 0.99
    assert np.mean(mine[~train] == y[~train]) > 0.8
    assert (logistic_baseline(X, np.where(train, 2, -1), 3) == 2).all()  # one class seen: that class
