"""The executor: a batch's way from the sampler's indices to the consumer, one small module per stage.

::

    base       the stage contract (`Stage`: takes, returns, owns, stops, counts) and `StageStats`
    batch      what travels: `_Work` (a batch between stages), `Batch` (to the consumer), `Failures`
    read       ReadStage: bytes read and parsed, sizes probed, every op's parameters drawn
    decode     DecodeStage: encoded images to pixels on a decode lane (GPU decoder or CPU pool)
    ops        OpsStage: the ops, the other fields collated, detection targets moved with the images
    outputs    the ops stage's output batches: in-flight bound and reuse
    boxes      detection boxes: the source's box format and the per-box fields
    pipeline   Pipeline: the three stages of one loader, made together; eager runs
    executor   Executor: the stages on threads, joined by bounded queues (`_Slots`, `_Turns`)
    lifecycle  CLOSE_AT_EXIT: executors and worker pools closed by an exit hook, before finalization
    workers    WorkerPool: the pipeline (or its read stage) in worker processes

The layer order of the package (`tests/test_layers.py`): errors/defaults < io < formats < decode < ops <
engine < torch < tools; this package imports nothing from `ingest.torch` or `ingest.tools`.
"""

from .base import Stage, StageStats
from .batch import Batch, Failures
from .executor import EpochEnd, Executor
from .lifecycle import CLOSE_AT_EXIT
from .pipeline import STAGES, Pipeline, resolve_device

__all__ = ["Batch", "CLOSE_AT_EXIT", "EpochEnd", "Executor", "Failures", "Pipeline", "STAGES", "Stage",
           "StageStats", "resolve_device"]
