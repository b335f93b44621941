"""Geometry ops: Resize, CenterCrop, RandomResizedCrop, Flip (HorizontalFlip, VerticalFlip), Rotate.

Each op is an affine map per sample from its output to its input, given for a whole batch by
:meth:`GeometryOp.steps` (:class:`ingest.ops.affine.Steps`); boxes and masks follow it through that map.
On CPU, ``apply`` runs the op eagerly with torch's own kernels, so results match
``torchvision.transforms.v2.functional``: crop = slicing (a view, no copy), resize = ``interpolate`` on the
uint8 image seen as a channels-last NCHW tensor (torch's fast uint8 path), flip = ``flip``, rotate =
``grid_sample`` with torchvision's fill rule.
On CUDA, ``apply`` composes the op into a :class:`~ingest.ops.affine.Warp` and runs the batched resample.

Interpolation names: ``"bilinear"``, ``"bicubic"`` and ``"nearest"``. ``"nearest"`` takes the pixel that
contains the mapped pixel centre: torchvision's ``NEAREST_EXACT`` (and PIL's, OpenCV's ``INTER_NEAREST_EXACT``).
torchvision's legacy ``NEAREST`` (``floor(i * scale)``) shifts the image by up to half an input pixel and is no
affine sampling rule, so it is not offered.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .. import random
from ..errors import ConfigError
from . import resample
from .._numpy import columns, copy, zeros
from .affine import Steps, compose, eye
from .base import (Images, Op, Rngs, Size, as_list, fill_for, fill_levels, pad_crop, per_sample, probability,
                   size_array, size_list, sizes_of, stack_if_uniform)

INTERPOLATIONS = ("bicubic", "bilinear", "nearest")
_TORCH_MODE = {"nearest": "nearest-exact", "bilinear": "bilinear", "bicubic": "bicubic"}


# --------------------------------------------------------------------------------------------------
# Config checks shared by the ops of this module.

def _interpolation(value: Any) -> str:
    if value not in INTERPOLATIONS:
        raise ConfigError(f"Unknown interpolation {value!r}. Available: {', '.join(INTERPOLATIONS)}")
    return value


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"`{name}` must be an int, got {value!r}")
    if value <= 0:
        raise ConfigError(f"`{name}` must be positive, got {value}")
    return int(value)


def _size_pair(name: str, value: Any) -> Size:
    """An int (square) or a (height, width) pair of positive ints."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        v = _positive_int(name, value)
        return v, v
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return _positive_int(name, value[0]), _positive_int(name, value[1])
    raise ConfigError(f"`{name}` must be an int or a (height, width) pair, got {value!r}")


