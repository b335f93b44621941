"""The batched resample: execute a :class:`~ingest.ops.affine.Warp`, optionally followed by an epilogue.

It only resamples. What to resample comes from :mod:`ingest.ops.affine` (the composed map); what to do with
the result comes as an :class:`Epilogue` of coefficients (``x * a + b`` per channel, then a dtype and a
layout: what Normalize gives via ``Normalize.epilogue``). Two implementations of the same math:

* on CUDA with CuPy: one kernel launch for the whole batch, ragged or not (:mod:`ingest.ops._warp_kernel`);
* anywhere else: :func:`reference`, torch ops per sample.

The math, per output pixel (centre ``p``) of sample n: map ``q = matrix[n] @ p`` into the source. If ``q`` is
outside ``box[n]`` the pixel is ``fill``. Otherwise, when the matrix is axis-aligned (a crop/scale/flip,
possibly with a quarter turn) and ``antialias`` is set, it is the separable antialiasing filter of torch's
and PIL's resize: a triangle (bilinear) or Keys cubic a=-0.5 (bicubic) whose support grows with the scale
factor along each source axis, over the taps inside the box, weights normalized to sum 1. Otherwise it is
plain sampling at ``q``: nearest (the pixel containing ``q``), bilinear, or bicubic (Keys a=-0.75, torch's
non-antialiased bicubic), with taps clamped to the box. Taps inside the box but outside the image (a padded
crop) read ``fill``. Ops that only move pixels narrow both: the box is cut to ``inside[n]`` (what the ops
after the last resample read: a crop, then a pad has fill in its padding), and taps outside ``readable[n]``
(what the ops before it kept: a crop, then a pad, then a resize) read ``fill`` as those outside the image do. Values are rounded to whole levels (as the eager path's uint8
images are) before the optional epilogue.

The eager op-by-op path and the warp differ only where stated: rounding between steps (<= 1 level),
torchvision's soft fill blend along a rotated image's edges (the warp's edge is hard), and a downscale
followed by a rotation, which the warp samples without antialiasing.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch

from .._numpy import columns, copy
from ..errors import ConfigError
from . import _warp_kernel
from .affine import Warp, bounds
from .base import (PIXEL_DTYPES, ImageArena, Images, Size, as_list, copy_into, device_and_channels, fill_levels, levels,
                   pad_crop, size_array, size_array_of, sizes_of)


class Epilogue(NamedTuple):
    """What happens to each resampled pixel value (whole levels, float) on its way out."""

    a: tuple[float, ...]     # per channel: out = x * a + b
    b: tuple[float, ...]
    dtype: torch.dtype       # uint8 (rounded, saturated), float32, float16 or bfloat16
    layout: str              # "NCHW" or "NHWC"


def finish(x: torch.Tensor, epilogue: Epilogue) -> torch.Tensor:
    """The epilogue on a ``[N, H, W, C]`` batch of pixel values (uint8, or float holding whole levels)."""
    c = x.shape[-1]
    a, b = (torch.tensor(v, dtype=torch.float32, device=x.device) for v in (epilogue.a, epilogue.b))
    if epilogue.layout == "NCHW":
        x, a, b = x.permute(0, 3, 1, 2), a.view(c, 1, 1), b.view(c, 1, 1)
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    out.copy_(x)  # the dtype and layout change in one pass (faster than a mixed-dtype mul on CPU)
    out.mul_(a).add_(b)
    if epilogue.dtype == torch.uint8:
        return out.round_().clamp_(0, 255).to(torch.uint8)
    return out if epilogue.dtype == torch.float32 else out.to(epilogue.dtype)


class _Setup(NamedTuple):
    """What both implementations need per sample, derived once from a Warp and the actual source sizes."""

    matrix: np.ndarray     # (N, 2, 3)
    box: np.ndarray        # (N, 4) float64 x0 y0 x1 y1: points outside take fill
    taps: np.ndarray       # (N, 4) int64 x0 y0 x1 y1 (end exclusive): pixels the filter may read (those
                           # outside the image read fill)
    aa: np.ndarray         # (N,) bool: separable antialiasing filter (else plain sampling)
    support: np.ndarray    # (N, 2) filter half-width along source x, y, in source pixels
    inv_scale: np.ndarray  # (N, 2) 1 / max(1, source pixels per output pixel) along x, y
    window: np.ndarray     # (N, 4) int64 x0 y0 x1 y1: the source pixels read (`Warp.readable` in the image); the
                           # coordinates above are relative to its corner, and pixels outside it read fill


def _setup(w: Warp, sizes: Sequence[Size]) -> _Setup:
    hw = size_array(sizes)
    if w.matrix.shape != (len(hw), 3, 3) or len(w.out_sizes) != len(hw) or w.box.shape != (len(hw), 4):
        raise ValueError(f"the warp is for {len(w.out_sizes)} samples, the batch has {len(hw)}")
    if w.interpolation not in ("nearest", "bilinear", "bicubic"):
        raise ConfigError(f"Unknown interpolation {w.interpolation!r}. Available: bicubic, bilinear, nearest")
    # Column by column: numpy gives the GIL up in an operation on more than 500 items (ingest._numpy), and this
    # runs per batch in the training process.
    n, eps, tiny = len(hw), 1e-6, 1e-9
    box, matrix, window = _narrowed(w, hw)
    taps = np.empty((n, 4), dtype=np.int64)
    for j in range(4):
        taps[:, j] = np.floor(box[:, j] + eps) if j < 2 else np.ceil(box[:, j] - eps)
    a00, a01, a10, a11 = (np.abs(matrix[:, r, c]) for r, c in ((0, 0), (0, 1), (1, 0), (1, 1)))
    aligned = ((a01 < tiny) & (a10 < tiny)) | ((a00 < tiny) & (a11 < tiny))
    aa = aligned & bool(w.antialias) & (w.interpolation != "nearest")
    factor = 2.0 if w.interpolation == "bicubic" else 1.0
    scale, support, inv_scale = (np.empty((n, 2)) for _ in range(3))
    for j, (first, second) in enumerate(((a00, a01), (a10, a11))):
        scale[:, j] = np.maximum(first + second, 1.0)  # source pixels per output pixel, along source x and y
        support[:, j] = scale[:, j] * factor
        inv_scale[:, j] = 1.0 / scale[:, j]
    return _Setup(copy(matrix[:, :2, :]), copy(box, np.float64), taps, aa, support, inv_scale, window)


def _narrowed(w: Warp, hw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``w``'s box and matrix where ops that only move pixels narrow what the resample may use, and the window
    (N, 4) int64 x0 y0 x1 y1 of each source it reads, the box and matrix then relative to its corner.

    The box is cut to `Warp.inside` on a side where the output maps past it (a crop, then a pad); the window is
    `Warp.readable` where the taps reach past it inside the image (a crop, then a pad, then a resize), else
    the whole image. Narrowed only there: every other warp keeps its arguments (the native planner's too)."""
    n, eps = len(hw), 1e-6
    box, matrix = w.box.copy(), w.matrix.copy()
    window = columns(0, 0, hw[:, 1], hw[:, 0], n=n, dtype=np.int64)
    if w.inside is not None:
        out = size_array(w.out_sizes)
        seen = bounds(matrix, columns(0.0, 0.0, out[:, 1], out[:, 0], n=n))   # where the output's area maps
        for j in range(4):   # per side: cut where the output maps past it and it is inside the box
            side = 1.0 if j < 2 else -1.0   # +1: a lower bound
            cut = (side * (w.inside[:, j] - seen[:, j]) > eps) & (side * (w.inside[:, j] - box[:, j]) > eps)
            box[:, j] = np.where(cut, w.inside[:, j], box[:, j])
    if w.readable is None:
        return box, matrix, window
    kept, reach = np.empty((n, 4), dtype=np.int64), np.empty((n, 4), dtype=np.int64)
    for j in range(4):   # both clipped to the image
        lo = j < 2
        kept[:, j] = (np.maximum(np.floor(w.readable[:, j] + eps), 0) if lo
                      else np.minimum(np.ceil(w.readable[:, j] - eps), window[:, j]))
        reach[:, j] = (np.maximum(np.floor(box[:, j] + eps), 0) if lo
                       else np.minimum(np.ceil(box[:, j] - eps), window[:, j]))
    beyond = (reach[:, 0] < kept[:, 0]) | (reach[:, 1] < kept[:, 1]) | (reach[:, 2] > kept[:, 2]) | (
        reach[:, 3] > kept[:, 3])
    narrow = (reach[:, 2] > reach[:, 0]) & (reach[:, 3] > reach[:, 1]) & beyond
    gone = narrow & ((kept[:, 2] <= kept[:, 0]) | (kept[:, 3] <= kept[:, 1]))
    box[gone] = 0.0   # nothing kept: all fill
    for j in range(4):
        window[:, j] = np.where(narrow, np.maximum(kept[:, j], kept[:, j - 2]) if j >= 2 else kept[:, j], window[:, j])
    for j in range(2):
        matrix[:, j, 2] -= window[:, j]
        box[:, j] -= window[:, j]
        box[:, j + 2] -= window[:, j]
    return box, matrix, window


