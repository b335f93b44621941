"""Geometry ops of detection pipelines: RandomIoUCrop (SSD's crop), ZoomOut (paste onto a larger canvas),
PadTo (pad to a size or a multiple: letterbox, or Detectron's bottom-right padding to a multiple of 32).

Like every geometry op they are per-sample affine maps (:meth:`GeometryOp.steps`), so boxes, masks and
polygon segmentations follow them through :class:`ingest.ops.planner.Plan` (boxes and polygons mapped and
clipped to each op's output, masks warped nearest, an object's fields pruned with its box) and they fuse
with the resizes and flips around them into one warp. COCO's ``area`` is pruned with its box but keeps the
source's value, as in torchvision's ``transforms.v2``: it is the annotation's size that COCOeval buckets
objects by, not the augmented view's (see the planner's docstring).

Resize with ``max_size`` (``Resize(800, max_size=1333)``: shorter side 800 unless the longer would pass 1333)
and Flip (horizontal and vertical) live in :mod:`ingest.ops.geometry`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import ConfigError

try:   # built by setup.py where a C compiler is found: the batch's draws in one call that keeps the GIL
    from . import _boxes as NATIVE
except ImportError:
    NATIVE = None
from .affine import Steps, eye
from .boxes import BoxBatch
from .base import (Images, Rngs, Size, as_list, pad_crop, per_sample, probability, size_array,
                   stack_if_uniform)
from .geometry import GeometryOp, _fill, _positive_int, _range, _size_pair


def _translation(n: int, left: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Matrices of an op whose output pixel (x, y) is input pixel (x + left, y + top)."""
    m = eye(n)
    m[:, 0, 2], m[:, 1, 2] = left, top
    return m


