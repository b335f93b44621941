"""ingest's decoders against the codec projects' own test files and those projects' reference decodes.

The files are not in the repository: ``dev/conformance_files.py`` copies them from clones of uclouvain/openjpeg-data
(the ISO/IEC 15444-4 conformance codestreams and JP2 files, with their reference decodes), libtiff (``test/images``)
and webmproject/libwebp-test-data into the directory ``INGEST_CONFORMANCE_DIR`` names. Where it is unset, or a
project's folder or a file is missing there, those tests skip. docs/codecs.md, "Conformance", says what passed.

- JPEG 2000, class 1 of ISO/IEC 15444-4 (profiles 0 and 1): decoded at full resolution, component by component
  against the reference PGX within the standard's bounds (peak absolute error and mean squared error per component,
  Tables C.6 and C.7, as OpenJPEG's ``tests/conformance`` lists them): the stored values (``dtype`` uint16) and the
  default 8-bit decode, which keeps their top 8 bits. JP2 files against their reference TIFFs within Table G.1's
  bounds (peak 4, MSE 4 per colour). The other codestreams of openjpeg-data's conformance folder against their
  PPM/PGM. What ingest refuses by design is a DecodeError naming the file and why.
- TIFF: libtiff's test images that have a PNM twin (the same picture, written by other tools) equal it; every other
  one decodes or gives a DecodeError.
- WebP: every file of libwebp-test-data decodes to the bytes whose MD5 the suite lists for dwebp's PPM (RGB) and
  PAM (RGBA) output.
- Damage: truncated and byte-flipped copies of a few of these files decode or give a DecodeError naming the file,
  in a child process, so that a crash or a hang fails the test; each decode within a time bound and the whole
  within a memory bound. A truncated file is never decoded to a partial image.
- GPU (marked ``gpu``): GpuDecoder on the 8-bit files, within the same bounds against the same references.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ingest import defaults
from ingest.decode import codecs
from ingest.decode import gpu as decode_gpu
from ingest.decode.cpu import CpuDecoder
from ingest.errors import DecodeError

imagecodecs = pytest.importorskip("imagecodecs")
tifffile = pytest.importorskip("tifffile")

#: The directory dev/conformance_files.py wrote (its openjpeg-data/, libtiff/ and libwebp-test-data/ folders).
CONFORMANCE = os.environ.get("INGEST_CONFORMANCE_DIR")

# ISO/IEC 15444-4 class 1: per component, (peak absolute error, mean squared error) at most. Table C.6 (profile 0)
# and C.7 (profile 1); the component count is the reference's (p0_13's 257 components are checked as 4 there).
CLASS1_BOUNDS = {
    "p0_01.j2k": [(0, 0)],
    "p0_04.j2k": [(5, 0.776), (4, 0.626), (6, 1.070)],
    "p0_09.j2k": [(0, 0)],
    "p0_11.j2k": [(0, 0)],
    "p0_12.j2k": [(0, 0)],
    "p0_14.j2k": [(0, 0)] * 3,
    "p0_16.j2k": [(0, 0)],
    "p1_02.j2k": [(5, 0.765), (4, 0.616), (6, 1.051)],
    "p1_04.j2k": [(624, 3080)],
    "p1_05.j2k": [(40, 8.458), (40, 9.816), (40, 10.154)],
    "p1_06.j2k": [(2, 0.6)] * 3,
}
#: Conformance files ingest refuses by design, and a word its DecodeError says: signed samples, more than 4
#: components, and components at other resolutions than the image's except 4:2:2/4:2:0 chroma (a whole image
#: on a subsampled grid included: its header's size is the reference grid's, not the decoded image's).
REFUSED = {
    "p0_02.j2k": "subsampling", "p0_03.j2k": "signed", "p0_05.j2k": "subsampling", "p0_06.j2k": "subsampling",
    "p0_07.j2k": "signed", "p0_08.j2k": "signed", "p0_10.j2k": "subsampling", "p0_13.j2k": "257 components",
    "p0_15.j2k": "signed", "p1_01.j2k": "subsampling", "p1_03.j2k": "subsampling", "p1_07.j2k": "subsampling",
    "a4_colr.j2c": "subsampling", "a6_mono_colr.j2c": "subsampling", "b2_mono.j2c": "subsampling",
    "e2_colr.j2c": "subsampling", "subsampling_2.jp2": "subsampling", "zoo2.jp2": "subsampling",
}
#: JP2 files of ISO/IEC 15444-4 and their reference TIFFs; Table G.1: peak 4 and MSE 4 on each colour.
JP2_FILES = [f"file{k}.jp2" for k in range(1, 10)]
JP2_BOUND = (4, 4.0)
#: The other codestreams of openjpeg-data's conformance folder (Part 4's earlier test set) and their reference
#: PPM/PGM: exact; subsampling_1.jp2 (4:2:0 sYCC, OpenJPEG's own) within Table G.1's JP2 bound.
OTHER_FILES = {name: (0, 0.0) for name in (
    "a1_mono.j2c", "a2_colr.j2c", "a3_mono.j2c", "a5_mono.j2c", "b1_mono.j2c", "b3_mono.j2c", "c1_mono.j2c",
    "c2_mono.j2c", "d1_colr.j2c", "d2_colr.j2c", "e1_colr.j2c", "f1_mono.j2c", "f2_mono.j2c", "g1_colr.j2c",
    "g2_colr.j2c", "g3_colr.j2c", "g4_colr.j2c")} | {"subsampling_1.jp2": JP2_BOUND}
#: libtiff's test images with a PNM twin, and the dtype to compare them at.
TIFF_TWINS = {"minisblack-1c-8b.tiff": ("minisblack-1c-8b.pgm", "uint8"),
              "rgb-3c-8b.tiff": ("rgb-3c-8b.ppm", "uint8"),
              "rgb-3c-16b.tiff": ("rgb-3c-16b.ppm", "uint16"),
              "miniswhite-1c-1b.tiff": ("miniswhite-1c-1b.pbm", "uint8")}
#: libwebp-test-data files whose PAM (RGBA) output ingest does not give, and why: an ingest RGBA decode keeps
#: alpha only where the file says it has alpha. bad_palette_index.webp's lossless header says none (its
#: alpha_is_used bit is 0) while its out-of-range palette indices decode to transparent black in dwebp's PAM.
WEBP_PAM_DIFFERS = {"bad_palette_index.webp"}


def source(*parts: str) -> Path:
    """A path in the conformance directory, or skip where it (or the directory) is absent."""
    if not CONFORMANCE:
        pytest.skip("INGEST_CONFORMANCE_DIR is not set (dev/conformance_files.py makes the directory)")
    path = Path(CONFORMANCE, *parts)
    if not path.exists():
        pytest.skip(f"{path} not found")
    return path


def j2k_input(name: str) -> Path:
    return source("openjpeg-data", "input", "conformance", name)


def j2k_baseline(name: str) -> Path:
    return source("openjpeg-data", "baseline", "conformance", name)


def decoder(**options) -> CpuDecoder:
    return CpuDecoder(threads=1, **options)


# -- reference readers (independent of ingest's) ---------------------------------------------------------------


def read_pgx(path: Path) -> np.ndarray:
    """One component of a PGX file: ``PG ML|LM [+|-]depth width height`` and raw samples, 1, 2 or 4 bytes each."""
    data = path.read_bytes()
    end = data.index(b"\n")
    match = re.fullmatch(rb"PG\s*(ML|LM)\s*([+-]?)\s*(\d+)\s+(\d+)\s+(\d+)\s*", data[:end])
    order, sign, depth, width, height = match.groups()
    size = next(s for s in (1, 2, 4) if int(depth) <= 8 * s)
    dtype = np.dtype(("i" if sign == b"-" else "u") + str(size)).newbyteorder(">" if order == b"ML" else "<")
    return np.frombuffer(data, dtype, int(width) * int(height), end + 1).reshape(int(height), int(width))


def read_pnm(path: Path) -> np.ndarray:
    """A binary PBM/PGM/PPM as ``[H, W, C]`` (C 1 or 3): comments skipped, 16-bit samples big-endian, PBM bits as
    0 (black) and 255 (white)."""
    data = path.read_bytes()
    kind = data[:2]
    count = 2 if kind == b"P4" else 3
    fields = re.match(rb"P[456]" + rb"(?:\s+|#[^\n]*\n)*(\d+)" * count + rb"\s", data)
    width, height = int(fields.group(1)), int(fields.group(2))
    if kind == b"P4":
        rows = np.frombuffer(data, np.uint8, height * -(-width // 8), fields.end()).reshape(height, -1)
        return (255 * (1 - np.unpackbits(rows, axis=1)[:, :width]))[:, :, None].astype(np.uint8)
    channels = 3 if kind == b"P6" else 1
    dtype = np.dtype(np.uint8 if int(fields.group(3)) < 256 else ">u2")
    return np.frombuffer(data, dtype, width * height * channels, fields.end()).reshape(height, width, channels)


def reference_rgb8(name: str) -> np.ndarray:
    """The reference decode of a JPEG 2000 file of :data:`CLASS1_BOUNDS` (8-bit ones), :data:`JP2_FILES` or
    :data:`OTHER_FILES` as 8-bit RGB (gray repeated), what ingest's default decode is compared with."""
    stem = name.rsplit(".", 1)[0]
    if name in CLASS1_BOUNDS:
        reference = np.dstack([read_pgx(j2k_baseline(f"c1{stem}_{k}.pgx")) for k in range(len(CLASS1_BOUNDS[name]))])
    elif name in JP2_FILES:
        reference = tifffile.imread(j2k_baseline(f"jp2_{stem[4:]}.tif"))
    else:
        reference = read_pnm(j2k_baseline(stem + ".ppm"))
    reference = reference if reference.ndim == 3 else reference[:, :, None]
    return np.repeat(reference, 3, axis=2) if reference.shape[2] == 1 else reference


