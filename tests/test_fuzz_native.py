"""The native parsers fed hostile bytes under AddressSanitizer and UndefinedBehaviorSanitizer (tests/fuzz_native.c,
compiled here with the system C compiler; skipped where there is none or it has no sanitizers): the PNG decoder
in both modes, the JPEG header scan, the tf.train.Example scan, and the native engine's record parses (RecordIO,
TFRecord, Caffe Datum, framed records, an Object Detection API record's boxes).

Inputs are valid files made by Pillow and ingest's own writers, then mutated with their structure in mind (PNG
chunks reordered, dropped, doubled or rewritten with their CRCs fixed; the inflated pixel rows changed and deflated
again; protobuf and framed lengths set to huge values), plus every truncation and byte-level flips. Every case
must end without a sanitizer report, crash or hang, inside the time the harness is given. Beyond that:

- a PNG the image mode decodes is one Pillow decodes to the same pixels (`convert("RGB")`), and a mask is
  Pillow's `np.array` of the gray or index band;
- a record the scans take is one protobuf parses, with the lists and values the scan reported.

``INGEST_FUZZ_EXAMPLES`` sets the examples per hypothesis test (default 100, deterministic) for longer runs.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from ingest.formats import Field, Record
from ingest.formats._framed import KIND_CODES, decode, encode
from ingest.formats._protos import Datum, Example
from ingest.formats.recordio import IR_HEADER, MAGIC, unpack
from ingest.formats.tfrecord import frame

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("INGEST_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 200, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
CASE_SECONDS = 20.0   # for one batch of cases: the parsers are linear, a hang shows as a timeout
HUGE = [0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x80000001, 0xFFFFFFFE, 0, 1, 0x1FFFFFFF, 0x20000000]


# -- the harness ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> "Harness":
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path_factory.mktemp("fuzz") / "fuzz_native"
    cmd = [cc, "-std=c11", "-O1", "-g", "-ffp-contract=off", "-fno-omit-frame-pointer",
           "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-I", str(ROOT / "ingest/_native"),
           str(ROOT / "tests/fuzz_native.c"), "-o", str(exe), "-ldl", "-lm"]
    built = subprocess.run(cmd, capture_output=True, text=True)
    if built.returncode != 0:
        if "sanitize" in built.stderr or "asan" in built.stderr or "ubsan" in built.stderr:
            pytest.skip(f"the C compiler has no AddressSanitizer/UBSan: {built.stderr[-300:]}")
        raise AssertionError(f"tests/fuzz_native.c does not build:\n{built.stderr}")
    return Harness(str(exe))


class Harness:
    """Runs batches of cases through the sanitized harness; any report, crash or timeout fails the test."""

    def __init__(self, exe: str):
        self.exe = exe

    def run(self, cases: list[tuple[bytes, bytes]]) -> list[bytes]:
        stdin = b"".join(mode + struct.pack("<I", len(data)) + data for mode, data in cases)
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:allocator_may_return_null=1",
                   UBSAN_OPTIONS="print_stacktrace=1")
        try:
            done = subprocess.run([self.exe], input=stdin, capture_output=True, timeout=CASE_SECONDS, env=env)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the harness hung on one of {len(cases)} cases "
                                 f"(first: {cases[0][0]!r} {cases[0][1][:64].hex()})") from None
        if done.returncode != 0:
            culprit = self._culprit(cases)
            raise AssertionError(f"the harness failed (rc {done.returncode}) on {culprit[0]!r} "
                                 f"{culprit[1].hex()}:\n{done.stderr.decode(errors='replace')[-4000:]}")
        out, at = [], 0
        for _ in cases:
            n = struct.unpack_from("<I", done.stdout, at)[0]
            out.append(done.stdout[at + 4:at + 4 + n])
            at += 4 + n
        assert at == len(done.stdout)
        return out

    def _culprit(self, cases):
        """The first case that fails on its own (for the message)."""
        for case in cases:
            stdin = case[0] + struct.pack("<I", len(case[1])) + case[1]
            try:
                if subprocess.run([self.exe], input=stdin, capture_output=True, timeout=CASE_SECONDS).returncode:
                    return case
            except subprocess.TimeoutExpired:
                return case
        return cases[0]


def ints(blob: bytes, n: int, at: int = 0) -> list[int]:
    return list(struct.unpack_from(f"<{n}q", blob, at))


# -- PNGs ---------------------------------------------------------------------------------------------------------

CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}


def chunk(kind: bytes, data: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(kind + data) if crc is None else crc
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc & 0xFFFFFFFF)


def ihdr(w: int, h: int, depth: int, ctype: int, interlace: int = 0) -> bytes:
    return struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, interlace)


def filtered(raw: list[bytes], bpp: int, filters: list[int]) -> bytes:
    """The rows filtered with the given types (PNG's five filters), each with its filter byte."""
    out, prev = [], bytes(len(raw[0]))
    for row, f in zip(raw, filters):
        x = bytearray(len(row))
        for i, v in enumerate(row):
            a = row[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 0:
                pred = 0
            elif f == 1:
                pred = a
            elif f == 2:
                pred = b
            elif f == 3:
                pred = (a + b) // 2
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
            x[i] = (v - pred) & 0xFF
        out.append(bytes([f]) + bytes(x))
        prev = row
    return b"".join(out)


def make_png(rng: np.random.Generator, ctype: int, depth: int, w: int, h: int, *, entries: int | None = None,
             trns: bool = False, idats: int = 1, extra: list[bytes] = ()) -> bytes:
    """A PNG of random pixels and random row filters (palette indices below `entries`)."""
    ch = CHANNELS[ctype]
    row_bytes = (w * ch * depth + 7) // 8
    if ctype == 3:
        entries = entries or int(rng.integers(1, 2 ** depth + 1))
        values = rng.integers(0, entries, size=(h, w))
        raw = []
        for y in range(h):
            bits = "".join(format(int(v), f"0{depth}b") for v in values[y])
            bits += "0" * (8 * row_bytes - len(bits))
            raw.append(bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8)))
    else:
        raw = [rng.integers(0, 256, size=row_bytes, dtype=np.uint8).tobytes() for _ in range(h)]
    bpp = max(1, ch * depth // 8)
    stream = zlib.compress(filtered(raw, bpp, [int(f) for f in rng.integers(0, 5, size=h)]), 6)
    parts = [b"\x89PNG\r\n\x1a\n", chunk(b"IHDR", ihdr(w, h, depth, ctype))]
    parts += list(extra)
    if ctype == 3:
        parts.append(chunk(b"PLTE", rng.integers(0, 256, size=3 * entries, dtype=np.uint8).tobytes()))
    if trns:
        size = {0: 2, 2: 6, 3: min(entries or 1, 4)}.get(ctype)
        if size:
            parts.append(chunk(b"tRNS", rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()))
    cuts = sorted(set(int(c) for c in rng.integers(0, len(stream) + 1, size=idats - 1)))
    for a, b in zip([0] + cuts, cuts + [len(stream)]):
        parts.append(chunk(b"IDAT", stream[a:b]))
    parts.append(chunk(b"IEND", b""))
    return b"".join(parts)


def pillow_pngs() -> list[bytes]:
    rng = np.random.default_rng(7)
    out = []
    for mode in ("1", "L", "LA", "RGB", "RGBA", "P", "I;16"):
        a = rng.integers(0, 256, size=(5, 7, {"LA": 2, "RGB": 3, "RGBA": 4}.get(mode, 1)), dtype=np.uint8)
        img = Image.fromarray(a.squeeze(-1) if a.shape[-1] == 1 else a,
                              {"1": "L", "I;16": "L", "P": "L"}.get(mode, mode))
        img = img.convert(mode) if mode in ("1", "P") else img
        if mode == "I;16":
            img = Image.fromarray(rng.integers(0, 65536, size=(4, 6), dtype=np.uint16))
        buf = io.BytesIO()
        extra = {"transparency": 3} if mode == "P" else {}
        img.save(buf, "PNG", **extra)
        out.append(buf.getvalue())
    for bits in (1, 2, 4):
        img = Image.fromarray(rng.integers(0, 2 ** bits, size=(6, 9), dtype=np.uint8), "L").convert("P")
        buf = io.BytesIO()
        img.save(buf, "PNG", bits=bits)
        out.append(buf.getvalue())
    return out


def seed_pngs() -> list[bytes]:
    rng = np.random.default_rng(1)
    seeds = []
    for ctype, depths in DEPTHS.items():
        for depth in depths:
            w, h = int(rng.integers(1, 12)), int(rng.integers(1, 6))
            seeds.append(make_png(rng, ctype, depth, w, h, trns=bool(rng.integers(0, 2)),
                                  idats=int(rng.integers(1, 4))))
    seeds.append(make_png(rng, 3, 8, 300, 3, entries=256, idats=3))   # a row longer than a few blocks of input
    seeds.append(make_png(rng, 6, 8, 20, 40))
    seeds.append(make_png(rng, 6, 8, 300, 120, idats=5))   # rows inflated in several blocks
    seeds.append(make_png(rng, 2, 8, 22000, 2))            # a row longer than a block
    return seeds + pillow_pngs()


SEED_PNGS = seed_pngs()


# chunk data Pillow's handlers parse (a compression method, a NUL, zlib data, palettes): whole and damaged
ANCILLARY = [b"icc\0\0" + zlib.compress(bytes(300)), b"icc\0\1" + zlib.compress(b"x"), b"icc\0", b"\0",
             b"key\0\0" + zlib.compress(bytes(2 << 20), 9), b"key\0\1\0en\0key\0" + zlib.compress(b"text"),
             b"key\0\1\0en\0key\0" + zlib.compress(bytes(2 << 20), 9), b"key\0\0garbage", bytes(31), bytes(9),
             bytes(770), bytes(771)]   # (a PLTE of 256 entries and a bit, of 257 entries)


def chunks_of(png: bytes) -> list[tuple[bytes, bytes]]:
    """The (type, data) chunks of a well-formed PNG."""
    out, at = [], 8
    while at + 12 <= len(png):
        n = struct.unpack_from(">I", png, at)[0]
        out.append((png[at + 4:at + 8], png[at + 8:at + 8 + n]))
        at += 12 + n
    return out


def pillow_rgb(data: bytes) -> np.ndarray | None:
    """What ingest.decode.cpu gives for a PNG (its stored pixels, RGB, alpha and colour key dropped), or None where
    Pillow refuses it."""
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
        img.info.pop("transparency", None)
        if img.mode.startswith("I;16"):
            gray = (np.asarray(img) >> 8).astype(np.uint8)
            return np.repeat(gray[:, :, None], 3, axis=2)
        return np.array(img if img.mode == "RGB" else img.convert("RGB"))
    except Exception:
        return None


def pillow_mask(data: bytes) -> np.ndarray | None:
    """`np.array` of the PNG's gray or index band (a mask as ingest.decode.masks reads it), or None."""
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
        a = np.array(img)
    except Exception:
        return None
    return a[..., 0] if a.ndim == 3 else a


DECODED, PILLOW, REFUSED = 0, 1, 2


def check_pngs(harness: Harness, pngs: list[bytes]) -> dict[int, int]:
    """Each PNG through both modes; the claims checked against Pillow. Returns the count per image-mode status."""
    cases = [(m, p) for p in pngs for m in (b"P", b"M")]
    results = harness.run(cases)
    counts: dict[int, int] = {}
    for (mode, png), out in zip(cases, results):
        header, status, h, w, depth, ctype, offset = ints(out, 7)
        message = out[56:56 + 128].split(b"\0")[0].decode(errors="replace")
        if mode == b"P":
            counts[status] = counts.get(status, 0) + 1
        if status == REFUSED:
            assert message and -1 <= offset <= len(png), (png.hex(), message, offset)
        if status != DECODED:
            continue
        pixels = out[56 + 128:]
        if mode == b"P":
            want = pillow_rgb(png)
            assert want is not None, f"image mode decoded a PNG Pillow refuses: {png.hex()}"
            got = np.frombuffer(pixels, np.uint8).reshape(h, w, 3)
        else:
            want = pillow_mask(png)
            assert want is not None, f"mask mode decoded a PNG Pillow refuses: {png.hex()}"
            got = np.frombuffer(pixels, np.uint16 if depth == 16 else np.uint8).reshape(h, w)
            want = want.astype(got.dtype)
        assert got.shape == want.shape and np.array_equal(got, want), \
            f"{mode!r} pixels differ from Pillow's for {png.hex()}"
    return counts


def test_valid_pngs_decode_as_pillow_does(harness):
    counts = check_pngs(harness, SEED_PNGS)
    assert counts.get(DECODED, 0) >= 15   # the image mode takes most seeds (not the 16-bit ones)


def test_every_truncation_of_a_png(harness):
    pngs = [p[:n] for p in SEED_PNGS[:12] + SEED_PNGS[-4:] for n in range(len(p))]
    counts = check_pngs(harness, pngs)
    assert counts.get(DECODED, 0) == 0   # a PNG cut anywhere has lost at least its IEND


def test_png_lengths_set_to_huge_values(harness):
    pngs = []
    for p in SEED_PNGS[:20]:
        at = 8
        while at + 12 <= len(p):
            n = struct.unpack_from(">I", p, at)[0]
            for v in HUGE:
                pngs.append(p[:at] + struct.pack(">I", v) + p[at + 4:])
            if p[at + 4:at + 8] == b"IHDR":
                for field in (16, 20):   # width and height, the chunk's CRC fixed
                    for v in HUGE + [3, 0x10000]:
                        body = bytearray(p[16:29])
                        struct.pack_into(">I", body, field - 16, v)
                        pngs.append(p[:8] + chunk(b"IHDR", bytes(body)) + p[33:])
            at += 12 + n
    check_pngs(harness, pngs)


@st.composite
def png_mutant(draw) -> bytes:
    """A seed PNG with a few structure-aware changes, its chunks' CRCs fixed (mostly)."""
    png = draw(st.sampled_from(SEED_PNGS))
    parts = chunks_of(png)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["drop", "dup", "swap", "ihdr", "bytes", "rows", "zlib", "insert", "split"]))
        k = draw(st.integers(0, len(parts) - 1)) if parts else 0
        if op == "drop" and parts:
            del parts[k]
        elif op == "dup" and parts:
            parts.insert(draw(st.integers(0, len(parts))), parts[k])
        elif op == "swap" and len(parts) > 1:
            m = draw(st.integers(0, len(parts) - 1))
            parts[k], parts[m] = parts[m], parts[k]
        elif op == "ihdr" and parts and parts[0][0] == b"IHDR" and len(parts[0][1]) == 13:
            body = bytearray(parts[0][1])
            which = draw(st.sampled_from(["w", "h", "depth", "ctype", "interlace", "methods"]))
            if which in ("w", "h"):
                struct.pack_into(">I", body, 0 if which == "w" else 4,
                                 draw(st.sampled_from(HUGE + [2, 3, 5, 8, 13, 100])))
            else:
                body[{"depth": 8, "ctype": 9, "interlace": 12, "methods": 10}[which]] = \
                    draw(st.sampled_from([0, 1, 2, 3, 4, 6, 8, 16, 255]))
            parts[0] = (b"IHDR", bytes(body))
        elif op == "bytes" and parts:
            kind, data = parts[k]
            data = bytearray(data)
            for _ in range(draw(st.integers(1, 3))):
                if data:
                    data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
            cut = draw(st.integers(0, len(data)))
            parts[k] = (kind, bytes(data[:cut] if draw(st.booleans()) else data))
        elif op in ("rows", "zlib"):   # the inflated IDAT stream changed, deflated again
            idat = [i for i, (kind, _) in enumerate(parts) if kind == b"IDAT"]
            if not idat:
                continue
            try:
                raw = bytearray(zlib.decompress(b"".join(parts[i][1] for i in idat)))
            except zlib.error:
                continue
            if op == "rows":
                what = draw(st.sampled_from(["set", "cut", "grow"]))
                if what == "set" and raw:
                    raw[draw(st.integers(0, len(raw) - 1))] = draw(st.sampled_from([0, 1, 4, 5, 255,
                                                                                     draw(st.integers(0, 255))]))
                elif what == "cut":
                    del raw[draw(st.integers(0, len(raw))):]
                else:
                    raw += bytes(draw(st.integers(1, 40)))
                stream = zlib.compress(bytes(raw), draw(st.integers(0, 9)))
            else:
                stream = draw(st.sampled_from([
                    zlib.compress(bytes(raw))[:-4] + b"\0\0\0\0",          # a wrong Adler-32
                    zlib.compress(bytes(raw)) + b"trailing",
                    b"\x78\x9c" + b"\xff" * 8,                            # an invalid deflate block
                    b"\x78\xbb\0\0\0\0" + zlib.compress(bytes(raw))[2:],  # a preset dictionary
                    zlib.compress(bytes(raw))[:2] + b"\x01\x00\x00\xff\xff" + zlib.compress(bytes(raw))[2:],
                ]))
            parts = [p for i, p in enumerate(parts) if i not in idat[1:]]
            parts[idat[0]] = (b"IDAT", stream)
        elif op == "insert":
            kind = draw(st.sampled_from([b"tRNS", b"PLTE", b"eXIf", b"acTL", b"fcTL", b"abCD", b"ABCD", b"IDAT",
                                         b"IEND", b"IHDR", b"tEXt", b"a1CD", b"gAMA", b"cHRM", b"sRGB", b"pHYs",
                                         b"iCCP", b"zTXt", b"iTXt"]))
            data = draw(st.one_of(st.binary(max_size=40), st.sampled_from(ANCILLARY)))
            parts.insert(draw(st.integers(0, len(parts))), (kind, data))
        elif op == "split" and parts:
            kind, data = parts[k]
            if kind == b"IDAT" and len(data) > 1:
                cut = draw(st.integers(1, len(data) - 1))
                parts[k:k + 1] = [(b"IDAT", data[:cut]), (b"IDAT", b""), (b"IDAT", data[cut:])]
    bad_crc = draw(st.integers(-1, len(parts) - 1)) if draw(st.integers(0, 9)) == 0 else -1
    out = b"\x89PNG\r\n\x1a\n" + b"".join(chunk(kind, data, 0 if i == bad_crc else None)
                                           for i, (kind, data) in enumerate(parts))
    if draw(st.integers(0, 4)) == 0:   # a byte-level change over the whole file
        out = bytearray(out)
        out[draw(st.integers(0, len(out) - 1))] ^= 1 << draw(st.integers(0, 7))
        out = bytes(out)
    return out


