"""Batched image ops on CPU or CUDA tensors (the contract: :mod:`ingest.ops.base`).

Geometry: :class:`Resize`, :class:`CenterCrop`, :class:`RandomResizedCrop`, :class:`Flip` (and
:class:`HorizontalFlip`, :class:`VerticalFlip`), :class:`Rotate`. Pixels: :class:`ColorJitter`,
:class:`Normalize`. The executor's entry points: :func:`plan` (draw every random parameter once, compose
the leading geometry run into one :class:`Warp`) and :class:`Plan.execute`, or :func:`run_ops` for both.
The batched resample itself is :func:`ingest.ops.warp.warp` (the submodule keeps that name, so the function is
not re-exported here; its torch reference is ``ingest.ops.warp.reference``).
"""

from .base import Op, Step, Warp
from .color import ColorJitter
from .geometry import CenterCrop, Flip, GeometryOp, HorizontalFlip, RandomResizedCrop, Resize, Rotate, VerticalFlip
from .normalize import Normalize
from .warp import Plan, compose, plan, rescaled, run_ops

__all__ = [
    "CenterCrop", "ColorJitter", "Flip", "GeometryOp", "HorizontalFlip", "Normalize", "Op", "Plan",
    "RandomResizedCrop", "Resize", "Rotate", "Step", "VerticalFlip", "Warp", "compose", "plan", "rescaled",
    "run_ops",
]
