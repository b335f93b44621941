"""Mixed decoding: JPEG, JPEG 2000 and TIFF decoded on the GPU by nvImageCodec, the rest on the CPU and uploaded.

One :meth:`GpuDecoder.decode_batch` call decodes every GPU-eligible image of the batch in one nvImageCodec call
on the caller's CUDA stream, optionally only the region each sample needs (region-of-interest decode, see
``ingest.ops.base.Warp.roi``). What the GPU does not take, or refuses, is decoded by the
:class:`~ingest.decode.cpu.CpuDecoder` inside the same batch and uploaded on the same stream, so the
pixels a sample gets do not depend on which path took it (up to the IDCT/upsampling differences of the
decoders, a few levels).

Two engines drive nvImageCodec:

- **native** (the default where it loads): nvImageCodec's C API through ctypes (:mod:`ingest.decode._nvimgcodec`).
  Python plans the batch (sizes from the headers, one output arena, regions); the per-image native calls and
  the per-image tensors (plain indexing of the arena) keep the GIL, and only the batch decode gives it up. So a
  batch costs a handful of GIL hand-offs whatever its size, each a switch interval beside a busy Python thread
  (a training loop in the same process), instead of several per image.
- **python**: nvImageCodec's Python binding, used when the native one cannot load (an nvImageCodec version whose
  C structs are not mirrored, said in a warning). It gives the GIL up several times per image, so beside a
  busy Python thread it slows down by orders of magnitude: run it in worker processes.

Decisions, and why:

- **GPU-eligible** = an 8-bit sequential Huffman JPEG (baseline or extended) with 1 or 3 components whose
  data ends with the EOI marker. RGB-coded JPEGs (Adobe transform 0: nvJPEG under nvImageCodec 0.9
  decodes them as YCbCr), CMYK, 12-bit, lossless, arithmetic-coded and non-JPEG data go straight to
  the CPU decoder, which defines what they become (CMYK conversion, 16-bit >> 8, dropped alpha). A missing
  EOI means a truncated file: nvJPEG may fill the missing rows with grey where the CPU decoder raises, so
  those go to the CPU too and fail there.
- **JPEG 2000** (nvJPEG2000) is GPU-eligible with 1 or 3 unsigned 8-bit components at full resolution (no
  subsampled component), complete (the codestream ends with EOC), no palette and, in a JP2 file, an sRGB or
  greyscale colour space with no ICC profile and no channel definition that reorders or marks an opacity
  (sYCC, ICC and the others are OpenJPEG's to apply), and decodes regions like JPEG (nvJPEG2000 decodes only the tiles and code blocks a
  region touches). A JPEG 2000 image whose crop the ops downscale enough for a reduced resolution (by default
  3 levels, the ``jpeg2k_decoder`` setting) goes first to nvJPEG2000 called directly (`ingest.decode.nvjpeg2k`:
  the tiles the region touches, at that resolution; `decode_batch_reduced`), and what it declines goes this
  way. **TIFF** (nvTIFF) is
  GPU-eligible when gray or RGB, 8-bit unsigned, chunky, uncompressed or LZW/Deflate-compressed with no
  predictor or the horizontal one, every strip or tile within the file; it is decoded whole (strips hold whole
  rows, and a region would save little), the ops crop it. Their headers are read by `ingest.decode.codecs` (a few
  bytes, no decode), which also says how the CPU decoder reads the others: 16-bit, float, YCbCr, palette,
  WebP/ZSTD/JPEG-compressed TIFFs and every other JPEG 2000. Both are nvImageCodec GPU_ONLY decoders, so the
  "auto" backend adds that kind after the JPEG ones.
- **JPEG 2000 beside the GPU**: a share of each batch's GPU-eligible JPEG 2000 images (the ``host_jpeg2k_share``
  setting; "auto" by default, `ingest.decode.share`) is decoded by the CPU decoder on its threads while nvJPEG2000
  decodes the others, since nvJPEG2000 alone leaves most cores idle for a long batch. They are counted as
  "cpu-share". TIFFs are not shared: nvTIFF is fast enough that the CPU's images only slowed its batches.
- A decoder whose CPU decoder returns something other than uint8 RGB (``dtype`` uint16, ``channels`` 1 or 4)
  sends every image to it: the GPU path writes 8-bit RGB only.
- **Orientation** is applied by us (nvImageCodec's ``apply_exif_orientation`` is off), from the same header
  parse as the CPU path, so both agree on EXIF and XMP orientation. A region is decoded only for
  orientation 1; an oriented image is decoded whole and reported at origin (0, 0).
- **Sizes** (:meth:`GpuDecoder.probe`) come from the CPU decoder's header parse: a few segments read in
  Python, cheaper than building an nvImageCodec CodeStream, and the same answer as the CPU path gives.
- **Memory** (native): the batch's images live in one PyTorch-allocated buffer, allocated on one stream of
  the decoder's `Arenas` (each image 256-byte aligned), so PyTorch's caching allocator reuses it and no
  per-image allocation happens. Its size stays the same from batch to batch (`Arenas.size_for`), so that the
  allocator reuses its blocks instead of caching one more whenever a batch needs a little more than the last. A caller
  done with a batch hands its arena back (:meth:`GpuDecoder.recycle`; the loader's ops stage does once the
  ops wrote their output elsewhere), and the next batch decodes into it without a torch call; decoders
  given one :class:`Arenas` (a pipeline's decode lanes) take each other's. When
  every image was decoded there and none needs turning, the batch is returned as that buffer plus offsets and
  sizes (:class:`~ingest.decode.arena.ImageArena`): the warp reads it without a tensor per image, whose creation
  cost a few microseconds each alone and gave up the GIL (a switch interval beside a busy thread) per call.
  (python) images of orientation 1 are zero-copy views of nvImageCodec's buffers, which it frees with
  ``cudaFreeAsync`` on the stream it decoded on, ignoring other streams. Either way a caller that reads the
  images on another stream makes the decode stream wait on an event recorded after that work and calls
  :meth:`GpuDecoder.hold_until` with it before dropping them: the memory is then reused or freed only after
  the reads.
- **Why an image fell back** is counted in :attr:`GpuDecoder.fallbacks` (nvImageCodec's processing status:
  ``IMAGE_CORRUPTED``, ``CODEC_UNSUPPORTED``...). nvImageCodec's own console lines are suppressed (its logger is
  off; what its extensions print at start is kept in :attr:`GpuDecoder.messages`).

nvImageCodec is loaded lazily; without it :class:`GpuDecoder` raises ImportError naming the extra to install.
"""

from __future__ import annotations

