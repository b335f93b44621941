"""Normalize: the last step of a pipeline, ``(x - mean) / std`` into the training dtype and layout.

This is DALI's ``crop_mirror_normalize`` output stage; the crop and mirror parts are geometry ops that the
planner composes into a warp, and Normalize becomes that warp's epilogue (its coefficients, see
:class:`ingest.ops.resample.Epilogue`), so on CUDA a RandomResizedCrop + Flip + Normalize pipeline is one
kernel from decoded images to the final float tensor. It fixes the batch's dtype and layout
(:meth:`Normalize.declare`), so it comes last.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from ..errors import ConfigError
from . import _warp_kernel, resample
from .affine import identity
from .base import PIXEL_DTYPES, ImageSpec, Images, Op, levels, sizes_of

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8)
LAYOUTS = ("NCHW", "NHWC")


def _numbers(name: str, value: Any) -> tuple[float, ...]:
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                             for v in values):
        raise ConfigError(f"`{name}` must be a finite number or a sequence of them (one per channel), "
                          f"got {value!r}")
    return tuple(float(v) for v in values)


class Normalize(Op):
    """``out = (x - mean) / std * scale + shift`` per channel, cast to ``dtype``, in ``layout``.

    **``mean`` and ``std`` are in pixel units, 0..255, like DALI** (ImageNet: ``mean=(123.675, 116.28,
    103.53), std=(58.395, 57.12, 57.375)``), *not* torchvision's 0..1 units: multiply torchvision's values by
    255. A ``std`` below 1 everywhere is rejected as that mistake (dividing 8-bit pixels by less than one
    level is not a normalization). Each may be one number or one per channel (1, 3 or 4 of them, as the
    images have). uint16 pixels (``Loader(decode_dtype=torch.uint16)``) are scaled by 255 / 65535 first, so
    the same 0..255 ``mean`` and ``std`` serve both: ``x / 65535`` where 8-bit pixels give ``x / 255``.

    ``dtype``: ``torch.float32``, ``float16``, ``bfloat16`` or ``uint8`` (rounded and saturated to 0..255;
    use ``scale``/``shift`` as in DALI to map the normalized range into it, e.g. ``scale=64, shift=128``).
    ``layout``: ``"NCHW"`` (the torchvision/PyTorch convention) or ``"NHWC"``. The arithmetic is float32
    whatever the output dtype. Batches in: ``[N, H, W, C]`` uint8 or a ragged list; out: ``[N, C, H, W]``
    (or ``[N, H, W, C]``) of ``dtype``, or a list of ``[C, H, W]`` (``[H, W, C]``) for a ragged batch.
    """

    def __init__(self, mean: float | Sequence[float], std: float | Sequence[float], *,
                 dtype: torch.dtype = torch.float32, layout: str = "NCHW", scale: float = 1.0,
                 shift: float = 0.0):
        self.mean = _numbers("mean", mean)
        self.std = _numbers("std", std)
        if min(self.std) <= 0:
            raise ConfigError(f"`std` must be positive, got {std!r}")
        if max(self.std) < 1.0:
            raise ConfigError(f"`std` {std!r} is below one pixel level: Normalize takes mean and std in pixel "
                              f"units (0..255, like DALI), not torchvision's 0..1; multiply them by 255")
        if len(self.mean) > 1 and len(self.std) > 1 and len(self.mean) != len(self.std):
            raise ConfigError(f"`mean` has {len(self.mean)} values but `std` has {len(self.std)}")
        if dtype not in DTYPES:
            raise ConfigError(f"Unknown dtype {dtype!r}. Available: {', '.join(str(d) for d in DTYPES)}")
        if layout not in LAYOUTS:
            raise ConfigError(f"Unknown layout {layout!r}. Available: {', '.join(LAYOUTS)}")
        (scale, shift) = _numbers("scale", scale) + _numbers("shift", shift)
        if scale == 0:
            raise ConfigError("`scale` must be non-zero, got 0")
        self.dtype = dtype
        self.layout = layout
        self.scale = scale
        self.shift = shift

    pointwise_affine = True

    pixel_dtypes = PIXEL_DTYPES

    def epilogue(self, channels: int, dtype: torch.dtype = torch.uint8) -> resample.Epilogue:
        """This normalization as ``out = x * a + b`` per channel plus the output dtype and layout, for pixels
        of ``channels`` channels and ``dtype`` (uint16 samples are first brought to 0..255: times 255 / 65535)."""
        n = max(len(self.mean), len(self.std))
        if n not in (1, channels):
            raise ConfigError(f"Normalize has {n} channel values (mean, std) for images of {channels} channels: "
                              f"give one value, or one per channel")
        mean = self.mean * channels if len(self.mean) == 1 else self.mean
        std = self.std * channels if len(self.std) == 1 else self.std
        unit = 255.0 / levels(dtype)   # one level of the samples in the 0..255 units of mean and std
        k = tuple(self.scale / s for s in std)
        b = tuple(self.shift - m * f for m, f in zip(mean, k))
        return resample.Epilogue(tuple(f * unit for f in k) if unit != 1.0 else k, b, self.dtype, self.layout)

    def declare(self, spec: ImageSpec) -> ImageSpec:
        super().declare(spec)
        if spec.channels is not None:
            self.epilogue(spec.channels, spec.dtype)   # a mean or std for another channel count: refused now
        return ImageSpec(self.dtype, self.layout)

    def apply(self, images: Images, params: Any = None) -> Images:
        if not len(images):
            return images
        first = images[0]
        epilogue = self.epilogue(first.shape[-1], first.dtype)
        if first.device.type == "cuda" and _warp_kernel.available():  # one launch, ragged or not
            return resample.warp(images, identity(sizes_of(images)), epilogue=epilogue)
        if isinstance(images, torch.Tensor):
            return resample.finish(images, epilogue)
        return [resample.finish(im[None], epilogue)[0] for im in images]
