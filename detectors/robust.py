"""Robust statistics shared by detectors: NaN-tolerant medians and MAD scales, vectorized.

    >>> import numpy as np
    >>> from detectors.robust import mad_scale_rows, nanmedian_rows
    >>> x = np.array([[1.0, np.nan, 3.0, 2.0], [4.0, 4.0, 4.0, 40.0]])
    >>> nanmedian_rows(x)
    array([2., 4.])
    >>> mad_scale_rows(x, center=nanmedian_rows(x), floor=0.5)
    array([1.4826, 0.5   ])

``numpy.nanmedian`` across thousands of columns falls back to a Python loop per row, and
``numpy.partition`` with two ``kth`` values is several times slower than with one. These
helpers do one single-``kth`` partition per call, whatever the pattern of missing values.
float32 input stays float32 (its partition is about twice as fast); anything else is
computed in float64. Results are float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
AnyFloatArray = npt.NDArray[np.floating[Any]]

# Scale factor that makes the MAD a consistent estimator of the standard deviation of a normal.
MAD_TO_SIGMA = 1.4826


def nanmedian_rows(a: npt.ArrayLike, *, overwrite: bool = False) -> FloatArray:
    """Median of each row of a 2-D array, ignoring NaN and ±inf; NaN for an all-missing row.

    With ``overwrite=True`` a C-contiguous float32/float64 input array is partitioned in
    place (its contents become unspecified) instead of copied.
    """
    return nanmedian_rows_counts(a, overwrite=overwrite)[0]


def nanmedian_rows_counts(
    a: npt.ArrayLike, *, overwrite: bool = False
) -> tuple[FloatArray, IntArray]:
    """:func:`nanmedian_rows` and the number of valid (finite) values in each row.

    Missing entries of a row are replaced by -inf and +inf in the proportion that puts the
    median of the row's valid values at column ``n // 2`` (and ``n // 2 - 1`` for an even
    count), so one ``partition`` serves every row.
    """
    arr = _writable_2d(a, overwrite=overwrite)
    n_rows, n = arr.shape
    if n == 0:
        return np.full(n_rows, np.nan), np.zeros(n_rows, dtype=np.int64)
    half = n // 2

    finite = np.isfinite(arr)
    valid = finite.sum(axis=1, dtype=np.int64)
    # The first `n_low` missing entries of a row sort low, the rest high.
    _place_missing(arr, finite, valid, n_low=half - valid // 2)

    arr.partition(half, axis=1)
    med = arr[:, half].astype(np.float64)
    even = (valid % 2 == 0) & (valid > 0)
    if half > 0 and even.any():
        low = arr[:, :half].max(axis=1).astype(np.float64)
        med[even] = 0.5 * (low[even] + med[even])
    med[valid == 0] = np.nan
    return med, valid


def nanquantile_rows_counts(
    a: npt.ArrayLike, q: float, *, overwrite: bool = False
) -> tuple[FloatArray, IntArray]:
    """Per-row ``q``-quantile of the valid values (nearest rank: the value at index
    ``floor(q * (valid - 1) + 0.5)`` of the sorted valid values, no interpolation) and the
    number of valid values, with one single-``kth`` partition like :func:`nanmedian_rows_counts`.

    >>> nanquantile_rows_counts(np.array([[4.0, 1.0, np.nan, 3.0, 2.0]]), 0.25)
    (array([2.]), array([4]))
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    arr = _writable_2d(a, overwrite=overwrite)
    n_rows, n = arr.shape
    if n == 0:
        return np.full(n_rows, np.nan), np.zeros(n_rows, dtype=np.int64)
    kth = int(np.floor(q * (n - 1) + 0.5))
    finite = np.isfinite(arr)
    valid = finite.sum(axis=1, dtype=np.int64)
    k_valid = np.floor(q * np.maximum(valid - 1, 0) + 0.5).astype(np.int64)
    _place_missing(arr, finite, valid, n_low=np.clip(kth - k_valid, 0, n - valid))
    arr.partition(kth, axis=1)
    out = arr[:, kth].astype(np.float64)
    out[valid == 0] = np.nan
    return out, valid


def _place_missing(
    arr: AnyFloatArray, finite: npt.NDArray[np.bool_], valid: IntArray, *, n_low: IntArray
) -> None:
    """Overwrite each row's missing entries: its first ``n_low`` ones (row-major order) with
    -inf, the rest with +inf, so that after one partition the wanted order statistic of the
    row's valid values sits at a column shared by every row."""
    n = arr.shape[1]
    if not (valid < n).any():
        return
    where = np.flatnonzero(~finite)
    row = where // n
    n_missing = n - valid
    first = np.cumsum(n_missing) - n_missing
    nth = np.arange(where.size) - first[row]
    arr.reshape(-1)[where] = np.where(nth < n_low[row], -np.inf, np.inf)


def mad_scale_rows(a: npt.ArrayLike, *, center: npt.ArrayLike, floor: float = 0.0) -> FloatArray:
    """Per-row robust standard deviation: ``1.4826 · median(|a - center|)``, at least ``floor``.

    ``center`` is one value per row (usually the row median). Rows with no valid values get
    ``floor``. The floor keeps z-scores finite when every rank is (nearly) identical.
    """
    arr = np.asarray(a)
    if arr.dtype != np.float32:
        arr = arr.astype(np.float64, copy=False)
    c = np.asarray(center).astype(arr.dtype).reshape(-1, 1)
    dev = arr - c
    np.abs(dev, out=dev)
    mad = nanmedian_rows(dev, overwrite=True)
    scale: FloatArray = np.fmax(MAD_TO_SIGMA * mad, floor)
    return scale


def _writable_2d(a: npt.ArrayLike, *, overwrite: bool) -> AnyFloatArray:
    """``a`` itself when it may be overwritten, else a C-contiguous float32/float64 copy."""
    arr = np.asarray(a)
    if arr.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {arr.shape}")
    dtype = np.float32 if arr.dtype == np.float32 else np.float64
    in_place = (
        overwrite
        and arr is a
        and arr.dtype == dtype
        and arr.flags.c_contiguous
        and arr.flags.writeable
    )
    if in_place:
        return arr
    copy: AnyFloatArray = np.array(arr, dtype=dtype, order="C", copy=True)
    return copy
