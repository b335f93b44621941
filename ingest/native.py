"""The native engine's Python side: who may run on it (`why_not`), and `NativeExecutor`, the executor the Loader
iterates in its place.

The engine (``ingest/_native/engine.c``, module ``ingest._engine``) runs a batch from its dataset indices to the
finished device batch on native threads: byte-range reads into a pinned arena, the record parse (the table's kind:
`ingest.formats._native_table.KINDS`), the JPEG header scan, the op chain's draws (the native planner,
``plan.h``), nvImageCodec's decode of each sample's region into a device arena, the fused warp + normalize kernel
into a preallocated output, the labels and a host function per batch that puts it on the ready queue once the GPU
has run it (a PNG image is decoded on the engine's read team instead of by nvImageCodec on the GPU, a JPEG the GPU
path does not take by nvImageCodec's CPU decoder, and uploaded with its batch). The training thread's Python per batch is one native ``next()`` (the GIL released while it waits; a
batch comes finished, so the thread makes no CUDA call, which would hold the GIL while the driver's locks are busy
with the engine's threads) and the wrapping of the batch's output slot.

Rules:

- **Eligible** (`why_not` returns None): a CUDA device with decode "mixed" (any decode for raw pixels), no worker
  processes, a source with ``native_table()`` (file trees, RecordIO, uncompressed TFRecord of an image and an
  optional int label, or of the Object Detection API layout, LMDB of ours, encoded Caffe Datums or images, indexed
  WebDataset tars of an image and an optional label, raw shards of uint8 RGB pixels; where a source's settings or
  data rule a table out, ``NotNative`` says why), encoded images (or a raw shard's pixels) and nothing else asked for
  (``output="tuple"``, or a source with only an image, a label and, in a TFRecord, LMDB (ours) or WebDataset table,
  one ``mask`` field, or the detection fields below), images that are not mostly JPEG 2000 or TIFF
  (`mostly_other_codecs`: the engine takes JPEGs, on the GPU or its CPU decoder, and its read team PNGs, and the
  Python stages decode those two on the GPU too), a chain `ingest.native_plan.describe` takes whose output size is fixed (or, over raw shards of one pixel
  shape, fixed by that shape: `one_shape`), nvImageCodec's native binding (not for raw pixels) and
  CuPy (the kernel) loaded. The ``engine`` setting decides: "auto" runs the native engine where eligible,
  "python" never, "native" raises a ConfigError naming why where not.
- **Same samples** as the Python engine for the same seed: the same order, draws (keyed by seed, epoch and dataset
  index), labels, regions and kernel arguments; pixels within the decoders' tolerance (a decoder's backend
  depends on the image's place in its share of the batch, as in the Python engine).
- **Output ring**: ``prefetch + 1`` output tensors (and label tensors) made at start (the chains have a fixed
  output size). A batch hands out views of its slot's tensors; once the user drops both, the slot goes back to
  the engine, whose next kernel into it waits for the work queued on the stream that took the batch (an event
  the engine's thread records there when it takes the slot again). A slot still viewed elsewhere (a view
  the user kept) gets new tensors before its reuse; so does the oldest slot out when every slot is out and
  nothing is ready (the user keeps every batch), rather than stall.
- **Failures**: a sample that cannot be read is dropped natively and counted here against the epoch's
  `ingest.engine.batch.Failures` with the error the Python read stage raises (`io.read_error`, `io.short_read`: they
  name the file). So is a record whose bytes do not have the CRC32C its table gives (``NativeTable.crcs``, the
  source's ``check``): the engine's read team computes it over the whole byte range read, the bytes
  `ingest.formats.checks` covers, and the error is the `CorruptRecordError` the Python reader raises
  (`checks.mismatch_error`: it names the file, the record's offset and the sample as the reader does,
  ``NativeTable.index_names``); so is a TFRecord record whose own masked CRC32C of its length or data fails
  (``check_crc``: `tfrecord.crc_error`). A sample the engine does not decode (neither a JPEG its GPU path or its
  CPU decoder takes nor a PNG its read team decodes, below; a record the engine's parse leaves to the Python
  reader: a split RecordIO record, a TFRecord record that is not a canonical Example holding the keys, a Datum that
  is not a plain encoded one; a PNG the engine's decoder leaves to Pillow or refuses; a sample the table leaves to
  Python, ``NativeTable.python``; one nvImageCodec refuses, on the GPU or the CPU) keeps its row, which this class fills through a Python pipeline
  with CPU decoding for those samples only (read, probe, plan, decode, ops, the same draws); one that fails there is
  dropped from the batch, which then is a new tensor. The cost of a fallback: that pipeline's GIL hand-offs and a CPU
  decode, per batch that has one; `stats()["native"]["fallbacks"]` counts them.
- **Raw pixels** (a "pixels" table, `ingest.formats.raw.RawSource.native_table`): each sample's pixels are read
  into the pinned arena like any record, the batch's arena is copied to a device arena in one copy, and the warp
  kernel reads each sample where it landed, whole, at the table's height and width: no header scan, no
  nvImageCodec (its `gpu` argument is the device and the kernels alone). The Python stages run the same kernel on
  the same plan over the same pixels on a GPU, so the batches are equal exactly.
- **PNG images**: a PNG of 8 bits or fewer, not interlaced, without an eXIf chunk, is decoded on the engine's read
  team (``png_decode.h``) to exactly the CPU decoder's RGB (Pillow's ``convert("RGB")``, transparency dropped),
  uploaded with its batch in one copy and warped by the same kernel on the plan the Python stages draw, so its row
  is theirs exactly; counted as the decode path "cpu-native". Others (16 bits, Adam7, ...) fall back as above.
- **JPEGs the GPU path leaves** (progressive, CMYK/YCCK, Adobe RGB, EXIF- or XMP-oriented: ``why_not_gpu``): one
  of 8 bits, Huffman-coded, of 1, 3 or 4 components, ending in EOI, is decoded whole by nvImageCodec's CPU decoder
  (`host_decoder`: device CPU_ONLY, its libjpeg-turbo backend; the engine's reader thread calls it once per batch
  without the GIL) into the PNGs' host image arena, turned there by its orientation as the CPU decoder turns it
  (its plan drawn at the turned size), and uploaded and warped like a PNG: its pixels are the CPU decoder's
  (simplejpeg, Pillow's CMYK conversion) exactly, so its row is the Python stages'; counted as "cpu-native". One
  that decoder refuses falls back ("decoder"); 12-bit, arithmetic-coded, lossless or cut-short ones fall back
  ("not a GPU JPEG"). Without nvImageCodec's CPU backend they all fall back. A JPEG whose entropy data is damaged
  but which ends in EOI is decoded with its lost blocks filled, where the Python stages' strict CPU decode drops it
  (as nvImageCodec's GPU decoders do for the JPEGs the GPU path takes).
- **Masks**: with the fields asked for, a table's mask field (``NativeTable.mask``) is decoded by the engine's read
  team and warped like its image (nearest, the field's ``mask_fill``) into each slot's ``[B, H, W]`` uint8 mask
  tensor, handed out as the batch's field under its name; a mask the engine leaves to Python (fallback "mask")
  has its row filled, or its sample failed, by the Python pipeline as above; a 16-bit one there is a
  `DecodeError` (the slot's masks are uint8).
- **Detection**: a source with ``native_boxes()`` and a bounded detection chain (`ingest.engine.native_boxes`)
  tells the engine once where its boxes are: COCO hands over its boxes and fields as arrays; a TFRecord source of
  the Object Detection API layout hands over the keys, and the engine scans each record's coordinate lists, size,
  per-box lists and per-sample ints out of the record it has just read (example_scan.h), in pixels as the reader
  makes them (the record's ``image/height`` and ``image/width``, the same float arithmetic). A record the scan does
  not take (a missing key, lists whose lengths differ from its boxes', a size that is not positive, an id that is
  not a decimal int64, anything but the canonical encoding) falls back ("record": the Python reader reads it or
  names its problem), as does one with more boxes than the slots hold per sample ("boxes",
  `engine.native_boxes.RECORD_BOXES`). Each batch comes with every sample at its own output size (a list of views
  of the slot's rows, or one tensor with a batch-wide PadTo) and its targets padded as the Python engine collates
  them (boxes in the asked format, per-box fields, ``<field>_lengths`` and ``image_sizes`` on the host, the rest on
  the device), views of the slot's buffers, the slot given back once all are dropped. A batch with fallback rows
  gets them, boxes and fields included, from the Python pipeline, merged into new tensors.
- **Epochs**: the engine runs on into the next epoch, as the Python executor does; each epoch's indices and batch
  bounds are made once from the sampler's plans and handed over as arrays, one epoch ahead.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from . import defaults, io
from .errors import ConfigError, CorruptRecordError
from .formats import checks, tfrecord
from .formats.lmdb import LMDBSource
from .formats.webdataset import WebDatasetSource
from .formats._native_table import NotNative
from .formats.base import Location, fields_of
from .ops import planner
from .ops.affine import same_fill
from .ops.geometry import CenterCrop, Flip, RandomResizedCrop, Resize
from .engine import Batch, EpochEnd, Failures, Pipeline
from .engine.collate import stays_on_host
from .sampler import BatchPlan, Sampler

try:
    from . import _engine as ENGINE
except ImportError:   # built where a C compiler was found (setup.py)
    ENGINE = None

ENGINES = ("auto", "python", "native")
#: Why a sample fell back to the Python path, by the engine's code (`stats()["native"]["fallbacks"]`).
#: ("oriented": an EXIF-oriented JPEG the GPU path would take, where the engine has no CPU decoder; "decoder":
#: nvImageCodec refused it, on the GPU or its CPU decoder.)
FALLBACK_REASONS = {1: "not a GPU JPEG", 2: "oriented", 3: "record", 4: "decoder", 5: "plan", 6: "mask", 7: "boxes"}
_KINDS = {"whole": 0, "recordio": 1, "tfrecord": 2, "caffe_datum": 3, "framed": 4, "pixels": 5}
_TABLES = "file trees, RecordIO, TFRecord, LMDB, WebDataset and raw shards do"
_DTYPES = {torch.uint8: 0, torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


@dataclass(frozen=True)
class Chain:
    """What the engine runs: the source's table, the chain's description, and the output each batch fills."""

    table: Any            # formats._native_table.NativeTable
    desc: np.ndarray      # float64 (ingest.native_plan.describe)
    size: tuple[int, int]   # the fixed output (height, width)
    dtype: torch.dtype
    layout: str | None    # the ops' output layout; None: NHWC memory handed out as NCHW views
    mask_fill: int = 255  # the table's mask field's fill (`Field.mask_fill`), where it has one
    detection: Any = None  # engine.native_boxes.Detection: boxes and their fields, ragged outputs (None: none)

    @property
    def fields(self) -> frozenset[str]:
        """The fields besides image and label its batches carry."""
        if self.detection is not None:
            return self.detection.fields
        return frozenset({self.table.mask[0]} if self.table.mask else ())


def why_not(source, ops, *, device: torch.device, decode: str, workers: int, streamed: bool, tuple_output: bool,
            pipeline: Pipeline | None, decode_dtype: str = "uint8", channels: int = 3
            ) -> tuple[Chain | None, str | None]:
    """(the chain, None) where a Loader of these settings can run on the native engine, else (None, why not).
    ``decode_dtype`` and ``channels``: the Loader's (checked names, `ingest.decode.codecs.output_options`)."""
    if (decode_dtype, channels) != ("uint8", 3):
        return None, (f"it gives 8-bit RGB (decode_dtype={decode_dtype!r}, channels={channels} ask for other "
                      "pixels, which the Python stages decode and transform)")
    if ENGINE is None:
        return None, "the native engine (ingest._engine) was not built"
    pixels = getattr(pipeline, "image_kind", None) == "pixels"   # (raw pixels: nothing to decode)
    if device.type != "cuda" or (decode != "mixed" and not pixels):
        return None, f"it decodes on the GPU for a CUDA device (device={device}, decode={decode!r})"
    if workers or streamed or pipeline is None:
        return None, "it runs in the training process on a seekable source (no worker processes, no stream)"
    if getattr(source, "native_table", None) is None:
        return None, f"{type(source).__name__} gives no native table ({_TABLES})"
    fields = fields_of(source)
    if (pipeline.image_kind != "image" and not pixels) or (pipeline.direct and not pixels):
        return None, "it takes encoded images or raw pixels"
    if pixels and "boxes" in fields:
        return None, "it takes raw pixels without boxes"
    chain, why = chain_for(source, ops)
    if chain is None:
        return None, why
    if pixels != (chain.table.kind == "pixels"):
        return None, f"its images are {pipeline.image_kind}, but its native table's are {chain.table.kind!r}"
    extra = set(fields) - {"image", "label"} - chain.fields
    if not tuple_output and extra:
        return None, f"output='dict' asks for fields it does not collate ({', '.join(sorted(extra))})"
    if mostly_other_codecs(chain.table):
        return None, ("most of its images are JPEG 2000 or TIFF, which it would hand to the CPU decoder (the Python "
                      "stages decode them on the GPU)")
    lanes = [gpu for gpu, _ in pipeline.lanes if gpu is not None]
    if not pixels and (not lanes or any(gpu.engine != "native" for gpu in lanes)):
        return None, "nvImageCodec's native binding did not load (see ingest.decode._nvimgcodec)"
    from .ops import _warp_kernel
    if not _warp_kernel.available():
        return None, "CuPy (the warp kernel) is not installed"
    return chain, None


