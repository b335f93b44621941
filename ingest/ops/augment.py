"""The augmentations of modern ImageNet recipes: the automatic policies (RandAugment, TrivialAugmentWide,
AutoAugment), RandomErasing, GaussianBlur, RandomGrayscale and RandomAffine.

Every op draws each sample's parameters from that sample's stream (`ingest.random.SampleRandom`: so a
sample's augmentation does not depend on its batch, the batch size, shards or a resume) and executes a
whole batch with the primitives of :mod:`ingest.ops.functional`, which equal torchvision's.

**Policies** draw what torchvision's ``transforms.v2`` draws, with its distributions: RandAugment ``num_ops``
times an op uniformly from its 14 and a sign coin (magnitude fixed by ``magnitude``); TrivialAugmentWide an op,
a magnitude bin uniformly from ``num_magnitude_bins`` and a sign; AutoAugment one of the 25 sub-policies, then
each of its two ops with its probability, and a sign. The ops then run in that order per sample, batched,
one round after the other. The host plans every round from the draws (each sample's op and its numbers: a
matrix, factors, a mask) and sends the plan to the device in one copy; nothing waits for the device.

A uint8 RGB batch on CUDA, where CuPy is there, runs each round as the policy's own kernels
(:mod:`ingest.ops._policy_kernel`): one launch for the per-sample statistics the round's ops read (the luma mean
of Contrast, the channel extremes of AutoContrast, the channel histograms and tables of Equalize), only when a
sample drew one of those, and one launch that writes every sample's op (geometry as one affine resample,
nearest or bilinear with the policy's fill; the colour ops; sharpness; autocontrast; equalize; or a copy) into a
new batch. So a round costs at most two launches, whatever was drawn, and the batch is read and written about
once per round. Their arithmetic is the torch path's float32 steps in the same order (exact for the colour ops,
the geometry within a level but for a rare nearest-neighbour tie). Elsewhere (CPU, or CUDA without CuPy) a
round runs at most five groups of torch calls, each over the samples that drew one of its ops: the geometry
ops (shear, translate, rotate: one per-sample affine resample), the pointwise ones (brightness, colour,
contrast, posterize, solarize, invert: one pass), sharpness, autocontrast and equalize (per-sample histograms
by one ``scatter_add``, the tables applied by one ``gather``): a fixed number of torch calls (about 70 per round
at most), whatever the batch size. That path is the readable reference the kernels are tested against. Gray
and float batches run op by op on the same groups. Unlike torchvision, each *sample* draws its own ops
(torchvision draws once per call, i.e. per image when it runs per sample in a DataLoader worker: the same
distribution).

A policy mixes geometry and colour per sample, in order, so it is a stage of its own rather than part of
the fused warp; :class:`RandomAffine` is a geometry op and folds into the warp of the geometry around it
(boxes and masks follow it). The policies take images (not boxes): use RandomAffine for detection.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from ..errors import ConfigError
from . import _policy_kernel
from . import functional as F
from .affine import Steps, eye
from .base import Images, Op, Rngs, Size, as_list, per_sample, probability, size_array, sizes_of
from .geometry import GeometryOp, _fill, _range

# --------------------------------------------------------------------------------------------------
# Running a batch function over a ragged or fixed batch of [H, W, C] images.


def on_batches(images: Images, fn) -> Images:
    """``fn(x, rows)`` on the batch as ``[n, C, H, W]`` views (``rows``: which samples, an int64 array),
    returning ``[n, C, H, W]``; the result in the ops' working form (``[N, H, W, C]``, or a list for a
    ragged batch). A ragged batch runs once per distinct image size."""
    if isinstance(images, torch.Tensor):
        if not len(images):
            return images
        out = fn(images.permute(0, 3, 1, 2), np.arange(len(images)))
        return out.permute(0, 2, 3, 1).contiguous()
    ims = as_list(images)
    if not ims:
        return images
    hw = size_array(sizes_of(ims))
    keys = hw[:, 0] * (1 << 32) + hw[:, 1]
    out: list[Any] = [None] * len(ims)
    for key in np.unique(keys):
        rows = np.flatnonzero(keys == key)
        x = torch.stack([ims[k] for k in rows.tolist()]).permute(0, 3, 1, 2)
        for k, im in zip(rows.tolist(), fn(x, rows).permute(0, 2, 3, 1).contiguous().unbind(0)):
            out[k] = im
    return out


class _Rows:
    """A batch ``[n, C, H, W]`` that ops change on subsets of its samples, in place of a private copy."""

    def __init__(self, x: torch.Tensor):
        self.x, self.owned = x, False

    def update(self, rows: np.ndarray | torch.Tensor | None, fn) -> None:
        """Samples ``rows`` of the batch (host indices, int64 indices on the batch's device, or None: all)
        replaced by ``fn(those samples)``."""
        if rows is None or (isinstance(rows, np.ndarray) and len(rows) == len(self.x)):
            self.x, self.owned = fn(self.x), True
            return
        if not len(rows):
            return
        idx = F.upload([rows.astype(np.int64)], self.x.device)[0] if isinstance(rows, np.ndarray) else rows
        out = fn(self.x.index_select(0, idx))
        if not self.owned:
            self.x, self.owned = self.x.clone(), True
        self.x.index_copy_(0, idx, out.to(self.x.dtype))


# --------------------------------------------------------------------------------------------------
# Policies

#: Every op a policy can draw, by number.
NAMES = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
         "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")
OP = {name: k for k, name in enumerate(NAMES)}
_GEOMETRY = np.array([OP[n] for n in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")])
_SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness"}


def _linspace(end: float, bins: int) -> np.ndarray:
    return torch.linspace(0.0, end, bins).double().numpy()   # float32 values, as torchvision's tables


def _posterize_bits(bins: int, spread: int) -> np.ndarray:
    return (8 - (torch.arange(bins) / ((bins - 1) / spread))).round().int().double().numpy()


def _space(kind: str, bins: int) -> dict[str, Any]:
    """A policy's magnitude table per op, torchvision's: an array of ``bins`` values, a function of the image
    (height, width) giving one (translations), or None (no magnitude)."""
    if kind == "wide":   # TrivialAugmentWide
        return {"Identity": None, "ShearX": _linspace(0.99, bins), "ShearY": _linspace(0.99, bins),
                "TranslateX": _linspace(32.0, bins), "TranslateY": _linspace(32.0, bins),
                "Rotate": _linspace(135.0, bins), "Brightness": _linspace(0.99, bins),
                "Color": _linspace(0.99, bins), "Contrast": _linspace(0.99, bins),
                "Sharpness": _linspace(0.99, bins), "Posterize": _posterize_bits(bins, 6),
                "Solarize": torch.linspace(1.0, 0.0, bins).double().numpy(), "AutoContrast": None, "Equalize": None}
    space = {"Identity": None, "ShearX": _linspace(0.3, bins), "ShearY": _linspace(0.3, bins),
             "TranslateX": lambda h, w: _linspace(150.0 / 331.0 * w, bins),
             "TranslateY": lambda h, w: _linspace(150.0 / 331.0 * h, bins),
             "Rotate": _linspace(30.0, bins), "Brightness": _linspace(0.9, bins), "Color": _linspace(0.9, bins),
             "Contrast": _linspace(0.9, bins), "Sharpness": _linspace(0.9, bins),
             "Posterize": _posterize_bits(bins, 4), "Solarize": torch.linspace(1.0, 0.0, bins).double().numpy(),
             "AutoContrast": None, "Equalize": None}
    if kind == "auto":   # AutoAugment: no Identity, an Invert
        del space["Identity"]
        space["Invert"] = None
    return space


def _magnitudes(space: dict[str, Any], ops: np.ndarray, bins: np.ndarray, negative: np.ndarray,
                hw: np.ndarray) -> np.ndarray:
    """Per sample and round, the magnitude of the drawn op (``ops`` global numbers) at bin ``bins``, negated
    where ``negative`` for signed ops; 0 for ops without one. A loop over the ops, not the samples."""
    out = np.zeros(ops.shape)
    for name, table in space.items():
        sel = ops == OP[name]
        if table is None or not sel.any():
            continue
        if callable(table):   # depends on the image size: one table per distinct size
            rows, cols = np.nonzero(sel)
            sizes = hw[rows]
            for size in np.unique(sizes, axis=0):
                same = (sizes == size).all(axis=1)
                out[rows[same], cols[same]] = table(*size.tolist())[bins[rows[same], cols[same]]]
        else:
            out[sel] = table[bins[sel]]
        if name in _SIGNED:
            out[sel & negative] *= -1
    return out


class PolicyParams(NamedTuple):
    """Per sample and round (``[N, R]``): the op drawn (a number of :data:`NAMES`; Identity where none runs)
    and its magnitude (signed)."""

    ops: np.ndarray
    magnitudes: np.ndarray


def _policy_theta(ops: np.ndarray, m: np.ndarray, h: int, w: int) -> np.ndarray:
    """torchvision's inverse maps (relative to the centres) of the geometry ops ``ops`` with magnitudes ``m``
    on ``h`` x ``w`` images: shears about the top-left corner, translations by whole pixels (truncated), rotations
    counter-clockwise about the centre."""
    shear = np.zeros((len(ops), 2))
    shear[:, 0] = np.where(ops == OP["ShearX"], np.degrees(np.arctan(m)), 0.0)
    shear[:, 1] = np.where(ops == OP["ShearY"], np.degrees(np.arctan(m)), 0.0)
    translate = np.zeros((len(ops), 2))
    translate[:, 0] = np.where(ops == OP["TranslateX"], np.trunc(m), 0.0)
    translate[:, 1] = np.where(ops == OP["TranslateY"], np.trunc(m), 0.0)
    angle = np.where(ops == OP["Rotate"], -m, 0.0)
    corner = (ops == OP["ShearX"]) | (ops == OP["ShearY"])
    center = np.where(corner[:, None], np.array([[-w * 0.5, -h * 0.5]]), 0.0)
    return F.inverse_affine_matrices(angle, translate, 1.0, shear, center)


def _colour(name: str, x: torch.Tensor, m: np.ndarray) -> torch.Tensor:
    """The colour op ``name`` with magnitudes ``m`` (one per sample of ``x``), as torchvision's policies call it."""
    if name == "Brightness":
        return F.adjust_brightness(x, 1.0 + m)
    if name == "Color":
        return F.adjust_saturation(x, 1.0 + m)
    if name == "Contrast":
        return F.adjust_contrast(x, 1.0 + m)
    if name == "Sharpness":
        return F.adjust_sharpness(x, 1.0 + m)
    if name == "Posterize":
        return F.posterize(x, m.astype(np.int64))
    if name == "Solarize":
        return F.solarize(x, (1.0 if x.is_floating_point() else 255.0) * m)
    if name == "AutoContrast":
        return F.autocontrast(x)
    if name == "Equalize":
        return F.equalize(x)
    return F.invert(x)


#: The ops :func:`_pointwise` runs together.
_POINTWISE = np.array([OP[n] for n in ("Brightness", "Color", "Contrast", "Posterize", "Solarize", "Invert")])


def _pointwise_arguments(ops: np.ndarray, m: np.ndarray) -> tuple[list[np.ndarray], tuple[bool, bool, bool]]:
    """What :func:`_pointwise` takes for samples drawing ``ops`` with magnitudes ``m``, on the host: ``[n, 3]``
    float32 (the factor ``a``, ``b = 1 - a`` for Color and Contrast, the solarize threshold), ``[n]`` bool
    (Contrast), ``[n]`` uint8 (the posterize mask); and which of the blend, mask and inversion steps any sample
    needs."""
    blend = np.isin(ops, [OP["Brightness"], OP["Color"], OP["Contrast"]])
    a = np.where(blend, 1.0 + m, 1.0)
    b = np.where(blend & (ops != OP["Brightness"]), -m, 0.0)   # 1 - a, taken in float64 as torchvision does
    bits = np.where(ops == OP["Posterize"], m, 8).astype(np.int64)
    mask = np.where(bits >= 8, 255, (255 << (8 - np.minimum(bits, 8))) & 255)
    threshold = np.where(ops == OP["Solarize"], 255.0 * m, np.where(ops == OP["Invert"], 0.0, 256.0))
    arrays = [np.stack([a, b, threshold], axis=1).astype(np.float32), ops == OP["Contrast"], mask.astype(np.uint8)]
    return arrays, (bool((b != 0).any()), bool((mask != 255).any()), bool((threshold <= 255).any()))


def _pointwise(x: torch.Tensor, sent: Sequence[torch.Tensor], steps: tuple[bool, bool, bool]) -> torch.Tensor:
    """Brightness, Color, Contrast, Posterize, Solarize and Invert on uint8 RGB ``x``, each sample its own op
    and magnitude (:func:`_pointwise_arguments`' arrays, on ``x``'s device), in one pass of a dozen torch calls:
    ``trunc(clamp(x * a + g * (1 - a)))`` with ``g`` the luma (Color) or its mean (Contrast) and ``a = 1`` for
    the other ops, then ``& mask`` (Posterize; 255 for the others), then inversion at or above a threshold
    (Solarize; 0 for Invert, 256 for the others). The same float32 operations as torchvision's, so the same
    results (``mul`` then ``addcmul`` is its ``add(alpha=)``)."""
    params, contrast, mask = sent
    blend, masked, inverted = steps
    a_t, b_t, thr = (params[:, k].view(-1, 1, 1, 1) for k in range(3))
    out = x.mul(a_t)   # uint8 times float32: float32, as torchvision's float copy times the factor
    if blend:
        r, g, bl = x.unbind(dim=1)
        gray = r.mul(0.2989).add_(g, alpha=0.587).add_(bl, alpha=0.114).floor_().unsqueeze(1)
        other = torch.where(contrast.view(-1, 1, 1, 1), gray.mean(dim=(-3, -2, -1), keepdim=True), gray)
        out = out.addcmul_(other, b_t)
    out = out.clamp_(0, 255).to(torch.uint8)
    if masked:
        out = out & mask.view(-1, 1, 1, 1)
    if inverted:
        out = torch.where(out >= thr, out.bitwise_not(), out)
    return out


def _sharpness_factors(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sharpness's factor ``1 + m`` and one minus it, float32, the latter taken in float64 before the cast
    (torchvision's ``_blend``)."""
    f = 1.0 + m
    return f.astype(np.float32), (1.0 - f).astype(np.float32)


def _interpolation(value: Any) -> str:
    if value not in ("nearest", "bilinear"):
        raise ConfigError(f"Unknown interpolation {value!r}. Available: bilinear, nearest")
    return value


class _Policy(Op):
    """Runs drawn :class:`PolicyParams` on a batch (see the module docstring)."""

    pixel_channels = (1, 3)   # its colour operations are RGB's or gray's

    interpolation: str = "nearest"
    fill: tuple[float, ...] | None = None
    #: Its shears, translations and rotations have no map for boxes and masks: refused on a source with boxes.
    follows_boxes = False

    def _setup(self, interpolation: str, fill: Any) -> None:
        self.interpolation = _interpolation(interpolation)
        self.fill = None if fill is None else _fill(fill)

    def apply(self, images: Images, params: PolicyParams) -> Images:
        ops, mags = params
        if not len(images) or not (ops != OP["Identity"]).any():
            return images
        return on_batches(images, lambda x, rows: self._run(x, ops[rows], mags[rows]))

    def _run(self, x: torch.Tensor, ops: np.ndarray, mags: np.ndarray) -> torch.Tensor:
        if x.shape[1] not in (1, 3):
            raise ValueError(f"{type(self).__name__} needs images of 1 or 3 channels, got {x.shape[1]}")
        if x.shape[1] != 3 or x.dtype != torch.uint8:
            return self._run_each(x, ops, mags)
        if x.is_cuda and x.numel() and _policy_kernel.available():
            return self._run_fused(x, ops, mags)
        return self._run_groups(x, ops, mags)

    def _run_fused(self, x: torch.Tensor, ops: np.ndarray, mags: np.ndarray) -> torch.Tensor:
        """A uint8 RGB batch through the policy kernels (:mod:`ingest.ops._policy_kernel`): per round that runs an
        op, a statistics launch where some sample needs one, then one launch of every sample's op."""
        rows = self._kernel_rows(ops, mags, x.shape[-2:])
        active = (rows[..., 0] != _policy_kernel.KINDS["copy"]).any(axis=1)
        needs = (rows[..., 3] != 0).any(axis=1)
        prm = F.upload([rows], x.device)[0]   # every round's parameters: one copy to the device
        stats = torch.empty((len(x), _policy_kernel.STATS), dtype=torch.int32, device=x.device) \
            if needs.any() else None
        fill = None if self.fill is None else F._fill_values(list(self.fill), 3)
        for r in np.flatnonzero(active).tolist():
            x = _policy_kernel.run_round(x, prm[r], stats if needs[r] else None, self.interpolation, fill)
        return x

    def _kernel_rows(self, ops: np.ndarray, mags: np.ndarray, size: Sequence[int]) -> np.ndarray:
        """The policy kernels' parameters, ``[R, N, ROW]`` int32 (layout in :mod:`ingest.ops._policy_kernel`):
        the numbers :meth:`_steps` plans for the torch path, per sample."""
        kinds = _policy_kernel.KINDS
        rows = np.zeros((ops.shape[1], len(ops), _policy_kernel.ROW), dtype=np.int32)
        floats = rows[..., 4:].view(np.float32)
        for r in range(ops.shape[1]):
            col, m, row, fl = ops[:, r], mags[:, r], rows[r], floats[r]
            sel = np.isin(col, _GEOMETRY)
            if sel.any():
                theta = _policy_theta(col[sel], m[sel], *size)
                row[sel, 0] = kinds["warp"]
                fl[sel, :6] = F.warp_arguments(theta, size, None, torch.float32)[0].reshape(-1, 6)
            sel = np.isin(col, _POINTWISE)
            if sel.any():
                (params, contrast, mask), _ = _pointwise_arguments(col[sel], m[sel])
                row[sel, 0] = kinds["pointwise"]
                row[sel, 1] = np.where(contrast, 2, np.where(col[sel] == OP["Color"], 1, 0))
                row[sel, 2], row[sel, 3] = mask, contrast
                fl[sel, :3] = params
            sel = col == OP["Sharpness"]
            if sel.any():
                row[sel, 0] = kinds["Sharpness"]
                fl[sel, 0], fl[sel, 1] = _sharpness_factors(m[sel])
            for name, need in (("AutoContrast", 2), ("Equalize", 4)):
                sel = col == OP[name]
                row[sel, 0], row[sel, 3] = kinds[name], need
        return rows

    def _run_groups(self, x: torch.Tensor, ops: np.ndarray, mags: np.ndarray) -> torch.Tensor:
        """A uint8 RGB batch by torch calls: per round, each group of :meth:`_steps` on its samples."""
        steps, arrays = self._steps(ops, mags, x.shape[-2:])
        sent = iter(F.upload(arrays, x.device))   # every parameter of every round: one copy to the device
        batch = _Rows(x)
        for kind, rows, k, extra in steps:
            idx = None if rows is None else next(sent)
            params = [next(sent) for _ in range(k)]
            if kind == "warp":
                batch.update(idx, lambda s: F.warp_sent(s, params, self.interpolation))
            elif kind == "pointwise":
                batch.update(idx, lambda s: _pointwise(s, params, extra))
            elif kind == "Sharpness":
                batch.update(idx, lambda s: F._sharpen(s, params[0], params[1]))
            else:
                batch.update(idx, F.autocontrast if kind == "AutoContrast" else F.equalize)
        return batch.x

    def _steps(self, ops: np.ndarray, mags: np.ndarray, size: Sequence[int]) -> tuple[list[tuple], list[np.ndarray]]:
        """A uint8 RGB batch's work, planned on the host: per round the groups of samples that drew the geometry
        ops, the pointwise ops, Sharpness, AutoContrast and Equalize, each ``(kind, rows or None for all, how
        many parameter arrays, extra)``, and the arrays (each group's rows, then its parameters) to upload."""
        n = len(ops)
        steps: list[tuple] = []
        arrays: list[np.ndarray] = []
        fill = None if self.fill is None else F._fill_values(list(self.fill), 3)

        def add(kind: str, rows: np.ndarray, params: list[np.ndarray], extra: Any = None) -> None:
            whole = len(rows) == n
            if not whole:
                arrays.append(rows.astype(np.int64))
            arrays.extend(params)
            steps.append((kind, None if whole else rows, len(params), extra))

        for r in range(ops.shape[1]):
            col, m = ops[:, r], mags[:, r]
            rows = np.flatnonzero(np.isin(col, _GEOMETRY))
            if len(rows):
                theta = _policy_theta(col[rows], m[rows], *size)
                add("warp", rows, F.warp_arguments(theta, size, fill, torch.float32))
            rows = np.flatnonzero(np.isin(col, _POINTWISE))
            if len(rows):
                add("pointwise", rows, *_pointwise_arguments(col[rows], m[rows]))
            rows = np.flatnonzero(col == OP["Sharpness"])
            if len(rows):
                add("Sharpness", rows, [f.reshape(-1, 1, 1, 1) for f in _sharpness_factors(m[rows])])
            for name in ("AutoContrast", "Equalize"):
                rows = np.flatnonzero(col == OP[name])
                if len(rows):
                    add(name, rows, [])
        return steps, arrays

    def _run_each(self, x: torch.Tensor, ops: np.ndarray, mags: np.ndarray) -> torch.Tensor:
        """Gray or float batches: per round, each op drawn on the samples that drew it."""
        h, w = x.shape[-2:]
        batch = _Rows(x)
        for r in range(ops.shape[1]):
            col, m = ops[:, r], mags[:, r]
            rows = np.flatnonzero(np.isin(col, _GEOMETRY))
            if len(rows):
                theta = _policy_theta(col[rows], m[rows], h, w)
                batch.update(rows, lambda s: F.warp_batch(s, theta, self.interpolation, self.fill))
            for k in np.unique(col).tolist():
                name = NAMES[k]
                if name == "Identity" or k in _GEOMETRY:
                    continue
                rows = np.flatnonzero(col == k)
                batch.update(rows, lambda s: _colour(name, s, m[rows]))
        return batch.x


def _int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low or (
            high is not None and value > high):
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        raise ConfigError(f"`{name}` must be an int {bound}, got {value!r}")
    return int(value)


class RandAugment(_Policy):
    """torchvision's ``RandAugment(num_ops, magnitude, num_magnitude_bins)``: ``num_ops`` times per sample, one
    of 14 ops drawn uniformly (Identity, ShearX/Y, TranslateX/Y, Rotate, Brightness, Color, Contrast, Sharpness,
    Posterize, Solarize, AutoContrast, Equalize) at bin ``magnitude`` of its table, signed ops negated with
    probability 0.5. ``interpolation`` ("nearest" or "bilinear") and ``fill`` (None: zeros without torchvision's
    fill blend; or pixel units) for the geometry ops. Params: :class:`PolicyParams`."""

    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31, *,
                 interpolation: str = "nearest", fill: float | Sequence[float] | None = None):
        self.num_magnitude_bins = _int("num_magnitude_bins", num_magnitude_bins, 2)
        self.num_ops = _int("num_ops", num_ops, 0)
        self.magnitude = _int("magnitude", magnitude, 0, self.num_magnitude_bins - 1)
        self._setup(interpolation, fill)
        self._space = _space("rand", self.num_magnitude_bins)
        self._ops = np.array([OP[n] for n in self._space])

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> PolicyParams:
        hw = size_array(sizes)
        u = per_sample(rngs, len(hw)).random(2 * self.num_ops)   # per round: the op, the sign
        pick = np.minimum((u[:, 0::2] * len(self._ops)).astype(np.int64), len(self._ops) - 1)
        ops = self._ops[pick]
        bins = np.full(ops.shape, self.magnitude)
        return PolicyParams(ops, _magnitudes(self._space, ops, bins, u[:, 1::2] <= 0.5, hw))


class TrivialAugmentWide(_Policy):
    """torchvision's ``TrivialAugmentWide(num_magnitude_bins)``: per sample one of 14 ops drawn uniformly, its
    magnitude bin uniformly from ``num_magnitude_bins``, signed ops negated with probability 0.5 (the wide
    tables: shear 0.99, translate 32 px, rotate 135 degrees, ...). ``interpolation`` and ``fill`` as
    :class:`RandAugment`'s. Params: :class:`PolicyParams`."""

    def __init__(self, num_magnitude_bins: int = 31, *, interpolation: str = "nearest",
                 fill: float | Sequence[float] | None = None):
        self.num_magnitude_bins = _int("num_magnitude_bins", num_magnitude_bins, 2)
        self._setup(interpolation, fill)
        self._space = _space("wide", self.num_magnitude_bins)
        self._ops = np.array([OP[n] for n in self._space])

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> PolicyParams:
        hw = size_array(sizes)
        u = per_sample(rngs, len(hw)).random(3)   # the op, the bin, the sign
        ops = self._ops[np.minimum((u[:, 0] * len(self._ops)).astype(np.int64), len(self._ops) - 1)][:, None]
        bins = np.minimum((u[:, 1] * self.num_magnitude_bins).astype(np.int64), self.num_magnitude_bins - 1)
        return PolicyParams(ops, _magnitudes(self._space, ops, bins[:, None], (u[:, 2] <= 0.5)[:, None], hw))


#: torchvision's ImageNet AutoAugment policy: 25 sub-policies of two (op, probability, magnitude bin).
IMAGENET_POLICY = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)), (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)), (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)), (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)), (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)
POLICIES = {"imagenet": IMAGENET_POLICY}


