"""JPEG 2000, TIFF and binary PNM/PAM on the CPU, and the output rules (precision, channels) every decode follows.

Which library decodes what (the reasons are in docs/design.md, "CPU decode and its libraries"):

- **JPEG 2000** (a JP2 file or a bare J2K codestream): OpenJPEG through ``imagecodecs`` (the ``codecs`` extra).
  Without it a JPEG 2000 file is a :class:`~ingest.errors.DecodeError` naming the extra to install.
- **TIFF**: libtiff through ``imagecodecs``, which is built with every compression TIFF files use (LZW, Deflate,
  ZSTD, WebP, JPEG, LERC, PackBits, ...) and libtiff's predictors (horizontal and floating point). Without
  ``imagecodecs`` TIFFs go to Pillow, which reads the common ones.
- **PNM** (binary PGM ``P5``, PPM ``P6`` and PAM ``P7``, 8 or 16 bits): read here, a text header and raw samples.
  The text and bitmap variants (``P1``-``P4``) go to Pillow.

Output rules (:func:`finish`), for every format:

- ``dtype`` uint8: integer samples of more than 8 bits keep their 8 most significant bits of the stored
  precision (a 16-bit sample ``>> 8``, a 12-bit one ``>> 4``), never rounded or clipped. uint16: the stored
  values unchanged (a 12-bit image stays in 0..4095, an 8-bit one in 0..255).
- Floating-point samples are clipped to [0, 1] and scaled to the dtype's range (255 or 65535), rounded.
- ``channels`` 3: gray is repeated, alpha dropped. 1: gray as stored; colour becomes luma with Pillow's
  ITU-R 601 weights (``(19595 R + 38470 G + 7471 B + 32768) >> 16``). 4: alpha kept, or opaque (the largest
  value of the stored precision) where there is none.

libtiff's and OpenJPEG's warnings reach the console only when the ``ingest`` logger is at DEBUG
(:func:`verbose`); their errors become :class:`DecodeError`\\ s naming the file.
"""

from __future__ import annotations

import logging
import struct
import zlib
from typing import Any, NamedTuple

import numpy as np

from ingest._numpy import zeros
from ingest.decode import openjpeg
from ingest.errors import ConfigError, DecodeError

try:
    import imagecodecs
except ImportError:  # the `codecs` extra is not installed: JPEG 2000 is refused, TIFF goes to Pillow
    imagecodecs = None

JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  \r\n\x87\n"
J2K_SIGNATURE = b"\xff\x4f\xff\x51"   # SOC, then SIZ
TIFF_SIGNATURES = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")   # classic and BigTIFF, both byte orders
#: The PNM kinds read here: gray, RGB and PAM, binary.
PNM_SIGNATURES = (b"P5", b"P6", b"P7")

#: Output dtypes by name, and channel counts, that decoders take.
DTYPES = ("uint8", "uint16")
CHANNELS = (1, 3, 4)
#: Most components (samples per pixel) a JPEG 2000 or TIFF may have here: gray, gray+alpha, RGB, RGBA.
MAX_COMPONENTS = 4
#: Most tiles a JPEG 2000 codestream may have (its tile index, Isot, is 16 bits): more is a hostile header that
#: would make the decoder allocate a structure per tile.
MAX_TILES = 65535
#: Largest TIFF tile accepted beyond four times the image's pixels (tiles may overhang a small image).
MAX_TILE_PIXELS = 1 << 20

#: Header table kinds (column 0 of `ingest.decode.cpu.jpeg_headers`' table, beside its 0-2) of a JPEG 2000 or TIFF
#: that the GPU decodes (`Header.gpu`): `table_row` makes their rows.
KIND_JPEG2K, KIND_TIFF = 3, 4

#: What to install for the codecs imagecodecs brings (its absence is named in errors).
INSTALL = "pip install 'ingest[codecs]'"
_log = logging.getLogger("ingest")