def mostly_other_codecs(table, samples: int = 16) -> bool:
    """Whether most of up to ``samples`` samples of a file table (kind "whole"), spread evenly over it, start like
    a JPEG 2000 or TIFF file (PNGs are not counted: the engine decodes them on its read team). One read of a few
    bytes each; an unreadable file counts as neither."""
    from .decode import codecs
    n = len(table.files)
    if table.kind != "whole" or n == 0:
        return False
    picks = np.unique(np.linspace(0, n - 1, min(n, samples)).astype(np.int64)).tolist()
    other = 0
    for k in picks:
        try:
            with open(table.paths[int(table.files[k])], "rb") as f:
                f.seek(int(table.offsets[k]))
                head = f.read(16)
        except OSError:
            continue
        other += codecs.sniff(memoryview(head)) in ("jpeg2k", "tiff")
    return 2 * other > len(picks)


def chain_for(source, ops) -> tuple[Chain | None, str | None]:
    """(the source's table and the ops' chain, None), or (None, why) where the planner or the source cannot give
    them: the part of `why_not` that needs no GPU."""
    try:
        from .native_plan import describe
    except ImportError:
        return None, "the native planner (ingest.native_plan) is missing"
    boxes = "boxes" in fields_of(source)
    desc = describe(ops, 3, batch_wide=boxes)
    if desc is None:
        return None, "its op chain is not one the native planner runs (see ingest.native_plan)"
    clash = _fill_clash(ops)
    if clash is not None:
        return None, clash
    probe = planner.plan(ops, [(64, 64), (480, 640)], 0)
    if boxes:
        return _detection_chain(source, ops, desc, probe)
    varies = "its op chain's output size depends on the image's (the output ring is made at start)"
    if probe.out_sizes[0] != probe.out_sizes[1] and getattr(source, "fixed_shape", None) is None:
        return None, varies   # (raw shards of one pixel shape: one output size, checked on their table below)
    table_of = getattr(source, "native_table", None)
    if table_of is None:
        return None, f"{type(source).__name__} gives no native table ({_TABLES})"
    try:
        table = table_of()
    except NotNative as err:
        masks = [n for n, f in fields_of(source).items() if f.kind == "mask"]
        also = (f" (a mask field, {', '.join(masks)}, rides the native engine from TFRecord records, LMDBs of our "
                "layout and indexed WebDataset tars only, whose tables give each mask's encoded bytes in the image's "
                f"file: a record's feature or field, a member's byte range; {type(source).__name__}'s native table "
                "carries no mask)") \
            if masks and not isinstance(source, (tfrecord.TFRecordSource, LMDBSource, WebDatasetSource)) else ""
        return None, f"{type(source).__name__} gives no native table here: {err}{also}"
    if probe.out_sizes[0] != probe.out_sizes[1]:   # fixed all the same where every image has one size
        shape = one_shape(table)
        if shape is None:
            return None, varies
        probe = planner.plan(ops, [shape], 0)
    fill = fields_of(source)[table.mask[0]].mask_fill if table.mask else 255
    if not 0 <= fill <= 255:
        return None, f"its mask field's fill {fill} is not a uint8 value (the engine's masks are uint8)"
    return Chain(table, desc, tuple(probe.out_sizes[0]), probe.output.dtype, probe.output.layout, fill), None


