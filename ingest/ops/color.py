"""ColorJitter: brightness, contrast, saturation and hue, with factors drawn per sample.

The arithmetic is torchvision's for uint8 images (``torchvision.transforms.v2.functional.adjust_*``): each
step works in float32 and truncates back to whole levels before the next, so results match torchvision's
to within one level. It runs batched on any device: a fixed-size batch as one ``[N, H*W, C]`` tensor with
per-sample factors ``[N, 1, 1]``; a ragged batch on CUDA as all pixels concatenated, with per-pixel factors and
a segmented mean, so no step loops over samples on the GPU. The arithmetic runs on a planar float copy.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

from ..errors import ConfigError
from .base import Images, Op, Rngs, Size, as_list, per_sample, probability
from .functional import _constant, upload

_GRAY = (0.2989, 0.587, 0.114)  # torchvision's (ITU-R 601) luma weights
_HUE_OFFSETS = np.array([[5.0], [3.0], [1.0]], dtype=np.float32)  # r, g, b in the closed-form HSV -> RGB


def _factor_range(name: str, value: Any, *, center: float, bound: tuple[float, float]) -> tuple[float, float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"`{name}` must be >= 0, got {value!r}")
        lo, hi = center - value, center + value
        if center == 1.0:
            lo = max(lo, 0.0)
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        lo, hi = float(value[0]), float(value[1])
    else:
        raise ConfigError(f"`{name}` must be a number or a (min, max) pair, got {value!r}")
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ConfigError(f"`{name}` must lie in [{bound[0]}, {bound[1]}] with min <= max, got {value!r}")
    return float(lo), float(hi)


class JitterParams(NamedTuple):
    """Per-sample factors, ``(N,)`` float64 arrays; None for a disabled adjustment."""

    brightness: np.ndarray | None
    contrast: np.ndarray | None
    saturation: np.ndarray | None
    hue: np.ndarray | None


class ColorJitter(Op):
    """Randomly change brightness, contrast, saturation and hue, as ``torchvision.transforms.v2.ColorJitter``.

    Each of ``brightness``, ``contrast``, ``saturation`` is a number ``v`` (factor drawn from
    ``[max(0, 1 - v), 1 + v]``) or a ``(min, max)`` range; ``hue`` is ``v`` in [0, 0.5] (shift drawn from
    ``[-v, v]``) or a range inside [-0.5, 0.5]. 0 disables an adjustment. Unlike torchvision, factors are
    drawn **per sample** (torchvision draws one set per call) and the order is **fixed**: brightness,
    contrast, saturation, hue (torchvision shuffles it per call), so a whole batch runs as one sequence of
    batched tensor ops. ``p`` is the probability that a sample is jittered at all. Saturation and hue
    leave 1-channel images unchanged, as in torchvision; images must have 1 or 3 channels (a loader of
    ``channels=1`` refuses saturation and hue, of ``channels=4`` all of it: ConfigError).
    """

    def __init__(self, brightness: float | Sequence[float] = 0, contrast: float | Sequence[float] = 0,
                 saturation: float | Sequence[float] = 0, hue: float | Sequence[float] = 0, *, p: float = 1.0):
        self.brightness = _factor_range("brightness", brightness, center=1.0, bound=(0.0, math.inf))
        self.contrast = _factor_range("contrast", contrast, center=1.0, bound=(0.0, math.inf))
        self.saturation = _factor_range("saturation", saturation, center=1.0, bound=(0.0, math.inf))
        self.hue = _factor_range("hue", hue, center=0.0, bound=(-0.5, 0.5))
        self.p = probability(p)

    @property
    def pixel_channels(self) -> tuple[int, ...]:
        """Saturation and hue change colours, which gray has none of: they need RGB (brightness and contrast
        take gray too)."""
        return (3,) if self.saturation != (1.0, 1.0) or self.hue != (0.0, 0.0) else (1, 3)

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> JitterParams:
        ranges = [(self.brightness, 1.0), (self.contrast, 1.0), (self.saturation, 1.0), (self.hue, 0.0)]
        on = [r != (identity, identity) for r, identity in ranges]
        # Per sample, one call: the coin, then a uniform number per adjustment (enabled or not).
        u = per_sample(rngs, len(sizes)).random(5)
        chosen = u[:, 0] < self.p

        def factors(k: int) -> np.ndarray | None:
            (lo, hi), identity = ranges[k]
            return np.where(chosen, lo + (hi - lo) * u[:, k + 1], identity) if on[k] else None

        return JitterParams(*(factors(k) for k in range(4)))

    def apply(self, images: Images, params: JitterParams) -> Images:
        ims = as_list(images)
        if not ims or all(f is None for f in params):
            return images
        c = ims[0].shape[-1]
        if c not in (1, 3):
            raise ValueError(f"ColorJitter needs images of 1 or 3 channels, got {c}")
        device = ims[0].device
        if isinstance(images, torch.Tensor):  # [N, H, W, C] -> [N, H*W, C], factors [N, 1, 1]
            x = images.reshape(len(ims), -1, c)
            f = [None if v is None else v.view(-1, 1, 1) for v in _upload(params, device)]
            return _jitter(x, *f, mean=lambda g: g.mean(dim=-1, keepdim=True)).view(images.shape)
        if device.type == "cpu":  # per sample: no concatenation copy
            out = []
            for n, im in enumerate(ims):
                f = [None if v is None else torch.tensor(float(v[n])) for v in params]
                out.append(_jitter(im.reshape(-1, c), *f, mean=lambda g: g.mean(dim=-1, keepdim=True))
                           .view(im.shape))
            return out
        return _apply_flat(ims, params)


def _apply_flat(ims: list[torch.Tensor], params: JitterParams) -> list[torch.Tensor]:
    """A ragged batch as every pixel in one ``[P, C]`` tensor, factors gathered per pixel and a segmented
    contrast mean: a fixed number of kernels whatever the batch size (the CUDA path)."""
    device, c = ims[0].device, ims[0].shape[-1]
    counts = [im.shape[0] * im.shape[1] for im in ims]
    x = torch.cat([im.reshape(-1, c) for im in ims])
    counts_t = _to_device(np.asarray(counts, dtype=np.int64), device)
    segment = torch.repeat_interleave(torch.arange(len(ims), device=device), counts_t,
                                      output_size=sum(counts))  # (given, so no device -> host sync)
    f = [None if v is None else v[segment][None] for v in _upload(params, device)]

    def segment_mean(g: torch.Tensor) -> torch.Tensor:  # [1, P] -> each pixel's sample mean
        sums = torch.zeros(len(ims), dtype=g.dtype, device=device).index_add_(0, segment, g[0])
        return (sums / counts_t.to(g.dtype))[segment][None]

    out = _jitter(x, *f, mean=segment_mean)
    return [part.view(im.shape) for part, im in zip(out.split(counts), ims)]


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on ``device``, asynchronously (`ingest.ops.functional.upload`: from pageable memory, as
    ``torch.tensor(array, device=cuda)`` copies, the host would wait for the stream)."""
    return upload([array], device)[0]


