"""The map algebra that images, boxes and masks share.

Coordinates are continuous pixel coordinates: pixel (row i, column j) covers ``[j, j+1) x [i, i+1)``, its
centre is ``(j + 0.5, i + 0.5)``; boxes are ``(x0, y0, x1, y1)`` (ltrb) in the same coordinates, as COCO's and
torchvision's absolute XYXY boxes are. A geometry op on a batch is :class:`Steps`: per sample, a 3x3 matrix
mapping a point of the op's OUTPUT to the point of its INPUT it samples, ``[x_in, y_in, 1]^T = M @ [x_out,
y_out, 1]^T``, plus its output size and what its resample needs. Images are resampled *backwards* through
the matrix (:class:`Warp`, executed by :mod:`ingest.ops.resample`); boxes are mapped *forwards* through its
inverse (:func:`map_boxes`); polygon vertices go the same way (:func:`map_points`) and are clipped to each op's
output (:func:`clip_polygons`).

:func:`compose` turns a run of Steps into one :class:`Warp`; :meth:`Warp.shifted` and :meth:`Warp.rescaled`
fit it to what a decoder actually returned (a region of interest, a DCT-downscaled image).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple, Sequence

import numpy as np

from .._numpy import columns, zeros
from .base import Size, size_array, size_list

try:   # built by setup.py where a C compiler is found (map_boxes_kept)
    from . import _boxes
except ImportError:
    _boxes = None


class Steps(NamedTuple):
    """One geometry op on a batch of N samples, as arrays."""

    matrix: np.ndarray              # (N, 3, 3) float64, output coords -> input coords
    out_sizes: np.ndarray           # (N, 2) int64 (height, width)
    crop: np.ndarray | None         # (N, 4) float64 x0 y0 x1 y1 in input coords the op reads, or None: all
    resamples: np.ndarray           # (N,) bool: the op interpolates (resize, rotate), not only moves pixels
    interpolation: str = "nearest"  # the resampling op's filter ...
    antialias: bool = False
    fill: tuple[float, ...] | None = None  # ... and the colour of pixels from outside the input (pixel units)


def eye(n: int) -> np.ndarray:
    """``n`` identity matrices, (n, 3, 3) (zeroed and set column by column: see ingest._numpy)."""
    m = zeros((n, 3, 3), np.float64)
    for k in range(3):
        m[:, k, k] = 1.0
    return m


def bounds(m: np.ndarray, region: np.ndarray) -> np.ndarray:
    """Bounding boxes (N, 4) of the rectangles ``region`` (N, 4) mapped by ``m`` (N, 3, 3): all four corners
    mapped, then their min and max. Corner by corner on (N,) arrays: numpy lets the GIL go on arrays of more
    than 500 elements, and a batch's (N, 4) ones would be (see `ingest.random`)."""
    x0, y0, x1, y1 = region[:, 0], region[:, 1], region[:, 2], region[:, 3]
    out = np.empty((len(m), 4))
    for axis in (0, 1):
        a, b, c = m[:, axis, 0], m[:, axis, 1], m[:, axis, 2]
        p = [a * x + b * y + c for x, y in ((x0, y0), (x1, y0), (x1, y1), (x0, y1))]
        out[:, axis] = np.minimum(np.minimum(np.minimum(p[0], p[1]), p[2]), p[3])
        out[:, axis + 2] = np.maximum(np.maximum(np.maximum(p[0], p[1]), p[2]), p[3])
    return out