@FUZZ
@given(st.lists(png_mutant(), min_size=8, max_size=8))
def test_mutated_pngs(harness, pngs):
    check_pngs(harness, pngs)


# -- JPEG headers -------------------------------------------------------------------------------------------------

def seed_jpegs() -> list[bytes]:
    rng = np.random.default_rng(3)
    out = []
    for mode in ("RGB", "L", "CMYK"):
        img = Image.fromarray(rng.integers(0, 256, size=(9, 13, 3), dtype=np.uint8)).convert(mode)
        buf = io.BytesIO()
        exif = Image.Exif()
        exif[0x0112] = 6
        img.save(buf, "JPEG", exif=exif.tobytes(), quality=50)
        out.append(buf.getvalue())
    xmp = b"http://ns.adobe.com/xap/1.0/\0<x tiff:Orientation=\"3\"/>"
    head = b"\xff\xd8\xff\xe1" + struct.pack(">H", len(xmp) + 2) + xmp
    out.append(head + out[0][2:])
    out.append(b"\xff\xd8\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00" + out[2][2:])
    return out


SEED_JPEGS = seed_jpegs()


def check_jpegs(harness: Harness, jpegs: list[bytes]) -> None:
    from ingest.decode.cpu import read_jpeg_header
    for jpeg, out in zip(jpegs, harness.run([(b"J", j) for j in jpegs])):
        row = ints(out, 9)
        assert row[0] in (0, 1, 2) and row[8] in (0, 1)
        if row[0] == 1:   # the Python reading of the same header agrees
            assert 1 <= row[6] <= 8
            try:
                header = read_jpeg_header(memoryview(jpeg))
            except Exception:
                continue
            assert tuple(header) == (row[1], row[2], row[3], row[4], row[5], row[6], bool(row[7])), jpeg.hex()


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(SEED_JPEGS), st.lists(st.tuples(st.integers(0, 10 ** 6),
                                                                         st.integers(0, 255)), max_size=4),
                          st.integers(0, 10 ** 6)), min_size=8, max_size=8))
