"""The PyTorch adapter: `Loader`, the DataLoader-like front of the executor, and `GenericIterator`, the
`DALIGenericIterator`-like multi-output form. This is the only module that knows framework conventions."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from ._driver import on_device
from ._malloc import keep_freed_memory
from . import defaults
from .decode.codecs import output_options
from .errors import ConfigError, IngestError
from .formats import detect, open_source
from .formats.base import Location, Record, Source, check_index, fields_of
from .formats.boxes import box_format as check_box_format
from .formats.filetree import IMAGE_EXTENSIONS
from .formats.memory import MemorySource
from .ops.mix import split as split_batch_op
from .ops.user import as_ops
from .engine import STAGES, Batch, EpochEnd, Executor, Failures, Pipeline, StageStats, resolve_device
from .engine.batch import cuda_tensors
from .sampler import LAST_BATCH, BatchPlan, Sampler
from .stream import DEFAULT_BUFFER, StreamedSource
from .engine.workers import STAGES as WORKER_STAGES
from .engine.workers import WorkerPool

OUTPUTS = ("tuple", "dict")


class Loader:
    """Batches of augmented images and labels as tensors on ``device``.

    ``source``: a dataset path — an ImageFolder root, an LMDB directory, ``*.tfrecord``/``*.record`` (also
    ``.gz``), ``*.rec``, ``*.tar``/``*.tgz`` shards (a file, a glob, a directory of shards or a list of paths),
    a raw-shard index, a COCO ``instances_*.json``, or a converter output directory; the format is detected
    from the path (`ingest.formats.detect`), ``format=`` overrides it and ``reader_options`` go to its reader
    (e.g. a TFRecord feature spec). Or any `ingest.formats.Source`, a list of encoded images (bytes / uint8
    arrays), or an iterator of encoded images or ``(image, label)`` pairs (streamed in arrival order: no
    shuffle, sharding or ``len``). Compressed record files are streamed (`ingest.stream`): shard order
    shuffled, then a ``shuffle_buffer``-record buffer.

    ``num_workers``: 0 runs the pipeline on threads of this process; W > 0 adds W worker processes (batch b
    on worker b % W; see `ingest.engine.workers`). ``worker_stages`` says what they run: "all" (the default,
    "auto": each worker runs the whole pipeline, with ``num_threads`` or cores / W decode threads, and on
    CUDA its own context) or "read" (reading, parsing, header probes and drawing the augmentation: CPU work,
    no CUDA context) with decode and ops on this process's threads and its one CUDA context: about a quarter
    of the GPU memory, but the decode and ops share the training loop's GIL (see docs/design.md). Default
    ``num_workers`` (None): the ``num_workers`` setting of `ingest.defaults`, "auto" unless set: none for GPU
    decode, raw shards and detection targets (the training process runs them: one CUDA context), 4 (fewer under
    16 cores) for CPU decode feeding a CUDA device, none on the CPU (see `auto_workers`). Workers are
    spawned (CUDA cannot be forked), so a script that iterates such a loader needs the usual
    ``if __name__ == "__main__":`` guard.

    Iterating yields ``(images, labels)``, or with ``output="dict"`` a dict with ``images``, ``labels``,
    every other field the source declares (collated by kind, see `ingest.engine.collate`), ``indices`` (dataset
    indices) and ``is_pad`` (padding of the last batch). Every ``iter()``
    starts the next epoch (or resumes the one `load_state_dict` points into). Without worker processes the
    pipeline reads on into the next epoch while the last one's batches are consumed, as DALI's does: a loader
    that finished an epoch holds its threads and a few batches until its next epoch or `close()` (or ``with``,
    or collection). ``shard_id`` / ``num_shards``
    default to the ``torch.distributed`` rank and world size when it is initialized. ``last_batch``: "drop",
    "partial" or "pad" (see `ingest.sampler.Sampler`); by default "pad" when sharded, so that every rank gets
    the same number of batches (like ``DistributedSampler``: repeated samples, marked in ``is_pad``), else
    "partial".

    ``ragged``: the batch type of ``images`` (and of other image fields). False (the default): one tensor
    ``[N, C, H, W]`` every batch; a batch whose images differ in size (no op fixed it: Resize to (h, w),
    CenterCrop, RandomResizedCrop, PadTo(batch=True)) is a ConfigError saying so. True: always a list of
    ``[C, H, W]`` tensors, whatever the sizes (what torchvision's detection models take). One Loader never
    mixes the two.

    ``decode_dtype`` and ``channels``: what encoded images decode to (every format, `ingest.decode.codecs`).
    By default 8-bit RGB: 16-bit samples keep their 8 high bits, alpha is dropped, gray is repeated.
    ``decode_dtype=torch.uint16`` keeps 16-bit samples as stored (an 8-bit image stays 0..255);
    ``channels=1`` gives gray (colour becomes ITU-R 601 luma), ``channels=4`` RGB with alpha (opaque where the
    file has none). Batches are then ``[N, channels, H, W]`` of that dtype, or Normalize's output. Geometry
    (Resize, CenterCrop, RandomResizedCrop, Flip) and Normalize take 16-bit pixels (Normalize scales them by
    65535 where 8-bit ones are scaled by 255, so its 0..255 ``mean`` and ``std`` serve both); other ops are
    8-bit only, and colour ops refuse 4 channels (and 1 where they change colours): ConfigErrors here. These
    settings decode on the CPU (the GPU decoders write 8-bit RGB) and run on the Python stages, not the
    native engine. Only encoded images have them (a raw-pixel source is given as stored).
    """

    def __init__(self, source: str | os.PathLike | Source | Sequence | Iterable, *, batch_size: int,
                 device: str | torch.device = "cpu", decode: str | None = None, ops: Sequence = (),
                 shuffle: bool = False, seed: int = 0, last_batch: str | None = None,
                 shard_id: int | None = None, num_shards: int | None = None, prefetch: int = 2,
                 num_threads: int | None = None, num_workers: int | None = None, max_failures: int | float = 0,
                 io: str | None = None, output: str = "tuple", extensions: Sequence[str] = IMAGE_EXTENSIONS,
                 format: str | None = None, reader_options: dict[str, Any] | None = None,
                 shuffle_buffer: int = DEFAULT_BUFFER, worker_stages: str = "auto", ragged: bool = False,
                 decode_dtype: torch.dtype | str = torch.uint8, channels: int = 3):
        decode_dtype, channels = output_options(decode_dtype, channels)   # ConfigError naming the choices
        if output not in OUTPUTS:
            raise ConfigError(f"Unknown output {output!r}. Available: {', '.join(OUTPUTS)}")
        if not isinstance(ragged, bool):
            raise ConfigError(f"`ragged` must be True or False, got {ragged!r}")
        self.ragged = ragged
        if shard_id is None and num_shards is None:
            shard_id, num_shards = _distributed_rank()
        elif shard_id is None or num_shards is None:
            raise ConfigError("pass both `shard_id` and `num_shards`, or neither")
        if last_batch is None:  # sharded: equal batch counts on every rank, or a DDP step waits forever
            last_batch = "pad" if num_shards > 1 else "partial"
        self._stream = None
        if _is_path(source):
            fmt = format or detect(source)
            options = dict(reader_options or {})
            if fmt == "filetree":
                options.setdefault("extensions", extensions)
            source = open_source(source, fmt, **options)
        elif format is not None or reader_options is not None:
            raise ConfigError("`format` and `reader_options` apply when `source` is a path; got a "
                              f"{type(source).__name__}")
        elif isinstance(source, (list, tuple)):
            source = MemorySource(source)
        elif not isinstance(source, Source) and isinstance(source, Iterable):
            if shuffle or num_shards > 1:
                raise ConfigError("a streamed iterator cannot be shuffled or sharded; pass a list instead")
            self._stream = _Stream(iter(source))
            source = self._stream
        elif not isinstance(source, Source) and not getattr(source, "streamed", False):
            raise ConfigError(f"`source` must be a path, a Source, a list or an iterable, got {type(source).__name__}")
        self._streamed: StreamedSource | None = None
        if self._stream is None and getattr(source, "streamed", False):  # GZIP TFRecords, gzipped tars
            source = self._streamed = StreamedSource(source, buffer_size=shuffle_buffer)
        fields = fields_of(source)
        self._image_fields = {name for name, f in fields.items() if f.kind in IMAGE_KINDS and name != "image"}
        if output == "tuple" and "image" not in fields:
            raise ConfigError(f"this source has no image field (fields: {', '.join(fields)}); "
                              "use output='dict'")
        clash = set(fields) & {"images", "labels", "indices", "is_pad"}
        if clash:
            raise ConfigError(f"field names {sorted(clash)} clash with the loader's own outputs")
        self.source = source
        self.sampler = Sampler(len(source) if self._stream is None else 0, batch_size, shuffle=shuffle,
                               seed=seed, shard_id=shard_id, num_shards=num_shards, last_batch=last_batch)
        if self._stream is None and self.sampler.shard_length() == 0 and len(source) > 0:
            raise ConfigError(f"shard {shard_id} of {num_shards} is empty: the dataset has {len(source)} samples")
        self.device, self.decode = resolve_device(device, decode)
        self.ops = as_ops(ops)   # refused here, not in a worker: anything that is not an op
        split_batch_op(self.ops, boxes="boxes" in fields, labels="label" in fields)
        self.max_failures = max_failures
        Failures(max_failures, 0)  # validate now, not at the first epoch
        if prefetch < 1:
            raise ConfigError(f"`prefetch` must be >= 1, got {prefetch}")
        self.prefetch = prefetch
        if num_workers is None:
            num_workers = defaults.get("num_workers")
        if num_workers == "auto":
            num_workers = auto_workers(self.device, self.decode, fields)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"`num_workers` must be an int >= 0, got {num_workers!r}")
        if self._stream is not None or self._streamed is not None:
            num_workers = 0  # a stream is read where it lives
        self.num_workers = num_workers
        self.pipeline: Pipeline | None = None
        self._pool: WorkerPool | None = None
        if worker_stages not in ("auto", *WORKER_STAGES):
            raise ConfigError(f"Unknown worker_stages {worker_stages!r}. Available: auto, "
                              f"{', '.join(WORKER_STAGES)}")
        # "auto" is "all": "read" holds less GPU memory but does not train faster (docs/measurements.md,
        # Reader processes), so it is a choice to make, not the default, until it trains faster.
        self.worker_stages = ("all" if worker_stages == "auto" else worker_stages) if num_workers else None
        if self.worker_stages != "all":   # this process runs the pipeline, or its decode and ops
            if defaults.get("keep_freed_memory") == "auto":
                keep_freed_memory()   # its per-record copies reuse freed pages instead of faulting in new ones
            self.pipeline = Pipeline(source, ops=self.ops, device=self.device, decode=self.decode, io=io,
                                     num_threads=num_threads, decode_dtype=decode_dtype, channels=channels)
        if self.worker_stages == "read":
            self._check_read_stage()
        # The native engine (`ingest.native`) runs the epochs where eligible and the ``engine`` setting allows.
        from . import native
        chain, why = native.why_not(source, self.ops, device=self.device, decode=self.decode, workers=num_workers,
                                    streamed=self._stream is not None or self._streamed is not None,
                                    tuple_output=True, pipeline=self.pipeline, decode_dtype=decode_dtype,
                                    channels=channels)
        self._native = native.choose(defaults.get("engine"), chain, why)
        self.engine = "native" if self._native is not None else "python"   # what runs (`stats()["engine"]`)
        self.native_why_not = why   # why the native engine does not run these settings (None where it can)
        worker_threads = num_threads or max(1, defaults.cores() // max(num_workers, 1))
        self._spec = dict(source=source, ops=self.ops, device=str(self.device), decode=self.decode, io=io,
                          num_threads=worker_threads, sampler=self.sampler, prefetch=prefetch,
                          max_failures=max_failures, stages=self.worker_stages, decode_dtype=decode_dtype,
                          channels=channels)
        self.output = output
        self.epoch = -1            # the epoch being (or last) iterated
        self._resume: tuple[int, int, int] | None = None   # (epoch, batch, offset) for the next iter()
        self._offset = 0           # samples of the epoch's global order delivered before a resize (elastic)
        self._next = 0             # number of the batch after the last one handed out (the resume point)
        self._run = 0              # counts iter() calls: an iterator of an older run ends at its next step
        self._finished = True
        # The in-process executor. It runs on into the next epoch when one ends (`_epochs`): a new `iter()` that
        # asks for that epoch from its start takes it over (`_chained`); anything else closes it.
        self._executor: Executor | None = None
        self._failures: Failures | None = None

    def _check_read_stage(self) -> None:
        """Read-only workers hand over encoded images read through the host (not raw shards read straight into
        the batch, nor decoded pixels)."""
        p = self.pipeline
        if p.image_kind != "image" or p.direct:
            raise ConfigError("worker_stages='read' needs a source of encoded images; this one has "
                              f"{p.image_kind or 'no'} images{' read straight to the device' if p.direct else ''}: "
                              "use worker_stages='all' or num_workers=0")

    # -- iteration ------------------------------------------------------------------------
    def __len__(self) -> int:
        if self._stream is not None:
            raise TypeError("a Loader over a streamed iterator has no length")
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run ``epoch`` from its start (like DistributedSampler.set_epoch)."""
        self._resume = (int(epoch), 0, 0)

    def __iter__(self) -> Iterator:
        if self._resume is not None:
            epoch, start, offset = self._resume
            self._resume = None
        else:
            epoch, start, offset = self.epoch + 1, 0, 0
        chained = self._chained(epoch, start, offset)
        if chained is None:
            self._close_executor()
        self.epoch, self._offset, self._next, self._finished = epoch, offset, start, False
        self._run += 1
        if chained is not None:   # the running executor has read on into this epoch
            self._failures = chained.ended.failures
            self._failures.release()   # its read-ahead failures are this epoch's: reported now
            chained.ended = None
            return self._iterate(chained, self._run)
        if self._stream is not None:
            plans = self._stream.plans(self.sampler.batch_size, self.sampler.seed)
        elif self._streamed is not None:
            plans = self._streamed.plans(self.sampler, self.epoch, start, self._offset)
        else:
            plans = self.sampler.batches(self.epoch, start, self._offset)
        # A fractional budget is a share of the samples this epoch reads (None: unknown, for a stream).
        self._failures = Failures(self.max_failures, self.sampler.samples(start, self._offset) if self._stream is None else None)
        if self._native is not None and self._native_output():
            from .native import NativeExecutor
            self.pipeline.deliver(None, with_fields=self.output != "tuple")
            sampler = self.sampler
            self.engine = "native"
            self._executor = NativeExecutor(self.pipeline, self._native, sampler, epoch=self.epoch, start=start,
                                            offset=self._offset, failures=self._failures,
                                            budget=partial(Failures, self.max_failures, sampler.samples(0, 0), held=True),
                                            prefetch=self.prefetch, with_fields=self.output != "tuple")
            return self._iterate(self._executor, self._run)
        read = None
        if self.pipeline is not None:   # set below where this process's ops stage makes the batches
            self.pipeline.deliver(None, with_fields=self.output != "tuple")
        if self.num_workers:
            if self._pool is None:
                self._pool = WorkerPool(self._spec, self.num_workers)
            count = self.sampler.num_batches(self._offset)
            if self.worker_stages == "all":
                return self._iterate(self._pool.epoch(self.epoch, start, count, self._failures, self._offset),
                                     self._run)
            stop = threading.Event()
            read = _Received(self._pool.epoch(self.epoch, start, count, self._failures, self._offset, stop), stop)
        elif self._stream is None:   # a sampler's epochs, or a streamed source's, run on (`_epochs`)
            sampler, streamed = self.sampler, self._streamed   # not self: the read thread must not hold the Loader
            plans_of = sampler.batches if streamed is None else partial(streamed.plans, sampler)
            plans = _epochs(plans, self.epoch, plans_of, self.pipeline,
                            partial(Failures, self.max_failures, sampler.samples(0, 0), held=True))
        self.pipeline.start_epoch(self._failures)
        self.pipeline.deliver(torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None,
                              with_fields=self.output != "tuple")
        self._executor = Executor(self.pipeline, plans, prefetch=self.prefetch, read=read)
        self.engine = "python"
        return self._iterate(self._executor, self._run)

    def _native_output(self) -> bool:
        """Whether the native engine gives what this iteration yields (a dict asks for every field); a
        ConfigError where the ``engine`` setting is "native" and it does not."""
        extra = set(fields_of(self.source)) - {"image", "label"} - self._native.fields
        if self.output == "tuple" or not extra:
            return True
        if defaults.get("engine") == "native":
            raise ConfigError(f"engine='native', but output='dict' asks for fields the native engine does not "
                              f"collate: {', '.join(sorted(extra))}")
        return False

    def _chained(self, epoch: int, start: int, offset: int) -> Executor | None:
        """The running executor, if the consumer took every batch of the last epoch and it has read on into
        ``epoch`` from its start, with the fields this iteration yields."""
        ex = self._executor
        if ex is None or ex.ended is None or not self._finished:
            return None
        if (ex.ended.epoch, start, offset) != (epoch, 0, 0) or self.pipeline.with_fields != (self.output != "tuple"):
            return None
        return ex

    def _iterate(self, batches: Iterator[Batch], run: int) -> Iterator:
        """Deliver ``batches``; ends (StopIteration) at its next step once a newer ``iter()`` has started, with
        or without worker processes. An executor that stopped at an epoch end runs on (see `Executor`)."""
        finished = False
        try:
            while run == self._run:
                try:
                    batch = next(batches)
                except StopIteration:
                    self._finished = finished = True
                    return
                if run != self._run:
                    return
                self._next = batch.number + 1   # a batch dropped whole by the failure budget is not replayed
                yield self._deliver(batch)
        finally:
            close = getattr(batches, "close", None)
            if close is not None and not (finished and getattr(batches, "ended", None) is not None):
                close()

    def _deliver(self, batch: Batch):
        if batch.ready is not None:
            with on_device(self.device):   # the caller's thread may be a new one, or on another GPU
                stream = torch.cuda.current_stream(self.device)
                stream.wait_event(batch.ready)
                if self.pipeline is not None and self.pipeline.outputs_ahead is not None:
                    self.pipeline.handed_over(stream)   # bounds the outputs in flight (`Outputs.bound_outputs`)
                marked = self.pipeline.consumer_stream if self.pipeline is not None else None
                if stream != marked:   # else this process's ops stage marked them (`OpsStage.consumer_stream`)
                    for t in cuda_tensors((batch.images, batch.labels, batch.fields)):
                        t.record_stream(stream)
        images = batch.images
        if self.ragged or not isinstance(images, torch.Tensor):   # (a tensor, not ragged: the batch type as it is)
            images = one_batch_type(images, "images", self.ragged)
        if self.output == "tuple":
            return images, batch.labels
        fields = batch.fields
        if fields:
            fields = {name: one_batch_type(value, name, self.ragged) if name in self._image_fields else value
                      for name, value in fields.items()}
        return {"images": images, "labels": batch.labels, **fields, "indices": batch.indices, "is_pad": batch.is_pad}

    def _close_executor(self) -> None:
        if self._executor is not None:
            self._executor.close()
        self._executor = None

    def close(self) -> None:
        """Stop any running epoch and release threads, worker processes and decoders, and the handles the
        source opened in this process (its ``close``, if it has one: files, LMDB environments)."""
        self._close_executor()
        if self.pipeline is not None:
            self.pipeline.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        close_source = getattr(self.source, "close", None)
        if callable(close_source):
            close_source()

    def __del__(self) -> None:
        try:
            if getattr(self, "_executor", None) is not None:
                self._close_executor()
            pool = getattr(self, "_pool", None)
            if pool is not None:
                pool.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the next batch comes from. Save it with the model; `load_state_dict` resumes exactly there,
        with the same order and the same augmentation randomness as an uninterrupted run, on this number of
        ranks or another (``position``: samples of the epoch's global order delivered by all ranks).
        ``fingerprint`` identifies the dataset (`dataset_fingerprint`)."""
        if self._resume is not None:
            epoch, batch, offset = self._resume
        elif self._finished:
            epoch, batch, offset = self.epoch + 1, 0, 0
        else:
            epoch, batch, offset = self.epoch, self._next, self._offset
        s = self.sampler
        return {"epoch": epoch, "batch": batch, "offset": offset, "position": s.position(batch, offset),
                "seed": s.seed, "shuffle": s.shuffle, "batch_size": s.batch_size, "num_shards": s.num_shards,
                "shard_id": s.shard_id, "num_samples": s.n, "last_batch": s.last_batch,
                "fingerprint": self._dataset_fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next ``iter()`` resume where ``state`` (from `state_dict`, usually rank 0's) points.

        With the same number of ranks, batch size and last-batch policy every rank resumes at the saved batch
        of its own shard. Otherwise (elastic resume: N ranks saved, M resume) the rest of the epoch is the
        part of its global order not yet delivered, ``state["position"]`` on, sharded over this loader's ranks,
        each sample once; later epochs are those of an uninterrupted run of this configuration.

        Notes: every field is checked before anything changes (`check_state`): its type (ints are ints, not
        strings, floats or bools) and its range, and that the state comes from this dataset, seed and
        shuffle (``fingerprint``: a state saved before it existed is accepted on the other checks). A
        ConfigError names the field that fails."""
        if self._stream is not None:
            raise ConfigError("a Loader over a streamed iterator cannot resume from a state_dict")
        s = self.sampler
        saved = check_state(state, s)
        saved_print = state.get("fingerprint")
        if saved_print is not None and saved_print != self._dataset_fingerprint():
            raise ConfigError(f"checkpoint `fingerprint` {saved_print!r} is not this dataset's "
                              f"({self._dataset_fingerprint()!r}): it was saved over other samples")
        epoch, batch, offset = int(state["epoch"]), int(state["batch"]), int(state.get("offset", 0))
        self._close_executor()
        layout = {"batch_size": s.batch_size, "num_shards": s.num_shards, "last_batch": s.last_batch}
        if all(state[k] == v for k, v in layout.items()):
            self._resume = (epoch, batch, offset)
        else:
            position = saved.position(batch, offset)
            self._resume = (epoch, 0, position) if position < s.n else (epoch + 1, 0, 0)

    def _dataset_fingerprint(self) -> str | None:
        """`dataset_fingerprint` of the source, made once (None over a streamed iterator, which cannot resume)."""
        if self._stream is not None:
            return None
        if getattr(self, "_fingerprint", None) is None:
            self._fingerprint = dataset_fingerprint(self.source)
        return self._fingerprint

    # -- observability ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Which read and decode paths ran (and why GPU-eligible images went to the CPU decoder instead:
        ``gpu_fallbacks``), per-stage busy and CPU seconds (`StageStats`) and queue occupancy
        (counting the work read ahead into the next epoch), the current epoch's failures (summed over worker
        processes, if any); where this process's ops stage runs on CUDA, ``buffers``: how many output batches
        (`Outputs.dense_output`) and GPU decode arenas it allocated, and the arenas' size."""
        reports = [r for r in (self._pool.stats if self._pool else []) if r]
        totals = [StageStats(name) for name in STAGES]
        paths, fallbacks, read_path = Counter(), Counter(), reports[0]["read_path"] if reports else None
        for r in reports:
            for t in totals:
                t.add(*r["stages"][t.name])
            paths.update(r["decode_paths"])
            fallbacks.update(r["gpu_fallbacks"])
        stages = {t.name: t.as_dict(self.prefetch) for t in totals}
        out: dict[str, Any] = {}
        if self.pipeline is not None:
            if reports:   # reader processes: their read stage (summed), then this process's stages
                out["worker_read"] = stages["read"]
            stages = {s.name: s.as_dict(self.prefetch) for s in self.pipeline.stage_stats}
            paths = Counter(self.pipeline.decode_paths)
            fallbacks.update(self.pipeline.gpu_fallbacks)
            read_path = read_path or self.pipeline.read_path
            if self.pipeline.device.type == "cuda":   # how many batch buffers this process allocated
                gpu = self.pipeline.lanes[0][0]
                out["buffers"] = {"outputs_made": self.pipeline.outputs_made,
                                  "arenas_made": gpu.arenas.made if gpu is not None else 0,
                                  "arena_mb": round(gpu.arenas.size / 2**20, 1) if gpu is not None else 0}
        if getattr(self._executor, "native", False):   # the native engine's counts
            out["native"] = self._executor.stats()
        return {"engine": self.engine, "read_path": read_path, "decode": self.decode, "decode_paths": dict(paths),
                "gpu_fallbacks": dict(fallbacks), "device": str(self.device), "workers": self.num_workers,
                "worker_stages": self.worker_stages, "stages": stages, **out,
                "failures": list(self._failures.items) if self._failures else []}

    def __repr__(self) -> str:
        return (f"Loader({self.source!r}, batch_size={self.sampler.batch_size}, device='{self.device}', "
                f"decode='{self.decode}', num_workers={self.num_workers}, ops={self.ops!r})")


