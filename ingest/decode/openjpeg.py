"""OpenJPEG (libopenjp2) called directly for the one thing its Python wrappers do not offer: decoding only an
area of a JPEG 2000 image (``opj_set_decode_area``), which skips the tiles and code blocks outside it. A random
crop of a large image then costs a part of its whole decode; the samples inside the area are the whole decode's
exactly (OpenJPEG decodes the area's code blocks and the wavelet's margin around them).

The library is the copy Pillow's wheels bundle (``pillow.libs/libopenjp2-*.so*``, Pillow being a dependency of
ingest), else the system's (``ctypes.util.find_library``). Without either, :func:`available` is False and JPEG
2000 images are decoded whole by imagecodecs, as before. The struct layouts below are OpenJPEG 2.x's public ones
(``openjpeg.h``: ``opj_image_t``, ``opj_image_comp_t``), checked at load: version 2.3 or later.

:func:`decode_area` takes what `ingest.decode.codecs` marks ``Header.region``: every component at full
resolution, unsigned samples of at most 16 bits, plain colours (no palette, channel reordering or ICC profile:
nothing the decoder would transform after decoding) and a complete codestream. Errors are
:class:`~ingest.errors.DecodeError` naming the file and OpenJPEG's own message; the library prints nothing (its
message handlers keep the messages for the error).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from ctypes import CFUNCTYPE, POINTER, byref, c_char_p, c_int, c_int32, c_int64, c_size_t, c_uint16, c_uint32, c_void_p

import numpy as np

from ingest.decode._wheels import package_folders
from ingest.errors import DecodeError

CODEC_J2K, CODEC_JP2 = 0, 2   # OPJ_CODEC_FORMAT
CHUNK = 1 << 20               # the stream's buffer (OpenJPEG's own default)
PARAMETERS_BYTES = 1 << 15    # room for opj_dparameters_t (about 8.3 KB in 2.x), filled by the library itself


class Unavailable(RuntimeError):
    """No usable libopenjp2 here; the message says why."""


class _Component(ctypes.Structure):   # opj_image_comp_t
    _fields_ = [("dx", c_uint32), ("dy", c_uint32), ("w", c_uint32), ("h", c_uint32), ("x0", c_uint32),
                ("y0", c_uint32), ("prec", c_uint32), ("bpp", c_uint32), ("sgnd", c_uint32),
                ("resno_decoded", c_uint32), ("factor", c_uint32), ("data", POINTER(c_int32)), ("alpha", c_uint16)]


class _Image(ctypes.Structure):   # opj_image_t
    _fields_ = [("x0", c_uint32), ("y0", c_uint32), ("x1", c_uint32), ("y1", c_uint32), ("numcomps", c_uint32),
                ("color_space", c_int), ("comps", POINTER(_Component)), ("icc_profile_buf", c_void_p),
                ("icc_profile_len", c_uint32)]


_READ = CFUNCTYPE(c_size_t, c_void_p, c_size_t, c_void_p)   # opj_stream_read_fn
_SKIP = CFUNCTYPE(c_int64, c_int64, c_void_p)               # opj_stream_skip_fn
_SEEK = CFUNCTYPE(c_int, c_int64, c_void_p)                 # opj_stream_seek_fn
_MESSAGE = CFUNCTYPE(None, c_char_p, c_void_p)              # opj_msg_callback
_END = c_size_t(-1).value                                   # (OPJ_SIZE_T)-1: the read function's end of stream

_SIGNATURES = {
    "opj_version": (c_char_p, []),
    "opj_create_decompress": (c_void_p, [c_int]),
    "opj_set_default_decoder_parameters": (None, [c_void_p]),
    "opj_setup_decoder": (c_int, [c_void_p, c_void_p]),
    "opj_set_error_handler": (c_int, [c_void_p, c_void_p, c_void_p]),
    "opj_set_warning_handler": (c_int, [c_void_p, c_void_p, c_void_p]),
    "opj_set_info_handler": (c_int, [c_void_p, c_void_p, c_void_p]),
    "opj_stream_create": (c_void_p, [c_size_t, c_int]),
    "opj_stream_set_read_function": (None, [c_void_p, c_void_p]),
    "opj_stream_set_skip_function": (None, [c_void_p, c_void_p]),
    "opj_stream_set_seek_function": (None, [c_void_p, c_void_p]),
    "opj_stream_set_user_data": (None, [c_void_p, c_void_p, c_void_p]),
    "opj_stream_set_user_data_length": (None, [c_void_p, ctypes.c_uint64]),
    "opj_read_header": (c_int, [c_void_p, c_void_p, POINTER(POINTER(_Image))]),
    "opj_set_decode_area": (c_int, [c_void_p, POINTER(_Image), c_int32, c_int32, c_int32, c_int32]),
    "opj_decode": (c_int, [c_void_p, c_void_p, POINTER(_Image)]),
    "opj_end_decompress": (c_int, [c_void_p, c_void_p]),
    "opj_image_destroy": (None, [POINTER(_Image)]),
    "opj_stream_destroy": (None, [c_void_p]),
    "opj_destroy_codec": (None, [c_void_p]),
}


def _candidates() -> list[str]:
    """Pillow's bundled libopenjp2 (beside the PIL package, as its wheels lay it out), then the system's."""
    found = [str(path) for folder in package_folders("PIL")
             for path in sorted((folder.parent / "pillow.libs").glob("libopenjp2*"))]
    system = ctypes.util.find_library("openjp2")
    return found + ([system] if system else [])


@functools.cache
def load() -> ctypes.CDLL:
    """libopenjp2 with the calls used here typed; :class:`Unavailable` where none loads or it is older than 2.3."""
    why = "no libopenjp2 (Pillow's wheels bundle one; or install OpenJPEG 2.3+)"
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)   # CDLL: every call gives the GIL up while it runs
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = restype, argtypes
        except (OSError, AttributeError) as err:
            why = f"{path}: {err}"
            continue
        version = tuple(int(p) for p in lib.opj_version().decode().split(".")[:2])
        if version >= (2, 3):
            return lib
        why = f"{path} is OpenJPEG {lib.opj_version().decode()}; 2.3 or later is needed"
    raise Unavailable(why)


def available() -> bool:
    """Whether :func:`decode_area` can run here."""
    try:
        load()
    except Unavailable:
        return False
    return True


def decode_area(buf: memoryview, area: tuple[int, int, int, int], name: str, *, jp2: bool) -> np.ndarray:
    """The samples of ``area`` = (x0, y0, x1, y1), in image pixels, of a JPEG 2000 file (``jp2``) or bare
    codestream that `ingest.decode.codecs` marks ``Header.region``: ``[y1 - y0, x1 - x0]`` for one component, else
    ``[y1 - y0, x1 - x0, C]``, uint8 up to 8-bit precision and uint16 above, as OpenJPEG decodes them (the whole
    decode's samples there, exactly). :class:`DecodeError` naming the file where OpenJPEG fails."""
    lib = load()
    data = np.frombuffer(buf, dtype=np.uint8)
    base, size, at = data.ctypes.data, len(data), [0]
    messages: list[str] = []

    def read(dst, n, _):
        n = min(n, size - at[0])
        if n <= 0:
            return _END
        ctypes.memmove(dst, base + at[0], n)
        at[0] += n
        return n

    def skip(n, _):
        to = min(max(at[0] + n, 0), size)
        moved, at[0] = to - at[0], to
        return moved

    def seek(n, _):
        if not 0 <= n <= size:
            return 0
        at[0] = n
        return 1

    def message(text, _):
        messages.append(text.decode(errors="replace").strip())

    callbacks = (_READ(read), _SKIP(skip), _SEEK(seek), _MESSAGE(message))   # alive until the call returns
    fn = [ctypes.cast(cb, c_void_p) for cb in callbacks]

    def failed(what: str) -> DecodeError:
        said = "; ".join(m for m in messages if m) or "no message"
        return DecodeError(f"cannot decode JPEG 2000 ({what}): {said}", path=name)

    codec = lib.opj_create_decompress(CODEC_JP2 if jp2 else CODEC_J2K)
    stream = lib.opj_stream_create(CHUNK, 1)
    image = POINTER(_Image)()
    try:
        for handler in (lib.opj_set_error_handler, lib.opj_set_warning_handler, lib.opj_set_info_handler):
            handler(codec, fn[3], None)
        params = ctypes.create_string_buffer(PARAMETERS_BYTES)
        lib.opj_set_default_decoder_parameters(params)
        if not lib.opj_setup_decoder(codec, params):
            raise failed("setup")
        lib.opj_stream_set_read_function(stream, fn[0])
        lib.opj_stream_set_skip_function(stream, fn[1])
        lib.opj_stream_set_seek_function(stream, fn[2])
        lib.opj_stream_set_user_data(stream, None, None)
        lib.opj_stream_set_user_data_length(stream, size)
        if not lib.opj_read_header(stream, codec, byref(image)):
            raise failed("header")
        grid = image.contents
        x0, y0, x1, y1 = (int(v) for v in area)
        if not lib.opj_set_decode_area(codec, image, grid.x0 + x0, grid.y0 + y0, grid.x0 + x1, grid.y0 + y1):
            raise failed(f"area {x0},{y0}-{x1},{y1}")
        if not lib.opj_decode(codec, stream, image) or not lib.opj_end_decompress(codec, stream):
            raise failed("decode")
        decoded = image.contents
        comps = [decoded.comps[c] for c in range(decoded.numcomps)]
        h, w = y1 - y0, x1 - x0
        if not comps or any((c.w, c.h) != (w, h) or c.sgnd or not c.data for c in comps):
            raise failed(f"components {[(c.w, c.h, c.sgnd) for c in comps]} for an area of {w}x{h}")
        out = np.empty((h, w, len(comps)), np.uint8 if max(c.prec for c in comps) <= 8 else np.uint16)
        for k, c in enumerate(comps):
            out[:, :, k] = np.ctypeslib.as_array(c.data, shape=(h, w))
        return out[:, :, 0] if len(comps) == 1 else out
    finally:
        if image:
            lib.opj_image_destroy(image)
        lib.opj_stream_destroy(stream)
        lib.opj_destroy_codec(codec)