def errors(got: np.ndarray, reference: np.ndarray) -> list[tuple[int, float]]:
    """Per component (last axis), the peak absolute error and the mean squared error."""
    assert got.shape == reference.shape, (got.shape, reference.shape)
    diff = got.astype(np.int64) - reference.astype(np.int64)
    return [(int(np.abs(diff[..., k]).max()), float(np.mean(diff[..., k] ** 2))) for k in range(diff.shape[-1])]


def within(measured: list[tuple[int, float]], bounds: list[tuple[int, float]]) -> bool:
    return all(peak <= peak_bound and mse <= mse_bound + 1e-9
               for (peak, mse), (peak_bound, mse_bound) in zip(measured, bounds, strict=True))


# -- JPEG 2000: ISO/IEC 15444-4 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CLASS1_BOUNDS))
def test_class1_codestreams_within_iso_bounds_per_component(name):
    """The stored values (uint16: 8 and 12-bit samples unchanged) of each component within Table C.6/C.7's peak
    and MSE, at full resolution; the default 8-bit RGB decode is the same values' top 8 bits."""
    data = j2k_input(name).read_bytes()
    bounds = CLASS1_BOUNDS[name]
    stem = name.rsplit(".", 1)[0]
    reference = np.dstack([read_pgx(j2k_baseline(f"c1{stem}_{k}.pgx")) for k in range(len(bounds))])
    stored = decoder(dtype="uint16", channels=1 if len(bounds) == 1 else 3).decode(data, name)
    measured = errors(stored, reference)
    assert within(measured, bounds), (name, measured, bounds)
    precision = codecs.read_header(memoryview(data), "jpeg2k", name).precision
    default = decoder().decode(data, name)
    top = (stored >> (precision - 8)).astype(np.uint8)
    np.testing.assert_array_equal(default, top if top.shape[2] == 3 else np.repeat(top, 3, axis=2))


