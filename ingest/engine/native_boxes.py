"""Detection on the native engine, its Python side (`ingest.native` calls it): which detection loaders it runs,
what it tells the engine once (`Detection`: where the boxes come from, the per-box and per-sample fields), the
output ring's sizes, and each batch's outputs as views of the slot's buffers (`SlotViews`), the engine having
written them (``ingest/_native/engine_det.h``).

Rules:

- **Eligible**: a source with ``native_boxes()``, whose fields besides image and label are its boxes, int or float
  per-box fields that the Python stages prune with the boxes (`engine.boxes.PER_BOX`, or the source's
  ``per_box``) and int per-sample fields (no masks or polygons); a chain the native planner describes (batch-wide
  PadTo included) whose output sides are bounded (a Resize to a size, with ``max_size`` or by its longer side, a
  crop: `bound`), without a centred batch-wide PadTo or relative boxes with a batch-wide PadTo (their rows would
  move, or their boxes rescale, when Python fills a larger row).
- **Where the boxes come from**: a table (`formats._native_table.NativeBoxes`: COCO's annotations) is handed over
  once, converted to absolute ltrb here; record keys (`formats._native_table.RecordBoxes`: TFRecord records of the
  Object Detection API layout) are handed over once, and the engine scans each record's boxes and fields out of
  the record it has just read, converting them as the reader does. Either way each batch's boxes are gathered
  into its job after the read and take one path from there.
- **The same batch as the Python engine**: images a list of per-sample CHW views (or, with a batch-wide PadTo, one
  tensor), boxes float32 ``[B, K, 4]`` in the asked format padded with 0, per-box ints int64 padded with -1 and
  floats float32 padded with 0, ``<name>_lengths`` int64 per box field, ``image_sizes`` int64 ``[B, 2]`` where an
  op pads, per-sample ints int64 ``[B]``; all on the device, in the source's field order.
- **Ring**: each slot's image buffer holds ``batch`` rows of the largest output (`bound`), its target buffer
  ``batch`` samples of ``most`` boxes, both made at start: a table's most boxes per sample, or for records
  `RECORD_BOXES`; a record with more falls back (its row filled by the Python pipeline, reason "boxes").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..formats.base import fields_of
from ..formats.boxes import box_format as check_box_format
from ..ops.boxes import BoxBatch, to_ltrb
from ..formats._native_table import RecordBoxes
from ..ops.detection import PadTo, RandomIoUCrop, ZoomOut
from ..ops.geometry import CenterCrop, Flip, RandomResizedCrop, Resize
from .boxes import PER_BOX
from .collate import PAD, stays_on_host

#: The engine's info array: int64s before the rows (engine_det.h DET_HEAD), columns per row.
HEAD, COLUMNS = 32, 5
#: Box formats by the engine's code.
FORMATS = {"xyxy": 0, "xywh": 1, "cxcywh": 2}
_VALUE_KINDS = {"ints": (np.int64, torch.int64), "floats": (np.float32, torch.float32)}
#: Boxes per sample the slots hold where the boxes come from each record (a record with more falls back).
RECORD_BOXES = 256
#: A record's scan codes (engine_det.h): the box keys', then per field kind.
_CODES = {"boxes": b"FFFFii", "ints": b"I", "floats": b"F", "int": b"i", "decimal": b"b"}


@dataclass(frozen=True)
class Detection:
    """What the engine is given once, and how the batches' fields come out: a table's boxes and fields (``boxes``,
    ``starts``, the fields' values, ``declared``), or ``record``, the keys and scan codes of each record's."""

    boxes: np.ndarray | None   # float64 [M, 4]: absolute ltrb of each image's declared size (None: records)
    starts: np.ndarray | None  # int64 [n + 1]
    per_box: tuple             # (name, values int64 or float32 [M] (None: records), torch dtype, pad)
    per_sample: tuple          # (name, values int64 [n] (None: records))
    declared: np.ndarray | None
    box_format: str
    relative: bool
    bound: tuple[int, int]     # the largest output's sides, (shorter, longer)
    batchwide: bool            # a PadTo(batch=True): one size per batch, one tensor
    sizes: bool                # image_sizes delivered (the chain pads)
    order: tuple[str, ...]     # the fields as the Python engine orders them
    fill: tuple[float, ...]    # the padding's levels per channel
    most: int = 0              # boxes per sample the slots hold
    record: tuple | None = None   # (keys, codes) of each record's boxes and fields (engine_det.h)

    @property
    def fields(self) -> frozenset[str]:
        return frozenset(self.order)

    def stride(self, channels: int) -> int:
        """Output elements between two rows of a ragged slot: the largest image's."""
        return self.bound[0] * self.bound[1] * channels

    def row_capacity(self, channels: int) -> int:
        """Elements per row a slot holds: a batch-wide size may be the longer side both ways."""
        side = self.bound[1]
        return side * side * channels if self.batchwide else self.stride(channels)

    def target_bytes(self, batch: int) -> int:
        """The largest batch's staged targets (engine_det.h's sections, each 8-byte aligned)."""
        cells = batch * self.most
        total = cells * 16 + sum((cells * dtype.itemsize + 7) // 8 * 8 for _, _, dtype, _ in self.per_box)
        return total + batch * 8 * (1 + len(self.per_box)) + batch * 16 + batch * 8 * len(self.per_sample) + 64


def bound(ops: Sequence) -> tuple[int, int] | None:
    """The output sides' bound (shorter, longer) of a chain, or None where an op leaves it unbounded."""
    sides = None
    for op in ops:
        if isinstance(op, Resize):
            if op.size is not None:
                sides = tuple(sorted(op.size))
            elif op.shorter is not None and op.max_size:
                sides = (min(op.shorter, op.max_size), op.max_size)
            elif op.longer is not None:
                sides = (op.longer, op.longer)
            else:
                sides = None
        elif isinstance(op, (CenterCrop, RandomResizedCrop)):
            sides = tuple(sorted(op.size))
        elif isinstance(op, ZoomOut):
            sides = None
        elif isinstance(op, PadTo) and sides is not None:
            if op.size is not None:
                big = max(op.size)
                sides = (max(sides[0], big), max(sides[1], big))
            if op.multiple:
                sides = tuple(-(-s // op.multiple) * op.multiple for s in sides)
        elif not isinstance(op, (Flip, RandomIoUCrop, PadTo)) and type(op).__name__ != "Normalize":
            return None
    return sides


def detection_of(source, ops: Sequence, fill: Sequence[float]) -> tuple[Detection | None, str | None]:
    """(the `Detection` for a source with boxes, None), or (None, why the engine does not run it)."""
    give = getattr(source, "native_boxes", None)
    if give is None:
        return None, (f"{type(source).__name__} gives the engine no boxes (COCO's annotations and TFRecord records "
                      "of the Object Detection API layout do)")
    fields = fields_of(source)
    box_ops = [op for op in ops if type(op).__name__ != "Normalize"]
    pads = [op for op in box_ops if isinstance(op, PadTo)]
    batchwide = any(op.batch for op in pads)
    if any(op.batch and op.center for op in pads):
        return None, "a centred PadTo(batch=True) (a row Python fills could move every row)"
    sides = bound(box_ops)
    if sides is None:
        return None, "its chain's output size is not bounded (a Resize with max_size, to a size, or a crop bounds it)"
    pruned = list(getattr(source, "per_box", None) or PER_BOX)   # (the per-box fields the Python stages prune)
    order, per_box_kinds, per_sample_kinds = [], {}, {}
    for name, field in fields.items():
        if name in ("image", "label"):
            continue
        if name == "boxes" and field.kind == "array":
            order += ["boxes", "boxes_lengths"]
        elif field.kind in _VALUE_KINDS and name not in pruned:
            return None, (f"its field {name!r} is a list the Python stages do not prune with the boxes (they prune "
                          f"{', '.join(pruned)})")
        elif field.kind in _VALUE_KINDS:
            per_box_kinds[name] = field.kind
            order += [name, f"{name}_lengths"]
        elif field.kind == "int":
            per_sample_kinds[name] = field.kind
            order.append(name)
        else:
            return None, f"its field {name!r} ({field.kind}) is not one it collates (boxes and their int and float fields)"
    try:
        given = give()
    except Exception as err:  # noqa: BLE001 - the source's NotNative or its data's problem: the reason
        return None, f"{type(source).__name__} gives no boxes here: {err}"
    relative = bool(getattr(source, "relative", False))
    if relative and batchwide:
        return None, "relative boxes with a PadTo(batch=True) (they scale by the batch's size)"
    if set(per_box_kinds) != set(given.per_box) or set(per_sample_kinds) != set(given.per_sample):
        return None, "its per-box and per-sample fields are not all given to the engine"
    fmt = check_box_format(getattr(source, "box_format", "xyxy"))
    per_box_of = {name: (_VALUE_KINDS[kind][1], PAD[kind]) for name, kind in per_box_kinds.items()}
    sizes = bool(pads)
    order += ["image_sizes"] if sizes else []
    shape = dict(box_format=fmt, relative=relative, bound=sides, batchwide=batchwide, sizes=sizes, order=tuple(order),
                 fill=tuple(float(v) for v in fill))
    if isinstance(given, RecordBoxes):
        if relative:
            return None, "relative boxes from records (the engine scans absolute ones)"
        keys = [*given.boxes, *(given.per_box[n][0] for n in per_box_kinds),
                *(given.per_sample[n][0] for n in per_sample_kinds)]
        codes = b"".join([_CODES["boxes"], *(_CODES[given.per_box[n][1]] for n in per_box_kinds),
                          *(_CODES[given.per_sample[n][1]] for n in per_sample_kinds)])
        return Detection(None, None, tuple((n, None, *per_box_of[n]) for n in per_box_kinds),
                         tuple((n, None) for n in per_sample_kinds), None, most=RECORD_BOXES,
                         record=([k.encode("utf-8") for k in keys], codes), **shape), None
    n = len(given.starts) - 1
    hw = given.declared if given.declared is not None else np.ones((n, 2), np.int64)
    if relative and given.declared is None:
        return None, "relative boxes without the images' declared sizes"
    ltrb = to_ltrb(BoxBatch(np.asarray(given.boxes, np.float64).reshape(-1, 4), given.starts), hw, fmt,
                   relative).flat
    per_box = tuple((name, np.ascontiguousarray(given.per_box[name], _VALUE_KINDS[kind][0]), *per_box_of[name])
                    for name, kind in per_box_kinds.items())
    per_sample = tuple((name, np.ascontiguousarray(given.per_sample[name], np.int64)) for name in per_sample_kinds)
    starts = np.ascontiguousarray(given.starts, np.int64)
    return Detection(np.ascontiguousarray(ltrb, np.float64), starts, per_box, per_sample,
                     None if given.declared is None else np.ascontiguousarray(given.declared, np.int64),
                     most=int(np.diff(starts).max()) if n > 0 else 0, **shape), None


def engine_arguments(det: Detection, channels: int) -> tuple:
    """``Engine.set_detection``'s arguments (its stride: a row's capacity, the rows' spacing in a ragged slot and the
    largest output a sample may have)."""
    fields = [(values, dtype.itemsize, np.array([pad], _NUMPY[dtype]).tobytes()) for _, values, dtype, pad in
              det.per_box]
    return (det.boxes, det.starts, fields, [v for _, v in det.per_sample], FORMATS[det.box_format], det.relative,
            det.declared, det.row_capacity(channels), det.batchwide, det.record, det.most)


_NUMPY = {torch.int64: np.int64, torch.float32: np.float32}


class SlotViews:
    """One slot's detection buffers: the image rows (flat), the device targets (as int64 and float32), the host
    staging the engine writes them from (pinned with CUDA; the counts and sizes are handed out from it: they stay on
    the host, `collate.stays_on_host`) and its info array."""

    __slots__ = ("out", "targets", "i64", "f32", "staging", "host", "host_i64", "info")

    def __init__(self, out: torch.Tensor, targets: torch.Tensor, staging: torch.Tensor, info: np.ndarray):
        self.out, self.targets, self.staging, self.info = out, targets, staging, info
        self.host = staging.numpy()
        self.i64 = targets[:targets.numel() // 8 * 8].view(torch.int64)
        self.f32 = targets[:targets.numel() // 4 * 4].view(torch.float32)
        self.host_i64 = staging[:staging.numel() // 8 * 8].view(torch.int64)

    def shapes(self, rows: int) -> list[list[int]]:
        """Per row: out height, width, content height, width, kept boxes."""
        return self.info[HEAD:HEAD + COLUMNS * rows].reshape(rows, COLUMNS).tolist()

    def images(self, rows: int, shapes: list[list[int]], det: Detection, layout: str | None, nchw: bool,
               channels: int) -> Any:
        """The batch's images as the Python engine gives them: a list of per-sample tensors (CHW views of HWC
        memory where no op chose a layout), or with a batch-wide PadTo one tensor."""
        c = channels
        if det.batchwide:
            h = max(s[0] for s in shapes)
            w = max(s[1] for s in shapes)
            if nchw:
                return self.out.as_strided((rows, c, h, w), (c * h * w, h * w, w, 1), 0)
            if layout is None:
                return self.out.as_strided((rows, c, h, w), (h * w * c, 1, w * c, c), 0)
            return self.out.as_strided((rows, h, w, c), (h * w * c, w * c, c, 1), 0)
        stride, out = det.stride(c), self.out
        if nchw:
            return [out.as_strided((c, h, w), (h * w, w, 1), r * stride) for r, (h, w, _, _, _) in enumerate(shapes)]
        if layout is None:
            return [out.as_strided((c, h, w), (1, w * c, c), r * stride) for r, (h, w, _, _, _) in enumerate(shapes)]
        return [out.as_strided((h, w, c), (w * c, c, 1), r * stride) for r, (h, w, _, _, _) in enumerate(shapes)]

    def fields(self, rows: int, det: Detection) -> dict[str, torch.Tensor]:
        """The batch's target fields in the Python engine's order: views of the device targets, the counts and
        sizes of the host staging."""
        info = self.info
        k = int(info[0])
        offsets = info[4:4 + int(info[3])].tolist()
        nf = len(det.per_box)
        got: dict[str, torch.Tensor] = {"boxes": self.f32.as_strided((rows, k, 4), (4 * k, 4, 1), offsets[0] // 4)}
        for f, (name, _, dtype, _) in enumerate(det.per_box):
            base = self.i64 if dtype == torch.int64 else self.f32
            size = 8 if dtype == torch.int64 else 4
            got[name] = base.as_strided((rows, k), (k, 1), offsets[1 + f] // size)
        for f, name in enumerate(["boxes"] + [name for name, *_ in det.per_box]):
            got[f"{name}_lengths"] = self.host_i64.as_strided((rows,), (1,), offsets[1 + nf + f] // 8)
        if det.sizes:
            got["image_sizes"] = self.host_i64.as_strided((rows, 2), (2, 1), offsets[2 + 2 * nf] // 8)
        for v, (name, _) in enumerate(det.per_sample):
            got[name] = self.i64.as_strided((rows,), (1,), offsets[3 + 2 * nf + v] // 8)
        return {name: got[name] for name in det.order}


def merged(det: Detection, rows: int, filled: list[int], dropped: list[int], images: Any, fields: dict[str, Any],
           done_images: Any, done_fields: dict[str, Any], fill: Sequence[float], device: torch.device,
           layout: str | None, nchw: bool) -> tuple[Any, dict[str, Any], np.ndarray]:
    """A batch with rows Python filled (``filled``: their rows, in the order of ``done_*``) and rows dropped (their
    samples failed there): images and fields rebuilt as new tensors the Python engine's way (padded to the most
    boxes, a batch-wide size the largest of the two). Returns the images, the fields and the rows kept."""
    kept = np.array([r for r in range(rows) if r not in set(dropped)], np.int64)
    at = {r: q for q, r in enumerate(filled)}
    done_list = list(done_images.unbind(0)) if isinstance(done_images, torch.Tensor) else list(done_images)
    if det.batchwide:
        ours = images
        heights = [t.shape[-2] if (layout is None or nchw) else t.shape[0] for t in done_list]
        widths = [t.shape[-1] if (layout is None or nchw) else t.shape[1] for t in done_list]
        hwc = layout is not None and not nchw
        h0, w0 = (ours.shape[1], ours.shape[2]) if hwc else (ours.shape[2], ours.shape[3])
        h, w = max([h0, *heights]), max([w0, *widths])
        c = ours.shape[3] if hwc else ours.shape[1]
        levels = torch.tensor(list(fill)[:c], dtype=ours.dtype, device=ours.device)
        canvas = torch.empty((len(kept), h, w, c), dtype=ours.dtype, device=ours.device)
        canvas[:] = levels
        for new, r in enumerate(kept.tolist()):
            src = done_list[at[r]] if r in at else ours[r]
            src = src if hwc else src.permute(1, 2, 0)
            canvas[new, :src.shape[0], :src.shape[1]] = src
        images = canvas if hwc else (canvas.permute(0, 3, 1, 2).contiguous() if nchw else canvas.permute(0, 3, 1, 2))
    else:
        # (the engine's rows copied: the slot goes back to the engine once the copies queued so far have run)
        images = [done_list[at[r]] if r in at else images[r].clone() for r in kept.tolist()]
    if not fields:
        return images, fields, kept
    out: dict[str, Any] = {}

    def rows_of(source: dict[str, Any], name: str) -> list[np.ndarray]:
        values, lengths = source[name].cpu().numpy(), source[f"{name}_lengths"].cpu().numpy()
        return [values[q, :lengths[q]] for q in range(len(lengths))]

    for name in [n for n in det.order if f"{n}_lengths" in det.order]:
        ours = rows_of(fields, name)
        theirs = rows_of(done_fields, name) if name in done_fields else []   # (every fallback row failed)
        per_row = [theirs[at[r]] if r in at else ours[r] for r in kept.tolist()]
        most = max([len(v) for v in per_row], default=0)
        pad = 0 if name == "boxes" else next(p for n, _, _, p in det.per_box if n == name)
        sample = fields[name]
        padded = np.full((len(per_row), most, *sample.shape[2:]), pad, dtype=sample.cpu().numpy().dtype)
        for q, v in enumerate(per_row):
            padded[q, :len(v)] = v
        out[name] = torch.from_numpy(padded).to(device)
        out[f"{name}_lengths"] = torch.tensor([len(v) for v in per_row], dtype=torch.int64)   # (on the host)
    for name in [n for n in det.order if n not in out]:
        ours = fields[name].cpu()
        theirs = done_fields[name].cpu() if name in done_fields else None   # (None: every fallback row failed)
        joined = torch.stack([theirs[at[r]] if r in at else ours[r] for r in kept.tolist()])
        out[name] = joined if stays_on_host(name) else joined.to(device)
    return images, {name: out[name] for name in det.order}, kept