def _range(name: str, value: Any, *, low: float) -> tuple[float, float]:
    """A (min, max) pair with low < min <= max."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise ConfigError(f"`{name}` must be a (min, max) pair of numbers, got {value!r}")
    lo, hi = float(value[0]), float(value[1])
    if not (low < lo <= hi and math.isfinite(hi)):
        raise ConfigError(f"`{name}` must satisfy {low} < min <= max, got {value!r}")
    return lo, hi


def _fill(value: Any) -> tuple[float, ...]:
    """A fill colour in pixel units (0..255, times 257 on 16-bit images): one number or one per channel."""
    values = value if isinstance(value, (tuple, list)) else (value,)
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 255
                             for v in values):
        raise ConfigError(f"`fill` must be a number in 0..255 or one per channel, got {value!r}")
    return tuple(float(v) for v in values)


#: The pixel dtypes of the ops that keep 16-bit samples (crop, resize, flip): uint16 resamples in float32.
_BOTH = (torch.uint8, torch.uint16)


# --------------------------------------------------------------------------------------------------
# Eager CPU kernels on [H, W, C] uint8 (or uint16) images.

def _nchw(im: torch.Tensor) -> torch.Tensor:
    """``[H, W, C]`` as a ``[1, C, H, W]`` channels-last view. The batch stride is set to something no
    [1, C, H, W] tensor could take for channels-first, so that torch keeps the output channels-last (no
    repacking copy; the same trick as torchvision's resize)."""
    x = im.permute(2, 0, 1).unsqueeze(0)
    return x.as_strided(x.shape, (max(im.numel(), 1),) + x.stride()[1:])


def resize_image(im: torch.Tensor, size: Size, interpolation: str, antialias: bool) -> torch.Tensor:
    """``torchvision.transforms.v2.functional.resize`` of one ``[H, W, C]`` uint8 image (``"nearest"`` as
    NEAREST_EXACT)."""
    if tuple(im.shape[:2]) == tuple(size):
        return im
    return _resize_nchw(_nchw(im), size, interpolation, antialias)[0].permute(1, 2, 0)


def _resize_nchw(x: torch.Tensor, size: Size, interpolation: str, antialias: bool) -> torch.Tensor:
    if x.dtype == torch.uint16:   # torch has no uint16 resize: in float32, rounded back to whole levels
        y = _resize_nchw(x.to(torch.float32), size, interpolation, antialias)
        return y.round_().clamp_(0, 65535).to(torch.uint16)
    mode = _TORCH_MODE[interpolation]
    if mode == "nearest-exact":
        return F.interpolate(x, size=tuple(size), mode=mode)
    return F.interpolate(x, size=tuple(size), mode=mode, align_corners=False, antialias=antialias)


# --------------------------------------------------------------------------------------------------
# The geometry op contract.

class GeometryOp(Op):
    """A crop, resize, flip, pad or rotation: an affine map per sample, composable into one Warp.

    Subclasses implement ``_steps`` (vectorized over the batch) and ``_apply_cpu``; an op that drops boxes
    by its own rule (beyond clipping) implements :meth:`box_filter`. ``interpolation``, ``antialias``
    matter for ops that resample; ``fill`` (pixel units) for ops that can produce pixels outside the input.
    """

    interpolation: str = "nearest"
    antialias: bool = False
    fill: tuple[float, ...] | None = None
    pads = False  # only adds fill around the image (its content size is the size before it)

    def _steps(self, sizes: np.ndarray, params: Any) -> Steps:
        raise NotImplementedError

    def _apply_cpu(self, images: Images, params: Any) -> Images:
        raise NotImplementedError

    def steps(self, sizes: Sequence[Size] | np.ndarray, params: Any) -> Steps:
        """This op on a batch of ``sizes`` with its drawn ``params``, as per-sample affine maps."""
        st = self._steps(size_array(sizes), params)
        return st._replace(interpolation=self.interpolation, antialias=self.antialias, fill=self.fill)

    def box_filter(self, boxes: np.ndarray, owner: np.ndarray, params: Any) -> np.ndarray | None:
        """Which boxes ``[M, 4]`` of the batch (in input coords; box m is sample ``owner[m]``'s) the op keeps
        by its own rule, or None: all (boxes are clipped to the output in any case, and empty ones dropped)."""
        return None

    def out_sizes(self, sizes: Sequence[Size], params: Any) -> list[Size]:
        return size_list(self.steps(sizes, params).out_sizes)

    def apply(self, images: Images, params: Any) -> Images:
        if not len(images):
            return images
        if images[0].device.type == "cpu":
            return self._apply_cpu(images, params)
        sizes = sizes_of(images)
        return resample.warp(images, compose([self.steps(sizes, params)], sizes))


# --------------------------------------------------------------------------------------------------

class Resize(GeometryOp):
    """Resize to ``size`` = (height, width), or so that one side has a given length, keeping the aspect.

    ``Resize(size=(h, w))``; ``Resize(256)`` or ``Resize(shorter=256)``: shorter side 256, the longer one
    scaled and truncated to an int, optionally capped at ``max_size`` (then the shorter one is scaled
    down); ``Resize(longer=512)``: longer side 512. The output sizes are exactly
    ``torchvision.transforms.v2.functional.resize``'s (``longer=L`` is torchvision's ``size=None,
    max_size=L``). ``antialias=True`` selects torch's (and PIL's) antialiased kernels for ``"bilinear"`` and
    ``"bicubic"``: widened when downscaling; for bicubic also the a=-0.5 cubic when upscaling, as in torch.
    """

    pixel_dtypes = _BOTH

    def __init__(self, size: int | Sequence[int] | None = None, *, shorter: int | None = None,
                 longer: int | None = None, max_size: int | None = None, interpolation: str = "bilinear",
                 antialias: bool = True):
        if isinstance(size, (tuple, list)) and len(size) == 1:
            size = size[0]
        if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
            if shorter is not None:
                raise ConfigError("pass the shorter side as `size` or as `shorter`, not both")
            size, shorter = None, _positive_int("size", size)
        given = [name for name, v in (("size", size), ("shorter", shorter), ("longer", longer)) if v is not None]
        if len(given) != 1:
            raise ConfigError(f"Resize needs exactly one of `size`, `shorter`, `longer`, got {given or 'none'}")
        self.size = None if size is None else _size_pair("size", size)
        self.shorter = None if shorter is None else _positive_int("shorter", shorter)
        self.longer = None if longer is None else _positive_int("longer", longer)
        if max_size is not None:
            if self.shorter is None:
                raise ConfigError("`max_size` caps the longer side of a `shorter=` resize; "
                                  "with `size=(h, w)` or `longer=` it has no meaning")
            max_size = _positive_int("max_size", max_size)
            if max_size <= self.shorter:
                raise ConfigError(f"`max_size` must be greater than `shorter` ({self.shorter}), got {max_size}")
        self.max_size = max_size
        self.interpolation = _interpolation(interpolation)
        self.antialias = bool(antialias)

    @property
    def fixed_size(self) -> bool:  # type: ignore[override]
        return self.size is not None

    def output_size(self, height: int, width: int) -> Size:
        """The (height, width) an image of this size is resized to."""
        return tuple(self._output_sizes(np.array([[height, width]], dtype=np.int64))[0].tolist())

    def _output_sizes(self, sizes: np.ndarray) -> np.ndarray:
        """:meth:`output_size` of every row of ``sizes`` (N, 2), vectorized with the same float64 arithmetic."""
        if self.size is not None:
            return np.tile(np.array([self.size], dtype=np.int64), (len(sizes), 1))
        h, w = sizes[:, 0], sizes[:, 1]
        portrait = w <= h
        short, long = np.where(portrait, w, h), np.where(portrait, h, w)
        if self.longer is not None:
            new_short, new_long = (self.longer * short / long).astype(np.int64), np.full_like(long, self.longer)
        else:
            new_short, new_long = np.full_like(short, self.shorter), (self.shorter * long / short).astype(np.int64)
            if self.max_size is not None:
                cap = new_long > self.max_size
                new_short = np.where(cap, (self.max_size * new_short / new_long).astype(np.int64), new_short)
                new_long = np.where(cap, self.max_size, new_long)
        new_short = np.maximum(new_short, 1)  # a sliver (1 x 2000 at max_size 1333) keeps one row, not none
        return np.stack([np.where(portrait, new_long, new_short), np.where(portrait, new_short, new_long)], axis=1)

    def _steps(self, sizes: np.ndarray, params: Any) -> Steps:
        out = self._output_sizes(sizes)
        m = eye(len(sizes))
        m[:, 0, 0] = sizes[:, 1] / out[:, 1]
        m[:, 1, 1] = sizes[:, 0] / out[:, 0]
        return Steps(m, out, None, (out != sizes).any(axis=1))

    def _apply_cpu(self, images: Images, params: Any) -> Images:
        if isinstance(images, torch.Tensor):  # one size in, one size out: a single batched call
            size = self.output_size(images.shape[1], images.shape[2])
            if size == tuple(images.shape[1:3]):
                return images
            return _resize_nchw(images.permute(0, 3, 1, 2), size, self.interpolation,
                                self.antialias).permute(0, 2, 3, 1)
        return stack_if_uniform([resize_image(im, self.output_size(im.shape[0], im.shape[1]),
                                              self.interpolation, self.antialias) for im in images])


class CenterCrop(GeometryOp):
    """Crop the centre ``size`` = int or (height, width); where the image is smaller, pad with ``fill``
    (pixel units), exactly like ``torchvision.transforms.v2.functional.center_crop`` (which pads with 0)."""

    pixel_dtypes = _BOTH

    fixed_size = True

    def __init__(self, size: int | Sequence[int], *, fill: float | Sequence[float] = 0):
        self.size = _size_pair("size", size)
        self.fill = _fill(fill)

    @staticmethod
    def _offset(n: np.ndarray, c: int) -> np.ndarray:
        # torchvision pads (c - n) // 2 before, then anchors at round((padded - c) / 2) (ties to even).
        centred = np.rint((n - c) / 2.0).astype(np.int64)
        return np.where(c > n, -((c - n) // 2), centred)

    def _steps(self, sizes: np.ndarray, params: Any) -> Steps:
        ch, cw = self.size
        top, left = self._offset(sizes[:, 0], ch), self._offset(sizes[:, 1], cw)
        m = eye(len(sizes))
        m[:, 0, 2], m[:, 1, 2] = left, top
        out = columns(ch, cw, n=len(sizes), dtype=np.int64)   # column by column, as RandomResizedCrop's
        return Steps(m, out, columns(left, top, left + cw, top + ch), zeros(len(sizes), bool))

    def _apply_cpu(self, images: Images, params: Any) -> Images:
        ch, cw = self.size
        sizes = size_array(sizes_of(images))
        top, left = self._offset(sizes[:, 0], ch), self._offset(sizes[:, 1], cw)
        first = images[0]
        fill = fill_levels(self.fill, first.shape[-1], first.dtype)
        if isinstance(images, torch.Tensor):
            return pad_crop(images, int(top[0]), int(left[0]), ch, cw, fill)
        return stack_if_uniform([pad_crop(im, int(t), int(l), ch, cw, fill)
                                 for im, t, l in zip(images, top, left)])


class RandomResizedCrop(GeometryOp):
    """Crop a random region of random area (``scale``, a fraction of the image) and aspect (``ratio``,
    width / height, drawn log-uniformly), then resize it to ``size``.

    The region is drawn by torchvision's ``RandomResizedCrop.get_params`` procedure (10 attempts, then the
    central crop of the image clamped to ``ratio``), each sample's numbers from its own stream.
    Params: an ``(N, 4)`` int64 array of (top, left, height, width).
    """

    pixel_dtypes = _BOTH

    fixed_size = True

    def __init__(self, size: int | Sequence[int], scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), *, interpolation: str = "bilinear",
                 antialias: bool = True):
        self.size = _size_pair("size", size)
        self.scale = _range("scale", scale, low=0.0)
        self.ratio = _range("ratio", ratio, low=0.0)
        self.interpolation = _interpolation(interpolation)
        self.antialias = bool(antialias)

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> np.ndarray:
        rngs = per_sample(rngs, len(sizes))
        hw = size_array(sizes)
        if random.NATIVE is not None:   # the procedure below in one call (ingest/_random.c)
            out = np.empty((len(hw), 4), dtype=np.int64)
            random.NATIVE.resized_crops(np.ascontiguousarray(rngs.keys), rngs.advance(2), np.ascontiguousarray(hw),
                                        *self.scale, *self.ratio, out)
            return out
        h, w = hw[:, 0], hw[:, 1]
        # Per sample: 10 areas and 10 aspects, then the position (used if an attempt fits). The attempts run one
        # after another over the samples still without a fit, so no array holds more than the batch: numpy lets
        # the GIL go on arrays of more than 500 elements, which beside a busy thread costs up to a switch interval
        # each (a [B, 10] form would cross that line in most of its calls once B > 50).
        u, at = rngs.random(20), rngs.random(2)
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        cw, ch, found = zeros(len(hw), np.int64), zeros(len(hw), np.int64), zeros(len(hw), bool)
        todo = np.arange(len(hw))
        for j in range(10):
            if not len(todo):
                break
            ht, wt = h[todo], w[todo]
            # u[:, j][todo], not u[todo, j]: numpy's 2-D fancy indexing gave the GIL up, a column's 1-D one does not
            area = ht * wt * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, j][todo])
            aspect = np.exp(lo + (hi - lo) * u[:, 10 + j][todo])
            tw = np.rint(np.sqrt(area * aspect)).astype(np.int64)  # rint: ties to even, like round()
            th = np.rint(np.sqrt(area / aspect)).astype(np.int64)
            ok = (tw > 0) & (tw <= wt) & (th > 0) & (th <= ht)
            fit = todo[ok]
            cw[fit], ch[fit], found[fit] = tw[ok], th[ok], True
            todo = todo[~ok]
        # Fallback: the whole image, narrowed to the nearest allowed aspect.
        in_ratio = w / h
        fw = np.where(in_ratio > self.ratio[1], np.rint(h * self.ratio[1]).astype(np.int64), w)
        fh = np.where(in_ratio < self.ratio[0], np.rint(w / self.ratio[0]).astype(np.int64), h)
        cw, ch = np.where(found, cw, fw), np.where(found, ch, fh)
        out = np.empty((len(hw), 4), dtype=np.int64)   # filled by column: no array of 4 x B
        out[:, 0] = np.where(found, (at[:, 0] * (h - ch + 1)).astype(np.int64), (h - ch) // 2)
        out[:, 1] = np.where(found, (at[:, 1] * (w - cw + 1)).astype(np.int64), (w - cw) // 2)
        out[:, 2], out[:, 3] = ch, cw
        return out

    def _steps(self, sizes: np.ndarray, params: np.ndarray) -> Steps:
        oh, ow = self.size
        top, left, ch, cw = (params[:, k].astype(np.float64) for k in range(4))
        m = eye(len(sizes))
        m[:, 0, 0], m[:, 0, 2] = cw / ow, left
        m[:, 1, 1], m[:, 1, 2] = ch / oh, top
        out = columns(oh, ow, n=len(sizes), dtype=np.int64)
        return Steps(m, out, columns(left, top, left + cw, top + ch), (ch != oh) | (cw != ow))

    def out_sizes(self, sizes: Sequence[Size], params: Any) -> list[Size]:
        return [self.size] * len(sizes)

    def _apply_cpu(self, images: Images, params: np.ndarray) -> Images:
        out = [resize_image(im[t:t + h, l:l + w], self.size, self.interpolation, self.antialias)
               for im, (t, l, h, w) in zip(as_list(images), params.tolist())]
        return torch.stack(out)


class Flip(GeometryOp):
    """Mirror each sample with probability ``p``: left-right if ``horizontal``, top-bottom if ``vertical``
    (each axis with its own coin, as DALI's ``flip`` fed by two ``coin_flip``). Params: an ``(N, 2)`` bool
    array (flip left-right, flip top-bottom). ``HorizontalFlip(p)`` and ``VerticalFlip(p)`` are the
    one-axis forms (torchvision's ``RandomHorizontalFlip``, ``RandomVerticalFlip``)."""

    pixel_dtypes = _BOTH

    def __init__(self, p: float = 0.5, *, horizontal: bool = True, vertical: bool = False):
        if not (horizontal or vertical):
            raise ConfigError("Flip needs `horizontal=True` or `vertical=True` (or both)")
        self.p = probability(p)
        self.horizontal = bool(horizontal)
        self.vertical = bool(vertical)

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> np.ndarray:
        u = per_sample(rngs, len(sizes)).random(2)   # column by column (see ingest._numpy)
        return columns((u[:, 0] < self.p) & self.horizontal, (u[:, 1] < self.p) & self.vertical, dtype=bool)

    def _steps(self, sizes: np.ndarray, params: np.ndarray) -> Steps:
        m = eye(len(sizes))
        fx, fy = params[:, 0], params[:, 1]
        m[:, 0, 0], m[:, 0, 2] = np.where(fx, -1.0, 1.0), np.where(fx, sizes[:, 1], 0)
        m[:, 1, 1], m[:, 1, 2] = np.where(fy, -1.0, 1.0), np.where(fy, sizes[:, 0], 0)
        return Steps(m, copy(sizes), None, zeros(len(sizes), bool))

    def out_sizes(self, sizes: Sequence[Size], params: Any) -> list[Size]:
        return list(sizes)

    def _apply_cpu(self, images: Images, params: np.ndarray) -> Images:
        if not params.any():
            return images
        out = []
        for im, (fx, fy) in zip(as_list(images), params.tolist()):
            dims = [d for d, f in ((1, fx), (0, fy)) if f]
            out.append(im.flip(dims) if dims else im)
        return torch.stack(out) if isinstance(images, torch.Tensor) else stack_if_uniform(out)


class HorizontalFlip(Flip):
    """Mirror left-right with probability ``p`` (torchvision's ``RandomHorizontalFlip``)."""

    def __init__(self, p: float = 0.5):
        super().__init__(p, horizontal=True, vertical=False)


class VerticalFlip(Flip):
    """Mirror top-bottom with probability ``p`` (torchvision's ``RandomVerticalFlip``)."""

    def __init__(self, p: float = 0.5):
        super().__init__(p, horizontal=False, vertical=True)


class Rotate(GeometryOp):
    """Rotate counter-clockwise by ``angle`` degrees about the image centre, like
    ``torchvision.transforms.v2.functional.rotate``: a number, or a (min, max) range drawn uniformly per
    sample. ``expand=True`` grows the output to hold the whole rotated image (torchvision's size rule);
    pixels from outside the image take ``fill`` (pixel units). Params: an ``(N,)`` float64 array of angles.

    On CPU the result is torchvision's (``grid_sample`` plus its fill blend along the edges of the
    rotated image); the composed warp instead gives an edge pixel ``fill`` or the image, never a blend.
    """

    antialias = False

    def __init__(self, angle: float | Sequence[float], *, expand: bool = False,
                 fill: float | Sequence[float] = 0, interpolation: str = "bilinear"):
        if isinstance(angle, (tuple, list)):
            if not (len(angle) == 2 and all(isinstance(a, (int, float)) and math.isfinite(a) for a in angle)
                    and angle[0] <= angle[1]):
                raise ConfigError(f"`angle` must be a number or a (min, max) range, got {angle!r}")
            self.angle: float | tuple[float, float] = (float(angle[0]), float(angle[1]))
        elif isinstance(angle, (int, float)) and not isinstance(angle, bool) and math.isfinite(angle):
            self.angle = float(angle)
        else:
            raise ConfigError(f"`angle` must be a number or a (min, max) range, got {angle!r}")
        self.expand = bool(expand)
        self.fill = _fill(fill)
        self.interpolation = _interpolation(interpolation)

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> np.ndarray:
        if isinstance(self.angle, tuple):
            return per_sample(rngs, len(sizes)).uniform(*self.angle)
        return np.full(len(sizes), self.angle)

    @staticmethod
    def _cos_sin(angles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = np.mod(angles, 360.0)
        rad = np.radians(a)
        c, s = np.cos(rad), np.sin(rad)
        quarter = np.mod(a, 90.0) == 0  # exact values, so that quarter turns move whole pixels
        k = np.rint(a / 90.0).astype(np.int64) % 4
        c = np.where(quarter, np.array([1.0, 0.0, -1.0, 0.0])[k], c)
        s = np.where(quarter, np.array([0.0, 1.0, 0.0, -1.0])[k], s)
        return c, s

    def _expanded(self, sizes: np.ndarray, c: np.ndarray, s: np.ndarray) -> np.ndarray:
        """torchvision's expand size: the rotated corners' extent in float32, truncated to 1e-4 before
        ceil/floor so that 1e-15 errors do not add a pixel."""
        h = sizes[:, 0].astype(np.float32)[:, None]
        w = sizes[:, 1].astype(np.float32)[:, None]
        hx, hy = np.float32(0.5) * w, np.float32(0.5) * h
        cx = np.concatenate([-hx, -hx, hx, hx], axis=1)  # corners relative to the centre
        cy = np.concatenate([-hy, hy, hy, -hy], axis=1)
        c32, s32 = c.astype(np.float32)[:, None], s.astype(np.float32)[:, None]
        xs = c32 * cx - s32 * cy + hx
        ys = s32 * cx + c32 * cy + hy
        tol, inv = np.float32(1e-4), np.float32(1e4)

        def extent(v: np.ndarray) -> np.ndarray:
            hi = np.ceil(np.trunc(v.max(axis=1) * inv) * tol)
            lo = np.floor(np.trunc(v.min(axis=1) * inv) * tol)
            return (hi - lo).astype(np.int64)

        return np.stack([extent(ys), extent(xs)], axis=1)

    def _steps(self, sizes: np.ndarray, params: np.ndarray) -> Steps:
        angles = np.asarray(params, dtype=np.float64).reshape(-1)
        c, s = self._cos_sin(angles)
        out = sizes.copy()
        if self.expand:  # quarter turns swap height and width exactly (torchvision's rot90 fast path)
            quarter = np.mod(angles, 90.0) == 0
            swap = quarter & (np.abs(s) == 1.0)
            out = np.where(quarter[:, None], np.where(swap[:, None], sizes[:, ::-1], sizes),
                           self._expanded(sizes, c, s))
        h, w = sizes[:, 0].astype(np.float64), sizes[:, 1].astype(np.float64)
        oh, ow = out[:, 0] / 2.0, out[:, 1] / 2.0
        # x_in = c (x - ow/2) - s (y - oh/2) + w/2 ; y_in = s (x - ow/2) + c (y - oh/2) + h/2
        m = eye(len(sizes))
        m[:, 0, 0], m[:, 0, 1], m[:, 0, 2] = c, -s, w / 2 - c * ow + s * oh
        m[:, 1, 0], m[:, 1, 1], m[:, 1, 2] = s, c, h / 2 - s * ow - c * oh
        identity = (np.mod(angles, 360.0) == 0) & (out == sizes).all(axis=1)
        return Steps(m, out, None, ~identity)

    def _apply_cpu(self, images: Images, params: np.ndarray) -> Images:
        angles = np.asarray(params, dtype=np.float64).reshape(-1)
        out_sizes = self.out_sizes(sizes_of(images), angles)
        return stack_if_uniform([self._rotate_one(im, float(a), size)
                                 for im, a, size in zip(as_list(images), angles, out_sizes)])

    def _rotate_one(self, im: torch.Tensor, angle: float, out_size: Size) -> torch.Tensor:
        """torchvision's ``rotate`` of one image, step for step in float32 (so that even ties between two
        pixels resolve as there)."""
        a = angle % 360.0
        h, w, c = im.shape
        if a == 0:
            return im
        if a == 180:
            return torch.rot90(im, 2, (0, 1))
        if a in (90.0, 270.0) and (self.expand or h == w):
            return torch.rot90(im, 1 if a == 90 else 3, (0, 1))
        oh, ow = out_size
        rot = math.radians(-a)
        theta = torch.tensor([[math.cos(rot), math.sin(rot), 0.0], [-math.sin(rot), math.cos(rot), 0.0]])
        # Output pixel centres relative to the output centre, mapped and scaled to grid_sample's [-1, 1].
        base = torch.empty(1, oh, ow, 3)
        base[..., 0] = torch.linspace((1.0 - ow) * 0.5, (ow - 1.0) * 0.5, steps=ow)
        base[..., 1] = torch.linspace((1.0 - oh) * 0.5, (oh - 1.0) * 0.5, steps=oh)[:, None]
        base[..., 2] = 1.0
        grid = base.view(1, oh * ow, 3).bmm(theta.T[None] / torch.tensor([0.5 * w, 0.5 * h])).view(1, oh, ow, 2)
        x = torch.cat([im.permute(2, 0, 1).to(torch.float32), torch.ones(1, h, w)])[None]
        y = F.grid_sample(x, grid, mode=self.interpolation, padding_mode="zeros", align_corners=False)[0]
        img, mask = y[:c], y[c:]
        fill = torch.tensor(fill_for(self.fill, c)).view(c, 1, 1)
        if self.interpolation == "nearest":
            img = torch.where(mask < 0.5, fill, img)
        else:  # torchvision's blend towards fill where the sample point left the image
            img = (img - fill) * mask + fill
        return img.round_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 0)
