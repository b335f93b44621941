"""numpy helpers that keep the GIL.

numpy gives the GIL up inside an operation on more than 500 items (its threshold for a loop), and `np.zeros`
of 1 KB or more gives it up around its ``calloc``. Beside a thread that holds the GIL (a training loop in the
same process) each release costs up to a switch interval: a GPU decode batch's planning, ~1 ms of numpy on
256 images, took ~13 ms beside a busy thread on 2 cores, and so on the H100. The loader's per-batch code
therefore works on ``(N,)`` columns and makes its zeroed arrays here.
"""

from __future__ import annotations

import math

import numpy as np


def zeros(shape: int | tuple[int, ...], dtype) -> np.ndarray:
    """``np.zeros(shape, dtype)`` over a zeroed ``bytearray`` (Python fills it holding the GIL), writable."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return np.frombuffer(bytearray(math.prod(shape) * dtype.itemsize), dtype).reshape(shape)


def columns(*cols, dtype=np.float64) -> np.ndarray:
    """An ``(n, len(cols))`` array filled column by column (each column an (n,) array or a number)."""
    n = max((len(c) for c in cols if np.ndim(c)), default=0)
    out = np.empty((n, len(cols)), dtype=dtype)
    for j, col in enumerate(cols):
        out[:, j] = col
    return out