def box_iou(boxes: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Intersection over union of ``boxes`` ``[..., 4]`` with ``other`` ``[..., 4]`` (x0, y0, x1, y1),
    broadcast against each other."""
    w = np.clip(np.minimum(boxes[..., 2], other[..., 2]) - np.maximum(boxes[..., 0], other[..., 0]), 0, None)
    h = np.clip(np.minimum(boxes[..., 3], other[..., 3]) - np.maximum(boxes[..., 1], other[..., 1]), 0, None)
    inter = w * h
    union = ((boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
             + (other[..., 2] - other[..., 0]) * (other[..., 3] - other[..., 1]) - inter)
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def _padded(boxes: BoxBatch) -> tuple[np.ndarray, np.ndarray]:
    """A batch's boxes as one ``(N, max K, 4)`` array and its ``(N, max K)`` validity mask."""
    counts = boxes.counts
    out = np.zeros((len(counts), int(counts.max(initial=0)), 4))
    valid = np.arange(out.shape[1]) < counts[:, None]
    out[valid] = boxes.flat   # row-major order of the mask: sample by sample, box by box
    return out, valid


class RandomIoUCrop(GeometryOp):
    """SSD's random crop whose boxes overlap it enough (torchvision's ``RandomIoUCrop``, DALI's
    ``random_bbox_crop``).

    Per sample: pick a threshold from ``min_ious`` (the default set is SSD's and torchvision's); None keeps the
    image whole, 0 takes any crop holding a box centre. Else try ``attempts`` crops: width and height each a uniform fraction in ``scale`` of the image's, width/height within ``aspect``, at a
    uniform position. A crop qualifies when some box has its centre inside it and, among those, the best IoU
    with the crop is at least the threshold. The first that qualifies is taken (the attempts of a round are
    drawn at once) and keeps only the boxes whose centre it holds. When none does, another threshold is picked, ``rounds`` times at most (torchvision
    loops until one works, which never ends for an image without boxes), then the image stays whole.
    Needs the boxes at draw time (``plan(..., boxes=...)``); without boxes no crop qualifies.
    Params: ``(N, 5)`` int64 (top, left, height, width, cropped).
    """

    uses_boxes = True

    def __init__(self, min_ious: Sequence[float | None] = (None, 0.0, 0.1, 0.3, 0.5, 0.7, 0.9), *,
                 scale: Sequence[float] = (0.3, 1.0), aspect: Sequence[float] = (0.5, 2.0),
                 attempts: int = 40, rounds: int = 10):
        if not (isinstance(min_ious, (tuple, list)) and min_ious and all(
                v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0)
                for v in min_ious)):
            raise ConfigError(f"`min_ious` must be a non-empty sequence of None or numbers in [0, 1], "
                              f"got {min_ious!r}")
        self.min_ious = tuple(None if v is None else float(v) for v in min_ious)
        self.scale = _range("scale", scale, low=0.0)
        if self.scale[1] > 1.0:
            raise ConfigError(f"`scale` must lie in (0, 1], got {scale!r}")
        self.aspect = _range("aspect", aspect, low=0.0)
        self.attempts = _positive_int("attempts", attempts)
        self.rounds = _positive_int("rounds", rounds)

    def draw(self, sizes: Sequence[Size], rngs: Rngs, boxes: Sequence[np.ndarray] | BoxBatch | None = None
             ) -> np.ndarray:
        """Every sample's crop, ``boxes`` per sample (``[K, 4]`` ltrb) or as a :class:`BoxBatch`. One call of
        ``ingest.ops._boxes`` where it was built (each sample's rounds and attempts in order, stopping at the
        first crop that qualifies), else numpy round by round; the same crops either way."""
        rngs = per_sample(rngs, len(sizes))
        hw = size_array(sizes)
        batch = BoxBatch.of([np.zeros((0, 4))] * len(hw) if boxes is None else boxes)
        if len(batch) != len(hw):
            raise ValueError(f"got boxes for {len(batch)} samples, the batch has {len(hw)}")
        # NaN stands for None (no crop)
        choices = np.array([np.nan if t is None else t for t in self.min_ious])
        if NATIVE is not None:
            out = np.empty((len(hw), 5), dtype=np.int64)
            NATIVE.iou_crops(np.ascontiguousarray(rngs.keys), rngs.advance(1), np.ascontiguousarray(hw),
                             np.ascontiguousarray(batch.flat, dtype=np.float64),
                             np.ascontiguousarray(batch.starts, dtype=np.int64), choices, *self.scale, *self.aspect,
                             self.attempts, self.rounds, out)
            return out
        out = np.concatenate([np.zeros_like(hw), hw, np.zeros_like(hw[:, :1])], axis=1)  # whole images
        padded, valid = _padded(batch)
        # A round's draws come from a child stream of its own, taken for the samples still open, so a sample's
        # draws do not depend on which others are.
        rounds = rngs.spawn()
        open_ = np.flatnonzero(valid.any(axis=1))  # samples still looking for a crop (none without boxes)
        for _ in range(self.rounds):
            rng = rounds.spawn().take(open_)
            threshold = choices[rng.integers(0, len(choices))]
            u = rng.random(self.attempts * 4).reshape(-1, self.attempts, 4)
            trying = ~np.isnan(threshold)
            open_, threshold, u = open_[trying], threshold[trying], u[trying]
            if not len(open_):
                break
            top, left, ch, cw = self._attempts(hw[open_], padded[open_], valid[open_], threshold, u)
            found = ch > 0
            out[open_[found]] = np.stack([top, left, ch, cw, np.ones_like(ch)], axis=1)[found]
            open_ = open_[~found]
        return out

    def _attempts(self, hw: np.ndarray, boxes: np.ndarray, valid: np.ndarray, threshold: np.ndarray,
                  u: np.ndarray) -> tuple[np.ndarray, ...]:
        """The first qualifying crop (top, left, height, width) per sample of a round, height 0 where none
        qualifies. ``u``: (S, attempts, 4) uniform numbers; ``boxes`` (S, K, 4), ``valid`` (S, K)."""
        (s0, s1), (a0, a1) = self.scale, self.aspect
        h, w = hw[:, :1], hw[:, 1:]
        cw = (w * (s0 + (s1 - s0) * u[..., 0])).astype(np.int64)
        ch = (h * (s0 + (s1 - s0) * u[..., 1])).astype(np.int64)
        left = ((w - cw) * u[..., 2]).astype(np.int64)
        top = ((h - ch) * u[..., 3]).astype(np.int64)
        shaped = (cw > 0) & (ch > 0) & (a0 * ch <= cw) & (cw <= a1 * ch)
        # Boxes (S, K, 1) against crops (S, 1, A), one coordinate array each (attempts innermost: numpy's fast
        # loop); box_iou's arithmetic, counted only where the crop holds the box's centre.
        x0, y0 = left[:, None].astype(np.float64), top[:, None].astype(np.float64)
        x1, y1 = x0 + cw[:, None], y0 + ch[:, None]
        bx0, by0, bx1, by1 = (boxes[..., k, None] for k in range(4))
        cx, cy = (bx0 + bx1) / 2, (by0 + by1) / 2
        inside = valid[..., None] & (x0 < cx) & (cx < x1) & (y0 < cy) & (cy < y1)  # S, K, A
        inter = (np.clip(np.minimum(bx1, x1) - np.maximum(bx0, x0), 0, None)
                 * np.clip(np.minimum(by1, y1) - np.maximum(by0, y0), 0, None))
        union = (bx1 - bx0) * (by1 - by0) + (cw * ch)[:, None].astype(np.float64) - inter
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = np.where(union > 0, inter / union, 0.0)
        best = np.where(inside, iou, -1.0).max(axis=1, initial=-1.0)  # S, A
        inside = inside.any(axis=1)
        ok = shaped & inside & (best >= threshold[:, None])
        first = ok.argmax(axis=1)
        rows = np.arange(len(hw))
        hit = ok[rows, first]
        return (top[rows, first], left[rows, first], np.where(hit, ch[rows, first], 0), cw[rows, first])

    def _steps(self, sizes: np.ndarray, params: np.ndarray) -> Steps:
        top, left, ch, cw = (params[:, k].astype(np.float64) for k in range(4))
        crop = np.stack([left, top, left + cw, top + ch], axis=1)
        return Steps(_translation(len(sizes), left, top), params[:, 2:4].astype(np.int64), crop,
                     np.zeros(len(sizes), dtype=bool))

    def box_filter(self, boxes: np.ndarray, owner: np.ndarray, params: np.ndarray) -> np.ndarray:
        top, left, ch, cw, cropped = params[owner].T
        cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
        return (cropped == 0) | ((left < cx) & (cx < left + cw) & (top < cy) & (cy < top + ch))

    def _apply_cpu(self, images: Images, params: np.ndarray) -> Images:
        return stack_if_uniform([im[t:t + ch, l:l + cw]
                                 for im, (t, l, ch, cw, _) in zip(as_list(images), params.tolist())])