class AutoAugment(_Policy):
    """torchvision's ``AutoAugment(policy)`` (``"imagenet"``): per sample one of the policy's 25 sub-policies
    drawn uniformly; each of its two ops runs with its probability, at its magnitude bin of 10, signed ops
    negated with probability 0.5. ``interpolation`` and ``fill`` as :class:`RandAugment`'s.
    Params: :class:`PolicyParams`."""

    def __init__(self, policy: str = "imagenet", *, interpolation: str = "nearest",
                 fill: float | Sequence[float] | None = None):
        name = getattr(policy, "value", policy)   # torchvision's AutoAugmentPolicy.IMAGENET too
        if name not in POLICIES:
            raise ConfigError(f"Unknown AutoAugment policy {policy!r}. Available: {', '.join(POLICIES)}")
        self.policy = name
        self._setup(interpolation, fill)
        self._space = _space("auto", 10)
        table = POLICIES[name]
        self._ops = np.array([[OP[op] for op, _, _ in sub] for sub in table])
        self._p = np.array([[p for _, p, _ in sub] for sub in table])
        self._bins = np.array([[b or 0 for _, _, b in sub] for sub in table])

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> PolicyParams:
        hw = size_array(sizes)
        u = per_sample(rngs, len(hw)).random(5)   # the sub-policy; per op, whether it runs and the sign
        sub = np.minimum((u[:, 0] * len(self._ops)).astype(np.int64), len(self._ops) - 1)
        runs = u[:, 1:3] <= self._p[sub]
        ops = np.where(runs, self._ops[sub], OP["Identity"])
        return PolicyParams(ops, _magnitudes(self._space, ops, self._bins[sub], u[:, 3:5] <= 0.5, hw))


