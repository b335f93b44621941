"""The composed warp: a run of geometry ops done as one batched resample, and the planner around it.

``compose`` multiplies the ops' per-sample matrices into one :class:`~ingest.ops.base.Warp`; ``warp`` executes
it, with an optional :class:`~ingest.ops.normalize.Normalize` fused into the output, by one of two
implementations of the same math:

* on CUDA with CuPy: one kernel launch for the whole batch, ragged or not (:mod:`ingest.ops._warp_kernel`);
* anywhere else: :func:`reference`, torch ops per sample.

The math, per output pixel (centre ``p``) of sample n: map ``q = matrix[n] @ p`` into the source. If ``q`` is
outside ``box[n]`` the pixel is ``fill``. Otherwise, when the matrix is axis-aligned (a crop/scale/flip,
possibly with a quarter turn) and ``antialias`` is set, it is the separable antialiasing filter of torch's
and PIL's resize: a triangle (bilinear) or Keys cubic a=-0.5 (bicubic) whose support grows with the scale
factor along each source axis, over the taps inside the box, weights normalized to sum 1. Otherwise it is
plain sampling at ``q``: nearest (the pixel containing ``q``), bilinear, or bicubic (Keys a=-0.75, torch's
non-antialiased bicubic), with taps clamped to the box. Taps inside the box but outside the image (a padded
crop) read ``fill``. Values are rounded to whole levels (as the eager path's uint8 images are) before the
optional ``x * a + b`` normalization.

The eager op-by-op path and the warp differ only where stated: rounding between steps (<= 1 level),
torchvision's soft fill blend along a rotated image's edges (the warp's edge is hard), and a downscale
followed by a rotation, which the warp samples without antialiasing.

Decoders may hand over images smaller than the probed size (JPEG DCT scaling by k/8) or cropped to the
warp's region of interest: :func:`rescaled` and ``Warp.shifted`` map the warp onto what arrived, so the
same drawn parameters apply (the antialias filter automatically narrows on a pre-shrunk source).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from ..errors import ConfigError
from . import _warp_kernel
from .base import Images, Op, Size, Warp, as_list, sizes_of
from .geometry import GeometryOp, pad_crop
from .normalize import Normalize


# --------------------------------------------------------------------------------------------------
# Building warps.

def _bbox(m: np.ndarray, region: np.ndarray) -> np.ndarray:
    """Bounding boxes (N, 4) of the rectangles ``region`` (N, 4) mapped by ``m`` (N, 3, 3)."""
    xs = region[:, [0, 2, 2, 0]]
    ys = region[:, [1, 1, 3, 3]]
    px = m[:, 0, 0, None] * xs + m[:, 0, 1, None] * ys + m[:, 0, 2, None]
    py = m[:, 1, 0, None] * xs + m[:, 1, 1, None] * ys + m[:, 1, 2, None]
    return np.stack([px.min(1), py.min(1), px.max(1), py.max(1)], axis=1)


def compose(ops: Sequence[GeometryOp], params: Sequence[Any], sizes: Sequence[Size]) -> Warp:
    """One Warp for ``ops`` (applied in order, each with its drawn params) on sources of ``sizes``.

    The box is the input region of the last op that resamples (its crop, if it has one, else its whole
    input) mapped to source coordinates; the whole source if no op resamples. It may reach past the source
    (a crop larger than the image pads): taps there read ``fill``, as the padded pixels they stand for.
    Interpolation and antialias come from that op ("nearest" if none: the warp then only moves whole
    pixels); fill from the last op that has one.
    """
    src = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    n = len(src)
    box = np.zeros((n, 4))
    box[:, 2], box[:, 3] = src[:, 1], src[:, 0]
    m = np.tile(np.eye(3), (n, 1, 1))
    cur = src
    resampler, fill = None, None
    for op, p in zip(ops, params):
        if not isinstance(op, GeometryOp):
            raise ConfigError(f"compose takes geometry ops only, got {op!r}")
        st = op._steps(cur, p)
        if st.resamples.any():
            region = st.crop if st.crop is not None else np.stack(
                [np.zeros(n), np.zeros(n), cur[:, 1], cur[:, 0]], axis=1).astype(np.float64)
            box = np.where(st.resamples[:, None], _bbox(m, region), box)
            resampler = op
        if op.fill is not None:
            fill = op.fill
        m = m @ st.matrix
        cur = st.out_sizes
    return Warp(m, [(int(h), int(w)) for h, w in cur], box,
                interpolation=resampler.interpolation if resampler else "nearest",
                antialias=resampler.antialias if resampler else False,
                fill=fill if fill is not None else (0.0,),
                source_sizes=[(int(h), int(w)) for h, w in src])


def identity(images: Images) -> Warp:
    """The warp that copies each image as it is (to run only the fused normalize)."""
    sizes = sizes_of(images)
    box = np.array([[0.0, 0.0, w, h] for h, w in sizes]).reshape(-1, 4)
    return Warp(np.tile(np.eye(3), (len(sizes), 1, 1)), list(sizes), box, "nearest", False, (0.0,),
                list(sizes))


def _dct_scale(probed: np.ndarray, arrived: np.ndarray) -> np.ndarray:
    """Per sample (sx, sy): k/8 where a JPEG decoder scaling by k/8 gives exactly ``arrived`` (it rounds the
    size up), else the plain size ratio per axis."""
    ratio = (arrived / np.maximum(probed, 1))[:, ::-1].astype(np.float64)
    for k in range(1, 9):
        exact = (np.ceil(probed * k / 8 - 1e-9) == arrived).all(axis=1)
        ratio[exact] = k / 8
    return ratio


def rescaled(w: Warp, sizes: Sequence[Size], scales: float | Sequence[float] | None = None) -> Warp:
    """``w`` for sources that arrived at ``sizes`` rather than ``w.source_sizes`` (decoder downscaling).

    A source pixel coordinate x becomes ``x * s``: the matrices are pre-multiplied by ``diag(sx, sy, 1)`` and
    the box scaled the same way. ``scales`` (one factor, or one per sample, decoded/probed) says what the
    decoder did; left out, it is inferred from the sizes (k/8 when they match a JPEG DCT scaling exactly).
    """
    arrived = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    if scales is None:
        s = _dct_scale(np.asarray(w.source_sizes, dtype=np.int64).reshape(-1, 2), arrived)
    else:
        s = np.repeat(np.broadcast_to(np.asarray(scales, dtype=np.float64), (len(arrived),))[:, None], 2, 1)
    m = w.matrix.copy()
    m[:, 0, :] *= s[:, :1]
    m[:, 1, :] *= s[:, 1:]
    box = w.box * np.concatenate([s, s], axis=1)
    return Warp(m, list(w.out_sizes), box, w.interpolation, w.antialias, w.fill,
                [(int(h), int(wd)) for h, wd in arrived])


# --------------------------------------------------------------------------------------------------
# Executing warps.

class _Setup(NamedTuple):
    """What both implementations need per sample, derived once from a Warp and the actual source sizes."""

    matrix: np.ndarray     # (N, 2, 3)
    box: np.ndarray        # (N, 4) float64 x0 y0 x1 y1: points outside take fill
    taps: np.ndarray       # (N, 4) int64 x0 y0 x1 y1 (end exclusive): pixels the filter may read (those
                           # outside the image read fill)
    aa: np.ndarray         # (N,) bool: separable antialiasing filter (else plain sampling)
    support: np.ndarray    # (N, 2) filter half-width along source x, y, in source pixels
    inv_scale: np.ndarray  # (N, 2) 1 / max(1, source pixels per output pixel) along x, y


def _setup(w: Warp, sizes: Sequence[Size]) -> _Setup:
    hw = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    if w.matrix.shape != (len(hw), 3, 3) or len(w.out_sizes) != len(hw) or w.box.shape != (len(hw), 4):
        raise ValueError(f"the warp is for {len(w.out_sizes)} samples, the batch has {len(hw)}")
    if w.interpolation not in ("nearest", "bilinear", "bicubic"):
        raise ConfigError(f"Unknown interpolation {w.interpolation!r}. Available: bicubic, bilinear, nearest")
    eps = 1e-6
    taps = np.empty((len(hw), 4), dtype=np.int64)
    taps[:, :2] = np.floor(w.box[:, :2] + eps)
    taps[:, 2:] = np.ceil(w.box[:, 2:] - eps)
    a = np.abs(w.matrix[:, :2, :2])
    tiny = 1e-9
    aligned = ((a[:, 0, 1] < tiny) & (a[:, 1, 0] < tiny)) | ((a[:, 0, 0] < tiny) & (a[:, 1, 1] < tiny))
    aa = aligned & bool(w.antialias) & (w.interpolation != "nearest")
    scale = np.maximum(a.sum(axis=2), 1.0)  # source pixels per output pixel, along source x and y
    support = scale * (2.0 if w.interpolation == "bicubic" else 1.0)
    return _Setup(w.matrix[:, :2, :].copy(), w.box.astype(np.float64), taps, aa, support, 1.0 / scale)


def _fill_values(fill: Sequence[float], channels: int) -> tuple[float, ...]:
    """``fill`` per channel, in whole levels (what a padded uint8 image holds)."""
    if len(fill) == channels:
        return tuple(float(round(v)) for v in fill)
    if len(set(fill)) == 1:
        return (float(round(fill[0])),) * channels
    raise ConfigError(f"`fill` has {len(fill)} values for images of {channels} channels")


def warp(images: Images, w: Warp, *, normalize: Normalize | None = None) -> Images:
    """Resample every image of the batch by ``w``; normalize the result if ``normalize`` is given.

    Returns ``[N, H, W, C]`` uint8 (or ``normalize``'s dtype and layout) when all outputs share a size, else
    a list. On CUDA with CuPy this is one kernel launch on the current torch stream; otherwise
    :func:`reference`.
    """
    ims = as_list(images)
    if not ims:
        return images
    first = ims[0]
    if any(im.dim() != 3 or im.dtype != torch.uint8 or im.device != first.device
           or im.shape[2] != first.shape[2] for im in ims):
        raise ValueError("warp takes [H, W, C] uint8 images with one channel count, all on one device")
    setup = _setup(w, sizes_of(ims))
    fill = _fill_values(w.fill, first.shape[2])
    if first.device.type == "cuda" and first.shape[2] <= 4 and _warp_kernel.available():
        return _warp_kernel.launch(ims, w.out_sizes, setup, w.interpolation, fill,
                                   normalize.coefficients(first.shape[2]) if normalize else None,
                                   normalize.dtype if normalize else torch.uint8,
                                   normalize is not None and normalize.layout == "NCHW")
    return _reference(ims, w, setup, fill, normalize)


def reference(images: Images, w: Warp, *, normalize: Normalize | None = None) -> Images:
    """The torch implementation of :func:`warp` (any device, one sample at a time): the executable spec
    that the CUDA kernel is tested against, and the CPU path for sources that are not the planned size."""
    ims = as_list(images)
    if not ims:
        return images
    return _reference(ims, w, _setup(w, sizes_of(ims)), _fill_values(w.fill, ims[0].shape[2]), normalize)


def _reference(ims: list[torch.Tensor], w: Warp, setup: _Setup, fill_values: tuple[float, ...],
               normalize: Normalize | None) -> Images:
    fill = torch.tensor(fill_values, dtype=torch.float32, device=ims[0].device)
    outs = []
    for n, im in enumerate(ims):
        resample = _resample_aa if setup.aa[n] else _resample_plain
        outs.append(resample(im, setup, n, w.out_sizes[n], w.interpolation, fill_values, fill)
                    .clamp_(0, 255).round_())
    if all(o.shape == outs[0].shape for o in outs):
        batch = torch.stack(outs)
        return normalize.finish(batch) if normalize else batch.to(torch.uint8)
    if normalize:
        return [normalize.finish(o[None])[0] for o in outs]
    return [o.to(torch.uint8) for o in outs]


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
    x0, y0, x1, y1 = (int(v) for v in st.taps[n])
    bx0, by0, bx1, by1 = st.box[n]
    if x1 <= x0 or y1 <= y0:
        return fill.expand(oh, ow, -1).clone()
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
    oh, ow = out_size
    x0, y0, x1, y1 = (int(v) for v in st.taps[n])
    bx0, by0, bx1, by1 = st.box[n]
    dev = im.device
    oy = (torch.arange(oh, dtype=torch.float64, device=dev) + 0.5)[:, None]
    ox = (torch.arange(ow, dtype=torch.float64, device=dev) + 0.5)[None, :]
    x = m00 * ox + m01 * oy + m02
    y = m10 * ox + m11 * oy + m12
    inside = (x >= bx0) & (x <= bx1) & (y >= by0) & (y <= by1)
    if x1 <= x0 or y1 <= y0:
        return fill.expand(oh, ow, -1).clone()

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
        v = torch.zeros(oh, ow, im.shape[2], dtype=torch.float64, device=dev)
        for dy, wy in zip(offsets, weights_y):
            for dx, wx in zip(offsets, weights_x):
                v += wy * wx * at(yi + dy, xi + dx)
        v = v.to(torch.float32)
    return torch.where(inside[..., None], v, fill)


# --------------------------------------------------------------------------------------------------
# Planning: draw once, then execute on whichever device.

@dataclass
class Plan:
    """A batch's ops with every random parameter drawn, split for execution.

    ``warp`` is the leading run of geometry ops composed (None if the ops do not start with one); the
    executor can read ``warp.roi()`` before decoding to ask for region-of-interest decode.
    ``fused_normalize`` is a Normalize directly after that run, done in the warp's epilogue. ``rest`` is every
    later op with its params, run op by op.
    """

    sizes: list[Size]                     # the source sizes the params were drawn for
    geometry: list[tuple[GeometryOp, Any]]
    warp: Warp | None
    fused_normalize: Normalize | None
    rest: list[tuple[Op, Any]]
    out_sizes: list[Size]                 # sizes of the final images

    def execute(self, images: Images, origins: Sequence[tuple[int, int]] | None = None,
                scales: float | Sequence[float] | None = None) -> Images:
        """Run the plan on the decoded batch.

        ``origins`` = (x0, y0) per sample when the decoder returned only a region of each source (from
        ``warp.roi()``); ``scales`` = decoded/probed size factor when it also downscaled (inferred from the
        sizes when neither is given). On CPU, images of the planned sizes run op by op eagerly
        (torchvision-exact); anything else runs the composed warp.
        """
        images = self._geometry(images, origins, scales)
        for op, p in self.rest:
            images = op.apply(images, p)
        return images

    def _geometry(self, images: Images, origins, scales) -> Images:
        if self.warp is None:
            return images
        ims = as_list(images)
        if not ims:
            return images
        sizes = sizes_of(images)
        if ims[0].device.type == "cpu" and origins is None and scales is None and sizes == self.sizes:
            for op, p in self.geometry:
                images = op.apply(images, p)
            return self.fused_normalize.apply(images) if self.fused_normalize else images
        w = self.warp
        if origins is not None:
            w = rescaled(w.shifted(origins), sizes, 1.0 if scales is None else scales)
        elif scales is not None or sizes != self.sizes:
            w = rescaled(w, sizes, scales)
        return warp(images, w, normalize=self.fused_normalize)


def plan(ops: Sequence[Op], sizes: Sequence[Size], rng: np.random.Generator) -> Plan:
    """Draw every op's params in op order, once, for sources of ``sizes``; compose the leading geometry run."""
    sizes = [(int(h), int(w)) for h, w in sizes]
    drawn: list[tuple[Op, Any]] = []
    cur = sizes
    for op in ops:
        p = op.draw(cur, rng)
        drawn.append((op, p))
        cur = op.out_sizes(cur, p)
    k = 0
    while k < len(drawn) and isinstance(drawn[k][0], GeometryOp):
        k += 1
    geometry = drawn[:k]
    w = compose([o for o, _ in geometry], [p for _, p in geometry], sizes) if k else None
    fused = drawn[k][0] if k and k < len(drawn) and isinstance(drawn[k][0], Normalize) else None
    rest = drawn[k + (fused is not None):]
    return Plan(sizes, geometry, w, fused, rest, list(cur))


def run_ops(ops: Sequence[Op], images: Images, rng: np.random.Generator, *, device_kind: str = "cpu") -> Images:
    """Plan and execute ``ops`` on a batch, on ``device_kind`` ("cpu" or "cuda"; images are moved there).
    Returns ``[N, ...]`` when the outputs share a size, else a list."""
    if device_kind not in ("cpu", "cuda"):
        raise ConfigError(f"Unknown device_kind {device_kind!r}. Available: cpu, cuda")
    ims = as_list(images)
    if ims and ims[0].device.type != device_kind:
        images = (images.to(device_kind, non_blocking=True) if isinstance(images, torch.Tensor)
                  else [im.to(device_kind, non_blocking=True) for im in ims])
    return plan(ops, sizes_of(images), rng).execute(images)