def _mask_ranges(table) -> dict[str, np.ndarray]:
    """The engine's mask-range arguments of a table whose mask has its own byte ranges (a WebDataset mask member;
    None or no ranges: none)."""
    if table is None or table.mask_offsets is None:
        return {}
    out = {"mask_offsets": np.ascontiguousarray(table.mask_offsets, np.int64),
           "mask_sizes": np.ascontiguousarray(table.mask_sizes, np.int64)}
    if table.mask_crcs is not None:
        out["mask_crcs"] = np.ascontiguousarray(table.mask_crcs, np.uint32)
    return out


def one_shape(table) -> tuple[int, int] | None:
    """The (height, width) every sample of a "pixels" table the engine reads has (raw shards of one pixel shape:
    a chain whose output size follows the image's then gives one size), else None. The engine plans its output
    size at its first such sample's (engine.c)."""
    if table.kind != "pixels":
        return None
    hw = table.hw if table.python is None else table.hw[table.python == 0]
    if not len(hw) or (hw != hw[0]).any():
        return None
    return int(hw[0, 0]), int(hw[0, 1])


def _detection_chain(source, ops, desc: np.ndarray, probe) -> tuple[Chain | None, str | None]:
    """`chain_for` of a source with boxes: its table and `engine.native_boxes.Detection`, or why not."""
    from .engine.native_boxes import detection_of
    from .native_plan import RECORD
    if getattr(source, "native_table", None) is None:
        return None, f"{type(source).__name__} gives no native table ({_TABLES})"
    fill = desc[RECORD:RECORD + 3]
    if desc[3]:   # Normalize: the padding's values are the filled levels through its epilogue
        fill = fill * desc[6:9] + desc[10:13]
    det, why = detection_of(source, ops, fill.tolist())
    if det is None:
        return None, why
    try:
        table = source.native_table()
    except NotNative as err:
        return None, f"{type(source).__name__} gives no native table here: {err}"
    return Chain(table, desc, det.bound, probe.output.dtype, probe.output.layout, detection=det), None


def _fill_clash(ops) -> str | None:
    """Why the native planner's one warp per batch could paint a pixel with the wrong fill, or None: it fills with
    the chain's last fill (plan.h), so an op that can pad (a CenterCrop on images that may be smaller than its crop)
    followed by an op of another fill needs the Python planner, which splits the warp there
    (`ingest.ops.affine.fill_apart`). Sizes known for every image (after a Resize to a size, a RandomResizedCrop
    or a CenterCrop) decide whether a CenterCrop can pad; anything else counts as able to."""
    size = None        # every image's (height, width) here, where the ops fix it
    padded = None      # the op that can pad first
    for op in ops:
        fill = getattr(op, "fill", None)
        if fill is not None and padded is not None and not same_fill(fill, padded.fill):
            return (f"its {type(padded).__name__} can pad with fill {padded.fill} and a later "
                    f"{type(op).__name__} fills with {fill}: the native planner's one warp has one fill")
        if fill is not None and padded is None and not (
                isinstance(op, CenterCrop) and size is not None and size[0] >= op.size[0] and size[1] >= op.size[1]):
            padded = op
        if isinstance(op, (CenterCrop, RandomResizedCrop)) or (isinstance(op, Resize) and op.size is not None):
            size = tuple(op.size)
        elif not isinstance(op, Flip):
            size = None
    return None


