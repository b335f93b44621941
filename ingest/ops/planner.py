"""The planner: draw a batch's random parameters once, per sample, and split its ops into stages.

:func:`plan` walks the ops in order on the probed sizes (no pixels needed): each op draws sample n's
parameters from row n of the batch's random source (and sees the samples' boxes, as mapped so far, when given), declares what it
outputs, and joins a stage. Every run of consecutive geometry ops becomes one stage executed as one
:class:`~ingest.ops.affine.Warp` (with a following pointwise-affine op, Normalize, as its epilogue); every
other op is a stage of its own. A warp has one fill, so a run ends before an op of another fill once an op of
the run has put fill into the batch (`affine.fill_apart`). The first stage's warp is known before decoding: ``Plan.warp.roi()`` tells
the GPU decoder which region of each image to decode.

The same plan then moves everything that belongs to the images: :meth:`Plan.execute` the pixels,
:meth:`Plan.map_boxes` the boxes, :meth:`Plan.warp_masks` the masks, :meth:`Plan.map_polygons` polygon
segmentations, and :meth:`Plan.targets` a whole detection target (boxes mapped, masks warped, polygons moved and
clipped, per-box fields pruned with their boxes) in one call.

**area** is pruned with its boxes and otherwise left as the source gave it (COCO's area of the segmentation
in the original image), as torchvision's ``transforms.v2`` and detectron2 leave it: it is what COCOeval uses
to bucket objects into small, medium and large, a property of the annotation rather than of one augmented
view, and after a crop it could not be recomputed for objects without a segmentation. Training losses do not
read it. Recompute it from the mapped boxes or polygons where a view's own area is wanted.
"""

from __future__ import annotations

import copy
import json
import operator
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain, repeat
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

from ..errors import ConfigError
from . import resample
from .affine import (Steps, Warp, clip_polygons, compose, fill_apart, map_boxes_kept, map_points, nonempty,
                     polygon_parts_kept)
from .boxes import BoxBatch, as_array, from_ltrb, split
from .base import (PIXELS, ImageArena, ImageSpec, Images, Op, Rngs, Size, as_list, copy_into, device_and_channels,
                   per_sample, same_size, size_array, size_array_of, size_list, sizes_of)
from .geometry import GeometryOp
from .user import as_ops

_DTYPE = operator.attrgetter("dtype")

#: Per-box target fields that :meth:`Plan.targets` prunes together with the boxes (COCO's names).
PER_BOX = ("labels", "iscrowd", "area")

#: The most samples one plan holds in `plan_sliced`: numpy gives the GIL up in an operation on more than 500
#: items (`ingest._numpy`), so a plan's draws and its warp's launch arguments, written column by column, keep it
#: at up to 256 samples (and ``(n, 2)`` columns pairs): past 500 items every column releases the GIL, and beside
#: a busy thread each release costs up to a switch interval (docs/measurements.md, The GIL).
SLICE = 256


@dataclass
class Stage:
    """A run of geometry ops composed into one warp (``warp`` set, ``steps`` one per op, optionally a
    pointwise-affine ``epilogue`` op), or a single other op (``warp`` None)."""

    drawn: list[tuple[Op, Any]]
    in_sizes: list[Size]
    out_sizes: list[Size]
    steps: list[Steps] = field(default_factory=list)
    warp: Warp | None = None
    epilogue: Op | None = None

    def run(self, images: Images, origins: Sequence[tuple[int, int]] | None = None,
            scales: float | Sequence[float] | None = None, out: torch.Tensor | None = None) -> Images:
        """The stage on ``images``; a warp writes its batch to ``out`` when given (the CPU's op-by-op path and
        other ops ignore it: see :meth:`Plan.execute`)."""
        if self.warp is None:
            (op, params), = self.drawn
            return op.apply(images, params)
        if not len(images):
            return images
        device, channels = device_and_channels(images)
        planned = origins is None and scales is None and sizes_of(images) == self.in_sizes
        if device.type == "cpu" and planned:
            for op, params in self.drawn:  # op by op with torch's kernels: torchvision's results
                images = op.apply(images, params)
            return self.epilogue.apply(images, None) if self.epilogue else images
        w = self.warp
        if origins is not None:
            w = w.shifted(origins).rescaled(size_array_of(images), 1.0 if scales is None else scales)
        elif not planned:
            w = w.rescaled(size_array_of(images), scales)
        dtype = torch.uint8 if isinstance(images, ImageArena) else images[0].dtype
        epilogue = self.epilogue.epilogue(channels, dtype) if self.epilogue else None
        return resample.warp(images, w, epilogue=epilogue, out=out)