def test_mutated_jpeg_headers(harness, cases):
    jpegs = []
    for jpeg, edits, cut in cases:
        b = bytearray(jpeg)
        for at, v in edits:
            b[at % min(len(b), 200)] = v   # the header's bytes
        jpegs.append(bytes(b[:cut % (len(b) + 1)]))
    check_jpegs(harness, jpegs)


def test_every_truncation_and_huge_segment_length_of_a_jpeg_header(harness):
    jpegs = []
    for j in SEED_JPEGS:
        jpegs += [j[:n] for n in range(min(len(j), 400))]
        at = 2
        while at + 4 <= len(j) and j[at] == 0xFF and j[at + 1] not in (0xDA, 0xD9):
            for v in (0, 1, 2, 0xFFFF, 0x8000):
                jpegs.append(j[:at + 2] + struct.pack(">H", v) + j[at + 4:])
            at += 2 + struct.unpack_from(">H", j, at + 2)[0]
    check_jpegs(harness, jpegs)


# -- tf.train.Example, TFRecord and Object Detection API records ---------------------------------------------------

OD_KEYS = [b"image/object/bbox/xmin", b"image/object/bbox/ymin", b"image/object/bbox/xmax",
           b"image/object/bbox/ymax", b"image/height", b"image/width", b"image/object/class/label",
           b"image/object/area", b"image/source_id", b"image/id"]