# --------------------------------------------------------------------------------------------------
# RandomErasing, GaussianBlur, RandomGrayscale

class ErasingParams(NamedTuple):
    """Per sample: the rectangle (top, left, height, width; 0 height where nothing is erased), ``[N, 4]`` int64,
    and the seed of the noise that fills it (``value="random"``), ``[N]`` uint64."""

    boxes: np.ndarray
    seeds: np.ndarray


#: ImageNet's mean and std in pixel units (as `ingest.ops.Normalize` takes them).
IMAGENET_MEAN, IMAGENET_STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)


class RandomErasing(Op):
    """torchvision's ``RandomErasing(p, scale, ratio, value)``: with probability ``p`` per sample, a rectangle of
    ``scale`` of the image's area and aspect ``ratio`` (h / w, log-uniform) is drawn (10 attempts, none erased
    if none fits, as torchvision) and set to ``value``: a number or one per channel in pixel units, or
    ``"random"``: per-pixel normal noise of ``mean`` and ``std`` per channel (pixel units, ImageNet's by
    default), rounded and clamped, which after an ImageNet Normalize is timm's ``mode="pixel"`` (standard normal
    noise) clipped to the 8-bit range. Runs on pixels, before Normalize.

    The rectangle is drawn from the sample's stream; the noise of ``"random"`` from a torch generator on the
    images' device seeded per batch by its samples' keys, so it is reproducible for the same batch, not
    per sample. Params: :class:`ErasingParams`."""

    def __init__(self, p: float = 0.5, scale: Sequence[float] = (0.02, 0.33), ratio: Sequence[float] = (0.3, 3.3),
                 value: float | Sequence[float] | str = 0, *, mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD):
        self.p = probability(p)
        self.scale = _range("scale", scale, low=0.0)
        if self.scale[1] > 1:
            raise ConfigError(f"`scale` must lie in (0, 1], got {scale!r}")
        self.ratio = _range("ratio", ratio, low=0.0)
        if value == "random":
            self.value: tuple[float, ...] | str = "random"
        else:
            try:
                self.value = _fill(value)
            except ConfigError as err:
                raise ConfigError(f"`value` must be a number in 0..255, one per channel or 'random', "
                                  f"got {value!r}") from err
        self.mean, self.std = tuple(float(v) for v in mean), tuple(float(v) for v in std)

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> ErasingParams:
        hw = size_array(sizes)
        rngs = per_sample(rngs, len(hw))
        u = rngs.random(23)   # the coin, 10 areas, 10 aspects, the position
        seeds = rngs.integers(0, 1 << 62).astype(np.uint64)
        h, w = hw[:, 0], hw[:, 1]
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        area = (h * w)[:, None] * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, 1:11])
        aspect = np.exp(lo + (hi - lo) * u[:, 11:21])
        eh = np.rint(np.sqrt(area * aspect)).astype(np.int64)
        ew = np.rint(np.sqrt(area / aspect)).astype(np.int64)
        ok = (eh < h[:, None]) & (ew < w[:, None])
        first = ok.argmax(axis=1)
        found = ok.any(axis=1) & (u[:, 0] < self.p)
        rows = np.arange(len(hw))
        eh, ew = np.where(found, eh[rows, first], 0), np.where(found, ew[rows, first], 0)
        boxes = np.zeros((len(hw), 4), dtype=np.int64)
        boxes[:, 0] = (u[:, 21] * (h - eh + 1)).astype(np.int64)
        boxes[:, 1] = (u[:, 22] * (w - ew + 1)).astype(np.int64)
        boxes[:, 2], boxes[:, 3] = eh, ew
        return ErasingParams(boxes, seeds)

    def apply(self, images: Images, params: ErasingParams) -> Images:
        boxes, seeds = params
        if not len(images) or not (boxes[:, 2] > 0).any():
            return images
        return on_batches(images, lambda x, rows: self._erase(x, boxes[rows], seeds[rows]))

    def _erase(self, x: torch.Tensor, boxes: np.ndarray, seeds: np.ndarray) -> torch.Tensor:
        """One masked fill from the per-sample rectangles; their corners, and the fill values, in one upload."""
        c = x.shape[1]
        corners = np.concatenate([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], axis=1)
        if self.value == "random":
            rows = np.flatnonzero(boxes[:, 2] > 0)
            g = torch.Generator(device=x.device)
            g.manual_seed(int(np.bitwise_xor.reduce(seeds[rows])) & ((1 << 63) - 1))
            mean, std = (np.asarray(v[:c] if len(v) >= c else v * c, dtype=np.float32) for v in (self.mean, self.std))
            box, mean_t, std_t = F.upload([corners, mean, std], x.device)
            noise = torch.randn((len(x), c) + tuple(x.shape[-2:]), generator=g, device=x.device)
            value = noise.mul_(std_t.view(1, -1, 1, 1)).add_(mean_t.view(1, -1, 1, 1))
            value = (value.round_().clamp_(0, 255) if x.dtype == torch.uint8 else value).to(x.dtype)
            return F.erase_boxes(x, box, value)
        values = self.value if len(self.value) == c else self.value * c
        if len(set(values)) == 1:   # one number: a masked fill
            return F.erase_boxes(x, F.upload([corners], x.device)[0], float(values[0]))
        box, value = F.upload([corners, np.asarray(values, dtype=np.float32)], x.device)
        return F.erase_boxes(x, box, value.view(1, -1, 1, 1).to(x.dtype))