@dataclass
class Plan:
    """A batch's ops with every random parameter drawn, split into stages.

    ``drawn`` lists (op, params) in op order; ``out_sizes`` and ``output`` (dtype, and the layout if an op
    fixed one) say what :meth:`execute` returns; ``warp`` is the first stage's warp when the ops start with
    geometry (else None): read ``warp.roi()`` before decoding for region-of-interest decode.
    """

    sizes: list[Size]                  # the source sizes the params were drawn for
    drawn: list[tuple[Op, Any]]
    stages: list[Stage]
    out_sizes: list[Size]
    output: ImageSpec
    content_sizes: list[Size] | None = None  # before the trailing padding ops (PadTo), where there are any
    # The boxes given to `plan` and where they were after every op (`map_box_batch` reuses them)
    tracked: tuple[BoxBatch, "_Boxes"] | None = field(default=None, repr=False, compare=False)

    @property
    def warp(self) -> Warp | None:
        return self.stages[0].warp if self.stages else None

    def execute(self, images: Images, origins: Sequence[tuple[int, int]] | None = None,
                scales: float | Sequence[float] | None = None, *, out: torch.Tensor | None = None) -> Images:
        """Run the plan on the decoded batch.

        ``origins`` = (x0, y0) per sample when the decoder returned only a region of each source (from
        ``warp.roi()``); ``scales`` = decoded/probed size factor when it also downscaled (inferred from the
        sizes when neither is given). On CPU, images of the planned sizes run op by op eagerly
        (torchvision-exact); anything else runs the composed warps. Without a leading warp the images must be
        whole (origins all (0, 0)).

        ``out``: a tensor to write the batch to, of its final shape and dtype (``[N, C, H, W]`` for an NCHW
        layout, else ``[N, H, W, C]``), returned. A last stage that is a warp writes there itself; other
        results are copied in.
        """
        if origins is not None and self.warp is None:
            if any(tuple(o) != (0, 0) for o in origins):
                raise ValueError("`origins` (region-of-interest decode) need a plan that starts with geometry")
            origins = None
        last = len(self.stages) - 1
        for k, stage in enumerate(self.stages):
            into = out if k == last else None
            images = (stage.run(images, origins, scales, into) if k == 0 and stage.warp is not None
                      else stage.run(images, out=into))
        return images if out is None or images is out else copy_into(out, images)

    def map_boxes(self, boxes: Sequence[Any], *, min_size: float = 0.0) -> tuple[list[Any], list[np.ndarray]]:
        """Boxes (one ``[K, 4]`` ltrb array or tensor per sample, absolute pixels of the source) through every
        geometry op: corners mapped, clipped to each op's output, dropped when empty (or narrower or lower
        than ``min_size`` at the end) or by the op's own rule (an IoU crop keeps boxes whose centre it
        holds). Returns the surviving boxes (same type, dtype and device as given) and, per sample, a
        ``[K]`` bool mask of the input boxes kept, for pruning the boxes' other fields."""
        given = BoxBatch.of(boxes)
        mapped, keep = self.map_box_batch(given, min_size=min_size)
        return _like_each(mapped, list(boxes)), split(keep, given.starts)

    def map_box_batch(self, boxes: BoxBatch, *, min_size: float = 0.0) -> tuple[BoxBatch, np.ndarray]:
        """:meth:`map_boxes` on a whole batch at once: the surviving boxes (float64) and an ``[M]`` bool mask
        of the input boxes kept."""
        if len(boxes) != len(self.sizes):
            raise ValueError(f"got boxes for {len(boxes)} samples, the batch has {len(self.sizes)}")
        if self.tracked is not None and self.tracked[0] is boxes:   # mapped already while the plan was drawn
            tracked = copy.copy(self.tracked[1])
        else:
            self._check_steps("boxes other than those it was planned with")
            tracked = _Boxes(boxes)
            for stage in self.stages:
                for (op, params), steps in zip(stage.drawn, stage.steps):
                    tracked.follow(op, params, steps)
        tracked.prune(min_size)
        return tracked.batch(), tracked.keep()

    def _check_steps(self, what: str) -> None:
        """ValueError where a warp's ops have no steps (a plan of the native planner's) to move ``what`` by."""
        if any(stage.warp is not None and not stage.steps for stage in self.stages):
            raise ValueError(f"this plan (the native planner's) keeps no per-op steps to move {what} by")

    def warp_masks(self, masks: Sequence[Any], *, device: torch.device | str | None = None,
                   fill: int = 0) -> list[torch.Tensor]:
        """Masks (one ``[K, H, W]`` uint8 or uint16 array or tensor per sample, at the source size) through
        every geometry stage with the images' own warps, sampled nearest (labels are never blended), ``fill``
        where a pixel has no source (0: "not the object", for instance masks; 255 for a VOC label map), on
        ``device`` (default: where the masks are). On CUDA every mask of the batch is one plane of one buffer
        (host masks go up in one copy) and each stage warps them in one launch; on CPU a sample's masks are
        one gather. A uint16 mask moves as the two bytes of each value (whole values: nearest sampling never
        mixes them)."""
        cuda = (torch.device(device).type == "cuda" if device is not None else
                bool(len(masks)) and isinstance(masks[0], torch.Tensor) and masks[0].is_cuda)
        if cuda:
            batch = _MaskBatch.of(masks, torch.device(device) if device is not None else masks[0].device)
            for stage in self.stages:
                if stage.warp is not None:
                    batch = batch.warped(stage.warp.for_masks(_fill_bytes(fill, batch.itemsize)))
            return batch.per_sample()
        out = [torch.as_tensor(m) for m in masks]
        for stage in self.stages:
            if stage.warp is not None:
                out = _warp_masks(out, stage.warp, fill)
        return out

    def map_polygons(self, segmentations: Sequence[Sequence[Any]]) -> list[list[Any]]:
        """Segmentations (per sample, one entry per object, in COCO's forms and absolute pixels of the
        source: a list of polygon parts ``[x0, y0, x1, y1, ...]``, an RLE ``{"size": [h, w], "counts": ...}``
        or None) through every geometry op, as the image goes. Each vertex is mapped through the op's map
        and each part clipped to the op's output (Sutherland-Hodgman), op by op as boxes are; parts left
        with fewer than 3 vertices or no area are dropped (an object may be left with ``[]``). An RLE is
        decoded, warped like a mask (nearest) and encoded again for the output size (compressed, counts a
        str); its size must be the sample's source size. None stays None. Returns new lists."""
        if len(segmentations) != len(self.sizes):
            raise ValueError(f"got segmentations for {len(segmentations)} samples, the batch has {len(self.sizes)}")
        out = [list(objs) for objs in segmentations]
        self._check_steps("polygons")
        geometry = [steps for stage in self.stages for steps in stage.steps]
        if not geometry:
            return out
        _Parts(out).follow(geometry)
        if any(isinstance(o, dict) for objs in out for o in objs):
            self._warp_rles(out)
        return out

    def _warp_rles(self, segmentations: list[list[Any]]) -> None:
        """Every RLE entry of ``segmentations`` (in place) warped like a mask and encoded again."""
        from pycocotools import mask as mask_utils
        planes = []
        for n, objs in enumerate(segmentations):
            h, w = self.sizes[n]
            rles = [_rle(o, (h, w), n) for o in objs if isinstance(o, dict)]
            planes.append(np.ascontiguousarray(mask_utils.decode(rles).transpose(2, 0, 1)) if rles
                          else np.zeros((0, h, w), dtype=np.uint8))
        for objs, warped in zip(segmentations, self.warp_masks(planes)):
            if not len(warped):
                continue
            encoded = iter(mask_utils.encode(np.asfortranarray(warped.cpu().numpy().transpose(1, 2, 0))))
            for j, o in enumerate(objs):
                if isinstance(o, dict):
                    rle = next(encoded)
                    objs[j] = {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}

    def targets(self, targets: Sequence[dict[str, Any]], *, per_box: Sequence[str] = PER_BOX,
                min_size: float = 0.0) -> list[dict[str, Any]]:
        """Detection targets (one dict per sample) through the plan, in one call: ``boxes`` (``[K, 4]`` ltrb,
        absolute pixels) mapped, ``masks`` (``[K, H, W]`` uint8) pruned and warped, ``polygons`` (one COCO
        segmentation per box, as :meth:`map_polygons` takes them, or that list as JSON text, which comes
        back as JSON text) pruned and moved, and the ``per_box`` fields (``labels``, ``iscrowd``, ``area`` by
        default: arrays, tensors or lists of length K) pruned with their boxes. Other fields pass unchanged;
        ``area`` is pruned, not recomputed (see the module docstring). A sample without ``boxes`` keeps its
        fields; its masks and polygons are still moved.

        Notes: the batch's boxes are mapped and pruned as one array (:meth:`map_box_batch`), and a per-box
        field that is a numpy array (or a tensor) of one dtype in every sample is pruned as one array too;
        other fields sample by sample."""
        boxes = [t.get("boxes") for t in targets]
        given = BoxBatch.of([np.zeros((0, 4)) if b is None else b for b in boxes])
        mapped, keep = self.map_box_batch(given, min_size=min_size)
        has: list[bool] | None = [b is not None for b in boxes]
        if all(has):
            has = None
        return self._targets(targets, has, _like_each(mapped, boxes), keep, given.starts, mapped.starts, per_box)

    def batch_targets(self, targets: Sequence[dict[str, Any]], boxes: BoxBatch, *, per_box: Sequence[str] = PER_BOX,
                      box_format: str = "xyxy", relative: bool = False, min_size: float = 0.0,
                      device: torch.device | None = None) -> list[dict[str, Any]]:
        """:meth:`targets` with every sample's boxes given as one batch, ``boxes`` (absolute ltrb of the source,
        float64; each target's own ``boxes`` is not read), coming back as ``[K, 4]`` float32 arrays in
        ``box_format`` (``"xyxy"``, ``"xywh"`` or ``"cxcywh"``) of each output image, relative to its size with ``relative``
        (`ingest.ops.boxes.from_ltrb`): the pipeline's form. ``masks`` are pruned where they are and warped on
        ``device`` (:meth:`warp_masks`)."""
        fields = {name: [t.get(name) for t in targets] for name in per_box}   # (a sample without it: not joined)
        rows = self.box_rows(boxes, fields, box_format=box_format, relative=relative, min_size=min_size)
        pruned = {name: split(values, rows.starts) for name, values in rows.fields.items()}
        return self._targets(targets, None, split(rows.boxes, rows.starts), rows.keep, boxes.starts, rows.starts,
                             per_box, device, pruned)

    def box_rows(self, boxes: BoxBatch, fields: dict[str, list[Any]] | None = None, *, box_format: str = "xyxy",
                 relative: bool = False, min_size: float = 0.0) -> "BoxRows":
        """A batch's boxes (absolute ltrb of the source) and per-box fields through the plan, as one array each:
        the kept boxes in ``box_format`` (relative to each output image's size with ``relative``: `from_ltrb`),
        and every field of ``fields`` (per sample: one value per box) whose values are numpy arrays of one dtype
        and of the samples' box counts, joined and pruned with its boxes; fields that are not are left out (the
        caller prunes them sample by sample). :meth:`batch_targets` and the pipeline's ops stage both take their
        boxes and per-box fields from here."""
        mapped, keep = self.map_box_batch(boxes, min_size=min_size)
        joined = {}
        for name, values in (fields or {}).items():
            flat = joined_per_box(values, boxes.starts)
            if flat is not None:
                joined[name] = flat[keep]
        return BoxRows(from_ltrb(mapped, size_array(self.out_sizes), box_format, relative), mapped.starts, keep,
                       joined)

    def _targets(self, targets: Sequence[dict[str, Any]], has: list[bool] | None, boxes: list[Any], keep: np.ndarray,
                 before: np.ndarray, after: np.ndarray, per_box: Sequence[str],
                 device: torch.device | None = None, done: dict[str, list[Any]] | None = None
                 ) -> list[dict[str, Any]]:
        """The targets with ``boxes`` (per sample) set and their per-box fields, masks and polygons pruned by
        ``keep`` (``[M]`` over the input boxes, sample n's at rows ``before[n]:before[n + 1]``, its kept ones
        at ``after[n]:after[n + 1]``); then masks warped and polygons moved. ``has``: which samples had boxes
        (None: all). ``done``: per-box fields pruned already (`box_rows`), per sample."""
        out = list(map(dict, targets))
        if has is None:
            for d, b in zip(out, boxes):
                d["boxes"] = b
        else:
            for d, b, h in zip(out, boxes, has):
                if h:
                    d["boxes"] = b
        fields = set().union(*out)
        if "polygons" in fields:
            for d in out:
                if "polygons" in d:
                    d["polygons"] = _segmentation_list(d["polygons"])
        done = done or {}
        for name, values in done.items():
            for d, v in zip(out, values):
                d[name] = v
        for name in [*per_box, "masks", "polygons"]:
            if name not in fields or name in done:
                continue
            everywhere = has is None and sum(map(operator.contains, out, repeat(name))) == len(out)
            pruned = _take_all(list(map(operator.itemgetter(name), out)), keep, before, after) if everywhere else None
            if pruned is not None:
                for d, v in zip(out, pruned):
                    d[name] = v
                continue
            for n, (d, k) in enumerate(zip(out, split(keep, before))):
                if name in d and (has is None or has[n]):
                    d[name] = _take(d[name], k, name)
        if "masks" in fields:
            if not all(map(operator.contains, out, repeat("masks"))):
                raise ValueError("`masks` must be given for every sample of the batch or for none")
            for d, m in zip(out, self.warp_masks([d["masks"] for d in out], device=device)):
                d["masks"] = m
        if "polygons" in fields:
            moved = self.map_polygons([d.get("polygons", []) for d in out])
            for t, d, p in zip(targets, out, moved):
                if "polygons" in d:
                    d["polygons"] = _like_segmentation(p, t["polygons"])
        return out