def _fill_values(fill: Sequence[float], channels: int, dtype: torch.dtype = torch.uint8) -> tuple[float, ...]:
    """``fill`` per channel, in whole levels of ``dtype`` (what a padded image holds: `fill_levels`)."""
    return tuple(float(round(v)) for v in fill_levels(fill, channels, dtype))


def warp(images: Images, w: Warp, *, epilogue: Epilogue | None = None, out: torch.Tensor | None = None) -> Images:
    """Resample every image of the batch by ``w``, then run ``epilogue`` on the result if given.

    Returns ``[N, H, W, C]`` of the images' dtype, uint8 or uint16 (or the epilogue's dtype and layout) when
    all outputs share a size, else a list. On CUDA with CuPy, uint8 and at most 4 channels this is one kernel
    launch on the current torch stream; otherwise (uint16 too) :func:`reference`. ``out``: a contiguous tensor
    of that shape, dtype and device to write to instead of a new one (the outputs must share a size), returned.
    """
    if not len(images):
        return images
    device, channels = device_and_channels(images)
    dtype = torch.uint8 if isinstance(images, ImageArena) else images[0].dtype
    if isinstance(images, torch.Tensor):  # one check for the whole batch, no view per image
        if images.dim() != 4 or images.dtype not in PIXEL_DTYPES:
            raise ValueError("warp takes [N, H, W, C] uint8 (or uint16) batches or lists of [H, W, C] images")
    elif not isinstance(images, ImageArena) and any(  # an arena is uint8 [H, W, C] on one device by construction
            im.dim() != 3 or im.dtype != dtype or im.device != device or im.shape[2] != channels
            for im in images):
        raise ValueError("warp takes [H, W, C] uint8 (or uint16) images of one dtype and channel count, all on "
                         "one device")
    if dtype not in PIXEL_DTYPES:
        raise ValueError(f"warp takes uint8 or uint16 pixels, got {dtype}")
    setup = _setup(w, size_array_of(images))
    fill = _fill_values(w.fill, channels, dtype)
    # The kernel reads 8-bit samples; 16-bit ones run the torch implementation (on their device)
    if device.type == "cuda" and channels <= 4 and dtype == torch.uint8 and _warp_kernel.available():
        return _warp_kernel.launch(images, w.out_sizes, setup, w.interpolation, fill,
                                   epilogue[:2] if epilogue else None,
                                   epilogue.dtype if epilogue else torch.uint8,
                                   epilogue is not None and epilogue.layout == "NCHW", out=out)
    result = _reference(as_list(images), w, setup, fill, epilogue)
    return result if out is None else copy_into(out, result)


