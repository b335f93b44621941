"""A ctypes binding to nvImageCodec's C API (``libnvimgcodec.so.0``) for batched decoding into caller memory.

Why not the Python binding: it releases the GIL once or more per image (code stream parse, image info, image
wrapper), and beside any busy Python thread every re-acquire waits a switch interval, so a batch's decode
grows with its image count times that interval beside a training loop (see docs/measurements.md, The GIL).
Here the per-image calls (code stream,
region view, image wrapper) go through :class:`ctypes.PyDLL`, which keeps the GIL: each is a few microseconds of
native work. Only the batch decode goes through :class:`ctypes.CDLL`, which releases it: one GIL hand-off per
batch, whatever its size. The wait for its future keeps the GIL: nvimgcodecDecoderDecode returns once the
host side of the batch is done, so the wait is short, and every release costs up to a switch interval beside
a busy Python thread. Nothing calls back into Python (no debug messenger callback), so
holding the GIL in a native call can never deadlock with nvImageCodec's threads.

Contract:

- :func:`load` finds the library (the ``nvidia-nvimgcodec-cu13`` wheel's copy, found without importing its Python
  module, else the system's), checks its version against :data:`SUPPORTED` and creates one process-wide instance.
  Anything wrong raises :class:`Unavailable` (an ImportError) saying what, so callers can fall back.
- The structs below mirror ``nvimgcodec.h`` of nvImageCodec 0.9 (every struct starts with ``struct_type``,
  ``struct_size``, ``struct_next``; the library checks type and size of each). Other versions are refused: a
  changed layout would be read as garbage. ``tests/test_nvimgcodec_native.py`` compiles the header and compares
  sizes, offsets and enum values.
- nvImageCodec's own log lines are off: the instance is created without a debug messenger; what its extensions
  print while loading is captured (`captured_stderr`) and logged at DEBUG on the ``ingest`` logger. What they would
  have said reaches the caller as each image's processing status (:data:`STATUS_NAMES`).
- :class:`BatchDecoder` decodes a batch of host-memory JPEG, JPEG 2000 and TIFF buffers (optionally only a region of each) as
  interleaved 8-bit RGB into buffers the caller owns (device or host), ordered on the caller's CUDA stream.
  One BatchDecoder is used by one thread at a time; its handles are reused from batch to batch.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import sys
import tempfile
from ctypes import POINTER, Structure, Union, c_char, c_float, c_int, c_size_t, c_uint8, c_uint32, c_void_p
from typing import Sequence

import numpy as np

from .._numpy import zeros
from ._wheels import first_file, package_folders

#: nvImageCodec versions (major * 1000 + minor * 100 + patch, as nvimgcodecGetProperties reports them) whose
#: struct layouts this module mirrors: 0.9.x.
SUPPORTED = range(900, 1000)
SONAME = "libnvimgcodec.so.0"

# nvimgcodecStructureType_t
ST_PROPERTIES = 1
ST_INSTANCE_CREATE_INFO = 2
ST_DECODE_PARAMS = 5
ST_ORIENTATION = 7
ST_REGION = 8
ST_CODE_STREAM_VIEW = 9
ST_CODE_STREAM_INFO = 10
ST_IMAGE_INFO = 11
ST_IMAGE_PLANE_INFO = 12
ST_BACKEND = 17
ST_BACKEND_PARAMS = 29
ST_EXECUTION_PARAMS = 30

SAMPLE_UINT8 = 0x0802
SAMPLING_NONE = 0
SAMPLEFORMAT_I_RGB = 8
COLORSPEC_SRGB = 1
BUFFER_STRIDED_DEVICE = 1
BUFFER_STRIDED_HOST = 2
DEVICE_CPU_ONLY = -99999
LOAD_HINT_FIXED = 2

#: nvimgcodecBackendKind_t by name.
BACKEND_KINDS = {"CPU_ONLY": 1, "GPU_ONLY": 2, "HYBRID_CPU_GPU": 3, "HW_GPU_ONLY": 4}

#: nvimgcodecStatus_t (what a call returns) by value.
CALL_STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 2: "INVALID_PARAMETER", 3: "BAD_CODESTREAM",
               4: "CODESTREAM_UNSUPPORTED", 5: "ALLOCATOR_FAILURE", 6: "EXECUTION_FAILED", 7: "ARCH_MISMATCH",
               8: "INTERNAL_ERROR", 9: "IMPLEMENTATION_UNSUPPORTED", 10: "MISSED_DEPENDENCIES"}

PROCESSING_SUCCESS = 0x1
#: nvimgcodecProcessingStatus bits by value: why an image was not decoded.
STATUS_NAMES = {0x0: "UNKNOWN", 0x2: "SATURATED", 0x3: "FAIL", 0x7: "IMAGE_CORRUPTED", 0xB: "CODEC_UNSUPPORTED",
                0x13: "BACKEND_UNSUPPORTED", 0x23: "ENCODING_UNSUPPORTED", 0x43: "RESOLUTION_UNSUPPORTED",
                0x83: "CODESTREAM_UNSUPPORTED", 0x5: "COLOR_SPEC_UNSUPPORTED", 0x9: "ORIENTATION_UNSUPPORTED",
                0x11: "ROI_UNSUPPORTED", 0x21: "SAMPLING_UNSUPPORTED", 0x41: "SAMPLE_TYPE_UNSUPPORTED",
                0x81: "SAMPLE_FORMAT_UNSUPPORTED", 0x101: "NUM_IMAGES_UNSUPPORTED",
                0x201: "NUM_PLANES_UNSUPPORTED", 0x401: "NUM_CHANNELS_UNSUPPORTED"}

#: nvImageCodec codec names decoded here (``ing_nv_routed`` in ``_native/nvloop.h``); others are OUT_NOT_JPEG.
ROUTED = (b"jpeg", b"jpeg2k", b"tiff")

#: Per-image codes of a batch besides the processing status (bit 0x1: decoded), as ``_nvloop.c`` writes them:
#: a parse step failed (| its call status), none of the :data:`ROUTED` codecs, the batch decode call failed
#: (| its call status).
OUT_PARSE, OUT_NOT_JPEG, OUT_DECODE = 0x10000, 0x20000, 0x40000

try:  # the compiled loop (setup.py builds it where a C compiler is found); None: the ctypes loop runs instead
    from ingest.decode import _nvloop as LOOP
except ImportError:
    LOOP = None

MAX_NUM_DIM = 5
MAX_ROI_FILL_CHANNELS = 5
MAX_NUM_PLANES = 32
MAX_CODEC_NAME_SIZE = 256


class Unavailable(ImportError):
    """The native decoder cannot be used here (no library, unsupported version, instance creation failed)."""


# -- struct layouts (nvimgcodec.h, 0.9) ---------------------------------------------------------------------------

def _header() -> list[tuple[str, type]]:
    return [("struct_type", c_int), ("struct_size", c_size_t), ("struct_next", c_void_p)]


class Properties(Structure):
    _fields_ = _header() + [("version", c_uint32), ("cudart_version", c_uint32)]


class InstanceCreateInfo(Structure):
    _fields_ = _header() + [
        ("load_builtin_modules", c_int), ("load_extension_modules", c_int),
        ("extension_modules_path", ctypes.c_char_p), ("create_debug_messenger", c_int),
        ("debug_messenger_desc", c_void_p), ("message_severity", c_uint32), ("message_category", c_uint32)]


class Orientation(Structure):
    _fields_ = _header() + [("rotated", c_int), ("flip_x", c_int), ("flip_y", c_int)]


class ImagePlaneInfo(Structure):
    _fields_ = _header() + [
        ("width", c_uint32), ("height", c_uint32), ("row_stride", c_size_t), ("num_channels", c_uint32),
        ("sample_type", c_int), ("precision", c_uint8)]


class _SampleValue(Union):
    _fields_ = [("as_uint", c_uint32), ("as_int", c_int), ("as_float", c_float)]


class OutOfBoundsSample(Structure):
    _fields_ = [("value", _SampleValue), ("type", c_int)]


class Region(Structure):
    _fields_ = _header() + [
        ("ndim", c_int), ("start", c_int * MAX_NUM_DIM), ("end", c_int * MAX_NUM_DIM),
        ("out_of_bounds_policy", c_int), ("out_of_bounds_samples", OutOfBoundsSample * MAX_ROI_FILL_CHANNELS)]


class ImageInfo(Structure):
    _fields_ = _header() + [
        ("codec_name", c_char * MAX_CODEC_NAME_SIZE), ("color_spec", c_int), ("chroma_subsampling", c_int),
        ("sample_format", c_int), ("orientation", Orientation), ("num_planes", c_uint32),
        ("plane_info", ImagePlaneInfo * MAX_NUM_PLANES), ("buffer", c_void_p), ("buffer_kind", c_int),
        ("cuda_stream", c_void_p)]


class CodeStreamView(Structure):
    _fields_ = _header() + [("image_idx", c_size_t), ("region", Region), ("bitstream_offset", c_size_t)]


class CodeStreamInfo(Structure):
    _fields_ = _header() + [("code_stream_view", c_void_p), ("codec_name", c_char * MAX_CODEC_NAME_SIZE),
                            ("num_images", c_size_t), ("size", c_size_t)]


class DecodeParams(Structure):
    _fields_ = _header() + [("apply_exif_orientation", c_int)]


class BackendParams(Structure):
    _fields_ = _header() + [("load_hint", c_float), ("load_hint_policy", c_int)]


class Backend(Structure):
    _fields_ = _header() + [("kind", c_int), ("params", BackendParams)]


class ExecutionParams(Structure):
    _fields_ = _header() + [
        ("device_allocator", c_void_p), ("pinned_allocator", c_void_p), ("max_num_cpu_threads", c_int),
        ("executor", c_void_p), ("device_id", c_int), ("pre_init", c_int), ("skip_pre_sync", c_int),
        ("num_backends", c_int), ("backends", POINTER(Backend))]


#: Every mirrored struct with its structure type (None: nested only, no type of its own).
STRUCTS = {"nvimgcodecProperties_t": (Properties, ST_PROPERTIES),
           "nvimgcodecInstanceCreateInfo_t": (InstanceCreateInfo, ST_INSTANCE_CREATE_INFO),
           "nvimgcodecOrientation_t": (Orientation, ST_ORIENTATION),
           "nvimgcodecImagePlaneInfo_t": (ImagePlaneInfo, ST_IMAGE_PLANE_INFO),
           "nvimgcodecOutOfBoundsSample_t": (OutOfBoundsSample, None),
           "nvimgcodecRegion_t": (Region, ST_REGION),
           "nvimgcodecImageInfo_t": (ImageInfo, ST_IMAGE_INFO),
           "nvimgcodecCodeStreamView_t": (CodeStreamView, ST_CODE_STREAM_VIEW),
           "nvimgcodecCodeStreamInfo_t": (CodeStreamInfo, ST_CODE_STREAM_INFO),
           "nvimgcodecDecodeParams_t": (DecodeParams, ST_DECODE_PARAMS),
           "nvimgcodecBackendParams_t": (BackendParams, ST_BACKEND_PARAMS),
           "nvimgcodecBackend_t": (Backend, ST_BACKEND),
           "nvimgcodecExecutionParams_t": (ExecutionParams, ST_EXECUTION_PARAMS)}


def new(struct: type[Structure], **fields) -> Structure:
    """A zeroed ``struct`` with its type and size filled in (and any nested typed structs'), then ``fields``."""
    value = struct()
    _stamp(value)
    for name, field in fields.items():
        setattr(value, name, field)
    return value


_TYPES = {cls: st for cls, st in STRUCTS.values() if st is not None}


def _stamp(value: Structure) -> None:
    if type(value) in _TYPES:
        value.struct_type, value.struct_size = _TYPES[type(value)], ctypes.sizeof(value)
    for name, ftype in value._fields_:
        if issubclass(ftype, Structure):
            _stamp(getattr(value, name))
        elif issubclass(ftype, ctypes.Array) and issubclass(ftype._type_, Structure):
            for item in getattr(value, name):
                _stamp(item)


# -- the library ---------------------------------------------------------------------------------------------------

_VP, _SZ, _I = c_void_p, c_size_t, c_int
#: name: (argtypes, releases the GIL). Pointers travel as plain integers (addresses), the cheapest ctypes argument.
_FUNCTIONS = {
    "nvimgcodecGetProperties": ([_VP], False),
    "nvimgcodecInstanceCreate": ([_VP, _VP], True),
    "nvimgcodecDecoderCreate": ([_VP, _VP, _VP, ctypes.c_char_p], True),
    "nvimgcodecDecoderDestroy": ([_VP], True),
    "nvimgcodecCodeStreamCreateFromHostMem": ([_VP, _VP, _VP, _SZ, _VP], False),
    "nvimgcodecCodeStreamGetCodeStreamInfo": ([_VP, _VP], False),
    "nvimgcodecCodeStreamGetSubCodeStream": ([_VP, _VP, _VP], False),
    "nvimgcodecCodeStreamDestroy": ([_VP], False),
    "nvimgcodecImageCreate": ([_VP, _VP, _VP], False),
    "nvimgcodecImageDestroy": ([_VP], False),
    "nvimgcodecDecoderDecode": ([_VP, _VP, _VP, _I, _VP, _VP], True),
    "nvimgcodecFutureWaitForAll": ([_VP], False),
    "nvimgcodecFutureGetProcessingStatus": ([_VP, _VP, _VP], False),
    "nvimgcodecFutureDestroy": ([_VP], False),
}


class Library:
    """The loaded library: its functions (GIL kept or released as :data:`_FUNCTIONS` says), version, instance,
    and ``messages``: what its extensions printed while loading (e.g. "Failed to load nvjpeg2k library")."""

    def __init__(self, path: str):
        try:
            keep, release = ctypes.PyDLL(path), ctypes.CDLL(path)
        except OSError as err:
            raise Unavailable(f"cannot load nvImageCodec's C library {path}: {err}") from err
        self.path = path
        for name, (argtypes, releases) in _FUNCTIONS.items():
            fn = getattr(release if releases else keep, name)
            fn.argtypes, fn.restype = argtypes, c_int
            setattr(self, name.removeprefix("nvimgcodec"), fn)
        #: The addresses the compiled loop calls, in its FN_* order.
        self.loop_functions = tuple(ctypes.cast(getattr(keep, "nvimgcodec" + name), c_void_p).value for name in (
            "CodeStreamCreateFromHostMem", "CodeStreamGetCodeStreamInfo", "CodeStreamGetSubCodeStream",
            "ImageCreate", "DecoderDecode", "FutureWaitForAll", "FutureGetProcessingStatus", "FutureDestroy"))
        props = new(Properties)
        self._check(self.GetProperties(ctypes.addressof(props)), "nvimgcodecGetProperties")
        self.version = props.version
        if self.version not in SUPPORTED:
            raise Unavailable(f"nvImageCodec {version_string(self.version)} at {path} is not supported by the "
                              f"native decoder (its C structs are mirrored for {version_string(SUPPORTED.start)} "
                              f"to before {version_string(SUPPORTED.stop)})")
        info = new(InstanceCreateInfo, load_builtin_modules=1, load_extension_modules=1, create_debug_messenger=0)
        instance = c_void_p()
        with captured_stderr() as self.messages:
            status = self.InstanceCreate(ctypes.addressof(instance), ctypes.addressof(info))
        self._check(status, "nvimgcodecInstanceCreate")
        self.instance = instance.value

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise Unavailable(f"{what} failed: {CALL_STATUS.get(status, status)}")


@contextlib.contextmanager
def captured_stderr():
    """Collect what native code writes to file descriptor 2 meanwhile (nvImageCodec's extensions print their
    missing libraries there, bypassing its logger: ``[nvjpeg2k_ext] Failed to load ...``) into the yielded list
    of lines, instead of the console; each line is also logged at DEBUG on the ``ingest`` logger, so that only a
    user who turns that on sees them. Other threads' stderr output in that window is collected too: keep the
    window short."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield lines
            finally:
                os.dup2(saved, 2)
                sink.seek(0)
                lines += sink.read().decode(errors="replace").splitlines()
                for line in lines:
                    logging.getLogger("ingest").debug("nvImageCodec: %s", line)
    finally:
        os.close(saved)


def version_string(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"


def library_path() -> str:
    """The wheel's copy of the library (located without importing nvidia.nvimgcodec), else the bare soname."""
    found = first_file(folder / SONAME for folder in package_folders("nvidia.nvimgcodec"))
    return str(found) if found is not None else SONAME


@functools.cache
def load(path: str | None = None) -> Library:
    """The library at ``path`` (default :func:`library_path`), checked and with its instance; cached."""
    return Library(path or library_path())


# -- batched decode ------------------------------------------------------------------------------------------------

class BatchDecoder:
    """An nvImageCodec decoder on ``device_id`` (:data:`DEVICE_CPU_ONLY` for host output), restricted to
    ``backends`` (names of :data:`BACKEND_KINDS`, or (name, load hint) pairs: the share of a batch that backend
    takes, the rest going on to the next; None: all), created with the decoder ``options`` string, on
    ``cpu_threads`` threads of its own (0: one per core)."""

    def __init__(self, lib: Library, device_id: int, *, backends: Sequence[str] | None = None, options: str = "",
                 cpu_threads: int = 0):
        self.lib = lib
        self.buffer_kind = BUFFER_STRIDED_HOST if device_id == DEVICE_CPU_ONLY else BUFFER_STRIDED_DEVICE
        kinds = [(b, 1.0) if isinstance(b, str) else tuple(b) for b in backends or []]
        chosen = (Backend * max(1, len(kinds)))()
        for slot, (kind, load) in zip(chosen, kinds):
            _stamp(slot)
            slot.kind = BACKEND_KINDS[kind]
            slot.params.load_hint, slot.params.load_hint_policy = load, LOAD_HINT_FIXED
        params = new(ExecutionParams, device_id=device_id, num_backends=len(kinds),
                     backends=chosen if kinds else None, max_num_cpu_threads=cpu_threads)
        handle = c_void_p()
        with captured_stderr() as self.messages:
            status = lib.DecoderCreate(lib.instance, ctypes.addressof(handle), ctypes.addressof(params),
                                       options.encode())
        if status != 0:
            raise Unavailable(f"nvimgcodecDecoderCreate (device {device_id}, backends {kinds or 'all'}) failed: "
                              f"{CALL_STATUS.get(status, status)}")
        self.handle = handle.value
        self.params = new(DecodeParams, apply_exif_orientation=0)
        self._probe = new(CodeStreamInfo)
        self._capacity = 0
        self._reserve(64)

    def _reserve(self, n: int) -> None:
        """Room for ``n`` images: handle slots (kept, so handles are reused) and the per-image structs."""
        if n <= self._capacity:
            return
        old = self._capacity
        cap = max(n, 2 * old)
        slots = {name: np.zeros(cap, np.uint64) for name in ("parents", "subs", "images")}
        if old:
            for name, arr in slots.items():
                arr[:old] = getattr(self, "_" + name)
        self._parents, self._subs, self._images = slots["parents"], slots["subs"], slots["images"]
        self._infos = (ImageInfo * cap)()
        self._views = (CodeStreamView * cap)()
        for info, view in zip(self._infos, self._views):
            _stamp(info)
            _stamp(view)
            info.color_spec, info.chroma_subsampling, info.sample_format = COLORSPEC_SRGB, SAMPLING_NONE, \
                SAMPLEFORMAT_I_RGB
            info.num_planes, info.buffer_kind = 1, self.buffer_kind
            plane = info.plane_info[0]
            plane.num_channels, plane.sample_type = 3, SAMPLE_UINT8  # precision 0: the type's full range
            view.region.ndim = 2
        plane = ImageInfo.plane_info.offset
        self._buffer = _column(self._infos, ImageInfo.buffer.offset, np.uint64)
        self._stream = _column(self._infos, ImageInfo.cuda_stream.offset, np.uint64)
        self._height = _column(self._infos, plane + ImagePlaneInfo.height.offset, np.uint32)
        self._width = _column(self._infos, plane + ImagePlaneInfo.width.offset, np.uint32)
        self._stride = _column(self._infos, plane + ImagePlaneInfo.row_stride.offset, np.uint64)
        self._capacity = cap

    def submit(self, datas: Sequence, regions: np.ndarray, heights: np.ndarray, widths: np.ndarray,
               outputs: np.ndarray, cuda_stream: int) -> "Pending":
        """Start decoding ``datas[i]`` (bytes-like, host memory, alive until :meth:`Pending.wait` returns) into
        ``outputs[i]`` (an address) as ``heights[i]`` x ``widths[i]`` RGB rows of ``widths[i] * 3`` bytes.
        ``regions`` ([n, 4] int32, x0 y0 x1 y1) decodes only that part of an image (its size is then the
        region's); a row with x1 <= x0 decodes the whole image. The pixels are ready in order on
        ``cuda_stream`` once :meth:`Pending.wait` has returned.

        With the compiled loop (:data:`LOOP`) the whole batch is decoded here, the GIL released once; without
        it each image's native calls go through ctypes, keeping the GIL, and only the decode call releases it."""
        n = len(datas)
        self._reserve(n)
        self._buffer[:n], self._stream[:n] = outputs, cuda_stream
        self._height[:n], self._width[:n], self._stride[:n] = heights, widths, np.asarray(widths) * 3
        regions = np.ascontiguousarray(regions, dtype=np.int32).reshape(n, 4)
        out = zeros(n, np.uint32)
        if LOOP is not None and n:
            region = CodeStreamView.region.offset
            LOOP.decode(self.lib.loop_functions, self.lib.instance, self.handle, ctypes.addressof(self.params),
                        datas, regions, (self._parents.ctypes.data, self._subs.ctypes.data, self._images.ctypes.data),
                        (ctypes.addressof(self._infos), ctypes.sizeof(ImageInfo)),
                        (ctypes.addressof(self._views), ctypes.sizeof(CodeStreamView),
                         region + Region.start.offset, region + Region.end.offset),
                        (ctypes.addressof(self._probe), CodeStreamInfo.codec_name.offset), out)
            return Pending(self.lib, out)
        return Pending(self.lib, out, *self._prepare(datas, regions, out))

    def _prepare(self, datas: Sequence, regions: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, int, int]:
        """The ctypes loop: each image's code stream, region view and image wrapper (``out`` marks those
        that fail), then the batch decode call started. Returns the indices of the images in that call, the
        call's status and its future (0: none)."""
        lib, inst, n = self.lib, self.lib.instance, len(datas)
        parents, subs = self._parents.ctypes.data, self._subs.ctypes.data
        images, infos = self._images.ctypes.data, ctypes.addressof(self._infos)
        views, isz, vsz = ctypes.addressof(self._views), ctypes.sizeof(ImageInfo), ctypes.sizeof(CodeStreamView)
        use_sub = regions[:, 2] > regions[:, 0]
        probe = ctypes.addressof(self._probe)
        for i, data in enumerate(datas):
            address, length = _address(data)
            status = lib.CodeStreamCreateFromHostMem(inst, parents + 8 * i, address, length, None)
            if status == 0:  # parse now: one stream no parser takes would fail the whole batch's decode call
                status = lib.CodeStreamGetCodeStreamInfo(int(self._parents[i]), probe)
                if status == 0 and self._probe.codec_name not in ROUTED:
                    out[i] = OUT_NOT_JPEG
                    continue
            if status == 0 and use_sub[i]:
                x0, y0, x1, y1 = regions[i].tolist()
                view = self._views[i].region
                view.start[0], view.start[1], view.end[0], view.end[1] = y0, x0, y1, x1
                status = lib.CodeStreamGetSubCodeStream(int(self._parents[i]), subs + 8 * i, views + vsz * i)
            if status == 0:
                status = lib.ImageCreate(inst, images + 8 * i, infos + isz * i)
            if status != 0:
                out[i] = OUT_PARSE | status
        picked = np.flatnonzero(out == 0)
        streams = np.ascontiguousarray(np.where(use_sub, self._subs[:n], self._parents[:n])[picked])
        chosen = np.ascontiguousarray(self._images[:n][picked])
        future, call = c_void_p(), 0
        if len(picked):
            call = lib.DecoderDecode(self.handle, streams.ctypes.data, chosen.ctypes.data, len(picked),
                                     ctypes.addressof(self.params), ctypes.addressof(future))
        return picked, call, future.value or 0

    def close(self) -> None:
        """Destroy every handle (images, region streams, streams, the decoder). Not thread-safe with submit."""
        lib = self.lib
        for arr, destroy in ((self._images, lib.ImageDestroy), (self._subs, lib.CodeStreamDestroy),
                             (self._parents, lib.CodeStreamDestroy)):
            for handle in arr[arr != 0]:
                destroy(int(handle))
            arr[:] = 0
        if self.handle:
            lib.DecoderDestroy(self.handle)
            self.handle = None


class Pending:
    """A submitted batch: :meth:`wait` (once) returns, per image, None if decoded or the reason it was not."""

    def __init__(self, lib: Library, out: np.ndarray, picked: np.ndarray | None = None, call: int = 0,
                 future: int = 0):
        # out: per-image codes; with the ctypes loop, the images in the running decode call, its status, future
        self._lib, self._out, self._picked, self._call, self._future = lib, out, picked, call, future

    def wait(self) -> list[str | None]:
        out, picked, call = self._out, self._picked, self._call
        if picked is not None and len(picked):  # the ctypes loop: the decode call is still running
            statuses = np.zeros(len(picked), np.uint32)
            if self._future:
                self._lib.FutureWaitForAll(self._future)
                if call == 0:
                    size = c_size_t(len(statuses))
                    self._lib.FutureGetProcessingStatus(self._future, statuses.ctypes.data, ctypes.addressof(size))
                self._lib.FutureDestroy(self._future)
            out[picked] = statuses if call == 0 else OUT_DECODE | call
        return reasons(out)


def reasons(out: np.ndarray) -> list[str | None]:
    """Per image: None where ``out`` (the loop's codes, see ``_nvloop.c``) says decoded, else why not."""
    why: list[str | None] = [None] * len(out)
    for k in np.flatnonzero(out != PROCESSING_SUCCESS).tolist():
        code = int(out[k])
        if code == OUT_NOT_JPEG:
            why[k] = "NOT_JPEG"
        elif code & OUT_PARSE:
            why[k] = "PARSE_" + CALL_STATUS.get(code & 0xFFFF, str(code & 0xFFFF))
        elif code & OUT_DECODE:
            why[k] = "DECODE_" + CALL_STATUS.get(code & 0xFFFF, str(code & 0xFFFF))
        else:
            why[k] = STATUS_NAMES.get(code, f"STATUS_{code:#x}")
    return why


def _column(array: ctypes.Array, offset: int, dtype: type) -> np.ndarray:
    """One field of every struct in ``array`` as a writable numpy view (fields are set per batch in one go)."""
    item = ctypes.sizeof(array._type_)
    return np.ndarray((len(array),), dtype, buffer=array, offset=offset, strides=(item,))


def _address(data) -> tuple[int | bytes, int]:
    """What to pass as a ``const unsigned char*`` for ``data`` without copying it, and its length in bytes."""
    if isinstance(data, bytes):
        return data, len(data)  # ctypes passes a bytes object's own buffer for a void* argument
    if isinstance(data, np.ndarray):
        return data.ctypes.data, data.nbytes
    array = np.frombuffer(data, np.uint8)
    return array.ctypes.data, array.nbytes
