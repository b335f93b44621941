"""JPEG 2000 on the GPU through nvJPEG2000 itself (ctypes): only the tiles a crop touches, at a reduced resolution.

A JPEG 2000 codestream holds each tile as a wavelet pyramid, so an image can be decoded at resolution level r
(each side divided by 2^r) without decoding the levels above it. When the ops downscale a crop by at least
2^r, the crop decoded at level r still has at least the output's pixels, and the levels above need not be
decoded (how much nvJPEG2000 saves by that depends on the depth: :data:`AUTO_LEVEL`).
nvImageCodec 0.9 decodes JPEG 2000 only at full resolution; this module calls ``nvjpeg2kDecodeTile`` with the
number of resolutions to decode. `ingest.decode.gpu.GpuDecoder` sends it the crops that allow :data:`AUTO_LEVEL`
levels or more (the ``jpeg2k_decoder`` setting's "auto"), or every crop a level applies to ("nvjpeg2k");
whatever it declines goes the nvImageCodec way.

Rules:

- **Level** (:func:`choose_level`): the largest r with 2^r at most the warp's smallest step (source pixels per
  output pixel, :func:`warp_steps`), capped by the decomposition levels of every tile decoded (resolutions - 1).
  No warp, no reduction.
- **Region** (:func:`plan_region`): every tile the crop's region intersects, decoded into one buffer laid out
  on the reduced grid: tile t at level r spans ``ceil(tx0 / 2^r) .. ceil(tx1 / 2^r)`` on the reference grid
  (ISO/IEC 15444-1, B.5), so neighbouring tiles abut exactly.
- **Geometry**: reduced sample u lies on reference-grid sample ``u * 2^r`` (the low-pass band keeps the even
  samples of each level), so the decoded image is the source sampled every 2^r pixels. Its ``scale`` is
  ``2^-r`` on both axes and its ``origin`` the source coordinate (fractional, in full-resolution pixels) that
  maps to its corner: a source coordinate x is ``(x - origin) * scale`` in it (`ingest.ops.affine.Warp.shifted`,
  then ``rescaled``).
- **Output**: ``[H, W, 3]`` uint8 RGB on the caller's stream. Gray is repeated; 3 components are RGB after the
  codestream's inverse multi-component transform (nvJPEG2000 applies it) or, in a JP2 file declaring sYCC,
  after nvJPEG2000's sYCC to RGB conversion. Samples of more than 8 bits keep their 8 most significant bits
  (``>> (precision - 8)``), as `ingest.decode.codecs.finish` does on the CPU.
- **Declined** (None, the reason counted in :attr:`Decoder.declined`): 2 or 4+ components, subsampled or
  signed components, more than 16 bits, an image or tile offset (nvJPEG2000's documentation requires both to be
  0), a JP2 palette, channel definition or ICC profile, a codestream that does not end with EOC (cut short: the
  CPU decoder refuses it, naming the file), a tile whose size nvJPEG2000 reports differently
  from the reduced-grid formula (its buffer would not be the one allocated), and a region with a tile that has no
  sample at the level chosen (a tile, or its part inside the image at an edge, narrower than 2^level can reduce
  to none).

Errors: a status other than success from any call is a :class:`Failed` (a :class:`~ingest.errors.DecodeError`)
naming the file and the call, its ``why`` the status's name. Without the library (or a GPU) :func:`load` raises
:class:`Unavailable` with the reason; importing this module never fails for that.

Threads: the library handle is shared (the GPU decoder decodes a batch's JPEG 2000 images on a few threads at
once, so that their host stages run side by side); nvJPEG2000's decode states and bitstream handles may not be,
so each thread that decodes gets its own (:data:`SLOTS` of them, used in turn). A decode state is reused only after the
host has seen the event recorded after its last tile: nvJPEG2000 stages a tile's data in the state's own
buffers, so a state queued again before its last tile ran would overwrite that tile's input. The tiles of one
image therefore take turns over :data:`TILE_STATES` states of their slot, each waited for before its next tile.
"""