@pytest.mark.parametrize("name", JP2_FILES)
def test_jp2_files_within_table_g1_bounds(name):
    """The JP2 files (palette, sYCC, ICC profiles, 12 and 16-bit) as 8-bit RGB against their reference TIFFs:
    colour conversions (palette, sYCC, ICC) applied as Part 4 applies them, deep samples' top 8 bits."""
    data = j2k_input(name).read_bytes()
    measured = errors(decoder().decode(data, name), reference_rgb8(name))
    assert within(measured, [JP2_BOUND] * 3), (name, measured)


@pytest.mark.parametrize("name", sorted(OTHER_FILES))
def test_other_conformance_codestreams_equal_their_references(name):
    data = j2k_input(name).read_bytes()
    measured = errors(decoder().decode(data, name), reference_rgb8(name))
    assert within(measured, [OTHER_FILES[name]] * 3), (name, measured)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_conformance_files_give_a_decode_error_naming_the_file(name):
    """From the header alone: probing refuses them as decoding does, before any pixel is decoded."""
    path = j2k_input(name)
    for refuse in (decoder(dtype="uint16", channels=4).decode, decoder().probe):
        with pytest.raises(DecodeError, match=REFUSED[name]) as caught:
            refuse(path.read_bytes(), str(path))
        assert caught.value.path == str(path)