OD_KINDS = b"FFFFiiIFbi"
MOST = 6


def od_example(rng: np.random.Generator, boxes: int, *, extra: bool = True) -> bytes:
    ex = Example()
    f = ex.features.feature
    for key in OD_KEYS[:4]:
        f[key.decode()].float_list.value.extend(rng.random(boxes).astype(np.float32).tolist())
    f["image/height"].int64_list.value.append(int(rng.integers(1, 600)))
    f["image/width"].int64_list.value.append(int(rng.integers(1, 600)))
    f["image/object/class/label"].int64_list.value.extend(rng.integers(-5, 90, size=boxes).tolist())
    f["image/object/area"].float_list.value.extend(rng.random(boxes).tolist())
    f["image/source_id"].bytes_list.value.append(str(int(rng.integers(0, 10 ** 12))).encode())
    f["image/id"].int64_list.value.append(int(rng.integers(-2 ** 63, 2 ** 63)))
    if extra:
        f["image/encoded"].bytes_list.value.append(b"\xff\xd8\xff" + bytes(20))
        f["image/object/class/text"].bytes_list.value.extend([b"cat"] * boxes)
    return ex.SerializeToString()


SEED_EXAMPLES = [od_example(np.random.default_rng(s), b) for s, b in enumerate([0, 1, 2, 3, MOST, MOST + 1])]