from __future__ import annotations

import ctypes
import functools
import math
import struct
import threading
from collections import Counter
from ctypes import POINTER, Structure, byref, c_int, c_int32, c_size_t, c_uint8, c_uint32, c_void_p
from typing import Any, NamedTuple

import numpy as np

from ingest import defaults
from ingest._driver import recorded, wait_for
from ingest.decode import codecs
from ingest.decode.codecs import Siz, read_siz
from ingest.decode._wheels import first_file, package_folders
from ingest.errors import DecodeError

SONAME = "libnvjpeg2k.so.0"
#: nvJPEG2000 objects (decode state, bitstream, parameters) each decoding thread keeps, used in turn: a second
#: image parses and queues while the first one's GPU work runs.
SLOTS = 2
#: Decode states a slot's tiles take turns over: the host queues one tile while the GPU decodes the last.
TILE_STATES = 2
#: The fewest levels a crop must allow before the ``jpeg2k_decoder`` setting's "auto" sends it here. One or two
#: levels down nvJPEG2000 spends about its full-resolution time on a tile, so nvImageCodec's decode of the crop's
#: code blocks alone costs less; from three levels down whole tiles at the level cost less (docs/design.md).
AUTO_LEVEL = 3

# -- nvjpeg2k.h (0.11) ------------------------------------------------------------------------------------------

STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 2: "INVALID_PARAMETER", 3: "BAD_JPEG", 4: "JPEG_NOT_SUPPORTED",
          5: "ALLOCATOR_FAILURE", 6: "EXECUTION_FAILED", 7: "ARCH_MISMATCH", 8: "INTERNAL_ERROR",
          9: "IMPLEMENTATION_NOT_SUPPORTED"}
UINT8, UINT16 = 0, 1                       # nvjpeg2kImageType_t
COLORSPACE_NOT_SUPPORTED, COLORSPACE_SYCC = -1, 3   # nvjpeg2kColorSpace_t
JP2_SYCC = 18                              # the JP2 ``colr`` box's enumerated sYCC


class ImageInfo(Structure):
    _fields_ = [("image_width", c_uint32), ("image_height", c_uint32), ("tile_width", c_uint32),
                ("tile_height", c_uint32), ("num_tiles_x", c_uint32), ("num_tiles_y", c_uint32),
                ("num_components", c_uint32)]


class ComponentInfo(Structure):
    _fields_ = [("component_width", c_uint32), ("component_height", c_uint32), ("precision", c_uint8),
                ("sgn", c_uint8)]


class Image(Structure):
    _fields_ = [("pixel_data", POINTER(c_void_p)), ("pitch_in_bytes", POINTER(c_size_t)), ("pixel_type", c_int),
                ("num_components", c_uint32)]


_P = POINTER(c_void_p)
_U = POINTER(c_uint32)
#: name: argument types; every function returns nvjpeg2kStatus_t (an int).
_SIGNATURES = {
    "nvjpeg2kCreateSimple": [_P],
    "nvjpeg2kDestroy": [c_void_p],
    "nvjpeg2kSetDeviceMemoryPadding": [c_size_t, c_void_p],
    "nvjpeg2kDecodeStateCreate": [c_void_p, _P],
    "nvjpeg2kDecodeStateDestroy": [c_void_p],
    "nvjpeg2kStreamCreate": [_P],
    "nvjpeg2kStreamDestroy": [c_void_p],
    "nvjpeg2kStreamParse": [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p],
    "nvjpeg2kStreamGetImageInfo": [c_void_p, POINTER(ImageInfo)],
    "nvjpeg2kStreamGetImageComponentInfo": [c_void_p, POINTER(ComponentInfo), c_uint32],
    "nvjpeg2kStreamGetResolutionsInTile": [c_void_p, c_uint32, _U],
    "nvjpeg2kStreamGetResolutionComponentDim": [c_void_p, c_uint32, c_uint32, c_uint32, _U, _U],
    "nvjpeg2kStreamGetColorSpace": [c_void_p, POINTER(c_int)],
    "nvjpeg2kDecodeParamsCreate": [_P],
    "nvjpeg2kDecodeParamsDestroy": [c_void_p],
    "nvjpeg2kDecodeParamsSetRGBOutput": [c_void_p, c_int32],
    "nvjpeg2kDecodeTile": [c_void_p, c_void_p, c_void_p, c_void_p, c_uint32, c_uint32, POINTER(Image), c_void_p],
}