class Header(NamedTuple):
    """What a JPEG 2000 or TIFF header says, before any pixel is decoded."""

    codec: str        # "jpeg2k" or "tiff" (nvImageCodec's codec names)
    height: int
    width: int
    components: int   # samples per pixel
    precision: int    # bits per sample (the largest over the components)
    orientation: int  # TIFF's Orientation tag (1-8); 1 for JPEG 2000
    photometric: int  # TIFF's PhotometricInterpretation; 1 (gray) or 2 (RGB) for JPEG 2000
    gpu: bool         # a kind nvImageCodec decodes to the CPU path's pixels (see `ingest.decode.gpu`), complete:
                      # a JPEG 2000 codestream ending with EOC, a TIFF whose strips or tiles lie within the file
    region: bool = False   # a JPEG 2000 image OpenJPEG decodes an area of as its whole decode has it (`decode`'s
                           # ``region``): every component at full resolution, at most 16 bits, plain colours,
                           # complete


def sniff(buf: memoryview) -> str | None:
    """The format the bytes start like: "jpeg2k", "tiff", "pnm" (binary P5/P6/P7) or None."""
    head = bytes(buf[:12])
    if head == JP2_SIGNATURE or head[:4] == J2K_SIGNATURE:
        return "jpeg2k"
    if head[:4] in TIFF_SIGNATURES:
        return "tiff"
    if head[:2] in PNM_SIGNATURES and len(head) > 2 and head[2:3].isspace():
        return "pnm"
    return None


def output_options(dtype: Any, channels: int) -> tuple[str, int]:
    """``(dtype name, channels)`` checked: dtype uint8 or uint16 (numpy or torch, or its name), channels 1, 3, 4."""
    name = dtype if isinstance(dtype, str) else str(dtype).rsplit(".", 1)[-1]   # torch.uint16 -> "uint16"
    try:
        name = np.dtype(dtype).name   # numpy scalar types and dtypes
    except TypeError:
        pass
    if name not in DTYPES:
        raise ConfigError(f"Unknown decode dtype {dtype!r}. Available: {', '.join(DTYPES)}")
    if channels not in CHANNELS:
        raise ConfigError(f"`channels` must be one of {', '.join(map(str, CHANNELS))}, got {channels!r}")
    return name, channels


def verbose() -> bool:
    """Whether codec libraries may print their warnings: only with the ``ingest`` logger at DEBUG."""
    return _log.isEnabledFor(logging.DEBUG)


# -- headers --------------------------------------------------------------------------------------------------


class Unsupported(ValueError):
    """A well-formed header of a kind that is not decoded here (signed samples, a component layout)."""


def read_header(buf: memoryview, codec: str, name: str) -> Header:
    """The :class:`Header` of a JPEG 2000 or TIFF file; :class:`DecodeError` naming the file where it is unreadable
    or of a kind not decoded here."""
    try:
        return _jpeg2k_header(buf) if codec == "jpeg2k" else _tiff_header(buf)
    except Unsupported as err:
        raise DecodeError(f"unsupported {_NAMES[codec]}: {err}", path=name) from err
    except (struct.error, IndexError, ValueError, OverflowError) as err:
        raise DecodeError(f"unreadable {_NAMES[codec]} header: {err}", path=name) from err


_NAMES = {"jpeg2k": "JPEG 2000", "tiff": "TIFF", "pnm": "PNM"}


