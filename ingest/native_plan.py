"""The native planner's Python side: which op chains it runs, their flat description, and a binding for tests.

The native engine plans a batch in C (``ingest/_native/plan.h``): the draws, the composed warp, the regions to
decode and the warp kernel's argument rows, the numbers `ingest.ops.planner.plan` and
`ingest.ops._warp_kernel.pack` make. It runs the chains :func:`describe` describes:

    any sequence of Resize, CenterCrop, RandomResizedCrop, Flip (HorizontalFlip, VerticalFlip), ZoomOut,
    RandomIoUCrop (at most 8 thresholds) and PadTo (``batch=True`` where asked), at least one, optionally
    followed by Normalize

on images of 1 to 4 channels. For any other chain :func:`describe` returns None and the Python stages run it
(they also raise the ConfigError of a chain that is wrong for the images, e.g. a fill or a Normalize with three
values on one channel). Given the samples' boxes, :func:`plan` also moves them as the Python planner does
(`Plan.map_box_batch`: RandomIoUCrop draws on them, every op maps, clips and drops them) and returns the kept
boxes with the row of each among the boxes given, to gather their other fields. :class:`Planner` stands in
for `planner.plan` in the Python engine's read stage. :func:`plan` and :func:`pack` call the C code through
``ingest._plan`` (built by setup.py where a C compiler is found; ``NATIVE`` is None without it).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from .errors import ConfigError
from .ops import _warp_kernel, planner, resample
from .ops.affine import Warp
from .ops.base import PIXELS, ImageSpec, Op, size_list
from .ops.boxes import BoxBatch
from .ops.detection import PadTo, RandomIoUCrop, ZoomOut
from .ops.geometry import CenterCrop, Flip, HorizontalFlip, RandomResizedCrop, Resize, VerticalFlip
from .ops.normalize import Normalize
from .random import SampleRandom

try:
    from . import _plan as NATIVE
except ImportError:
    NATIVE = None

# plan.h's numbers (tests check them against ingest._plan's)
RECORD, MAX_OPS, DESC_VERSION = 16, 16, 1
RESIZE, CENTER_CROP, RANDOM_RESIZED_CROP, FLIP, ZOOM_OUT, IOU_CROP, PAD_TO = 1, 2, 3, 4, 5, 6, 7
PARAMS, MAX_IOUS = 5, 8
RESIZE_SIZE, RESIZE_SHORTER, RESIZE_LONGER = 0, 1, 2
INTERPOLATIONS = {"nearest": 0, "bilinear": 1, "bicubic": 2}

#: One ``ing_sample`` of plan.h.
SAMPLE = np.dtype([("region", np.int64, 4), ("out_hw", np.int64, 2), ("content_hw", np.int64, 2),
                   ("src_hw", np.int64, 2),
                   ("matrix", np.float64, 6), ("box", np.float64, 4), ("inside", np.float64, 4),
                   ("readable", np.float64, 4), ("valid", np.float64, 4)])

#: The op classes the native planner runs, exactly (a subclass may change what they do).
_GEOMETRY = (Resize, CenterCrop, RandomResizedCrop, Flip, HorizontalFlip, VerticalFlip, ZoomOut, RandomIoUCrop,
             PadTo)


def describe(ops: Sequence[Op], channels: int = 3, *, batch_wide: bool = False) -> np.ndarray | None:
    """The float64 description (plan.h, ``ing_chain_parse``) of ``ops`` on images of ``channels`` channels, or
    None when the native planner does not run that chain. ``batch_wide``: also chains with a PadTo(batch=True),
    whose output size is the batch's (a caller that sizes its output once, from a probe, must not take them)."""
    ops = list(ops)
    normalize = ops.pop() if ops and type(ops[-1]) is Normalize else None
    if not ops or len(ops) > MAX_OPS or not all(type(op) in _GEOMETRY for op in ops) or not 1 <= channels <= 4:
        return None
    if any(isinstance(op, RandomIoUCrop) and len(op.min_ious) > MAX_IOUS   # more than a record holds
           or isinstance(op, PadTo) and op.batch and not batch_wide for op in ops):
        return None
    fill = next((op.fill for op in reversed(ops) if op.fill is not None), (0.0,))
    try:
        fill_values = resample._fill_values(fill, channels)
        epilogue = normalize.epilogue(channels) if normalize is not None else None
    except ConfigError:
        return None
    desc = np.zeros((2 + len(ops), RECORD), dtype=np.float64)
    desc[0, :6] = DESC_VERSION, len(ops), channels, normalize is not None, 0, 0
    if epilogue is not None:
        desc[0, 4:6] = _warp_kernel._KINDS[epilogue.dtype], epilogue.layout == "NCHW"
        desc[0, 6:6 + channels], desc[0, 10:10 + channels] = epilogue.a, epilogue.b
    desc[1, :channels] = fill_values
    for row, op in zip(desc[2:], ops):
        row[:] = _record(op)
    return desc.reshape(-1)