def request(keys: list[bytes], kinds: bytes) -> bytes:
    return bytes([len(keys)]) + b"".join(bytes([kind, len(k)]) + k for k, kind in zip(keys, kinds))


def det_case(record: bytes, fmt: int = 0) -> bytes:
    spec = request(OD_KEYS, OD_KINDS) + bytes([2, 2, fmt]) + struct.pack("<H", MOST) + bytes([8, 4])
    return spec + record


def parse_example(data: bytes):
    try:
        return Example.FromString(data)
    except Exception:
        return None


def check_examples(harness: Harness, examples: list[bytes]) -> None:
    """Each Example through the Example scan (every OD key asked) and framed through the detection scan and
    the TFRecord image parse; whatever a scan takes, protobuf parses alike."""
    cases = []
    for data in examples:
        cases.append((b"E", request(OD_KEYS, OD_KINDS) + struct.pack("<H", 64) + data))
        cases.append((b"O", det_case(frame(data), len(cases) // 3 % 3)))   # box formats in turn
        cases.append((b"T", request([b"image/encoded", b"image/height", b"image/source_id"], b"bib") + b"\x02"
                      + frame(data)))
    results = harness.run(cases)
    for k, data in enumerate(examples):
        scan, det, image = results[3 * k:3 * k + 3]
        rc = ints(scan, 1)[0]
        ex = parse_example(data)
        if rc == 0:
            assert ex is not None, f"the Example scan took what protobuf refuses: {data.hex()}"
            used = ints(scan, 1, 8)[0]
            cells = ints(scan, 2 * len(OD_KEYS), 16)
            side = np.frombuffer(scan[16 + 16 * len(OD_KEYS):], np.int64)
            assert len(side) == used
            f = ex.features.feature
            for q, key in enumerate(OD_KEYS):
                kind, name = chr(OD_KINDS[q]), key.decode()
                if kind == "F":
                    got = side[cells[2 * q]:cells[2 * q] + cells[2 * q + 1]].view(np.float64)
                    assert np.array_equal(got, np.array(f[name].float_list.value, np.float32).astype(np.float64),
                                          equal_nan=True)
                elif kind == "I":
                    assert side[cells[2 * q]:cells[2 * q] + cells[2 * q + 1]].tolist() == \
                        list(f[name].int64_list.value)
                elif kind == "i":
                    assert [cells[2 * q]] == list(f[name].int64_list.value)
                else:
                    assert [data[cells[2 * q]:cells[2 * q] + cells[2 * q + 1]]] == list(f[name].bytes_list.value)
        rc, count = ints(det, 2)
        if rc == 0:
            assert ex is not None, f"the detection scan took what protobuf refuses: {data.hex()}"
            f = ex.features.feature
            assert count == len(f["image/object/bbox/xmin"].float_list.value) <= MOST
            if k % 3 == 0:   # ltrb asked: the reader's pixels (`tfrecord._od_boxes`), as test_native_detection
                coords = np.array([f[key.decode()].float_list.value for key in OD_KEYS[:4]], np.float32).T
                size = f["image/width"].int64_list.value[0], f["image/height"].int64_list.value[0]
                want = (coords.astype(np.float64).reshape(-1, 4) * (size * 2)).astype(np.float32)
                assert np.array_equal(np.frombuffer(det, np.float64, 4 * count, 16), want.reshape(-1),
                                      equal_nan=True), data.hex()
            at = 16 + 32 * count
            labels = np.frombuffer(det, np.int64, count, at)
            areas = np.frombuffer(det, np.float32, count, at + 8 * count)
            source_id, image_id = ints(det, 2, at + 12 * count)
            assert labels.tolist() == list(f["image/object/class/label"].int64_list.value)
            assert np.array_equal(areas, np.array(f["image/object/area"].float_list.value, np.float32),
                                  equal_nan=True)
            assert source_id == int(f["image/source_id"].bytes_list.value[0])
            assert [image_id] == list(f["image/id"].int64_list.value)
        elif rc == 2:   # more boxes than a sample may have
            assert ex is None or len(ex.features.feature["image/object/bbox/xmin"].float_list.value) > MOST or \
                len(ex.features.feature["image/object/area"].float_list.value) > MOST or \
                len(ex.features.feature["image/object/class/label"].int64_list.value) > MOST or \
                any(len(ex.features.feature[key.decode()].float_list.value) > MOST for key in OD_KEYS[:4])
        crc, ok, start, end, label, mstart, mlen = ints(image, 7)
        assert crc == 0
        if ok:
            assert ex is not None, f"the TFRecord parse took what protobuf refuses: {data.hex()}"
            f = ex.features.feature
            framed = frame(data)
            assert framed[start:end] == f["image/encoded"].bytes_list.value[0]
            assert label == f["image/height"].int64_list.value[0]
            assert framed[mstart:mstart + mlen] == f["image/source_id"].bytes_list.value[0]


def test_valid_od_examples_scan_as_protobuf_reads_them(harness):
    check_examples(harness, SEED_EXAMPLES + [od_example(np.random.default_rng(9), 2, extra=False)])


def test_every_truncation_of_an_od_example(harness):
    check_examples(harness, [e[:n] for e in SEED_EXAMPLES[:4] for n in range(len(e))])


def varint(v: int) -> bytes:
    out = bytearray()
    while True:
        out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
        v >>= 7
        if not v:
            return bytes(out)


def protobuf_fields(data: bytes) -> list[tuple[int, int, int, int]] | None:
    """(start, value start, value end, wire type) of each top-level field of a well-formed message, else None."""
    out, at = [], 0
    try:
        while at < len(data):
            start = at
            tag = 0
            for shift in range(0, 70, 7):
                b = data[at]
                at += 1
                tag |= (b & 0x7F) << shift
                if not b & 0x80:
                    break
            wire = tag & 7
            if wire == 0:
                while data[at] & 0x80:
                    at += 1
                at += 1
                out.append((start, at, at, 0))
            elif wire in (1, 5):
                at += 8 if wire == 1 else 4
                out.append((start, at, at, wire))
            elif wire == 2:
                n, shift = 0, 0
                while True:
                    b = data[at]
                    at += 1
                    n |= (b & 0x7F) << shift
                    shift += 7
                    if not b & 0x80:
                        break
                out.append((start, at, at + n, 2))
                at += n
            else:
                return None
    except IndexError:
        return None
    return out if at == len(data) else None


@st.composite
def example_mutant(draw) -> bytes:
    """A seed Example with its nested messages' fields dropped, doubled, reordered, given huge or negative length
    varints, or byte-level changes."""
    data = draw(st.sampled_from(SEED_EXAMPLES))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["nested", "bytes", "append", "length"]))
        if op == "bytes" and data:
            b = bytearray(data)
            b[draw(st.integers(0, len(b) - 1))] = draw(st.integers(0, 255))
            data = bytes(b)
        elif op in ("append", "bytes"):   # a second copy of some map entry or features message
            data = data + draw(st.sampled_from([data[:40], b"\x0a\x00", b"\x12\x00", b"\x1a\x02\x08\x01",
                                                b"\x0a\x05\x0a\x03\x0a\x01a"]))
        else:
            # walk down a few levels of length-delimited fields, then change one field there
            path, msg, base = [], data, 0
            for _depth in range(draw(st.integers(0, 4))):
                fields = protobuf_fields(msg)
                nested = [f for f in (fields or []) if f[3] == 2]
                if not nested:
                    break
                f = draw(st.sampled_from(nested))
                path.append((base, f))
                base += f[1]
                msg = msg[f[1]:f[2]]
            fields = protobuf_fields(msg)
            if not fields:
                continue
            k = draw(st.integers(0, len(fields) - 1))
            start, vstart, vend, wire = fields[k]
            whole = msg[start:vend]
            if op == "length" and wire == 2:
                tag_end = start + 1
                while msg[tag_end - 1] & 0x80:
                    tag_end += 1
                n = draw(st.sampled_from([2 ** 31, 2 ** 32 - 1, 2 ** 63, 2 ** 64 - 1, vend - vstart + 1,
                                          vend - vstart + 1000, 0]))
                new = msg[:tag_end] + varint(n) + msg[vstart:]
            else:
                what = draw(st.sampled_from(["drop", "dup", "swap"]))
                if what == "drop":
                    new = msg[:start] + msg[vend:]
                elif what == "dup":
                    new = msg[:vend] + whole + msg[vend:]
                else:
                    m = draw(st.integers(0, len(fields) - 1))
                    a, b = sorted((k, m))
                    parts = [msg[f[0]:f[2]] for f in fields]
                    parts[a], parts[b] = parts[b], parts[a]
                    new = b"".join(parts)
            data = rebuild(data, path, new)   # the changed message put back, its enclosing lengths fixed
    return data


def rebuild(data: bytes, path: list, new: bytes) -> bytes:
    """`data` with the message at `path` (its chain of enclosing fields) replaced by `new`, lengths fixed."""
    if not path:
        return new
    (_, (start, vstart, vend, _)), rest = path[0], path[1:]
    inner = rebuild(data[vstart:vend], [(b - vstart, f) for b, f in rest], new)
    tag_end = start + 1
    while data[tag_end - 1] & 0x80:
        tag_end += 1
    return data[:start] + data[start:tag_end] + varint(len(inner)) + inner + data[vend:]


@FUZZ
@given(st.lists(example_mutant(), min_size=8, max_size=8))
def test_mutated_od_examples(harness, examples):
    check_examples(harness, examples)


# -- RecordIO, Caffe Datum, framed records ------------------------------------------------------------------------

IMAGE = b"\xff\xd8\xff\xe0" + bytes(range(40))


def recordio_record(image: bytes, labels: list[float]) -> bytes:
    payload = IR_HEADER.pack(len(labels), labels[0] if len(labels) == 1 else 0.0, 7, 0)
    if len(labels) > 1:
        payload += np.array(labels, "<f4").tobytes()
    payload += image
    return MAGIC.to_bytes(4, "little") + struct.pack("<I", len(payload)) + payload + bytes(-len(payload) % 4)


SEED_RECORDIO = [recordio_record(IMAGE, [3.0]), recordio_record(IMAGE, [1.0, 2.0, 3.0]),
                 recordio_record(IMAGE[:5], [float("nan")]), recordio_record(IMAGE, [2.0 ** 40])]
SEED_DATUMS = [Datum(channels=3, height=2, width=4, data=IMAGE, label=5, encoded=True).SerializeToString(),
               Datum(data=IMAGE, label=-3, encoded=True, float_data=[1.0, 2.0]).SerializeToString()]
FRAMED_LAYOUTS = [("image", "int"), ("image", "int", "mask"), ("mask", "image"), ("image",)]


def framed_record(layout: tuple[str, ...], rng: np.random.Generator) -> bytes:
    fields = {{"int": "label"}.get(kind, kind): Field(kind) for kind in layout}
    extra = {}
    if "mask" in layout:
        extra["mask"] = rng.integers(0, 3, size=(3, 4), dtype=np.uint8)
    return encode(Record(IMAGE, int(rng.integers(-10, 10)), extra), fields)


SEED_FRAMED = [(layout, framed_record(layout, np.random.default_rng(k))) for k, layout in enumerate(FRAMED_LAYOUTS)]


def framed_case(layout: tuple[str, ...], record: bytes) -> bytes:
    codes = bytes(KIND_CODES[name] for name in layout)
    cell = layout.index("mask") if "mask" in layout else -1
    return bytes([len(codes)]) + codes + struct.pack("<b", cell) + record


def reader_of(mode: bytes, data: bytes) -> tuple[bytes, int, bytes | None]:
    """(image, label, mask or None) as the Python reader takes the record; it raises where the reader refuses."""
    if mode == b"D":   # protobuf keeps the last label; no label: -1 for the engine
        d = Datum.FromString(data)
        return d.data, d.label if d.HasField("label") else -1, None
    if mode == b"R":
        magic, lrec = struct.unpack_from("<II", data)
        if magic != MAGIC or lrec >> 29 or 8 + lrec > len(data):
            raise ValueError("not one whole unsplit record")
        record = unpack(data[8:8 + lrec], "x", 0, 0)
        return bytes(record.image), record.label, None
    n = data[0]
    layout = [{1: "image", 3: "int", 10: "mask"}[c] for c in data[1:1 + n]]
    record = data[2 + n:]
    fields = {{"int": "label"}.get(kind, kind): Field(kind) for kind in layout}
    values = decode(record, fields, path="x", key="k")
    mask = bytes(values["mask"]) if "mask" in values and data[1 + n] != 0xFF else None
    return bytes(values["image"]), values.get("label", -1), mask


def check_records(harness: Harness, cases: list[tuple[bytes, bytes]]) -> None:
    """Each record through its parse; a record the parse takes is one its Python reader takes alike."""
    for (mode, data), out in zip(cases, harness.run(cases)):
        ok, start, end, label, mstart, mlen = ints(out, 6)
        if ok != 1:
            continue
        try:
            image, want_label, mask = reader_of(mode, data)
        except Exception as err:
            raise AssertionError(f"the {mode!r} parse took what its reader refuses ({err}): {data.hex()}") from None
        record = data[2 + data[0]:] if mode == b"F" else data
        assert (record[start:end], label) == (image, want_label), data.hex()
        if mask is not None:
            assert record[mstart:mstart + mlen] == mask, data.hex()


def record_cases() -> list[tuple[bytes, bytes]]:
    cases = [(b"R", r) for r in SEED_RECORDIO] + [(b"D", d) for d in SEED_DATUMS]
    cases += [(b"F", framed_case(layout, r)) for layout, r in SEED_FRAMED]
    return cases


def test_every_truncation_and_huge_length_of_a_record(harness):
    cases = []
    for mode, data in record_cases():
        head = len(data) - len(SEED_FRAMED[0][1]) if mode == b"F" else 0
        if mode == b"F":
            head = data.index(b"IGR1")
        record = data[head:]
        cases += [(mode, data[:head] + record[:n]) for n in range(len(record))]
        for at in range(0, len(record) - 3):   # every 4 or 8 bytes read as a length
            for v in HUGE:
                cases.append((mode, data[:head] + record[:at] + struct.pack("<I", v) + record[at + 4:]))
            if mode == b"F":
                for v in (2 ** 63, 2 ** 64 - 1, 2 ** 63 - 1):
                    cases.append((mode, data[:head] + record[:at] + struct.pack("<Q", v) + record[at + 8:]))
    check_records(harness, cases)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(record_cases()),
                          st.lists(st.tuples(st.integers(0, 500), st.integers(0, 255)), min_size=1, max_size=4)),
                min_size=8, max_size=8))
