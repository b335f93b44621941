"""CPU image decoding: encoded bytes to an ``[H, W, 3]`` uint8 RGB array, EXIF orientation applied.

JPEG goes through simplejpeg (libjpeg-turbo, releases the GIL, can DCT-downscale); JPEG 2000, TIFF and binary
PNM/PAM through `ingest.decode.codecs` (OpenJPEG and libtiff from imagecodecs, PNM read there); every other
format, and the JPEGs libjpeg-turbo cannot take (12-bit, lossless, some damaged headers), goes through Pillow.
The format is sniffed from the bytes, never taken from the name.

What every decode returns by default, whatever the source (a decoder made with ``dtype`` uint16 or
``channels`` 1 or 4 follows `ingest.decode.codecs.finish` instead):

- RGB, uint8, C-contiguous and writable.
- Alpha is **dropped**: RGBA, LA, palette+tRNS and colour-key transparency keep their stored colours, as
  Pillow's ``convert("RGB")`` does; nothing is composited.
- 16-bit samples keep their 8 most significant bits (``>> 8``), never clipped.
- CMYK/YCCK JPEGs are converted with Pillow's formula (Adobe inverted CMYK), so both paths agree exactly.
- Multi-frame files (APNG, GIF, MPO, multi-page TIFF) give their first frame.
- Floating-point samples (TIFF) are clipped to [0, 1] and scaled to 0..255.
- Orientation: the EXIF Orientation tag (1-8), or XMP ``tiff:Orientation`` when EXIF has none (as
  Pillow's ``ImageOps.exif_transpose`` reads it). In a PNG only an eXIf chunk before the pixel data is
  read, so that :meth:`CpuDecoder.probe` needs no decode.

Failure policy: any failure raises :class:`~ingest.errors.DecodeError` naming the source, chained from the
cause. A JPEG is decoded only if libjpeg-turbo reports no warning; a warning that means pixels were lost
(truncation, corrupt entropy data: see ``_LOST_DATA``) is an error, because a training set should not
silently hold grey halves. Other warnings (e.g. junk between segments) and unsupported variants are handed
to Pillow, which also refuses truncated files. Sizes are checked against ``max_pixels`` before any pixel
buffer is allocated.
"""

from __future__ import annotations

import io
import re
import struct
import time
from concurrent.futures import Future
from typing import Any, NamedTuple, Sequence

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from ingest import defaults
from ingest._numpy import zeros
from ingest._threads import Threads
from ingest.decode import codecs
from ingest.errors import ConfigError, DecodeError
from ingest.formats._images import JPEG_SIGNATURE

try:  # the batch header scan in C (setup.py builds it where a compiler is found), else read_jpeg_header per image
    from ingest.formats import _jpeg as NATIVE_HEADERS
except ImportError:
    NATIVE_HEADERS = None

Buffer = bytes | bytearray | memoryview | np.ndarray
Size = tuple[int, int]  # (height, width)

#: Formats handed to Pillow. Others (EPS runs Ghostscript, ...) are refused rather than risked.
PILLOW_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "PPM")

#: libjpeg warnings that mean some pixels were not decoded (they would be left grey).
_LOST_DATA = (
    "Premature end of JPEG file",      # truncated file
    "premature end of data segment",   # entropy segment ends before its blocks do
    "bad Huffman code",                # corrupt entropy data; the rest of the segment is zeroed
    "instead of RST",                  # restart marker missing; data skipped to resynchronise
)

_ORIENTATION_TAG = 0x0112
_SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RST0-7: no length field
_HEADER_MARKERS = _SOF_MARKERS | {0xE1, 0xEE}  # the segments read_jpeg_header looks into (APP1, APP14)
_MARKER = re.compile(rb"\xff+([^\x00\xff])")                  # fill bytes, then a marker code
_XMP_PREFIX = b"http://ns.adobe.com/xap/1.0/\x00"
_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(?:="|>)([0-9])')

# How to turn stored pixels [H, W, C] into displayed ones, per EXIF orientation (Pillow's exif_transpose).
_ORIENT = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: a.transpose(1, 0, 2)[:, ::-1],
    7: lambda a: a.transpose(1, 0, 2)[::-1, ::-1],
    8: lambda a: a.transpose(1, 0, 2)[::-1],
}


