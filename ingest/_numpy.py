"""numpy helpers that keep the GIL.

numpy gives the GIL up inside an operation on more than 500 items (its threshold for a loop), and `np.zeros`
of 1 KB or more gives it up around its ``calloc``. Beside a thread that holds the GIL (a training loop in the
same process) each release costs up to a switch interval (docs/measurements.md, The in-process CUDA loader).
The loader's per-batch code therefore works on ``(N,)`` columns and makes its zeroed arrays here.
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np

#: numpy's threshold: an operation on more items than this gives the GIL up.
LIMIT = 500


def zeros(shape: int | tuple[int, ...], dtype) -> np.ndarray:
    """``np.zeros(shape, dtype)`` over a zeroed ``bytearray`` (Python fills it holding the GIL), writable."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return np.frombuffer(bytearray(math.prod(shape) * dtype.itemsize), dtype).reshape(shape)


def columns(*cols, n: int | None = None, dtype=np.float64) -> np.ndarray:
    """An ``(n, len(cols))`` array filled column by column (each column an (n,) array or a number; ``n``:
    the arrays' length, or given)."""
    if n is None:
        n = max((len(c) for c in cols if np.ndim(c)), default=0)
    out = np.empty((n, len(cols)), dtype=dtype)
    for j, col in enumerate(cols):
        out[:, j] = col
    return out


def assign(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for two arrays of one shape ``(n, ...)``, one ``(n,)`` column at a time."""
    for index in product(*map(range, dst.shape[1:])):   # product: np.ndindex costs more to set up per call
        dst[(slice(None), *index)] = src[(slice(None), *index)]


def copy(a: np.ndarray, dtype=None) -> np.ndarray:
    """A copy of the ``(n, ...)`` array ``a`` (as ``dtype``, if given), made column by column (`assign`)."""
    out = np.empty(a.shape, dtype=dtype or a.dtype)
    assign(out, a)
    return out


def take(a: np.ndarray, idx: np.ndarray, dtype=None) -> np.ndarray:
    """``a[idx]`` (as ``dtype``, if given) for a 1-D ``a`` and ``idx`` of any length, `LIMIT` items at a time."""
    out = np.empty(len(idx), dtype=dtype or a.dtype)
    for start in range(0, len(idx), LIMIT):
        out[start:start + LIMIT] = a[idx[start:start + LIMIT]]
    return out


def extremes(a: np.ndarray) -> tuple:
    """``(a.min(), a.max())`` of a non-empty 1-D array, `LIMIT` items at a time."""
    parts = [a[start:start + LIMIT] for start in range(0, len(a), LIMIT)]
    return min(p.min() for p in parts), max(p.max() for p in parts)
