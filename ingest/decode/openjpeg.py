"""OpenJPEG (libopenjp2) called directly for the one thing its Python wrappers do not offer: decoding only an
area of a JPEG 2000 image (``opj_set_decode_area``), which skips the tiles and code blocks outside it. A random
crop of a large image then costs a part of its whole decode; the samples inside the area are the whole decode's
exactly (OpenJPEG decodes the area's code blocks and the wavelet's margin around them).

The calls run in the compiled ``ingest.decode._openjpeg`` (``ingest/decode/_openjpeg.c``), one call an image that
gives the GIL up once: header, area, decode and the copy into the caller's array. The library is the copy
Pillow's wheels bundle (``pillow.libs/libopenjp2-*.so*``, Pillow being a dependency of ingest), else the
system's (``ctypes.util.find_library``), version 2.3 or later. Without the compiled module or the library,
:func:`available` is False and JPEG 2000 images are decoded whole by imagecodecs.

:func:`decode_area` takes what `ingest.decode.codecs` marks ``Header.region``: every component at full
resolution, unsigned samples of at most 16 bits, plain colours (no palette, channel reordering or ICC profile:
nothing the decoder would transform after decoding) and a complete codestream. Errors are
:class:`~ingest.errors.DecodeError` naming the file and OpenJPEG's own message; the library prints nothing.
"""

from __future__ import annotations

import ctypes.util
import functools

import numpy as np

from ingest.decode._wheels import package_folders
from ingest.errors import DecodeError

try:
    from ingest.decode import _openjpeg
except ImportError:   # built without a C compiler: JPEG 2000 images are decoded whole
    _openjpeg = None


class Unavailable(RuntimeError):
    """No usable libopenjp2 (or no compiled ``_openjpeg``) here; the message says why."""


def _candidates() -> list[str]:
    """Pillow's bundled libopenjp2 (beside the PIL package, as its wheels lay it out), then the system's."""
    found = [str(path) for folder in package_folders("PIL")
             for path in sorted((folder.parent / "pillow.libs").glob("libopenjp2*"))]
    system = ctypes.util.find_library("openjp2")
    return found + ([system] if system else [])


@functools.cache
def load() -> str:
    """The loaded libopenjp2's version; :class:`Unavailable` where none loads or it is older than 2.3."""
    if _openjpeg is None:
        raise Unavailable("ingest was built without its compiled parts (ingest.decode._openjpeg)")
    why = "no libopenjp2 (Pillow's wheels bundle one; or install OpenJPEG 2.3+)"
    for path in _candidates():
        try:
            version = _openjpeg.load(path)
        except OSError as err:
            why = str(err)
            continue
        if tuple(int(p) for p in version.split(".")[:2]) >= (2, 3):
            return version
        why = f"{path} is OpenJPEG {version}; 2.3 or later is needed"
        break   # the module keeps the first library it opened
    raise Unavailable(why)


def available() -> bool:
    """Whether :func:`decode_area` can run here."""
    try:
        load()
    except Unavailable:
        return False
    return True


def decode_area(buf: memoryview, area: tuple[int, int, int, int], name: str, *, jp2: bool, out: np.ndarray) -> None:
    """Write the samples of ``area`` = (x0, y0, x1, y1), in image pixels, of a JPEG 2000 file (``jp2``) or bare
    codestream that `ingest.decode.codecs` marks ``Header.region`` into ``out``: a uint8 (samples of up to 8 bits)
    or uint16 array ``[y1 - y0, x1 - x0]`` for one component, else ``[y1 - y0, x1 - x0, C]``, whose rows may be
    strided (a view into a whole image). The whole decode's samples there, exactly. :class:`DecodeError` naming
    the file where OpenJPEG fails or decodes what ``out`` cannot hold."""
    load()
    x0, y0, x1, y1 = (int(v) for v in area)
    try:
        _openjpeg.decode_area(buf, x0, y0, x1, y1, jp2, out)
    except _openjpeg.Failed as err:
        what, said = err.args
        what = f"area {x0},{y0}-{x1},{y1}" if what == "area" else what
        raise DecodeError(f"cannot decode JPEG 2000 ({what}): {said}", path=name) from None
