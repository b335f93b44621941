"""Batch ops: MixUp and CutMix, which mix each sample with another of the delivered batch, and its label.

Each sample n draws its own mixing weight ``lam`` from Beta(alpha, alpha) (and for CutMix its patch) from its
own stream, like every op (`ingest.random`): its draws do not depend on the batch, shards or a resume. Its
partner is the sample before it in the delivered batch (sample 0's is the last: torchvision's ``roll(1)``),
which does depend on the batch. Labels become soft, ``[N, num_classes]`` float32::

    y_n = lam_n * onehot(label_n) + (1 - lam_n) * onehot(label_{n-1})

with timm's label smoothing (``label_smoothing`` s: each one-hot is ``1 - s + s / C`` and ``s / C``).

* MixUp: ``x_n = lam_n x_n + (1 - lam_n) x_{n-1}``; uint8 batches are blended in float32 and rounded.
* CutMix: a box of area ``(1 - lam_n)`` of the image (torchvision's rule: centre uniform, clipped to the
  image) is taken from the partner; ``lam_n`` becomes the share of the image left (timm's ``correct_lam``).
* MixUpCutMix: timm's ``Mixup`` with both: per sample CutMix with probability ``switch_prob``, else MixUp.

Each applies to a sample with probability ``p`` (else ``lam = 1``: the image is unchanged and its label one-hot,
smoothed). In a Loader a batch op is the last op (after Normalize or not: mixing is linear, so it commutes with
Normalize); it runs on the delivered batch after failed samples are dropped, so a partner is always a real
sample, and it needs one output size (a fixed-size op before it) and labels. Sources with boxes are refused
(a mixed image has no single set of boxes).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from ..errors import ConfigError
from ..random import SampleRandom
from .base import ImageSpec, Images, Op, Rngs, Size, levels, per_sample, probability, size_array
from .functional import erase_mask, upload

#: Rounds of Marsaglia and Tsang's rejection drawn per Gamma variate. Each is accepted with probability >= 0.95
#: (shape >= 1), so all 16 fail with probability < 1e-20; that sample then takes the last candidate.
_ROUNDS = 16


def gamma(rngs: SampleRandom, shape: float) -> np.ndarray:
    """One Gamma(shape, 1) variate per sample (Marsaglia and Tsang; shape < 1 through ``Gamma(shape + 1) *
    U ** (1 / shape)``), from a fixed number of draw calls: one ``random(3 * 16 + 1)``."""
    u = rngs.random(3 * _ROUNDS + 1)
    a = shape + 1.0 if shape < 1.0 else shape
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    u1, u2, accept = u[:, 0:_ROUNDS], u[:, _ROUNDS:2 * _ROUNDS], u[:, 2 * _ROUNDS:3 * _ROUNDS]
    x = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * math.pi * u2)   # standard normal (Box-Muller)
    v = (1.0 + c * x) ** 3
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = (v > 0) & (np.log1p(-accept) < 0.5 * x * x + d - d * v + d * np.log(np.where(v > 0, v, 1.0)))
    first = np.where(ok.any(axis=1), ok.argmax(axis=1), _ROUNDS - 1)
    g = d * np.maximum(v[np.arange(len(v)), first], 1e-300)
    if shape < 1.0:
        g = g * (1.0 - u[:, -1]) ** (1.0 / shape)
    return g


def beta(rngs: SampleRandom, alpha: float) -> np.ndarray:
    """One Beta(alpha, alpha) variate per sample: ``X / (X + Y)`` of two Gamma(alpha) variates."""
    x, y = gamma(rngs, alpha), gamma(rngs, alpha)
    with np.errstate(invalid="ignore"):
        out = x / (x + y)
    return np.where(np.isfinite(out), out, 0.5)


class MixParams(NamedTuple):
    """Per sample: the weight of its own image and label (``[N]`` float64; 1: unchanged), whether it is blended
    (MixUp, ``[N]`` bool) and the partner's box it takes (CutMix: y0, x0, y1, x1, ``[N, 4]`` int64; empty where
    none)."""

    lam: np.ndarray
    blend: np.ndarray
    boxes: np.ndarray


def _alpha(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 and math.isfinite(value)):
        raise ConfigError(f"`{name}` must be a number >= 0, got {value!r}")
    return float(value)


class BatchOp(Op):
    """An op that mixes samples of the delivered batch and their labels (``mixes_labels``): in a Loader the
    last op; eagerly ``op(images, labels, rng=...)``. Takes any dtype and layout (before or after Normalize)."""

    mixes_labels = True

    def __init__(self, num_classes: int, *, mixup_alpha: float, cutmix_alpha: float, switch_prob: float,
                 p: float, label_smoothing: float):
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
            raise ConfigError(f"`num_classes` must be an int >= 1, got {num_classes!r}")
        self.num_classes = int(num_classes)
        self.mixup_alpha = _alpha("mixup_alpha", mixup_alpha)
        self.cutmix_alpha = _alpha("cutmix_alpha", cutmix_alpha)
        if self.mixup_alpha == 0 and self.cutmix_alpha == 0:
            raise ConfigError("`alpha` must be > 0")
        self.switch_prob = probability(switch_prob)
        self.p = probability(p)
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) or not (
                0.0 <= label_smoothing < 1.0):
            raise ConfigError(f"`label_smoothing` must be in [0, 1), got {label_smoothing!r}")
        self.label_smoothing = float(label_smoothing)

    def declare(self, spec: ImageSpec) -> ImageSpec:
        """Mixing keeps the dtype and layout, whatever they are."""
        return spec

    def declare_labels(self) -> tuple[tuple[int, ...], torch.dtype]:
        """The per-sample shape and dtype of the labels it outputs: soft ``[num_classes]`` float32."""
        return (self.num_classes,), torch.float32

    def draw(self, sizes: Sequence[Size], rngs: Rngs) -> MixParams:
        hw = size_array(sizes)
        rngs = per_sample(rngs, len(hw))
        u = rngs.random(4)   # applied, CutMix or MixUp, the box centre (x, y)
        ones = np.ones(len(hw))
        lam_mix = beta(rngs, self.mixup_alpha) if self.mixup_alpha > 0 else ones
        lam_cut = beta(rngs, self.cutmix_alpha) if self.cutmix_alpha > 0 else ones
        applied = u[:, 0] < self.p
        cut = np.full(len(hw), self.cutmix_alpha > 0)
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            cut = u[:, 1] < self.switch_prob
        cut &= applied
        h, w = hw[:, 0], hw[:, 1]
        # torchvision's CutMix box: centre uniform over the pixels, half sides r * size, clipped to the image
        cx, cy = (u[:, 2] * w).astype(np.int64), (u[:, 3] * h).astype(np.int64)
        r = 0.5 * np.sqrt(1.0 - lam_cut)
        rw, rh = (r * w).astype(np.int64), (r * h).astype(np.int64)
        boxes = np.stack([np.maximum(cy - rh, 0), np.maximum(cx - rw, 0), np.minimum(cy + rh, h),
                          np.minimum(cx + rw, w)], axis=1)
        boxes[~cut] = 0
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        lam = np.where(cut, 1.0 - area / (h * w), np.where(applied, lam_mix, 1.0))
        return MixParams(lam, applied & ~cut, boxes)

    # -- execution ------------------------------------------------------------------------------
    def mix_images(self, images: torch.Tensor, params: MixParams, *, channels_last: bool = False) -> torch.Tensor:
        """The batch (``[N, C, H, W]``, or ``[N, H, W, C]`` with ``channels_last``) mixed, written back into
        ``images`` (so a preallocated output stays the output)."""
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            raise ValueError(f"{type(self).__name__} needs a batch of one image size (a fixed-size op before it: "
                             f"RandomResizedCrop, CenterCrop, Resize((h, w))), got "
                             f"{'a ragged list' if isinstance(images, list) else type(images).__name__}")
        lam, blend, boxes = params
        n = len(images)
        if len(lam) != n:
            raise ValueError(f"mixing drawn for {len(lam)} samples, the batch has {n}")
        if n < 2 or (lam == 1.0).all():
            return images
        x = images.permute(0, 3, 1, 2) if channels_last else images
        dev, fp = x.device, x.is_floating_point()
        dtype = x.dtype if fp else torch.float32
        src = x.to(torch.int32) if x.dtype == torch.uint16 else x   # CUDA has no uint16 roll or where
        partner = src.roll(1, 0)
        weight = np.where(blend, lam, 1.0)
        cut = bool((boxes[:, 2] > boxes[:, 0]).any())
        # the weights of each sample and its partner, and the CutMix boxes: one upload
        host = [np.stack([weight, 1.0 - weight], axis=1).astype(np.float64 if dtype == torch.float64 else np.float32)]
        sent = upload(host + [np.ascontiguousarray(boxes, dtype=np.int64)] if cut else host, dev)
        w_self, w_other = (sent[0][:, k].to(dtype).view(n, 1, 1, 1) for k in range(2))
        if fp:   # in place: the partners are a copy already
            out = x.mul_(w_self).addcmul_(partner, w_other)
        else:
            out = src.to(dtype).mul(w_self).addcmul_(partner.to(dtype), w_other)
            out = out.round_().clamp_(0, levels(x.dtype)).to(src.dtype)
        if cut:
            out = torch.where(erase_mask(out, sent[1]), partner, out, out=out)
        if out is not x:
            x.copy_(out)
        return images

    def mix_labels(self, labels: np.ndarray | torch.Tensor, params: MixParams) -> np.ndarray | torch.Tensor:
        """Class indices ``[N]`` as soft labels ``[N, num_classes]`` float32 (numpy in, numpy out; a tensor in,
        a tensor on its device out)."""
        lam = params.lam
        if isinstance(labels, torch.Tensor):
            if labels.device.type == "cpu":
                return torch.from_numpy(self.mix_labels(labels.numpy(), params))
            on = torch.nn.functional.one_hot(labels.long(), self.num_classes).to(torch.float32)
            y = on.mul_(1.0 - self.label_smoothing).add_(self.label_smoothing / self.num_classes)
            w = upload([lam.astype(np.float32)], labels.device)[0][:, None]
            return y.mul(w).add_(y.roll(1, 0).mul_(1.0 - w))
        labels = np.asarray(labels).reshape(-1)
        if len(labels) != len(lam):
            raise ValueError(f"mixing drawn for {len(lam)} samples, got {len(labels)} labels")
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise ValueError(f"{type(self).__name__} needs labels in 0..{self.num_classes - 1} "
                             f"(num_classes={self.num_classes}), got {labels.min()}..{labels.max()}")
        off = self.label_smoothing / self.num_classes
        y = np.full((len(labels), self.num_classes), off, dtype=np.float32)
        y[np.arange(len(labels)), labels] = 1.0 - self.label_smoothing + off
        w = lam.astype(np.float32)[:, None]
        return y * w + np.roll(y, 1, axis=0) * (np.float32(1.0) - w)

    def apply(self, images: Images, params: MixParams) -> Images:
        raise ConfigError(f"{type(self).__name__} mixes labels too: call it as op(images, labels), or make it the "
                          f"last of a Loader's ops")

    def __call__(self, images: torch.Tensor, labels: Any = None, rng: Rngs = None, *,
                 channels_last: bool = False) -> tuple[torch.Tensor, Any]:
        """Eagerly: ``(images, labels)`` mixed (a copy of ``images``), samples keyed as indices 0..N-1 of
        ``rng`` (see `per_sample`). ``images`` ``[N, C, H, W]`` (``[N, H, W, C]`` with ``channels_last``)."""
        if labels is None:
            raise ConfigError(f"{type(self).__name__} needs the labels: op(images, labels)")
        shape = images.shape[1:3] if channels_last else images.shape[2:4]
        params = self.draw([tuple(shape)] * len(images), per_sample(rng, len(images)))
        return self.mix_images(images.clone(), params, channels_last=channels_last), self.mix_labels(labels, params)


class MixUp(BatchOp):
    """torchvision's ``MixUp(alpha, num_classes)`` with per-sample weights Beta(alpha, alpha), applied with
    probability ``p``; optional timm label smoothing. See the module docstring."""

    def __init__(self, alpha: float = 1.0, num_classes: int = 1000, *, p: float = 1.0,
                 label_smoothing: float = 0.0):
        super().__init__(num_classes, mixup_alpha=alpha, cutmix_alpha=0.0, switch_prob=0.0, p=p,
                         label_smoothing=label_smoothing)
        if self.mixup_alpha == 0:
            raise ConfigError("`alpha` must be > 0")


class CutMix(BatchOp):
    """torchvision's ``CutMix(alpha, num_classes)`` with per-sample boxes of area ``1 - lam``, ``lam`` Beta(alpha,
    alpha), corrected to the area kept; applied with probability ``p``; optional timm label smoothing. Sources
    with boxes are refused. See the module docstring."""

    def __init__(self, alpha: float = 1.0, num_classes: int = 1000, *, p: float = 1.0,
                 label_smoothing: float = 0.0):
        super().__init__(num_classes, mixup_alpha=0.0, cutmix_alpha=alpha, switch_prob=1.0, p=p,
                         label_smoothing=label_smoothing)
        if self.cutmix_alpha == 0:
            raise ConfigError("`alpha` must be > 0")


class MixUpCutMix(BatchOp):
    """timm's ``Mixup(mixup_alpha, cutmix_alpha, prob=p, switch_prob, label_smoothing, num_classes)``, elementwise:
    per sample CutMix with probability ``switch_prob``, else MixUp. timm's ImageNet recipes use
    ``MixUpCutMix(0.8, 1.0, num_classes=1000, label_smoothing=0.1)``."""

    def __init__(self, mixup_alpha: float = 0.8, cutmix_alpha: float = 1.0, num_classes: int = 1000, *,
                 switch_prob: float = 0.5, p: float = 1.0, label_smoothing: float = 0.1):
        super().__init__(num_classes, mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, switch_prob=switch_prob,
                         p=p, label_smoothing=label_smoothing)


def split(ops: Sequence[Op], *, boxes: bool = False, labels: bool = True) -> tuple[list[Op], BatchOp | None]:
    """The per-sample ops a planner runs, and the batch op that ends the list (None if there is none). A batch
    op must be the last op, one at most, and needs labels and no boxes; with boxes, an op that moves pixels
    without a map for them (``follows_boxes = False``: the policies) is refused too. Otherwise a ConfigError."""
    ops = list(ops)
    if boxes:
        for op in ops:
            if getattr(op, "follows_boxes", True) is False:
                raise ConfigError(f"{type(op).__name__} moves pixels without a map for boxes and masks, and this "
                                  f"source has boxes or masks: use RandomAffine or Rotate (geometry ops, which boxes follow) "
                                  f"and colour ops instead")
    at = [k for k, op in enumerate(ops) if getattr(op, "mixes_labels", False)]
    if not at:
        return ops, None
    op = ops[at[0]]
    name = type(op).__name__
    if len(at) > 1:
        raise ConfigError(f"one batch op at most, got {', '.join(type(ops[k]).__name__ for k in at)}: "
                          f"MixUpCutMix combines MixUp and CutMix")
    if at[0] != len(ops) - 1:
        raise ConfigError(f"{name} mixes whole samples and their labels: it must be the last op, got "
                          f"{type(ops[-1]).__name__} after it")
    if boxes:
        raise ConfigError(f"{name} cannot run on a source with boxes: a mixed image has no single set of boxes "
                          f"and labels (drop it for detection)")
    if not labels:
        raise ConfigError(f"{name} mixes labels, and this source has no `label` field")
    return ops[:-1], op


class Mixing:
    """A batch op's draws for one delivered batch, from a child of the samples' streams (so they do not depend on
    the other ops' draws): :meth:`labels` makes the soft labels (on the host), :meth:`images` mixes the batch
    the ops output (``spec``: its dtype and layout; ``[N, C, H, W]`` unless the layout is NHWC)."""

    def __init__(self, op: BatchOp, rngs: SampleRandom, sizes: Sequence[Size], spec: ImageSpec):
        if sizes and len(set(map(tuple, sizes))) != 1:
            raise ValueError(f"{type(op).__name__} needs one output size for the batch (a fixed-size op before it: "
                             f"RandomResizedCrop, CenterCrop, Resize((h, w))), got {len(set(map(tuple, sizes)))}")
        self.op, self.spec = op, spec
        self.params = op.draw(sizes, rngs.spawn())

    def labels(self, labels: np.ndarray) -> np.ndarray:
        return self.op.mix_labels(labels, self.params)

    def images(self, images: torch.Tensor) -> torch.Tensor:
        return self.op.mix_images(images, self.params, channels_last=self.spec.layout == "NHWC")
