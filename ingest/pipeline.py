"""The executor: read -> decode -> ops as overlapped stages on their own threads, joined by bounded queues.

::

    sampler ──BatchPlan──> [read]  ──bytes──> [decode] ──images──> [ops] ──Batch──> consumer
                          I/O pool            CPU pool or           one fused warp
                          (KvikIO/pread)      nvImageCodec on       + rest, on the ops
                                              a lane's stream       CUDA stream
                                              (lanes in turn)

`Pipeline` holds the per-batch work of each stage and no threads, so it also runs eagerly (``Pipeline.run``
on a list of encoded images, for serving). `Executor` runs one epoch of it on threads: each stage takes
from the queue before it and puts into the one after it (``prefetch`` deep), so reading batch k+2,
decoding k+1 and augmenting k overlap with the training step on batch k; with two decode lanes (the GPU
default) two batches decode at once, each lane on its own thread. GPU work is ordered by CUDA events,
never by host synchronisation; the consumer's stream waits on the batch's event.

Bad samples: a read, parse, probe or decode failure drops the sample from its batch, logs (name, stage,
reason) and counts against ``max_failures`` (an int: samples; a float in (0, 1): fraction of the epoch);
past the budget the epoch fails with `FailureBudgetExceeded` listing them. With ``max_failures=0`` (the
default) the first failure raises its own typed error (e.g. `DecodeError` naming the file).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
import time
import weakref
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from . import defaults
from .errors import ConfigError, CorruptRecordError, FailureBudgetExceeded, IngestError
from .collate import collate, to_device
from .formats.base import Location, Record, Source, fields_of, locate_each, parse_each
from ._driver import Staging, recorded, wait_for
from ._numpy import take
from .io import ByteReader
from .ops import planner
from .ops.base import ImageArena, arena_under, bind_thread, same_size, stack_if_uniform
from .ops.decode import CpuDecoder
from .ops.mix import Mixing, split as split_batch_op
from .ops.user import as_ops
from .sampler import BatchPlan

log = logging.getLogger("ingest")

DECODE = ("mixed", "cpu")
STAGES = ("read", "decode", "ops")  # what Pipeline.read, .decode and .transform do, in order
PER_BOX = ("categories", "labels", "iscrowd", "area", "scores")  # per-box fields pruned with their boxes


@dataclass
class Batch:
    """What the executor hands the consumer. ``images`` and ``labels`` are on the loader's device."""

    images: torch.Tensor | list[torch.Tensor] | None   # None when the source has no image field
    labels: torch.Tensor
    indices: torch.Tensor                      # int64 dataset indices (CPU)
    is_pad: torch.Tensor                       # bool (CPU): True where the sample only pads the last batch
    fields: dict[str, Any] = field(default_factory=dict)   # every other declared field, collated by kind
    ready: Any = None      # an event (`ingest._driver`) recorded on the ops stream after the batch is complete
    number: int = 0                            # batch number within the epoch (this shard)


@dataclass
class _Work:
    """A batch in flight between stages."""

    plan: BatchPlan
    names: Sequence[str]   # a list, or `_Names` (made on demand)
    indices: np.ndarray
    is_pad: np.ndarray
    records: list[Record]
    sizes: list[tuple[int, int]] = field(default_factory=list)   # probed (oriented) image sizes
    headers: np.ndarray | None = None  # the batch's JPEG header table (`ops.decode.jpeg_headers`), if probed
    ops_plan: Any = None
    images: Any = None
    origins: list[tuple[int, int]] | None = None
    failed: list[int] = field(default_factory=list)   # positions whose decode failed (dummy image in place)
    ready: Any = None   # an event (`ingest._driver`) on the decode stream after the decode (or upload)
    lane: int = 0                                     # the decode lane (decoder and stream) that decoded it
    labels: np.ndarray | None = None                  # the batch's labels when known without records
    boxes: list[np.ndarray] | None = None             # each sample's boxes as absolute ltrb (detection)
    failures: Failures | None = None   # the budget of the batch's epoch: `Pipeline.failures` when it was read
    buffer: Any = None   # a direct read's batch tensor (`images` may be its first rows: `Pipeline._direct_buffer`)


class Failures:
    """The failure budget: records each bad sample, raises when the budget is exceeded.

    ``max_failures``: an int counts samples; a float in [0, 1) is that share of ``epoch_size``, the number of
    samples the epoch reads (padding included, a smaller last batch counted as it is), so 0.5 allows half of
    them. ``epoch_size=None`` (a stream of unknown length) takes counts only."""

    def __init__(self, max_failures: int | float, epoch_size: int | None):
        if isinstance(max_failures, bool) or not isinstance(max_failures, (int, float)) or max_failures < 0:
            raise ConfigError(f"`max_failures` must be an int >= 0 or a fraction in [0, 1), got {max_failures!r}")
        if isinstance(max_failures, float):
            if max_failures >= 1:
                raise ConfigError(f"a fractional `max_failures` must be < 1, got {max_failures}")
            if epoch_size is None:
                raise ConfigError(f"a fractional `max_failures` ({max_failures}) needs the epoch's length, which a "
                                  "streamed iterator does not have: pass a count of samples instead")
            self.budget = int(max_failures * epoch_size)
        else:
            self.budget = max_failures
        self.allowed = max_failures != 0
        self.items: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def add(self, name: str, stage: str, err: BaseException) -> None:
        """Count a failed sample: raise ``err`` when no failure is allowed, else record it."""
        if not self.allowed:
            if isinstance(err, IngestError | OSError):
                raise err
            raise IngestError(f"{name}: {stage} failed: {err}") from err
        self.record(name, stage, f"{type(err).__name__}: {err}")

    def record(self, name: str, stage: str, reason: str) -> None:
        """Record a failure (also one a worker process reported); raise when past the budget."""
        with self._lock:
            self.items.append((name, stage, reason))
            log.warning("ingest: skipping %s (%s failed: %s)", name, stage, reason)
            if len(self.items) > self.budget:
                stages = {}
                for _, s, _ in self.items:
                    stages[s] = stages.get(s, 0) + 1
                raise FailureBudgetExceeded(
                    f"{len(self.items)} samples failed, more than max_failures allows ({self.budget}); by stage: "
                    + ", ".join(f"{s}: {c}" for s, c in stages.items())
                    + f"; first: {self.items[0][0]} ({self.items[0][2]})", list(self.items))