def test_mutated_records(harness, cases):
    out = []
    for (mode, data), edits in cases:
        head = data.index(b"IGR1") if mode == b"F" and b"IGR1" in data else 0
        b = bytearray(data)
        for at, v in edits:
            b[head + at % (len(b) - head)] = v
        out.append((mode, bytes(b)))
    check_records(harness, out)


# -- mutated PNG images through the native engine (dry mode) --------------------------------------------------------

@settings(FUZZ, max_examples=max(4, EXAMPLES // 12))
@given(st.lists(png_mutant(), min_size=6, max_size=6), st.sampled_from(["tfrecord", "lmdb"]))
def test_mutated_png_images_through_a_dry_epoch(tmp_path_factory, pngs, fmt):
    """Records holding mutated PNG images through the engine's read team (parse, header, PNG decode, plan) in
    dry mode: every row the engine keeps is the Python stages' (run_dry), every other one Python's to fill or to
    drop with its typed error. Under `dev/sanitized_tests.py` the engine's threads run sanitized too."""
    from ingest import native
    if native.ENGINE is None:
        pytest.skip("ingest._engine was not built")
    from ingest.formats.tfrecord import TFRecordSource
    from test_native_records import images, run_dry, statuses, write_lmdb_ours, write_tfrecord
    directory = tmp_path_factory.mktemp("dry")
    records = images(3, png=(1,)) + [Record(png, k % 5) for k, png in enumerate(pngs)]
    source = TFRecordSource(str(write_tfrecord(directory, records))) if fmt == "tfrecord" else \
        write_lmdb_ours(directory, records)
    batches, _, _ = run_dry(source, max_failures=0.99, batch_size=len(records))   # (never a batch of none good)
    assert [statuses(batches)[k] for k in range(3)] == [0, 0, 0]   # the good ones (a PNG among them) stay native