class Unavailable(ImportError):
    """nvJPEG2000 cannot be used here (no library, a library without a needed call, no GPU to create it on)."""


class Library:
    """libnvjpeg2k loaded with the calls above typed (``lib.call(name, *args)`` returns the status)."""

    def __init__(self, path: str):
        try:
            self.dll = ctypes.CDLL(path)   # CDLL: the GIL is given up during each call (tier-2 runs on the host)
        except OSError as err:
            raise Unavailable(f"cannot load {path}: {err}") from err
        for name, argtypes in _SIGNATURES.items():
            try:
                fn = getattr(self.dll, name)
            except AttributeError as err:
                raise Unavailable(f"{path} has no {name}") from err
            fn.argtypes, fn.restype = argtypes, c_int
        self.path = path

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dll, name)


def library_path() -> str:
    """The nvidia-nvjpeg2k wheel's copy (``nvidia/nvjpeg2k/lib``, found without importing it), else the soname."""
    found = first_file(folder / "lib" / SONAME for folder in package_folders("nvidia.nvjpeg2k"))
    return str(found) if found is not None else SONAME


@functools.cache
def load(path: str | None = None) -> Library:
    """The library at ``path`` (default :func:`library_path`); :class:`Unavailable` saying why it cannot load."""
    return Library(path or library_path())


def unavailable(path: str | None = None) -> str | None:
    """Why nvJPEG2000 cannot load here, or None when it can."""
    try:
        load(path)
    except Unavailable as err:
        return str(err)
    return None


class Failed(DecodeError):
    """nvJPEG2000 could not decode an image: ``why`` says how in a word (the failing call's status name,
    NO_RESOLUTIONS, or UNREADABLE_HEADER), for the fallback counts."""

    def __init__(self, message: str, *, path: str, why: str):
        super().__init__(message, path=path)
        self.why = why


def _check(status: int, call: str, name: str) -> None:
    if status != 0:
        why = str(STATUS.get(status, status))
        raise Failed(f"nvJPEG2000 {call} failed: {why}", path=name, why=why)


# -- geometry (pure) --------------------------------------------------------------------------------------------

def ceil_shift(value: int, level: int) -> int:
    """``ceil(value / 2**level)`` for value >= 0: a reference-grid coordinate at resolution reduction ``level``."""
    return -((-value) >> level)


def tile_span(lo: int, hi: int, origin: int, size: int) -> tuple[int, int]:
    """The tiles (first, stop) along one axis that grid coordinates ``lo`` .. ``hi`` (hi > lo) intersect, for
    tiles of ``size`` starting at ``origin``."""
    return (lo - origin) // size, -(-(hi - origin) // size)


class Region(NamedTuple):
    """How to decode part of an image at a reduction level: the tiles and where each goes in one buffer."""

    tiles: list[tuple[int, int, int, int, int]]   # (tile id, x, y, width, height) in the buffer, reduced samples
    height: int                                   # the buffer, reduced samples
    width: int
    origin: tuple[float, float]   # the source coordinate (full-resolution pixels) of the buffer's corner
    scale: float                  # buffer pixels per source pixel, both axes: 2**-level
    level: int