def reference(images: Images, w: Warp, *, epilogue: Epilogue | None = None) -> Images:
    """The torch implementation of :func:`warp` (any device, one sample at a time): the executable spec
    that the CUDA kernel is tested against, and the CPU path for sources that are not the planned size."""
    ims = as_list(images)
    if not ims:
        return images
    return _reference(ims, w, _setup(w, sizes_of(ims)), _fill_values(w.fill, ims[0].shape[2], ims[0].dtype),
                      epilogue)


def _reference(ims: list[torch.Tensor], w: Warp, setup: _Setup, fill_values: tuple[float, ...],
               epilogue: Epilogue | None) -> Images:
    fill = torch.tensor(fill_values, dtype=torch.float32, device=ims[0].device)
    dtype = ims[0].dtype   # uint8, or uint16: whole levels of the images' own range
    top = levels(dtype)
    if dtype == torch.uint16:   # read as int32: CUDA indexes and pads no uint16 tensor
        ims = [im.to(torch.int32) for im in ims]
    outs = []
    for n, im in enumerate(ims):
        oh, ow = w.out_sizes[n]
        wx0, wy0, wx1, wy1 = setup.window[n].tolist()
        im = im[wy0:wy1, wx0:wx1]
        x0, y0, x1, y1 = setup.taps[n].tolist()
        if x1 <= x0 or y1 <= y0:  # nothing to read: all fill
            outs.append(fill.expand(oh, ow, -1).clone())
            continue
        resample = _resample_aa if setup.aa[n] else _resample_plain
        outs.append(resample(im, setup, n, (oh, ow), w.interpolation, fill_values, fill).clamp_(0, top).round_())
    if all(o.shape == outs[0].shape for o in outs):
        batch = torch.stack(outs)
        return finish(batch, epilogue) if epilogue else batch.to(dtype)
    if epilogue:
        return [finish(o[None], epilogue)[0] for o in outs]
    return [o.to(dtype) for o in outs]


