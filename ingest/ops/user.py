"""The user's own ops: a Python function over the batch, and torchvision ``transforms.v2`` used as they are.

**A function over the batch** (:class:`BatchFunction`)::

    def fn(images, rand):      # images: [N, C, H, W] uint8 on the Loader's device (CPU or CUDA)
        ...                    # rand: [N, k] float32 uniforms in [0, 1) on that device, row n sample n's
        return out             # [N, C, H', W'] uint8 on the same device, one row per sample

    ops=[RandomResizedCrop(224), BatchFunction(fn, randoms=2), Normalize(...)]

Rules: the function gets the whole batch once per call (one call per distinct image size for a ragged batch)
and must use torch operations on it, not a loop over samples; its randomness comes from ``rand`` only (``k =
randoms`` numbers per sample, drawn from the sample's own stream like every op's, so they resume and shard the
same way); it must not keep or change ``images`` (return a new tensor); it returns uint8 images of the input
size, or of ``size=(h, w)`` when it declares one. A Loader with ``num_workers`` pickles it, so it must be
defined at module level there.

**A torchvision v2 transform** (``torchvision.transforms.v2``, a Compose of them included) goes in ``ops``
as it is, or wrapped as :class:`Torchvision` to choose how it runs:

* per sample (the default): one call per image, ``[C, H, W]`` uint8, with torch's CPU generator (where
  torchvision draws its parameters) seeded from the sample's stream for that call and restored after, so each
  sample draws its own parameters and they resume and shard as every op's; CUDA generators are not touched. **Cost: one Python call per image** (a DataLoader worker's cost),
  on the ops thread of the Loader's process unless ``num_workers`` moves the ops into workers;
* ``per_batch=True``: one call on the ``[N, C, H, W]`` batch: torchvision draws **one** set of parameters for
  the whole batch (every sample gets the same crop, the same jitter), seeded from the batch's samples.

The transform must return uint8 images (no ``ToDtype``/``Normalize``: use ingest's Normalize, last), of the
input size unless ``size=(h, w)`` declares the output size.

Anything else in ``ops`` is a ConfigError naming its position and type.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..errors import ConfigError
from .augment import on_batches
from .functional import upload
from .base import Images, Op, Rngs, Size, per_sample

__all__ = ["BatchFunction", "Torchvision", "as_ops", "is_torchvision_transform"]


def _size(value: Any) -> Size | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, value
    if (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        return int(value[0]), int(value[1])
    raise ConfigError(f"`size` must be None, an int or a (height, width) pair of positive ints, got {value!r}")


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


class _UserOp(Op):
    """What the two user ops share: the declared size and the check of what the user's code returned."""

    size: Size | None = None

    def out_sizes(self, sizes: Sequence[Size], params: Any) -> list[Size]:
        return [self.size] * len(sizes) if self.size is not None else list(sizes)

    @property
    def fixed_size(self) -> bool:  # type: ignore[override]
        return self.size is not None

    def _checked(self, out: Any, x: torch.Tensor, what: str) -> torch.Tensor:
        want = (x.shape[0], x.shape[1]) + (self.size if self.size is not None else tuple(x.shape[2:]))
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"{what} returned a {type(out).__name__}, not a tensor")
        if out.dtype != torch.uint8 or tuple(out.shape) != tuple(want) or out.device != x.device:
            hint = "" if self.size is not None or tuple(out.shape[:2]) != want[:2] else \
                f" (declare a new size: size=({out.shape[-2]}, {out.shape[-1]}))" if out.dim() == 4 else ""
            raise ValueError(f"{what} must return uint8 {list(want)} on {x.device}, got {out.dtype} "
                             f"{list(out.shape)} on {out.device}{hint}")
        return out