def plan_region(siz: Siz, roi: tuple[int, int, int, int] | None, level: int) -> Region:
    """The tiles intersecting ``roi`` ((x0, y0, x1, y1) in image pixels, None: the whole image) and their layout
    at reduction ``level`` (module doc: Region, Geometry). ``roi`` is clipped to the image; an empty one is the
    whole image."""
    w, h = siz.width - siz.x0, siz.height - siz.y0
    x0, y0, x1, y1 = roi if roi is not None else (0, 0, w, h)
    x0, y0, x1, y1 = max(int(x0), 0), max(int(y0), 0), min(int(x1), w), min(int(y1), h)
    if x1 <= x0 or y1 <= y0:
        x0, y0, x1, y1 = 0, 0, w, h
    tx, stop_x = tile_span(siz.x0 + x0, siz.x0 + x1, siz.tile_x0, siz.tile_width)
    ty, stop_y = tile_span(siz.y0 + y0, siz.y0 + y1, siz.tile_y0, siz.tile_height)
    # Tile edges on the grid, clipped to the image, then reduced
    xs = [ceil_shift(min(max(siz.tile_x0 + p * siz.tile_width, siz.x0), siz.width), level)
          for p in range(tx, stop_x + 1)]
    ys = [ceil_shift(min(max(siz.tile_y0 + q * siz.tile_height, siz.y0), siz.height), level)
          for q in range(ty, stop_y + 1)]
    tiles = [(q * siz.tiles_x + p, xs[p - tx] - xs[0], ys[q - ty] - ys[0], xs[p - tx + 1] - xs[p - tx],
              ys[q - ty + 1] - ys[q - ty])
             for q in range(ty, stop_y) for p in range(tx, stop_x)]
    step = 1 << level
    origin = (step * (xs[0] - 0.5) + 0.5 - siz.x0, step * (ys[0] - 0.5) + 0.5 - siz.y0)
    return Region(tiles, ys[-1] - ys[0], xs[-1] - xs[0], origin, 1.0 / step, level)


def choose_level(step: float | None, max_level: int) -> int:
    """The largest reduction r <= ``max_level`` with ``2**r <= step``, where ``step`` is the fewest source pixels
    per output pixel the warp takes in any direction (:func:`warp_steps`); 0 for None (no warp). For a crop
    resized to the output this is the largest r at which the crop, decoded at 1/2^r, still has at least the
    output's size in both axes: the decode never introduces upscaling."""
    if step is None or not math.isfinite(step):
        return 0
    level = 0
    while level < max_level and (2 << level) <= step:
        level += 1
    return level


def crop_step(region_hw: tuple[float, float], out_hw: tuple[int, int]) -> float:
    """The step of a crop of ``region_hw`` (height, width) source pixels resized to ``out_hw``: the smaller of
    its two axes' source pixels per output pixel."""
    return min(region_hw[0] / out_hw[0], region_hw[1] / out_hw[1])


def warp_steps(matrix: np.ndarray) -> np.ndarray:
    """Per sample of ``matrix`` ((N, 3, 3) output -> source, `ingest.ops.affine.Warp.matrix`), the fewest source
    pixels per output pixel in any direction: the smaller singular value of its linear part."""
    m = np.asarray(matrix, dtype=np.float64).reshape(-1, 3, 3)
    return np.linalg.svd(m[:, :2, :2], compute_uv=False)[:, -1]


# -- decoding ---------------------------------------------------------------------------------------------------

class Decoded(NamedTuple):
    """One decoded image: ``[H, W, 3]`` uint8 on the device, where it lies in the source and its scale."""

    image: Any                      # torch.Tensor
    origin: tuple[float, float]     # source coordinate (full-resolution pixels) of its corner
    scale: float                    # its pixels per source pixel (1.0: full resolution)
    level: int


class _Slot:
    """A bitstream and parameter handle with :data:`TILE_STATES` decode states (each with the event after its last
    tile), and the event after the slot's last image."""

    __slots__ = ("states", "bitstream", "params", "events", "event")

    def __init__(self, states: list[int], bitstream: int, params: int):
        self.states, self.bitstream, self.params, self.event = states, bitstream, params, None
        self.events: list[Any] = [None] * len(states)


