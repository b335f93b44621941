"""The ops stage's output batches: how many are in flight, and dense outputs reused rather than allocated."""

from __future__ import annotations

import queue
import threading
import weakref
from collections import deque
from typing import Any

import torch

from .._driver import recorded, wait_for
from ..decode.arena import ImageArena
from ..ops.base import same_size
from .batch import _Work


class Outputs:
    """The ops stage's output batches (owned by `OpsStage`): a run of them starts with each executor
    (`start_outputs`, ended by `end_outputs`), the consumer reports each hand-over (`handed_over`), and
    the ops stage asks for the tensor a batch is written to (`dense_output`, else `bound_outputs`), counts it
    (`count_output`) and has it watched once handed out (`watch`)."""

    def __init__(self, device: torch.device, image_kind: str | None, ops_stream: torch.cuda.Stream | None):
        self.device, self.image_kind, self.ops_stream = device, image_kind, ops_stream
        # Output batches in flight (`bound_outputs`): an event on the consumer's stream per batch handed over
        # (`handed_over`), the count handed over and made, and how many outputs may be ahead of the one whose
        # hand-over the GPU has passed (None: no bound).
        self.start_outputs(None)

    def start_outputs(self, ahead: int | None, stop: threading.Event | None = None) -> None:
        """A new run of batches (an executor starting): counts restart; ``ahead`` as in `bound_outputs`, and
        the number of dense outputs kept for reuse (`dense_output`); ``stop``: the executor's, which ends a
        wait for one."""
        self._handed = deque(maxlen=64)
        self._handed_count = self._outputs = 0
        self.outputs_ahead = ahead
        self._kept: list[torch.Tensor] = []   # dense outputs made, oldest first (`dense_output`)
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
        steps ahead of the GPU), unbounded allocation would leave one more float32 output batch (147 MiB at
        256 x 224 x 224) in the cache for good. Bounded, the blocks in flight are the prefetched batches, the one the user holds
        and the one before it. Rarely waits: only while the GPU is that far behind. (Dense outputs are reused
        instead: `dense_output`.)"""
        k = self._outputs - self.outputs_ahead if self.outputs_ahead is not None else -1
        if k < 0:
            return
        i = k - (self._handed_count - len(self._handed))   # the deque holds the latest hand-overs
        if 0 <= i < len(self._handed):   # not handed over yet (cannot happen with a reserved place): no wait
            wait_for(self._handed[i])

    def dense_output(self, work: _Work) -> torch.Tensor | None:
        """The tensor the ops write a batch of one output size to (None: a ragged batch, or no executor bound;
        `bound_outputs` then): one of the `outputs_ahead` made before that nothing but this list holds any more
        (no tensor or view of the user's: the storage's use count), its reuse queued on the ops stream after
        the consumer's use of its last batch (`watch`); else, while all of them are held, a wait for one to be
        dropped (a weak reference to each handed out wakes it) or for the consumer to have taken every batch
        made (it then waits for this one: a new one is made rather than stall it).

        Why: a loop's variable still holds the batch before while ``next()`` hands over the next one, so with
        the ops stage free to allocate as soon as the queue has room, four float32 outputs would be in memory:
        the one held, the one handed over, two queued (588 MB at batch 256), one more than a loop ever uses.
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

    def watch(self, images: torch.Tensor, out: torch.Tensor) -> None:
        """Once ``images`` (what the user gets, over the kept ``out``) is dropped: events on the consumer's
        streams then, after every use of the batch queued there (the reuse of ``out`` waits for those, not for
        the steps the loop queued since: recorded at the reuse instead, they held the next batch's ops behind
        the step before it), and a wake for a `dense_output` waiting for a drop. Where a view of the user's
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

    def count_output(self) -> None:
        """One more output made in this run (what `bound_outputs` counts)."""
        self._outputs += 1

    def end_outputs(self, stop: threading.Event) -> None:
        """End the run that ``stop``'s executor started, unless another has started since: the outputs kept for
        reuse go (those the user holds stay theirs)."""
        if self._stop_outputs is stop:
            self.start_outputs(None)


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