def plan(ops: Sequence[Op], sizes: Sequence[Size], rngs: Rngs = None, *,
         boxes: Sequence[Any] | None = None, pixels: ImageSpec = PIXELS) -> Plan:
    """Draw every op's params in op order, once, for sources of ``sizes``, and stage the ops.

    ``rngs``: the batch's :class:`~ingest.random.SampleRandom` (the pipeline's keys samples by seed, epoch
    and dataset index), or a Generator or seed to key samples ``0..n-1`` from (:func:`~.base.per_sample`).
    Ops draw on the sizes as an ``(N, 2)`` int64 array. ``boxes`` (one ``[K, 4]`` ltrb array per sample, absolute
    pixels, or a :class:`~ingest.ops.boxes.BoxBatch`) are needed only by ops whose draws depend on them
    (``uses_boxes``: RandomIoUCrop); they are mapped through the ops as they are drawn, and such an op's
    ``draw`` gets them as a BoxBatch. ``pixels``: what the decoder gives (uint8 by default; uint16 and the
    channel count where the loader asked for them). Raises ConfigError when an op cannot take what the op
    before it outputs (or, first, those pixels: `check`).

    Notes: a warp paints every pixel without a source with one fill, its run's last. A geometry op whose fill
    differs from the open run's therefore starts a new warp when an earlier op of the run put fill pixels into
    this batch (`affine.fill_apart`: a crop larger than some image, a pad, a canvas, a rotation), so each warp's
    fill is what op-by-op execution gives; chains of one fill stay one warp.
    """
    if not all(isinstance(op, Op) for op in ops):   # a torchvision transform is wrapped; anything else refused
        ops = as_ops(ops)
    hw = size_array(sizes)  # ops draw on arrays, stages keep lists
    sizes = size_list(hw)
    rngs = per_sample(rngs, len(sizes))
    tracked = None
    if boxes is not None:
        given = BoxBatch.of(boxes)
        if len(given) != len(sizes):
            raise ValueError(f"got boxes for {len(given)} samples, the batch has {len(sizes)}")
        tracked = _Boxes(given)
    spec, cur = pixels, sizes
    content = None  # the sizes before a run of padding ops that nothing after has resized yet
    drawn: list[tuple[Op, Any]] = []
    stages: list[Stage] = []
    warp_inputs: dict[int, np.ndarray] = {}  # stage number -> its input sizes as an array
    for op in ops:
        spec = op.declare(spec)
        if op.uses_boxes:
            params = op.draw(hw, rngs, boxes=None if tracked is None else tracked.batch())
        else:
            params = op.draw(hw, rngs)
        drawn.append((op, params))
        last = stages[-1] if stages else None
        open_warp = last is not None and bool(last.steps) and last.epilogue is None
        if isinstance(op, GeometryOp):
            content = (cur if content is None else content) if op.pads else None
            steps = op.steps(hw, params)
            if tracked is not None:
                tracked.follow(op, params, steps)
            out = size_list(steps.out_sizes)
            if open_warp and fill_apart(last.steps, warp_inputs[len(stages) - 1], steps):
                open_warp = False   # one warp has one fill: an earlier op of the run padded with another
            if open_warp:
                last.drawn.append((op, params))
                last.steps.append(steps)
                last.out_sizes = out
            else:
                warp_inputs[len(stages)] = hw
                stages.append(Stage([(op, params)], cur, out, [steps]))
            cur, hw = out, steps.out_sizes
            continue
        if op.pointwise_affine and open_warp:
            last.epilogue = op
        else:
            stages.append(Stage([(op, params)], cur, op.out_sizes(cur, params)))
            if stages[-1].out_sizes != cur:
                content = None
            cur = stages[-1].out_sizes
            hw = size_array(cur)
    for k, stage in enumerate(stages):
        if stage.steps:
            stage.warp = compose(stage.steps, warp_inputs[k])
    return Plan(sizes, drawn, stages, list(cur), spec, content, None if tracked is None else (given, tracked))