class Decoder:
    """nvJPEG2000 on ``device`` (a torch CUDA device): :meth:`decode` one image at a time on a caller's stream.

    :attr:`declined` counts why images were left to other decoders (see the module doc)."""

    def __init__(self, device: Any, *, max_pixels: int | None = None, lib: Library | None = None):
        import torch
        self.lib = lib or load()
        self.device = device
        self.max_pixels = max_pixels
        self.declined: Counter[str] = Counter()
        self._local = threading.local()
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        handle = c_void_p()
        with torch.cuda.device(device):
            status = self.lib.nvjpeg2kCreateSimple(byref(handle))
        if status != 0:
            raise Unavailable(f"nvjpeg2kCreateSimple failed: {STATUS.get(status, status)}")
        self.handle = handle.value
        padding = defaults.get("jpeg2k_device_padding")
        if padding:
            self.lib.nvjpeg2kSetDeviceMemoryPadding(padding, self.handle)

    # -- per-thread state ----------------------------------------------------------------------------------

    def _slot(self) -> _Slot:
        """This thread's next slot, once the GPU has finished its last image."""
        local = self._local
        if not hasattr(local, "slots"):
            local.slots, local.turn = [self._new_slot() for _ in range(SLOTS)], 0
        slot = local.slots[local.turn]
        local.turn = (local.turn + 1) % SLOTS
        wait_for(slot.event)
        slot.event = None
        return slot

    def _new_slot(self) -> _Slot:
        states, bitstream, params = [c_void_p() for _ in range(TILE_STATES)], c_void_p(), c_void_p()
        for status, call in ([(self.lib.nvjpeg2kDecodeStateCreate(self.handle, byref(state)), "DecodeStateCreate")
                              for state in states] +
                             [(self.lib.nvjpeg2kStreamCreate(byref(bitstream)), "StreamCreate"),
                              (self.lib.nvjpeg2kDecodeParamsCreate(byref(params)), "DecodeParamsCreate")]):
            _check(status, call, "<nvJPEG2000 setup>")
        # sYCC to RGB where a JP2 file declares sYCC; ignored for every other colour space
        _check(self.lib.nvjpeg2kDecodeParamsSetRGBOutput(params, 1), "DecodeParamsSetRGBOutput", "<nvJPEG2000 setup>")
        slot = _Slot([state.value for state in states], bitstream.value, params.value)
        with self._lock:
            self._slots.append(slot)
        return slot

    # -- one image -----------------------------------------------------------------------------------------

    def decode(self, data: Any, name: str, roi: tuple[int, int, int, int] | None, step: float | None,
               stream: Any, min_level: int = 0) -> Decoded | None:
        """The image in ``data`` (a JP2 file or J2K codestream), only the tiles ``roi`` (x0, y0, x1, y1 in image
        pixels; None: all) intersects, at the level `choose_level` picks for ``step`` (None: full resolution),
        queued on ``stream`` (a torch CUDA stream). None when declined (module doc); DecodeError naming the file
        and the call when nvJPEG2000 refuses the data."""
        import torch
        with torch.cuda.device(self.device):   # a new slot's decode state is made on this device
            slot = self._slot()
        found = inspect(self.lib, self.handle, slot.bitstream, data, name, roi, step, self.max_pixels, min_level)
        if isinstance(found, str):
            with self._lock:   # (threads decode at once)
                self.declined[found] += 1
            return None
        region, siz, resolutions = found
        level, lib, bitstream = region.level, self.lib, slot.bitstream
        precision = max(siz.precisions)
        wide = precision > 8
        channels = len(siz.steps)
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            planes = torch.empty((channels, region.height, region.width),
                                 dtype=torch.int16 if wide else torch.uint8, device=self.device)
            size = planes.element_size()
            plane_bytes = region.height * region.width * size
            pointers, pitches = (c_void_p * channels)(), (c_size_t * channels)()
            image = Image(pointers, pitches, UINT16 if wide else UINT8, channels)
            for c in range(channels):
                pitches[c] = region.width * size
            base = planes.data_ptr()
            try:
                for k, (tile, x, y, _, _) in enumerate(region.tiles):
                    for c in range(channels):
                        pointers[c] = base + c * plane_bytes + (y * region.width + x) * size
                    turn = k % TILE_STATES
                    wait_for(slot.events[turn])   # its last tile's staged input has been read
                    # num_res_levels: the resolutions to decode (the tile's own less the reduction); 0 is all
                    status = lib.nvjpeg2kDecodeTile(self.handle, slot.states[turn], bitstream, slot.params, tile,
                                                    resolutions[tile] - level if level else 0, byref(image),
                                                    stream.cuda_stream)
                    slot.events[turn] = recorded(stream)
                    _check(status, "DecodeTile", name)
            finally:   # the slot is reused once this has run, whether or not every tile was queued
                slot.event = recorded(stream)
            pixels = to_rgb8(planes, precision)
        origin = region.origin if level else (int(region.origin[0]), int(region.origin[1]))
        return Decoded(pixels, origin, region.scale, level)

    def close(self) -> None:
        """Destroy every thread's nvJPEG2000 objects, then the handle, once their last images have run."""
        with self._lock:
            slots, self._slots = self._slots, []
        for slot in slots:
            wait_for(slot.event)
            self.lib.nvjpeg2kDecodeParamsDestroy(slot.params)
            self.lib.nvjpeg2kStreamDestroy(slot.bitstream)
            for state in slot.states:
                self.lib.nvjpeg2kDecodeStateDestroy(state)
        if self.handle:
            self.lib.nvjpeg2kDestroy(self.handle)
            self.handle = None


