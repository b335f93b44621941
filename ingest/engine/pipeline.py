"""`Pipeline`: the three stages of one loader, made together, with no threads of their own.

It runs eagerly (`Pipeline.run`, one batch through every stage on the calling thread; for serving and worker
processes) or on threads (`ingest.engine.executor.Executor`). What the stages share, it makes and hands to
each: the CPU decoder and the decode lanes (the decode stage's), the direct-read buffers the ops stage hands
back to the read stage.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import torch

from ..decode.codecs import output_options
from ..errors import ConfigError
from ..formats.base import Source, fields_of
from ..io import ByteReader
from ..ops.mix import split as split_batch_op
from ..ops.planner import check as check_ops
from ..ops.user import as_ops
from ..sampler import BatchPlan
from .base import StageStats
from .batch import Batch, Failures, _Work, split_fields
from .decode import DecodeStage
from .ops import OpsStage
from .read import ReadStage, decoded_pixels, reads_direct

DECODE = ("mixed", "cpu")
STAGES = ("read", "decode", "ops")  # what Pipeline.read, .decode and .transform do, in order


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
    """Per-batch work of each stage (`read_stage`, `decode_stage`, `ops_stage`), with no threads of its own.

    ``decode_dtype`` (uint8 or uint16) and ``channels`` (1, 3 or 4): what encoded images decode to
    (`ingest.decode.codecs.finish`); the ops are checked against it here. ``shared_reads``: a reader
    process's pipeline, whose read stage hands its batches to another process through that many shared
    buffers reused in turn. ``labels_on_host``: labels and the other fields stay on
    the CPU (a full worker's pipeline; see `ingest.engine.workers`). ``lanes``: decode lanes (`DecodeStage`).
    The stages are set up here and changed only through the methods below (`start_epoch`, `deliver`,
    `start_outputs`, `end_outputs`, `handed_over`)."""

    def __init__(self, source: Source, *, ops: Sequence = (), device: str | torch.device = "cpu",
                 decode: str | None = None, io: str | None = None, num_threads: int | None = None,
                 shared_reads: int = 0, labels_on_host: bool = False, lanes: int | str | None = None,
                 decode_dtype: Any = "uint8", channels: int = 3):
        self.source = source
        self.ops = as_ops(ops)   # torchvision transforms wrapped; anything else not an op is a ConfigError
        self.device, self.decode_kind = resolve_device(device, decode)
        self.fields = fields_of(source)
        self.image_kind, self.extra_fields = split_fields(source)
        self.direct = reads_direct(source)
        # A batch op (MixUp, CutMix) ends the ops: the read and decode stages plan the others, the ops stage runs it
        # (and, as boxes, masks refuse ops that move pixels without a map)
        masks = [k for k, f in self.extra_fields.items() if f.kind == "mask"]
        boxes = ("boxes" in self.extra_fields or bool(masks)) and self.image_kind is not None
        self.plan_ops, mixer = split_batch_op(self.ops, boxes=boxes, labels="label" in self.fields)
        self.decode_dtype, self.channels = output_options(decode_dtype, channels)
        if (self.decode_dtype, self.channels) != ("uint8", 3) and self.image_kind != "image":
            raise ConfigError(f"`decode_dtype` and `channels` choose what encoded images decode to; this source "
                              f"has {self.image_kind or 'no'} images (raw pixels are given as stored)")
        self.decode_stage = DecodeStage(self.plan_ops, self.device, self.decode_kind, self.image_kind, self.direct,
                                        num_threads=num_threads, lanes=lanes, masks=masks,
                                        decode_dtype=self.decode_dtype, channels=self.channels)
        if self.image_kind == "image":   # every op takes what the one before it gives, from the decoded pixels on
            check_ops(self.plan_ops, decoded_pixels(self.decode_stage.cpu))
        spare: list = []   # direct-read batch tensors, handed back by the ops stage to the read stage
        self.ops_stage = OpsStage(source, self.ops, self.device, cpu=self.decode_stage.cpu,
                                  lanes=self.decode_stage.lanes, spare=spare, labels_on_host=labels_on_host,
                                  mixer=mixer)
        self.read_stage = ReadStage(source, self.plan_ops, self.device,
                                    reader=ByteReader(io, pin=self.decode_kind == "mixed", shared=shared_reads),
                                    cpu=self.decode_stage.cpu, spare=spare,
                                    decode_stream=self.decode_stage.lanes[0][1],
                                    ops_stream=self.ops_stage.ops_stream,
                                    count_paths=self.decode_stage.count_paths)
        self.stages = (self.read_stage, self.decode_stage, self.ops_stage)   # in `STAGES` order

    # -- the stages' work ---------------------------------------------------------------------
    def read(self, plan: BatchPlan) -> _Work:
        """Read and parse a batch's samples; unreadable ones are dropped through the failure budget."""
        return self.read_stage.run(plan)

    def read_shared(self, plan: BatchPlan) -> _Work:
        """`read` for a batch handed to another process (`ReadStage.read_shared`)."""
        return self.read_stage.read_shared(plan)

    def decode(self, work: _Work, lane: int = 0) -> _Work:
        """Decode the batch on decode lane ``lane`` (`DecodeStage.run`)."""
        return self.decode_stage.run(work, lane)

    def transform(self, work: _Work) -> Batch | None:
        """The ops, the other fields and the targets (`OpsStage.run`); None if every sample failed."""
        return self.ops_stage.run(work)

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
        for stage in self.stages:
            stage.close()

    # -- what others change -------------------------------------------------------------------
    def start_epoch(self, failures: Failures) -> None:
        """Batches read from now on count against ``failures`` (`ReadStage.start_epoch`)."""
        self.read_stage.start_epoch(failures)

    def deliver(self, consumer_stream: torch.cuda.Stream | None, *, with_fields: bool) -> None:
        """Where the next batches go (`OpsStage.deliver`); without the fields, masks are not decoded."""
        self.ops_stage.deliver(consumer_stream, with_fields=with_fields)
        self.decode_stage.want_masks(with_fields)

    def start_outputs(self, ahead: int | None, stop: threading.Event | None = None) -> None:
        """A run of output batches starts (`Outputs.start_outputs`)."""
        self.ops_stage.outputs.start_outputs(ahead, stop)

    def end_outputs(self, stop: threading.Event) -> None:
        """The run ``stop``'s executor started ends (`Outputs.end_outputs`)."""
        self.ops_stage.outputs.end_outputs(stop)

    def handed_over(self, stream: torch.cuda.Stream) -> None:
        """The consumer took the next batch on ``stream`` (`Outputs.handed_over`)."""
        self.ops_stage.outputs.handed_over(stream)

    # -- what others read ---------------------------------------------------------------------
    @property
    def stage_stats(self) -> list[StageStats]:
        """Each stage's counts, in `STAGES` order (over every epoch)."""
        return [stage.stats for stage in self.stages]

    @property
    def failures(self) -> Failures:
        """The failure budget of the epoch being read."""
        return self.read_stage.failures

    @property
    def reader(self) -> ByteReader:
        return self.read_stage.reader

    @property
    def read_path(self) -> str:
        return self.read_stage.read_path

    @property
    def lanes(self) -> list[tuple[Any, torch.cuda.Stream | None]]:
        return self.decode_stage.lanes

    @property
    def decode_paths(self) -> dict[str, int]:
        return self.decode_stage.decode_paths

    @property
    def gpu_fallbacks(self) -> dict[str, int]:
        return self.decode_stage.gpu_fallbacks

    @property
    def ops_stream(self) -> torch.cuda.Stream | None:
        return self.ops_stage.ops_stream

    @property
    def consumer_stream(self) -> torch.cuda.Stream | None:
        return self.ops_stage.consumer_stream

    @property
    def with_fields(self) -> bool:
        return self.ops_stage.with_fields

    @property
    def outputs_ahead(self) -> int | None:
        return self.ops_stage.outputs.outputs_ahead

    @property
    def outputs_made(self) -> int:
        return self.ops_stage.outputs.outputs_made
