"""The op contract, said once.

A batch of images is either a fixed-size uint8 tensor ``[N, H, W, C]`` or a *ragged* list of ``[H, W, C]``
uint8 tensors (what a decoder returns), all on one device. Every op is batched and takes either form, on
CPU or CUDA, and returns a batch on the same device. Pixels are uint16 where the loader keeps 16-bit samples,
and C is 1, 3 or 4: an op says what it takes (`Op.pixel_dtypes`, `Op.pixel_channels`), checked when the
ops are planned. An :class:`ImageArena` (the GPU decoder's ragged
batch in one buffer) is a sequence of such images: ops that only iterate take it as a list, and the warp
reads it without making a tensor per image.

Randomness is split from execution, and drawn **per sample** for the whole batch at once::

    params = op.draw(sizes, rngs)       # rngs: a SampleRandom; row n of each draw is sample n's alone
    out    = op.apply(images, params)   # deterministic execution on the images' device

:class:`~ingest.random.SampleRandom` is a counter-based source: sample n's numbers are a pure function
of its key and the draw call, computed for all samples in a few numpy operations. The pipeline keys sample n
by ``(seed, epoch, dataset index)`` (``sampler.BatchPlan.sample_rngs``), so a sample's augmentation does not
depend on the batch it lands in, the number of ranks, a resume or a neighbour that failed to decode; CPU and
CUDA execute the same drawn numbers. An op makes the same draw calls for every batch (see
:mod:`ingest.random`). ``op(images, rng=...)`` does both steps, with samples keyed from ``rng`` (a
Generator or a seed): see :func:`per_sample`.

An op whose draws depend on the samples' boxes (an IoU-constrained crop) sets ``uses_boxes`` and takes
them as ``draw(sizes, rngs, boxes=...)``, one ``[K, 4]`` array per sample, mapped by the ops before it.

An op declares what it outputs before it runs: :meth:`Op.out_sizes` (per sample, given the drawn params)
and :meth:`Op.declare` (dtype and layout, an :class:`ImageSpec`), so the executor knows the batch it will
get without looking at the op's type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..decode.arena import ImageArena
from ..errors import ConfigError
from ..random import SampleRandom

Size = tuple[int, int]  # (height, width)


Images = torch.Tensor | list[torch.Tensor] | ImageArena
Rngs = SampleRandom | np.random.Generator | int | None


@dataclass(frozen=True)
class ImageSpec:
    """What a batch holds besides its sizes.

    ``layout`` is None for the ops' working form, ``[H, W, C]`` pixels (channels last), which every op takes;
    "NCHW" or "NHWC" once an op has fixed the layout of the final batch (Normalize), after which no other
    op can run. Pixels are uint8, or uint16 where the decoder keeps 16-bit samples; ``channels`` is their
    count where known (1 gray, 3 RGB, 4 RGBA; None: not said, taken as any).
    """

    dtype: torch.dtype = torch.uint8
    layout: str | None = None
    channels: int | None = None

    @property
    def pixels(self) -> bool:
        """True for ``[H, W, C]`` pixels (uint8 or uint16), the input every op takes."""
        return self.dtype in PIXEL_DTYPES and self.layout is None

    def batch_shape(self, n: int, size: tuple[int, int], channels: int) -> tuple[int, int, int, int]:
        """The shape of the tensor holding ``n`` images of ``size`` (height, width) in this layout."""
        (h, w), c = size, channels
        return (n, c, h, w) if self.layout == "NCHW" else (n, h, w, c)


PIXELS = ImageSpec()
#: The pixel dtypes a decoder gives: 8-bit samples, or 16-bit ones kept (`ingest.decode.codecs`).
PIXEL_DTYPES = (torch.uint8, torch.uint16)


def levels(dtype: torch.dtype) -> int:
    """The largest value of a pixel dtype: 255 for uint8, 65535 for uint16."""
    return 65535 if dtype == torch.uint16 else 255


def fill_levels(fill: Sequence[float], channels: int, dtype: torch.dtype) -> tuple[float, ...]:
    """``fill`` (one value or one per channel, in 8-bit pixel units 0..255) for an image of ``channels``
    channels of ``dtype``: unchanged for uint8, times 257 for uint16 (255 -> 65535)."""
    values = fill_for(fill, channels)
    return values if dtype != torch.uint16 else tuple(v * 257 for v in values)


def probability(p: Any) -> float:
    """``p`` validated as a probability in [0, 1] (a ConfigError naming it otherwise)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ConfigError(f"`p` must be a probability in [0, 1], got {p!r}")
    return float(p)


