"""The ops stage: a decoded batch through the ops (fused warps and the rest), its other fields collated and
its detection targets moved with the images, into the `Batch` the consumer gets."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np
import torch

from .._driver import Staging, recorded
from ..decode.arena import arena_under
from ..decode.cpu import CpuDecoder
from ..formats.base import Field, Source
from ..ops import planner
from ..ops.base import stack_if_uniform
from ..ops.mix import Mixing
from .base import Stage
from .batch import Batch, _Names, _select_rows, _Work, cuda_tensors, split_fields
from .boxes import BoxFields
from .collate import PAD, Rows, collate, padded_rows, to_device
from .outputs import Outputs

#: The kinds of per-box fields `_batch_targets` gives as one array, and the dtype `collate` batches them in.
_ROW_DTYPES = {"ints": np.int64, "floats": np.float32}


class OpsStage(Stage, BoxFields):
    """Stage 3: a decoded batch through the ops, into the `Batch` the consumer gets.

    Takes: the decode stage's `_Work`.
    Returns: the `Batch` (None when every sample failed): images through the ops plan, failed rows dropped,
        labels and the other fields collated and moved to the device, boxes, masks and polygons moved with
        the images, and ``ready`` (an event on the ops stream after all of it). Where batches go (the
        consumer's stream, whether the other fields are wanted) is set by `deliver`.
    Owns: the ops stream, the label uploads (``Staging``) and the output batches (`outputs`).
    Uses: the decode lanes (it orders the frees of decoded memory after its work and hands GPU arenas back to
        their decoder), the CPU decoder (image fields); hands direct-read batch tensors back to the read stage
        (``spare``).
    Stops: `close` has nothing to release (torch frees the stream; the outputs go with the run,
        `Outputs.end_outputs`)."""

    name = "ops"

    def __init__(self, source: Source, ops: Sequence, device: torch.device, *, cpu: CpuDecoder, lanes: list,
                 spare: list, labels_on_host: bool = False, mixer: Any = None):
        super().__init__()
        self.ops, self.device, self.cpu, self.lanes = list(ops), device, cpu, lanes
        # A batch op (MixUp, CutMix: `ops.mix`) ends the ops: the planner runs the others; it runs here, on the
        # delivered batch and its labels.
        self.mixer = mixer
        self.image_kind, self.extra_fields = split_fields(source)
        # labels_on_host: labels and the other fields stay on the CPU (a full worker's pipeline: they cross to
        # the training process inside the message and go to the GPU there; see `ingest.engine.workers`)
        self.labels_on_host = labels_on_host
        self.ops_stream = None
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):   # the caller's current device is left as it was
                self.ops_stream = torch.cuda.Stream(self.device)
        # with_fields: batches carry the extra fields. A Loader giving (images, labels) turns it off, so their
        # collation and copies to the device are not paid for fields nobody receives.
        self.with_fields = True
        # The stream the batches are used on (the iterating thread's current stream when an executor starts;
        # None: unknown). The ops stage marks each output tensor as used there (`record_stream`), so the
        # training loop's thread does not pay that torch call per batch; it does where it uses another stream.
        self.consumer_stream: torch.cuda.Stream | None = None
        self._staging = Staging()   # label uploads (GIL kept)
        self.outputs = Outputs(device, self.image_kind, self.ops_stream)
        self._spare_direct: list[tuple[torch.Tensor, Any]] = spare   # direct-read batch tensors handed back
        self._init_boxes(source, self.extra_fields, self.image_kind, self.ops)
        self.pads = any(getattr(op, "pads", False) for op in self.ops)

    def deliver(self, consumer_stream: torch.cuda.Stream | None, *, with_fields: bool) -> None:
        """Where the next batches go: ``consumer_stream`` (see `consumer_stream`; None: unknown) and whether
        they carry the fields other than image and label (``with_fields``)."""
        self.consumer_stream, self.with_fields = consumer_stream, with_fields

    def run(self, work: _Work) -> Batch | None:
        """The batch's ops, other fields and targets on the ops stream; None when every sample failed."""
        if not work.records:
            return None  # every sample of the batch failed (and the budget allowed it)
        failed = set(work.failed)
        keep = [k for k in range(len(work.records)) if k not in failed]
        names = _kept_names(work.names, keep) if self.extra_fields and self.with_fields else []   # for messages
        host_labels = np.ascontiguousarray(_select_rows(work.labels, keep, failed) if work.labels is not None else
                                           np.array([work.records[k].label for k in keep], dtype=np.int64))
        mixing = self._mixing(work, keep)
        if mixing is not None:
            host_labels = mixing.labels(host_labels)
        labels = torch.from_numpy(host_labels)
        if self.ops_stream is not None:
            with torch.cuda.stream(self.ops_stream):
                if work.ready is not None:
                    self.ops_stream.wait_event(work.ready)
                out = self.outputs.dense_output(work)
                if out is None:
                    self.outputs.bound_outputs()
                self.outputs.count_output()
                # the ops write the first rows of ``out``: all of them, or a smaller batch's (a view of the
                # user's, which holds ``out``'s memory as a detached batch would: what the user holds is
                # another tensor than the one kept)
                images = _select_rows(self._execute(work, None if out is None else out[:len(work.ops_plan.out_sizes)]),
                                      keep, failed)
                if mixing is not None:
                    images = mixing.images(images)
                if out is not None:
                    self.outputs.watch(images, out)
                values, rows = self._targets(work)
                fields = self._collate([values[k] for k in keep], names, work, keep, rows)
                if not self.labels_on_host:
                    labels = torch.empty(labels.shape, dtype=labels.dtype, device=self.device)
                    if len(host_labels):
                        self._staging.copy(host_labels, labels, self.ops_stream)
                    fields = to_device(fields, self.device)
                ready = recorded(self.ops_stream)
                if self.consumer_stream is not None:   # see `consumer_stream`
                    for t in cuda_tensors((images, labels, fields)):
                        t.record_stream(self.consumer_stream)
            # Decoded images may be views of nvImageCodec memory, freed in order on the decode stream(s)
            # once `work` is dropped: order those frees after the ops that read them.
            gpu, stream = self.lanes[work.lane]
            stream.wait_event(ready)
            if gpu is not None:
                gpu.hold_until(ready)
                if not _shares_memory(images, work.images):   # the ops wrote new memory: the arena is free
                    gpu.recycle(work.images, ready)
        else:
            images, ready = _select_rows(self._execute(work), keep, failed), None
            if mixing is not None:
                images = mixing.images(images)
            values, rows = self._targets(work)
            fields = self._collate([values[k] for k in keep], names, work, keep, rows)
        if work.buffer is not None and len(self._spare_direct) < 2 and not _shares_memory(images, work.images):
            self._spare_direct.append((work.buffer, ready))   # for the next reads (`_direct_buffer`)
        indices = torch.from_numpy(np.ascontiguousarray(_select_rows(work.indices, keep, failed)))
        is_pad = torch.from_numpy(np.ascontiguousarray(_select_rows(work.is_pad, keep, failed)))
        return Batch(images, labels, indices, is_pad, fields, ready, work.plan.number)

    def _collate(self, values: list[dict[str, Any]], names: list[str], work: _Work, keep: list[int],
                 rows: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> dict[str, Any]:
        """Every field other than image and label, batched by kind (`ingest.engine.collate`), and where the ops end
        by padding (PadTo) ``image_sizes``: each image's (height, width) before the padding. ``rows``: fields given
        for the whole batch (`_targets`), each as one array and its samples' offsets, not in ``values``."""
        out: dict[str, Any] = {}
        if not self.with_fields:
            return out
        rows = _kept_rows(rows, keep, len(work.records)) if rows else {}
        placed: tuple[Any, Any] = (None, None)   # the last offsets seen and their `Rows` (the fields share them)
        for name, spec in self.extra_fields.items():
            if spec.kind == "mask" and work.masks is not None:
                out[name] = self._masks(work, name, spec, keep)
                continue
            if name in rows:
                flat, starts = rows[name]
                if starts is not placed[0]:
                    placed = (starts, Rows.of(starts))
                if spec.kind in _ROW_DTYPES:   # as `collate` takes them: one value per box
                    flat = flat.astype(_ROW_DTYPES[spec.kind], copy=False)
                out.update(padded_rows(name, flat, placed[1], PAD[spec.kind], fixed=spec.kind != "array"
                                       and spec.shape is not None))
                continue
            out.update(collate(name, spec, [v[name] for v in values], names=names, decode=self.cpu.decode))
        if self.pads and work.ops_plan is not None and work.ops_plan.content_sizes is not None:
            out["image_sizes"] = torch.tensor([work.ops_plan.content_sizes[k] for k in keep], dtype=torch.int64)
        return out

    def _masks(self, work: _Work, name: str, spec: Field, keep: list[int]) -> torch.Tensor | list[torch.Tensor]:
        """A mask field's decoded values moved by the batch's geometry (`Plan.warp_masks`: the images' maps,
        nearest, the field's fill) on the ops' device, its kept rows: ``[N, H, W]`` when they share a size,
        else a list of ``[H, W]``."""
        maps = work.masks[name]
        if isinstance(work.ops_plan, planner.Plan) and any(stage.warp is not None for stage in work.ops_plan.stages):
            moved = [m[0] for m in work.ops_plan.warp_masks([m[None] for m in maps], device=self.device,
                                                            fill=spec.mask_fill)]
        else:
            moved = [torch.from_numpy(m) for m in maps]
        moved = [moved[k] for k in keep]
        if moved and all(m.shape == moved[0].shape for m in moved):
            dtype = moved[0].dtype   # stacked as bytes: torch has few kernels for uint16 (CUDA's cat among them)
            return torch.stack([m.contiguous().view(torch.uint8) for m in moved]).view(dtype)
        return moved

    def _mixing(self, work: _Work, keep: list[int]) -> Mixing | None:
        """The batch op's draws for the delivered samples (`ops.mix.Mixing`), or None without one."""
        if self.mixer is None or work.ops_plan is None:
            return None
        rows = np.asarray(keep, dtype=np.int64)
        rngs = replace(work.plan, indices=work.indices[rows], is_pad=work.is_pad[rows]).sample_rngs()
        return Mixing(self.mixer, rngs, [work.ops_plan.out_sizes[k] for k in keep], work.ops_plan.output)

    # -- detection targets ---------------------------------------------------------------------
    def _targets(self, work: _Work) -> tuple[list[dict[str, Any]], dict[str, tuple[np.ndarray, np.ndarray]]]:
        """Each sample's other fields; with boxes, moved by the batch's geometry: boxes mapped (in the source's
        box format), masks warped like the image (on the ops' device), polygons moved and clipped like the boxes
        (relative ones stay relative), per-box fields pruned with their boxes. Second, the fields given for the
        whole batch instead (`_batch_targets`), by name: one array and its samples' offsets."""
        values = [r.fields for r in work.records]
        if not self.boxes or work.ops_plan is None or not self.with_fields:
            return values, {}
        rows = self._batch_targets(work)
        if rows is not None:
            return values, rows
        # Polygons (COCO's JSON text) follow the boxes: relative coordinates as pixels while they move.
        relative = self.box_relative and "polygons" in self.extra_fields
        if relative:
            values = [dict(v, polygons=planner.scale_polygons(v["polygons"], w, h))
                      for v, (h, w) in zip(values, work.ops_plan.sizes)]
        mapped = work.ops_plan.batch_targets(values, work.boxes, per_box=self.per_box, box_format=self.box_format,
                                             relative=self.box_relative, device=self.device)
        if relative:
            for v, size in zip(mapped, work.ops_plan.out_sizes):
                v["polygons"] = planner.scale_polygons(v["polygons"], 1 / size[1], 1 / size[0])
        return mapped, {}

    def _batch_targets(self, work: _Work) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
        """The boxes and per-box fields of the whole batch at once (`Plan.box_rows`), where the fields that move
        are the boxes and per-box fields that are numpy arrays of one dtype, one value per box, in every sample
        (COCO's boxes, categories, iscrowd and area): each as one array and its samples' offsets, the values, in
        the dtypes, that the per-sample targets hold. None where that does not hold (boxes not declared an
        ``array``, masks, polygons, other values): the per-sample path takes the batch."""
        if ("masks" in self.extra_fields or "polygons" in self.extra_fields
                or self.extra_fields["boxes"].kind != "array"):   # (boxes of kind floats are batched flat: `collate`)
            return None
        names = [name for name in self.per_box if name in self.extra_fields]
        rows = work.ops_plan.box_rows(work.boxes, {name: [r.fields.get(name) for r in work.records] for name in names},
                                      box_format=self.box_format, relative=self.box_relative)
        if any(name not in rows.fields or (self.extra_fields[name].kind in _ROW_DTYPES and rows.fields[name].ndim != 1)
               for name in names):
            return None
        return {"boxes": (rows.boxes, rows.starts), **{name: (rows.fields[name], rows.starts) for name in names}}

    def _execute(self, work: _Work, out: torch.Tensor | None = None):
        if self.image_kind is None:
            return None
        images = work.ops_plan.execute(work.images, origins=work.origins, scales=work.scales, out=out)
        if isinstance(images, list):
            images = stack_if_uniform(images)
        if work.ops_plan.output.layout is None:  # no op chose a layout: CHW shapes over HWC memory, as torch has it
            if isinstance(images, torch.Tensor):
                return images.permute(0, 3, 1, 2)
            return [im.permute(2, 0, 1) for im in images]   # ragged: a list, each image laid out as in a batch
        return images


def _kept_names(names: Sequence[str], keep: list[int]) -> Sequence[str]:
    """The kept samples' names; made on demand where the batch's are (`_Names`: only messages read them)."""
    if isinstance(names, _Names):
        return names if len(keep) == len(names) else _Names(names.source, names.indices[keep])
    return [names[k] for k in keep]


def _kept_rows(rows: dict[str, tuple[np.ndarray, np.ndarray]], keep: list[int], n: int
               ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Batched fields (one array and its samples' offsets each) of the samples ``keep`` of ``n``."""
    if len(keep) == n:
        return rows
    kept = np.zeros(n, dtype=bool)
    kept[keep] = True
    out, done = {}, {}
    for name, (flat, starts) in rows.items():
        if id(starts) not in done:   # the fields share their offsets: the kept ones are made once
            counts = np.diff(starts)
            new = np.zeros(len(keep) + 1, dtype=np.int64)
            np.cumsum(counts[kept], out=new[1:])
            done[id(starts)] = (np.repeat(kept, counts), new)
        rows_kept, new = done[id(starts)]
        out[name] = (flat[rows_kept], new)
    return out


def _shares_memory(images: Any, decoded: Any) -> bool:
    """Whether a batch's output ``images`` may still be (or view) its ``decoded`` images' arena or batch tensor:
    True unless the output is one tensor in other memory."""
    arena = decoded if isinstance(decoded, torch.Tensor) else arena_under(decoded)   # a tensor: a direct read's
    if arena is None:
        return True
    start, size = arena.data_ptr(), arena.numel() * arena.element_size()
    if not isinstance(images, torch.Tensor):
        return True
    return start <= images.data_ptr() < start + size