def inspect(lib: Library, handle: int, bitstream: int, data: Any, name: str, roi: tuple[int, int, int, int] | None,
            step: float | None, max_pixels: int | None = None, min_level: int = 0
            ) -> tuple[Region, Siz, dict[int, int]] | str:
    """Host work before a decode: ``data`` parsed into ``bitstream``, checked (module doc, Declined), its level
    chosen and its region planned. Returns (region, SIZ, the resolutions of each of the region's tiles by tile
    id), or why it is declined (also "FULL_RESOLUTION" where the level chosen is below ``min_level``);
    DecodeError naming the file where the header is unreadable or nvJPEG2000 refuses it."""
    buf = memoryview(data).cast("B")
    siz = screen(buf, name, step, max_pixels, min_level)
    if isinstance(siz, str):
        return siz
    array = np.frombuffer(buf, dtype=np.uint8)
    _check(lib.nvjpeg2kStreamParse(handle, array.ctypes.data, len(array), 0, 0, bitstream), "StreamParse", name)
    info = ImageInfo()
    _check(lib.nvjpeg2kStreamGetImageInfo(bitstream, byref(info)), "StreamGetImageInfo", name)
    if (info.image_width, info.image_height, info.num_components, info.num_tiles_x, info.num_tiles_y) != \
            (siz.width - siz.x0, siz.height - siz.y0, len(siz.steps), siz.tiles_x, siz.tiles_y):
        return "INFO_MISMATCH"
    comp = ComponentInfo()
    for c in range(info.num_components):
        _check(lib.nvjpeg2kStreamGetImageComponentInfo(bitstream, byref(comp), c), "StreamGetImageComponentInfo",
               name)
        if (comp.component_width, comp.component_height) != (info.image_width, info.image_height) or comp.sgn:
            return "COMPONENT_LAYOUT"
    space = c_int()
    _check(lib.nvjpeg2kStreamGetColorSpace(bitstream, byref(space)), "StreamGetColorSpace", name)
    if space.value == COLORSPACE_NOT_SUPPORTED:
        return "COLOR_SPACE"
    region = plan_region(siz, roi, 0)
    count = c_uint32()
    resolutions = {}
    for tile, *_ in region.tiles:
        _check(lib.nvjpeg2kStreamGetResolutionsInTile(bitstream, tile, byref(count)), "StreamGetResolutionsInTile",
               name)
        if count.value < 1:
            raise Failed(f"nvJPEG2000 reports tile {tile} has no resolutions", path=name, why="NO_RESOLUTIONS")
        resolutions[tile] = count.value
    level = choose_level(step, min(resolutions.values()) - 1)
    if level < min_level:
        return "FULL_RESOLUTION"   # left to a decoder that decodes the region's code blocks alone
    if level:
        region = plan_region(siz, roi, level)
        if any(tw == 0 or th == 0 for _, _, _, tw, th in region.tiles):
            return "EMPTY_TILE"   # a tile narrower than 2^level (inside the image) reduced to no sample
    w, h = c_uint32(), c_uint32()
    for tile, _, _, tw, th in region.tiles:
        for c in range(info.num_components):
            _check(lib.nvjpeg2kStreamGetResolutionComponentDim(bitstream, c, tile, resolutions[tile] - 1 - level,
                                                               byref(w), byref(h)),
                   "StreamGetResolutionComponentDim", name)
            if (w.value, h.value) != (tw, th):
                return "TILE_SIZE_MISMATCH"
    return region, siz, resolutions