class GaussianBlur(Op):
    """torchvision's ``GaussianBlur(kernel_size, sigma)``: every sample blurred with an odd ``kernel_size`` (an int
    or (x, y)) and its own sigma drawn uniformly from ``sigma`` (a number, or a (min, max) range). One
    separable grouped convolution per axis for the whole batch. Params: ``[N]`` float64 sigmas."""

    def __init__(self, kernel_size: int | Sequence[int], sigma: float | Sequence[float] = (0.1, 2.0)):
        ks = [kernel_size, kernel_size] if isinstance(kernel_size, (int, np.integer)) else list(kernel_size)
        if len(ks) != 2 or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0 or k % 2 == 0
                               for k in ks):
            raise ConfigError(f"`kernel_size` must be an odd positive int or a pair of them, got {kernel_size!r}")
        self.kernel_size = (int(ks[0]), int(ks[1]))
        if isinstance(sigma, (int, float)) and not isinstance(sigma, bool):
            if not sigma > 0:
                raise ConfigError(f"`sigma` must be positive, got {sigma!r}")
            sigma = (float(sigma), float(sigma))
        self.sigma = _range("sigma", sigma, low=0.0)

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> np.ndarray:
        return per_sample(rngs, len(sizes)).uniform(*self.sigma)

    def apply(self, images: Images, params: np.ndarray) -> Images:
        return on_batches(images, lambda x, rows: F.gaussian_blur(x, list(self.kernel_size), params[rows]))


