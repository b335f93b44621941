"""Segmentation masks (fields of kind ``mask``): encoded single-channel or palette images decoded to the values
they store, not to colours.

=====================  ======================================================================
stored as              decoded to ``[H, W]``
=====================  ======================================================================
palette (``P``, PNG)    its palette indices, uint8 (PASCAL VOC's class ids, 255 = "ignore")
gray 8-bit (``L``)      its gray levels, uint8
gray 16-bit             its values, uint16 (Cityscapes-style instance ids, depth in mm, ...)
1-bit (``1``)           0 and 1, uint8
gray/palette + alpha    the first band (the alpha is dropped)
an ``[H, W]`` array     itself (uint8 or uint16; bool as 0/1 uint8): already decoded (raw shards)
=====================  ======================================================================

A colour image (RGB, RGBA, CMYK, ...) is refused with a `DecodeError`: its colours are not labels, and
converting them to gray would make up values (declare the field ``image`` to get its colours). Pillow
decodes every format it reads (PNG, BMP, TIFF, GIF, WebP lossless); JPEG masks are lossy and their edges
are wrong, but a gray JPEG decodes as its levels.

Notes
-----
The PNGs masks usually are (non-interlaced palette at 1-8 bits, gray at 1, 8 or 16 bits, 8-bit gray + alpha)
are decoded by ``ingest.decode._png`` where it was built and zlib loads: a batch on native threads, to
exactly the values Pillow gives, with at most one GIL hand-off per batch. Pillow decodes the rest, and
everything where that module is missing. The native decoder is stricter than Pillow on damaged files: it checks every chunk's CRC
(Pillow skips IDAT's) and wants the image data to inflate to exactly its rows, refusing more or less with a
`DecodeError` that names the sample and the byte offset of the chunk.
"""

from __future__ import annotations

import io
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image, UnidentifiedImageError

from .. import defaults
from .._threads import Threads
from ..errors import ConfigError, DecodeError

try:  # palette / gray PNGs of a batch in C (setup.py builds it where a compiler is found), else Pillow
    from . import _png as NATIVE_PNG
except ImportError:
    NATIVE_PNG = None
if NATIVE_PNG is not None and NATIVE_PNG.load() is not None:   # no libz.so.1: Pillow decodes every mask
    NATIVE_PNG = None

#: Pillow modes whose first band holds the stored values, and the dtype they decode to.
_MODES = {"P": np.uint8, "L": np.uint8, "1": np.uint8, "PA": np.uint8, "LA": np.uint8,
          "I;16": np.uint16, "I;16L": np.uint16, "I;16B": np.uint16, "I;16N": np.uint16, "I": np.uint16}

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: (colour type, bit depth) of the non-interlaced PNGs `NATIVE_PNG` decodes: palette, gray 1/8/16-bit, 8-bit
#: gray + alpha. Gray at 2 and 4 bits is Pillow's (it scales the levels), as are the colour ones (refused).
_NATIVE_KINDS = frozenset({(3, 1), (3, 2), (3, 4), (3, 8), (0, 1), (0, 8), (0, 16), (4, 8)})


def decode_mask(data: Any, name: str, *, max_pixels: int | None = None) -> np.ndarray:
    """The ``[H, W]`` values of one mask (see the module table): encoded bytes (bytes, memoryview, a 1-D
    uint8 array) or an already decoded 2-D array. ``name`` names the sample in errors; ``max_pixels`` (default:
    the ``max_pixels`` setting) refuses larger masks from their header."""
    if isinstance(data, np.ndarray) and data.ndim >= 2:
        return _decoded(data, name)
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    if not len(buf):
        raise DecodeError("empty mask", path=name)
    limit = defaults.get("max_pixels") if max_pixels is None else max_pixels
    if _native_png(buf):
        got = _native_batch([buf], [name], limit, 1)[0]
        if isinstance(got, DecodeError):
            raise got
        return got
    return _pillow(buf, name, limit)


def _pillow(buf: bytes | memoryview, name: str, limit: int) -> np.ndarray:
    try:
        img = Image.open(io.BytesIO(buf))
    except UnidentifiedImageError as err:
        raise DecodeError("mask: not an image of a format Pillow reads, or its header is damaged", path=name) from err
    except Exception as err:  # Pillow's plugins raise many types
        raise DecodeError(f"mask: cannot read the header: {err}", path=name) from err
    with img:
        if img.width * img.height > limit:
            raise DecodeError(f"mask of {img.width}x{img.height} pixels exceeds max_pixels={limit}", path=name)
        mode = img.mode
        if mode not in _MODES:
            raise DecodeError(f"mask is a {mode} image: a mask must be single-channel or palette (declare a "
                              "colour field as kind 'image')", path=name)
        try:
            if mode in ("PA", "LA"):
                img = img.getchannel(0)   # the palette indices / gray levels; the alpha dropped
            values = np.array(img)   # (a writable copy: batches wrap it in tensors)
        except Exception as err:
            raise DecodeError(f"mask: cannot decode: {err}", path=name) from err
    if mode == "I" and values.size and (values.min() < 0 or values.max() > 0xFFFF):
        raise DecodeError(f"mask holds 32-bit values ({values.min()}..{values.max()}) beyond uint16", path=name)
    return np.ascontiguousarray(values, dtype=_MODES[mode])