class CpuDecoder:
    """Decodes images on the CPU.

    ``threads`` sizes the pool :meth:`decode_batch` runs on (default: the ``decode_threads`` setting of
    `ingest.defaults`, one per CPU unless set). ``max_pixels`` refuses larger images from their header, before
    any pixel buffer is allocated (default: the ``max_pixels`` setting, Pillow's ``Image.MAX_IMAGE_PIXELS``
    unless set; see `ingest.defaults` for why). Pillow keeps its own bomb limit (twice
    ``Image.MAX_IMAGE_PIXELS``, past which it raises); the lower of the two applies to what Pillow decodes.
    ``dtype`` (uint8 or uint16, numpy or torch) and ``channels`` (1, 3 or 4) choose what every decode returns
    (`ingest.decode.codecs.finish`); the default, uint8 RGB, is the module's.
    """

    def __init__(self, *, threads: int | None = None, max_pixels: int | None = None, dtype: Any = "uint8",
                 channels: int = 3):
        threads = defaults.get("decode_threads") if threads is None else threads
        max_pixels = defaults.get("max_pixels") if max_pixels is None else max_pixels
        if threads < 1:
            raise ConfigError(f"`threads` must be >= 1, got {threads}")
        if max_pixels < 1:
            raise ConfigError(f"`max_pixels` must be >= 1, got {max_pixels}")
        self.threads = threads
        self.max_pixels = max_pixels
        self.dtype, self.channels = codecs.output_options(dtype, channels)
        #: Whether decodes return the default uint8 RGB (the GPU decoder decodes only for those).
        self.rgb8 = (self.dtype, self.channels) == ("uint8", 3)
        self._pool = Threads(threads, "ingest-decode")

    # -- public API ----------------------------------------------------------------------------------

    def probe(self, data: Buffer, name: str) -> Size:
        """``(height, width)`` of the image as :meth:`decode` returns it (orientation applied), from the
        header only."""
        return self.probe_header(data, name)[0]

    def probe_header(self, data: Buffer, name: str) -> tuple[Size, "JpegHeader | None"]:
        """:meth:`probe`'s size and, for a JPEG, its parsed header (which the GPU decoder can reuse)."""
        buf = as_buffer(data, name)
        if is_jpeg(buf):
            header = self._jpeg_header(buf, name)
            return _oriented(header.height, header.width, header.orientation), header
        codec = codecs.sniff(buf)
        if codec == "pnm":
            height, width = codecs.pnm_size(buf, name)
            self._check_size(height, width, name)
            return (height, width), None
        if codec is not None:
            header = self.codec_header(buf, codec, name)
            return _oriented(header.height, header.width, header.orientation), None
        with self._open_pillow(data, buf, name) as img:
            return _oriented(img.height, img.width, _pillow_orientation(img)), None

    def probe_batch(self, datas: Sequence[Buffer], names: Sequence[str]
                    ) -> tuple[list[Size | DecodeError], np.ndarray]:
        """:meth:`probe` of every image (its :class:`DecodeError` as a value where the header is refused), and
        the batch's JPEG header table (:func:`jpeg_headers`), which the GPU decoder takes instead of parsing
        again. JPEGs are read in one native call; other formats and refused headers go through
        :meth:`probe_header` one by one (the same sizes and the same errors); a JPEG 2000 or TIFF the GPU decodes
        gets its row there (`codecs.table_row`), so that the GPU decoder reads no header again."""
        table = jpeg_headers(datas)
        kind, h, w, orientation = table[:, 0], table[:, 1], table[:, 2], table[:, 6]
        good = (kind == 1) & (h > 0) & (w > 0) & (h * w <= self.max_pixels)
        turned = orientation >= 5
        heights, widths = np.where(turned, w, h).tolist(), np.where(turned, h, w).tolist()
        sizes: list[Size | DecodeError] = list(zip(heights, widths))
        for k in np.flatnonzero(~good).tolist():
            try:
                buf = as_buffer(datas[k], names[k])
                codec = None if kind[k] else codecs.sniff(buf)
                if codec in ("jpeg2k", "tiff"):
                    header = self.codec_header(buf, codec, names[k])
                    sizes[k] = _oriented(header.height, header.width, header.orientation)
                    if header.gpu:
                        table[k] = codecs.table_row(header)
                else:
                    sizes[k] = self.probe(datas[k], names[k])
            except DecodeError as err:
                sizes[k] = err
        return sizes, table

    def decode(self, data: Buffer, name: str, *, min_size: Size | None = None,
               region: tuple[int, int, int, int] | None = None) -> np.ndarray:
        """The image as an ``[H, W, 3]`` uint8 RGB array, orientation applied.

        ``min_size`` = (height, width) is a hint: a JPEG may then be downscaled in the DCT by the smallest
        factor M/8 (M = 1..8) that keeps the result at least that large. Only then can the result be
        smaller than :meth:`probe` says; its aspect ratio is kept up to rounding (sides are rounded up) and
        the caller scales its coordinates by ``result size / probed size``. Other formats, and the JPEGs
        libjpeg-turbo hands to Pillow, ignore the hint.

        ``region`` = (x0, y0, x1, y1) in the probed image's pixels says that only those pixels are needed: a
        JPEG 2000 image OpenJPEG can decode an area of comes back at its full size with just that area decoded
        (the whole decode's pixels there, 0 elsewhere: `ingest.decode.codecs.decode`). Other images ignore it.
        """
        buf = as_buffer(data, name)
        if is_jpeg(buf):
            header = self._jpeg_header(buf, name)
            pixels = self._decode_jpeg(data, buf, header, min_size, name)
            pixels = pixels if self.rgb8 else codecs.finish(pixels, 8, self.dtype, self.channels)
            return _orient(pixels, header.orientation)
        codec = codecs.sniff(buf)
        if codec == "pnm":
            self._check_size(*codecs.pnm_size(buf, name), name)
            return codecs.finish(*codecs.read_pnm(buf, name), self.dtype, self.channels)
        if codec == "jpeg2k" or (codec == "tiff" and codecs.imagecodecs is not None):
            header = self.codec_header(buf, codec, name)
            samples, precision = codecs.decode(buf, codec, header, name, region if codec == "jpeg2k" else None)
            return _orient(codecs.finish(samples, precision, self.dtype, self.channels), header.orientation)
        with self._open_pillow(data, buf, name) as img:
            # Pillow turns a TIFF by its Orientation tag as it loads it (and still reports the tag)
            orientation = 1 if img.format == "TIFF" else _pillow_orientation(img)
            if self.rgb8:
                pixels = _pillow_pixels(img, name)
            else:
                pixels = codecs.finish(*_pillow_samples(img, buf, name), self.dtype, self.channels)
        return _orient(pixels, orientation)

    def decode_batch(self, datas: Sequence[Buffer], names: Sequence[str], *,
                     min_sizes: Sequence[Size | None] | None = None,
                     regions: Sequence[tuple[int, int, int, int] | None] | np.ndarray | None = None
                     ) -> list[np.ndarray | DecodeError]:
        """:meth:`decode` of every image on the thread pool, in order, with its ``min_sizes`` and ``regions``
        entry. A sample that cannot be decoded gives its :class:`DecodeError` as a value (the executor counts
        it against the failure budget)."""
        if len(datas) != len(names):
            raise ValueError(f"got {len(datas)} images but {len(names)} names")
        hints = []
        for what, given in (("min_sizes", min_sizes), ("regions", regions)):
            if given is None:
                given = [None] * len(datas)
            elif len(given) != len(datas):
                raise ValueError(f"got {len(datas)} images but {len(given)} {what}")
            hints.append(given)
        return list(self._pool.map(self._decode_or_error, datas, names, *hints))

    def submit(self, data: Buffer, name: str, region: tuple[int, int, int, int] | None = None) -> Future:
        """:meth:`decode` (with its ``region``) started on the thread pool: a future of the image (or its
        :class:`DecodeError`) and when its decode ended (`time.perf_counter`)."""
        return self._pool.submit(self._decode_timed, data, name, region)

    def close(self) -> None:
        """Shut the thread pool down (waits for running decodes)."""
        self._pool.shutdown()

    def __enter__(self) -> "CpuDecoder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CpuDecoder(threads={self.threads}, max_pixels={self.max_pixels}, dtype={self.dtype!r}, "
                f"channels={self.channels})")

    def codec_header(self, buf: memoryview, codec: str, name: str) -> codecs.Header:
        """The header of a JPEG 2000 or TIFF file (``codec`` as `ingest.decode.codecs.sniff` names it), its size,
        component count and decoded bytes (at most ``4 * max_pixels``: what an 8-bit RGBA image of ``max_pixels``
        takes, so deep samples allow fewer pixels) checked before anything is decoded."""
        header = codecs.read_header(buf, codec, name)
        self._check_size(header.height, header.width, name)
        if not 1 <= header.components <= codecs.MAX_COMPONENTS:
            raise DecodeError(f"{header.components} components per pixel (at most {codecs.MAX_COMPONENTS} are "
                              "decoded: gray, gray+alpha, RGB, RGBA)", path=name)
        nbytes = header.height * header.width * header.components * -(-max(header.precision, 8) // 8)
        if nbytes > 4 * self.max_pixels:
            raise DecodeError(f"{header.width}x{header.height} pixels of {header.components} x {header.precision}-bit "
                              f"samples decode to {nbytes} bytes, more than max_pixels={self.max_pixels} 8-bit RGBA "
                              "pixels (a decompression bomb?); to allow larger images raise the limit: "
                              "ingest.defaults.set(max_pixels=N) or the INGEST_MAX_PIXELS environment variable",
                              path=name)
        return header

    # -- JPEG ----------------------------------------------------------------------------------------

    def _jpeg_header(self, buf: memoryview, name: str) -> JpegHeader:
        header = read_jpeg_header(buf)
        if header is None:
            raise DecodeError("JPEG has no frame header (SOF) before its image data", path=name)
        self._check_size(header.height, header.width, name)
        return header

    def _decode_jpeg(self, data: Buffer, buf: memoryview, header: JpegHeader, min_size: Size | None,
                     name: str) -> np.ndarray:
        """Stored (unoriented) pixels of a JPEG: simplejpeg, or Pillow for what libjpeg-turbo refuses."""
        min_h, min_w = _stored_min_size(min_size, header.orientation)
        cmyk = header.components == 4
        try:
            pixels = simplejpeg.decode_jpeg(buf, colorspace="CMYK" if cmyk else "RGB", strict=True,
                                            min_height=min_h, min_width=min_w)
        except ValueError as err:
            if any(text in str(err) for text in _LOST_DATA):
                what = "truncated JPEG" if "end of JPEG file" in str(err) else "corrupt JPEG data"
                raise DecodeError(f"{what} (libjpeg: {err})", path=name) from err
            return self._decode_jpeg_with_pillow(data, buf, name, err)
        return _cmyk_to_rgb(pixels) if cmyk else pixels

    def _decode_jpeg_with_pillow(self, data: Buffer, buf: memoryview, name: str,
                                 libjpeg_error: ValueError) -> np.ndarray:
        try:
            with self._open_pillow(data, buf, name) as img:
                return _pillow_pixels(img, name)
        except DecodeError as err:
            raise DecodeError(f"{_reason(err)}; libjpeg-turbo: {libjpeg_error}", path=name) from err

    # -- Pillow --------------------------------------------------------------------------------------

    def _open_pillow(self, data: Buffer, buf: memoryview, name: str) -> Image.Image:
        """Pillow's lazy open (reads the header only), with the size checked."""
        if not len(buf):
            raise DecodeError("empty file", path=name)
        # BytesIO shares a bytes object's memory; other buffers are copied once (Pillow needs a file).
        stream = io.BytesIO(data if isinstance(data, bytes) else buf)
        try:
            img = Image.open(stream, formats=PILLOW_FORMATS)
        except UnidentifiedImageError as err:
            raise DecodeError(f"not an image of a known format ({', '.join(PILLOW_FORMATS)}) or its header "
                              "is damaged", path=name) from err
        except Exception as err:  # Pillow's plugins raise many types (SyntaxError, struct.error, ...)
            raise DecodeError(f"cannot read the image header: {_describe(err)}", path=name) from err
        try:
            self._check_size(img.height, img.width, name)
        except DecodeError:
            img.close()
            raise
        return img

    def _check_size(self, height: int, width: int, name: str) -> None:
        if height <= 0 or width <= 0:
            raise DecodeError(f"image has no pixels ({width}x{height})", path=name)
        if height * width > self.max_pixels:
            raise DecodeError(f"{width}x{height} = {width * height} pixels exceeds max_pixels={self.max_pixels} "
                              "(a decompression bomb?); to allow larger images raise the limit: "
                              "ingest.defaults.set(max_pixels=N) or the INGEST_MAX_PIXELS environment variable",
                              path=name)

    def _decode_or_error(self, data: Buffer, name: str, min_size: Size | None,
                         region: tuple[int, int, int, int] | None = None) -> np.ndarray | DecodeError:
        try:
            return self.decode(data, name, min_size=min_size, region=region)
        except DecodeError as err:
            return err

    def _decode_timed(self, data: Buffer, name: str, region: tuple[int, int, int, int] | None
                      ) -> tuple[np.ndarray | DecodeError, float]:
        image = self._decode_or_error(data, name, None, region)
        return image, time.perf_counter()


# -- helpers ------------------------------------------------------------------------------------------


class JpegHeader(NamedTuple):
    """What the segments before a JPEG's first scan say."""

    height: int       # as stored, before orientation
    width: int
    components: int   # 1 gray, 3 YCbCr/RGB, 4 CMYK/YCCK
    precision: int    # bits per sample
    process: int      # SOF marker: C0 baseline, C1 extended, C2 progressive, C3 lossless, C9+ arithmetic
    orientation: int  # EXIF (or XMP) orientation, 1-8
    rgb: bool = False  # 3 components stored as RGB, not YCbCr (Adobe transform 0, or component ids 'R','G','B')


def as_buffer(data: Buffer, name: str) -> memoryview:
    """A flat byte view of ``data`` (no copy); TypeError naming ``name`` for what has no such view."""
    try:
        buf = memoryview(data)
        if not buf.c_contiguous:
            raise TypeError("not contiguous")
        return buf if buf.format == "B" and buf.ndim == 1 else buf.cast("B")
    except TypeError as err:
        raise TypeError(f"{name}: expected bytes, memoryview or a contiguous uint8 array, "
                        f"got {type(data).__name__}") from err


def is_jpeg(buf: memoryview) -> bool:
    """Whether the bytes start like a JPEG (SOI, then a marker): the name is never trusted."""
    return buf[:3] == JPEG_SIGNATURE


#: Columns of a :func:`jpeg_headers` row. kind: 0 not a JPEG, 1 a JPEG with a frame header, 2 a JPEG without
#: one; then :class:`JpegHeader`'s fields (0 unless kind is 1); eoi: whether the bytes end with EOI (FF D9).
HEADER_COLUMNS = ("kind", "height", "width", "components", "precision", "process", "orientation", "rgb", "eoi")


def jpeg_headers(datas: Sequence[Buffer]) -> np.ndarray:
    """An ``[n, 9]`` int64 table of :data:`HEADER_COLUMNS`, row k read from ``datas[k]`` as
    :func:`read_jpeg_header` reads it: in one call to ``ingest.formats._jpeg`` (which keeps the GIL: a batch takes
    microseconds, less than getting the GIL back beside a busy thread), or, where that was not built, image by
    image here."""
    out = zeros((len(datas), len(HEADER_COLUMNS)), np.int64)
    if NATIVE_HEADERS is not None:
        NATIVE_HEADERS.headers(datas, out)
        return out
    for row, data in zip(out, datas):
        buf = memoryview(data).cast("B")
        row[8] = buf[-2:] == b"\xff\xd9"
        if is_jpeg(buf):
            header = read_jpeg_header(buf)
            row[0] = 2 if header is None else 1
            if header is not None:
                row[1:8] = header
    return out


def header_of(row: np.ndarray) -> JpegHeader | None:
    """The :class:`JpegHeader` of a :func:`jpeg_headers` row (None unless it is a JPEG with a frame header)."""
    return JpegHeader(*row[1:7].tolist(), bool(row[7])) if row[0] == 1 else None


def read_jpeg_header(buf: memoryview) -> JpegHeader | None:
    """The frame header and orientation of a JPEG (``is_jpeg(buf)``), read from the segments before the first
    scan; None when no frame header comes before it. Junk between segments is skipped to the next marker, as
    libjpeg does."""
    frame = None
    exif_orientation = xmp_orientation = None
    adobe_transform = component_ids = None
    pos, size = 2, len(buf)
    while pos + 1 < size:
        if buf[pos] == 0xFF and buf[pos + 1] not in (0x00, 0xFF):  # the usual case: the next marker is here
            marker, pos = buf[pos + 1], pos + 2
        elif (match := _MARKER.search(buf, pos)) is not None:       # fill bytes or junk before it
            marker, pos = match.group(1)[0], match.end()
        else:
            break
        if marker in _STANDALONE_MARKERS:
            continue
        if marker in (0xD9, 0xDA) or pos + 2 > size:  # EOI or SOS: no more header segments
            break
        length = (buf[pos] << 8) | buf[pos + 1]
        start, pos = pos + 2, pos + length
        if marker not in _HEADER_MARKERS:  # tables (DQT, DHT, ...) and other application data: skipped
            continue
        segment = buf[start:pos]
        if marker in _SOF_MARKERS and frame is None and len(segment) >= 6:
            precision, height, width, components = struct.unpack_from(">BHHB", segment)
            frame = (height, width, components, precision, marker)
            component_ids = bytes(segment[6:6 + 3 * components:3])
        elif marker == 0xEE and segment[:5] == b"Adobe" and len(segment) >= 12:
            adobe_transform = segment[11]
        elif marker == 0xE1 and segment[:6] == b"Exif\x00\x00" and exif_orientation is None:
            exif_orientation = _tiff_orientation(segment[6:])
        elif marker == 0xE1 and segment[:len(_XMP_PREFIX)] == _XMP_PREFIX and xmp_orientation is None:
            found = _XMP_ORIENTATION.search(segment)
            xmp_orientation = int(found.group(1)) if found else None
    if frame is None:
        return None
    orientation = exif_orientation or xmp_orientation
    rgb = frame[2] == 3 and (adobe_transform == 0 or (adobe_transform is None and component_ids == b"RGB"))
    return JpegHeader(*frame, orientation if orientation in _ORIENT else 1, rgb)


def _tiff_orientation(tiff: memoryview) -> int | None:
    """The Orientation tag of IFD0 of a TIFF (EXIF) block, or None if absent or unreadable."""
    order = {b"II": "<", b"MM": ">"}.get(bytes(tiff[:2]))
    if order is None:
        return None
    try:
        (ifd,) = struct.unpack_from(order + "I", tiff, 4)
        (count,) = struct.unpack_from(order + "H", tiff, ifd)
        for entry in range(ifd + 2, ifd + 2 + 12 * count, 12):
            tag, kind = struct.unpack_from(order + "HH", tiff, entry)
            if tag == _ORIENTATION_TAG:
                value_format = {3: "H", 4: "I"}.get(kind)  # SHORT, as the standard says, or LONG
                return struct.unpack_from(order + value_format, tiff, entry + 8)[0] if value_format else None
    except struct.error:  # an offset past the end of the block
        return None
    return None


def _pillow_orientation(img: Image.Image) -> int:
    """EXIF/XMP orientation of a lazily opened image, without decoding it (see the module docstring)."""
    if img.format == "PNG" and "exif" not in img.info:
        return 1  # Pillow would decode the whole PNG looking for an eXIf chunk after the pixel data
    try:
        orientation = img.getexif().get(_ORIENTATION_TAG, 1)
    except Exception:  # a malformed EXIF block: like Pillow's exif_transpose, ignore it
        return 1
    return orientation if orientation in _ORIENT else 1


def _pillow_pixels(img: Image.Image, name: str) -> np.ndarray:
    """Decode a lazily opened image to stored (unoriented) RGB uint8, alpha dropped, 16-bit >> 8."""
    try:
        img.load()  # raises on truncated data: LOAD_TRUNCATED_IMAGES is left False
        img.info.pop("transparency", None)  # alpha is dropped: the colour key goes too (and its warning)
        if img.mode.startswith("I;16"):
            gray = (np.asarray(img) >> 8).astype(np.uint8)
            return np.repeat(gray[:, :, None], 3, axis=2)
        return np.array(img if img.mode == "RGB" else img.convert("RGB"))
    except Exception as err:  # Pillow's decoders raise OSError, SyntaxError, ValueError, EOFError, ...
        raise DecodeError(f"cannot decode: {_describe(err)}", path=name) from err


def _pillow_samples(img: Image.Image, buf: memoryview, name: str) -> tuple[np.ndarray, int]:
    """Decode a lazily opened image to its stored samples (gray, gray+alpha, RGB or RGBA) and their precision,
    for `codecs.finish`. A 16-bit colour PNG (which Pillow reduces to 8 bits) is read by imagecodecs instead."""
    try:
        if img.format == "PNG" and bytes(buf[24:26]) in (b"\x10\x02", b"\x10\x06"):   # IHDR: 16-bit RGB(A)
            if codecs.imagecodecs is None:
                raise DecodeError(f"16-bit colour PNG samples need imagecodecs: {codecs.INSTALL}", path=name)
            return codecs.imagecodecs.png_decode(buf), 16
        img.load()
        if img.mode.startswith("I;16"):
            return np.asarray(img).astype(np.uint16), 16
        if img.mode in ("I", "F"):
            samples = np.asarray(img)
            return (samples, 0) if img.mode == "F" else (np.clip(samples, 0, 65535).astype(np.uint16), 16)
        if img.mode not in ("L", "LA", "RGB", "RGBA"):
            alpha = "A" in img.mode or "a" in img.mode or "transparency" in img.info
            img = img.convert(("LA" if img.mode == "1" else "RGBA") if alpha else ("L" if img.mode == "1"
                                                                                    else "RGB"))
        return np.array(img), 8
    except DecodeError:
        raise
    except Exception as err:  # Pillow's decoders raise OSError, SyntaxError, ValueError, EOFError, ...
        raise DecodeError(f"cannot decode: {_describe(err)}", path=name) from err


def _cmyk_to_rgb(cmyk: np.ndarray) -> np.ndarray:
    """Pillow's conversion of a JPEG's CMYK (stored inverted, the Adobe way) to RGB, bit for bit."""
    c = cmyk.astype(np.uint16)
    k = c[:, :, 3:]
    t = (255 - c[:, :, :3]) * k + 128
    return (k - (((t >> 8) + t) >> 8)).astype(np.uint8)


def _orient(pixels: np.ndarray, orientation: int) -> np.ndarray:
    if orientation == 1:
        return pixels
    return np.ascontiguousarray(_ORIENT[orientation](pixels))


def _oriented(height: int, width: int, orientation: int) -> Size:
    return (width, height) if orientation >= 5 else (height, width)


def _stored_min_size(min_size: Size | None, orientation: int) -> Size:
    """``min_size`` (displayed) in stored coordinates, as simplejpeg's (min_height, min_width); 0 = none."""
    if min_size is None:
        return 0, 0
    height, width = min_size
    if height < 0 or width < 0:
        raise ValueError(f"`min_size` must be >= 0, got {min_size}")
    return _oriented(height, width, orientation)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def _reason(err: DecodeError) -> str:
    """A DecodeError's message without the ``path: `` prefix the constructor adds."""
    return str(err).removeprefix(f"{err.path}: ")