def per_sample(rngs: Rngs, n: int) -> SampleRandom:
    """The random source of ``n`` samples: ``rngs`` itself when it is a :class:`SampleRandom` of ``n``
    samples; else samples ``0..n-1`` keyed from a seed (int), a numpy Generator (one number drawn from it)
    or fresh entropy (None). Sample k's key does not depend on ``n``, so an eager call gives sample k the
    same draws in any batch size."""
    if isinstance(rngs, SampleRandom):
        if len(rngs) != n:
            raise ValueError(f"the random source has {len(rngs)} samples, the batch has {n}")
        return rngs
    if rngs is None:
        rngs = np.random.default_rng()
    if isinstance(rngs, np.random.Generator):
        rngs = int(rngs.integers(0, 1 << 63))
    if isinstance(rngs, bool) or not isinstance(rngs, (int, np.integer)):
        raise TypeError(f"expected a SampleRandom, a numpy Generator, a seed or None, got {type(rngs).__name__}")
    return SampleRandom.eager(int(rngs), n)


def same_size(sizes: Sequence[Size]) -> bool:
    """Whether every pair of ``sizes`` equals the first (True for none): one ``list.count`` in C, not a Python
    step per sample."""
    sizes = sizes if isinstance(sizes, list) else list(sizes)
    return not sizes or sizes.count(sizes[0]) == len(sizes)


def _repeated(sizes: Any) -> bool:
    """Whether ``sizes`` is a list of one (height, width) tuple repeated (what `size_list` makes of equal
    sizes), so callers can build its array from one pair instead of numpy converting the list pair by pair."""
    return isinstance(sizes, list) and bool(sizes) and isinstance(sizes[0], tuple) and same_size(sizes)


def size_array(sizes: Sequence[Size] | np.ndarray) -> np.ndarray:
    """``(height, width)`` pairs as an ``(N, 2)`` int64 array (an int64 array of that shape is returned as is)."""
    if _repeated(sizes):
        h, w = sizes[0]
        hw = np.empty((len(sizes), 2), dtype=np.int64)
        hw[:, 0], hw[:, 1] = h, w
        return hw
    return np.asarray(sizes, dtype=np.int64).reshape(-1, 2)


def size_list(sizes: Sequence[Size] | np.ndarray) -> list[Size]:
    """``(height, width)`` int pairs from an ``(N, 2)`` array or a sequence of pairs, as a list of tuples
    (through one ``tolist``: no Python int conversion per sample; one tuple repeated when all are equal)."""
    if _repeated(sizes):
        return [tuple(map(int, sizes[0]))] * len(sizes)
    hw = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    if len(hw) and (hw[:, 0] == hw[0, 0]).all() and (hw[:, 1] == hw[0, 1]).all():   # (N,): keeps the GIL
        return [tuple(hw[0].tolist())] * len(hw)
    return list(map(tuple, hw.tolist()))


def as_list(images: Images) -> list[torch.Tensor]:
    """The batch as a list of ``[H, W, C]`` tensors (views, no copy)."""
    if isinstance(images, torch.Tensor):
        if images.dim() != 4:
            raise ValueError(f"an image batch tensor must be [N, H, W, C], got shape {tuple(images.shape)}")
        return list(images.unbind(0))
    return list(images)


def device_and_channels(images: Images) -> tuple[torch.device, int]:
    """The batch's device and channel count, without making a view of an image (a torch call each)."""
    if isinstance(images, ImageArena):
        return images.device, images.channels
    first = images[0]
    return first.device, int(first.shape[-1])


def sizes_of(images: Images) -> list[Size]:
    """``(height, width)`` of every image in the batch."""
    if isinstance(images, torch.Tensor):
        n, h, w = images.shape[:3]
        return [(int(h), int(w))] * int(n)
    if isinstance(images, ImageArena):
        return list(map(tuple, images.hw.tolist()))
    return [(int(im.shape[0]), int(im.shape[1])) for im in images]


def size_array_of(images: Images) -> np.ndarray:
    """:func:`sizes_of` as an ``(N, 2)`` int64 array, made without a tuple per image: an arena's own ``hw``, or
    one size repeated for a batch tensor (the GPU ops stage asks for it several times per batch, and numpy
    converting a list of size tuples goes pair by pair)."""
    if isinstance(images, ImageArena):
        return images.hw
    if isinstance(images, torch.Tensor):
        return size_array([tuple(images.shape[1:3])] * int(images.shape[0]))
    return size_array(sizes_of(images))


def stack_if_uniform(images: list[torch.Tensor]) -> Images:
    """Stack to ``[N, H, W, C]`` when all images share a shape; otherwise keep the list. uint16 images are
    stacked as their bytes (CUDA has no uint16 ``cat``)."""
    if images and all(im.shape == images[0].shape for im in images):
        if images[0].dtype == torch.uint16:
            flat = torch.stack([im.reshape(-1).view(torch.uint8) for im in images]).view(torch.uint16)
            return flat.view(len(images), *images[0].shape)
        return torch.stack(images)
    return images


