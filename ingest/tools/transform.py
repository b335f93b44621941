"""Optional per-sample re-encoding for `ingest convert`: ``max_side`` / ``quality`` (JPEG out) and
``raw_size`` (decoded pixels out, for raw shards). Only the ``image`` field is transformed; other fields pass
through as they are.

- ``max_side=S``: an image whose longer side exceeds S is decoded (EXIF orientation applied), resized with
  antialiasing so that its longer side is S (aspect kept, ingest's `Resize(longer=S)`) and re-encoded as JPEG;
  smaller images keep their bytes unless ``quality`` is given.
- ``quality=Q``: every image is re-encoded as JPEG at quality Q (4:2:0); with ``max_side`` it sets the
  quality of the resized ones (default 90).
- ``raw_size=(H, W)``: every image is decoded and resized to exactly H x W: the field becomes ``pixels``
  (uint8 [H, W, 3]), what raw shards hold so that training skips decoding.

All of it is deterministic (libjpeg-turbo via simplejpeg, torch's CPU resize), so a conversion gives the same
bytes on any machine with the same library versions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simplejpeg
import torch

from ..errors import ConfigError, DecodeError
from ..formats.base import Field, Record
from ..ops.decode import CpuDecoder
from ..ops.geometry import Resize, resize_image

#: JPEG quality used for resized images when ``quality`` is not given.
DEFAULT_QUALITY = 90


@dataclass(frozen=True)
class Transform:
    """What to do to each sample's image on the way through the converter (nothing by default)."""

    max_side: int | None = None
    quality: int | None = None
    raw_size: tuple[int, int] | None = None

    def __post_init__(self):
        if self.max_side is not None and (isinstance(self.max_side, bool) or self.max_side < 1):
            raise ConfigError(f"`max_side` must be >= 1, got {self.max_side}")
        if self.quality is not None and not 1 <= self.quality <= 100:
            raise ConfigError(f"`quality` must be in 1..100, got {self.quality}")
        if self.raw_size is not None:
            if len(self.raw_size) != 2 or min(self.raw_size) < 1:
                raise ConfigError(f"`raw_size` must be (height, width) >= 1, got {self.raw_size}")
            if self.max_side is not None or self.quality is not None:
                raise ConfigError("`raw_size` writes decoded pixels; it cannot be combined with "
                                  "`max_side` or `quality`, which re-encode JPEG")

    @property
    def active(self) -> bool:
        return self.max_side is not None or self.quality is not None or self.raw_size is not None

    def fields(self, fields: dict[str, Field]) -> dict[str, Field]:
        """The fields a source with ``fields`` has after this transform."""
        if not self.active:
            return dict(fields)
        if "image" not in fields:
            raise ConfigError("resizing or re-encoding needs an 'image' field; the source has "
                              f"{', '.join(fields) or 'none'}")
        out = dict(fields)
        if self.raw_size is not None:
            out["image"] = Field("pixels", (*self.raw_size, 3), "uint8")
        else:
            out["image"] = Field("image")
        return out

    def apply(self, record: Record, name: str, decoder: CpuDecoder) -> Record:
        """The record with its image transformed. Raises DecodeError naming ``name``."""
        if not self.active:
            return record
        image = record.image
        if isinstance(image, np.ndarray) and image.ndim == 3:   # decoded pixels (Caffe raw Datum, raw shards)
            pixels = _rgb(image, name)
        elif self.max_side is not None and self.quality is None:
            height, width = decoder.probe(image, name)
            if max(height, width) <= self.max_side:
                return record
            pixels = decoder.decode(image, name)
        else:
            pixels = decoder.decode(image, name)
        if self.raw_size is not None:
            out = _resize(pixels, tuple(self.raw_size))
        else:
            if self.max_side is not None and max(pixels.shape[:2]) > self.max_side:
                pixels = _resize(pixels, Resize(longer=self.max_side).output_size(*pixels.shape[:2]))
            out = simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=self.quality or DEFAULT_QUALITY,
                                         colorspace="RGB", colorsubsampling="420")
        return Record(out, record.label, dict(record.fields))


def _rgb(pixels: np.ndarray, name: str) -> np.ndarray:
    if pixels.dtype != np.uint8 or pixels.shape[2] not in (1, 3):
        raise DecodeError(f"pixels of shape {pixels.shape} and dtype {pixels.dtype} are not uint8 gray or RGB",
                          path=name)
    return np.repeat(pixels, 3, axis=2) if pixels.shape[2] == 1 else pixels


def _resize(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    out = resize_image(torch.from_numpy(np.ascontiguousarray(pixels)), size, "bilinear", True)
    return np.ascontiguousarray(out.numpy())
