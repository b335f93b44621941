"""The op contract, said once.

A batch of images is either a fixed-size uint8 tensor ``[N, H, W, C]`` or a *ragged* list of ``[H, W, C]``
uint8 tensors (what a decoder returns), all on one device. Every op is batched and takes either form, on
CPU or CUDA, and returns a batch on the same device.

Randomness is split from execution so that the CPU and CUDA paths, eager calls and the fused pipeline all
see the same random numbers::

    params = op.draw(sizes, rng)        # per-sample random parameters; depends only on sizes and rng
    out    = op.apply(images, params)   # deterministic execution on the images' device

``op(images, rng=...)`` does both. ``rng`` is a ``numpy.random.Generator``; the pipeline derives one per batch
from ``(seed, epoch, batch index)``, so a resumed run draws exactly what an uninterrupted one would.

Geometry ops (crop, resize, flip, rotate) also describe themselves as a per-sample affine map
(:class:`Step`). The pipeline composes a run of geometry ops into one :class:`Warp` and executes it with a
single batched resample (one CUDA kernel for the whole batch), which also tells the GPU decoder which region
of each image to decode (region-of-interest decode).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

Size = tuple[int, int]  # (height, width)
Images = torch.Tensor | list[torch.Tensor]


def as_list(images: Images) -> list[torch.Tensor]:
    """The batch as a list of ``[H, W, C]`` tensors (views, no copy)."""
    if isinstance(images, torch.Tensor):
        if images.dim() != 4:
            raise ValueError(f"an image batch tensor must be [N, H, W, C], got shape {tuple(images.shape)}")
        return list(images.unbind(0))
    return list(images)


def sizes_of(images: Images) -> list[Size]:
    """``(height, width)`` of every image in the batch."""
    if isinstance(images, torch.Tensor):
        n, h, w = images.shape[:3]
        return [(int(h), int(w))] * int(n)
    return [(int(im.shape[0]), int(im.shape[1])) for im in images]


def stack_if_uniform(images: list[torch.Tensor]) -> Images:
    """Stack to ``[N, H, W, C]`` when all images share a shape; otherwise keep the list."""
    if images and all(im.shape == images[0].shape for im in images):
        return torch.stack(images)
    return images


class Op:
    """Base of every batched op. Subclasses implement :meth:`apply` and, if random, :meth:`draw`."""

    #: True for ops whose output size does not depend on the input size (the executor can preallocate).
    fixed_size: bool = False

    def draw(self, sizes: Sequence[Size], rng: np.random.Generator) -> Any:
        """Per-sample random parameters for a batch of images of these sizes. Default: none."""
        return None

    def apply(self, images: Images, params: Any) -> Images:
        raise NotImplementedError

    def out_sizes(self, sizes: Sequence[Size], params: Any) -> list[Size]:
        """Sizes of the images :meth:`apply` returns for inputs of ``sizes``. Default: unchanged."""
        return list(sizes)

    def __call__(self, images: Images, rng: np.random.Generator | None = None) -> Images:
        if rng is None:
            rng = np.random.default_rng()
        return self.apply(images, self.draw(sizes_of(images), rng))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


# --------------------------------------------------------------------------------------------------
# Geometry: per-sample affine maps, composed into one Warp.
#
# Coordinates are continuous pixel coordinates: pixel (row i, column j) covers [j, j+1) x [i, i+1), its
# centre is (j + 0.5, i + 0.5). A Step's matrix maps a point of the op's OUTPUT to the point of its INPUT
# it samples: [x_in, y_in, 1]^T = M @ [x_out, y_out, 1]^T (3x3, float64).


@dataclass
class Step:
    """One geometry op on one sample, as an affine map plus what the resampler needs to know."""

    matrix: np.ndarray            # 3x3 float64, output coords -> input coords
    out_size: Size                # (height, width) of the op's output
    crop: tuple[float, float, float, float] | None = None  # (x0, y0, x1, y1) in INPUT coords the op reads from
    resamples: bool = False       # True if the op interpolates (resize, rotate); False for exact crops/flips


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

    def shifted(self, origins: Sequence[tuple[int, int]]) -> "Warp":
        """The same warp for sources cropped at ``origins`` = (x0, y0) per sample (region-of-interest decode)."""
        o = np.asarray(origins, dtype=np.float64).reshape(-1, 2)
        m = self.matrix.copy()
        m[:, :2, 2] -= o
        return Warp(m, list(self.out_sizes), self.box - np.tile(o, 2), self.interpolation, self.antialias,
                    self.fill, list(self.source_sizes))

    def roi(self) -> list[tuple[int, int, int, int]]:
        """Integer source regions (x0, y0, x1, y1) that hold every pixel the resample can read."""
        hw = np.asarray(self.source_sizes, dtype=np.int64).reshape(-1, 2)
        lo = np.maximum(np.floor(self.box[:, :2]).astype(np.int64), 0)
        hi = np.minimum(np.ceil(self.box[:, 2:]).astype(np.int64), hw[:, ::-1])
        return [tuple(r) for r in np.concatenate([lo, hi], axis=1).tolist()]
