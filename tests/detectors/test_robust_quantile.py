"""``nanquantile_rows_counts``: the nearest-rank quantile of each row's valid values."""

from __future__ import annotations

import numpy as np
import pytest

from detectors.robust import nanquantile_rows_counts


def _reference(row: np.ndarray, q: float) -> float:
    valid = np.sort(row[np.isfinite(row)])
    if not valid.size:
        return float("nan")
    return float(valid[int(np.floor(q * (valid.size - 1) + 0.5))])


@pytest.mark.parametrize("q", [0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_sorting_each_row_whatever_is_missing(q: float, dtype: type) -> None:
    rng = np.random.default_rng(7)
    a = rng.normal(size=(300, 17)).astype(dtype)
    a[rng.random(a.shape) < 0.3] = np.nan
    a[5] = np.nan  # a row with nothing valid
    a[6, :-1] = np.nan  # a row with one valid value
    got, valid = nanquantile_rows_counts(a, q)
    want = np.array([_reference(row.astype(np.float64), q) for row in a])
    np.testing.assert_array_equal(valid, np.isfinite(a).sum(axis=1))
    np.testing.assert_allclose(got, want, equal_nan=True)


def test_rejects_a_quantile_outside_zero_one() -> None:
    with pytest.raises(ValueError, match="q must be in"):
        nanquantile_rows_counts(np.ones((2, 3)), 1.5)


def test_leaves_the_input_alone_unless_told() -> None:
    a = np.array([[3.0, np.nan, 1.0, 2.0]])
    nanquantile_rows_counts(a, 0.25)
    np.testing.assert_array_equal(a, [[3.0, np.nan, 1.0, 2.0]])