def _plain_colour(buf: memoryview, pos: int, end: int, colours: tuple[int, ...] = ()) -> bool:
    """Whether a JP2 header box (``jp2h``, its contents from ``pos`` to ``end``) names colours the GPU decodes as
    the CPU decoder does: no palette (``pclr``), no channel definition (``cdef``) other than colour channels in
    codestream order (the CPU decoder reorders channels by it), no ICC profile (a ``colr`` box of method 2 or 3,
    which the CPU decoder applies, as OpenJPEG's own tools do, and nvJPEG2000 ignores) and, where a ``colr`` box
    enumerates the colour space, sRGB or greyscale (not sYCC, CMYK, CIELab...) or one of ``colours``."""
    while pos + 8 <= end:
        length, kind = struct.unpack_from(">I4s", buf, pos)
        if kind == b"pclr":
            return False
        if kind == b"cdef" and length >= 10:   # N, then (channel, type, association) per channel
            count = min(struct.unpack_from(">H", buf, pos + 8)[0], (length - 10) // 6)
            for at in range(pos + 10, pos + 10 + 6 * count, 6):
                channel, kind_of, association = struct.unpack_from(">3H", buf, at)
                if kind_of != 0 or association != channel + 1:   # an opacity channel, or colours reordered
                    return False
        if kind == b"colr" and length >= 12 and buf[pos + 8] in (2, 3):   # an ICC profile (restricted or any)
            return False
        if kind == b"colr" and length >= 15 and buf[pos + 8] == 1:   # method 1: an enumerated colour space
            if struct.unpack_from(">I", buf, pos + 11)[0] not in _PLAIN_COLOURS + colours:
                return False
        if length < 8:
            break
        pos += length
    return True


#: JP2 enumerated colour spaces nvJPEG2000 and OpenJPEG give alike: sRGB and greyscale.
_PLAIN_COLOURS = (16, 17)


def codestream(buf: memoryview, colours: tuple[int, ...] = ()) -> tuple[int, int, bool]:
    """Where the JPEG 2000 codestream of a JP2 file or bare codestream lies (start, end) and whether its JP2
    colours are plain (`_plain_colour`, also allowing the enumerated ``colours``); ValueError where the boxes are
    malformed or the codestream does not start with SOC, SIZ."""
    start, end, plain = 0, len(buf), True
    if bytes(buf[:12]) == JP2_SIGNATURE:   # JP2 boxes: find the contiguous codestream box ('jp2c')
        pos, size = 0, len(buf)
        while True:
            if pos + 8 > size:
                raise ValueError("no codestream box (jp2c)")
            length, kind = struct.unpack_from(">I4s", buf, pos)
            head = 8
            if length == 1:
                (length,), head = struct.unpack_from(">Q", buf, pos + 8), 16
            if kind == b"jp2c":
                start, end = pos + head, (pos + length if length else size)
                break
            if kind == b"jp2h":
                plain = _plain_colour(buf, pos + head, pos + length if length else size, colours)
            if length < head:   # 0: the box runs to the end (only the last may), anything else is malformed
                raise ValueError(f"box {kind!r} at byte {pos} has length {length}")
            pos += length
    if bytes(buf[start:start + 4]) != J2K_SIGNATURE:
        raise ValueError("the codestream does not start with SOC, SIZ")
    return start, end, plain


class Siz(NamedTuple):
    """A codestream's SIZ marker: the reference grid and its tiling (ISO/IEC 15444-1, A.5.1)."""

    width: int        # Xsiz: the grid's right edge (the image spans x0 .. width)
    height: int       # Ysiz
    x0: int           # XOsiz: the image's offset on the grid
    y0: int           # YOsiz
    tile_width: int   # XTsiz
    tile_height: int  # YTsiz
    tile_x0: int      # XTOsiz: the first tile's offset
    tile_y0: int      # YTOsiz
    steps: tuple[tuple[int, int], ...]   # (XRsiz, YRsiz) per component
    precisions: tuple[int, ...]          # bits per component
    signed: bool

    @property
    def tiles_x(self) -> int:
        return -(-(self.width - self.tile_x0) // self.tile_width)

    @property
    def tiles_y(self) -> int:
        return -(-(self.height - self.tile_y0) // self.tile_height)


def read_siz(buf: memoryview, start: int = 0) -> Siz:
    """The SIZ marker of the codestream at ``start`` (after SOC); ValueError or struct.error where it is short."""
    if bytes(buf[start:start + 4]) != J2K_SIGNATURE:
        raise ValueError("the codestream does not start with SOC, SIZ")
    xs, ys, xo, yo, xt, yt, xto, yto = struct.unpack_from(">8I", buf, start + 8)
    (count,) = struct.unpack_from(">H", buf, start + 40)
    if count < 1 or count > 16384:
        raise ValueError(f"SIZ says {count} components")
    comps = [struct.unpack_from(">3B", buf, start + 42 + 3 * c) for c in range(count)]
    if xs <= xo or ys <= yo or xt == 0 or yt == 0 or xto > xo or yto > yo or xto + xt <= xo or yto + yt <= yo:
        raise ValueError(f"SIZ grid {xs}x{ys} from ({xo}, {yo}), tiles {xt}x{yt} from ({xto}, {yto})")
    out = Siz(xs, ys, xo, yo, xt, yt, xto, yto, tuple((dx, dy) for _, dx, dy in comps),
              tuple((s & 0x7F) + 1 for s, _, _ in comps), any(s & 0x80 for s, _, _ in comps))
    if out.tiles_x * out.tiles_y > MAX_TILES:
        raise ValueError(f"{out.tiles_x * out.tiles_y} tiles, more than a codestream can index ({MAX_TILES})")
    return out


def _jpeg2k_header(buf: memoryview) -> Header:
    start, end, plain = codestream(buf)
    siz = read_siz(buf, start)
    csiz, precision = len(siz.steps), max(siz.precisions)
    if siz.signed:   # refused before decoding, as the other layouts not decoded here
        raise Unsupported(f"signed samples ({precision}-bit) are not supported")
    steps = list(siz.steps)
    full = all(step == (1, 1) for step in steps)
    chroma = len(steps) >= 3 and steps[0] == (1, 1) and steps[1] == steps[2] in _CHROMA_STEPS and \
        all(step == (1, 1) for step in steps[3:])
    if not (full or chroma):
        # OpenJPEG's colour conversion prints to stderr and gives up on any other layout
        raise Unsupported(f"component subsampling {steps} is not supported")
    complete = end <= len(buf) and bytes(buf[end - 2:end]) == b"\xff\xd9"   # ends with EOC: not truncated
    # nvJPEG2000 asks for image and tile start coordinates of 0 (its user guide); with others it may crash the
    # process (the conformance codestream e1_colr.j2c does, through nvImageCodec)
    at_origin = not (siz.x0 or siz.y0 or siz.tile_x0 or siz.tile_y0)
    gpu = csiz in (1, 3) and precision == 8 and full and complete and plain and at_origin
    region = full and complete and plain and precision <= 16 and csiz <= MAX_COMPONENTS
    return Header("jpeg2k", siz.height - siz.y0, siz.width - siz.x0, csiz, precision, 1, 1 if csiz < 3 else 2, gpu,
                  region)


#: Chroma subsampling of components 1 and 2 (their horizontal, vertical steps) that JPEG 2000 files may have:
#: 4:2:2 and 4:2:0 YCC, which OpenJPEG converts to RGB.
_CHROMA_STEPS = ((2, 1), (2, 2))

# TIFF tags read here, and the compressions and photometrics nvTIFF takes.
_TAGS = {256: "width", 257: "height", 258: "bits", 259: "compression", 262: "photometric", 274: "orientation",
         277: "spp", 278: "rows_per_strip", 284: "planar", 317: "predictor", 322: "tile_width", 323: "tile_length",
         339: "format"}
_CHUNK_TAGS = {273: "offsets", 279: "counts", 324: "offsets", 325: "counts"}   # strips' or tiles' data
#: Most strips or tiles whose extent `_tiff_header` checks; a file with more is left to the CPU decoder.
_MAX_CHUNKS = 1 << 16
_TIFF_TYPES = {1: "B", 3: "H", 4: "I", 16: "Q"}   # BYTE, SHORT, LONG, LONG8
_GPU_COMPRESSIONS = (1, 5, 8, 32946)   # none, LZW, Deflate (Adobe and old)
_GPU_PHOTOMETRICS = (1, 2)             # min-is-black, RGB


def _tiff_header(buf: memoryview) -> Header:
    order = "<" if bytes(buf[:2]) == b"II" else ">"
    big = struct.unpack_from(order + "H", buf, 2)[0] == 43
    if big:
        (ifd,) = struct.unpack_from(order + "Q", buf, 8)
        (count,), entry, first = struct.unpack_from(order + "Q", buf, ifd), 20, ifd + 8
        layout, inline = order + "HHQ", 8
    else:
        (ifd,) = struct.unpack_from(order + "I", buf, 4)
        (count,), entry, first = struct.unpack_from(order + "H", buf, ifd), 12, ifd + 2
        layout, inline = order + "HHI", 4
    if count > 4096:
        raise ValueError(f"the first directory claims {count} entries")
    tags: dict[str, int] = {}
    chunks: dict[str, np.ndarray] = {}
    for pos in range(first, first + entry * count, entry):
        tag, kind, n = struct.unpack_from(layout, buf, pos)
        if (tag not in _TAGS and tag not in _CHUNK_TAGS) or kind not in _TIFF_TYPES or n < 1:
            continue
        fmt = order + _TIFF_TYPES[kind]
        at = pos + entry - inline
        if struct.calcsize(fmt) * n > inline:   # the values are elsewhere
            (at,) = struct.unpack_from(order + ("Q" if big else "I"), buf, at)
        if tag in _TAGS:
            tags[_TAGS[tag]] = struct.unpack_from(fmt, buf, at)[0]
        elif n <= _MAX_CHUNKS and at + struct.calcsize(fmt) * n <= len(buf):
            chunks[_CHUNK_TAGS[tag]] = np.frombuffer(buf, np.dtype(fmt), n, at).astype(np.uint64)
    if "width" not in tags or "height" not in tags:
        raise ValueError("the first directory has no ImageWidth or ImageLength")
    tile = tags.get("tile_width", 0) * tags.get("tile_length", 0)
    if tile > max(4 * tags["width"] * tags["height"], MAX_TILE_PIXELS):
        # libtiff allocates a whole tile before decoding any: a hostile tile size is an allocation of gigabytes
        raise ValueError(f"tiles of {tags.get('tile_width')}x{tags.get('tile_length')} pixels for a "
                         f"{tags['width']}x{tags['height']} image")
    spp, bits = tags.get("spp", 1), tags.get("bits", 1)
    photometric = tags.get("photometric", 1 if spp < 3 else 2)
    if tags.get("format", 1) == 2 and photometric in (1, 2):   # SampleFormat 2: gray or RGB signed integers
        raise Unsupported(f"signed {bits}-bit integer samples are not supported")
    orientation = tags.get("orientation", 1)
    offsets, counts = chunks.get("offsets"), chunks.get("counts")
    size = np.uint64(len(buf))
    complete = offsets is not None and counts is not None and len(offsets) == len(counts) and \
        bool(((offsets <= size) & (counts <= size) & (offsets + counts <= size)).all())   # within the file
    gpu = (spp == {1: 1, 2: 3}.get(photometric) and bits == 8 and tags.get("format", 1) == 1
           and tags.get("compression", 1) in _GPU_COMPRESSIONS and tags.get("planar", 1) == 1
           and tags.get("predictor", 1) in (1, 2) and complete and not _long_last_strip(buf, tags, offsets, counts))
    return Header("tiff", tags["height"], tags["width"], spp, bits, orientation if 1 <= orientation <= 8 else 1,
                  photometric, bool(gpu))


def _long_last_strip(buf: memoryview, tags: dict[str, int], offsets: np.ndarray, counts: np.ndarray) -> bool:
    """Whether a Deflate-compressed 8-bit image's last strip, due fewer rows than the others, inflates to more
    than it is due. libtiff ignores the rest; nvTIFF decoded such a file (libtiff's
    deflate-last-strip-extra-data.tiff) wrong inside a batch, so it goes to the CPU. Inflates at most the last
    strip's due bytes plus one; LZW strips and single-strip images are not checked."""
    if tags.get("compression", 1) not in (8, 32946) or "tile_width" in tags or len(offsets) < 2:
        return False
    height, rows = tags["height"], tags.get("rows_per_strip", tags["height"])
    due_rows = height - (len(offsets) - 1) * rows
    if not 0 < due_rows < rows:
        return False
    due = due_rows * tags["width"] * tags.get("spp", 1)
    start, size = int(offsets[-1]), int(counts[-1])
    try:
        return len(zlib.decompressobj().decompress(buf[start:start + size], due + 1)) > due
    except zlib.error:   # damaged: the decoders say so
        return False


def table_row(header: Header) -> tuple[int, ...]:
    """A GPU-eligible header as a row of the JPEG header table (`ingest.decode.cpu.HEADER_COLUMNS`): kind
    `KIND_JPEG2K` or `KIND_TIFF`, height, width, components, precision, 0, orientation, 0 and 1 (complete)."""
    kind = KIND_JPEG2K if header.codec == "jpeg2k" else KIND_TIFF
    return kind, header.height, header.width, header.components, header.precision, 0, header.orientation, 0, 1


# -- decoding -------------------------------------------------------------------------------------------------


def decode(buf: memoryview, codec: str, header: Header | None, name: str, region: Roi | None = None
           ) -> tuple[np.ndarray, int]:
    """Stored (unoriented) samples of a JPEG 2000, TIFF or PNM file, ``[H, W]`` or ``[H, W, C]``, and their
    precision in bits (0 for floating point). :class:`DecodeError` naming the file for anything refused.

    ``region`` = (x0, y0, x1, y1): only those pixels are needed. A JPEG 2000 image whose header allows it
    (``Header.region``) then has just that area decoded by OpenJPEG (`ingest.decode.openjpeg`) and the rest of
    the array left 0; inside the area the samples are the whole decode's. Other images are decoded whole."""
    if codec == "pnm":
        return read_pnm(buf, name)
    if imagecodecs is None:
        raise DecodeError(f"decoding {_NAMES[codec]} needs imagecodecs: {INSTALL}", path=name)
    if codec == "jpeg2k" and region is not None and header is not None and header.region:
        area = clip_roi(region, header.height, header.width)
        if area is not None and openjpeg.available():
            x0, y0, x1, y1 = area
            shape = (header.height, header.width) + ((header.components,) if header.components > 1 else ())
            # zeroed holding the GIL (ingest._numpy): the decode call below is then the image's one hand-off
            samples = zeros(shape, np.uint8 if header.precision <= 8 else np.uint16)
            openjpeg.decode_area(buf, area, name, jp2=bytes(buf[:12]) == JP2_SIGNATURE, out=samples[y0:y1, x0:x1])
            return samples, header.precision
    try:
        if codec == "jpeg2k":
            samples = imagecodecs.jpeg2k_decode(buf, verbose=verbose(), numthreads=1)
            if samples.dtype.kind != "u":
                raise ValueError(f"signed ({samples.dtype}) samples are not supported")
            return samples, header.precision
        return _tiff(buf, header)
    # imagecodecs raises its codecs' errors (RuntimeErrors) and, for damaged directories, ValueError/IndexError
    except (RuntimeError, ValueError, IndexError, OverflowError, MemoryError) as err:
        raise DecodeError(f"cannot decode {_NAMES[codec]}: {err}", path=name) from err


Roi = tuple[int, int, int, int]  # x0, y0, x1, y1 in (oriented) source pixels


def clip_roi(roi: Roi | None, height: int, width: int) -> Roi | None:
    """``roi`` clipped to a ``height`` x ``width`` image; None when there is no region worth decoding alone
    (none given, empty after clipping, or the whole image). Called per image: plain comparisons, no loops."""
    if roi is None:
        return None
    x0, y0, x1, y1 = roi
    x0, y0 = (int(x0) if x0 > 0 else 0), (int(y0) if y0 > 0 else 0)
    x1, y1 = (int(x1) if x1 < width else width), (int(y1) if y1 < height else height)
    if x1 <= x0 or y1 <= y0 or (x0 == 0 and y0 == 0 and x1 == width and y1 == height):
        return None
    return x0, y0, x1, y1


def _tiff(buf: memoryview, header: Header) -> tuple[np.ndarray, int]:
    """The first directory's samples. Gray and RGB of whole-byte samples come as stored; palette, YCbCr, CMYK,
    Lab, min-is-white and bilevel images through libtiff's RGBA interface (8-bit RGBA)."""
    loud = verbose()
    if header.photometric not in (1, 2) or header.precision not in (8, 16, 32, 64):
        rgba = imagecodecs.tiff_decode(buf, asrgb=True, verbose=loud)
        flips = _RGBA_FLIPS.get(header.orientation)   # libtiff flipped these rows and columns: undone
        return (np.flip(rgba, flips) if flips else rgba), 8
    pixels = imagecodecs.tiff_decode(buf, verbose=loud)
    c = header.components
    if pixels.ndim == 3 and c > 1 and pixels.shape == (c, header.height, header.width):
        pixels = pixels.transpose(1, 2, 0)   # planar (separate) samples
    if pixels.shape[:2] != (header.height, header.width) or (pixels.ndim == 3) != (c > 1):
        raise ValueError(f"libtiff gave samples of shape {pixels.shape} for a {header.width}x{header.height} "
                         f"image of {c} samples per pixel")
    if pixels.dtype.kind == "f":
        return pixels, 0
    if pixels.dtype.kind != "u":
        raise ValueError(f"{pixels.dtype} samples are not supported")
    return pixels, header.precision


#: The axes libtiff's RGBA interface (asked for top-left rows, as imagecodecs asks) flips per Orientation tag;
#: it never transposes. The stored pixels are these flips undone; the orientation is then applied like a JPEG's.
_RGBA_FLIPS = {2: (1,), 6: (1,), 3: (0, 1), 7: (0, 1), 4: (0,), 8: (0,)}


def read_pnm(buf: memoryview, name: str) -> tuple[np.ndarray, int]:
    """Samples of a binary PGM (P5), PPM (P6) or PAM (P7) with their precision: 8 where the maxval is below 256
    (a smaller maxval scaled to 0..255), else the maxval's bit length (2-byte big-endian samples)."""
    magic = bytes(buf[:2])
    try:
        if magic == b"P7":
            width, height, depth, maxval, pos = _pam_header(buf)
        else:
            (width, height, maxval), pos = _tokens(buf, 2, 3)
            depth = 1 if magic == b"P5" else 3
    except ValueError as err:
        raise DecodeError(f"malformed PNM header: {err}", path=name) from err
    if not (1 <= maxval <= 65535) or width < 1 or height < 1 or not 1 <= depth <= MAX_COMPONENTS:
        raise DecodeError(f"PNM header out of range: {width}x{height}, depth {depth}, maxval {maxval}", path=name)
    size = 1 if maxval < 256 else 2
    need = width * height * depth * size
    if len(buf) - pos < need:
        raise DecodeError(f"truncated PNM: {len(buf) - pos} bytes of samples, expected {need}", path=name,
                          offset=len(buf))
    samples = np.frombuffer(buf, np.uint8 if size == 1 else ">u2", width * height * depth, pos)
    samples = samples.reshape(height, width, depth)
    if maxval not in (255, 65535):   # samples above the maxval (a damaged file) are taken as the maxval
        samples = np.minimum(samples, maxval)
    if maxval < 255:   # scaled to the 8-bit range, rounded (as Pillow does)
        return ((samples.astype(np.uint32) * 255 + maxval // 2) // maxval).astype(np.uint8), 8
    if size == 1:
        return samples, 8
    return samples.astype(np.uint16), max(9, maxval.bit_length())


def _tokens(buf: memoryview, pos: int, count: int) -> tuple[list[int], int]:
    """``count`` whitespace-separated decimal numbers from ``pos`` (comments skipped), and the position after
    the single whitespace byte that ends the last one."""
    values, end = [], min(len(buf), pos + 1024)
    while len(values) < count:
        while pos < end and (chr(buf[pos]).isspace() or buf[pos] == 0x23):
            if buf[pos] == 0x23:   # '#': a comment to the end of the line
                while pos < end and buf[pos] not in (0x0A, 0x0D):
                    pos += 1
            else:
                pos += 1
        start = pos
        while pos < end and 0x30 <= buf[pos] <= 0x39:
            pos += 1
        if pos == start or pos - start > 9:
            raise ValueError(f"expected a number at byte {start}")
        values.append(int(bytes(buf[start:pos])))
    if pos >= len(buf) or not chr(buf[pos]).isspace():
        raise ValueError(f"no whitespace after the header at byte {pos}")
    return values, pos + 1


def _pam_header(buf: memoryview) -> tuple[int, int, int, int, int]:
    end = bytes(buf[:4096]).find(b"ENDHDR\n")
    if end < 0:
        raise ValueError("no ENDHDR line in the first 4096 bytes")
    fields = {}
    for line in bytes(buf[3:end]).decode("ascii", "replace").splitlines():
        key, _, value = line.strip().partition(" ")
        if key and not key.startswith("#") and key != "TUPLTYPE":
            if not value.strip().isdigit() or len(value.strip()) > 9:
                raise ValueError(f"{key} is {value.strip()!r}, not a number")
            fields[key] = int(value)
    missing = [k for k in ("WIDTH", "HEIGHT", "DEPTH", "MAXVAL") if k not in fields]
    if missing:
        raise ValueError(f"no {', '.join(missing)}")
    return fields["WIDTH"], fields["HEIGHT"], fields["DEPTH"], fields["MAXVAL"], end + 7


def pnm_size(buf: memoryview, name: str) -> tuple[int, int]:
    """``(height, width)`` of a binary PNM/PAM from its header."""
    try:
        if bytes(buf[:2]) == b"P7":
            width, height = _pam_header(buf)[:2]
        else:
            width, height = _tokens(buf, 2, 2)[0]
    except ValueError as err:
        raise DecodeError(f"malformed PNM header: {err}", path=name) from err
    return height, width


# -- output rules ---------------------------------------------------------------------------------------------


def finish(samples: np.ndarray, precision: int, dtype: str, channels: int) -> np.ndarray:
    """``samples`` (``[H, W]`` or ``[H, W, C]``, C = 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA; ``precision`` bits per
    sample, 0 for floating point) as a C-contiguous ``[H, W, channels]`` array of ``dtype`` by the module's rules."""
    if samples.ndim == 2:
        samples = samples[:, :, None]
    top = 255 if dtype == "uint8" else 65535
    if precision == 0:   # floating point: [0, 1] -> the dtype's range
        samples = np.rint(np.clip(np.nan_to_num(samples, nan=0.0), 0.0, 1.0) * top)
        precision = 8 if dtype == "uint8" else 16
    out_type = np.uint8 if dtype == "uint8" else np.uint16
    keep = 8 if dtype == "uint8" else 16
    if precision > keep:
        samples = samples >> (precision - keep)
        precision = keep
    samples = samples.astype(out_type, copy=False)
    opaque = (1 << precision) - 1 if precision else top
    c = samples.shape[2]
    color, alpha = samples[:, :, :3] if c >= 3 else None, samples[:, :, c - 1:] if c in (2, 4) else None
    gray = samples[:, :, :1] if c < 3 else None
    if channels == 1:
        out = gray if gray is not None else _luma(color, out_type)
    elif channels == 3:
        out = color if color is not None else np.repeat(gray, 3, axis=2)
    else:
        rgb = color if color is not None else np.repeat(gray, 3, axis=2)
        a = alpha if alpha is not None else np.full(samples.shape[:2] + (1,), opaque, out_type)
        out = np.concatenate((rgb, a), axis=2)
    return np.require(out, out_type, ("C", "W"))


def _luma(rgb: np.ndarray, out_type: type) -> np.ndarray:
    """ITU-R 601 luma with Pillow's integer weights (its ``convert("L")`` for 8-bit RGB, bit for bit)."""
    r, g, b = (rgb[:, :, k].astype(np.uint64) for k in range(3))
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(out_type)[:, :, None]