def check(ops: Sequence[Op], pixels: ImageSpec = PIXELS) -> ImageSpec:
    """What ``ops`` output for decoded ``pixels``, without drawing: ConfigError where an op cannot take what
    comes before it (a colour op on 1 or 4 channels, an 8-bit-only op on uint16 pixels, anything after
    Normalize). The pipeline calls it once, at construction."""
    spec = pixels
    for op in ops:
        spec = op.declare(spec)
    return spec


@dataclass
class Sliced:
    """A batch of more than `SLICE` samples planned in slices of at most `SLICE` (`plan_sliced`): ``bounds``
    gives each slice's samples, ``plans`` its plan. :meth:`execute` runs each slice on its rows and writes all
    of them to one output tensor. Reads as a `Plan` does where the pipeline reads one: ``sizes``,
    ``out_sizes``, ``content_sizes``, ``output`` (no ``warp``: it is for whole images, no regions to decode)."""

    bounds: list[tuple[int, int]]
    plans: list[Plan]
    warp = None

    # Joined once, in C: the pipeline reads out_sizes three times per batch (its output, the rows written, this
    # execute's check), as a Plan's list field.
    @cached_property
    def sizes(self) -> list[Size]:
        return list(chain.from_iterable(p.sizes for p in self.plans))

    @cached_property
    def out_sizes(self) -> list[Size]:
        return list(chain.from_iterable(p.out_sizes for p in self.plans))

    @cached_property
    def content_sizes(self) -> list[Size] | None:
        if self.plans[0].content_sizes is None:
            return None
        return list(chain.from_iterable(p.content_sizes for p in self.plans))

    @property
    def output(self) -> ImageSpec:
        return self.plans[0].output

    def execute(self, images: torch.Tensor, origins: None = None, scales: None = None, *,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """Every slice's plan on its rows of ``images`` (one ``[N, H, W, C]`` tensor), written to one
        ``[N, ...]`` tensor, ``out`` or a new one (its layout as :meth:`Plan.execute`'s ``out``). The outputs
        must share a size."""
        if origins is not None or scales is not None:
            raise ValueError("a sliced plan takes whole images at full resolution (no `origins` or `scales`)")
        sizes = self.out_sizes
        if not same_size(sizes):
            raise ValueError("a sliced plan's outputs must share a size")
        spec = self.output
        shape = spec.batch_shape(len(sizes), sizes[0], images.shape[3])
        if out is None:
            out = torch.empty(shape, dtype=spec.dtype, device=images.device)
        elif tuple(out.shape) != shape or out.dtype != spec.dtype:
            raise ValueError(f"`out` is {tuple(out.shape)} {out.dtype}; the batch is {shape} {spec.dtype}")
        for (a, b), p in zip(self.bounds, self.plans):   # tensor slicing keeps the GIL (narrow() would not)
            p.execute(images[a:b], out=out[a:b])
        return out


def plan_sliced(ops: Sequence[Op], sizes: Sequence[Size], rngs: Callable[[int, int], Rngs]) -> Plan | Sliced:
    """:func:`plan` for ``sizes``, in slices of at most `SLICE` samples when there are more: ``rngs(a, b)``
    gives samples a..b-1's random source. Each sample draws from its own key, so the slices draw what one
    plan would."""
    n = len(sizes)
    if n <= SLICE:
        return plan(ops, sizes, rngs(0, n))
    k = -(-n // SLICE)
    bounds = [(n * j // k, n * (j + 1) // k) for j in range(k)]
    return Sliced(bounds, [plan(ops, sizes[a:b], rngs(a, b)) for a, b in bounds])


def run_ops(ops: Sequence[Op], images: Images, rng: Rngs = None, *, device_kind: str = "cpu") -> Images:
    """Plan and execute ``ops`` on a batch, on ``device_kind`` ("cpu" or "cuda"; images are moved there).
    Returns ``[N, ...]`` when the outputs share a size, else a list."""
    if device_kind not in ("cpu", "cuda"):
        raise ConfigError(f"Unknown device_kind {device_kind!r}. Available: cpu, cuda")
    ims = as_list(images)
    if ims and ims[0].device.type != device_kind:
        ahead = device_kind == "cuda"   # to the host: a copy not waited for could be read before it lands
        images = (images.to(device_kind, non_blocking=ahead) if isinstance(images, torch.Tensor)
                  else [im.to(device_kind, non_blocking=ahead) for im in ims])
    return plan(ops, sizes_of(images), rng).execute(images)


# --------------------------------------------------------------------------------------------------

def moved_boxes(given: BoxBatch, kept: BoxBatch, rows: np.ndarray) -> tuple[BoxBatch, "_Boxes"]:
    """`Plan.tracked` for boxes moved through every op elsewhere (the native planner): ``given`` the boxes the plan
    was drawn with, ``kept`` those left (in output pixels), ``rows`` the row of each among ``given``'s."""
    tracked = _Boxes(kept)
    tracked.starts, tracked.row = given.starts, rows
    return given, tracked


class BoxRows(NamedTuple):
    """A batch's boxes and per-box fields through a plan, one array each (`Plan.box_rows`)."""

    boxes: np.ndarray                # [K, 4] float32: the kept boxes of every sample, in the asked format
    starts: np.ndarray               # [N + 1] int64: sample n's are rows starts[n]:starts[n + 1]
    keep: np.ndarray                 # [M] bool: which of the boxes given were kept
    fields: dict[str, np.ndarray]    # per-box fields joined and pruned (rows as `boxes`'s)


class _Boxes:
    """A batch's boxes on their way through the ops: one ``[M, 4]`` array, the sample each belongs to and its
    row among the batch's input boxes (boxes stay in sample order)."""

    def __init__(self, boxes: BoxBatch):
        self.starts = boxes.starts
        self.flat = boxes.flat
        self.owner = boxes.owner
        self.row = np.arange(len(self.flat))

    def batch(self) -> BoxBatch:
        """The boxes still here, with their samples' offsets."""
        return BoxBatch(self.flat, np.searchsorted(self.owner, np.arange(len(self.starts)), side="left"))

    def follow(self, op: GeometryOp, params: Any, steps: Steps) -> None:
        """Through one geometry op: its own filter, then the map, clip and the drop of empty boxes."""
        chosen = op.box_filter(self.flat, self.owner, params)
        if chosen is not None:
            self._select(chosen)
        self.flat, kept = map_boxes_kept(steps, self.flat, self.owner)
        self._select(kept)

    def prune(self, min_size: float) -> None:
        if min_size > 0:
            self._select(nonempty(self.flat, min_size))

    def keep(self) -> np.ndarray:
        """Which of the batch's input boxes are still here, ``[M]`` bool."""
        kept = np.zeros(int(self.starts[-1]), dtype=bool)
        kept[self.row] = True
        return kept

    def _select(self, mask: np.ndarray) -> None:
        if not mask.all():
            self.flat, self.owner, self.row = self.flat[mask], self.owner[mask], self.row[mask]


class _Parts:
    """The polygon parts of a batch's segmentations on their way through the ops: all vertices in one
    ``[M, 2]`` array, the part of each, and each part's sample and (object, position in the object)."""

    def __init__(self, segmentations: list[list[Any]]):
        self.segmentations = segmentations
        coords, where = [], []
        for n, objs in enumerate(segmentations):
            for j, obj in enumerate(objs):
                if isinstance(obj, (list, tuple)):
                    for part in obj:
                        coords.append(_vertices(part, n, j))
                        where.append((n, j))
        self.where = where
        self.owner = np.array([n for n, _ in where], dtype=np.int64)
        self.part = np.repeat(np.arange(len(coords)), [len(c) for c in coords])
        self.points = np.concatenate(coords) if coords else np.zeros((0, 2))

    def follow(self, geometry: Sequence[Steps]) -> None:
        """Through every op's map and clip, then written back into the segmentations (as lists of floats)."""
        points, part = self.points, self.part
        for steps in geometry:
            points = map_points(steps, points, self.owner[part])
            points, part = clip_polygons(points, part, steps.out_sizes[self.owner[part]])
        points, part = polygon_parts_kept(points, part)
        for n, j in self.where:
            self.segmentations[n][j] = []
        starts = np.flatnonzero(np.r_[True, part[1:] != part[:-1]]) if len(part) else np.zeros(0, dtype=np.int64)
        for lo, hi in zip(starts.tolist(), np.r_[starts[1:], len(part)].tolist()):
            n, j = self.where[int(part[lo])]
            self.segmentations[n][j].append(points[lo:hi].ravel().tolist())


def _vertices(part: Any, sample: int, obj: int) -> np.ndarray:
    """A polygon part ``[x0, y0, x1, y1, ...]`` as ``[P, 2]`` float64."""
    try:
        a = np.asarray(part, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"sample {sample}, object {obj}: a polygon part must be a list of numbers") from err
    if a.ndim != 1 or len(a) % 2 or not np.isfinite(a).all():
        raise ValueError(f"sample {sample}, object {obj}: a polygon part must be a flat list of an even "
                         f"number of finite coordinates, got shape {a.shape}")
    return a.reshape(-1, 2)


def _rle(obj: dict, size: tuple[int, int], sample: int) -> dict:
    """An RLE segmentation as pycocotools' ``decode`` takes it; its size must be ``size`` (height, width)."""
    from pycocotools import mask as mask_utils
    if list(obj.get("size", ())) != list(size) or "counts" not in obj:
        raise ValueError(f"sample {sample}: an RLE segmentation must have counts and the image's size "
                         f"{list(size)}, got size {obj.get('size')}")
    counts = obj["counts"]
    if isinstance(counts, list):   # uncompressed
        return mask_utils.frPyObjects(obj, *size)
    return {"size": list(size), "counts": counts.encode("ascii") if isinstance(counts, str) else counts}


def _segmentation_list(value: Any) -> list[Any]:
    """A per-object segmentation list, from itself or its JSON text."""
    objs = json.loads(value) if isinstance(value, (str, bytes)) else value
    if not isinstance(objs, (list, tuple)):
        raise ValueError(f"polygons must be a list with one segmentation per object, got {type(objs).__name__}")
    return list(objs)


def scale_polygons(value: Any, sx: float, sy: float) -> Any:
    """Per-object segmentations (a list, or its JSON text) with every polygon vertex's x multiplied by
    ``sx`` and y by ``sy`` (relative coordinates to pixels and back, or a plain resize); RLEs and None as
    they are. Returns the type given."""
    objs = _segmentation_list(value)
    scale = np.array([sx, sy], dtype=np.float64)
    out = [[(_vertices(part, 0, j) * scale).ravel().tolist() for part in obj] if isinstance(obj, (list, tuple))
           else obj for j, obj in enumerate(objs)]
    return _like_segmentation(out, value)


def _like_segmentation(objs: list[Any], ref: Any) -> Any:
    """``objs`` as JSON text (str or bytes) when ``ref`` was, else as the list."""
    if isinstance(ref, str):
        return json.dumps(objs)
    return json.dumps(objs).encode("utf-8") if isinstance(ref, bytes) else objs


class _MaskBatch(NamedTuple):
    """A batch's masks as the planes of one byte buffer: sample n's ``shapes[n]`` = (K, H, W) planes follow
    sample n - 1's in ``storage`` (1-D uint8), each ``[H, W]`` contiguous, of ``dtype`` (a uint16 plane is
    an ``[H, W, 2]`` image of its values' bytes). What the warp kernel reads (as an `ImageArena`) and writes
    (`resample.warp` puts a ragged batch's outputs one after another in one buffer), so a stage costs one
    launch and no view per mask."""

    storage: torch.Tensor
    shapes: np.ndarray
    dtype: torch.dtype = torch.uint8

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype == torch.uint16 else 1

    @classmethod
    def of(cls, masks: Sequence[Any], device: torch.device) -> "_MaskBatch":
        """The masks on ``device``: host arrays joined in one host buffer and copied up once, tensors joined
        there."""
        shapes = np.array(list(map(_mask_shape, masks)), dtype=np.int64).reshape(-1, 3)
        if all(isinstance(m, np.ndarray) or (isinstance(m, torch.Tensor) and not m.is_cuda) for m in masks):
            host = np.concatenate([np.asarray(m).reshape(-1) for m in masks]) if len(masks) else np.zeros(0, np.uint8)
            storage = torch.from_numpy(host).to(device, non_blocking=True)
        else:
            storage = torch.cat([torch.as_tensor(m, device=device).reshape(-1) for m in masks])
        if storage.dtype not in (torch.uint8, torch.uint16):
            raise ValueError(f"masks must be uint8 or uint16, got {storage.dtype}")
        return cls(storage.view(torch.uint8), shapes, storage.dtype)

    def warped(self, w: Warp) -> "_MaskBatch":
        """Every plane through its sample's map in ``w`` (one `resample.warp` of all planes)."""
        k, hw, c = self.shapes[:, 0], self.shapes[:, 1:], self.itemsize
        out = np.concatenate([k[:, None], size_array(w.out_sizes)], axis=1)
        planes = int(k.sum())
        if not planes:
            return _MaskBatch(self.storage[:0], out, self.dtype)
        owner = np.repeat(np.arange(len(k)), k)
        area = hw[:, 0] * hw[:, 1] * c
        first = np.cumsum(k) - k                     # each sample's first plane
        start = np.cumsum(k * area) - k * area       # ... and its byte offset
        offsets = start[owner] + (np.arange(planes) - first[owner]) * area[owner]
        result = resample.warp(ImageArena(self.storage, offsets, hw[owner], channels=c), w.take(owner))
        if isinstance(result, torch.Tensor):
            return _MaskBatch(result.reshape(-1), out, self.dtype)
        total = int((out[:, 0] * out[:, 1] * out[:, 2]).sum()) * c
        base = result[0]._base
        if base is not None and base.dim() == 1 and base.numel() == total and base.data_ptr() == result[0].data_ptr():
            return _MaskBatch(base, out, self.dtype)   # the kernel's outputs: one buffer, in plane order
        return _MaskBatch(torch.cat([r.reshape(-1) for r in result]), out, self.dtype)

    def per_sample(self) -> list[torch.Tensor]:
        """Sample by sample: ``[K, H, W]`` views of the buffer."""
        sizes = (self.shapes[:, 0] * self.shapes[:, 1] * self.shapes[:, 2] * self.itemsize).tolist()
        parts = self.storage.split(sizes) if sizes else []
        return [part.view(self.dtype).view(shape) for part, shape in zip(parts, map(tuple, self.shapes.tolist()))]


def _mask_shape(m: Any) -> tuple[int, int, int]:
    return tuple(m.shape)


def _fill_bytes(fill: int, itemsize: int) -> tuple[float, ...]:
    """A mask's fill value as the warp's per-channel fill of its bytes (little-endian)."""
    return tuple(float(b) for b in int(fill).to_bytes(itemsize, "little"))


def _as_bytes(m: torch.Tensor) -> torch.Tensor:
    """``[K, H, W]`` uint8 or uint16 masks as ``[K, H, W, itemsize]`` uint8 (a view where contiguous)."""
    if m.dtype not in (torch.uint8, torch.uint16):
        raise ValueError(f"masks must be uint8 or uint16, got {m.dtype}")
    c = 2 if m.dtype == torch.uint16 else 1
    return m.contiguous().view(torch.uint8).view(*m.shape, c)


def _from_bytes(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of `_as_bytes`."""
    return b.contiguous().view(dtype).view(b.shape[:-1])


def _warp_masks(masks: list[torch.Tensor], w: Warp, fill: int = 0) -> list[torch.Tensor]:
    """Each sample's ``[K, H, W]`` masks resampled nearest by its map in ``w`` (fill ``fill``), on the CPU."""
    w = w.for_masks()   # (the box that every op reads; the fill is per dtype, below)
    counts = [int(m.shape[0]) for m in masks]
    out = [m.new_zeros((0,) + tuple(size)) for m, size in zip(masks, w.out_sizes)]
    if not sum(counts):
        return out
    for n, m in enumerate(masks):  # the sample's masks as the channels of one image: one gather
        if not counts[n]:
            continue
        planes = _as_bytes(m)
        k, c = planes.shape[0], planes.shape[3]
        fill_bytes = _fill_bytes(fill, c)
        if w.matrix[n, 0, 1] == 0 and w.matrix[n, 1, 0] == 0:
            moved = _nearest_aligned(planes, w, n, fill_bytes)
        else:   # [K, H, W, c] -> an [H, W, K * c] image, and back
            image = planes.permute(1, 2, 0, 3).reshape(*planes.shape[1:3], k * c)
            warped = as_list(resample.warp([image], w.for_masks(fill_bytes * k).take([n])))[0]
            moved = warped.reshape(*warped.shape[:2], k, c).permute(2, 0, 1, 3)
        out[n] = _from_bytes(moved, m.dtype)
    return out


def _nearest_aligned(masks: torch.Tensor, w: Warp, n: int, fill: Sequence[float]) -> torch.Tensor:
    """``[K, H, W, c]`` mask bytes through sample n's map of ``w`` when it has no rotation or shear (crops,
    flips, resizes, pads): :func:`resample.warp`'s nearest sampling, ``fill`` (per byte) where it reads
    none, computed per row and per column and applied as one gather (the warp computes a coordinate pair
    per output pixel). Same arithmetic, so the same result (tested)."""
    (m00, _, m02), (_, m11, m12) = w.matrix[n, :2]
    bx0, by0, bx1, by1 = w.box[n]
    oh, ow = w.out_sizes[n]
    value = torch.tensor([int(v) for v in fill], dtype=torch.uint8)
    x = m00 * (np.arange(ow, dtype=np.float64) + 0.5) + m02
    y = m11 * (np.arange(oh, dtype=np.float64) + 0.5) + m12
    eps = 1e-6   # the taps: the whole pixels the box covers
    tx0, ty0, tx1, ty1 = (int(np.floor(bx0 + eps)), int(np.floor(by0 + eps)), int(np.ceil(bx1 - eps)),
                          int(np.ceil(by1 - eps)))
    if tx1 <= tx0 or ty1 <= ty0:
        return value.expand(masks.shape[0], oh, ow, masks.shape[3]).clone()
    xi = np.clip(np.floor(x).astype(np.int64), tx0, tx1 - 1)
    yi = np.clip(np.floor(y).astype(np.int64), ty0, ty1 - 1)
    h, wd = masks.shape[1:3]
    good_x = (x >= bx0) & (x <= bx1) & (xi >= 0) & (xi < wd)
    good_y = (y >= by0) & (y <= by1) & (yi >= 0) & (yi < h)
    rows = torch.from_numpy(np.clip(yi, 0, h - 1))
    cols = torch.from_numpy(np.clip(xi, 0, wd - 1))
    out = masks.index_select(1, rows).index_select(2, cols)
    out[:, torch.from_numpy(~good_y)] = value   # the rows and the columns that read fill
    out[:, :, torch.from_numpy(~good_x)] = value
    return out


def _like(boxes: np.ndarray, ref: Any) -> Any:
    """``boxes`` as the type of ``ref``: a tensor of its dtype and device, or an array of its float dtype."""
    if isinstance(ref, torch.Tensor):
        dtype = ref.dtype if ref.is_floating_point() else torch.float32
        return torch.from_numpy(boxes).to(device=ref.device, dtype=dtype)
    dtype = getattr(ref, "dtype", np.float64)
    return boxes.astype(dtype if np.issubdtype(dtype, np.floating) else np.float64)


def _like_each(boxes: BoxBatch, refs: Sequence[Any]) -> list[Any]:
    """Each sample's boxes as the type of its ``refs`` entry (`_like`); converted once for the batch when the
    refs are all numpy arrays of one dtype, or all tensors of one dtype and device."""
    types = set(map(type, refs))
    if types == {np.ndarray} and len(set(map(_DTYPE, refs))) == 1:
        return split(_like(boxes.flat, refs[0]), boxes.starts)
    if types == {torch.Tensor} and len({(r.dtype, r.device) for r in refs}) == 1:
        return split(_like(boxes.flat, refs[0]), boxes.starts)
    return [_like(b, ref) for b, ref in zip(boxes.per_sample(), refs)]


def _take_all(values: list[Any], keep: np.ndarray, before: np.ndarray, after: np.ndarray) -> list[Any] | None:
    """Every sample's per-box field pruned by ``keep`` at once (see `Plan._targets`), when the values are all
    numpy arrays, or all tensors, of one dtype (and device) whose lengths are the samples' box counts; else
    None (then `_take` goes sample by sample, and says which field is wrong)."""
    types = set(map(type, values))
    if types == {np.ndarray}:
        joined = joined_per_box(values, before)
        return None if joined is None else split(joined[keep], after)
    if types != {torch.Tensor} or len(set(map(_DTYPE, values))) != 1 or not _lengths_are(values, before):
        return None
    if len({v.device for v in values}) == 1:
        try:
            joined = torch.cat(values)
        except RuntimeError:
            return None
        return split(joined[torch.from_numpy(keep).to(joined.device)], after)
    return None


def joined_per_box(values: list[Any], starts: np.ndarray) -> np.ndarray | None:
    """A per-box field of every sample as one array, sample n's values at rows ``starts[n]:starts[n + 1]``, when
    the values are all numpy arrays of one dtype whose lengths are the samples' box counts (and whose shapes
    agree past the first dimension); else None."""
    if set(map(type, values)) != {np.ndarray} or len(set(map(_DTYPE, values))) != 1:
        return None
    if not _lengths_are(values, starts):
        return None
    try:
        return np.concatenate(values)
    except ValueError:   # shapes differ beyond the first dimension
        return None


def _lengths_are(values: list[Any], starts: np.ndarray) -> bool:
    """Whether the values' lengths are the counts that ``starts`` (offsets) give (False for a 0-d value)."""
    try:
        lengths = np.fromiter(map(len, values), np.int64, len(values))
    except TypeError:   # a 0-d value
        return False
    return np.array_equal(lengths, np.diff(starts))


def _take(value: Any, keep: np.ndarray, name: str) -> Any:
    """The entries of a per-box field where ``keep`` is set."""
    if len(value) != len(keep):
        raise ValueError(f"target field `{name}` has {len(value)} entries for {len(keep)} boxes")
    if isinstance(value, torch.Tensor):
        return value[torch.from_numpy(keep).to(value.device)]
    if isinstance(value, np.ndarray):
        return value[keep]
    return [v for v, k in zip(value, keep) if k]