class RandomGrayscale(Op):
    """torchvision's ``RandomGrayscale(p)``: with probability ``p`` per sample, the image becomes its luma in
    every channel (1-channel images are unchanged; a loader of ``channels`` 1 or 4 refuses it). Params: ``[N]``
    bool."""

    pixel_channels = (3,)   # luma of RGB: gray is that already, RGBA's alpha is no colour

    def __init__(self, p: float = 0.1):
        self.p = probability(p)

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> np.ndarray:
        return per_sample(rngs, len(sizes)).random() < self.p

    def apply(self, images: Images, params: np.ndarray) -> Images:
        if not params.any():
            return images

        def gray(x: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
            if x.shape[1] != 3:
                return x
            batch = _Rows(x)
            batch.update(np.flatnonzero(params[rows]), lambda s: F.rgb_to_grayscale(s, 3))
            return batch.x
        return on_batches(images, gray)


# --------------------------------------------------------------------------------------------------
# RandomAffine: a geometry op

class RandomAffine(GeometryOp):
    """torchvision's ``RandomAffine(degrees, translate, scale, shear)`` as a geometry op: per sample an angle
    uniform in ``degrees`` (a number d for (-d, d), or a range), a translation of up to ``translate`` =
    (fx, fy) of the width and height (whole pixels, rounded), a scale uniform in ``scale`` and a shear
    uniform in ``shear`` (a number s for x in (-s, s), a range for x, or four numbers for x and y), about the
    image centre, keeping the size; pixels from outside take ``fill`` (pixel units). Its map joins the fused
    warp of the geometry around it; boxes and masks follow it. On CPU it runs as torchvision's ``affine``
    (with its fill blend along the edges). Params: ``[N, 6]`` float64 (angle, tx, ty, scale, shear x, shear y).
    """

    antialias = False

    def __init__(self, degrees: float | Sequence[float] = 0.0, translate: Sequence[float] | None = None,
                 scale: Sequence[float] | None = None, shear: float | Sequence[float] | None = None, *,
                 interpolation: str = "nearest", fill: float | Sequence[float] = 0):
        self.degrees = self._symmetric("degrees", degrees)
        if translate is not None:
            if not (isinstance(translate, (tuple, list)) and len(translate) == 2
                    and all(isinstance(t, (int, float)) and 0 <= t <= 1 for t in translate)):
                raise ConfigError(f"`translate` must be a pair of fractions in [0, 1], got {translate!r}")
            translate = (float(translate[0]), float(translate[1]))
        self.translate = translate
        self.scale = None if scale is None else _range("scale", scale, low=0.0)
        if shear is None or isinstance(shear, (int, float)) or len(shear) == 2:
            self.shear = (0.0, 0.0, 0.0, 0.0) if shear is None else self._symmetric("shear", shear) + (0.0, 0.0)
        elif len(shear) == 4:
            self.shear = self._symmetric("shear", shear[:2]) + self._symmetric("shear", shear[2:])
        else:
            raise ConfigError(f"`shear` must be a number, a (min, max) range or four numbers, got {shear!r}")
        self.interpolation = _interpolation(interpolation)
        self.fill = _fill(fill)

    @staticmethod
    def _symmetric(name: str, value: Any) -> tuple[float, float]:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < 0:
                raise ConfigError(f"`{name}` must be >= 0 as a single number, got {value!r}")
            return -float(value), float(value)
        if (isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value)
                and value[0] <= value[1]):
            return float(value[0]), float(value[1])
        raise ConfigError(f"`{name}` must be a number or a (min, max) range, got {value!r}")

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> np.ndarray:
        hw = size_array(sizes)
        u = per_sample(rngs, len(hw)).random(6)
        out = np.zeros((len(hw), 6))
        out[:, 0] = self.degrees[0] + (self.degrees[1] - self.degrees[0]) * u[:, 0]
        if self.translate is not None:
            for k, (frac, side) in enumerate(((self.translate[0], hw[:, 1]), (self.translate[1], hw[:, 0]))):
                limit = frac * side
                out[:, 1 + k] = np.rint(-limit + 2 * limit * u[:, 1 + k])
        out[:, 3] = 1.0 if self.scale is None else self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, 3]
        out[:, 4] = self.shear[0] + (self.shear[1] - self.shear[0]) * u[:, 4]
        out[:, 5] = self.shear[2] + (self.shear[3] - self.shear[2]) * u[:, 5]
        return out

    @staticmethod
    def _theta(params: np.ndarray) -> np.ndarray:
        return F.inverse_affine_matrices(params[:, 0], params[:, 1:3], params[:, 3], params[:, 4:6], (0.0, 0.0))

    def _steps(self, sizes: np.ndarray, params: np.ndarray) -> Steps:
        t = self._theta(params)
        h, w = sizes[:, 0].astype(np.float64), sizes[:, 1].astype(np.float64)
        m = eye(len(sizes))   # centre-relative -> pixel coordinates (centres at +0.5), same size in and out
        m[:, :2, :2] = t[:, :, :2]
        m[:, 0, 2] = t[:, 0, 2] + w / 2 - t[:, 0, 0] * w / 2 - t[:, 0, 1] * h / 2
        m[:, 1, 2] = t[:, 1, 2] + h / 2 - t[:, 1, 0] * w / 2 - t[:, 1, 1] * h / 2
        identity = (t[:, :, :2] == np.eye(2)).all(axis=(1, 2)) & (t[:, :, 2] == 0).all(axis=1)
        return Steps(m, sizes.copy(), None, ~identity)

    def _apply_cpu(self, images: Images, params: np.ndarray) -> Images:
        return on_batches(images, lambda x, rows: F.warp_batch(x, self._theta(params[rows]), self.interpolation,
                                                               self.fill))