def _record(op: Op) -> list[float]:
    """One op's description record (RECORD fields)."""
    if isinstance(op, Resize):
        if op.size is not None:
            mode, size = RESIZE_SIZE, op.size
        elif op.shorter is not None:
            mode, size = RESIZE_SHORTER, (op.shorter, 0)
        else:
            mode, size = RESIZE_LONGER, (op.longer, 0)
        fields = [RESIZE, mode, *size, op.max_size or 0, INTERPOLATIONS[op.interpolation], op.antialias]
    elif isinstance(op, CenterCrop):
        fields = [CENTER_CROP, *op.size]
    elif isinstance(op, RandomResizedCrop):
        fields = [RANDOM_RESIZED_CROP, *op.size, *op.scale, *op.ratio, INTERPOLATIONS[op.interpolation],
                  op.antialias]
    elif isinstance(op, ZoomOut):
        fields = [ZOOM_OUT, *op.ratio, op.p]
    elif isinstance(op, RandomIoUCrop):
        fields = [IOU_CROP, *op.scale, *op.aspect, op.attempts, op.rounds, len(op.min_ious),
                  *(np.nan if t is None else t for t in op.min_ious)]
    elif isinstance(op, PadTo):
        fields = [PAD_TO, *(op.size or (0, 0)), op.multiple or 0, op.center, op.batch]
    else:
        fields = [FLIP, op.p, op.horizontal, op.vertical]
    return [float(v) for v in fields] + [0.0] * (RECORD - len(fields))


class Planner:
    """`ingest.ops.planner.plan` for one op chain done by the native planner: the same `planner.Plan` (draws,
    sizes, one warp, the boxes moved and pruned), from one C call and a few array views instead of every op's
    numpy steps. :meth:`of` gives one where the results are the same (tested): a chain :func:`describe`
    describes, of one fill (the Python planner then makes one warp as the native planner does). The plan has no
    per-op `Steps` (``stage.steps`` is empty): it serves images, boxes given to it and masks, not
    `Plan.map_polygons` nor boxes other than those it was given."""

    def __init__(self, ops: Sequence[Op], desc: np.ndarray, pixels: ImageSpec):
        self.ops, self.desc = list(ops), desc
        self.output = planner.check(self.ops, pixels)
        self.geometry = self.ops[:-1] if type(self.ops[-1]) is Normalize else self.ops
        self.epilogue = self.ops[-1] if type(self.ops[-1]) is Normalize else None
        fills = [op.fill for op in self.geometry if op.fill is not None]
        self.fill = fills[-1] if fills else (0.0,)
        self.pads = isinstance(self.geometry[-1], PadTo)   # content sizes: before the trailing padding

    @classmethod
    def of(cls, ops: Sequence[Op], pixels: ImageSpec = PIXELS) -> "Planner | None":
        """The native planner for ``ops`` on decoded ``pixels`` (uint8), or None where it would not plan them
        as `planner.plan` does (or is not built)."""
        if NATIVE is None or pixels.dtype != PIXELS.dtype or pixels.channels is None:
            return None
        desc = describe(ops, pixels.channels, batch_wide=True)
        fills = {op.fill for op in ops if getattr(op, "fill", None) is not None}
        return None if desc is None or len(fills) > 1 else cls(ops, desc, pixels)

    def plan(self, sizes: Sequence[tuple[int, int]], rngs: SampleRandom,
             boxes: BoxBatch | Sequence[np.ndarray] | None = None) -> planner.Plan:
        """``planner.plan(ops, sizes, rngs, boxes=boxes)``: ``rngs`` a fresh `SampleRandom` (no draws made)."""
        if rngs.calls:
            raise ValueError("the native planner draws from a fresh SampleRandom")
        hw = np.ascontiguousarray(sizes, dtype=np.int64).reshape(-1, 2)
        boxes = None if boxes is None else BoxBatch.of(boxes)   # (what `map_box_batch` then reuses)
        q = plan(self.desc, 0, 0, None, hw, boxes, keys=rngs.keys)
        s = q.samples
        n = len(s)
        matrix = np.zeros((n, 3, 3))
        matrix[:, :2] = s["matrix"].reshape(n, 2, 3)
        matrix[:, 2, 2] = 1.0
        src, out = size_list(hw), size_list(s["out_hw"])
        warp = Warp(matrix, out, s["box"], q.interpolation, q.antialias, self.fill, src, s["valid"], s["readable"],
                    s["inside"])
        drawn = [(op, _params(op, q.params[:, k])) for k, op in enumerate(self.geometry)]
        stage = planner.Stage(list(drawn), src, out, warp=warp, epilogue=self.epilogue)
        if self.epilogue is not None:
            drawn.append((self.epilogue, None))
        tracked = None if boxes is None else planner.moved_boxes(boxes, q.boxes, q.kept)
        return planner.Plan(src, drawn, [stage], out, self.output, size_list(s["content_hw"]) if self.pads else None,
                            tracked)


def _params(op: Op, drawn: np.ndarray) -> Any:
    """An op's drawn parameters (plan.h, ``params``) as its ``draw`` gives them."""
    if isinstance(op, Flip):
        return drawn[:, :2].astype(bool)
    if isinstance(op, RandomIoUCrop):
        return drawn[:, :5]
    if isinstance(op, (RandomResizedCrop, ZoomOut)):
        return drawn[:, :4]
    return None


