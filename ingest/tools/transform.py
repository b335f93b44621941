"""Optional per-sample re-encoding for `ingest convert`: ``max_side`` / ``quality`` (JPEG out) and
``raw_size`` (decoded pixels out, for raw shards). The ``image`` field is transformed, and the annotations
that are in its pixels follow it (below); other fields pass through as they are.

- ``max_side=S``: an image whose longer side exceeds S is decoded (EXIF orientation applied), resized with
  antialiasing so that its longer side is S (aspect kept, ingest's `Resize(longer=S)`) and re-encoded as JPEG;
  smaller images keep their bytes unless ``quality`` is given.
- ``quality=Q``: every image is re-encoded as JPEG at quality Q (4:2:0); with ``max_side`` it sets the
  quality of the resized ones (default 90).
- ``raw_size=(H, W)``: every image is decoded and resized to exactly H x W: the field becomes ``pixels``
  (uint8 [H, W, 3]), what raw shards hold so that training skips decoding.

**Annotations follow the pixels.** When an image changes size, the detection fields the COCO reader gives
(by name) are moved with it, by sx = new width / old width and sy = new height / old height: ``boxes``
(absolute ones, any box format; relative ones stay), ``area`` (times sx * sy), ``polygons`` (vertices scaled
and parts clipped to the image, relative ones staying relative; RLE entries resized nearest and encoded
again) and ``masks`` (resized nearest); so is every field of kind ``mask`` (a segmentation label map,
decoded, resized nearest and handed to the writer as its ``[H, W]`` values). Masks and polygons go through the Loader's own ``Resize`` code, so
reading the packed data gives what reading the source through ``Resize`` gives. The old size is the decoded one,
EXIF orientation applied: annotations are read in the displayed frame, as the Loader reads them (see the
coco module), and a re-encoded image carries no orientation tag, so they stay in it.

All of it is deterministic (libjpeg-turbo via simplejpeg, torch's CPU resize), so a conversion gives the same
bytes on any machine with the same library versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import simplejpeg
import torch

from ..errors import ConfigError, CorruptRecordError, DecodeError
from ..formats.base import Field, Record
from ..ops import planner
from ..decode.cpu import CpuDecoder
from ..decode.masks import decode_mask
from ..ops.geometry import Resize, resize_image

#: JPEG quality used for resized images when ``quality`` is not given.
DEFAULT_QUALITY = 90


@dataclass(frozen=True)
class Transform:
    """What to do to each sample's image on the way through the converter (nothing by default)."""

    max_side: int | None = None
    quality: int | None = None
    raw_size: tuple[int, int] | None = None
    relative: bool = False   # the source's boxes and polygons are relative to the image size (they stay)
    masks: tuple[str, ...] = ()   # the fields of kind mask (segmentation label maps)

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
        before = pixels.shape[:2]
        if self.raw_size is not None:
            out = pixels = _resize(pixels, tuple(self.raw_size))
        else:
            if self.max_side is not None and max(pixels.shape[:2]) > self.max_side:
                pixels = _resize(pixels, Resize(longer=self.max_side).output_size(*pixels.shape[:2]))
            out = simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=self.quality or DEFAULT_QUALITY,
                                         colorspace="RGB", colorsubsampling="420")
        fields = dict(record.fields)
        if pixels.shape[:2] != before:
            fields = resized_targets(fields, before, pixels.shape[:2], relative=self.relative, name=name,
                                     masks=self.masks)
        return Record(out, record.label, fields)


def resized_targets(fields: dict[str, Any], before: tuple[int, int], after: tuple[int, int], *,
                    relative: bool = False, name: str = "", masks: tuple[str, ...] = ()) -> dict[str, Any]:
    """The detection fields of an image resized from ``before`` to ``after`` (height, width) moved with it
    (module docstring), and the ``masks`` fields (kind mask) decoded and resized nearest, as decoded
    ``[H, W]`` arrays (writers store them as PNGs of their values); other fields as they are. A mask or RLE
    not of the ``before`` size, or a malformed field, raises CorruptRecordError naming ``name``."""
    sx, sy = after[1] / before[1], after[0] / before[0]
    out = dict(fields)
    try:
        if masks:
            resize = planner.plan([Resize(tuple(after))], [tuple(before)])
            for key in masks:
                values = decode_mask(out[key], name)
                if values.shape != tuple(before):
                    raise ValueError(f"mask {key!r} of {values.shape[1]}x{values.shape[0]} does not fit the image "
                                     f"of {before[1]}x{before[0]}")
                out[key] = resize.warp_masks([values[None]])[0][0].numpy()
        if "boxes" in out and not relative:
            out["boxes"] = _scaled(out["boxes"], [sx, sy, sx, sy], (-1, 4))
        if "area" in out:
            out["area"] = _scaled(out["area"], sx * sy, (-1,))
        if "masks" not in out and "polygons" not in out:
            return out
        resize = planner.plan([Resize(tuple(after))], [tuple(before)])
        if "masks" in out:
            masks = np.asarray(out["masks"])
            if masks.ndim != 3 or masks.shape[1:] != tuple(before):
                raise ValueError(f"masks of shape {masks.shape} do not fit the image of {before[0]}x{before[1]}")
            out["masks"] = resize.warp_masks([masks])[0].numpy()
        if "polygons" in out:   # as the Loader moves them through a Resize
            value = out["polygons"]
            if relative:
                value = planner.scale_polygons(value, before[1], before[0])
            value = resize.targets([{"polygons": value}])[0]["polygons"]
            if relative:
                value = planner.scale_polygons(value, 1 / after[1], 1 / after[0])
            out["polygons"] = value
    except ValueError as err:
        raise CorruptRecordError(str(err), path=name) from err
    return out


def _scaled(values: Any, scale: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``values`` times ``scale``, in their float dtype (float32 for others)."""
    a = np.asarray(values)
    dtype = a.dtype if np.issubdtype(a.dtype, np.floating) else np.float32
    return (a.astype(np.float64).reshape(shape) * scale).astype(dtype)


def _rgb(pixels: np.ndarray, name: str) -> np.ndarray:
    if pixels.dtype != np.uint8 or pixels.shape[2] not in (1, 3):
        raise DecodeError(f"pixels of shape {pixels.shape} and dtype {pixels.dtype} are not uint8 gray or RGB",
                          path=name)
    return np.repeat(pixels, 3, axis=2) if pixels.shape[2] == 1 else pixels


def _resize(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    out = resize_image(torch.from_numpy(np.ascontiguousarray(pixels)), size, "bilinear", True)
    return np.ascontiguousarray(out.numpy())
