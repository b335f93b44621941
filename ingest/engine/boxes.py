"""Detection boxes as the stages see them: the source's box format, which per-box fields follow the boxes,
and the conversion to absolute ltrb pixels (the read stage converts before the ops draw; the ops stage's
`Plan.batch_targets` converts back after mapping)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..formats.base import Field, Source
from ..ops.base import size_array
from ..ops.boxes import BoxBatch, to_ltrb

PER_BOX = ("categories", "labels", "iscrowd", "area", "scores")  # per-box fields pruned with their boxes


class BoxFields:
    """A stage that handles boxes: `_init_boxes` (from its constructor) sets what the source says about them."""

    def _init_boxes(self, source: Source, extra_fields: dict[str, Field], image_kind: str | None,
                    ops: Sequence) -> None:
        # Detection: a "boxes" field (xyxy, xywh or cxcywh, absolute or relative, as the source says) follows the
        # geometry ops; the per-box fields (the source's `per_box`, else those of `PER_BOX` it has) are
        # pruned with their boxes, and "masks" are warped like the image.
        self.boxes = "boxes" in extra_fields and image_kind is not None
        self.box_format = getattr(source, "box_format", "xyxy")
        self.box_relative = bool(getattr(source, "relative", False))
        self.per_box = list(getattr(source, "per_box", None) or
                            [k for k in PER_BOX if k in extra_fields and extra_fields[k].kind != "array"])
        self.box_ops = self.boxes and any(getattr(op, "uses_boxes", False) for op in ops)

    def _to_ltrb(self, boxes: list[Any], sizes: list[tuple[int, int]]) -> BoxBatch:
        """The samples' boxes in the source's format as one batch of absolute ltrb pixels of images of ``sizes``
        (height, width): `ingest.ops.boxes.to_ltrb` (the way back is `Plan.batch_targets`'s)."""
        batch = BoxBatch.of(boxes, coerce=_box_rows)
        return to_ltrb(batch, size_array(sizes), self.box_format, self.box_relative)


def _box_rows(boxes: Any) -> np.ndarray:
    """A sample's boxes as ``[K, 4]`` float64 rows (any array-like of 4K numbers)."""
    return np.array(boxes, dtype=np.float64).reshape(-1, 4)