class ZoomOut(GeometryOp):
    """With probability ``p``, paste the image onto a canvas ``r`` times its size (``r`` uniform in
    ``ratio``) at a uniform position, the rest ``fill`` (torchvision's ``RandomZoomOut``, DALI's ``paste``;
    SSD's expand). Params: ``(N, 4)`` int64 (left, top, canvas height, canvas width)."""

    def __init__(self, ratio: Sequence[float] = (1.0, 4.0), *, fill: float | Sequence[float] = 0, p: float = 0.5):
        self.ratio = _range("ratio", ratio, low=0.0)
        if self.ratio[0] < 1.0:
            raise ConfigError(f"`ratio` must be >= 1 (a canvas at least the image's size), got {ratio!r}")
        self.fill = _fill(fill)
        self.p = probability(p)

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> np.ndarray:
        hw = size_array(sizes)
        u = per_sample(rngs, len(hw)).random(4)  # the coin, the ratio, the position x and y
        r = np.where(u[:, 0] < self.p, self.ratio[0] + u[:, 1] * (self.ratio[1] - self.ratio[0]), 1.0)
        ch, cw = (hw[:, 0] * r).astype(np.int64), (hw[:, 1] * r).astype(np.int64)
        left, top = ((cw - hw[:, 1]) * u[:, 2]).astype(np.int64), ((ch - hw[:, 0]) * u[:, 3]).astype(np.int64)
        return np.stack([left, top, ch, cw], axis=1)

    def _steps(self, sizes: np.ndarray, params: np.ndarray) -> Steps:
        left, top = -params[:, 0].astype(np.float64), -params[:, 1].astype(np.float64)
        out = params[:, 2:4].astype(np.int64)
        crop = np.stack([left, top, left + out[:, 1], top + out[:, 0]], axis=1)
        return Steps(_translation(len(sizes), left, top), out, crop, np.zeros(len(sizes), dtype=bool))

    def _apply_cpu(self, images: Images, params: np.ndarray) -> Images:
        return stack_if_uniform([pad_crop(im, -t, -l, ch, cw, self.fill)
                                 for im, (l, t, ch, cw) in zip(as_list(images), params.tolist())])


