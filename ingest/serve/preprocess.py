"""One dynamic batch of encoded images through the ops, each image's outcome its own.

`Preprocessor.run(items)` runs a server's batch through the in-process loader's pipeline (what
``Loader(list_of_bytes)`` runs): decode and ops on its device, in one batch. A bad item (empty, not an image, an
image above ``max_pixels``, damaged data) is refused alone: its outcome is an `ItemError` naming why, while the
other items' images come out as the loader gives them. The optional user model runs once over the batch's
good images.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .. import defaults
from ..engine import Failures, Pipeline
from ..errors import ConfigError
from ..formats.memory import MemorySource
from ..ops import loads
from ..sampler import BatchPlan


class ItemError(ValueError):
    """Why one item of a batch was refused (the message a client gets for its request)."""


@dataclass(frozen=True)
class Outcome:
    """One item's result: ``image`` (its output, on the preprocessor's device; for a user model the model's
    row for it as ``output``) or ``error``."""

    image: torch.Tensor | None = None
    output: torch.Tensor | None = None
    error: ItemError | None = None


def load_model(ref: str | None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``"module:callable"`` imported (None for None): a function of the preprocessed batch ``[N, ...]`` on
    the device, returning ``[N, ...]``. A ConfigError when it cannot be imported or is not callable."""
    if ref is None:
        return None
    module, sep, name = ref.partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"`--model` must be MODULE:CALLABLE, got {ref!r}")
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"cannot import the model {ref!r}: {err}") from err
    if not callable(obj):
        raise ConfigError(f"the model {ref!r} is a {type(obj).__name__}, not a callable")
    return obj


class _Batch(MemorySource):
    """The items of the batch being run: one source the pipeline keeps, its items replaced per batch."""

    def __init__(self):
        super().__init__([])

    def hold(self, items: list[Any]) -> None:
        self._items = items
        self._labels = np.full(len(items), -1, dtype=np.int64)


class Preprocessor:
    """The ops of a spec (`ingest.ops.loads` text, or a list of ops) run over batches of encoded images on
    ``device``, then ``model`` (a callable, or a ``"module:callable"`` reference) over the results.

    Notes
    -----
    One `ingest.engine.Pipeline` (the loader's stages: its decoders, checks and ops) is made once and runs each
    batch on the calling thread, with a failure budget of every item: a refused item only drops out of the batch,
    and its reason comes from the budget's records. Outputs equal ``Loader(items, batch_size=len(items))``'s. On
    CUDA the returned tensors are ready on the current stream (the pipeline makes it wait on the batch); each
    stays valid while it is referenced. Not for several threads at once (a Triton instance calls it serially).
    The batch's torch CPU ops run on the ``ops_threads`` setting's intra-op threads, as the loader's ops stage
    does (torch's default, every core, spins OpenMP threads beside the decode pool and a server's transport);
    the calling thread's own count is put back after each batch.
    """

    def __init__(self, spec: str | Sequence[Any], *, device: str | torch.device = "cpu",
                 model: str | Callable | None = None, num_threads: int | None = None):
        self.ops = loads(spec) if isinstance(spec, (str, bytes)) else list(spec)
        self.model = load_model(model) if isinstance(model, str) or model is None else model
        self._source = _Batch()
        self._pipeline = Pipeline(self._source, ops=self.ops, device=device, num_threads=num_threads)
        self.device = self._pipeline.device
        self._batches = 0

    def run(self, items: Sequence[Any]) -> list[Outcome]:
        """The outcome of each of ``items`` (encoded images: bytes or 1-D uint8 arrays), in order."""
        outcomes: list[Outcome | None] = [None] * len(items)
        good = []
        for k, item in enumerate(items):
            if len(item) == 0:
                outcomes[k] = Outcome(error=ItemError("the encoded image is empty (0 bytes)"))
            else:
                good.append(k)
        if good:
            images, errors = self._images([items[k] for k in good])
            for k, image, error in zip(good, images, errors):
                outcomes[k] = Outcome(image=image, error=error)
            self._apply_model(outcomes)
        return outcomes   # type: ignore[return-value]

    def close(self) -> None:
        """Release the pipeline's decoders and threads."""
        self._pipeline.close()

    def _images(self, items: list[Any]) -> tuple[list[torch.Tensor | None], list[ItemError | None]]:
        n = len(items)
        images: list[torch.Tensor | None] = [None] * n
        errors: list[ItemError | None] = [None] * n
        self._source.hold(items)
        failures = Failures(n, n)
        self._pipeline.start_epoch(failures)
        cuda = self.device.type == "cuda"
        self._pipeline.deliver(torch.cuda.current_stream(self.device) if cuda else None, with_fields=False)
        plan = BatchPlan(epoch=0, number=self._batches, indices=np.arange(n, dtype=np.int64),
                         is_pad=np.zeros(n, dtype=bool), seed=np.random.SeedSequence(0))
        self._batches += 1
        caller_threads = torch.get_num_threads()
        torch.set_num_threads(defaults.ops_threads())
        try:
            batch = self._pipeline.run(plan)
        finally:
            torch.set_num_threads(caller_threads)
            self._source.hold([])   # the request buffers are not kept past the batch
        names = {self._source.name(k): k for k in range(n)}
        for name, stage, reason in failures.items:
            errors[names[name]] = ItemError(f"{stage} failed: {reason.replace(name + ': ', '')}")
        if batch is not None:
            for row, k in enumerate(batch.indices.tolist()):
                images[k] = batch.images[row]
        for k, image in enumerate(images):
            if image is None and errors[k] is None:   # not expected: a dropped item without a record
                errors[k] = ItemError("the image produced no output")
        return images, errors

    def _apply_model(self, outcomes: list[Outcome | None]) -> None:
        if self.model is None:
            return
        rows = [k for k, o in enumerate(outcomes) if o is not None and o.error is None]
        if not rows:
            return
        with torch.inference_mode():
            out = self.model(torch.stack([outcomes[k].image for k in rows]))
        if not isinstance(out, torch.Tensor) or out.dim() < 1 or out.shape[0] != len(rows):
            raise ValueError(f"the model must return a tensor with one row per image ({len(rows)}), got "
                             f"{getattr(out, 'shape', type(out).__name__)}")
        for row, k in enumerate(rows):
            outcomes[k] = Outcome(image=outcomes[k].image, output=out[row])


def as_items(array: np.ndarray) -> list[np.ndarray]:
    """A request's ``ENCODED`` tensor as its items: ``[L]`` is one encoded image, ``[B, L]`` B of them."""
    if array.ndim == 1:
        return [array]
    if array.ndim != 2:
        raise ItemError(f"ENCODED must be [L] or [B, L] uint8, got shape {list(array.shape)}")
    return list(array)