def _upload(arrays: Sequence[np.ndarray | None], device: torch.device) -> list[torch.Tensor | None]:
    """Per-sample factor arrays as float32 tensors on ``device``, in one copy."""
    present = [np.asarray(a, dtype=np.float32) for a in arrays if a is not None]
    if not present:
        return [None] * len(arrays)
    rows = iter(_to_device(np.stack(present), device).unbind(0))
    return [None if a is None else next(rows) for a in arrays]


def _gray(x: torch.Tensor) -> torch.Tensor:
    """Luma of planar ``[..., 3, P]`` float pixels as ``[..., 1, P]``, truncated to whole levels (torchvision's
    uint8 rule)."""
    r, g, b = x[..., 0:1, :], x[..., 1:2, :], x[..., 2:3, :]
    return (r * _GRAY[0] + g * _GRAY[1] + b * _GRAY[2]).floor_()


def _blend(x: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``x * factor + other * (1 - factor)``, clamped and truncated to whole levels."""
    return (x * factor + other * (1.0 - factor)).clamp_(0, 255).floor_()


def _jitter(x: torch.Tensor, brightness: torch.Tensor | None, contrast: torch.Tensor | None,
            saturation: torch.Tensor | None, hue: torch.Tensor | None,
            mean: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The four adjustments on uint8 pixels ``[..., P, C]``; factors broadcast against ``[..., 1, P]``;
    ``mean`` reduces ``[..., 1, P]`` per sample (keeping dims). The math runs on a planar float copy
    ``[..., C, P]`` (channel slices contiguous, which is faster on CPU than channels-last)."""
    planar = x.transpose(-1, -2)
    rgb = planar.shape[-2] == 3
    x = torch.empty(planar.shape, dtype=torch.float32, device=x.device).copy_(planar)
    if brightness is not None:
        x = x.mul_(brightness).clamp_(0, 255).floor_()
    if contrast is not None:
        x = _blend(x, mean(_gray(x) if rgb else x), contrast)
    if saturation is not None and rgb:
        x = _blend(x, _gray(x), saturation)
    if hue is not None and rgb:
        x = _shift_hue(x.mul_(1.0 / 255.0), hue)
    return x.to(torch.uint8).transpose(-1, -2).contiguous()


def _shift_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate the hue of planar ``[..., 3, P]`` RGB in 0..1 by ``shift`` turns; returns whole levels 0..255
    (float). HSV as torchvision (and PIL) define it; back to RGB in the closed form
    ``c = v - v*s*clamp(min(k, 4 - k), 0, 1)``, ``k = (n + 6h) mod 6`` with n = 5, 3, 1 for r, g, b."""
    r, g, b = x[..., 0:1, :], x[..., 1:2, :], x[..., 2:3, :]
    v = x.amax(dim=-2, keepdim=True)
    delta = v - x.amin(dim=-2, keepdim=True)
    flat = delta == 0
    s = delta / torch.where(flat, torch.ones_like(v), v)
    inv = 1.0 / torch.where(flat, torch.ones_like(delta), delta)
    h = torch.where(v == r, (g - b) * inv, torch.where(v == g, (b - r) * inv + 2.0, (r - g) * inv + 4.0))
    h6 = torch.remainder(h * (1.0 / 6.0) + shift, 1.0).mul_(6.0)
    k = torch.remainder(_constant(("hue offsets",), lambda: _HUE_OFFSETS, x.device) + h6, 6.0)
    ramp = torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0)
    return (v - (v * s) * ramp).mul_(255.999).floor_()  # torchvision's float -> uint8 rule