def _filter(x: np.ndarray, interpolation: str) -> np.ndarray:
    """The antialiasing filter: triangle (bilinear) or Keys cubic with a = -0.5 (bicubic)."""
    return _keys(x, -0.5) if interpolation == "bicubic" else np.maximum(1.0 - np.abs(x), 0.0)


def _keys(x, a: float):
    """Keys' cubic convolution kernel (numpy arrays or tensors)."""
    where = torch.where if isinstance(x, torch.Tensor) else np.where
    x = abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return where(x < 1, near, where(x < 2, far, 0.0))


def _aa_taps(centers: np.ndarray, support: float, inv: float, lo: int, hi: int,
             interpolation: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tap indices (n, K), normalized weights (n, K) and validity (n,) of the filter at ``centers``, using
    only pixels lo..hi-1."""
    start = np.maximum(np.floor(centers - support + 0.5), lo)
    stop = np.minimum(np.floor(centers + support + 0.5), hi)
    k = max(int((stop - start).max(initial=0)), 1)
    idx = start[:, None] + np.arange(k)
    wts = _filter((idx + 0.5 - centers[:, None]) * inv, interpolation) * (idx < stop[:, None])
    total = wts.sum(axis=1)
    ok = np.abs(total) > 1e-12
    wts /= np.where(ok, total, 1.0)[:, None]
    return np.clip(idx, lo, max(hi - 1, lo)).astype(np.int64), wts, ok


def _filter_axis(img: torch.Tensor, dim: int, idx: np.ndarray, wts: np.ndarray) -> torch.Tensor:
    """Taps along ``dim`` (0 or 1) of a float ``[R, W, C]`` image:
    ``out[.., i, ..] = sum_k wts[i, k] * img[.., idx[i, k], ..]``."""
    i = torch.from_numpy(idx).to(img.device)
    w = torch.from_numpy(wts).to(device=img.device, dtype=torch.float32)
    shape = (-1, 1, 1) if dim == 0 else (1, -1, 1)
    out = torch.index_select(img, dim, i[:, 0]).mul_(w[:, 0].view(shape))
    for k in range(1, idx.shape[1]):
        out.addcmul_(torch.index_select(img, dim, i[:, k]), w[:, k].view(shape))
    return out


def _resample_aa(im: torch.Tensor, st: _Setup, n: int, out_size: Size, interpolation: str,
                 fill_values: tuple[float, ...], fill: torch.Tensor) -> torch.Tensor:
    (m00, m01, m02), (m10, m11, m12) = st.matrix[n]
    oh, ow = out_size
    x0, y0, x1, y1 = st.taps[n].tolist()
    bx0, by0, bx1, by1 = st.box[n]
    # Source x and y of every output column / row; a quarter turn swaps which output axis drives which.
    transposed = abs(m00) < 1e-9
    out_x, out_y = np.arange(ow) + 0.5, np.arange(oh) + 0.5
    cx = (m01 * out_y if transposed else m00 * out_x) + m02
    cy = (m10 * out_x if transposed else m11 * out_y) + m12
    tx, wx, okx = _aa_taps(cx, st.support[n, 0], st.inv_scale[n, 0], x0, x1, interpolation)
    ty, wy, oky = _aa_taps(cy, st.support[n, 1], st.inv_scale[n, 1], y0, y1, interpolation)
    okx &= (cx >= bx0) & (cx <= bx1)
    oky &= (cy >= by0) & (cy <= by1)
    # Read only the pixels the taps reach (fill where they leave the image).
    c0, r0 = int(tx.min()), int(ty.min())
    src = pad_crop(im, r0, c0, int(ty.max()) + 1 - r0, int(tx.max()) + 1 - c0, fill_values).to(torch.float32)
    tx, ty = tx - c0, ty - r0
    if transposed:  # output rows follow source x: filter the transposed source
        src, rows, cols = src.transpose(0, 1), (tx, wx, okx), (ty, wy, oky)
    else:
        rows, cols = (ty, wy, oky), (tx, wx, okx)
    # Filter first along the axis whose pass costs less.
    if rows[1].size * src.shape[1] <= cols[1].size * src.shape[0]:
        v = _filter_axis(_filter_axis(src, 0, *rows[:2]), 1, *cols[:2])
    else:
        v = _filter_axis(_filter_axis(src, 1, *cols[:2]), 0, *rows[:2])
    if rows[2].all() and cols[2].all():
        return v
    inside = torch.from_numpy(rows[2][:, None] & cols[2][None, :]).to(im.device)
    return torch.where(inside[..., None], v, fill)


def _resample_plain(im: torch.Tensor, st: _Setup, n: int, out_size: Size, interpolation: str,
                    fill_values: tuple[float, ...], fill: torch.Tensor) -> torch.Tensor:
    (m00, m01, m02), (m10, m11, m12) = st.matrix[n]
    x0, y0, x1, y1 = st.taps[n].tolist()
    bx0, by0, bx1, by1 = st.box[n]
    dev = im.device
    oy = (torch.arange(out_size[0], dtype=torch.float64, device=dev) + 0.5)[:, None]
    ox = (torch.arange(out_size[1], dtype=torch.float64, device=dev) + 0.5)[None, :]
    x = m00 * ox + m01 * oy + m02
    y = m10 * ox + m11 * oy + m12
    inside = (x >= bx0) & (x <= bx1) & (y >= by0) & (y <= by1)
    src = pad_crop(im, y0, x0, y1 - y0, x1 - x0, fill_values)  # a view unless the box leaves the image

    def at(yi: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
        return src[(yi - y0).clamp(0, y1 - y0 - 1), (xi - x0).clamp(0, x1 - x0 - 1)].to(torch.float32)

    if interpolation == "nearest":
        v = at(y.floor().long(), x.floor().long())
    else:
        fx, fy = x - 0.5, y - 0.5
        xf, yf = fx.floor(), fy.floor()
        tx, ty = (fx - xf)[..., None], (fy - yf)[..., None]
        xi, yi = xf.long(), yf.long()
        if interpolation == "bilinear":
            offsets, weights_x, weights_y = (0, 1), (1 - tx, tx), (1 - ty, ty)
        else:  # Keys cubic, a = -0.75 (torch's non-antialiased bicubic)
            offsets = (-1, 0, 1, 2)
            weights_x = [_keys(tx - d, -0.75) for d in offsets]
            weights_y = [_keys(ty - d, -0.75) for d in offsets]
        v = torch.zeros(*out_size, im.shape[2], dtype=torch.float64, device=dev)
        for dy, wy in zip(offsets, weights_y):
            for dx, wx in zip(offsets, weights_x):
                v += wy * wx * at(yi + dy, xi + dx)
        v = v.to(torch.float32)
    return torch.where(inside[..., None], v, fill)