#: Fields of `Loader.state_dict`; ``fingerprint`` may be absent (states saved before it existed).
STATE_FIELDS = ("epoch", "batch", "offset", "position", "seed", "shuffle", "batch_size", "num_shards", "shard_id",
                "num_samples", "last_batch", "fingerprint")
#: Fields a state may lack (states saved by earlier versions): offset and position 0, shard 0, no fingerprint.
OPTIONAL_STATE = ("offset", "position", "shard_id", "fingerprint")
#: Samples whose names go into `dataset_fingerprint` (spread evenly, the first and the last among them).
FINGERPRINT_SAMPLES = 16


def dataset_fingerprint(source: Any) -> str:
    """A short hash identifying a dataset for checkpoints: its length, its class names and the file names
    (the last path component, so a dataset moved to another directory keeps its fingerprint) of up to
    `FINGERPRINT_SAMPLES` samples spread over it; a streamed source's shard file names stand for the
    samples, which it can only name while it holds them."""
    n = len(source)
    digest = hashlib.sha256(f"{n}\0".encode())
    digest.update("\0".join(map(str, getattr(source, "classes", ()))).encode("utf-8", "surrogatepass") + b"\1")
    if isinstance(source, StreamedSource):
        names = [str(shard) for shard in getattr(source.source, "shards", ())]
    else:
        spread = (round(k * (n - 1) / (FINGERPRINT_SAMPLES - 1)) for k in range(FINGERPRINT_SAMPLES))
        picks = sorted(set(spread)) if n else []
        names = []
        for i in picks:
            try:
                names.append(str(source.name(i)))
            except (IngestError, OSError, LookupError, AttributeError):   # a source that cannot name its samples
                names.append("?")
    for name in names:
        digest.update(os.path.basename(name.rstrip("/")).encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()[:16]


def check_state(state: Any, sampler: Sampler) -> Sampler:
    """Raise ConfigError, naming the field, unless ``state`` is a `Loader.state_dict` that ``sampler``'s
    loader can resume: every field of `STATE_FIELDS` there (but `OPTIONAL_STATE`) and of its type and range,
    no other field, the dataset order's fields (seed, shuffle, number of samples) equal to the sampler's,
    and ``batch``, ``offset`` and ``position`` inside the epoch of the saved layout. Returns the sampler of
    the saved layout."""
    if not isinstance(state, dict):
        raise ConfigError(f"`state` must be a dict from Loader.state_dict(), got {type(state).__name__}")
    missing = [k for k in STATE_FIELDS if k not in state and k not in OPTIONAL_STATE]
    if missing:
        raise ConfigError(f"checkpoint is missing {', '.join(missing)}: not a Loader.state_dict()")
    unknown = sorted(map(repr, set(state) - set(STATE_FIELDS)))
    if unknown:
        raise ConfigError(f"checkpoint has unknown field(s) {', '.join(unknown)}: not a Loader.state_dict()")
    for key in ("epoch", "batch", "offset", "position", "seed", "num_samples", "shard_id"):
        _state_int(state, key, 0)
    for key in ("batch_size", "num_shards"):
        _state_int(state, key, 1)
    if not isinstance(state["shuffle"], (bool, np.bool_)):
        raise ConfigError(f"checkpoint `shuffle` must be a bool, got {state['shuffle']!r}")
    if not isinstance(state["last_batch"], str) or state["last_batch"] not in LAST_BATCH:
        raise ConfigError(f"checkpoint `last_batch` must be one of {', '.join(LAST_BATCH)}, got "
                          f"{state['last_batch']!r}")
    fingerprint = state.get("fingerprint")
    if fingerprint is not None and not (isinstance(fingerprint, str) and re.fullmatch(r"[0-9a-f]{16}", fingerprint)):
        raise ConfigError(f"checkpoint `fingerprint` must be 16 hex digits, got {fingerprint!r}")
    if not int(state.get("shard_id", 0)) < int(state["num_shards"]):
        raise ConfigError(f"checkpoint `shard_id` must be < its `num_shards` {state['num_shards']}, got "
                          f"{state['shard_id']}")
    order = {"seed": sampler.seed, "shuffle": sampler.shuffle, "num_samples": sampler.n}
    diff = {k: (state[k], v) for k, v in order.items() if state[k] != v}
    if diff:
        raise ConfigError("checkpoint comes from another dataset order (saved, current): "
                          + ", ".join(f"{k}={a!r}/{b!r}" for k, (a, b) in diff.items()))
    batch, offset = int(state["batch"]), int(state.get("offset", 0))
    for key in ("offset", "position"):   # position is what batch and offset give; only its range is checked
        if int(state.get(key, 0)) > sampler.n:
            raise ConfigError(f"checkpoint `{key}` {state[key]} is past the {sampler.n} samples of an epoch")
    saved = Sampler(sampler.n, int(state["batch_size"]), shuffle=sampler.shuffle, seed=sampler.seed,
                    num_shards=int(state["num_shards"]), last_batch=state["last_batch"])
    top = saved.num_batches(offset)
    if batch > top:
        raise ConfigError(f"checkpoint `batch` must be an int in [0, {top}] (its loader had {top} batches "
                          f"in that epoch), got {batch}")
    return saved


def _state_int(state: dict[str, Any], key: str, low: int) -> None:
    value = state.get(key, low)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(f"checkpoint `{key}` must be an int >= {low}, got {value!r}")


def _epochs(plans: Iterator[BatchPlan], epoch: int, plans_of: Callable[[int, int, int], Iterator[BatchPlan]],
            pipeline: Pipeline, budget: Callable[[], Failures]) -> Iterator[BatchPlan | EpochEnd]:
    """``plans`` (those of ``epoch``), then each following epoch's from its start (``plans_of(epoch, 0, 0)``),
    after an `EpochEnd` holding its failure budget. Advanced by the read stage alone, which sets that budget on
    the pipeline between the two epochs' reads: a batch counts against the budget of the epoch it was read in
    (`_Work.failures`)."""
    yield from plans
    while True:
        epoch += 1
        failures = budget()
        yield EpochEnd(epoch, failures)
        pipeline.start_epoch(failures)
        yield from plans_of(epoch, 0, 0)


class _Received:
    """The read stage when worker processes read: the next batch they sent (in plan order). `close` (the
    executor's) ends a wait for one."""

    def __init__(self, works: Iterator, stop: threading.Event):
        self.works, self.stop = works, stop

    def __call__(self, plan: BatchPlan):
        work = next(self.works, None)
        if work is not None and work.plan.number != plan.number:
            raise IngestError(f"reader processes sent batch {work.plan.number} where {plan.number} was due")
        return work

    def close(self) -> None:
        self.stop.set()


class GenericIterator:
    """`DALIGenericIterator`'s shape over a `Loader`: each step yields a one-element list holding a dict that
    maps ``output_map`` names to the loader's outputs (images, labels, then indices, is_pad)."""

    FIELDS = ("images", "labels", "indices", "is_pad")

    def __init__(self, loader: Loader, output_map: Sequence[str] = ("data", "label")):
        if not 1 <= len(output_map) <= len(self.FIELDS):
            raise ConfigError(f"`output_map` must name 1 to {len(self.FIELDS)} outputs "
                              f"(in order: {', '.join(self.FIELDS)}), got {list(output_map)}")
        self.loader, self.output_map = loader, list(output_map)
        self._it: Iterator | None = None

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def size(self) -> int:
        return len(self.loader.source)

    def __iter__(self) -> "GenericIterator":
        if self._it is None:
            self.reset()
        return self

    def __next__(self) -> list[dict[str, torch.Tensor]]:
        if self._it is None:
            self.reset()
        try:
            batch = next(self._it)
        except StopIteration:
            self._it = None
            raise
        if not isinstance(batch, dict):
            batch = dict(zip(("images", "labels"), batch))
        return [{name: batch[f] for name, f in zip(self.output_map, self.FIELDS)}]

    def reset(self) -> None:
        """Start the next epoch."""
        self.loader.output = "dict"
        self._it = iter(self.loader)


def auto_workers(device: torch.device, decode: str, fields: dict) -> int:
    """``num_workers="auto"``: worker processes only where Python work per sample is the bound and the GPU does
    not take it over, i.e. CPU decode feeding a CUDA device; else none.

    GPU decode, raw shards, the fused ops and detection targets cost a few Python and native calls per batch
    (a detection batch's boxes are drawn, mapped and pruned as whole-batch arrays: `ingest.ops.boxes`), so
    they run in the training process: one CUDA context, no copy between processes. Fed by GPU-decoded JPEGs,
    training in-process keeps pace with four full workers at a fraction of their GPU memory (each worker holds
    its own context and decode buffers; docs/measurements.md, Executor). The source's ``fields`` do not change
    the choice: detection targets run in the training process like any other field."""
    return min(4, max(1, defaults.cores() // 4)) if device.type == "cuda" and decode == "cpu" else 0


def _is_path(source: Any) -> bool:
    """A dataset path, or a list of shard paths (a list of bytes is in-memory images)."""
    if isinstance(source, (str, os.PathLike)):
        return True
    return isinstance(source, (list, tuple)) and bool(source) and all(isinstance(p, (str, os.PathLike))
                                                                      for p in source)


def _distributed_rank() -> tuple[int, int]:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _Stream:
    """A streamed source (see `ingest.formats.base`) of one shard: an iterable of encoded images or
    ``(image, label)`` pairs, read in arrival order. `iter_shard` walks it from the start (a one-shot iterator
    can be walked once); the Loader pulls it batch by batch through `plans` and reads each batch's items back
    with `locate` / `parse` (dataset index = arrival position), holding only the batch being read."""

    classes: Sequence[str] = ()
    streamed = True
    shards = ("<stream>",)

    def __init__(self, items: Iterable):
        self._items = items
        self._pending: Iterator | None = None   # what `plans` has not taken yet
        self._held: dict[int, tuple[Any, int]] = {}
        self._n = 0

    def iter_shard(self, k: int, skip: int) -> Iterator[tuple[str, Record]]:
        """``(name, record)`` of every item from position ``skip`` on."""
        check_index(k, 1)
        for i, item in enumerate(iter(self._items)):
            if i >= skip:
                image, label = _pair(item)
                yield self.name(i), Record(image, label)

    def plans(self, batch_size: int, seed: int) -> Iterator[BatchPlan]:
        if self._pending is None:
            self._pending = iter(self._items)
        number = 0
        while True:
            start = self._n
            self._held.clear()   # the read stage asks for the next plan once the last one is parsed
            for item in self._pending:
                self._held[self._n] = _pair(item)
                self._n += 1
                if self._n - start == batch_size:
                    break
            if self._n == start:
                return
            idx = np.arange(start, self._n, dtype=np.int64)
            yield BatchPlan(0, number, idx, np.zeros(len(idx), bool), np.random.SeedSequence([seed, 0, 0, number]),
                            seed)
            number += 1

    def __len__(self) -> int:
        return self._n

    def locate(self, i: int) -> Location:
        return Location(self.name(i), data=self._held[i][0])

    def parse(self, i: int, raw) -> Record:
        return Record(raw, self._held[i][1])

    def labels(self) -> np.ndarray:
        """Labels are known only as items stream by."""
        return np.full(0, -1, dtype=np.int64)

    def name(self, i: int) -> str:
        return f"<stream item {i}>"


def _pair(item: Any) -> tuple[Any, int]:
    image, label = item if isinstance(item, tuple) else (item, -1)
    return image, int(label)


#: Field kinds batched as images: one tensor, or with ``ragged=True`` a list (`one_batch_type`).
IMAGE_KINDS = ("image", "pixels", "mask")
#: The ops that give every image of a batch one size, named when a batch's sizes differ.
SIZE_FIXING_OPS = ("Resize((h, w))", "CenterCrop", "RandomResizedCrop", "PadTo(batch=True)")


def one_batch_type(images: Any, name: str, ragged: bool) -> Any:
    """A batch's images (or another image field) in the Loader's one batch type: a tensor ``[N, ...]``, or with
    ``ragged`` a list of per-sample tensors (a tensor split along dim 0). A list of images of different sizes
    where ``ragged`` is False is a ConfigError naming the ops that fix the size and the ``ragged`` option: a
    batch type that changed with the batch's sizes would surface as a crash epochs into training."""
    if ragged:
        return list(images.unbind(0)) if isinstance(images, torch.Tensor) else images
    if not isinstance(images, list):
        return images
    if images and all(im.shape == images[0].shape for im in images):
        return torch.stack(images)
    shapes = sorted({tuple(im.shape) for im in images})
    raise ConfigError(
        f"the {name} of this batch differ in size ({', '.join('x'.join(map(str, s)) for s in shapes[:4])}"
        f"{', ...' if len(shapes) > 4 else ''}) and no op makes them one size, so they cannot be one tensor. "
        f"Add an op that fixes the size ({', '.join(SIZE_FIXING_OPS)}) or pass ragged=True to the Loader "
        f"(every batch's {name} then come as a list of tensors)")


def detection_targets(batch: dict[str, Any], *, boxes: str = "boxes", labels: str = "categories",
                      box_format: str = "xyxy") -> list[dict]:
    """A detection batch (``output="dict"``) as torchvision's detection targets: one dict per image with
    ``boxes`` (float ``[K, 4]`` xyxy pixels, which torchvision's models take, converted from ``box_format``: the
    format the reader was asked for, xyxy by default; `ingest.formats.boxes`), ``labels`` (int64 ``[K]``, from
    the ``labels`` field) and, where the batch has them, ``masks``, ``iscrowd``, ``area`` and ``image_id``;
    padding removed with ``<field>_lengths``."""
    box_format = check_box_format(box_format)
    counts = batch[f"{boxes}_lengths"].tolist() if f"{boxes}_lengths" in batch else \
        [batch[boxes].shape[1]] * batch[boxes].shape[0]
    out = []
    for n, k in enumerate(counts):
        target = {"boxes": _xyxy(batch[boxes][n, :k].float(), box_format), "labels": batch[labels][n, :k].long()}
        for name in ("masks", "iscrowd", "area"):
            if name in batch:
                target[name] = batch[name][n][:k]   # a padded tensor, or a list of per-image masks
        if "image_id" in batch:
            target["image_id"] = batch["image_id"][n]
        out.append(target)
    return out


def _xyxy(b: torch.Tensor, box_format: str) -> torch.Tensor:
    """``[K, 4]`` boxes of ``box_format`` as xyxy (on their device)."""
    if box_format == "xywh":
        return torch.cat([b[:, :2], b[:, :2] + b[:, 2:]], dim=1)
    if box_format == "cxcywh":
        return torch.cat([b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2], dim=1)
    return b
