"""The decode stage: a batch's encoded images to pixels, on one of the decode lanes."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Sequence

import numpy as np
import torch

from .. import defaults
from .._driver import recorded
from ..decode.arena import ImageArena
from ..decode.cpu import CpuDecoder
from ..decode.masks import MaskDecoder
from ..errors import DecodeError
from ..ops import planner
from .base import Stage
from .batch import _Work


class DecodeStage(Stage):
    """Stage 2: a batch's encoded images to pixels, on one of the decode lanes.

    Takes: the read stage's `_Work`, and the lane to decode it on (``run(work, lane)``; the executor runs one
        thread per lane, lanes at once).
    Returns: the same `_Work` with ``images`` decoded (nvImageCodec on the lane's stream, regions only where
        the plan crops, or the CPU pool, uploaded when the device is CUDA) and ``ready`` (an event after
        them); decoded pixels pass through (uploaded); for direct reads it draws the ops' parameters instead.
        Images that fail become blank stand-ins, counted against the batch's budget (``work.failures``).
    Owns: the decode lanes (``lanes``: a GPU decoder, or None for the CPU pool, and a CUDA stream each), the
        CPU decoder (``cpu``: the read stage probes headers with it, the ops stage decodes image fields with
        it) and the images counted per decode path (`decode_paths`, `gpu_fallbacks`).
    Stops: `close` closes the decoders. The ops stage orders the frees of decoded memory after its own work,
        on the lane's stream."""

    name = "decode"

    def __init__(self, ops: Sequence, device: torch.device, decode: str, image_kind: str | None, direct: bool, *,
                 num_threads: int | None = None, lanes: int | str | None = None, masks: Sequence[str] = (),
                 decode_dtype: Any = "uint8", channels: int = 3):
        super().__init__()
        self.ops, self.device, self.image_kind, self.direct = list(ops), device, image_kind, direct
        # What every decode gives (`ingest.decode.codecs.finish`): uint8 RGB, or uint16 / 1 or 4 channels asked
        # for (then no lane has a GPU decoder: see below)
        self.cpu = CpuDecoder(threads=num_threads, dtype=decode_dtype, channels=channels)
        # The mask fields, decoded on the CPU beside the images (Pillow: palette indices, gray levels)
        self.mask_fields = list(masks)
        self.masks = MaskDecoder(threads=num_threads) if self.mask_fields else None
        self._masks_wanted = True   # (`want_masks`)
        # Decode lanes: each a GPU decoder (mixed; None: the CPU pool) and a decode stream (CUDA). With several
        # (``lanes``, else the ``decode_batches`` setting; encoded images only) the executor decodes that many
        # batches at once, one thread per lane, so that one batch's Python work overlaps another's decode.
        # GPU decoders write 8-bit RGB: other pixels asked for decode on the CPU pool (and are uploaded)
        gpu = decode == "mixed" and self.image_kind == "image" and not self.direct and self.cpu.rgb8
        lanes = (lanes or defaults.get("decode_batches")) if self.image_kind == "image" and not self.direct else 1
        if lanes == "auto":
            lanes = 2 if gpu else 1
        self.lanes: list[tuple[Any, torch.cuda.Stream | None]] = [(None, None)] * lanes
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):   # the caller's current device is left as it was
                if gpu:   # a decoder only for JPEGs (and the JPEG 2000s and TIFFs nvImageCodec takes)
                    from ..decode.gpu import Arenas, GpuDecoder, cpu_threads_each
                    each, arenas = defaults.get("gpu_decoders"), Arenas(keep=lanes + 1)   # the lanes share them
                    self.lanes = [(GpuDecoder(self.device, self.cpu, threads=each, arenas=arenas,
                                              cpu_threads=cpu_threads_each(each * lanes)),
                                   torch.cuda.Stream(self.device)) for _ in range(lanes)]
                else:
                    self.lanes = [(None, torch.cuda.Stream(self.device)) for _ in range(lanes)]
        self._counts = threading.Lock()
        self._paths: dict[str, int] = {}
        self._tallies: dict[str, list[int]] = {}   # (`tally`)

    def run(self, work: _Work, lane: int = 0) -> _Work:
        """Decode the batch: nvImageCodec on the decode stream (regions only, where the plan crops), or the
        CPU pool (then uploaded when the device is CUDA). ``lane``: which of `lanes` (decoder and stream);
        lanes may run at once, each on its own thread."""
        gpu, stream = self.lanes[lane]
        work.lane = lane
        if self.direct:
            # Nothing to decode: the ops' random draws are made here, while the read stage (the limit on this
            # path) reads the next batch, instead of before each read.
            if len(work.indices):   # in slices on a large batch (`planner.SLICE`)
                work.ops_plan = planner.plan_sliced(self.ops, work.sizes, work.plan.sample_rngs)
            return work
        if self.masks is not None and self._masks_wanted and work.records:   # on the CPU pool, beside the images
            pending = self._start_masks(work)
            try:
                self._decode_images(work, gpu, stream)
            except BaseException:
                for wait in pending.values():   # (nothing left running on the pool)
                    wait()
                raise
            self._finish_masks(work, pending)
            return work
        return self._decode_images(work, gpu, stream)

    def _decode_images(self, work: _Work, gpu, stream) -> _Work:
        if not work.records or self.image_kind is None:
            return work
        datas = [r.image for r in work.records]
        if self.image_kind == "pixels":
            images = [torch.from_numpy(np.ascontiguousarray(d)) for d in datas]
            if self.device.type == "cuda":
                images, work.ready = _upload(images, self.device, stream)
            self.count_paths({"none (pixels)": len(images)})
            work.images = images
            return work
        if gpu is not None:
            warp = work.ops_plan.warp
            rois = warp.regions() if warp is not None else None
            # how far each sample's warp downscales: nvJPEG2000 (the jpeg2k_decoder setting) may decode that much less
            warps = warp.matrix if warp is not None and gpu.jpeg2k_level else None
            with torch.cuda.stream(stream):
                images, origins, scales, paths = gpu.decode_batch_reduced(datas, work.names, rois=rois, warps=warps,
                                                                          stream=stream, headers=work.headers)
                images = self._replace_failures(work, images, rois, origins, gpu=True)
                work.ready = recorded(stream)
            work.origins, work.scales = origins, scales
        else:
            # only the pixels the warp reads: a JPEG 2000 image then has just that area decoded (the same pixels)
            warp = work.ops_plan.warp
            decoded = self.cpu.decode_batch(datas, work.names, regions=warp.regions() if warp is not None else None)
            paths = ["cpu"] * len(decoded)
            decoded = self._replace_failures(work, decoded, None, None, gpu=False)
            images = [torch.from_numpy(im) for im in decoded]
            if self.device.type == "cuda":
                images, work.ready = _upload(images, self.device, stream)
        self.count_paths(Counter(paths))
        work.images = images
        return work

    def want_masks(self, wanted: bool) -> None:
        """Whether the next batches' masks are decoded: not for a consumer that takes no fields."""
        self._masks_wanted = wanted

    def _start_masks(self, work: _Work) -> dict:
        """Every mask field's decode (`ingest.decode.masks`) started on the mask pool."""
        return {name: self.masks.submit([r.fields[name] for r in work.records], work.names)
                for name in self.mask_fields}

    def _finish_masks(self, work: _Work, pending: dict) -> None:
        """The batch's decoded masks, ``[H, W]`` values per field, in ``work.masks``. A mask that cannot be
        decoded, or whose size is not its image's, fails its sample (counted against the budget; a 1x1 stand-in
        holds its place until the ops stage drops the row)."""
        work.masks = {}
        for name, wait in pending.items():
            decoded = wait()
            for k, m in enumerate(decoded):
                if not isinstance(m, BaseException) and work.sizes and m.shape != tuple(work.sizes[k]):
                    m = DecodeError(f"mask {name!r} is {m.shape[1]}x{m.shape[0]}, its image "
                                    f"{work.sizes[k][1]}x{work.sizes[k][0]}: a mask must have its image's size",
                                    path=work.names[k])
                if isinstance(m, BaseException):
                    if k not in work.failed:
                        work.failures.add(work.names[k], "decode", m)
                        work.failed.append(k)
                    decoded[k] = np.zeros((1, 1), dtype=np.uint8)
            work.masks[name] = decoded

    @property
    def gpu_fallbacks(self) -> dict[str, int]:
        """Why GPU-eligible images went to the CPU decoder, summed over the lanes' GPU decoders
        (`GpuDecoder.fallbacks`: nvImageCodec's processing status, or FAIL / SHAPE_MISMATCH)."""
        total: Counter[str] = Counter()
        for gpu, _ in self.lanes:
            if gpu is not None:
                total.update(gpu.fallbacks)
        return dict(total)

    def count_paths(self, counts: dict[str, int]) -> None:
        """Add images per decode path to `decode_paths` (lanes count at once)."""
        with self._counts:
            for path, n in counts.items():
                self._paths[path] = self._paths.get(path, 0) + n

    def tally(self, path: str) -> list[int]:
        """A running count of the images decoded by ``path``, ``[n]``, that one thread adds to in place, with no
        lock or dict per batch (the native engine's batches); `decode_paths` adds it in where it is above 0."""
        with self._counts:
            return self._tallies.setdefault(path, [0])

    @property
    def decode_paths(self) -> dict[str, int]:
        """Images per decode path: those counted (`count_paths`) and the tallies (`tally`)."""
        with self._counts:
            paths = dict(self._paths)
            for path, (n,) in self._tallies.items():
                if n:
                    paths[path] = paths.get(path, 0) + n
        return paths

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
            if k not in work.failed:   # (its mask may have failed first)
                work.failures.add(work.names[k], "decode", im)
                work.failed.append(k)
            h, w = work.sizes[k] if rois is not None else work.ops_plan.out_sizes[k]
            if rois is not None and rois[k] is not None:
                x0, y0, x1, y1 = (int(v) for v in rois[k])
                h, w = y1 - y0, x1 - x0
                origins[k] = (x0, y0)
            c, dtype = self.cpu.channels, np.dtype(self.cpu.dtype)   # the decoder's output, blank
            if gpu:
                out[k] = torch.zeros((h, w, c), dtype=torch.uint16 if dtype == np.uint16 else torch.uint8,
                                     device=self.device)
            else:
                out[k] = np.zeros((h, w, c), dtype=dtype)
        return out

    def close(self) -> None:
        self.cpu.close()
        if self.masks is not None:
            self.masks.close()
        for gpu, _ in self.lanes:
            if gpu is not None:
                gpu.close()


def _upload(images: list[torch.Tensor], device: torch.device, stream: torch.cuda.Stream):
    """Copy a ragged batch of host images (uint8, or uint16: moved as their bytes) to the GPU in one transfer
    through one pinned buffer."""
    sizes = [im.numel() * im.element_size() for im in images]
    host = torch.empty(sum(sizes), dtype=torch.uint8, pin_memory=True)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    for im, a, b in zip(images, offsets, offsets[1:]):
        host[a:b].copy_(im.reshape(-1).view(torch.uint8))
    with torch.cuda.stream(stream):
        dev = host.to(device, non_blocking=True)
        ready = recorded(stream)
    out = [dev[a:b].view(im.dtype).view(im.shape) for im, a, b in zip(images, offsets, offsets[1:])]
    return out, ready