def resolve_device(device: str | torch.device, decode: str | None) -> tuple[torch.device, str]:
    """Validate the output device and decode kind; the default decode is "mixed" on CUDA, else "cpu"."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device='cuda' but CUDA is not available; use device='cpu'")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    decode = decode or ("mixed" if device.type == "cuda" else "cpu")
    if decode not in DECODE:
        raise ConfigError(f"Unknown decode {decode!r}. Available: {', '.join(DECODE)}")
    if decode == "mixed" and device.type != "cuda":
        raise ConfigError("decode='mixed' decodes on the GPU and needs device='cuda'")
    return device, decode


class Pipeline:
    """Per-batch work of each stage, with no threads of its own."""

    def __init__(self, source: Source, *, ops: Sequence = (), device: str | torch.device = "cpu",
                 decode: str | None = None, io: str | None = None, num_threads: int | None = None,
                 shared_reads: int = 0, labels_on_host: bool = False, lanes: int | str | None = None):
        self.source = source
        self.ops = as_ops(ops)   # torchvision transforms wrapped; anything else not an op is a ConfigError
        self.device, self.decode_kind = resolve_device(device, decode)
        decode = self.decode_kind
        # shared_reads: a reader process's pipeline, whose read stage hands its batches to another process
        # through that many shared buffers reused in turn
        self.reader = ByteReader(io, pin=decode == "mixed", shared=shared_reads)
        # labels_on_host: labels and the other fields stay on the CPU (a full worker's pipeline: they cross to
        # the training process inside the message and go to the GPU there; see `ingest.workers`)
        self.labels_on_host = labels_on_host
        self.cpu = CpuDecoder(threads=num_threads)
        self.fields = fields_of(source)
        image = self.fields.get("image")
        self.image_kind = image.kind if image is not None else None   # "image", "pixels" or None
        self.extra_fields = {k: f for k, f in self.fields.items() if k not in ("image", "label")}
        # with_fields: batches carry the extra fields. A Loader giving (images, labels) turns it off, so their
        # collation and copies to the device are not paid for fields nobody receives.
        self.with_fields = True
        self.direct = reads_direct(source)
        # Decode lanes: each a GPU decoder (mixed; None: the CPU pool) and a decode stream (CUDA). With several
        # (``lanes``, else the ``decode_batches`` setting; encoded images only) the executor decodes that many
        # batches at once, one thread per lane, so that one batch's Python work overlaps another's decode.
        lanes = (lanes or defaults.get("decode_batches")) if self.image_kind == "image" and not self.direct else 1
        if lanes == "auto":
            lanes = 2 if decode == "mixed" else 1
        self.lanes: list[tuple[Any, torch.cuda.Stream | None]] = [(None, None)] * lanes
        self.ops_stream = None
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):   # the caller's current device is left as it was
                self.ops_stream = torch.cuda.Stream(self.device)
                if decode == "mixed" and self.image_kind == "image" and not self.direct:   # a decoder only for JPEGs
                    from .ops.decode_gpu import Arenas, GpuDecoder, cpu_threads_each
                    each, arenas = defaults.get("gpu_decoders"), Arenas(keep=lanes + 1)   # the lanes share them
                    self.lanes = [(GpuDecoder(self.device, self.cpu, threads=each, arenas=arenas,
                                              cpu_threads=cpu_threads_each(each * lanes)),
                                   torch.cuda.Stream(self.device)) for _ in range(lanes)]
                else:
                    self.lanes = [(None, torch.cuda.Stream(self.device)) for _ in range(lanes)]
        self.decode_stream = self.lanes[0][1]   # raw shards read straight to the GPU queue their reads here
        # The stream the batches are used on (the iterating thread's current stream when an executor starts;
        # None: unknown). The ops stage marks each output tensor as used there (`record_stream`), so the
        # training loop's thread does not pay that torch call per batch; it does where it uses another stream.
        self.consumer_stream: torch.cuda.Stream | None = None
        self._staging = Staging()   # label uploads (GIL kept)
        # Output batches in flight (`bound_outputs`): an event on the consumer's stream per batch handed over
        # (`handed_over`), the count handed over and made, and how many outputs may be ahead of the one whose
        # hand-over the GPU has passed (None: no bound).
        self.start_outputs(None)
        self._spare_direct: list[tuple[torch.Tensor, Any]] = []   # direct-read batch tensors handed back
        self._direct_rows = 0   # the rows of the largest direct-read batch so far
        self._counts = threading.Lock()
        self._labels = source.labels() if self.direct else None
        # Detection: a "boxes" field (ltrb or xywh, absolute or relative, as the source says) follows the
        # geometry ops; the per-box fields (the source's `per_box`, else those of `PER_BOX` it has) are
        # pruned with their boxes, and "masks" are warped like the image.
        self.boxes = "boxes" in self.extra_fields and self.image_kind is not None
        self.box_format = getattr(source, "box_format", "ltrb")
        self.box_relative = bool(getattr(source, "relative", False))
        self.per_box = list(getattr(source, "per_box", None) or
                            [k for k in PER_BOX if k in self.extra_fields and self.extra_fields[k].kind != "array"])
        self.box_ops = self.boxes and any(getattr(op, "uses_boxes", False) for op in self.ops)
        self.pads = any(getattr(op, "pads", False) for op in self.ops)
        # A batch op (MixUp, CutMix: `ops.mix`) ends the ops: the planner runs the others; it runs in `transform`
        # on the delivered batch and its labels.
        self.plan_ops, self.mixer = split_batch_op(self.ops, boxes=self.boxes, labels="label" in self.fields)
        self.stage_stats = [StageStats(name) for name in STAGES]  # over every epoch
        self.decode_paths: dict[str, int] = {}
        self.failures = Failures(0, 0)

    # -- stage 1: read ------------------------------------------------------------------------
    @property
    def read_path(self) -> str:
        """How this pipeline's bytes are read (``stats()["read_path"]``): raw shards of one shape go straight to
        the output device (`ByteReader.device_path` on CUDA), everything else to host memory first."""
        return self.reader.device_path if self.direct and self.device.type == "cuda" else self.reader.path

    def read(self, plan: BatchPlan) -> _Work:
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
        self._count_paths({"none (raw, direct read)": len(idx)})
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
                work.boxes = [self._to_ltrb(r.fields["boxes"], size) for r, size in zip(work.records, probed)]
            work.ops_plan = planner.plan(self.plan_ops, probed, rngs, boxes=work.boxes if self.box_ops else None)
        return work

    # -- stage 2: decode ----------------------------------------------------------------------
    def decode(self, work: _Work, lane: int = 0) -> _Work:
        """Decode the batch: nvImageCodec on the decode stream (regions only, where the plan crops), or the
        CPU pool (then uploaded when the device is CUDA). ``lane``: which of `lanes` (decoder and stream);
        lanes may run at once, each on its own thread."""
        gpu, stream = self.lanes[lane]
        work.lane = lane
        if self.direct:
            # Nothing to decode: the ops' random draws are made here, while the read stage (the limit on this
            # path) reads the next batch, instead of before each read.
            if len(work.indices):   # in slices on a large batch (`planner.SLICE`)
                work.ops_plan = planner.plan_sliced(self.plan_ops, work.sizes, work.plan.sample_rngs)
            return work
        if not work.records or self.image_kind is None:
            return work
        datas = [r.image for r in work.records]
        if self.image_kind == "pixels":
            images = [torch.from_numpy(np.ascontiguousarray(d)) for d in datas]
            if self.device.type == "cuda":
                images, work.ready = _upload(images, self.device, stream)
            self._count_paths({"none (pixels)": len(images)})
            work.images = images
            return work
        if gpu is not None:
            warp = work.ops_plan.warp
            rois = warp.regions() if warp is not None else None
            with torch.cuda.stream(stream):
                images, origins, paths = gpu.decode_batch(datas, work.names, rois=rois, stream=stream,
                                                          headers=work.headers)
                images = self._replace_failures(work, images, rois, origins, gpu=True)
                work.ready = recorded(stream)
            work.origins = origins
        else:
            decoded = self.cpu.decode_batch(datas, work.names)
            paths = ["cpu"] * len(decoded)
            decoded = self._replace_failures(work, decoded, None, None, gpu=False)
            images = [torch.from_numpy(im) for im in decoded]
            if self.device.type == "cuda":
                images, work.ready = _upload(images, self.device, stream)
        self._count_paths(Counter(paths))
        work.images = images
        return work

    @property
    def gpu_fallbacks(self) -> dict[str, int]:
        """Why GPU-eligible images went to the CPU decoder, summed over the lanes' GPU decoders
        (`GpuDecoder.fallbacks`: nvImageCodec's processing status, or FAIL / SHAPE_MISMATCH)."""
        total: Counter[str] = Counter()
        for gpu, _ in self.lanes:
            if gpu is not None:
                total.update(gpu.fallbacks)
        return dict(total)

    def _count_paths(self, counts: dict[str, int]) -> None:
        """Add images per decode path to `decode_paths` (lanes count at once)."""
        with self._counts:
            for path, n in counts.items():
                self.decode_paths[path] = self.decode_paths.get(path, 0) + n

    def _replace_failures(self, work: _Work, images: list, rois, origins, *, gpu: bool) -> list:
        """Failed images become blank stand-ins (the ops plan was drawn for them); their rows are dropped after
        the ops run. A stand-in is never allocated at the probed size, which a tiny corrupt file can make huge:
        on the CPU the warp is rescaled onto whatever arrives, so it takes the size of the plan's output; on the
        GPU the warp reads each region 1:1 from its origin, so it takes the region (or the probed size where
        the batch's other images are decoded whole)."""
        if isinstance(images, ImageArena):  # the GPU decoder returns one only when every image decoded
            return images
        out = list(images)
        for k, im in enumerate(images):
            if not isinstance(im, BaseException):
                continue
            work.failures.add(work.names[k], "decode", im)
            work.failed.append(k)
            h, w = work.sizes[k] if rois is not None else work.ops_plan.out_sizes[k]
            if rois is not None and rois[k] is not None:
                x0, y0, x1, y1 = (int(v) for v in rois[k])
                h, w = y1 - y0, x1 - x0
                origins[k] = (x0, y0)
            if gpu:
                out[k] = torch.zeros((h, w, 3), dtype=torch.uint8, device=self.device)
            else:
                out[k] = np.zeros((h, w, 3), dtype=np.uint8)
        return out

    # -- stage 3: ops -------------------------------------------------------------------------
    def start_outputs(self, ahead: int | None, stop: threading.Event | None = None) -> None:
        """A new run of batches (an executor starting): counts restart; ``ahead`` as in `bound_outputs`, and
        the number of dense outputs kept for reuse (`_dense_output`); ``stop``: the executor's, which ends a
        wait for one."""
        self._handed = deque(maxlen=64)
        self._handed_count = self._outputs = 0
        self.outputs_ahead = ahead
        self._kept: list[torch.Tensor] = []   # dense outputs made, oldest first (`_dense_output`)
        self.outputs_made = 0                  # how many were allocated in this run
        self._watched: deque = deque(maxlen=64)   # weak references to the outputs handed out
        # id of a kept output -> (a weak reference to it, the events after its batch's last use or None)
        self._dropped: dict[int, tuple] = {}
        self._wakes: queue.SimpleQueue = queue.SimpleQueue()   # a hand-over, or an output dropped
        self._used_on: set = set()   # the streams the consumer took batches on
        self._stop_outputs = stop

    def handed_over(self, stream: torch.cuda.Stream) -> None:
        """The consumer took the next batch: an event on its ``stream``, where its use of the batch before is
        queued by then (the consumer's thread calls this)."""
        self._handed.append(recorded(stream))
        self._handed_count += 1
        if stream is not None:
            self._used_on.add(stream)
        self._wakes.put(None)

    def bound_outputs(self) -> None:
        """Wait, before the ops stage allocates output number n, until the consumer's stream has run past the
        hand-over of output n - `outputs_ahead`. The ops stage allocates each output on its own stream and marks
        it used on the consumer's (`consumer_stream`); a block the user has dropped goes back to torch's cache
        only once the consumer's stream has run past that use, and an allocation that finds none free takes new
        memory, which the cache then keeps. With the consumer's stream behind (the training loop's thread runs
        steps ahead of the GPU), that happened at times: one more float32 output batch (147 MiB at 256 x 224 x
        224) held for good. Bounded, the blocks in flight are the prefetched batches, the one the user holds
        and the one before it. Rarely waits: only while the GPU is that far behind. (Dense outputs are reused
        instead: `_dense_output`.)"""
        k = self._outputs - self.outputs_ahead if self.outputs_ahead is not None else -1
        if k < 0:
            return
        i = k - (self._handed_count - len(self._handed))   # the deque holds the latest hand-overs
        if 0 <= i < len(self._handed):   # not handed over yet (cannot happen with a reserved place): no wait
            wait_for(self._handed[i])

    def _dense_output(self, work: _Work) -> torch.Tensor | None:
        """The tensor the ops write a batch of one output size to (None: a ragged batch, or no executor bound;
        `bound_outputs` then): one of the `outputs_ahead` made before that nothing but this list holds any more
        (no tensor or view of the user's: the storage's use count), its reuse queued on the ops stream after
        the consumer's use of its last batch (`_watch`); else, while all of them are held, a wait for one to be
        dropped (a weak reference to each handed out wakes it) or for the consumer to have taken every batch
        made (it then waits for this one: a new one is made rather than stall it).

        Why: a loop's variable still holds the batch before while ``next()`` hands over the next one, so with
        the ops stage free to allocate as soon as the queue has room, four float32 outputs were in memory: the
        one held, the one handed over, two queued (588 MB at batch 256), one more than a loop ever uses at once.
        Reused, the outputs held are the one the loop uses, the queued ones and the one being made."""
        plan = work.ops_plan
        if self.outputs_ahead is None or plan is None or self.image_kind is None or not work.records:
            return None
        sizes, c = plan.out_sizes, _channels(work.images)
        if c is None or not same_size(sizes):
            return None
        shape, dtype = plan.output.batch_shape(len(sizes), sizes[0], c), plan.output.dtype

        def alike(out: torch.Tensor) -> bool:   # of this batch's dtype and sample shape
            return out.dtype == dtype and out.shape[1:] == shape[1:]

        def fits(out: torch.Tensor) -> bool:   # a smaller batch (an epoch's last) takes the first rows of one
            return alike(out) and out.shape[0] >= shape[0]

        while True:
            for out in self._kept:
                if fits(out) and not _held_elsewhere(out):
                    ref, events = self._dropped.pop(id(out), (None, None))
                    if ref is None or ref() is not out:
                        events = None
                    for event in events if events is not None else [recorded(s) for s in tuple(self._used_on)]:
                        self.ops_stream.wait_event(event)
                    return out
            stopped = self._stop_outputs is not None and self._stop_outputs.is_set()
            if sum(map(fits, self._kept)) < self.outputs_ahead or self._handed_count >= self._outputs or stopped:
                break
            try:
                self._wakes.get(timeout=0.05)
            except queue.Empty:   # a wake can be missed (a view of the user's dropped last): look again
                pass
        # as many rows as the largest kept of its sample shape: a smaller batch's output serves full ones after it
        rows = max([shape[0]] + [o.shape[0] for o in self._kept if alike(o)])
        out = torch.empty((rows, *shape[1:]), dtype=dtype, device=self.device)   # on the ops stream (the caller's)
        if len(self._kept) >= self.outputs_ahead:   # one that does not fit goes first, else the oldest
            self._kept.pop(next((k for k, o in enumerate(self._kept) if not fits(o)), 0))  # torch frees it once
        self._kept.append(out)                                                            # the user drops it
        self.outputs_made += 1
        return out

    def _watch(self, images: torch.Tensor, out: torch.Tensor) -> None:
        """Once ``images`` (what the user gets, over the kept ``out``) is dropped: events on the consumer's
        streams then, after every use of the batch queued there (the reuse of ``out`` waits for those, not for
        the steps the loop queued since: recorded at the reuse instead, they held the next batch's ops behind
        the step before it), and a wake for a `_dense_output` waiting for a drop. Where a view of the user's
        still holds the memory (its base is ``out``, not ``images``), the reuse records its own events."""
        wakes, dropped, streams, key = self._wakes, self._dropped, self._used_on, id(out)
        kept = weakref.ref(out)   # not kept alive by this (an id can be another tensor's once it is gone)
        alone = _ALONE + 1   # ``out`` and ``images``, which still holds its storage while this runs

        def drop(_):
            base = kept()
            if base is not None:
                dropped[key] = (kept, [recorded(s) for s in tuple(streams)] if _references(base) <= alone else None)
            wakes.put(None)   # SimpleQueue.put: safe wherever the drop happens

        self._watched.append(weakref.ref(images, drop))

    def transform(self, work: _Work) -> Batch | None:
        if not work.records:
            return None  # every sample of the batch failed (and the budget allowed it)
        failed = set(work.failed)
        keep = [k for k in range(len(work.records)) if k not in failed]
        names = [work.names[k] for k in keep] if self.extra_fields and self.with_fields else []   # for messages
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
                out = self._dense_output(work)
                if out is None:
                    self.bound_outputs()
                self._outputs += 1
                # the ops write the first rows of ``out``: all of them, or a smaller batch's (a view of the
                # user's, which holds ``out``'s memory as a detached batch would: what the user holds is
                # another tensor than the one kept)
                images = _select_rows(self._execute(work, None if out is None else out[:len(work.ops_plan.out_sizes)]),
                                      keep, failed)
                if mixing is not None:
                    images = mixing.images(images)
                if out is not None:
                    self._watch(images, out)
                values = self._targets(work)
                fields = self._collate([values[k] for k in keep], names, work, keep)
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
            values = self._targets(work)
            fields = self._collate([values[k] for k in keep], names, work, keep)
        if work.buffer is not None and len(self._spare_direct) < 2 and not _shares_memory(images, work.images):
            self._spare_direct.append((work.buffer, ready))   # for the next reads (`_direct_buffer`)
        indices = torch.from_numpy(np.ascontiguousarray(_select_rows(work.indices, keep, failed)))
        is_pad = torch.from_numpy(np.ascontiguousarray(_select_rows(work.is_pad, keep, failed)))
        return Batch(images, labels, indices, is_pad, fields, ready, work.plan.number)

    def _mixing(self, work: _Work, keep: list[int]) -> Mixing | None:
        """The batch op's draws for the delivered samples (`ops.mix.Mixing`), or None without one."""
        if self.mixer is None or work.ops_plan is None:
            return None
        rows = np.asarray(keep, dtype=np.int64)
        rngs = replace(work.plan, indices=work.indices[rows], is_pad=work.is_pad[rows]).sample_rngs()
        return Mixing(self.mixer, rngs, [work.ops_plan.out_sizes[k] for k in keep], work.ops_plan.output)

    def _collate(self, values: list[dict[str, Any]], names: list[str], work: _Work, keep: list[int]
                 ) -> dict[str, Any]:
        """Every field other than image and label, batched by kind (`ingest.collate`), and where the ops end
        by padding (PadTo) ``image_sizes``: each image's (height, width) before the padding."""
        out: dict[str, Any] = {}
        if not self.with_fields:
            return out
        for name, spec in self.extra_fields.items():
            out.update(collate(name, spec, [v[name] for v in values], names=names, decode=self.cpu.decode))
        if self.pads and work.ops_plan is not None and work.ops_plan.content_sizes is not None:
            out["image_sizes"] = torch.tensor([work.ops_plan.content_sizes[k] for k in keep], dtype=torch.int64)
        return out

    # -- detection targets ---------------------------------------------------------------------
    def _targets(self, work: _Work) -> list[dict[str, Any]]:
        """Each sample's other fields; with boxes, moved by the batch's geometry: boxes mapped (in the source's
        box format), masks warped like the image (on the ops' device), polygons moved and clipped like the boxes
        (relative ones stay relative), per-box fields pruned with their boxes."""
        values = [r.fields for r in work.records]
        if not self.boxes or work.ops_plan is None or not self.with_fields:
            return values
        ltrb = [dict(v, boxes=b) for v, b in zip(values, work.boxes)]
        if "masks" in self.extra_fields and self.device.type == "cuda":
            for v in ltrb:
                v["masks"] = torch.as_tensor(v["masks"]).to(self.device, non_blocking=True)
        # Polygons (COCO's JSON text) follow the boxes: relative coordinates as pixels while they move.
        relative = self.box_relative and "polygons" in self.extra_fields
        if relative:
            for v, (h, w) in zip(ltrb, work.ops_plan.sizes):
                v["polygons"] = planner.scale_polygons(v["polygons"], w, h)
        mapped = work.ops_plan.targets(ltrb, per_box=self.per_box)
        for v, size in zip(mapped, work.ops_plan.out_sizes):
            v["boxes"] = self._from_ltrb(v["boxes"], size)
            if relative:
                v["polygons"] = planner.scale_polygons(v["polygons"], 1 / size[1], 1 / size[0])
        return mapped

    def _to_ltrb(self, boxes: Any, size: tuple[int, int]) -> np.ndarray:
        """Boxes in the source's format as ltrb absolute pixels of an image of ``size`` (height, width)."""
        b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
        if self.box_relative:
            b *= (size[1], size[0], size[1], size[0])
        if self.box_format == "xywh":
            b[:, 2:] += b[:, :2]
        return b

    def _from_ltrb(self, boxes: Any, size: tuple[int, int]) -> np.ndarray:
        b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
        if self.box_format == "xywh":
            b[:, 2:] -= b[:, :2]
        if self.box_relative:
            b /= (size[1], size[0], size[1], size[0])
        return b.astype(np.float32)

    def _execute(self, work: _Work, out: torch.Tensor | None = None):
        if self.image_kind is None:
            return None
        images = work.ops_plan.execute(work.images, origins=work.origins, out=out)
        if isinstance(images, list):
            images = stack_if_uniform(images)
        if work.ops_plan.output.layout is None:  # no op chose a layout: CHW shapes over HWC memory, as torch has it
            if isinstance(images, torch.Tensor):
                return images.permute(0, 3, 1, 2)
            return [im.permute(2, 0, 1) for im in images]   # ragged: a list, each image laid out as in a batch
        return images

    # -- eager use --------------------------------------------------------------------------
    def run(self, plan: BatchPlan | _Work) -> Batch | None:
        """All three stages for one batch, one after the other on the calling thread (timed like the
        threaded stages), or the last two for a `_Work` the read stage made; the current stream waits for
        the batch. None if every sample failed."""
        item: Any = plan
        stages = zip((self.read, self.decode, self.transform), self.stage_stats)
        if isinstance(plan, _Work):   # its read stage has run
            next(stages)
        for stage, stats in stages:
            item = stats.timed(stage, item)
        if item is not None and item.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(item.ready)
        return item

    def close(self) -> None:
        self.reader.close()
        self.cpu.close()
        for gpu, _ in self.lanes:
            if gpu is not None:
                gpu.close()


def reads_direct(source) -> bool:
    """Raw shards of one pixel shape and nothing else to parse: their batches are read straight into one
    tensor on the output device, with no parse and no decode (`Pipeline._read_direct`)."""
    fields = fields_of(source)
    image = fields.get("image")
    return (image is not None and image.kind == "pixels" and set(fields) <= {"image", "label"}
            and getattr(source, "fixed_shape", None) is not None and hasattr(source, "read_batch"))


def _select(work: _Work, keep: list[int]) -> _Work:
    return _Work(work.plan, [work.names[k] for k in keep], work.indices[keep], work.is_pad[keep],
                 [work.records[k] for k in keep], failures=work.failures)


_NO_FIELDS = Record(None)


def cuda_tensors(value: Any) -> Iterator[torch.Tensor]:
    """The CUDA tensors in a batch value (tensors, lists, tuples and dicts of them)."""
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from cuda_tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from cuda_tensors(v)


_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def _references(tensor: torch.Tensor) -> int:
    """The references to ``tensor``'s memory (its storage's use count, as torch.multiprocessing reads it),
    the storage object this takes included."""
    storage = tensor.untyped_storage()   # held while its count is read
    return _USE_COUNT(storage._cdata)


_ALONE = _references(torch.empty(1)) if _USE_COUNT is not None else 0


def _held_elsewhere(tensor: torch.Tensor) -> bool:
    """Whether any tensor but ``tensor`` holds its memory (a view, the batch handed out); True where this torch
    does not say."""
    return _USE_COUNT is None or _references(tensor) > _ALONE


def _channels(images: Any) -> int | None:
    """The channels of a decoded batch (an arena of RGB images, a ``[N, H, W, C]`` tensor or a list of
    ``[H, W, C]`` images); None if it has none or they differ."""
    if isinstance(images, ImageArena):
        return 3
    if isinstance(images, torch.Tensor):
        return images.shape[-1] if images.dim() == 4 else None
    if isinstance(images, list) and images and all(isinstance(im, torch.Tensor) for im in images):
        c = {im.shape[-1] for im in images}
        return c.pop() if len(c) == 1 else None
    return None


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


class _Names:
    """The names of a batch's samples, made on demand (only messages need them). A source whose ``name(i)``
    holds only while a batch is read (a stream's) names the batch at once instead (``batch_names``)."""

    def __init__(self, source: Source, indices: np.ndarray):
        self.source, self.indices = source, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> str:
        return self.source.name(int(self.indices[k]))

    def __reduce__(self):   # crossing to another process: the names, not the source
        return list, ([self[k] for k in range(len(self))],)


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


def _select_rows(images: Any, keep: list[int], failed: set[int]) -> Any:
    """The rows of a batch (tensor, array or list) whose samples did not fail. Without failures, the batch
    itself: no fancy indexing, with which numpy gives the GIL up on more than 500 rows (ingest._numpy)."""
    if not failed or images is None:
        return images
    if isinstance(images, torch.Tensor):
        return images[torch.tensor(keep, dtype=torch.long, device=images.device)]
    if isinstance(images, np.ndarray):
        return images[keep]
    return [images[k] for k in keep]


def _upload(images: list[torch.Tensor], device: torch.device, stream: torch.cuda.Stream):
    """Copy a ragged batch of host images to the GPU in one transfer through one pinned buffer."""
    sizes = [im.numel() for im in images]
    host = torch.empty(sum(sizes), dtype=torch.uint8, pin_memory=True)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    for im, a, b in zip(images, offsets, offsets[1:]):
        host[a:b].copy_(im.reshape(-1))
    with torch.cuda.stream(stream):
        dev = host.to(device, non_blocking=True)
        ready = recorded(stream)
    out = [dev[a:b].view(im.shape) for im, a, b in zip(images, offsets, offsets[1:])]
    return out, ready


# ------------------------------------------------------------------------------------------------
# Threads


class _End:
    pass


@dataclass
class EpochEnd:
    """In a run of several epochs, what passes through the stages between one epoch's batches and the next's:
    the next epoch's number and the failure budget its batches count against."""

    epoch: int
    failures: Failures


class _Raised:
    def __init__(self, exc: BaseException):
        self.exc = exc


class _Slots:
    """A queue of ``depth`` places, each taken by its producer before it starts on a batch (`reserve`) and
    freed when the consumer takes the batch out (`get`): a stage never holds a finished batch, and the device
    memory in it, while it waits for room. Ends and errors pass without a place."""

    def __init__(self, stop: threading.Event, depth: int):
        self.stop, self.items, self.free = stop, queue.Queue(), threading.Semaphore(depth)

    def reserve(self) -> bool:
        """Take a place; False once the executor stops."""
        while not self.stop.is_set():
            if self.free.acquire(timeout=0.05):
                return True
        return False

    def get(self) -> Any:
        """The next item (None once the executor stops); its place is free again."""
        while not self.stop.is_set():
            try:
                item = self.items.get(timeout=0.05)
            except queue.Empty:
                continue
            if not isinstance(item, (_End, _Raised)):
                self.free.release()
            return item
        return None

    def clear(self) -> None:
        while not self.items.empty():
            self.items.get_nowait()


class _Turns:
    """`_Slots` taken in turn: batch k goes to (and comes from) the k % n-th, so the decode lanes' batches come
    back in order. The end of the epoch goes to every one, so that every lane stops; an error goes where the
    next batch would have."""

    def __init__(self, slots: list[_Slots]):
        self.slots = slots
        self.put_turn = self.get_turn = 0

    def reserve(self) -> bool:
        return self.slots[self.put_turn % len(self.slots)].reserve()

    def cancel(self) -> None:
        """Give back the place `reserve` took (no batch came of it)."""
        self.slots[self.put_turn % len(self.slots)].free.release()

    def put(self, item: Any) -> None:
        for slot in self.slots if isinstance(item, _End) else [self.slots[self.put_turn % len(self.slots)]]:
            slot.items.put(item)
        self.put_turn += 1

    def get(self) -> Any:
        item = self.slots[self.get_turn % len(self.slots)].get()
        self.get_turn += 1
        return item

    def qsize(self) -> int:
        return sum(slot.items.qsize() for slot in self.slots)


class StageStats:
    """Busy time of a stage, the CPU time its thread(s) spent in it, and how full the queue after it was when it
    put a batch (summed; see as_dict). The CPU time is the calling thread's own: the work it does holding the
    GIL (Python, numpy, torch calls' host side), not the native threads it waits on (reads, nvImageCodec), so
    the stages' CPU seconds per batch, added up, say how much of the GIL a batch needs in this process."""

    def __init__(self, name: str):
        self.name, self.busy, self.cpu, self.batches, self.occupancy = name, 0.0, 0.0, 0, 0
        self._lock = threading.Lock()

    def timed(self, fn: Callable, item: Any) -> Any:
        """``fn(item)``, its time added to this stage's busy seconds (a stage of several threads: their sum)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(item)
        finally:
            with self._lock:
                self.busy += time.perf_counter() - t0
                self.cpu += time.thread_time() - c0
                self.batches += 1

    def add(self, busy: float, cpu: float, batches: int, occupancy: int) -> None:
        """Add another process's counts of this stage (reader or worker processes)."""
        self.busy, self.cpu = self.busy + busy, self.cpu + cpu
        self.batches, self.occupancy = self.batches + batches, self.occupancy + occupancy

    def counts(self) -> tuple[float, float, int, int]:
        """What `add` takes: busy and CPU seconds, batches, summed occupancy."""
        return self.busy, self.cpu, self.batches, self.occupancy

    def as_dict(self, depth: int) -> dict[str, float]:
        return {"seconds": round(self.busy, 4), "cpu_seconds": round(self.cpu, 4), "batches": self.batches,
                "mean_queue_after": round(self.occupancy / max(self.batches, 1), 3), "queue_depth": depth}


class Executor:
    """A `Pipeline` run on stage threads (read, one per decode lane, ops) over ``plans``: iterate it for
    `Batch`es. Where the plans hold an `EpochEnd` between two epochs, iteration stops there (`ended` holds it)
    while the threads go on into the next epoch, and iterating again continues with its batches: the pipeline
    does not drain and refill between epochs. `close()` (also on garbage collection, ``break`` or an exception)
    stops every thread and leaves none behind. Executors still running when the interpreter exits are closed
    by an exit hook, before finalization: a stage thread left inside a torch call while the interpreter
    finalizes aborts the process ("terminate called without an active exception").

    The ops stage runs its torch CPU ops on the ``ops_threads`` setting's intra-op threads (half the cores
    unless set), not torch's default of every core: the decode pool keeps the cores busy meanwhile, and
    OpenMP threads spinning beside it made the ops stage ~3x slower on 2 cores (see `ingest.defaults`)."""

    def __init__(self, pipeline: Pipeline, plans: Iterator[BatchPlan], *, prefetch: int = 2,
                 read: Callable[[BatchPlan], _Work] | None = None):
        self.pipeline = pipeline
        self.prefetch = prefetch
        self._stop = threading.Event()
        self.stats = pipeline.stage_stats
        # ``read``: what the read stage does instead of `Pipeline.read` (reader processes: receive the batch)
        self._read = read
        # The decode stage runs one thread per decode lane: batch k goes to lane k % lanes, and the ops stage
        # takes them back in the same turn, so batches stay in order. Each stage takes a place in the queue after
        # it before it starts a batch (`_Slots`); decoded batches hold device memory, so the lanes share the
        # ``prefetch`` places after the decode stage.
        lanes = len(pipeline.lanes)
        # Outputs in flight: those queued (``prefetch``), the one the consumer holds, the one it held before.
        pipeline.start_outputs(prefetch + 1 if pipeline.consumer_stream is not None else None, self._stop)
        to_decode = [_Slots(self._stop, prefetch) for _ in range(lanes)]
        decoded = [_Slots(self._stop, max(1, prefetch // lanes)) for _ in range(lanes)]
        self._out = _Slots(self._stop, prefetch)
        self._queues = [*to_decode, *decoded, self._out]
        plans = iter(plans)
        # (work, take an item, where results go, stats, torch intra-op threads (None: torch's), thread name)
        stages = [(read or pipeline.read, lambda: next(plans, _End()), _Turns(to_decode), self.stats[0], None,
                   "read")]
        for k in range(lanes):
            stages.append((lambda work, k=k: pipeline.decode(work, k), to_decode[k].get, _Turns([decoded[k]]),
                           self.stats[1], None, f"decode{k or ''}"))
        stages.append((pipeline.transform, _Turns(decoded).get, _Turns([self._out]), self.stats[2],
                       defaults.ops_threads(), "ops"))
        self._threads = [threading.Thread(target=self._run_stage, name=f"ingest-{name}", daemon=True, args=args)
                         for *args, name in stages]
        self._closed = False
        self.ended: EpochEnd | None = None   # the epoch end the consumer reached last, until the next epoch is taken
        CLOSE_AT_EXIT.add(self)
        for t in self._threads:
            t.start()

    def _run_stage(self, fn, take, out: _Turns, stats: StageStats, threads: int | None) -> None:
        bind_thread(self.pipeline.device)
        if threads is not None:
            set_thread_torch_threads(threads)
        try:
            while out.reserve():   # room for the result first: no finished batch waits in this thread
                item = take()
                if item is None:   # stopped
                    return
                if isinstance(item, (_End, _Raised)):
                    out.cancel()
                    out.put(item)
                    return
                if isinstance(item, EpochEnd):   # takes its place like a batch: it keeps the lanes' turns
                    out.put(item)
                    continue
                result = stats.timed(fn, item)
                stats.occupancy += out.qsize()
                if result is None:
                    out.cancel()
                else:
                    out.put(result)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, re-raised there
            out.put(_Raised(exc))

    def __iter__(self) -> "Executor":
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        item = self._out.get()
        if isinstance(item, EpochEnd):   # the threads go on into the next epoch
            self.ended = item
            raise StopIteration
        if item is None or isinstance(item, _End):
            self.close()
            raise StopIteration
        if isinstance(item, _Raised):
            self.close()
            raise item.exc
        return item

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        CLOSE_AT_EXIT.discard(self)
        self._stop.set()
        if hasattr(self._read, "close"):
            self._read.close()   # a read stage waiting on other processes stops waiting
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()
        for q in self._queues:
            q.clear()
        if self.pipeline._stop_outputs is self._stop:   # not another executor's since
            self.pipeline.start_outputs(None)   # the outputs kept for reuse go (those the user holds stay theirs)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def set_thread_torch_threads(n: int) -> None:
    """Run the calling thread's torch CPU ops on ``n`` intra-op threads, leaving other threads' counts alone.
    torch keeps the count per thread (OpenMP's) but also records it as the count of threads that start using
    torch later (the user's among them): that default is put back from a short-lived thread."""
    default = torch.get_num_threads()
    if n == default:
        return
    torch.set_num_threads(n)
    restore = threading.Thread(target=torch.set_num_threads, args=(default,), name="ingest-threads")
    restore.start()
    restore.join()


#: Executors and worker pools still open, closed by an exit hook (see `Executor`); each leaves on close().
CLOSE_AT_EXIT: "weakref.WeakSet[Any]" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for obj in list(CLOSE_AT_EXIT):
        obj.close()