class NativePlan(NamedTuple):
    """A batch planned by the native planner (plan.h's ``ing_plan_out``)."""

    samples: np.ndarray        # (N,) `SAMPLE` records: region, out_hw, content_hw, src_hw, matrix (2 x 3), box
    params: np.ndarray         # (N, ops, PARAMS) int64: each op's drawn parameters (plan.h)
    interpolation: str         # the batch's filter, and whether it antialiases
    antialias: bool
    boxes: BoxBatch | None = None   # given boxes: those kept, in output pixels (ltrb float64), per sample
    kept: np.ndarray | None = None  # ... and each one's row among the boxes given (int64), to gather other fields


def _check_seed(seed: int) -> int:
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"the native planner takes a seed in [0, 2**64), got {seed}")
    return int(seed)


def plan(desc: np.ndarray, seed: int, epoch: int, indices: Sequence[int] | np.ndarray | None,
         sizes: Sequence[tuple[int, int]] | np.ndarray, boxes: BoxBatch | Sequence[np.ndarray] | None = None, *,
         min_size: float = 0.0, keys: np.ndarray | None = None) -> NativePlan:
    """The chain ``desc`` planned for dataset ``indices`` of ``epoch`` on the probed ``sizes`` (height, width).

    ``boxes``: the samples' boxes (a `BoxBatch`, or one ``[K, 4]`` array per sample: x0 y0 x1 y1 in pixels of the
    probed source), which RandomIoUCrop draws on; they come back moved and pruned as
    ``planner.plan(..., boxes=boxes).map_box_batch(boxes, min_size=min_size)`` gives them, with the row of each
    kept box among those given. Without them RandomIoUCrop keeps every image whole. ``keys``: the samples' keys
    (a fresh `SampleRandom`'s) to draw from instead of those of (seed, epoch, indices), which are then unused."""
    hw = np.ascontiguousarray(sizes, dtype=np.int64).reshape(-1, 2)
    if keys is not None:
        keys = np.ascontiguousarray(keys, dtype=np.uint64).reshape(-1)
        seed, epoch, idx = 0, 0, None
        n = len(keys)
    else:
        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        n = len(idx)
    if len(hw) != n:
        raise ValueError(f"got {n} indices and {len(hw)} sizes")
    nops = int(desc[1])
    samples = np.zeros(n, dtype=SAMPLE)
    params = np.zeros((n, nops, PARAMS), dtype=np.int64)
    flat = given_counts = out = kept = counts = None
    if boxes is not None:
        given = boxes if isinstance(boxes, BoxBatch) else BoxBatch.of(boxes)
        if len(given) != n:
            raise ValueError(f"got boxes for {len(given)} samples, the batch has {n}")
        flat = np.ascontiguousarray(given.flat, dtype=np.float64)
        out, kept, counts = np.empty_like(flat), np.empty(len(flat), dtype=np.int64), np.empty(n, dtype=np.int64)
        given_counts = np.ascontiguousarray(given.counts, dtype=np.int64)
    interpolation, antialias = NATIVE.plan(np.ascontiguousarray(desc, dtype=np.float64), _check_seed(seed), n, idx,
                                           int(epoch), hw, samples, params, flat, given_counts, float(min_size),
                                           out, kept, counts, keys)
    names = {v: k for k, v in INTERPOLATIONS.items()}
    if boxes is None:
        return NativePlan(samples, params, names[interpolation], bool(antialias))
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    m = int(starts[-1])
    return NativePlan(samples, params, names[interpolation], bool(antialias), BoxBatch(out[:m], starts), kept[:m])


def pack(desc: np.ndarray, planned: NativePlan, decoded_hw: np.ndarray, src: np.ndarray,
         origins: np.ndarray | None = None, strides: np.ndarray | None = None
         ) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:
    """The warp kernel's ``ip`` (N, 16), ``fp`` (N + 1, 16) and grid for the decoded batch (plan.h, ``ing_pack``):
    ``decoded_hw`` (N, 2), ``src`` (N,) pointers, ``origins`` (N, 2) (x0, y0) of decoded regions or None (whole
    images), ``strides`` (N, 3) bytes or None (dense)."""
    n = len(planned.samples)

    def arg(a, dtype, shape):
        return None if a is None else np.ascontiguousarray(a, dtype=dtype).reshape(shape)

    ip = np.empty((n, 16), dtype=np.int64)
    fp = np.empty((n + 1, 16), dtype=np.float64)
    grid = NATIVE.pack(np.ascontiguousarray(desc, dtype=np.float64), 0, n, planned.samples,
                       INTERPOLATIONS[planned.interpolation], int(planned.antialias), arg(origins, np.int64, (n, 2)),
                       arg(decoded_hw, np.int64, (n, 2)), arg(src, np.uint64, (n,)), arg(strides, np.int64, (n, 3)),
                       ip, fp)
    return ip, fp, grid
