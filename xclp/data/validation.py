"""Input checks shared by every method: each failure says what is wrong and how to fix it."""

from __future__ import annotations

import numpy as np

from xclp.errors import InvalidInput

UNLABELED = -1


def check_features(X: object, *, d: int | None = None, name: str = "features") -> np.ndarray:
    """Return `X` as float64[n, d]; refuse non-2-D input, empty input, NaN/inf, wrong width."""
    try:
        arr = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{name} must be numeric: {exc}") from None
    if arr.ndim != 2:
        raise InvalidInput(f"{name} must be a 2-D array (rows x columns), got {arr.ndim}-D shape {arr.shape}")
    if arr.shape[0] == 0:
        raise InvalidInput(f"{name} has no rows: every party needs at least one row")
    if arr.shape[1] == 0:
        raise InvalidInput(f"{name} has no columns")
    if d is not None and arr.shape[1] != d:
        raise InvalidInput(f"{name} has {arr.shape[1]} columns but {d} were expected")
    bad = ~np.isfinite(arr)
    if bad.any():
        row, col = (int(v) for v in np.argwhere(bad)[0])
        raise InvalidInput(
            f"{name} contain {int(bad.sum())} NaN/inf values (first at row {row}, column {col}); "
            "impute or drop them before running"
        )
    return arr


def check_labels(y: object, n_classes: int, *, n: int | None = None, allow_unlabeled: bool = True) -> np.ndarray:
    """Return `y` as int64[n]; labels must be in 0..n_classes-1, or -1 (unlabeled) where allowed."""
    if not isinstance(n_classes, (int, np.integer)) or n_classes < 2:
        raise InvalidInput(f"n_classes must be an integer >= 2, got {n_classes!r}")
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise InvalidInput(f"labels must be a 1-D array, got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise InvalidInput(f"got {arr.shape[0]} labels for {n} rows")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise InvalidInput("labels must be whole numbers (use -1 for unlabeled rows)")
    elif arr.dtype.kind not in "iu":
        raise InvalidInput(f"labels must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    low = UNLABELED if allow_unlabeled else 0
    bad = (arr < low) | (arr >= n_classes)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        allowed = f"0..{n_classes - 1}" + (" or -1 for unlabeled" if allow_unlabeled else "")
        raise InvalidInput(f"label {int(arr[first])} at row {first} is out of range; allowed: {allowed}")
    return arr