def copy_into(out: torch.Tensor, images: Images) -> torch.Tensor:
    """A batch (one tensor, or images of one shape) copied into ``out``, which must have its shape and dtype;
    returns ``out``."""
    got = images if isinstance(images, torch.Tensor) else stack_if_uniform(as_list(images))
    if not isinstance(got, torch.Tensor) or got.shape != out.shape or got.dtype != out.dtype:
        raise ValueError(f"`out` is {tuple(out.shape)} {out.dtype}; the batch is "
                         + (f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor)
                            else "of several sizes"))
    return out.copy_(got)


def pad_crop(im: torch.Tensor, top: int, left: int, height: int, width: int,
             fill: Sequence[float]) -> torch.Tensor:
    """``im[top:top+height, left:left+width]`` of a ``[..., H, W, C]`` batch, padded with ``fill`` (one value
    or one per channel, in levels of the image's dtype: see `fill_levels`) where the window leaves the image.
    A view when it does not."""
    h, w = im.shape[-3], im.shape[-2]
    if top >= 0 and left >= 0 and top + height <= h and left + width <= w:
        return im[..., top:top + height, left:left + width, :]
    out = im.new_empty(im.shape[:-3] + (height, width, im.shape[-1]))
    out.copy_(torch.tensor(fill_for(fill, im.shape[-1]), device=im.device).round().to(im.dtype))
    y0, x0 = max(top, 0), max(left, 0)
    y1, x1 = min(top + height, h), min(left + width, w)
    if y1 > y0 and x1 > x0:
        out[..., y0 - top:y1 - top, x0 - left:x1 - left, :] = im[..., y0:y1, x0:x1, :]
    return out


def fill_for(fill: Sequence[float], channels: int) -> tuple[float, ...]:
    """``fill`` (one value or one per channel) for an image of ``channels`` channels."""
    if len(fill) == channels:
        return tuple(fill)
    if len(set(fill)) == 1:
        return (fill[0],) * channels
    raise ConfigError(f"`fill` has {len(fill)} values for images of {channels} channels")


class Op:
    """Base of every batched op. Subclasses implement :meth:`apply` and, if random, :meth:`draw`."""

    #: True for ops whose output size does not depend on the input size (the executor can preallocate).
    fixed_size: bool = False
    #: True for ops whose :meth:`draw` takes the samples' boxes (``boxes=``).
    uses_boxes: bool = False
    #: Pixel dtypes the op takes (`check_pixels`): uint8 unless it says it keeps 16-bit samples.
    pixel_dtypes: tuple[torch.dtype, ...] = (torch.uint8,)
    #: Channel counts the op takes (`check_pixels`); None: any.
    pixel_channels: tuple[int, ...] | None = None
    #: True for ops that are ``x * a + b`` per channel (:meth:`epilogue` gives a and b): the planner runs
    #: them as the epilogue of the warp before them.
    pointwise_affine: bool = False

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> Any:
        """Per-sample random parameters for a batch of images of these sizes (the planner passes an ``(N, 2)``
        int64 array) from ``rngs`` (:func:`per_sample` turns it into a :class:`SampleRandom`): sample n's
        from row n of the draws only, with the same draw calls for every batch. Default: none."""
        return None

    def apply(self, images: Images, params: Any) -> Images:
        raise NotImplementedError

    def out_sizes(self, sizes: Sequence[Size], params: Any) -> list[Size]:
        """Sizes of the images :meth:`apply` returns for inputs of ``sizes``. Default: unchanged."""
        return list(sizes)

    def declare(self, spec: ImageSpec) -> ImageSpec:
        """The dtype and layout this op outputs for inputs of ``spec``. Default: takes and gives pixels of a
        dtype in `pixel_dtypes` and a channel count in `pixel_channels` (`check_pixels`)."""
        if not spec.pixels:
            raise ConfigError(f"{self!r} takes [H, W, C] pixels, but the op before it outputs "
                              f"{spec.dtype} in layout {spec.layout}: put it before Normalize")
        self.check_pixels(spec)
        return spec

    def check_pixels(self, spec: ImageSpec) -> None:
        """ConfigError unless this op takes pixels of ``spec``'s dtype and channel count."""
        name = type(self).__name__
        if spec.dtype not in self.pixel_dtypes:
            raise ConfigError(f"{name} works on 8-bit pixels only, but the images are {spec.dtype} (decode_dtype): "
                              f"decode to uint8, or use ops that keep 16-bit samples (Resize, CenterCrop, "
                              f"RandomResizedCrop, Flip, Normalize)")
        if spec.channels is not None and self.pixel_channels is not None and spec.channels not in self.pixel_channels:
            raise ConfigError(f"{name} needs images of {' or '.join(map(str, self.pixel_channels))} channels, "
                              f"but they have {spec.channels} (channels={spec.channels})")

    def __call__(self, images: Images, rng: Rngs = None) -> Images:
        sizes = sizes_of(images)
        return self.apply(images, self.draw(sizes, per_sample(rng, len(sizes))))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"
