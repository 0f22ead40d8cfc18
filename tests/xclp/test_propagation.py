"""Label matrices, scores and predictions on hand-checkable examples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from xclp.errors import InvalidInput
from xclp.propagation import label_matrix, label_norm_mode, predict, scores


def test_one_hot_label_matrix() -> None:
    np.testing.assert_array_equal(label_matrix([2, 0, 2], 3), [[0, 0, 1], [1, 0, 0], [0, 0, 1]])


def test_class_normalised_label_matrix_divides_by_class_count() -> None:
    Y = label_matrix([2, 0, 2, 2], 4, normalise=True)
    np.testing.assert_allclose(Y, [[0, 0, 1 / 3, 0], [1, 0, 0, 0], [0, 0, 1 / 3, 0], [0, 0, 1 / 3, 0]])
    np.testing.assert_allclose(Y.sum(axis=0), [1, 0, 1, 0])  # absent classes stay zero


def test_label_matrix_with_given_class_counts() -> None:
    # A party holding 1 of 4 labeled rows of class 0 and 2 of 2 of class 1 (pooled counts [4, 2]).
    Y = label_matrix([0, 1, 1], 2, normalise=True, class_counts=np.array([4, 2]))
    np.testing.assert_allclose(Y, [[0.25, 0.0], [0.0, 0.5], [0.0, 0.5]])
    with pytest.raises(InvalidInput, match="at least the number of labeled rows"):
        label_matrix([0, 1, 1], 2, normalise=True, class_counts=np.array([4, 1]))


@pytest.mark.parametrize(("given", "mode"), [(False, "none"), (True, "party"), ("none", "none"), ("pooled", "pooled")])
def test_label_norm_modes(given: object, mode: str) -> None:
    assert label_norm_mode(given) == mode  # type: ignore[arg-type]


def test_label_matrix_refuses_unlabeled_and_out_of_range() -> None:
    with pytest.raises(InvalidInput, match="out of range; allowed: 0..2"):
        label_matrix([0, -1], 3)
    with pytest.raises(InvalidInput, match="out of range"):
        label_matrix([3], 3)


def test_scores_is_matrix_product_and_checks_shapes() -> None:
    S_L = np.array([[1.0, 0.5], [0.2, 2.0], [0.0, 0.0]])
    Y_L = label_matrix([1, 0], 2)
    np.testing.assert_allclose(scores(S_L, Y_L), [[0.5, 1.0], [2.0, 0.2], [0.0, 0.0]])
    with pytest.raises(InvalidInput, match="2 labeled columns but Y_L has 3 rows"):
        scores(S_L, label_matrix([1, 0, 1], 2))


def test_predict_by_hand() -> None:
    Z = np.array(
        [
            [0.0, 3.0, 0.0, 0.0],  # certain: class 1, confidence 1
            [1.0, 1.0, 1.0, 1.0],  # uniform: class 0 (tie -> smallest), confidence 0
            [0.0, 0.0, 0.0, 0.0],  # nothing reached this row: uniform, confidence 0
            [2.0, 2.0, 0.0, 0.0],  # two-way tie: class 0, confidence 1 - log 2 / log 4 = 0.5
            [-0.1, 1.0, 1.0, -5.0],  # negatives clipped: same as [0, 1, 1, 0] -> class 1, 0.5
        ]
    )
    labels, confidence = predict(Z)
    np.testing.assert_array_equal(labels, [1, 0, 0, 0, 1])
    assert labels.dtype == np.int64
    np.testing.assert_allclose(confidence, [1.0, 0.0, 0.0, 0.5, 0.5], atol=1e-15)


def test_predict_three_class_entropy() -> None:
    _, confidence = predict(np.array([[1.0, 2.0, 1.0]]))
    p = np.array([0.25, 0.5, 0.25])
    np.testing.assert_allclose(confidence, [1 + (p * np.log(p)).sum() / np.log(3)])


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 8), st.integers(2, 6)), elements=st.floats(0, 1e6)))
def test_confidence_in_unit_interval_and_scale_invariant(Z: np.ndarray) -> None:
    labels, confidence = predict(Z)
    assert np.all((confidence >= 0) & (confidence <= 1))
    np.testing.assert_array_equal(labels, np.argmax(Z, axis=1))
    labels2, confidence2 = predict(Z * 4.0)
    np.testing.assert_array_equal(labels2, labels)
    np.testing.assert_allclose(confidence2, confidence, atol=1e-12)


def test_predict_refuses_bad_scores() -> None:
    with pytest.raises(InvalidInput, match="C >= 2"):
        predict(np.ones((3, 1)))
    with pytest.raises(InvalidInput, match="NaN/inf"):
        predict(np.array([[np.nan, 1.0]]))