class PadTo(GeometryOp):
    """Pad each image (never crop) to at least ``size`` = int or (height, width), then up to a ``multiple``
    of its height and width, with ``fill``: at the bottom and right (Detectron's ``size_divisibility``,
    ``PadTo(multiple=32)``), or around the centre with ``center=True`` (a letterbox:
    ``[Resize(longer=640), PadTo(640, center=True)]``). ``batch=True`` pads every image to the batch's
    largest first, so the batch comes out as one ``[N, C, H, W]`` tensor (torchvision's ``ImageList``,
    Detectron's ``ImageList.from_tensors``); the loader's dict output then carries each image's size
    before the padding as ``image_sizes`` (``[N, 2]`` height, width)."""

    pads = True

    def __init__(self, size: int | Sequence[int] | None = None, *, multiple: int | None = None,
                 fill: float | Sequence[float] = 0, center: bool = False, batch: bool = False):
        if size is None and multiple is None and not batch:
            raise ConfigError("PadTo needs `size`, `multiple`, `batch=True` or a combination")
        self.size = None if size is None else _size_pair("size", size)
        self.multiple = None if multiple is None else _positive_int("multiple", multiple)
        self.fill = _fill(fill)
        self.center = bool(center)
        self.batch = bool(batch)

    def _padded(self, sizes: np.ndarray) -> np.ndarray:
        out = sizes.copy()
        if self.batch and len(out):
            out[:] = out.max(axis=0)
        if self.size is not None:
            out = np.maximum(out, np.array(self.size, dtype=np.int64))
        if self.multiple is not None:
            out = -(-out // self.multiple) * self.multiple
        return out

    def _steps(self, sizes: np.ndarray, params: Any) -> Steps:
        out = self._padded(sizes)
        before = (out - sizes) // 2 if self.center else np.zeros_like(sizes)
        top, left = -before[:, 0].astype(np.float64), -before[:, 1].astype(np.float64)
        crop = np.stack([left, top, left + out[:, 1], top + out[:, 0]], axis=1)
        return Steps(_translation(len(sizes), left, top), out, crop, np.zeros(len(sizes), dtype=bool))

    def _apply_cpu(self, images: Images, params: Any) -> Images:
        ims = as_list(images)
        st = self._steps(np.array([im.shape[:2] for im in ims], dtype=np.int64).reshape(-1, 2), params)
        return stack_if_uniform([pad_crop(im, int(m[1, 2]), int(m[0, 2]), int(h), int(w), self.fill)
                                 for im, m, (h, w) in zip(ims, st.matrix, st.out_sizes)])
