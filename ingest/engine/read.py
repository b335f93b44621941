"""The read stage: a batch's bytes read and parsed, its images' sizes probed and every op's parameters drawn."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .._driver import recorded
from .._numpy import take
from ..decode.cpu import CpuDecoder
from ..errors import CorruptRecordError, IngestError
from ..formats.base import Location, Source, fields_of, locate_each, parse_each
from ..io import ByteReader
from ..native_plan import Planner
from ..ops import planner
from ..ops.base import PIXELS, ImageSpec
from ..sampler import BatchPlan
from .base import Stage
from .batch import _NO_FIELDS, Failures, _Names, _select, _Work, split_fields
from .boxes import BoxFields


class ReadStage(Stage, BoxFields):
    """Stage 1: a batch's bytes read and parsed, its images' sizes probed, every op's parameters drawn.

    Takes: a `BatchPlan`.
    Returns: its `_Work`: records parsed, sizes probed (JPEG headers, or the pixel arrays' shapes) and the
        ops' parameters drawn (which tell the GPU decoder the region of each image); raw shards of one pixel
        shape (`reads_direct`) are read straight into one batch tensor instead. Samples that cannot be read,
        parsed or probed are dropped through the failure budget of the current epoch (`start_epoch`).
    Owns: the `ByteReader`; the direct-read batch tensors (``spare``, a list the ops stage hands them back
        through).
    Uses: the CPU decoder's header probe, the decode stage's path counts and its first lane's stream.
    Stops: `close` closes the reader."""

    name = "read"

    def __init__(self, source: Source, ops: Sequence, device: torch.device, *, reader: ByteReader,
                 cpu: CpuDecoder, spare: list, decode_stream: torch.cuda.Stream | None,
                 ops_stream: torch.cuda.Stream | None, count_paths: Callable[[dict[str, int]], None]):
        super().__init__()
        self.source, self.ops, self.device = source, list(ops), device
        self.reader, self.cpu = reader, cpu
        self.image_kind, extra_fields = split_fields(source)
        self.direct = reads_direct(source)
        self.decode_stream = decode_stream   # raw shards read straight to the GPU queue their reads here
        self.ops_stream = ops_stream
        self.count_paths = count_paths
        self._spare_direct: list[tuple[torch.Tensor, Any]] = spare   # direct-read batch tensors handed back
        self._direct_rows = 0   # the rows of the largest direct-read batch so far
        self._labels = source.labels() if self.direct else None
        self._init_boxes(source, extra_fields, self.image_kind, self.ops)
        self.failures = Failures(0, 0)
        self.pixels = decoded_pixels(cpu) if self.image_kind == "image" else PIXELS   # what the ops are planned for
        # Detection chains the native planner runs plan there (the same Plan; it moves the boxes it is given, so
        # it takes them whatever the ops draw on, and keeps no per-op steps, so polygons stay with planner.plan)
        self._native = (Planner.of(self.ops, self.pixels) if self.boxes and "polygons" not in extra_fields
                        else None)

    def start_epoch(self, failures: Failures) -> None:
        """Count the batches read from now on against ``failures`` (the budget of the epoch they belong to)."""
        self.failures = failures

    def read_shared(self, plan: BatchPlan) -> _Work:
        """`run` for a batch that crosses to another process: ``reader.last_arena`` then names the shared
        buffer it was read into (None where nothing was)."""
        self.reader.last_arena = None
        return self.run(plan)

    @property
    def read_path(self) -> str:
        """How this pipeline's bytes are read (``stats()["read_path"]``): raw shards of one shape go straight to
        the output device (`ByteReader.device_path` on CUDA), everything else to host memory first."""
        return self.reader.device_path if self.direct and self.device.type == "cuda" else self.reader.path

    def run(self, plan: BatchPlan) -> _Work:
        """Read and parse a batch's samples; unreadable ones are dropped through the failure budget."""
        if self.direct:
            return self._read_direct(plan)
        failures = self.failures
        idx = [int(i) for i in plan.indices]
        raws = self._read_raw(idx)
        read = [k for k, raw in enumerate(raws) if not isinstance(raw, BaseException)]
        parsed = iter(parse_each(self.source, [idx[k] for k in read], [raws[k] for k in read]))
        keep, records = [], []
        for k, (i, raw) in enumerate(zip(idx, raws)):
            if isinstance(raw, BaseException):
                failures.add(self.source.name(i), "read", raw)
                continue
            record = next(parsed)
            if isinstance(record, BaseException):
                failures.add(self.source.name(i), "parse", record)
                continue
            keep.append(k)
            records.append(record)
        indices = plan.indices[keep]
        names = self.source.batch_names(indices) if hasattr(self.source, "batch_names") else \
            _Names(self.source, indices)
        return self._plan(_Work(plan, names, indices, plan.is_pad[keep], records, failures=failures))

    def _read_direct(self, plan: BatchPlan) -> _Work:
        """Fixed-shape decoded pixels (raw shards) read straight into one ``[B, H, W, C]`` tensor on the
        output device (KvikIO: GPUDirect Storage where the host has it), with no parse and no decode."""
        idx = plan.indices
        # On the decode stream (idle here): KvikIO writes outside torch's streams, so the read first waits for
        # the work queued on the current stream, which must not be the training loop's.
        with torch.cuda.stream(self.decode_stream) if self.decode_stream is not None else _nothing():
            buffer = self._direct_buffer(len(idx))
            out = buffer if buffer.shape[0] == len(idx) else buffer[:len(idx)]   # a smaller batch: its first rows
            self.source.read_batch(idx, out, self.reader)
        labels = take(self._labels, idx) if len(self._labels) else np.full(len(idx), -1, dtype=np.int64)
        # No per-sample Python objects: names are made only if a message needs one, records are all alike.
        work = _Work(plan, _Names(self.source, idx), idx, plan.is_pad, [_NO_FIELDS] * len(idx), labels=labels,
                     failures=self.failures)
        work.sizes = [tuple(out.shape[1:3])] * len(idx)
        work.images, work.buffer = out, buffer
        if self.device.type == "cuda":
            work.ready = recorded(self.decode_stream)
        self.count_paths({"none (raw, direct read)": len(idx)})
        return work

    def _direct_buffer(self, n: int) -> torch.Tensor:
        """A ``[m, *shape]`` tensor (m >= n) for a direct read: one the ops stage handed back (`transform`: the
        ops wrote their output elsewhere), its reuse queued after the ops that read it, else a new one. Reusing
        them saves the allocation and `record_stream` per batch, torch calls that each give the GIL up. A smaller
        batch (an epoch's last) is read into the first rows of one as large as the largest batch so far, so that
        it serves the batches after it too."""
        if self._spare_direct:
            out, done = self._spare_direct.pop()
            if out.shape[0] >= n:
                if done is not None:
                    done.wait(self.decode_stream)
                return out
        self._direct_rows = max(self._direct_rows, n)
        out = self.source.batch_buffer(self._direct_rows, self.device)
        if self.device.type == "cuda":
            out.record_stream(self.ops_stream)  # allocated on the decode stream, used and freed on the ops stream
        return out

    def _read_raw(self, idx: list[int]) -> list:
        """Bytes of each sample: one buffer, or a tuple of buffers for a sample of several byte ranges
        (all ranges of a batch go to the reader in one call)."""
        located = locate_each(self.source, idx)
        flat: list[Location] = []
        for loc in located:
            if not isinstance(loc, BaseException):
                flat.extend(loc if isinstance(loc, tuple) else (loc,))
        got = iter(self.reader.read(flat))
        raws = []
        for loc in located:
            if isinstance(loc, BaseException):   # not located: fails as a read
                raws.append(loc)
            elif not isinstance(loc, tuple):
                raws.append(next(got))
            else:
                parts = tuple(next(got) for _ in loc)
                bad = [p for p in parts if isinstance(p, BaseException)]
                raws.append(bad[0] if bad else parts)
        return raws

    def _plan(self, work: _Work) -> _Work:
        """Image sizes from the headers (or the pixel arrays), then every op's random parameters (which tell
        the GPU decoder the region of each image to decode). Done in the read stage, which has time to spare."""
        if self.image_kind is None:
            return work
        if self.image_kind == "pixels":
            probed, headers = [], None
            for record, name in zip(work.records, work.names):
                try:
                    probed.append(_pixel_size(record.image, name))
                except IngestError as err:
                    probed.append(err)
        else:
            probed, headers = self.cpu.probe_batch([r.image for r in work.records], work.names)
        keep = []
        for k, size in enumerate(probed):
            if isinstance(size, IngestError):
                work.failures.add(work.names[k], "decode", size)
            else:
                keep.append(k)
        if len(keep) != len(probed):
            work = _select(work, keep)
            probed, headers = [probed[k] for k in keep], None if headers is None else headers[keep]
        work.sizes, work.headers = probed, headers
        if work.records:
            # One generator per sample still in the batch, keyed by (seed, epoch, dataset index).
            rngs = replace(work.plan, indices=work.indices, is_pad=work.is_pad).sample_rngs()
            if self.boxes:
                work.boxes = self._to_ltrb([r.fields["boxes"] for r in work.records], probed)
            if self._native is not None:
                work.ops_plan = self._native.plan(probed, rngs, work.boxes)
            else:
                work.ops_plan = planner.plan(self.ops, probed, rngs, boxes=work.boxes if self.box_ops else None,
                                             pixels=self.pixels)
        return work

    def close(self) -> None:
        self.reader.close()


def reads_direct(source) -> bool:
    """Raw shards of one pixel shape and nothing else to parse: their batches are read straight into one
    tensor on the output device, with no parse and no decode (`ReadStage._read_direct`)."""
    fields = fields_of(source)
    image = fields.get("image")
    return (image is not None and image.kind == "pixels" and set(fields) <= {"image", "label"}
            and getattr(source, "fixed_shape", None) is not None and hasattr(source, "read_batch"))


@contextlib.contextmanager
def _nothing():
    yield


def _pixel_size(pixels: Any, name: str) -> tuple[int, int]:
    """(height, width) of a decoded ``[H, W, C]`` uint8 sample."""
    shape = getattr(pixels, "shape", None)
    if shape is None or len(shape) != 3 or getattr(pixels, "dtype", None) != np.uint8:
        raise CorruptRecordError(f"expected uint8 pixels [H, W, C], got {getattr(pixels, 'dtype', type(pixels))} "
                                 f"{tuple(shape) if shape is not None else ''}", path=name)
    return int(shape[0]), int(shape[1])


def decoded_pixels(cpu: CpuDecoder) -> ImageSpec:
    """What the images decoded by ``cpu`` are to the ops: uint8 or uint16 ``[H, W, C]`` of its channel count."""
    return ImageSpec(torch.uint16 if cpu.dtype == "uint16" else torch.uint8, None, cpu.channels)