def screen(buf: memoryview, name: str, step: float | None, max_pixels: int | None = None, min_level: int = 0
           ) -> Siz | str:
    """What the header alone says, before the library is called: the codestream's SIZ, or why the image is
    declined (module doc, Declined; "FULL_RESOLUTION" where no level of at least ``min_level`` could apply to
    ``step``). DecodeError naming the file where the header is unreadable."""
    try:
        start, end, plain = codecs.codestream(buf, colours=(JP2_SYCC,))
        siz = read_siz(buf, start)
    except (ValueError, IndexError, OverflowError, struct.error) as err:
        raise Failed(f"unreadable JPEG 2000 header: {err}", path=name, why="UNREADABLE_HEADER") from err
    why = _decline(siz, plain)
    if why:
        return why
    if choose_level(step, 32) < min_level:   # no tile's resolutions could allow more: skip the parse
        return "FULL_RESOLUTION"
    if end > len(buf) or bytes(buf[end - 2:end]) != b"\xff\xd9":
        return "INCOMPLETE"   # no EOC: cut short, which the CPU decoder refuses (nvJPEG2000 may decode a part)
    if max_pixels is not None and (siz.width - siz.x0) * (siz.height - siz.y0) > max_pixels:
        return "MAX_PIXELS"   # the CPU decoder refuses it, naming the file
    return siz


def _decline(siz: Siz, plain: bool) -> str | None:
    """Why the header alone sends an image elsewhere (module doc, Declined), or None."""
    if len(siz.steps) not in (1, 3):
        return "COMPONENTS"
    if any(step != (1, 1) for step in siz.steps) or siz.signed:
        return "COMPONENT_LAYOUT"
    if max(siz.precisions) > 16:
        return "PRECISION"
    if siz.x0 or siz.y0 or siz.tile_x0 or siz.tile_y0:
        return "OFFSET"
    if not plain:
        return "JP2_COLOUR"
    return None


def to_rgb8(planes: Any, precision: int) -> Any:
    """Planar samples ``[C, H, W]`` (C 1 or 3; uint8, or int16 holding unsigned 16-bit samples) as ``[H, W, 3]``
    uint8: the 8 most significant bits of ``precision`` kept, gray repeated."""
    import torch
    if planes.dtype == torch.int16:
        planes = ((planes.to(torch.int32) & 0xFFFF) >> max(0, precision - 8)).to(torch.uint8)
    if planes.shape[0] == 1:
        planes = planes.expand(3, -1, -1)
    return planes.permute(1, 2, 0).contiguous()