def map_boxes(steps: Steps, boxes: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Boxes ``[M, 4]`` of a batch (box m belongs to sample ``owner[m]``), in the op's input coords, in its
    output coords: the four corners through the inverse map, their bounding box, clipped to the output
    image. Boxes wholly outside come out empty (zero width or height); :func:`nonempty` finds them."""
    out = bounds(np.linalg.inv(steps.matrix)[owner], boxes)
    hw = steps.out_sizes[owner].astype(np.float64)
    np.clip(out[:, 0::2], 0.0, hw[:, 1:], out=out[:, 0::2])
    np.clip(out[:, 1::2], 0.0, hw[:, :1], out=out[:, 1::2])
    return out


def map_boxes_kept(steps: Steps, boxes: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`map_boxes` and :func:`nonempty` of its result, in one call of ``ingest.ops._boxes`` where it was
    built (the same operations box by box, holding the GIL), else in numpy."""
    if _boxes is None:
        out = map_boxes(steps, boxes, owner)
        return out, nonempty(out)
    out, kept = np.empty((len(boxes), 4)), np.empty(len(boxes), dtype=bool)
    _boxes.map_boxes(np.ascontiguousarray(boxes, dtype=np.float64), np.ascontiguousarray(owner, dtype=np.int64),
                     np.ascontiguousarray(np.linalg.inv(steps.matrix)),
                     np.ascontiguousarray(steps.out_sizes, dtype=np.int64), out, kept)
    return out, kept


def map_points(steps: Steps, points: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Points ``[M, 2]`` (x, y) of a batch (point m belongs to sample ``owner[m]``), in the op's input coords,
    in its output coords: through the inverse map, as box corners go."""
    a = np.linalg.inv(steps.matrix)[owner]
    x, y = points[:, 0], points[:, 1]
    return np.stack([a[:, 0, 0] * x + a[:, 0, 1] * y + a[:, 0, 2], a[:, 1, 0] * x + a[:, 1, 1] * y + a[:, 1, 2]], 1)


#: Polygon parts whose area is at most this (square pixels) are degenerate: a line or a point after clipping.
MIN_POLYGON_AREA = 1e-9


def clip_polygons(points: np.ndarray, part: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Polygons clipped to their images: Sutherland-Hodgman against the four sides of ``[0, W] x [0, H]``,
    all parts at once. ``points`` ``[M, 2]`` are the vertices of every part in order, ``part[m]`` the part of
    vertex m (equal values contiguous), ``sizes`` ``[M, 2]`` the (height, width) to clip vertex m's part to.
    Returns the clipped vertices and their parts; a part wholly outside has none left. A clipped polygon
    that is not convex may keep zero-width slivers along the border (Sutherland-Hodgman's known artefact),
    which cover no area."""
    for axis, side in ((0, 0), (0, 1), (1, 0), (1, 1)):
        limit = sizes[:, 1 - axis].astype(np.float64)
        d = -points[:, axis] if side == 0 else points[:, axis] - limit   # inside where d <= 0
        points, part, sizes = _clip_half_plane(points, part, sizes, d)
    return points, part


def _previous(part: np.ndarray) -> np.ndarray:
    """Index of each vertex's predecessor in its part (the first vertex's is the part's last)."""
    n = len(part)
    first = np.flatnonzero(np.r_[True, part[1:] != part[:-1]]) if n else np.zeros(0, dtype=np.int64)
    prev = np.arange(n) - 1
    prev[first] = np.r_[first[1:], n] - 1
    return prev


def _clip_half_plane(points: np.ndarray, part: np.ndarray, extra: np.ndarray,
                     d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One Sutherland-Hodgman pass: the parts clipped to where ``d`` (a signed distance, affine in the
    vertex) is <= 0. For each edge (previous vertex -> vertex): the crossing point if it crosses, then the
    vertex if it is inside. ``extra`` rows follow their vertex."""
    inside = d <= 0
    if inside.all():   # the common case: nothing on the far side (also every empty batch)
        return points, part, extra
    prev = _previous(part)
    cross = inside != inside[prev]
    dp = d[prev]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(cross, dp / np.where(cross, dp - d, 1.0), 0.0)
    crossing = points[prev] + t[:, None] * (points - points[prev])
    emit = np.stack([cross, inside], 1)                      # per vertex: (crossing point, vertex)
    rows = np.repeat(np.arange(len(points)), emit.sum(1))
    return np.stack([crossing, points], 1)[emit], part[rows], extra[rows]


def polygon_parts_kept(points: np.ndarray, part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The vertices of the parts that are still polygons: consecutive repeated vertices removed (clipping
    makes them where a vertex lies on a side), then parts of fewer than 3 vertices or of area at most
    `MIN_POLYGON_AREA` dropped. Returns (points, part)."""
    if not len(points):
        return points, part
    same = (points == points[_previous(part)]).all(1)
    points, part = points[~same], part[~same]
    if not len(points):
        return points, part
    prev = _previous(part)
    cross = points[prev, 0] * points[:, 1] - points[:, 0] * points[prev, 1]   # shoelace terms
    ids, index, count = np.unique(part, return_inverse=True, return_counts=True)
    area = np.abs(np.bincount(index, weights=cross, minlength=len(ids))) / 2
    good = (count >= 3) & (area > MIN_POLYGON_AREA)
    keep = good[index]
    return points[keep], part[keep]


def pads(steps: Steps, sizes: np.ndarray) -> bool:
    """Whether the op ``steps`` (on inputs of ``sizes``, ``(N, 2)`` height, width) puts fill into its output for
    some sample: its output rectangle, mapped to its input, reaches past the input, or past the region it reads
    (``crop``) where it has one. A crop larger than the image, a pad, a canvas, a rotation or shear that moves a
    corner do; a crop inside the image, a resize and a flip do not. The corners decide it exactly (the input
    region is an axis-aligned rectangle), to a millionth of a pixel of rounding."""
    if not len(sizes):
        return False
    reach = bounds(steps.matrix, columns(0.0, 0.0, steps.out_sizes[:, 1], steps.out_sizes[:, 0]))
    limit = columns(0.0, 0.0, sizes[:, 1], sizes[:, 0])
    if steps.crop is not None:
        for c in range(2):
            limit[:, c] = np.maximum(limit[:, c], steps.crop[:, c])
            limit[:, c + 2] = np.minimum(limit[:, c + 2], steps.crop[:, c + 2])
    eps = 1e-6
    return bool((reach[:, 0] < limit[:, 0] - eps).any() or (reach[:, 1] < limit[:, 1] - eps).any()
                or (reach[:, 2] > limit[:, 2] + eps).any() or (reach[:, 3] > limit[:, 3] + eps).any())


def same_fill(a: Sequence[float] | None, b: Sequence[float] | None) -> bool:
    """Whether two fills (one value or one per channel; None: none) paint the same colour: one value stands for
    itself on every channel."""
    if a is None or b is None:
        return a is None and b is None
    a, b = tuple(map(float, a)), tuple(map(float, b))
    if len(a) != len(b) and 1 in (len(a), len(b)):
        a, b = (a * len(b), b) if len(a) == 1 else (a, b * len(a))
    return a == b


def fill_apart(run: Sequence[Steps], sizes: np.ndarray, steps: Steps) -> bool:
    """Whether the op ``steps`` must start a warp of its own after the run of ops ``run`` (the first on inputs of
    ``sizes``): it has a fill other than the run's (:func:`compose`'s, the last that an op of it has), and an op
    of the run has put fill into this batch (:func:`pads`), pixels one warp would paint with the new fill. Ops
    without a fill, and ops of the run's fill, always join, and so does any op after a run without a fill (an op
    has a fill where it can put pixels from outside its input: `GeometryOp`)."""
    if steps.fill is None:
        return False
    fill = next((st.fill for st in reversed(run) if st.fill is not None), None)
    if fill is None or same_fill(fill, steps.fill):
        return False
    for st in run:
        if pads(st, sizes):
            return True
        sizes = st.out_sizes
    return False


def nonempty(boxes: np.ndarray, min_size: float = 0.0) -> np.ndarray:
    """Which boxes ``[K, 4]`` have width and height above zero and at least ``min_size``."""
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    return (w > 0) & (h > 0) & (w >= min_size) & (h >= min_size)


@dataclass
class Warp:
    """A run of geometry ops on a batch, composed: what one batched resample must do.

    ``matrix[n]`` maps output coords of sample n to coords of the *source* image (what the decoder gave).
    ``box[n]`` = (x0, y0, x1, y1): the source region the resample may read; the filter window is clamped to
    it and points outside it take ``fill`` (this is what makes "crop, then resize" read only the crop, as
    torchvision does, while "resize, then crop" reads the whole resized image).
    """

    matrix: np.ndarray                 # (N, 3, 3) float64
    out_sizes: list[Size]
    box: np.ndarray                    # (N, 4) float64, x0 y0 x1 y1 in source coords
    interpolation: str = "bilinear"    # "nearest" | "bilinear" | "bicubic"
    antialias: bool = True
    fill: tuple[float, ...] = (0.0, 0.0, 0.0)
    source_sizes: list[Size] = field(default_factory=list)
    # (N, 4) in source coords: the part of ``box`` that every op of the run reads from its input (a crop, then
    # a pad: the padding maps past the crop, where the source still has pixels). None: ``box``.
    valid: np.ndarray | None = None
    # (N, 4) in source coords, for images: the source pixels the last resampling op's input holds (what the ops
    # before it kept: a crop, then a pad, then a resize reads fill past the crop; the whole source if no op
    # resamples), and the region its output points must map into (what the ops after it read: a crop, then a
    # pad; all of them if none resamples). None: the whole source, unbounded.
    readable: np.ndarray | None = None
    inside: np.ndarray | None = None

    def shifted(self, origins: Sequence[tuple[int, int]]) -> "Warp":
        """The same warp for sources cropped at ``origins`` = (x0, y0) per sample (region-of-interest decode)."""
        o = np.asarray(origins, dtype=np.float64).reshape(-1, 2)
        m = self.matrix.copy()
        m[:, :2, 2] -= o
        return replace(self, matrix=m, box=self.box - np.tile(o, 2),
                       **self._regions(lambda r: r - np.tile(o, 2)))

    def _regions(self, f) -> dict:
        """``f`` of each optional region that is set (for `replace`)."""
        return {k: None if getattr(self, k) is None else f(getattr(self, k)) for k in _REGIONS}

    def roi(self) -> list[tuple[int, int, int, int]]:
        """Integer source regions (x0, y0, x1, y1) that hold every pixel the resample can read."""
        return [tuple(r) for r in self.regions().tolist()]

    def regions(self) -> np.ndarray:
        """:meth:`roi` as an ``[N, 4]`` int64 array."""
        hw = size_array(self.source_sizes)
        lo = np.maximum(np.floor(self.box[:, :2]).astype(np.int64), 0)
        hi = np.minimum(np.ceil(self.box[:, 2:]).astype(np.int64), hw[:, ::-1])
        return np.concatenate([lo, hi], axis=1)

    def rescaled(self, sizes: Sequence[Size], scales: float | Sequence[float] | None = None) -> "Warp":
        """This warp for sources that arrived at ``sizes`` rather than ``source_sizes`` (decoder downscaling).

        A source pixel coordinate x becomes ``x * s``: the matrices are pre-multiplied by ``diag(sx, sy, 1)``
        and the box scaled the same way. ``scales`` (one factor, or one per sample, decoded/probed) says what
        the decoder did; left out, it is inferred from the sizes (k/8 when they match a JPEG DCT scaling
        exactly, which rounds the size up).
        """
        arrived = size_array(sizes)
        if scales is None:
            s = _dct_scale(size_array(self.source_sizes), arrived)
        else:
            s = np.repeat(np.broadcast_to(np.asarray(scales, dtype=np.float64), (len(arrived),))[:, None], 2, 1)
        m = self.matrix.copy()
        m[:, 0, :] *= s[:, :1]
        m[:, 1, :] *= s[:, 1:]
        both = np.concatenate([s, s], axis=1)
        return replace(self, matrix=m, box=self.box * both, source_sizes=size_list(arrived),
                       **self._regions(lambda r: r * both))

    def for_masks(self, fill: Sequence[float] = (0.0,)) -> "Warp":
        """The same map for label masks: nearest sampling (whole labels, no blending), ``fill`` (per channel:
        a uint16 mask warps as two uint8 channels, its fill's low and high bytes) wherever an op of the run
        has no input pixel (``valid``)."""
        return replace(self, interpolation="nearest", antialias=False, fill=tuple(float(v) for v in fill),
                       box=self.box if self.valid is None else self.valid, readable=None, inside=None)

    def take(self, indices: Sequence[int]) -> "Warp":
        """The maps of samples ``indices`` (repeats allowed: one entry per mask of a sample)."""
        idx = np.asarray(indices, dtype=np.int64)
        return replace(self, matrix=self.matrix[idx], box=self.box[idx],
                       **self._regions(lambda r: r[idx]),
                       out_sizes=size_list(size_array(self.out_sizes)[idx]),
                       source_sizes=size_list(size_array(self.source_sizes)[idx]))


#: The optional per-sample regions of a Warp, in source coords (moved and scaled with its box).
_REGIONS = ("valid", "readable", "inside")


def _dct_scale(probed: np.ndarray, arrived: np.ndarray) -> np.ndarray:
    """Per sample (sx, sy): k/8 where a JPEG decoder scaling by k/8 gives exactly ``arrived``, else the
    plain size ratio per axis."""
    ratio = (arrived / np.maximum(probed, 1))[:, ::-1].astype(np.float64)
    for k in range(1, 9):
        exact = (np.ceil(probed * k / 8 - 1e-9) == arrived).all(axis=1)
        ratio[exact] = k / 8
    return ratio


def compose(steps: Sequence[Steps], sizes: Sequence[Size]) -> Warp:
    """One Warp for a run of ops, given as their ``steps`` in order, on sources of ``sizes``.

    The box is the input region of the last op that resamples (its crop, if it has one, else its whole
    input) mapped to source coordinates; the whole source if no op resamples. It may reach past the source
    (a crop larger than the image, a paste onto a canvas): taps there read ``fill``, as the padded pixels
    they stand for. Interpolation and antialias come from that op ("nearest" if none: the warp then only
    moves whole pixels); fill from the last op that has one, so every pixel without a source takes that one colour:
    :func:`~ingest.ops.planner.plan` ends a run before an op of another fill once an op of it has padded
    (:func:`pads`). ``readable`` and ``inside`` bound what that op's input holds and where its output is read (see
    `Warp`): the ops that only move pixels, before and after it.

    Built from (N,) columns and `stacked_matmul`, so that no numpy call works on more than 500 elements at a
    batch size up to 500 (see `bounds`).
    """
    src = size_array(sizes)
    n = len(src)
    box = columns(0.0, 0.0, src[:, 1], src[:, 0])
    valid, readable = box.copy(), box.copy()
    inside = columns(-np.inf, -np.inf, np.inf, np.inf, n=n)   # no bound until an op after the last resample
    m, cur = eye(n), src
    resampler, fill = None, None
    for k, st in enumerate(steps):
        if k:   # what this op reads: its input (and its crop), in source coords
            regions = [columns(0.0, 0.0, cur[:, 1], cur[:, 0])] + ([st.crop] if st.crop is not None else [])
        else:
            regions = [st.crop] if st.crop is not None else []
        for region in regions:
            mapped = bounds(m, region) if k else region
            for c in range(2):
                for r in (valid, inside):
                    r[:, c] = np.maximum(r[:, c], mapped[:, c])
                    r[:, c + 2] = np.minimum(r[:, c + 2], mapped[:, c + 2])
        if st.resamples.any():
            region = st.crop if st.crop is not None else columns(0.0, 0.0, cur[:, 1], cur[:, 0])
            mapped = bounds(m, region)
            for c in range(4):
                box[:, c] = np.where(st.resamples, mapped[:, c], box[:, c])
                readable[:, c] = np.where(st.resamples, valid[:, c], readable[:, c])
                inside[:, c] = np.where(st.resamples, np.inf if c >= 2 else -np.inf, inside[:, c])
            resampler = st
        if st.fill is not None:
            fill = st.fill
        m = st.matrix if k == 0 else stacked_matmul(m, st.matrix)   # the identity times it, exactly
        cur = st.out_sizes
    return Warp(m, size_list(cur), box,
                interpolation=resampler.interpolation if resampler else "nearest",
                antialias=resampler.antialias if resampler else False,
                fill=fill if fill is not None else (0.0,),
                source_sizes=size_list(src), valid=valid,
                readable=readable, inside=inside)


#: Matrices per `stacked_matmul` call: numpy lets the GIL go on a product of more than 500 output elements.
_MATMUL_CHUNK = 500 // 9


def stacked_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for two (N, 3, 3) stacks, ``_MATMUL_CHUNK`` matrices per numpy call: the same products (each
    matrix goes through the same numpy kernel either way; tested), without giving the GIL up."""
    if len(a) <= _MATMUL_CHUNK or a.shape != b.shape:
        return a @ b
    out = np.empty((len(a), 3, 3))
    for lo in range(0, len(a), _MATMUL_CHUNK):
        out[lo:lo + _MATMUL_CHUNK] = a[lo:lo + _MATMUL_CHUNK] @ b[lo:lo + _MATMUL_CHUNK]
    return out


def identity(sizes: Sequence[Size]) -> Warp:
    """The warp that copies each image as it is (to run only an epilogue)."""
    hw = np.asarray(sizes, dtype=np.float64).reshape(-1, 2)
    box = columns(0.0, 0.0, hw[:, 1], hw[:, 0])
    return Warp(eye(len(hw)), size_list(sizes), box, "nearest", False, (0.0,), size_list(sizes))
