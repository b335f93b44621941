"""Box formats: the one convention every reader follows and every writer records.

A sample's ``boxes`` field is ``[N, 4]`` float32, in the format the user asks the reader for with
``box_format=`` (default ``"xyxy"``, in pixels: what torchvision's detection models take), whatever the
storage holds:

==========  ==========================================  ======================================
format      columns                                     also called
==========  ==========================================  ======================================
xyxy        left, top, right, bottom                    ``ltrb`` (DALI), torchvision's default
xywh        left, top, width, height                    COCO's ``bbox``
cxcywh      centre x, centre y, width, height           YOLO's (relative there)
==========  ==========================================  ======================================

Readers with ``relative=True`` divide x and width by the image's width, y and height by its height. A writer
records the format its boxes are stored in (the converter's manifest ``boxes`` entry, the Object Detection
API's normalized xyxy in a TFRecord), and reading back converts from it, so the same boxes come out. The
ops work on absolute xyxy internally (`ingest.ops.boxes`).

Changing the format is linear and the same for relative and absolute boxes, so it needs no image size;
changing between relative and absolute does, which only readers that know each image's size offer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError

#: The formats, canonical names.
BOX_FORMATS = ("xyxy", "xywh", "cxcywh")
#: Other names taken for them.
ALIASES = {"ltrb": "xyxy"}
#: The format boxes come out in when the user names none.
DEFAULT = "xyxy"


def box_format(name: Any, what: str = "`box_format`") -> str:
    """The canonical name of format ``name`` ('ltrb' -> 'xyxy'); a ConfigError naming the choices."""
    canonical = ALIASES.get(name, name) if isinstance(name, str) else None
    if canonical not in BOX_FORMATS:
        raise ConfigError(f"{what} must be one of {', '.join(BOX_FORMATS)} (or 'ltrb' for xyxy), got {name!r}")
    return canonical


def convert(boxes: Any, src: str, dst: str) -> np.ndarray:
    """``[N, 4]`` boxes in format ``src`` as format ``dst`` (a new float64 array; relative or absolute alike)."""
    b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    src, dst = box_format(src), box_format(dst)
    if src == dst:
        return b
    if src == "xywh":
        b[:, 2:] += b[:, :2]
    elif src == "cxcywh":
        b[:, :2] -= b[:, 2:] / 2
        b[:, 2:] += b[:, :2]
    if dst == "xywh":
        b[:, 2:] -= b[:, :2]
    elif dst == "cxcywh":
        b[:, 2:] -= b[:, :2]
        b[:, :2] += b[:, 2:] / 2
    return b


@dataclass(frozen=True)
class Conversion:
    """Stored boxes (format ``stored``) -> the format asked for (``wanted``), applied to a record's ``boxes``
    by the readers of formats that store them as they are (WebDataset, LMDB, raw): see `convert_record`."""

    stored: str
    wanted: str

    def __call__(self, record: Any) -> Any:
        boxes = record.fields.get("boxes")
        if boxes is not None:
            record.fields["boxes"] = convert(boxes, self.stored, self.wanted).astype(np.float32)
        return record


def convert_record(record: Any, conversion: Conversion | None) -> Any:
    """``record`` with its boxes in the format asked for (as it is without a ``conversion``)."""
    return record if conversion is None else conversion(record)