class BatchFunction(_UserOp):
    """``fn(images, rand) -> images`` as an op: see the module docstring for the contract. ``randoms``: how many
    uniform numbers each sample gets (``rand`` is None when 0); ``size``: the output (height, width) when the
    function changes it (None: it keeps the size). Params: ``[N, randoms]`` float64 uniforms."""

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor], *, randoms: int = 0,
                 size: int | Sequence[int] | None = None):
        if not callable(fn):
            raise ConfigError(f"BatchFunction needs a callable, got {type(fn).__name__}")
        if isinstance(randoms, bool) or not isinstance(randoms, int) or randoms < 0:
            raise ConfigError(f"`randoms` must be an int >= 0, got {randoms!r}")
        self.fn, self.randoms, self.size = fn, randoms, _size(size)

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> np.ndarray | None:
        return per_sample(rngs, len(sizes)).random(self.randoms) if self.randoms else None

    def apply(self, images: Images, params: np.ndarray | None) -> Images:
        def run(x: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
            rand = None
            if params is not None:
                rand = upload([params[rows].astype(np.float32)], x.device)[0]
            return self._checked(self.fn(x, rand), x, f"BatchFunction({_name(self.fn)})")
        return on_batches(images, run)


def is_torchvision_transform(obj: Any) -> bool:
    """Whether ``obj`` is a ``torchvision.transforms.v2`` transform (without importing torchvision)."""
    v2 = sys.modules.get("torchvision.transforms.v2")
    return v2 is not None and isinstance(obj, v2.Transform)


class Torchvision(_UserOp):
    """A ``torchvision.transforms.v2`` transform as an op, per sample (default) or ``per_batch``; ``size``: the
    output (height, width) when it changes the size. See the module docstring for the rules and the cost.
    Params: ``[N]`` uint64 seeds, one per sample."""

    def __init__(self, transform: Any, *, per_batch: bool = False, size: int | Sequence[int] | None = None):
        if not is_torchvision_transform(transform):
            raise ConfigError(f"Torchvision needs a torchvision.transforms.v2 transform, "
                              f"got {type(transform).__name__}")
        self.transform, self.per_batch, self.size = transform, bool(per_batch), _size(size)

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> np.ndarray:
        return per_sample(rngs, len(sizes)).integers(0, 1 << 62).astype(np.uint64)

    def apply(self, images: Images, params: np.ndarray) -> Images:
        what = f"the torchvision transform {type(self.transform).__name__}"

        def run(x: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
            cpu = torch.random.default_generator   # torchvision draws its parameters from it
            with torch.random.fork_rng(devices=[]):   # ... and the user's state of it is restored after
                if self.per_batch:
                    cpu.manual_seed(int(np.bitwise_xor.reduce(params[rows])))
                    return self._checked(self.transform(x), x, what)
                out = []
                for n, seed in zip(range(len(x)), params[rows].tolist()):
                    cpu.manual_seed(seed)
                    out.append(self.transform(x[n]))
            if not all(isinstance(o, torch.Tensor) and o.dim() == 3 for o in out):
                raise ValueError(f"{what} must return one [C, H, W] uint8 tensor per image")
            if len({o.shape for o in out}) != 1:
                raise ValueError(f"{what} returned images of several sizes for images of one size: a transform "
                                 f"that changes the size must give one fixed size, declared as size=(h, w)")
            return self._checked(torch.stack(out), x, what)
        return on_batches(images, run)

    def __repr__(self) -> str:
        return f"Torchvision({self.transform!r}, per_batch={self.per_batch}, size={self.size})"


def as_ops(ops: Sequence[Any]) -> list[Op]:
    """``ops`` as ingest ops: ops as they are, torchvision v2 transforms wrapped per sample (:class:`Torchvision`);
    anything else a ConfigError naming its position and what to do."""
    if isinstance(ops, (Op, str)) or callable(ops) and not isinstance(ops, (list, tuple)):
        raise ConfigError(f"`ops` must be a list of ops, got {type(ops).__name__}: ops=[...]")
    out = []
    for k, op in enumerate(ops):
        if isinstance(op, Op):
            out.append(op)
        elif is_torchvision_transform(op):
            out.append(Torchvision(op))
        elif callable(op):
            raise ConfigError(
                f"ops[{k}] is {_name(op)!r}, a {type(op).__name__}, not an op. A function over the batch goes in as "
                f"ingest.ops.BatchFunction(fn) (fn(images [N, C, H, W] uint8, rand [N, k]) -> images; see "
                f"docs/augmentation.md); a torchvision transform must be from torchvision.transforms.v2")
        else:
            raise ConfigError(f"ops[{k}] is a {type(op).__name__}, not an op: expected an ingest.ops op, a "
                              f"torchvision.transforms.v2 transform or ingest.ops.BatchFunction(fn)")
    return out