import functools
import io
import os
import threading
import time
import warnings
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ingest import defaults
from ingest.decode import _nvjpeg as nvjpeg
from ingest._driver import bind_thread, wait_for
from ingest._numpy import zeros
from ingest._threads import Threads
from ingest.errors import ConfigError, DecodeError
from ingest.decode import _nvimgcodec as native
from ingest.decode.arena import ImageArena, arena_under
from ingest.decode import codecs, nvjpeg2k
from ingest.decode.codecs import Roi, clip_roi
from ingest.decode.cpu import Buffer, CpuDecoder, JpegHeader, Size, as_buffer, jpeg_headers
from ingest.decode.share import HostShare, pick

#: Backend choices: "auto" (the ``hw_decoder_load`` setting: the hardware JPEG engine takes that share of a batch and
#: the CUDA decoder the rest, nvJPEG2000 and nvTIFF their formats; or, set to "auto", every backend nvImageCodec
#: has, picked per image), the engine only, CPU+GPU only (these two leave JPEG 2000 and TIFF to the CPU decoder).
BACKENDS = {"auto": None, "hw": "HW_GPU_ONLY", "hybrid": "HYBRID_CPU_GPU"}
#: How nvImageCodec is driven (see the module doc): the native one where it loads, else the Python binding.
ENGINES = ("auto", "native", "python")
#: Start of each image in the native engine's arena, in bytes: 256-byte aligned and a whole number of pixels.
_ALIGN = 768
#: Granularity of the arena size (`Arenas.size_for`): PyTorch rounds large allocations to 2 MiB.
_ARENA_STEP = 2 << 20

KIND_JPEG2K, KIND_TIFF = codecs.KIND_JPEG2K, codecs.KIND_TIFF

#: Huffman baseline and extended. Progressive JPEGs go to the CPU: the hardware decoder refuses them, and
#: nvImageCodec 0.9's CUDA decoder got a valid 12-scan one (jpeg-decoder/subtract-with-overflow.jpg) wrong.
_GPU_PROCESSES = (0xC0, 0xC1)


def decoder_options() -> str:
    """nvImageCodec's options for a decoder: chroma upsampling as libjpeg does it by default (nvImageCodec's
    default is 0), so GPU and CPU agree; the ``hybrid_huffman_threshold`` setting: the CUDA decoder's images
    of more pixels decode their Huffman stage on the GPU (nvJPEG's GPU_HYBRID backend), the others on its CPU
    threads (either way the pixels are the same); and the ``nvjpeg_host_padding`` / ``nvjpeg_device_padding``
    settings (DALI's ``host_memory_padding`` / ``device_memory_padding``, left out where 0): bytes added to each
    buffer nvJPEG allocates, so that its threads' buffers stop growing after their first images instead of
    freeing and regrowing them (each free waits for the whole GPU) through the first epochs. The
    ``jpeg2k_device_padding`` setting does the same for nvJPEG2000's device buffers alone (its decoder's own
    option, after the global ones: the last one it reads wins)."""
    threshold = defaults.get("hybrid_huffman_threshold")
    options = [":fancy_upsampling=1", f"nvjpeg_cuda_decoder:hybrid_huffman_threshold={threshold}"]
    for name, option in (("nvjpeg_host_padding", ":host_memory_padding"),
                         ("nvjpeg_device_padding", ":device_memory_padding"),
                         ("jpeg2k_device_padding", "nvjpeg2k_cuda_decoder:device_memory_padding")):
        if defaults.get(name):
            options.append(f"{option}={defaults.get(name)}")
    return " ".join(options)


# Displayed from stored pixels [H, W, C] per EXIF orientation: the CPU decoder's table, in torch.
_ORIENT = {
    2: lambda t: t.flip(1),
    3: lambda t: t.flip(0, 1),
    4: lambda t: t.flip(0),
    5: lambda t: t.permute(1, 0, 2),
    6: lambda t: t.permute(1, 0, 2).flip(1),
    7: lambda t: t.permute(1, 0, 2).flip(0, 1),
    8: lambda t: t.permute(1, 0, 2).flip(0),
}