def choose(setting: str, chain: Chain | None, why: str | None) -> Chain | None:
    """The chain to run natively under the ``engine`` setting, or None for the Python stages."""
    if setting not in ENGINES:
        raise ConfigError(f"Unknown engine {setting!r}. Available: {', '.join(ENGINES)}")
    if setting == "native" and chain is None:
        raise ConfigError(f"engine='native', but this loader cannot run on the native engine: {why}")
    return chain if setting != "python" else None


def epoch_arrays(sampler: Sampler, epoch: int, start: int = 0, offset: int = 0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The epoch's batches from number ``start`` on as the engine takes them (`Sampler.flat`: no plan made per
    batch): the indices, batch bounds and padding flags."""
    indices, pad, bounds = sampler.flat(epoch, start, offset)
    return indices.astype(np.int64), bounds, pad.astype(np.uint8)


def _kernels(device: torch.device) -> tuple[int, int, int]:
    """The warp kernel's CUfunction handles (nearest, bilinear, bicubic) for ``device``."""
    import cupy
    from .ops import _warp_kernel
    with cupy.cuda.Device(device.index):   # a RawKernel's Function (its CUfunction: .ptr) for this device
        return tuple(_warp_kernel._function(name).kernel.ptr for name in ("nearest", "bilinear", "bicubic"))


def _gpu_arguments(pipeline: Pipeline, table) -> tuple:
    """The engine's `gpu` argument: nvImageCodec's functions, handles and struct layouts (from the ctypes binding),
    the pipeline's decoders (every lane's: the Python stages do not run meanwhile) and the kernels; for a "pixels"
    table, which decodes nothing, the device and the kernels alone."""
    if table.kind == "pixels":
        return pipeline.device.index, _kernels(pipeline.device)
    from .decode import _nvimgcodec as nv
    lib = nv.load()
    decoders = [d for gpu, _ in pipeline.lanes if gpu is not None for d in gpu._decoders]
    device = pipeline.device
    kernels = _kernels(device)
    return (device.index, lib.loop_functions, _destroyers(lib), lib.instance, tuple(d.handle for d in decoders),
            ctypes.addressof(decoders[0].params), *_layouts(nv.BUFFER_STRIDED_DEVICE), kernels)


def _destroyers(lib) -> tuple[int, int]:
    """The addresses of ``lib``'s image and code stream destroy functions (the engine frees its handles)."""
    return tuple(ctypes.cast(fn, ctypes.c_void_p).value for fn in (lib.ImageDestroy, lib.CodeStreamDestroy))


def _layouts(buffer_kind: int) -> tuple[tuple, tuple, tuple]:
    """The engine's templates of nvImageCodec's structs with their field offsets: an image info of 8-bit interleaved
    RGB into a buffer of ``buffer_kind`` (buffer, stream, height, width, row stride), a code stream view of a 2-D
    region (its start and end) and a code stream info (its codec name)."""
    from .decode import _nvimgcodec as nv
    info = nv.new(nv.ImageInfo)
    info.color_spec, info.chroma_subsampling, info.sample_format = nv.COLORSPEC_SRGB, nv.SAMPLING_NONE, \
        nv.SAMPLEFORMAT_I_RGB
    info.num_planes, info.buffer_kind = 1, buffer_kind
    info.plane_info[0].num_channels, info.plane_info[0].sample_type = 3, nv.SAMPLE_UINT8
    plane = nv.ImageInfo.plane_info.offset
    view = nv.new(nv.CodeStreamView)
    view.region.ndim = 2
    region = nv.CodeStreamView.region.offset
    return ((bytes(info), nv.ImageInfo.buffer.offset, nv.ImageInfo.cuda_stream.offset,
             plane + nv.ImagePlaneInfo.height.offset, plane + nv.ImagePlaneInfo.width.offset,
             plane + nv.ImagePlaneInfo.row_stride.offset),
            (bytes(view), region + nv.Region.start.offset, region + nv.Region.end.offset),
            (bytes(nv.new(nv.CodeStreamInfo)), nv.CodeStreamInfo.codec_name.offset))


def host_decoder(threads: int):
    """nvImageCodec's CPU decoder (its libjpeg-turbo extension, host output, on ``threads`` threads of its own) that
    the engine decodes the JPEGs its GPU path does not take with, or None where the library or that backend is not
    there (those JPEGs then fall back to the Python stages)."""
    from .decode import _nvimgcodec as nv
    try:
        return nv.BatchDecoder(nv.load(), nv.DEVICE_CPU_ONLY, backends=["CPU_ONLY"], cpu_threads=threads)
    except nv.Unavailable:
        return None


def host_arguments(decoder) -> tuple:
    """The `cpu` item of the engine's `gpu` argument for ``decoder`` (a `host_decoder`): its library's functions, its
    instance, handle and decode parameters (EXIF orientation not applied: the engine turns the pixels) and the
    structs' templates for host output."""
    from .decode import _nvimgcodec as nv
    lib = decoder.lib
    return (lib.loop_functions, _destroyers(lib), lib.instance, decoder.handle, ctypes.addressof(decoder.params),
            *_layouts(nv.BUFFER_STRIDED_HOST))


class _Slot:
    """One output slot's tensors on the Python side: the output, label and (a table with a mask, the fields asked
    for) mask tensors the engine writes (``out``, ``labels``, ``masks``), the view handed out of the output
    (``shown``), host arrays of the rows' dataset indices and padding flags, and the storage use counts of the
    tensors with nothing of the user's alive (``alone``, counted by `count_alone` once the slot's tensors are
    set)."""

    __slots__ = ("out", "labels", "masks", "shown", "address", "indices", "pad", "alone", "storages", "generation",
                 "pending", "stream", "lost", "watching", "targets", "views", "staging")

    def __init__(self, out: torch.Tensor, labels: torch.Tensor, layout: str | None, batch: int,
                 masks: torch.Tensor | None = None, targets: torch.Tensor | None = None):
        self.out, self.labels, self.masks = out, labels, masks
        self.targets = targets   # detection: the device targets (engine.native_boxes.SlotViews)
        self.views = None
        self.staging = None   # detection: the pinned host staging of the targets (its counts and sizes handed out)
        self.shown = out.permute(0, 3, 1, 2) if layout is None else out
        self.address = out.data_ptr()
        self.watching: tuple = ()
        self.indices = np.zeros(batch, np.int64)
        self.pad = np.zeros(batch, np.uint8)
        self.count_alone()
        self.generation, self.pending, self.stream, self.lost = 0, 0, 0, False

    def count_alone(self) -> None:
        """Note each tensor's storage (its handle, alive as long as the slot holds the tensor) and its use count
        now, with nothing of the user's alive."""
        self.storages = tuple(t.untyped_storage()._cdata for t in self.tensors)
        self.alone = tuple(map(_USE_COUNT, self.storages)) if _USE_COUNT is not None else ()

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        if self.targets is not None:
            return (self.out, self.labels, self.targets) + ((self.staging,) if self.staging is not None else ())
        return (self.out, self.labels) if self.masks is None else (self.out, self.labels, self.masks)

    def held(self, dying: int) -> bool:
        """Whether anything but this slot (and the tensor handed out that is being dropped: 0 the images, 1 the
        labels, 2 the masks, which holds its memory while its drop is seen) holds any tensor's memory; True where
        torch does not say."""
        if _USE_COUNT is None:
            return True
        for k, storage in enumerate(self.storages):
            if _USE_COUNT(storage) > self.alone[k] + (dying == k):
                return True
        return False