def test_signed_jpeg2k_and_tiff_are_refused_from_their_headers():
    """(Runs without the conformance files.)"""
    signed = imagecodecs.jpeg2k_encode(np.arange(64, dtype=np.int8).reshape(8, 8) - 32, level=0, codecformat="j2k")
    with pytest.raises(DecodeError, match="unsupported JPEG 2000: signed samples"):
        codecs.read_header(memoryview(signed), "jpeg2k", "signed.j2k")
    with pytest.raises(DecodeError, match="signed.j2k: unsupported JPEG 2000: signed"):
        decoder().probe(signed, "signed.j2k")
    tiff = io.BytesIO()
    tifffile.imwrite(tiff, np.arange(64, dtype=np.int16).reshape(8, 8) - 32)
    with pytest.raises(DecodeError, match="signed.tif: unsupported TIFF: signed 16-bit"):
        decoder().probe(tiff.getvalue(), "signed.tif")


def test_icc_profile_jp2_is_decoded_on_the_cpu_where_the_profile_is_applied():
    """A JP2 whose colour is an ICC profile (a ``colr`` box of method 2) is not GPU-eligible: the CPU decoder applies
    the profile, as Part 4's reference decodes do, and nvJPEG2000 would not. (Runs without the conformance files.)"""
    rgb = np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3)
    plain = imagecodecs.jpeg2k_encode(rgb, level=0, codecformat="jp2")
    from PIL import ImageCms
    profile = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    icc = with_colour_box(plain, b"\x02\x00\x00" + profile)
    read = lambda data: codecs.read_header(memoryview(data), "jpeg2k", "a.jp2")  # noqa: E731
    assert read(plain).gpu and not read(icc).gpu
    assert read(icc)[:5] == read(plain)[:5]
    assert decoder().decode(icc, "icc.jp2").shape == rgb.shape


def test_jp2_channel_definitions_reordering_colours_are_decoded_on_the_cpu():
    """A ``cdef`` box that maps codestream channels to other colours (or to opacity) is applied by the CPU decoder
    (here: blue first); such a file is not GPU-eligible. One naming the colours in codestream order still is.
    (Runs without the conformance files.)"""
    rgb = np.zeros((8, 8, 3), np.uint8) + np.array([10, 20, 30], np.uint8)
    plain = imagecodecs.jpeg2k_encode(rgb, level=0, codecformat="jp2")
    read = lambda data: codecs.read_header(memoryview(data), "jpeg2k", "a.jp2")  # noqa: E731
    for associations, gpu, first in (((1, 2, 3), True, (10, 20, 30)), ((3, 2, 1), False, (30, 20, 10)),
                                     ((1, 2, 0), False, (10, 20, 30))):
        kinds = [0, 0, 1 if associations[2] == 0 else 0]   # association 0 with type 1: opacity of the whole image
        cdef = struct.pack(">H", 3) + b"".join(struct.pack(">3H", c, kinds[c], a) for c, a in enumerate(associations))
        data = with_header_box(plain, b"cdef", cdef)
        assert read(data).gpu is gpu, associations
        np.testing.assert_array_equal(decoder().decode(data, "cdef.jp2")[0, 0], first)


def boxes(data: bytes) -> list[tuple[bytes, bytes]]:
    """The (kind, contents) of the JP2 boxes in ``data``, in order (a length of 0: to the end)."""
    out, pos = [], 0
    while pos < len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        length = length or len(data) - pos
        out.append((kind, data[pos + 8:pos + length]))
        pos += length
    return out