def cpu_threads_each(decoders: int) -> int:
    """nvImageCodec CPU threads for each of ``decoders`` decoders in this process: the ``gpu_decode_threads``
    setting, or ("auto") this process's share of the cores (`defaults.cores`) split between its decoders. Each
    decoder otherwise starts one per core, so the threads of a process would be its decoders times the cores,
    and of a host its ranks times that, beside the training loops' own threads."""
    if defaults.get("gpu_decode_threads") != "auto":
        return defaults.get("gpu_decode_threads")
    return max(1, defaults.cores() // max(1, decoders))


def available() -> bool:
    """Whether GPU decoding can run here: CUDA is available and nvImageCodec loads (either engine)."""
    if not torch.cuda.is_available():
        return False
    try:
        native.load()
    except native.Unavailable:
        try:
            _nvimgcodec()
        except ImportError:
            return False
    return True


@functools.cache
def _nvimgcodec() -> Any:
    """nvImageCodec's Python binding, imported with its console logging off."""
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")  # read by the binding at import
    try:
        with native.captured_stderr():  # its extensions print missing optional libraries (nvjpeg2k, nvtiff)
            from nvidia import nvimgcodec
    except ImportError as err:
        raise ImportError("GPU decoding needs NVIDIA nvImageCodec: pip install ingest[gpu] "
                          f"(could not import nvidia.nvimgcodec: {err})") from err
    return nvimgcodec


@dataclass
class _Job:
    """One GPU-eligible sample: where it goes in the batch, and what to decode."""

    index: int
    data: Buffer
    header: JpegHeader
    roi: Roi | None  # decode only this region (orientation 1 only)

    def expected_shape(self) -> tuple[int, int, int]:
        if self.roi is None:
            return self.header.height, self.header.width, 3
        x0, y0, x1, y1 = self.roi
        return y1 - y0, x1 - x0, 3


class Arenas:
    """The native engine's batch arenas, shared by the decoders of one pipeline (its decode lanes): one size for
    all (`size_for`), and the arenas handed back (`give`), each with the event after its last read, taken by
    whichever decoder starts a batch next (`take`). Shared, a pipeline of two lanes needs three arenas (each
    lane's batch being decoded and the one the ops stage reads), where each lane keeping its own would hold
    four (see docs/measurements.md, Device memory).

    Every arena is allocated on one stream of the pool's (PyTorch's caching allocator reuses a freed block only
    for allocations on the stream it was allocated on): an arena dropped by one lane, its memory back in the
    cache, then serves the next arena whichever lane takes it, instead of the other lane's stream allocating
    more. :attr:`made` counts the arenas allocated."""

    def __init__(self, keep: int = 2):
        self.size = 0
        self.made = 0
        self._keep = keep
        self._spare: list[tuple[torch.Tensor, Any]] = []   # (arena, the event after its last read or None)
        self._lock = threading.Lock()
        self._streams: dict[torch.device, torch.cuda.Stream] = {}   # per device: where arenas are allocated
        self._takers: set[torch.cuda.Stream] = set()   # the streams decodes into arenas were queued on

    def size_for(self, need: int) -> int:
        """The size to allocate for a batch that needs ``need`` bytes: the same for every batch (a quarter
        above the first one's need, in 2 MiB steps) until one needs more. Each batch's need differs, and
        PyTorch's caching allocator keeps a new segment whenever no cached block is large enough, so a size per
        batch would pile up segments. A smaller batch (an epoch's last) decodes into the start of one, rather
        than shrinking for it and growing back (which would drop every arena twice per epoch). A new size drops
        the spares. (See docs/measurements.md, Device memory.)"""
        with self._lock:
            if need <= self.size:
                return self.size
            self.size = -(-(need + need // 4) // _ARENA_STEP) * _ARENA_STEP
            dropped, self._spare = self._spare, []
        for entry in dropped:
            _release(entry)
        return self.size

    def take(self, size: int, stream: torch.cuda.Stream, device: torch.device) -> torch.Tensor:
        """An arena of ``size`` bytes that a decode on ``stream`` may write now: a spare once the host has seen
        the event after its last read, else a new one, allocated on the pool's stream and complete (nothing is
        queued there) before it is returned.
        nvImageCodec does not order its writes after the work queued on the stream it is given, so a spare is
        taken only once the host has seen its event, never on stream order alone (a GPU test queues the read
        of a handed-back arena behind a GPU sleep; docs/measurements.md, Device memory)."""
        with self._lock:
            entry = self._spare.pop(0) if self._spare else None   # the oldest: its read is the likeliest done
        if entry is not None:
            arena, after = entry
            if arena.numel() == size:
                wait_for(after)
                return arena
            _release(entry)
        if stream is None:   # CPU tensors standing in (tests)
            arena = torch.empty(size, dtype=torch.uint8, device=device)
        else:
            with self._lock:
                home = self._streams.get(device)
                if home is None:
                    home = self._streams[device] = torch.cuda.Stream(device)
                self._takers.add(stream)
                takers = tuple(self._takers)
            with torch.cuda.stream(home):
                arena = torch.empty(size, dtype=torch.uint8, device=device)
            # The block may be an arena dropped with decodes still queued on a lane's stream (a batch the CPU
            # decoder took whole: no image views it); its reads were waited for on the host (`_release`).
            for taker in takers:
                taker.synchronize()
        with self._lock:
            self.made += 1
        return arena

    def give(self, arena: torch.Tensor, after: Any = None) -> None:
        """Hand ``arena`` back for a later batch. ``after``: a CUDA event recorded after every read of it (None:
        those reads have run)."""
        entry = (arena, after)
        with self._lock:
            if arena.numel() == self.size and len(self._spare) < self._keep:
                self._spare.append(entry)
                return
        _release(entry)


def _release(entry: tuple[torch.Tensor, Any]) -> None:
    """Drop an arena once the event after its last read has run: its memory goes back to the allocator on
    the stream it was allocated on, whose next arena there nvImageCodec may write at once (`Arenas.take`)."""
    wait_for(entry[1])


class GpuDecoder:
    """Decodes batches on ``device`` with nvImageCodec, falling back to ``cpu`` per image.

    ``backend``: one of :data:`BACKENDS`; :attr:`backends` says what the decoders were created with ((kind,
    load hint) pairs, None for all of nvImageCodec's). ``engine``: one of :data:`ENGINES` (see the module
    doc); "auto" takes the native engine and falls back, with a warning saying why, to the Python binding.
    ``threads``: how many nvImageCodec decoders share a batch. Native: the batch is split over them, and with
    the compiled loop each share runs on its own thread with the GIL released; with the ctypes loop each
    share is submitted from the caller's thread before any is awaited. Python binding: each decoder runs on
    its own thread and CUDA stream, but the binding's per-image GIL hand-offs serialize them, so more than
    one does not pay there. ``cpu_threads``: each decoder's nvImageCodec CPU threads (0: one per core); a
    pipeline gives each of its decoders its share of the cores (`cpu_threads_each`) rather than every decoder
    one thread per core. The figures behind these rules: docs/measurements.md, The in-process CUDA loader.

    :attr:`engine` says which engine runs, :attr:`fallbacks` counts why GPU-eligible images went to the CPU
    decoder, :attr:`messages` holds what nvImageCodec printed while loading.
    """

    def __init__(self, device: torch.device | str | int, cpu: CpuDecoder, *, backend: str = "auto",
                 threads: int = 1, engine: str = "auto", cpu_threads: int = 0, arenas: Arenas | None = None,
                 _check_regions: bool = True):
        if backend not in BACKENDS:
            raise ConfigError(f"Unknown backend {backend!r}. Available: {', '.join(BACKENDS)}")
        if engine not in ENGINES:
            raise ConfigError(f"Unknown engine {engine!r}. Available: {', '.join(ENGINES)}")
        if threads < 1:
            raise ConfigError(f"`threads` must be >= 1, got {threads}")
        self.engine, lib = _pick_engine(engine)
        self.device = _cuda_device(device)
        self.cpu = cpu
        self.backend = backend
        self.threads = threads
        self.cpu_threads = cpu_threads
        self.fallbacks: Counter[str] = Counter()
        self.arenas = arenas if arenas is not None else Arenas()   # native engine: batch arenas (see `recycle`)
        self._streams: list[torch.cuda.Stream] = []
        self._pool = None
        if lib is not None:
            self.messages = list(lib.messages)
            self._decoders = [self._new_native_decoder(lib) for _ in range(threads)]
            if threads > 1 and native.LOOP is not None:  # each share decoded on its own thread, GIL released
                self._pool = ThreadPoolExecutor(threads - 1, thread_name_prefix="ingest-gpu",
                                                initializer=bind_thread, initargs=(self.device,))
        else:
            nvimgcodec = _nvimgcodec()
            self.messages = []
            self._params = nvimgcodec.DecodeParams(apply_exif_orientation=False, allow_any_depth=False,
                                                   color_spec=nvimgcodec.ColorSpec.SRGB)
            self._decoders = [self._new_decoder(nvimgcodec) for _ in range(threads)]
            if threads > 1:
                self._streams = [torch.cuda.Stream(self.device) for _ in range(threads)]
                self._pool = ThreadPoolExecutor(threads, thread_name_prefix="ingest-gpu", initializer=bind_thread,
                                                initargs=(self.device,))
        self._warned = False
        share = defaults.get("host_jpeg2k_share")
        #: The CPU decoder's share of each batch's GPU-eligible JPEG 2000 images, decoded beside the GPU
        #: (`ingest.decode.share`); None without imagecodecs, which the CPU decoder needs for them.
        self.host_share = HostShare(share) if share != 0 and codecs.imagecodecs is not None else None
        #: Whether regions are decoded (else whole images, cropped by the ops): see `regions_decode`.
        self.regions = regions_decode(self.device, self.engine) if _check_regions else True
        #: The fewest resolution levels a JPEG 2000 crop must allow to go to nvJPEG2000 called directly (the
        #: ``jpeg2k_decoder`` setting; `decode_batch_reduced`), or 0 where none go.
        self.jpeg2k_level = _jpeg2k_level()
        #: nvJPEG2000 called directly, made at the first image it takes (None before)
        self.jpeg2k: nvjpeg2k.Decoder | None = None
        #: the threads that run nvJPEG2000's host stages (parse, tier-2 inside the tile decode) for a batch's JPEG
        #: 2000 images at once, beside nvImageCodec's call, each with its own decode states and CUDA stream
        self._jpeg2k_threads: Threads | None = None
        self._jpeg2k_local = threading.local()

    # -- public API ----------------------------------------------------------------------------------

    def probe(self, data: Buffer, name: str) -> Size:
        """``(height, width)`` as decoded, orientation applied: the CPU decoder's header parse (see module)."""
        return self.cpu.probe(data, name)

    def decode_batch(self, datas: Sequence[Buffer], names: Sequence[str], *,
                     rois: Sequence[Roi | None] | np.ndarray | None = None,
                     stream: torch.cuda.Stream | None = None, headers: np.ndarray | None = None
                     ) -> tuple[list[torch.Tensor | DecodeError] | ImageArena, list[tuple[int, int]], list[str]]:
        """Decode a batch to ``[H, W, 3]`` uint8 RGB CUDA tensors, ready in order on ``stream``.

        ``rois[i]`` = (x0, y0, x1, y1), the source region sample i needs, or None (or an [n, 4] array, x1 <= x0
        for none). Returns, per sample: the image (or its :class:`DecodeError`; when the native engine decoded
        every image and none needs turning, the images come as one :class:`~ingest.decode.arena.ImageArena`, a
        sequence of the same views), the (x0, y0) of what was decoded in source pixels (a region decode
        returns just the region) and the path that decoded it: "gpu", "gpu-roi", "cpu-share" (a JPEG 2000 the
        GPU could take, decoded on the CPU beside it: `host_share`) or "cpu-fallback".
        ``headers``: the batch's header table from `CpuDecoder.probe_batch`, to skip reading them again.
        A decoder that cannot decode regions here (:attr:`regions`) decodes whole images instead.
        The buffers in ``datas`` must stay unchanged until the call returns.
        """
        images, origins, _, paths = self.decode_batch_reduced(datas, names, rois=rois, stream=stream, headers=headers)
        return images, origins, paths

    def decode_batch_reduced(self, datas: Sequence[Buffer], names: Sequence[str], *,
                             rois: Sequence[Roi | None] | np.ndarray | None = None, warps: np.ndarray | None = None,
                             stream: torch.cuda.Stream | None = None, headers: np.ndarray | None = None
                             ) -> tuple[list[torch.Tensor | DecodeError] | ImageArena, list[tuple[float, float]],
                                        list[float] | None, list[str]]:
        """`decode_batch`, also returning each sample's scale (its pixels per source pixel), or None where every
        image is at full resolution. ``warps``: each sample's output-to-source matrix ((N, 3, 3), the ops' warp),
        or None. A JPEG 2000 image whose warp downscales its crop by 2^:attr:`jpeg2k_level` or more (the fewest
        source pixels per output pixel, `nvjpeg2k.warp_steps`) goes to `ingest.decode.nvjpeg2k` first: only the
        tiles its region touches, at the lowest resolution that keeps the output's size, path "gpu-nvjpeg2k", a
        fractional origin where reduced; the images it declines or fails on (counted in :attr:`fallbacks` as
        "nvjpeg2k: <why>") go on as below.
        """
        if len(datas) != len(names) or (rois is not None and len(rois) != len(datas)):
            raise ValueError(f"got {len(datas)} images, {len(names)} names and "
                             f"{'no' if rois is None else len(rois)} rois")
        n = len(datas)
        stream = stream if stream is not None else torch.cuda.current_stream(self.device)
        table = codec_rows(headers if headers is not None else jpeg_headers(datas), datas)
        given = _region_array(rois, n)
        pending = {}
        if self.jpeg2k_level and self.cpu.rgb8 and warps is not None and (table[:, 0] != 1).any():
            pending = self._start_jpeg2k(datas, names, given, nvjpeg2k.warp_steps(warps), table, stream)
            if pending:   # decoding on nvJPEG2000's threads while nvImageCodec takes the rest
                table = table.copy()
                table[list(pending), 0] = 0
        wanted = given if self.regions else _region_array(None, n)
        index = np.flatnonzero(gpu_decodable(table, self.cpu.max_pixels)) if self.cpu.rgb8 else np.arange(0)
        beside = self._start_beside(index, table, wanted, datas, names) if self.host_share is not None else None
        if beside is not None:
            index = np.setdiff1d(index, beside.index, assume_unique=True)
        every = len(index) == n
        rows = table if every else table[index]               # the header rows of those images
        regions = clip_regions(wanted if every else wanted[index], rows)   # all zeros: the whole image, from (0, 0)
        cropped = regions[:, 2] > regions[:, 0]
        orientation = rows[:, 6]
        with torch.cuda.device(self.device):
            if self.engine == "native" and len(index):
                arena, reasons = self._decode_native(index, datas, rows, regions, stream)
                if len(index) == n and not any(reasons) and (orientation == 1).all():
                    # The common case: one buffer, no tensor per image (see ImageArena).
                    return arena, list(map(tuple, regions[:, :2].tolist())), None, \
                        np.where(cropped, "gpu-roi", "gpu").tolist()
                decoded = [None if why else arena[k] if turn == 1 else orient(arena[k], turn)
                           for k, (why, turn) in enumerate(zip(reasons, orientation.tolist()))]
            else:
                jobs = [_Job(i, datas[i], JpegHeader(*row[1:7].tolist(), bool(row[7])), tuple(r) if crop else None)
                        for i, row, r, crop in zip(index.tolist(), rows, regions.tolist(), cropped.tolist())]
                decoded = self._decode_on_gpu(jobs, stream)
            images: list[torch.Tensor | DecodeError | None] = [None] * n
            origins = [(0, 0)] * n
            paths = ["cpu-fallback"] * n
            for i, image, r, crop in zip(index.tolist(), decoded, regions.tolist(), cropped.tolist()):
                if image is not None:
                    images[i] = image
                    origins[i] = (r[0], r[1])
                    paths[i] = "gpu-roi" if crop else "gpu"
            scales = [1.0] * n
            for i, done in self._finish_jpeg2k(pending).items():
                images[i], origins[i], scales[i], paths[i] = done.image, done.origin, done.scale, "gpu-nvjpeg2k"
            asked = [tuple(r) if r[2] > r[0] else None for r in wanted.tolist()]
            if beside is not None:
                done = self._finish_beside(beside)
                for i, image, origin in zip(beside.index.tolist(),
                                            *self._decode_on_cpu(beside.index.tolist(), datas, names, asked, stream,
                                                                 decoded=done)):
                    images[i], origins[i], paths[i] = image, origin, "cpu-share"
            left = [i for i, image in enumerate(images) if image is None]
            for i, image, origin in zip(left, *self._decode_on_cpu(left, datas, names, asked, stream)):
                images[i], origins[i] = image, origin
            if len(index) > 1 and not self._warned and all(image is None for image in decoded):
                self._refused_all(index, images)
        return images, origins, (scales if any(s != 1.0 for s in scales) else None), paths

    def _start_jpeg2k(self, datas: Sequence[Buffer], names: Sequence[str], wanted: np.ndarray, steps: np.ndarray,
                      table: np.ndarray, stream: torch.cuda.Stream) -> dict[int, Future]:
        """Queue the batch's JPEG 2000 images that :attr:`jpeg2k` takes on its threads, by position: those whose
        header it accepts and whose crop allows :attr:`jpeg2k_level` resolution levels or more (nvImageCodec
        decodes the region's code blocks alone at full resolution, where this path decodes whole tiles). The
        others are left to nvImageCodec, and why counted in :attr:`fallbacks`. Each thread decodes on a CUDA
        stream of its own, which ``stream`` then waits for."""
        pending = {}
        # not a JPEG (maybe a JPEG 2000), and downscaled enough for the level: no Python per image otherwise
        for i in np.flatnonzero((table[:, 0] != 1) & (steps >= 1 << self.jpeg2k_level)).tolist():
            buf = as_buffer(datas[i], names[i])
            if codecs.sniff(buf) != "jpeg2k":
                continue
            step = float(steps[i])
            try:
                why = nvjpeg2k.screen(buf, names[i], step, self.cpu.max_pixels, min_level=self.jpeg2k_level)
            except DecodeError:   # the other decoders decide (the CPU one names the file if it fails too)
                why = "UNREADABLE_HEADER"
            if isinstance(why, str):
                self.fallbacks[f"nvjpeg2k: {why}"] += 1
                continue
            if self.jpeg2k is None and not self._make_jpeg2k():
                break
            x0, y0, x1, y1 = wanted[i].tolist()
            pending[i] = self._jpeg2k_threads.submit(self._one_jpeg2k, buf, names[i],
                                                     (x0, y0, x1, y1) if x1 > x0 else None, step, stream)
        return pending

    def _one_jpeg2k(self, buf: memoryview, name: str, roi: Roi | None, step: float, stream: torch.cuda.Stream
                    ) -> nvjpeg2k.Decoded | DecodeError | None:
        """One image on this thread's own stream, joined to ``stream``; a DecodeError is returned, not raised."""
        local = self._jpeg2k_local
        if not hasattr(local, "stream"):
            local.stream = torch.cuda.Stream(self.device)
        try:
            done = self.jpeg2k.decode(buf, name, roi, step, local.stream, min_level=self.jpeg2k_level)
        except DecodeError as err:
            return err
        if done is not None:
            done.image.record_stream(stream)   # its memory is not reused before ``stream`` has read it
            stream.wait_stream(local.stream)
        return done

    def _make_jpeg2k(self) -> bool:
        """Make :attr:`jpeg2k` and its threads; where nvJPEG2000 cannot start here, turn the route off (with a
        warning if the setting asked for it by name) and return False."""
        try:
            self.jpeg2k = nvjpeg2k.Decoder(self.device, max_pixels=self.cpu.max_pixels)
        except nvjpeg2k.Unavailable as err:
            _jpeg2k_unavailable(str(err))
            self.jpeg2k_level = 0
            return False
        self._jpeg2k_threads = Threads(max(1, min(8, self.cpu_threads or defaults.cores())), "ingest-nvjpeg2k")
        return True

    def _finish_jpeg2k(self, pending: dict[int, Future]) -> dict[int, nvjpeg2k.Decoded]:
        """The decoded images of `_start_jpeg2k`'s by position; those it declined or failed on are left to the
        CPU decoder (counted in :attr:`fallbacks` as "nvjpeg2k: <why>")."""
        taken = {}
        for i, future in pending.items():
            done = future.result()
            if isinstance(done, DecodeError):
                self.fallbacks[f"nvjpeg2k: {getattr(done, 'why', 'FAILED')}"] += 1
            elif done is not None:
                taken[i] = done
        if self.jpeg2k is not None:
            for why, count in self.jpeg2k.declined.items():
                self.fallbacks[f"nvjpeg2k: {why}"] += count
            self.jpeg2k.declined.clear()
        return taken

    def _refused_all(self, index: np.ndarray, images: list) -> None:
        """Every GPU-eligible image of a batch went to the CPU decoder: warn once if it decoded them all (nvImageCodec
        refusing good images wholesale means something is wrong with it here, not with the data)."""
        if all(not isinstance(images[i], DecodeError) for i in index.tolist()):
            self._warned = True
            warnings.warn(f"ingest: nvImageCodec decoded none of a batch's {len(index)} images on {self.device} "
                          f"(why: {dict(self.fallbacks)}); the CPU decoder took them. "
                          f"nvJPEG loaded: {nvjpeg.describe()}", RuntimeWarning, stacklevel=3)

    def recycle(self, images: Any, after: Any = None) -> None:
        """Hand back the arena of a batch `decode_batch` returned (an `ImageArena`, or a list of images most of
        which view one: `arena_under`) once nothing will read it any more:
        ``after`` is a CUDA event recorded after the reads queued so far (None: they have run). The next batch
        of the same arena size (of any decoder sharing `arenas`) decodes into it, once that event has run,
        instead of allocating one (a torch allocation gives the GIL up twice, each a switch interval beside a
        busy Python thread). Anything else is ignored. The caller must hold no view of it."""
        storage = arena_under(images)
        if storage is not None and storage.numel() == self.arenas.size:
            self.arenas.give(storage, after)

    def hold_until(self, event: Any) -> None:
        """Order the reuse or release of every image returned so far after ``event`` (see Memory in the module
        doc): the decoder's own streams wait on it. The caller's ``stream`` given to `decode_batch` must wait too."""
        for side in self._streams:
            side.wait_event(event)

    def close(self) -> None:
        """Release the decoders and the thread pool."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self.engine == "native":
            for decoder in self._decoders:
                decoder.close()
        self._decoders.clear()
        if self.jpeg2k is not None:
            self._jpeg2k_threads.shutdown()
            self.jpeg2k.close()
            self.jpeg2k, self._jpeg2k_threads = None, None

    def __enter__(self) -> "GpuDecoder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GpuDecoder(device={self.device}, backend={self.backend!r}, backends={self.backends!r}, "
                f"threads={self.threads}, engine={self.engine!r})")

    # -- planning ------------------------------------------------------------------------------------

    def _backend_choices(self) -> list[list[tuple[str, float]] | None]:
        """The backend lists to try in turn, as (kind, load hint) pairs; None: every backend nvImageCodec has."""
        kind = BACKENDS[self.backend]
        if kind is not None:
            return [[(kind, 1.0)]]
        load = defaults.get("hw_decoder_load")
        if load == "auto":
            return [None]
        split = [("HW_GPU_ONLY", load), ("HYBRID_CPU_GPU", 1.0)] if load > 0 else [("HYBRID_CPU_GPU", 1.0)]
        # nvJPEG2000 and nvTIFF are GPU_ONLY decoders; without that kind they would be left out.
        return [split + [("GPU_ONLY", 1.0)], None]

    def _new_native_decoder(self, lib: native.Library) -> native.BatchDecoder:
        return self._first_decoder(lambda backends: native.BatchDecoder(
            lib, self.device.index, backends=backends, options=decoder_options(), cpu_threads=self.cpu_threads),
            native.Unavailable)

    def _new_decoder(self, nvimgcodec: Any) -> Any:
        def make(backends):
            chosen = None if backends is None else [
                nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, kind), load_hint=load) for kind, load in backends]
            return nvimgcodec.Decoder(device_id=self.device.index, backends=chosen, options=decoder_options(),
                                      max_num_cpu_threads=self.cpu_threads)
        # nvImageCodec raises its own exception type when a backend is unsupported
        return self._first_decoder(make, Exception)

    def _first_decoder(self, make, refused: type[BaseException]) -> Any:
        """The decoder ``make(backends)`` gives for the first of :meth:`_backend_choices` it accepts; ConfigError
        naming the backend when none is."""
        choices = self._backend_choices()
        for k, backends in enumerate(choices):
            try:
                decoder = make(backends)
                break
            except refused as err:
                if k + 1 == len(choices):
                    raise ConfigError(f"nvImageCodec cannot create a decoder with backend={self.backend!r} on "
                                      f"{self.device}: {err}. Available: {', '.join(BACKENDS)}") from err
        self.backends = backends
        self.messages += getattr(decoder, "messages", [])
        return decoder

    # -- GPU -----------------------------------------------------------------------------------------

    def _decode_on_gpu(self, jobs: list[_Job], stream: torch.cuda.Stream) -> list[torch.Tensor | None]:
        """Every job's image (None where nvImageCodec could not decode it), ready in order on ``stream``."""
        if not jobs:
            return []
        if not self._streams or len(jobs) < 2:
            return self._decode_chunk(self._decoders[0], jobs, stream)
        chunks = np.array_split(np.arange(len(jobs)), self.threads)
        futures = [self._pool.submit(self._decode_chunk, decoder, [jobs[k] for k in chunk], side)
                   for decoder, chunk, side in zip(self._decoders, chunks, self._streams)]
        images = []
        for future, side in zip(futures, self._streams):
            part = future.result()
            stream.wait_stream(side)
            for image in part:
                if image is not None:
                    image.record_stream(stream)  # allocated on `side`, used on `stream` from now on
            images += part
        return images

    def _decode_native(self, index: np.ndarray, datas: Sequence[Buffer], rows: np.ndarray, regions: np.ndarray,
                       stream: torch.cuda.Stream) -> tuple[ImageArena, list[str | None]]:
        """The native engine: images ``index`` of ``datas`` (``rows``: their header rows; ``regions`` the
        part of each to decode, x1 <= x0 for all of it) decoded into one new buffer (each image at a 256-byte
        aligned offset), the decoders' shares submitted, then all awaited. Returns the images (an arena over
        them; an image that failed holds garbage) and, per image, None or why nvImageCodec did not decode it
        (counted in :attr:`fallbacks`)."""
        n = len(index)
        hw = decoded_sizes(regions, rows)
        padded = -(-(hw[:, 0] * hw[:, 1] * 3) // _ALIGN) * _ALIGN
        offsets = np.concatenate(([0], np.cumsum(padded)[:-1]))
        storage = self.arenas.take(self.arenas.size_for(int(padded.sum())), stream, self.device)
        addresses = (offsets + storage.data_ptr()).astype(np.uint64)
        regions = regions.astype(np.int32)
        chunks = [c for c in np.array_split(np.arange(n), len(self._decoders)) if len(c)]
        chosen = datas if n == len(datas) else [datas[i] for i in index.tolist()]

        def share(decoder: native.BatchDecoder, chunk: np.ndarray) -> native.Pending:
            if len(chunks) == 1:   # no fancy indexing of [n, 4] (see ingest._numpy)
                return decoder.submit(chosen, regions, hw[:, 0], hw[:, 1], addresses, stream.cuda_stream)
            return decoder.submit([chosen[k] for k in chunk], regions[chunk], hw[chunk, 0], hw[chunk, 1],
                                  addresses[chunk], stream.cuda_stream)

        if self._pool is not None and len(chunks) > 1:  # compiled loop: the shares run at once, one per thread
            others = [self._pool.submit(share, d, c) for d, c in zip(self._decoders[1:], chunks[1:])]
            pending = [share(self._decoders[0], chunks[0])] + [f.result() for f in others]
        else:  # ctypes loop: each submit returns once its host work is done; the decodes then overlap
            pending = [share(decoder, chunk) for decoder, chunk in zip(self._decoders, chunks)]
        reasons = [why for batch in pending for why in batch.wait()]
        self.fallbacks.update(why for why in reasons if why is not None)
        return ImageArena(storage, offsets, hw), reasons

    def _decode_chunk(self, decoder: Any, jobs: list[_Job], stream: torch.cuda.Stream
                      ) -> list[torch.Tensor | None]:
        """One nvImageCodec call for ``jobs`` on ``stream``; images copied out of nvImageCodec's buffers."""
        if not jobs:
            return []
        nvimgcodec = _nvimgcodec()
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            sources = [_code_stream(nvimgcodec, job) for job in jobs]
            ready = [k for k, source in enumerate(sources) if source is not None]
            try:
                decoded = decoder.decode([sources[k] for k in ready], params=self._params,
                                         cuda_stream=stream.cuda_stream)
            except Exception:  # the whole call failed: every image goes to the CPU decoder instead
                decoded = [None] * len(ready)
            images: list[torch.Tensor | None] = [None] * len(jobs)
            for k, image in zip(ready, decoded):
                images[k] = self._copy_out(image, jobs[k])
        return images

    def _copy_out(self, image: Any, job: _Job) -> torch.Tensor | None:
        """The decoded image in PyTorch-owned memory, oriented; None if nvImageCodec gave nothing usable."""
        if image is None or tuple(image.shape) != job.expected_shape():
            self.fallbacks["FAIL" if image is None else "SHAPE_MISMATCH"] += 1
            return None  # undecodable, or not the RGB image asked for: let the CPU decoder do it
        view = torch.as_tensor(image, device=self.device)  # zero-copy; holds `image` while it lives
        return view if job.header.orientation == 1 else orient(view, job.header.orientation)

    # -- CPU fallback --------------------------------------------------------------------------------

    def _start_beside(self, index: np.ndarray, table: np.ndarray, wanted: np.ndarray, datas, names
                      ) -> _Beside | None:
        """The JPEG 2000 images among ``index`` (GPU-eligible) that the CPU decoder takes beside the GPU
        (`host_share`: the smallest regions, `ingest.decode.share.pick`), their decodes started on its threads,
        each with its region (OpenJPEG then decodes just that area: `CpuDecoder.decode`); None for none."""
        jpeg2k = index[table[index, 0] == KIND_JPEG2K]
        count = self.host_share.count(len(jpeg2k))
        if not count:
            return None
        rows = table[jpeg2k]
        regions = clip_regions(wanted[jpeg2k], rows)
        hw = decoded_sizes(regions, rows)
        cover = hw[:, 0] * hw[:, 1] / np.maximum(rows[:, 1] * rows[:, 2], 1)
        chosen = pick(count, cover)
        host, areas = jpeg2k[chosen], regions[chosen]
        return _Beside(host, time.perf_counter(),
                       [self.cpu.submit(datas[i], names[i], tuple(area) if area[2] > area[0] else None)
                        for i, area in zip(host.tolist(), areas.tolist())])

    def _finish_beside(self, beside: _Beside) -> list[np.ndarray | DecodeError]:
        """The CPU decoder's images of `_start_beside` (awaited); its wall time and the GPU side's (until now)
        go to `host_share`."""
        gpu_seconds = time.perf_counter() - beside.started
        results = [future.result() for future in beside.futures]
        self.host_share.record(max(end for _, end in results) - beside.started, gpu_seconds, len(results))
        return [image for image, _ in results]

    def _decode_on_cpu(self, indices: list[int], datas, names, rois, stream: torch.cuda.Stream, *,
                       decoded: list[np.ndarray | DecodeError] | None = None
                       ) -> tuple[list[torch.Tensor | DecodeError], list[tuple[int, int]]]:
        """Decode ``indices`` with the CPU decoder (or take them ``decoded`` already) and upload them (only their
        region, if any) on ``stream``."""
        if decoded is None:
            decoded = self.cpu.decode_batch([datas[i] for i in indices], [names[i] for i in indices])
        images, origins = [], []
        with torch.cuda.stream(stream):
            for i, pixels in zip(indices, decoded):
                roi = None if isinstance(pixels, DecodeError) else clip_roi(rois[i], *pixels.shape[:2])
                if roi is not None:
                    x0, y0, x1, y1 = roi
                    pixels = pixels[y0:y1, x0:x1]
                images.append(pixels if isinstance(pixels, DecodeError) else _upload(pixels, self.device))
                origins.append(roi[:2] if roi else (0, 0))
        return images, origins


# -- helpers ------------------------------------------------------------------------------------------


@functools.cache
def regions_decode(device: torch.device, engine: str) -> bool:
    """Whether nvImageCodec decodes JPEG regions on ``device`` in this process (checked once, on a decoder of its
    own: the CUDA decoder alone, whose answer no CPU backend can stand in for). Where it does not (every region
    fails when nvImageCodec has torchvision's nvJPEG, see `ingest.decode._nvjpeg`), decoders decode whole
    images instead, with a warning: right pixels for more decode work, instead of the CPU decoder for all."""
    data, name = _region_test_jpeg(), "<region decode check>"
    with CpuDecoder(threads=1) as cpu:
        try:
            check = GpuDecoder(device, cpu, backend="hybrid", engine=engine, cpu_threads=1, _check_regions=False)
        except ConfigError:   # no CUDA decoder to ask
            return True
        with check:
            _, _, (region,) = check.decode_batch([data], [name], rois=[(64, 32, 192, 160)])
            if region == "gpu-roi":
                return True
            _, _, (whole,) = check.decode_batch([data], [name])
    if whole != "gpu":   # it refuses the image itself: nothing learnt about regions
        return True
    warnings.warn(f"ingest: nvImageCodec cannot decode JPEG regions on {device} in this process, so whole "
                  f"images are decoded and then cropped (slower). nvJPEG loaded: {nvjpeg.describe()}. A copy bundled "
                  "with torchvision does this: import ingest before torchvision.", RuntimeWarning, stacklevel=4)
    return False


@functools.cache
def _region_test_jpeg() -> bytes:
    """A 256 x 192 baseline 4:2:0 JPEG (a colour gradient) for `regions_decode`."""
    from PIL import Image
    y, x = np.mgrid[0:192, 0:256]
    pixels = np.stack([x, y, (x + y) // 2], axis=-1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def gpu_decodable(table: np.ndarray, max_pixels: int) -> np.ndarray:
    """Which images of a :func:`~ingest.decode.cpu.jpeg_headers` table (with `codec_rows`) the GPU should decode
    (see the module docstring): complete 8-bit baseline or extended JPEGs, gray or YCbCr, and the JPEG 2000 and
    TIFF rows `codec_rows` added, of at most ``max_pixels``."""
    kind, h, w, comps, precision, process, _, rgb, eoi = table.T
    pixels = h * w
    jpeg = ((kind == 1) & (eoi == 1) & np.isin(process, _GPU_PROCESSES) & (precision == 8)
            & ((comps == 1) | (comps == 3)) & (rgb == 0))
    return (jpeg | (kind == KIND_JPEG2K) | (kind == KIND_TIFF)) & (pixels > 0) & (pixels <= max_pixels)


def codec_rows(table: np.ndarray, datas: Sequence[Buffer]) -> np.ndarray:
    """``table`` (a `jpeg_headers` table), with a row for each GPU-eligible JPEG 2000 or TIFF among its non-JPEG
    images (`ingest.decode.codecs.Header.gpu`, `codecs.table_row`: kind `KIND_JPEG2K` or `KIND_TIFF`, then the
    columns a JPEG row has). A copy when any row changes; an unreadable header leaves its row as it was (the CPU
    decoder then names the problem). A table from `CpuDecoder.probe_batch` has those rows already; only the
    JPEG 2000 and TIFF files the GPU does not take are read again."""
    out = table
    for k in np.flatnonzero(table[:, 0] == 0).tolist():
        buf = as_buffer(datas[k], "")
        codec = codecs.sniff(buf)
        if codec not in ("jpeg2k", "tiff"):
            continue
        try:
            header = codecs.read_header(buf, codec, "")
        except DecodeError:
            continue
        if header.gpu:
            out = out.copy() if out is table else out
            out[k] = codecs.table_row(header)
    return out


def clip_regions(regions: np.ndarray, table: np.ndarray) -> np.ndarray:
    """:func:`clip_roi` of each row of ``regions`` ([n, 4] x0 y0 x1 y1; x1 <= x0: none) to its image's stored
    size in ``table`` (header rows); a row becomes all zeros where there is no region worth decoding alone,
    wherever the image is turned by its orientation (regions are in displayed pixels), and for TIFFs."""
    h, w = table[:, 1], table[:, 2]
    x0, y0 = np.maximum(regions[:, 0], 0), np.maximum(regions[:, 1], 0)
    x1, y1 = np.minimum(regions[:, 2], w), np.minimum(regions[:, 3], h)
    whole = (x0 == 0) & (y0 == 0) & (x1 == w) & (y1 == h)
    keep = ((x1 > x0) & (y1 > y0) & ~whole & (table[:, 6] == 1) & (regions[:, 2] > regions[:, 0])
            & (table[:, 0] != KIND_TIFF))   # TIFFs are decoded whole (see the module docstring)
    out = zeros((len(regions), 4), np.int64)   # column by column: see ingest._numpy
    for k, column in enumerate((x0, y0, x1, y1)):
        out[:, k] = column * keep
    return out


def decoded_sizes(regions: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``[n, 2]`` (height, width) each image decodes to: its region (a `clip_regions` row with x1 > x0) or, for
    an all-zero row, its stored size in ``rows`` (header rows). Column by column: see ingest._numpy."""
    cropped = regions[:, 2] > regions[:, 0]
    hw = np.empty((len(regions), 2), dtype=np.int64)
    hw[:, 0] = np.where(cropped, regions[:, 3] - regions[:, 1], rows[:, 1])
    hw[:, 1] = np.where(cropped, regions[:, 2] - regions[:, 0], rows[:, 2])
    return hw


def _region_array(rois: Sequence[Roi | None] | np.ndarray | None, n: int) -> np.ndarray:
    """``rois`` (a sequence of regions or None, or already an [n, 4] array) as an [n, 4] int64 array."""
    if rois is None:
        return zeros((n, 4), np.int64)
    if isinstance(rois, np.ndarray):
        return rois.astype(np.int64, copy=False).reshape(n, 4)
    return np.array([(0, 0, 0, 0) if r is None else r for r in rois], np.int64).reshape(n, 4)


def orient(pixels: torch.Tensor, orientation: int) -> torch.Tensor:
    """Stored ``[H, W, C]`` pixels as displayed for an EXIF ``orientation``, always in new contiguous memory."""
    if orientation == 1:
        return pixels.clone()
    return _ORIENT[orientation](pixels).contiguous()


@dataclass
class _Beside:
    """A batch's images on the CPU decoder beside the GPU: their batch positions, when they started
    (`time.perf_counter`) and their futures (`CpuDecoder.submit`: the image or its error, and when it ended)."""
    index: np.ndarray
    started: float
    futures: list


def _code_stream(nvimgcodec: Any, job: _Job) -> Any:
    """An nvImageCodec CodeStream over the sample's bytes (no copy), cut to its region; None if refused."""
    data = job.data if isinstance(job.data, bytes) else np.frombuffer(job.data, dtype=np.uint8)
    try:
        source = nvimgcodec.CodeStream(data)
        if job.roi is None:
            return source
        x0, y0, x1, y1 = job.roi
        return source.get_sub_code_stream(region=nvimgcodec.Region(start=(y0, x0), end=(y1, x1)))
    except Exception:  # nvImageCodec raises RuntimeError for a stream it cannot parse
        return None


def _jpeg2k_level() -> int:
    """The fewest resolution levels a JPEG 2000 crop must allow to go to nvJPEG2000 called directly: 1 where the
    ``jpeg2k_decoder`` setting is "nvjpeg2k", `nvjpeg2k.AUTO_LEVEL` for "auto", 0 (none go) for "nvimgcodec" and
    where nvJPEG2000 cannot load (with a warning if the setting named it)."""
    choice = defaults.get("jpeg2k_decoder")
    if choice == "nvimgcodec":
        return 0
    why = nvjpeg2k.unavailable()
    if why:
        _jpeg2k_unavailable(why)
        return 0
    return 1 if choice == "nvjpeg2k" else nvjpeg2k.AUTO_LEVEL


def _jpeg2k_unavailable(why: str) -> None:
    if defaults.get("jpeg2k_decoder") == "nvjpeg2k":
        warnings.warn(f"ingest: jpeg2k_decoder is 'nvjpeg2k' but nvJPEG2000 is unavailable ({why}); JPEG 2000 "
                      "images are decoded by nvImageCodec", RuntimeWarning, stacklevel=5)


def _pick_engine(engine: str) -> tuple[str, native.Library | None]:
    """The engine to run and, for the native one, its library. ImportError naming the extra without either."""
    if engine != "python":
        try:
            return "native", native.load()
        except native.Unavailable as err:
            if engine == "native":
                raise
            reason = err
    _nvimgcodec()
    if engine == "auto":
        warnings.warn(f"ingest: nvImageCodec's native decoder is unavailable ({reason}); using its Python "
                      "binding, which slows down beside other busy Python threads", RuntimeWarning, stacklevel=4)
    return "python", None


def _upload(pixels: np.ndarray, device: torch.device) -> torch.Tensor:
    """Copy to a pinned buffer and from there to ``device`` without blocking (on the current stream), in the
    pixels' own dtype (uint8, or uint16 from a decoder asked for it). PyTorch's pinned-memory cache keeps the
    buffer until the copy has run."""
    host = torch.empty(pixels.shape, dtype=torch.uint16 if pixels.dtype == np.uint16 else torch.uint8,
                       pin_memory=True)
    host.numpy()[...] = pixels
    return host.to(device, non_blocking=True)


def _cuda_device(device: torch.device | str | int) -> torch.device:
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        raise ConfigError(f"GpuDecoder needs a CUDA device, got {device}")
    return torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