class _Handed:
    """What one batch handed out of slot ``k``: a weak reference to each tensor, all calling this object when
    dropped; the last drop gives the slot back (`NativeExecutor._give_back`), unless the slot was given back or
    replaced meanwhile (its generation moved on) or the executor is gone. ``storage``: which of the slot's tensors
    each one views (None: the slot's order)."""

    __slots__ = ("executor", "k", "slot", "generation", "storage", "refs", "__weakref__")

    def __init__(self, executor: "NativeExecutor", k: int, slot: _Slot, handed: tuple, storage: list[int] | None):
        self.executor, self.k, self.slot, self.generation, self.storage = weakref.ref(executor), k, slot, \
            slot.generation, storage
        slot.pending = len(handed)
        self.refs = [weakref.ref(t, self) for t in handed]

    def __call__(self, ref: weakref.ref) -> None:
        ex, slot = self.executor(), self.slot
        if ex is None or ex._closed or ex._slots[self.k] is not slot or slot.generation != self.generation:
            return
        slot.pending -= 1
        if slot.pending == 0:
            which = next(i for i, r in enumerate(self.refs) if r is ref)
            slot.lost = slot.held(which if self.storage is None else self.storage[which])
            ex._give_back(self.k)


class NativeExecutor:
    """Runs a Loader's epochs on the native engine: iterate it for `Batch`es, as `ingest.engine.executor.Executor`.
    Iteration stops at an epoch's end (``ended`` holds the `EpochEnd`) while the engine reads on into the next epoch;
    iterating again continues with it. ``sampler`` gives each epoch's batches (`Sampler.flat`), ``budget()`` a new
    epoch's failure budget. `close()` (also on collection) stops and joins every native thread.

    ``dry``: no CUDA; each batch is a `DryBatch` of the engine's plan for its rows (tests). ``gpu``: the engine's
    `gpu` argument instead of the one made from the pipeline's decoders (tests run the GPU path on a stand-in
    driver, with host memory as device memory on a CPU pipeline). ``host_jpegs``: whether the engine decodes the
    JPEGs its GPU path does not take with nvImageCodec's CPU decoder (`host_decoder`, where there) instead of
    leaving them to the Python stages; None: where ``gpu`` is not given."""

    native = True

    def __init__(self, pipeline: Pipeline, chain: Chain, sampler: Sampler, *, epoch: int, start: int, offset: int,
                 failures: Failures, budget: Callable[[], Failures], prefetch: int = 2, with_fields: bool = False,
                 dry: bool = False, read_threads: int | None = None, gpu: tuple | None = None,
                 host_jpegs: bool | None = None):
        self.pipeline, self.chain, self.sampler, self.prefetch = pipeline, chain, sampler, prefetch
        self.with_fields, self.dry = with_fields, dry
        # the mask field the engine decodes and warps beside the images (only where the batches carry the fields)
        self._mask = chain.table.mask if with_fields else None
        self.device = pipeline.device
        self._budget = budget
        self._failures: dict[int, Failures] = {epoch: failures}
        self._closed = False
        self._host = None   # nvImageCodec's CPU decoder (host_decoder), where the engine has one
        self._pid = os.getpid()   # a forked child's copy leaves the engine (its parent's) alone
        self.ended: EpochEnd | None = None
        self.fallbacks: Counter[str] = Counter()
        self._fallback: Pipeline | None = None
        self._batch = sampler.batch_size
        self.outputs_made = 0   # output tensors allocated: the ring at start, then one per slot replaced
        self._python = [0.0, 0]   # seconds of __next__ outside the engine's wait, and the batches they made
        # the stats' decode paths, counted per batch without a lock: the engine's rows (nvImageCodec's on the GPU,
        # and those decoded on the host: PNGs on its read team, JPEGs by its CPU decoder), the fallback rows
        stage = pipeline.decode_stage
        self._paths = (stage.tally("none (raw, native)" if chain.table.kind == "pixels" else "gpu"),
                       stage.tally("cpu-fallback"), stage.tally("cpu-native"))
        table = chain.table
        slots = prefetch + 1
        threads = read_threads or defaults.get("io_threads")
        if host_jpegs is None:
            host_jpegs = gpu is None
        gpu = None if dry else gpu or _gpu_arguments(pipeline, table)
        # nvImageCodec's CPU decoder for the JPEGs the GPU path does not take (closed after the engine)
        self._host = host_decoder(threads) if gpu is not None and host_jpegs and table.kind != "pixels" else None
        if self._host is not None:
            gpu = (*gpu, host_arguments(self._host))
        self._cuda = self.device.type == "cuda"
        self._engine = ENGINE.Engine(
            list(table.paths), np.ascontiguousarray(table.files, np.int64),
            np.ascontiguousarray(table.offsets, np.int64), np.ascontiguousarray(table.sizes, np.int64),
            None if table.labels is None else np.ascontiguousarray(table.labels, np.int64), _KINDS[table.kind],
            np.ascontiguousarray(chain.desc, np.float64), sampler.seed, self._batch, slots,
            threads, pipeline.decode_stage.cpu.max_pixels,
            all(lane.regions for lane, _ in pipeline.lanes if lane is not None), gpu,
            min(19, defaults.get("engine_nice")),
            None if table.crcs is None else np.ascontiguousarray(table.crcs, np.uint32),
            list(table.keys) or None, table.record_crc,
            None if table.python is None else np.ascontiguousarray(table.python, np.uint8),
            None if self._mask is None else self._mask[1], chain.mask_fill,
            None if table.hw is None else np.ascontiguousarray(table.hw, np.int64),
            **_mask_ranges(table if self._mask is not None else None),
            host_share=float(defaults.get("host_jpeg_share")) if self._host is not None else 0.0)
        self._det = chain.detection
        if self._det is not None:
            from .engine import native_boxes
            self._engine.set_detection(*native_boxes.engine_arguments(self._det, 3))
        self._slots: list[_Slot | None] = [None] * slots
        self._dry: list[np.ndarray] = []
        self._out: list[int] = []   # slots handed out and not given back, oldest first
        for k in range(slots):
            self._fill_slot(k)
        self._epoch = epoch
        self._add_epoch(epoch, start, offset)
        self._add_epoch(epoch + 1, 0, 0)
        from .engine import CLOSE_AT_EXIT
        CLOSE_AT_EXIT.add(self)

    # -- slots ----------------------------------------------------------------------------------------
    def _fill_slot(self, k: int) -> None:
        """Make slot k's tensors (at start, and for a slot still held elsewhere) and hand them to the engine."""
        if self.dry:
            if k >= len(self._dry):
                self._dry.append(np.zeros((self._batch, ENGINE.DRY_COLUMNS), np.int64))
                self._slots[k] = _Slot(torch.empty((self._batch, 1, 1, 1), dtype=torch.uint8),
                                       torch.empty(self._batch, dtype=torch.int64), "NHWC", self._batch)
                slot = self._slots[k]
                self._engine.set_slot(k, 0, 0, slot.indices, slot.pad, self._dry[k])
            return
        if self._det is not None:
            return self._fill_detection_slot(k)
        h, w = self.chain.size
        shape = (self._batch, 3, h, w) if self.chain.layout == "NCHW" else (self._batch, h, w, 3)
        with self._on_device():
            out = torch.empty(shape, dtype=self.chain.dtype, device=self.device)
            labels = torch.empty(self._batch, dtype=torch.int64, device=self.device)
            masks = None if self._mask is None else torch.empty((self._batch, h, w), dtype=torch.uint8,
                                                                device=self.device)
        self.outputs_made += 1
        old = self._slots[k]
        slot = _Slot(out, labels, self.chain.layout, self._batch, masks)
        if old is not None:
            slot.generation = old.generation + 1
            slot.indices, slot.pad = old.indices, old.pad
        self._slots[k] = slot
        self._engine.set_slot(k, out.data_ptr(), labels.data_ptr(), slot.indices, slot.pad, None,
                              0 if masks is None else masks.data_ptr())

    def _fill_detection_slot(self, k: int) -> None:
        """Slot k's detection buffers: image rows for the largest batch, device targets and their host staging
        (pinned with CUDA), the info array (`engine.native_boxes.SlotViews`)."""
        from .engine.native_boxes import COLUMNS, HEAD, SlotViews
        det, batch = self._det, self._batch
        size = det.target_bytes(batch)
        with self._on_device():
            out = torch.empty(batch * det.row_capacity(3), dtype=self.chain.dtype, device=self.device)
            labels = torch.empty(batch, dtype=torch.int64, device=self.device)
            targets = torch.empty(size, dtype=torch.uint8, device=self.device)
        host = torch.empty(size, dtype=torch.uint8, pin_memory=self._cuda)
        info = np.zeros(HEAD + COLUMNS * batch, np.int64)
        self.outputs_made += 1
        old = self._slots[k]
        slot = _Slot(out, labels, "NHWC", batch, targets=targets)
        slot.views = SlotViews(out, targets, host, info)
        slot.staging = host
        slot.count_alone()   # (the views' own references to the targets)
        if old is not None:
            slot.generation = old.generation + 1
            slot.indices, slot.pad = old.indices, old.pad
        self._slots[k] = slot
        self._engine.set_slot(k, out.data_ptr(), labels.data_ptr(), slot.indices, slot.pad, None, 0)
        self._engine.set_targets(k, targets.data_ptr(), slot.views.host, info)

    def _give_back(self, k: int) -> None:
        slot = self._slots[k]
        if k in self._out:
            self._out.remove(k)
        if slot.lost:   # a view of the user's still holds its memory: new tensors first
            self._fill_slot(k)
        self._engine.release(k, slot.stream)

    def _watch(self, k: int, *handed: torch.Tensor, storage: list[int] | None = None) -> None:
        """Give slot k back once every tensor handed out of it (images, labels and masks, in the slot's order) is
        dropped (wherever that happens). ``storage``: which of the slot's tensors each one views (None: the
        slot's order)."""
        slot = self._slots[k]
        slot.watching = _Handed(self, k, slot, handed, storage)

    def _unstarve(self) -> None:
        """Every slot is out and nothing is ready: the oldest slot out gets new tensors (the user keeps the old ones)
        and goes back to the engine."""
        if not self._out:
            raise RuntimeError("the native engine waits for an output slot, but none is out")
        k = self._out.pop(0)
        self._slots[k].generation += 1   # its drop callbacks no longer count
        self._slots[k].lost = True
        self._give_back(k)

    # -- epochs -----------------------------------------------------------------------------------------
    def _add_epoch(self, epoch: int, start: int, offset: int) -> None:
        self._engine.add_epoch(epoch, start, *epoch_arrays(self.sampler, epoch, start, offset))

    # -- iteration ----------------------------------------------------------------------------------------
    def __iter__(self) -> "NativeExecutor":
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        start = time.perf_counter()
        stream = torch._C._cuda_getCurrentRawStream(self.device.index) if self._cuda else 0
        while True:
            waited = time.perf_counter()
            item = self._engine.next()
            start += time.perf_counter() - waited   # (the wait, the GIL given up, is not this thread's work)
            if item is None:
                self._unstarve()
                continue
            kind, k, epoch, number, rows, notes = item
            if kind == ENGINE.EPOCH_END:
                failures = self._budget()
                self._failures[epoch + 1] = failures
                self._failures.pop(epoch - 1, None)
                self.ended = EpochEnd(epoch + 1, failures)
                self._add_epoch(epoch + 2, 0, 0)
                raise StopIteration
            failures = self._failures[epoch]
            slot = self._slots[k]
            slot.stream = stream
            self._out.append(k)
            try:
                if notes is not None:
                    fallback = self._notes(notes, failures, rows)
                else:   # every row nvImageCodec's: the stats' decode paths counted here
                    fallback = None
                    if not self.dry:
                        self._paths[0][0] += rows
            except BaseException:
                self._give_back(k)
                raise
            if self._det is not None and rows and not self.dry:
                batch = self._detection_batch(k, slot, epoch, number, rows, fallback, failures)
                if batch is None:
                    continue
                self._python[0] += time.perf_counter() - start
                self._python[1] += 1
                return batch
            if rows == 0 or self.dry:   # every sample failed (and the budget allowed it), or a dry run
                batch = DryBatch(self._dry[k][:rows].copy(), number, epoch, notes) if self.dry and rows else None
                self._give_back(k)
                if batch is None:
                    continue
                return batch
            if rows == self._batch:   # new views of the whole slot (cheaper than slices)
                images, labels = slot.shown[...], slot.labels[...]
                masks = None if slot.masks is None else slot.masks[...]
            else:
                images, labels = slot.shown[:rows], slot.labels[:rows]
                masks = None if slot.masks is None else slot.masks[:rows]
            kept = slice(0, rows)
            if fallback:
                images, labels, masks, kept = self._complete(k, epoch, number, rows, fallback, images, labels, masks,
                                                             failures)
            if self.with_fields:   # (the rows kept: a fallback row that failed is dropped; copies of the slot's)
                indices = torch.from_numpy(slot.indices[kept].copy())
                is_pad = torch.from_numpy(slot.pad[kept].astype(bool))
            else:
                indices = is_pad = _NONE
            if images.data_ptr() == slot.address:
                self._watch(k, images, labels, *(() if masks is None else (masks,)))
            else:   # a new tensor (a fallback dropped): the slot is free once the copies queued so far have run
                self._give_back(k)
            batch = Batch(images, labels, indices, is_pad, {} if masks is None else {self._mask[0]: masks}, None,
                          number)
            self._python[0] += time.perf_counter() - start
            self._python[1] += 1
            return batch

    def _detection_batch(self, k: int, slot: "_Slot", epoch: int, number: int, rows: int, fallback: list | None,
                         failures: Failures) -> Batch | None:
        """A detection batch: views of the slot's image rows and targets (`engine.native_boxes.SlotViews`), the
        fallback rows filled by the Python pipeline (new tensors then); None when every row failed there."""
        det, views = self._det, slot.views
        shapes = views.shapes(rows)
        chain = self.chain
        images = views.images(rows, shapes, det, chain.layout, chain.layout == "NCHW", 3)
        fields = views.fields(rows, det) if self.with_fields else {}
        labels = slot.labels[:rows]
        kept = None
        if fallback:
            images, labels, fields, kept = self._complete_detection(k, epoch, number, rows, fallback, images, labels,
                                                                    fields, failures)
            if kept is None:
                return None
        if self.with_fields:
            at = slice(0, rows) if kept is None else kept   # (copies of the slot's)
            indices = torch.from_numpy(slot.indices[at].copy())
            is_pad = torch.from_numpy(slot.pad[at].astype(bool))
        else:
            indices = is_pad = _NONE
        if kept is None:
            handed = [*(images if isinstance(images, list) else [images]), labels, *fields.values()]
            # (which of the slot's tensors each views: the rows, the labels, the targets, the host staging)
            storage = [0] * (len(handed) - 1 - len(fields)) + [1] + [3 if stays_on_host(name) else 2
                                                                       for name in fields]
            self._watch(k, *handed, storage=storage)
        else:   # new tensors: the slot is free once the copies queued so far have run
            self._give_back(k)
        return Batch(images, labels, indices, is_pad, fields, None, number)

    def _complete_detection(self, k: int, epoch: int, number: int, rows: int, fallback: list[tuple[int, int]],
                            images: Any, labels: torch.Tensor, fields: dict, failures: Failures):
        """`_complete` for a detection batch: the fallback rows' images, boxes and fields from the Python pipeline,
        merged the Python engine's way (`engine.native_boxes.merged`). Returns the images, labels, fields and rows
        kept (None: none)."""
        from .engine.native_boxes import merged
        done, filled, at = self._run_fallback(k, epoch, number, fallback, failures)
        with self._on_device():
            if self._cuda and done is not None and done.ready is not None:   # (made on the pipeline's stream)
                torch.cuda.current_stream(self.device).wait_event(done.ready)
            dropped = sorted(set(at.tolist()) - set(filled))
            if len(dropped) == rows:
                self._give_back(k)
                return None, None, None, None
            chain = self.chain
            images, fields, kept = merged(self._det, rows, filled, dropped, images, fields,
                                          done.images if done is not None else [],
                                          done.fields if done is not None else {}, self._det.fill, self.device,
                                          chain.layout, chain.layout == "NCHW")
            labels = labels[torch.from_numpy(kept).to(labels.device)] if dropped else labels.clone()
        return images, labels, fields, kept

    def _notes(self, notes: list, failures: Failures, rows: int) -> list[tuple[int, int]]:
        """Count the batch's read failures and CRC mismatches against ``failures`` (raising its typed error where the
        budget says) and its ``rows`` by decode path (the stats'), and return its fallbacks, (dataset index, row)."""
        fallback = []
        source = self.pipeline.source
        table = self.chain.table
        host = 0
        for index, row, stage, code, status in notes:
            if stage == ENGINE.NOTE_FALLBACK:
                self.fallbacks[FALLBACK_REASONS.get(code, str(code))] += 1
                fallback.append((index, row))
                continue
            if stage == ENGINE.NOTE_HOST:   # an image decoded on the host (a PNG, a JPEG the GPU path leaves)
                host += 1
                continue
            path, offset = table.paths[int(table.files[index])], int(table.offsets[index])
            named = index if table.index_names is None else table.index_names(index)
            if stage == ENGINE.NOTE_CORRUPT and table.record_crc:   # code: which of the record's CRCs failed
                err = tfrecord.crc_error("length" if code == 1 else "data", path=path, index=named, offset=offset)
            elif stage == ENGINE.NOTE_CORRUPT:   # code: the CRC32C of the bytes read; status: the one written
                err = checks.mismatch_error(code, status, int(table.sizes[index]), path=path, index=named,
                                            offset=offset)
                if table.kind == "pixels":   # (named as the raw reader names a field's mismatch)
                    err = CorruptRecordError(f"field 'image': {str(err).split(': ', 1)[1]}", path=path, index=named,
                                             offset=offset)
            elif code < 0:
                err = io.read_error(Location(path, offset), OSError(-code, os.strerror(-code)))
            else:
                err = io.short_read(code, status, path, offset)
            failures.add(source.name(index), "read", err)
        if not self.dry:
            self._paths[0][0] += rows - len(fallback) - host
            self._paths[1][0] += len(fallback)
            self._paths[2][0] += host
        return fallback

    def _complete(self, k: int, epoch: int, number: int, rows: int, fallback: list[tuple[int, int]],
                  images: torch.Tensor, labels: torch.Tensor, masks: torch.Tensor | None, failures: Failures):
        """Fill the fallback rows through a Python pipeline decoding on the CPU: the same reads, probes, draws and
        ops for those samples (and masks: its decode stage decodes them, or fails the sample with the error the
        Python engine gives); rows whose sample fails there are dropped (the batch is then a new tensor). Returns
        the images, labels, masks and the rows kept."""
        done, filled, at = self._run_fallback(k, epoch, number, fallback, failures)
        with self._on_device():
            if filled:
                if self._cuda:   # (made on the fallback pipeline's stream, read on this one)
                    stream = torch.cuda.current_stream(self.device)
                    made = [done.images, done.labels] + ([done.fields[self._mask[0]]] if masks is not None else [])
                    for t in made:
                        if isinstance(t, torch.Tensor):
                            t.record_stream(stream)
                where = torch.tensor(filled, dtype=torch.long, device=self.device)
                images[where] = done.images
                labels[where] = done.labels
                if masks is not None:
                    masks[where] = self._fallback_masks(done, done.indices.tolist())
            dropped = sorted(set(at.tolist()) - set(filled))
            kept = np.array(sorted(set(range(rows)) - set(dropped)), np.int64)
            if dropped:
                keep = torch.from_numpy(kept).to(self.device)
                images, labels = images[keep], labels[keep]
                masks = None if masks is None else masks[keep]
        return images, labels, masks, kept

    def _run_fallback(self, k: int, epoch: int, number: int, fallback: list[tuple[int, int]], failures: Failures
                      ) -> tuple[Batch | None, list[int], np.ndarray]:
        """The fallback rows' samples through the Python pipeline decoding on the CPU (the same reads, probes, draws
        and ops): its batch (None: every sample failed), the rows of the samples that came back in their order (a
        failed sample is left out of it), and every fallback row."""
        index = np.array([i for i, _ in fallback], np.int64)
        at = np.array([r for _, r in fallback], np.int64)
        pad = self._slots[k].pad[at].astype(bool)
        plan = BatchPlan(epoch, number, index, pad,
                         np.random.SeedSequence([self.sampler.seed, epoch, self.sampler.shard_id, number]),
                         self.sampler.seed)
        pipe = self._fallback_pipeline()
        pipe.start_epoch(failures)
        with self._on_device():
            done = pipe.run(plan)
        got = [] if done is None else done.indices.tolist()
        by_index: dict[int, list[int]] = {}
        for i, r in fallback:
            by_index.setdefault(i, []).append(r)
        return done, [by_index[i].pop(0) for i in got], at

    def _fallback_masks(self, done: Batch, indices: list[int]) -> torch.Tensor:
        """The fallback pipeline's masks for its rows, as the slot's (uint8 at the output size); a mask of other
        values (16-bit) is a DecodeError naming the sample: the engine's mask output is uint8."""
        got = done.fields[self._mask[0]]
        if isinstance(got, torch.Tensor) and got.dtype == torch.uint8:
            return got.to(self.device)
        from .errors import DecodeError
        bad = next((i for i, m in zip(indices, got) if m.dtype != torch.uint8), indices[0])
        raise DecodeError(f"mask {self._mask[0]!r} holds 16-bit values, which the native engine's uint8 masks cannot "
                          "hold: run this source with engine='python'", path=self.pipeline.source.name(bad))

    def _on_device(self) -> contextlib.AbstractContextManager:
        return torch.cuda.device(self.device) if self._cuda else contextlib.nullcontext()

    def _fallback_pipeline(self) -> Pipeline:
        if self._fallback is None:
            p = self.pipeline
            self._fallback = Pipeline(p.source, ops=p.ops, device=p.device, decode="cpu")
            if self._det is not None:   # (its boxes and fields make the rows' targets)
                self._fallback.deliver(None, with_fields=True)
            elif self._mask is None:   # (a fallback row's other fields are not collated)
                self._fallback.deliver(None, with_fields=False)
        return self._fallback

    # -- the rest ----------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The engine's counts, why samples fell back, how many output tensors were made and where each batch's
        time went: ``stage_ms`` (the mean per batch) and ``first_stage_ms`` (each of the first 64 batches), per
        stage of the reader thread ("reader_wait_job": for a free job and the GPU's last read of its host
        arenas, "read", "prepare": parse, header scan, plan and host decodes, "reader_wait_queue") and of the
        decode thread ("decoder_wait_batch": for a read batch, "wait_arena": for a device arena the kernel has
        read, "decode": nvImageCodec's call, "wait_slot": for an output slot the consumer gave back, "output":
        packing, uploads and launches). A loader that keeps the training waiting is bound by the stage whose
        wait the others show: a decode thread waiting for batches points at the reader, a reader waiting for jobs
        at the decode thread, a decode thread waiting for slots at the consumer."""
        seconds, batches = self._python
        own = {"fallbacks": dict(self.fallbacks), "outputs_made": self.outputs_made,
               # the training thread's time per batch in __next__ besides the engine's wait (drops not included)
               "python_ms_per_batch": round(1e3 * seconds / max(batches, 1), 4)}
        if self._closed:
            return own
        counts = self._engine.stats()
        counts["stage_ms"] = {k: round(v, 3) for k, v in counts["stage_ms"].items()}
        counts["first_stage_ms"] = {k: [round(t, 3) for t in v] for k, v in counts["first_stage_ms"].items()}
        handed = max(counts["handed"], 1)
        own["engine_gil_us_per_batch"] = round(counts["gil_ns"] / handed / 1e3, 2)   # next() and release()
        return {**counts, **own}

    def close(self) -> None:
        """Stop and join the engine's threads; the slots the user holds stay theirs."""
        if self._closed:
            return
        self._closed = True
        from .engine import CLOSE_AT_EXIT
        CLOSE_AT_EXIT.discard(self)
        if self._pid != os.getpid():
            return
        self._engine.close()
        if self._host is not None:
            self._host.close()
            self._host = None
        if self._fallback is not None:
            self._fallback.close()
            self._fallback = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


_NONE = torch.zeros(0, dtype=torch.int64)


@dataclass
class DryBatch:
    """A dry run's batch: per row, the engine's columns (``ingest._engine``'s dry layout: index, label, status
    (0 GPU path, 1 fallback), probed height and width, plan region, decode region, output height and width, pad)."""

    rows: np.ndarray
    number: int
    epoch: int
    notes: list | None

    COLUMNS = ("index", "label", "status", "h", "w", "rx0", "ry0", "rx1", "ry1", "dx0", "dy0", "dx1", "dy1",
               "out_h", "out_w", "pad")

    def column(self, name: str) -> np.ndarray:
        return self.rows[:, self.COLUMNS.index(name)]

