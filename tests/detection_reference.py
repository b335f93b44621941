"""The per-sample detection path as it was before the batch was vectorized (issue 32), kept as the reference
the vectorized one is tested against: RandomIoUCrop's draw (round by round over padded [S, K, A] arrays),
boxes tracked through the ops and pruned with their per-box fields sample by sample, and the pipeline's
per-sample box format conversions. Frozen: change it only to follow a deliberate change of behaviour."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ingest.ops.affine import Steps, map_boxes, nonempty
from ingest.ops.base import per_sample, size_array
from ingest.ops.detection import RandomIoUCrop
from ingest.ops.geometry import GeometryOp
from ingest.ops.planner import Plan


def _padded(boxes: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    arrays = [np.asarray(b, dtype=np.float64).reshape(-1, 4) for b in boxes]
    counts = np.array([len(b) for b in arrays], dtype=np.int64)
    out = np.zeros((len(arrays), int(counts.max(initial=0)), 4))
    valid = np.arange(out.shape[1]) < counts[:, None]
    if arrays:
        out[valid] = np.concatenate(arrays)
    return out, valid


def iou_crop_draw(op: RandomIoUCrop, sizes, rngs, boxes=None) -> np.ndarray:
    """RandomIoUCrop.draw."""
    rngs = per_sample(rngs, len(sizes))
    hw = size_array(sizes)
    out = np.concatenate([np.zeros_like(hw), hw, np.zeros_like(hw[:, :1])], axis=1)
    padded, valid = _padded([np.zeros((0, 4))] * len(hw) if boxes is None else boxes)
    choices = np.array([np.nan if t is None else t for t in op.min_ious])
    rounds = rngs.spawn()
    open_ = np.flatnonzero(valid.any(axis=1))
    for _ in range(op.rounds):
        rng = rounds.spawn().take(open_)
        threshold = choices[rng.integers(0, len(choices))]
        u = rng.random(op.attempts * 4).reshape(-1, op.attempts, 4)
        trying = ~np.isnan(threshold)
        open_, threshold, u = open_[trying], threshold[trying], u[trying]
        if not len(open_):
            break
        top, left, ch, cw = _attempts(op, hw[open_], padded[open_], valid[open_], threshold, u)
        found = ch > 0
        out[open_[found]] = np.stack([top, left, ch, cw, np.ones_like(ch)], axis=1)[found]
        open_ = open_[~found]
    return out


def _attempts(op, hw, boxes, valid, threshold, u):
    (s0, s1), (a0, a1) = op.scale, op.aspect
    h, w = hw[:, :1], hw[:, 1:]
    cw = (w * (s0 + (s1 - s0) * u[..., 0])).astype(np.int64)
    ch = (h * (s0 + (s1 - s0) * u[..., 1])).astype(np.int64)
    left = ((w - cw) * u[..., 2]).astype(np.int64)
    top = ((h - ch) * u[..., 3]).astype(np.int64)
    shaped = (cw > 0) & (ch > 0) & (a0 * ch <= cw) & (cw <= a1 * ch)
    x0, y0 = left[:, None].astype(np.float64), top[:, None].astype(np.float64)
    x1, y1 = x0 + cw[:, None], y0 + ch[:, None]
    bx0, by0, bx1, by1 = (boxes[..., k, None] for k in range(4))
    cx, cy = (bx0 + bx1) / 2, (by0 + by1) / 2
    inside = valid[..., None] & (x0 < cx) & (cx < x1) & (y0 < cy) & (cy < y1)
    inter = (np.clip(np.minimum(bx1, x1) - np.maximum(bx0, x0), 0, None)
             * np.clip(np.minimum(by1, y1) - np.maximum(by0, y0), 0, None))
    union = (bx1 - bx0) * (by1 - by0) + (cw * ch)[:, None].astype(np.float64) - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(union > 0, inter / union, 0.0)
    best = np.where(inside, iou, -1.0).max(axis=1, initial=-1.0)
    inside = inside.any(axis=1)
    ok = shaped & inside & (best >= threshold[:, None])
    first = ok.argmax(axis=1)
    rows = np.arange(len(hw))
    hit = ok[rows, first]
    return (top[rows, first], left[rows, first], np.where(hit, ch[rows, first], 0), cw[rows, first])


class _Boxes:
    def __init__(self, boxes: list[np.ndarray], samples: int):
        self.counts = np.array([len(b) for b in boxes], dtype=np.int64)
        self.flat = np.concatenate(boxes) if len(boxes) else np.zeros((0, 4))
        self.owner = np.repeat(np.arange(samples), self.counts)
        self.index = np.arange(len(self.flat)) - np.repeat(np.cumsum(self.counts) - self.counts, self.counts)

    def per_sample(self) -> list[np.ndarray]:
        return np.split(self.flat, np.cumsum(np.bincount(self.owner, minlength=len(self.counts)))[:-1])

    def follow(self, op: GeometryOp, params: Any, steps: Steps) -> None:
        chosen = op.box_filter(self.flat, self.owner, params)
        if chosen is not None:
            self._select(chosen)
        self.flat = map_boxes(steps, self.flat, self.owner)
        self._select(nonempty(self.flat))

    def prune(self, min_size: float) -> None:
        if min_size > 0:
            self._select(nonempty(self.flat, min_size))

    def keep(self) -> list[np.ndarray]:
        kept = np.zeros(int(self.counts.sum()), dtype=bool)
        kept[(np.cumsum(self.counts) - self.counts)[self.owner] + self.index] = True
        return np.split(kept, np.cumsum(self.counts)[:-1])

    def _select(self, mask: np.ndarray) -> None:
        self.flat, self.owner, self.index = self.flat[mask], self.owner[mask], self.index[mask]


def _as_array(boxes: Any) -> np.ndarray:
    a = boxes.detach().cpu().numpy() if isinstance(boxes, torch.Tensor) else np.asarray(boxes)
    if a.size == 0:
        return np.zeros((0, 4))
    return a.astype(np.float64)


def _like(boxes: np.ndarray, ref: Any) -> Any:
    if isinstance(ref, torch.Tensor):
        dtype = ref.dtype if ref.is_floating_point() else torch.float32
        return torch.from_numpy(boxes).to(device=ref.device, dtype=dtype)
    dtype = getattr(ref, "dtype", np.float64)
    return boxes.astype(dtype if np.issubdtype(dtype, np.floating) else np.float64)


def _take(value: Any, keep: np.ndarray) -> Any:
    if isinstance(value, torch.Tensor):
        return value[torch.from_numpy(keep).to(value.device)]
    if isinstance(value, np.ndarray):
        return value[keep]
    return [v for v, k in zip(value, keep) if k]


def map_boxes_plan(p: Plan, boxes: Sequence[Any], *, min_size: float = 0.0):
    """Plan.map_boxes."""
    tracked = _Boxes([_as_array(b) for b in boxes], len(p.sizes))
    for stage in p.stages:
        for (op, params), steps in zip(stage.drawn, stage.steps):
            tracked.follow(op, params, steps)
    tracked.prune(min_size)
    return [_like(b, ref) for b, ref in zip(tracked.per_sample(), boxes)], tracked.keep()


def targets(p: Plan, targets: Sequence[dict], *, per_box=("labels", "iscrowd", "area"), min_size: float = 0.0):
    """Plan.targets for boxes and per-box fields (no masks or polygons)."""
    boxes = [t.get("boxes") for t in targets]
    mapped, keep = map_boxes_plan(p, [np.zeros((0, 4)) if b is None else b for b in boxes], min_size=min_size)
    out = []
    for t, b, new, k in zip(targets, boxes, mapped, keep):
        d = dict(t)
        if b is not None:
            d["boxes"] = new
            for name in per_box:
                if name in d:
                    d[name] = _take(d[name], k)
        out.append(d)
    return out


def to_ltrb(boxes: Any, size: tuple[int, int], box_format: str, relative: bool) -> np.ndarray:
    """Pipeline._to_ltrb."""
    b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    if relative:
        b *= (size[1], size[0], size[1], size[0])
    if box_format == "xywh":
        b[:, 2:] += b[:, :2]
    return b


def from_ltrb(boxes: Any, size: tuple[int, int], box_format: str, relative: bool) -> np.ndarray:
    """Pipeline._from_ltrb."""
    b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    if box_format == "xywh":
        b[:, 2:] -= b[:, :2]
    if relative:
        b /= (size[1], size[0], size[1], size[0])
    return b.astype(np.float32)


def drawn(ops: Sequence[Any], sizes, rngs, boxes: Sequence[Any]) -> list[Any]:
    """The params `ingest.ops.planner.plan` drew for each op, boxes tracked through the ops as it did."""
    hw = size_array(sizes)
    rngs = per_sample(rngs, len(hw))
    tracked = _Boxes([_as_array(b) for b in boxes], len(hw))
    out = []
    for op in ops:
        params = (iou_crop_draw(op, hw, rngs, tracked.per_sample()) if isinstance(op, RandomIoUCrop)
                  else op.draw(hw, rngs))
        out.append(params)
        if isinstance(op, GeometryOp):
            steps = op.steps(hw, params)
            tracked.follow(op, params, steps)
            hw = steps.out_sizes
        else:
            hw = size_array(op.out_sizes(hw, params))
    return out