def packed(items: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(struct.pack(">I4s", 8 + len(contents), kind) + contents for kind, contents in items)


def with_header_box(jp2: bytes, kind: bytes, body: bytes) -> bytes:
    """``jp2`` with a ``kind`` box holding ``body`` added at the end of its header box."""
    return packed([(box, contents + packed([(kind, body)]) if box == b"jp2h" else contents)
                   for box, contents in boxes(jp2)])


def with_colour_box(jp2: bytes, colour: bytes) -> bytes:
    """``jp2`` with its header box's ``colr`` box replaced by one holding ``colour`` (method, precedence,
    approximation, then the enumerated space or the profile)."""
    def recoloured(header: bytes) -> bytes:
        return packed([(kind, colour if kind == b"colr" else contents) for kind, contents in boxes(header)])
    return packed([(box, recoloured(contents) if box == b"jp2h" else contents) for box, contents in boxes(jp2)])


# -- TIFF: libtiff's test images ------------------------------------------------------------------------------


def libtiff_images() -> Path:
    return source("libtiff", "test", "images")


@pytest.mark.parametrize("name", sorted(TIFF_TWINS))
def test_libtiff_images_equal_their_pnm_twins(name):
    folder = libtiff_images()
    twin, dtype = TIFF_TWINS[name]
    reference = read_pnm(folder / twin)
    got = decoder(dtype=dtype, channels=reference.shape[2]).decode((folder / name).read_bytes(), name)
    np.testing.assert_array_equal(got, reference.astype(dtype))


def test_every_libtiff_image_decodes_or_gives_a_decode_error():
    """Including the hostile ones (directory loops, broken fax data, old-style JPEG): a picture of the size its
    header says, or a DecodeError naming the file."""
    folder = libtiff_images()
    outcomes = {}
    for path in sorted(p for p in folder.iterdir() if p.suffix in (".tif", ".tiff")):
        try:
            pixels = decoder().decode(path.read_bytes(), str(path))
            assert pixels.shape == decoder().probe(path.read_bytes(), str(path)) + (3,), path.name
            outcomes[path.name] = "ok"
        except DecodeError as err:
            assert err.path == str(path)
            outcomes[path.name] = "refused"
    assert len(outcomes) >= 30 and outcomes["rgb-3c-16b.tiff"] == outcomes["quad-lzw-compat.tiff"] == "ok"


# -- WebP: libwebp-test-data ------------------------------------------------------------------------------------


def webp_md5s() -> tuple[Path, dict[str, str]]:
    folder = source("libwebp-test-data")
    lines = (folder / "libwebp_tests.md5").read_text().split("\n")
    return folder, {name: digest for digest, name in (line.split() for line in lines if line.strip())}


def test_webp_files_decode_to_dwebps_output():
    """Every file the suite lists: ingest's RGB decode, written as dwebp writes a PPM, has the listed MD5 of
    ``dwebp -ppm``; its RGBA decode (``channels=4``), written as dwebp writes a PAM, that of ``dwebp -pam``."""
    folder, md5s = webp_md5s()
    names = sorted({name.rsplit(".", 1)[0] for name in md5s})
    checked, wrong = 0, []
    for name in names:
        if not (folder / name).exists():   # a snapshot may lack the largest files
            continue
        data = (folder / name).read_bytes()
        rgb, rgba = decoder().decode(data, name), decoder(channels=4).decode(data, name)
        height, width = rgb.shape[:2]
        ppm = b"P6\n%d %d\n255\n" % (width, height) + rgb.tobytes()
        pam = b"P7\nWIDTH %d\nHEIGHT %d\nDEPTH 4\nMAXVAL 255\nTUPLTYPE RGB_ALPHA\nENDHDR\n" % (width, height) + \
            rgba.tobytes()
        if hashlib.md5(ppm).hexdigest() != md5s[name + ".ppm"]:
            wrong.append(name + ".ppm")
        if (hashlib.md5(pam).hexdigest() == md5s[name + ".pam"]) == (name in WEBP_PAM_DIFFERS):
            wrong.append(name + ".pam")
        checked += 1
    assert checked >= 90 and not wrong, wrong


# -- damaged files ---------------------------------------------------------------------------------------------

#: Files the damage sweep cuts and flips: JPEG 2000 codestreams of both profiles and a JP2 file, TIFFs (LZW, 16-bit,
#: WebP-compressed) and WebPs (lossy with alpha, lossless).
DAMAGED = [("openjpeg-data/input/conformance", "p0_01.j2k"), ("openjpeg-data/input/conformance", "p1_06.j2k"),
           ("openjpeg-data/input/conformance", "p0_04.j2k"), ("openjpeg-data/input/conformance", "file4.jp2"),
           ("libtiff/test/images", "quad-lzw-compat.tiff"), ("libtiff/test/images", "rgb-3c-16b.tiff"),
           ("libtiff/test/images", "webp_lossless_rgba_alpha_fully_opaque.tif"),
           ("libwebp-test-data", "lossy_alpha1.webp"), ("libwebp-test-data", "lossless1.webp")]
#: Most seconds one damaged file may take to decode or be refused, and most resident memory the sweep's process may
#: reach (the interpreter, numpy, torch and the codecs' libraries take most of it).
DAMAGE_SECONDS = 10.0
DAMAGE_MAX_RSS = 2 << 30

SWEEP = r'''
import json, resource, sys, time
import numpy as np
from ingest.decode.cpu import CpuDecoder
from ingest.errors import DecodeError
cpu = CpuDecoder(threads=1)
rng = np.random.default_rng(36)
results = []
for path in sys.argv[1:]:
    data = open(path, "rb").read()
    n = len(data)
    whole = cpu.decode(data, path)
    cases = [("cut", k, data[:k]) for k in sorted({2, 12, 40, 100, n // 8, n // 4, n // 2, 3 * n // 4, n - 100, n - 3,
                                                   n - 1}) if 0 < k < n]
    for k in range(12):   # half the flips in the first 256 bytes (headers), half anywhere
        damaged = bytearray(data)
        at = int(rng.integers(0, min(n, 256) if k % 2 else n))
        for j in range(at, min(n, at + int(rng.integers(1, 5)))):
            damaged[j] ^= int(rng.integers(1, 256))
        cases.append(("flip", at, bytes(damaged)))
    for kind, at, case in cases:
        name = f"{path}@{kind}{at}"
        start = time.perf_counter()
        try:
            pixels = cpu.decode(case, name)
            outcome = "ok " + ("whole" if pixels.shape == whole.shape and (pixels == whole).all() else "different")
        except DecodeError as err:
            outcome = "DecodeError" if err.path == name else f"DecodeError naming {err.path!r}"
        except BaseException as err:
            outcome = f"{type(err).__name__}: {err}"
        results.append([path, kind, at, outcome, time.perf_counter() - start])
print(json.dumps({"results": results, "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
'''


def test_truncated_and_flipped_files_decode_or_give_a_decode_error():
    """In a child process (a crash or a hang fails here, not the test run): every cut or flipped copy gives a
    DecodeError naming it, or a picture; a cut one never gives a partial picture (a cut that kept every byte the
    pixels need, such as a TIFF's trailing tag values, gives the whole file's)."""
    source()
    paths = [Path(CONFORMANCE, folder, name) for folder, name in DAMAGED if Path(CONFORMANCE, folder, name).exists()]
    if not paths:
        pytest.skip("none of the damage sweep's files found")
    done = subprocess.run([sys.executable, "-c", SWEEP, *map(str, paths)], capture_output=True, text=True,
                          timeout=DAMAGE_SECONDS * 8 + 60)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    results = report["results"]
    assert len(results) >= 20 * len(paths)
    odd = [r for r in results if r[3] != "DecodeError" and not r[3].startswith("ok ")]
    assert not odd, odd
    partial = [r for r in results if r[1] == "cut" and r[3] == "ok different"]
    assert not partial, partial
    slow = [r for r in results if r[4] > DAMAGE_SECONDS]
    assert not slow, slow
    assert report["max_rss"] < DAMAGE_MAX_RSS, report["max_rss"]


# -- GPU ------------------------------------------------------------------------------------------------------


requires_gpu = pytest.mark.skipif(not decode_gpu.available(),
                                  reason="needs CUDA and nvImageCodec (pip install ingest[gpu])")


@pytest.mark.gpu
@requires_gpu
def test_gpu_decodes_the_conformance_files_within_the_same_bounds():
    """The 8-bit class-1 codestreams, the JP2 files and the other codestreams in one batch through GpuDecoder
    (nvJPEG2000 where eligible, the CPU decoder for the rest, codestreams placed off the origin included): 8-bit
    RGB within the bounds the CPU decode is held to, against the same references (for the 12-bit p1_04 none
    applies at 8 bits: it goes to the CPU). The ICC profile of file8.jp2 is applied, so it is the CPU decoder's."""
    names = [n for n in sorted(CLASS1_BOUNDS) if n != "p1_04.j2k"] + JP2_FILES + sorted(OTHER_FILES)
    present = [n for n in names if Path(CONFORMANCE or "", "openjpeg-data", "input", "conformance", n).exists()]
    if not present:
        pytest.skip("INGEST_CONFORMANCE_DIR has no JPEG 2000 conformance files")
    datas = [j2k_input(n).read_bytes() for n in present]
    with CpuDecoder(threads=2) as cpu, defaults.set(host_jpeg2k_share=0):   # every eligible file on the GPU
        try:
            gpu = decode_gpu.GpuDecoder("cuda", cpu)
        except ImportError as err:
            pytest.skip(str(err))
        with gpu:
            images, _, paths = gpu.decode_batch(datas, present)
            outside = {}
            for name, image in zip(present, images):
                assert not isinstance(image, DecodeError), (name, image)
                bounds = CLASS1_BOUNDS.get(name) or [JP2_BOUND if name in JP2_FILES else OTHER_FILES[name]] * 3
                bounds = bounds * 3 if len(bounds) == 1 else bounds
                measured = errors(image.cpu().numpy(), reference_rgb8(name))
                if not within(measured, bounds):
                    outside[name] = measured
            took = dict(zip(present, paths))
            assert not outside, (outside, took, dict(gpu.fallbacks))
            assert "gpu" in paths, (took, dict(gpu.fallbacks), gpu.messages)
            # those nvJPEG2000 does not take (e1_colr.j2c, placed off the grid's origin, crashes it) never reach it
            header = {name: codecs.read_header(memoryview(data), "jpeg2k", name) for name, data in zip(present, datas)}
            assert all(took[name] == "cpu-fallback" for name in present if not header[name].gpu), took
            if "file8.jp2" in took:
                assert took["file8.jp2"] == "cpu-fallback", took


GPU_TIFFS = r'''
import json, sys
import ingest  # noqa: F401 - before torch, as in the tests' conftest
from ingest.decode.cpu import CpuDecoder
from ingest.decode.gpu import GpuDecoder
from ingest.errors import DecodeError
paths = sys.argv[1:]
datas = [open(p, "rb").read() for p in paths]
with CpuDecoder(threads=2) as cpu:
    try:
        gpu = GpuDecoder("cuda", cpu)
    except ImportError as err:
        print(json.dumps({"skip": str(err)}))
        sys.exit(0)
    with gpu:
        images, _, took = gpu.decode_batch(datas, paths)
        out = {}
        for p, data, image, path in zip(paths, datas, images, took):
            try:
                want = cpu.decode(data, p)
            except DecodeError:
                want = None
            got = None if isinstance(image, DecodeError) else image.cpu().numpy()
            same = want is not None and got is not None and got.shape == want.shape and bool((got == want).all())
            out[p] = [path, want is None, got is None, same]
        print(json.dumps({"images": out, "fallbacks": dict(gpu.fallbacks)}))
'''


@pytest.mark.gpu
@requires_gpu
def test_gpu_decodes_libtiffs_test_images_as_the_cpu_does(monkeypatch):
    """Every libtiff test TIFF (directory loops and sub-directory chains among them, which nvTIFF is given where
    the first directory is plain 8-bit gray or RGB) in one GpuDecoder batch, in a child process so that a hang or a
    crash fails here: each equals the CPU decode exactly (TIFF is lossless), or both refuse it."""
    folder = libtiff_images()
    paths = sorted(str(p) for p in folder.iterdir() if p.suffix in (".tif", ".tiff"))
    monkeypatch.setenv("INGEST_HOST_JPEG2K_SHARE", "0")   # every eligible file on the GPU
    done = subprocess.run([sys.executable, "-c", GPU_TIFFS, *paths], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(report["skip"])
    images = report["images"]
    wrong = {Path(p).name: r for p, r in images.items() if not (r[3] or (r[1] and r[2]))}
    assert not wrong, (wrong, report["fallbacks"])
    assert any(r[0] == "gpu" for r in images.values()), report