def _native_png(data: Any) -> bool:
    """Whether ``data`` (encoded bytes) starts as a PNG that `NATIVE_PNG` decodes; False for anything else."""
    if NATIVE_PNG is None or (isinstance(data, np.ndarray) and data.ndim >= 2):
        return False
    try:
        buf = memoryview(data).cast("B")
    except (TypeError, ValueError):
        return False
    return (len(buf) >= 29 and buf[:8] == _PNG_SIGNATURE and buf[12:16] == b"IHDR" and buf[28] == 0
            and (buf[25], buf[24]) in _NATIVE_KINDS)


def _native_batch(bufs: Sequence[Any], names: Sequence[str], limit: int,
                  threads: int) -> list[np.ndarray | DecodeError]:
    """PNG masks decoded by `NATIVE_PNG` on ``threads`` native threads, one GIL release for all (see
    `_native_results`)."""
    return _native_results(NATIVE_PNG.decode(bufs, limit, threads), bufs, names, limit)


def _native_results(results: list, bufs: Sequence[Any], names: Sequence[str],
                    limit: int) -> list[np.ndarray | DecodeError]:
    """`NATIVE_PNG`'s results as arrays; a PNG it leaves (animated, no PLTE, ...) decoded by Pillow; a refused
    one as its `DecodeError`."""
    out: list[np.ndarray | DecodeError] = []
    for buf, name, got in zip(bufs, names, results):
        if got is None:
            try:
                out.append(_pillow(buf, name, limit))
            except DecodeError as err:
                out.append(err)
        elif len(got) == 2:
            out.append(DecodeError(got[0], path=name, offset=got[1]))
        else:
            values, height, width, itemsize = got
            out.append(np.frombuffer(values, np.uint16 if itemsize == 2 else np.uint8).reshape(height, width))
    return out


def _decoded(data: np.ndarray, name: str) -> np.ndarray:
    a = data[..., 0] if data.ndim == 3 and data.shape[2] == 1 else data
    if a.ndim != 2:
        raise DecodeError(f"a decoded mask must be [H, W], got shape {data.shape}", path=name)
    if a.dtype == np.bool_:
        return a.astype(np.uint8)
    if a.dtype not in (np.uint8, np.uint16):
        raise DecodeError(f"a decoded mask must be uint8 or uint16, got {a.dtype}", path=name)
    return np.ascontiguousarray(a)


class MaskDecoder:
    """Decodes a batch's masks on ``threads`` threads (default: the ``decode_threads`` setting). The PNGs
    `NATIVE_PNG` takes are decoded on native threads of its own, started by `submit` and waited for by the
    function it returns, which takes no GIL hand-off when they are done by then; each other mask is a task of a
    pool of Python threads (started on first use), for Pillow, which lets the GIL go while it inflates."""

    def __init__(self, *, threads: int | None = None):
        threads = defaults.get("decode_threads") if threads is None else threads
        if threads < 1:
            raise ConfigError(f"`threads` must be >= 1, got {threads}")
        self.threads = threads
        self._pool = Threads(threads, "ingest-masks")

    def decode_batch(self, datas: Sequence[Any], names: Sequence[str]) -> list[np.ndarray | DecodeError]:
        """`decode_mask` of each, in order; a mask that cannot be decoded gives its `DecodeError` in its place."""
        return self.submit(datas, names)()

    def submit(self, datas: Sequence[Any], names: Sequence[str]) -> Callable[[], list[np.ndarray | DecodeError]]:
        """`decode_batch` started (on the native threads and the pool); the function returned waits for it and
        gives its result (the caller decodes the images meanwhile)."""
        if len(datas) <= 1:
            done = [_or_error(d, n) for d, n in zip(datas, names)]
            return lambda: done
        limit = defaults.get("max_pixels")
        png = [k for k, d in enumerate(datas) if _native_png(d)]
        bufs, png_names = [memoryview(datas[k]).cast("B") for k in png], [names[k] for k in png]
        native = NATIVE_PNG.start(bufs, limit, self.threads) if png else None
        taken = set(png)
        others = {k: self._pool.submit(_or_error, d, n)
                  for k, (d, n) in enumerate(zip(datas, names)) if k not in taken}

        def wait() -> list[np.ndarray | DecodeError]:
            out: list[Any] = [None] * len(datas)
            if native is not None:
                for k, got in zip(png, _native_results(NATIVE_PNG.finish(native), bufs, png_names, limit)):
                    out[k] = got
            for k, future in others.items():
                out[k] = future.result()
            return out
        return wait

    def close(self) -> None:
        self._pool.shutdown()


def _or_error(data: Any, name: str) -> np.ndarray | DecodeError:
    try:
        return decode_mask(data, name)
    except DecodeError as err:
        return err
