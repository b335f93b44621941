"""Detection boxes as the stages see them: the source's box format, which per-box fields follow the boxes,
and the conversions to and from absolute ltrb pixels (the read stage converts before the ops draw, the ops
stage converts back after mapping)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..formats.base import Field, Source

PER_BOX = ("categories", "labels", "iscrowd", "area", "scores")  # per-box fields pruned with their boxes


class BoxFields:
    """A stage that handles boxes: `_init_boxes` (from its constructor) sets what the source says about them."""

    def _init_boxes(self, source: Source, extra_fields: dict[str, Field], image_kind: str | None,
                    ops: Sequence) -> None:
        # Detection: a "boxes" field (ltrb or xywh, absolute or relative, as the source says) follows the
        # geometry ops; the per-box fields (the source's `per_box`, else those of `PER_BOX` it has) are
        # pruned with their boxes, and "masks" are warped like the image.
        self.boxes = "boxes" in extra_fields and image_kind is not None
        self.box_format = getattr(source, "box_format", "ltrb")
        self.box_relative = bool(getattr(source, "relative", False))
        self.per_box = list(getattr(source, "per_box", None) or
                            [k for k in PER_BOX if k in extra_fields and extra_fields[k].kind != "array"])
        self.box_ops = self.boxes and any(getattr(op, "uses_boxes", False) for op in ops)

    def _to_ltrb(self, boxes: Any, size: tuple[int, int]) -> np.ndarray:
        """Boxes in the source's format as ltrb absolute pixels of an image of ``size`` (height, width)."""
        b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
        if self.box_relative:
            b *= (size[1], size[0], size[1], size[0])
        if self.box_format == "xywh":
            b[:, 2:] += b[:, :2]
        return b

    def _from_ltrb(self, boxes: Any, size: tuple[int, int]) -> np.ndarray:
        b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
        if self.box_format == "xywh":
            b[:, 2:] -= b[:, :2]
        if self.box_relative:
            b /= (size[1], size[0], size[1], size[0])
        return b.astype(np.float32)
