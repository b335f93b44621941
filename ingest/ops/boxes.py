"""A batch's boxes as one array: what detection's draws, maps and prunes work on.

Sample n's boxes are rows ``starts[n]:starts[n + 1]`` of one ``[M, 4]`` float64 array (:class:`BoxBatch`), so
converting a batch between formats, mapping it through an op, dropping boxes and pruning the fields that go
with them are a few array operations for the whole batch, whatever its sample and box counts. Boxes keep
their sample's order (a drop is a boolean selection), so ``starts`` stays a valid offset column.

Formats (`ingest.formats.boxes`): ``"xyxy"`` (also ``"ltrb"``: x0, y0, x1, y1), ``"xywh"`` (COCO's x, y,
width, height) or ``"cxcywh"`` (centre, width, height), in absolute pixels or, with ``relative``, as fractions
of the image's width and height. The ops work on one internal format, absolute xyxy of the probed image:
`to_ltrb` takes a source's boxes there and `from_ltrb` back to the format the reader was asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..formats.boxes import BOX_FORMATS, convert  # noqa: F401 - the formats, re-exported for the ops


@dataclass(frozen=True, eq=False)
class BoxBatch:
    """``flat`` ``[M, 4]`` float64 boxes of a batch; sample n's are rows ``starts[n]:starts[n + 1]``
    (``starts``: ``[N + 1]`` int64, non-decreasing, from 0 to M). ``len()`` is the number of samples."""

    flat: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, boxes: Sequence[Any] | "BoxBatch", coerce: Callable[[Any], np.ndarray] | None = None
           ) -> "BoxBatch":
        """Per-sample boxes as one batch; a BoxBatch as it is. numpy arrays that are all ``[K, 4]`` are joined
        in one ``np.concatenate``; anything else is brought to ``[K, 4]`` float64 sample by sample first, by
        ``coerce`` (default :func:`as_array`: arrays, tensors or nested lists, an empty one of any shape)."""
        if isinstance(boxes, BoxBatch):
            return boxes
        arrays = list(boxes)
        counts = np.zeros(len(arrays) + 1, dtype=np.int64)
        flat = _joined(arrays)
        if flat is None:
            arrays = list(map(coerce or as_array, arrays))
            flat = np.concatenate(arrays) if arrays else np.zeros((0, 4))
        counts[1:] = np.fromiter(map(len, arrays), np.int64, len(arrays))
        return cls(flat, np.cumsum(counts))

    def __len__(self) -> int:
        return len(self.starts) - 1

    @property
    def counts(self) -> np.ndarray:
        """Boxes per sample, ``[N]``."""
        return np.diff(self.starts)

    @property
    def owner(self) -> np.ndarray:
        """The sample of each box, ``[M]`` int64."""
        return np.repeat(np.arange(len(self)), self.counts)

    def per_sample(self) -> list[np.ndarray]:
        """Sample by sample: ``[K, 4]`` views of ``flat``."""
        return split(self.flat, self.starts)

    def select(self, keep: np.ndarray) -> "BoxBatch":
        """The boxes where ``keep`` ``[M]`` is set, in order, with their samples' offsets."""
        kept = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(keep, out=kept[1:])
        return BoxBatch(self.flat[keep], kept[self.starts])


def split(a: np.ndarray | torch.Tensor, starts: np.ndarray) -> list[Any]:
    """Rows ``starts[n]:starts[n + 1]`` of ``a`` for every sample n (views)."""
    bounds = starts.tolist()
    return [a[lo:hi] for lo, hi in zip(bounds, bounds[1:])]


def _joined(arrays: list[Any]) -> np.ndarray | None:
    """The per-sample arrays as one ``[M, 4]`` float64 array when they are all numpy arrays of that shape;
    else None."""
    try:
        flat = np.concatenate(arrays, dtype=np.float64, casting="same_kind") if arrays else None
    except (TypeError, ValueError):
        return None
    return flat if flat is not None and flat.ndim == 2 and flat.shape[1] == 4 and \
        set(map(type, arrays)) == {np.ndarray} else None


def as_array(boxes: Any) -> np.ndarray:
    """``[K, 4]`` float64 boxes from an array, a tensor or nested lists."""
    a = boxes.detach().cpu().numpy() if isinstance(boxes, torch.Tensor) else np.asarray(boxes)
    if a.size == 0:
        return np.zeros((0, 4))
    if a.ndim != 2 or a.shape[1] != 4:
        raise ValueError(f"boxes must be [K, 4] (x0, y0, x1, y1), got shape {a.shape}")
    return a.astype(np.float64)


def to_ltrb(boxes: BoxBatch, sizes: np.ndarray, box_format: str = "xyxy", relative: bool = False) -> BoxBatch:
    """Boxes in ``box_format`` (relative to their image's size, or absolute) as absolute ltrb of images of
    ``sizes`` ``[N, 2]`` (height, width). Returns a new batch."""
    b = boxes.flat.astype(np.float64, copy=True)
    if relative:
        b *= _scale(boxes, sizes)
    return BoxBatch(convert(b, box_format, "xyxy"), boxes.starts)


def from_ltrb(boxes: BoxBatch, sizes: np.ndarray, box_format: str = "xyxy", relative: bool = False) -> np.ndarray:
    """:func:`to_ltrb`'s inverse: absolute ltrb of images of ``sizes`` as ``box_format`` (relative or not),
    ``[M, 4]`` float32."""
    b = convert(boxes.flat, "xyxy", box_format)
    if relative:
        b /= _scale(boxes, sizes)
    return b.astype(np.float32)


def _scale(boxes: BoxBatch, sizes: np.ndarray) -> np.ndarray:
    """Each box's (width, height, width, height) of its image, ``[M, 4]`` float64."""
    hw = np.asarray(sizes, dtype=np.float64).reshape(-1, 2)[boxes.owner]
    return hw[:, [1, 0, 1, 0]]
