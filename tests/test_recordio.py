"""MXNet RecordIO: chunk framing (split records, padding), IRHeader labels, .idx files used or built, the
writer's bytes against the spec of dmlc-core / mxnet.recordio.pack, bad input, im2rec's files, the Loader,
and (where a Python with MXNet is configured: INGEST_MX_PYTHON, or /tmp/mxvenv outside CI) MXNet itself."""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import ingest
from conftest import jpeg_bytes, realworld
from ingest.errors import ConfigError, CorruptRecordError
from ingest.formats import Field, Record, check_format, iter_records, read_location
from ingest.formats import recordio
from ingest.formats.recordio import MAGIC, RecordIOSource, RecordIOWriter

MAGIC_BYTES = struct.pack("<I", MAGIC)
MX_PYTHON = os.environ.get("INGEST_MX_PYTHON") or ("" if os.environ.get("CI") else "/tmp/mxvenv/bin/python")


def make_records(n: int, size=(20, 28)) -> list[Record]:
    return [Record(jpeg_bytes(size[0] + i, size[1] + i, seed=i), i % 4) for i in range(n)]


def write(directory: Path, records: list[Record], stem: str = "data", fields=None) -> list[str]:
    writer = RecordIOWriter(directory, stem, fields or {"image": Field("image"), "label": Field("int")})
    for r in records:
        writer.add(r)
    return writer.close()


def chunk_headers(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, cflag, length) of every chunk, walking the file by the spec."""
    out, pos = [], 0
    while pos < len(data):
        magic, lrec = struct.unpack_from("<II", data, pos)
        assert magic == MAGIC
        out.append((pos, lrec >> 29, lrec & (2 ** 29 - 1)))
        pos += 8 + ((lrec & (2 ** 29 - 1)) + 3) // 4 * 4
    return out


def test_round_trip_and_mxnet_layout(tmp_path):
    records = make_records(5)
    assert write(tmp_path, records) == ["data.rec", "data.idx", "data.crc32c"]
    src = RecordIOSource(tmp_path / "data.rec")
    check_format(src)
    assert src.labels().tolist() == [r.label for r in records]
    for k, ((_, got), want) in enumerate(zip(iter_records(src), records)):
        assert bytes(got.image) == want.image and got.label == want.label and got.fields["id"] == k
        assert got.fields["label_values"].tolist() == [float(want.label)]
    data = (tmp_path / "data.rec").read_bytes()
    heads = chunk_headers(data)
    assert [h[1] for h in heads] == [0] * 5                      # no magic inside: unsplit records
    assert (tmp_path / "data.idx").read_text() == "".join(f"{k}\t{h[0]}\n" for k, h in enumerate(heads))
    # the payload is mxnet.recordio.pack(IRHeader(0, label, id, 0), image): struct 'IfQQ' then the bytes
    _, _, length = heads[1]
    assert data[heads[1][0] + 8:heads[1][0] + 8 + length] == struct.pack("<IfQQ", 0, 1.0, 1, 0) + records[1].image
    assert all(h[0] % 4 == 0 for h in heads) and len(data) % 4 == 0  # padded to 4 bytes


def test_records_holding_the_magic_are_split_and_joined(tmp_path):
    image = bytearray(jpeg_bytes(16, 16))
    # payload offsets: IRHeader is 24 bytes, so image offset k is payload offset 24 + k
    last = len(image) - 4 - (24 + len(image) - 4) % 4
    for at in (0, 4, 40, last):                     # aligned (payload offset % 4 == 0) -> split points
        image[at:at + 4] = MAGIC_BYTES
    image[18:22] = MAGIC_BYTES                      # not 4-aligned in the payload: no split
    image = bytes(image)
    records = [Record(jpeg_bytes(8, 8), 1), Record(image, 2), Record(jpeg_bytes(9, 9), 3)]
    write(tmp_path, records)
    data = (tmp_path / "data.rec").read_bytes()
    flags = [h[1] for h in chunk_headers(data)]
    assert flags == [0, 1, 2, 2, 2, 3, 0]
    with_idx = RecordIOSource(tmp_path / "data.rec")
    os.remove(tmp_path / "data.idx")
    scanned = RecordIOSource(tmp_path / "data.rec")
    for src in (with_idx, scanned):
        assert len(src) == 3
        got = [r for _, r in iter_records(src)]
        assert [bytes(r.image) for r in got] == [r.image for r in records] and [r.label for r in got] == [1, 2, 3]
    assert [scanned.locate(i) for i in range(3)] == [with_idx.locate(i) for i in range(3)]


def test_multi_value_labels(tmp_path):
    fields = {"image": Field("image"), "label_values": Field("floats"), "id": Field("int")}
    boxes = np.array([2, 5, 0.1, 0.2, 0.5, 0.6], dtype=np.float32)
    records = [Record(jpeg_bytes(10, 10), -1, {"label_values": boxes, "id": 90}),
               Record(jpeg_bytes(11, 11), -1, {"label_values": np.array([7.0], np.float32), "id": 91})]
    write(tmp_path, records, fields=fields)
    data = (tmp_path / "data.rec").read_bytes()
    # pack() with an array label: flag = its size, header label 0, the float32 labels before the image
    assert data[8:8 + 24 + 24] == struct.pack("<IfQQ", 6, 0.0, 90, 0) + boxes.tobytes()
    src = RecordIOSource(tmp_path / "data.rec")
    first, second = (r for _, r in iter_records(src))
    assert first.label == -1 and first.fields["label_values"].tolist() == boxes.tolist() and first.fields["id"] == 90
    assert bytes(first.image) == records[0].image
    assert second.label == 7 and second.fields["label_values"].tolist() == [7.0]
    assert src.labels().tolist() == [-1, 7]


def test_non_integral_label_is_not_a_class(tmp_path):
    payload = struct.pack("<IfQQ", 0, 0.25, 3, 0) + jpeg_bytes(8, 8)
    (tmp_path / "x.rec").write_bytes(recordio.chunks(payload))
    src = RecordIOSource(tmp_path / "x.rec")
    rec = src.parse(0, read_location(src.locate(0)))
    assert rec.label == -1 and rec.fields["label_values"].tolist() == [0.25] and src.labels().tolist() == [-1]


@pytest.mark.parametrize("with_index", [True, False])
def test_a_meta_header_record_is_not_a_sample(tmp_path, with_index):
    """InsightFace's .rec files start with IRHeader(flag=2, label=[first id record, end]) and no image."""
    records = make_records(3)
    write(tmp_path, records)
    body = (tmp_path / "data.rec").read_bytes()
    meta = recordio.chunks(recordio.IR_HEADER.pack(2, 0.0, 0, 0) + np.array([1, 4], "<f4").tobytes())
    (tmp_path / "data.rec").write_bytes(meta + body)
    if with_index:
        (tmp_path / "data.idx").write_text("".join(f"{k}\t{o}\n" for k, o in
                                                   enumerate([0] + [len(meta) + o for o in offsets_of(body)])))
    else:
        os.remove(tmp_path / "data.idx")
    src = RecordIOSource(tmp_path / "data.rec")
    assert len(src) == 3 and src.meta[str(tmp_path / "data.rec")].tolist() == [1.0, 4.0]
    assert [bytes(r.image) for _, r in iter_records(src)] == [r.image for r in records]
    check_format(src)


def test_writer_rejects_what_recordio_cannot_hold(tmp_path):
    with pytest.raises(ConfigError, match="cannot store fields \\['caption'\\]"):
        RecordIOWriter(tmp_path, "x", {"image": Field("image"), "caption": Field("text")})
    with pytest.raises(ConfigError, match="encoded images"):
        RecordIOWriter(tmp_path, "y", {"image": Field("pixels"), "label": Field("int")})


def test_files_globs_and_directories(tmp_path):
    records = make_records(5)
    write(tmp_path, records[:2], stem="a")
    write(tmp_path, records[2:], stem="b")
    for path in (tmp_path, str(tmp_path / "*.rec"), [tmp_path / "a.rec", tmp_path / "b.rec"]):
        src = RecordIOSource(path)
        assert len(src) == 5 and src.labels().tolist() == [r.label for r in records]
    assert src.name(2) == f"{tmp_path / 'b.rec'}:0"
    check_format(src)
    assert recordio.write_index(str(tmp_path / "a.rec")) == str(tmp_path / "a.idx")


# -- bad input ----------------------------------------------------------------------------------------

@pytest.fixture
def rec(tmp_path) -> Path:
    write(tmp_path, make_records(4))
    return tmp_path / "data.rec"


def offsets_of(data: bytes) -> list[int]:
    return [h[0] for h in chunk_headers(data)]


def offsets(path: Path) -> list[int]:
    return offsets_of(path.read_bytes())


def test_wrong_magic(rec):
    os.remove(rec.with_suffix(".idx"))
    data = bytearray(rec.read_bytes())
    third = offsets(rec)[2]
    data[third] ^= 0xFF
    rec.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=f"{rec} at byte {third}: wrong magic"):
        RecordIOSource(rec)


def test_truncated_file(rec):
    os.remove(rec.with_suffix(".idx"))
    last = offsets(rec)[-1]
    data = rec.read_bytes()
    for cut in (last + 3, last + 30, len(data) - 1):
        rec.write_bytes(data[:cut])
        with pytest.raises(CorruptRecordError, match=f"{rec} at byte {last}: (truncated|chunk length)"):
            RecordIOSource(rec)


def test_truncated_file_with_its_index(rec):
    last = offsets(rec)[-1]
    rec.write_bytes(rec.read_bytes()[:last + 40])
    src = RecordIOSource(rec)  # the index is in bounds; the record is not whole
    with pytest.raises(CorruptRecordError, match=f"at byte {last}: chunk length .* runs past"):
        src.parse(3, read_location(src.locate(3)))


def test_split_record_without_its_end(tmp_path):
    payload = struct.pack("<IfQQ", 0, 1.0, 0, 0) + MAGIC_BYTES + b"tail"
    data = recordio.chunks(payload)
    first_chunk = 8 + 24
    (tmp_path / "x.rec").write_bytes(data[:first_chunk])
    with pytest.raises(CorruptRecordError, match="ends inside a split record"):
        RecordIOSource(tmp_path / "x.rec")
    bad = bytearray(data)
    bad[7] = (bad[7] & 0x1F) | (2 << 5)   # a middle chunk where a record must start
    (tmp_path / "x.rec").write_bytes(bytes(bad))
    with pytest.raises(CorruptRecordError, match="continuation flag 2 cannot start a first chunk"):
        RecordIOSource(tmp_path / "x.rec")


def test_index_entries_that_disagree_with_the_data(rec):
    os.remove(rec.with_suffix(".crc32c"))   # without the CRCs of every record, which would name the count first
    idx = rec.with_suffix(".idx")
    starts = offsets(rec)
    idx.write_text(f"0\t{starts[0]}\n1\t{starts[1] + 4}\n")
    src = RecordIOSource(rec)
    with pytest.raises(CorruptRecordError, match=f"{rec} \\[sample 1\\] at byte {starts[1] + 4}: wrong magic"):
        src.parse(1, read_location(src.locate(1)))
    idx.write_text(f"0\t{starts[0]}\n1\t{rec.stat().st_size + 8}\n")
    with pytest.raises(CorruptRecordError, match="data.idx.*index line 2"):
        RecordIOSource(rec)
    idx.write_text(f"0\t{starts[0]}\n1\t{starts[0]}\n")
    with pytest.raises(CorruptRecordError, match="listed twice"):
        RecordIOSource(rec)
    idx.write_text("just one word\n")
    with pytest.raises(CorruptRecordError, match="is not 'key<TAB>offset'"):
        RecordIOSource(rec)


@pytest.mark.parametrize("edit", ["empty", "first dropped", "middle dropped", "repeated"])
def test_index_must_list_every_record(rec, edit):
    """An empty index dropped a shard, a deleted line a record (read with its neighbour), a duplicated one
    repeated it, all silently: each is now named, at open or when the record is read."""
    idx = rec.with_suffix(".idx")
    lines = idx.read_text().splitlines(keepends=True)
    starts = offsets(rec)
    kept = {"empty": [], "first dropped": lines[1:], "middle dropped": lines[:1] + lines[2:],
            "repeated": lines + lines[1:2]}[edit]
    idx.write_text("".join(kept))
    with pytest.raises(CorruptRecordError, match=r"data\.(crc32c: holds the CRCs of 4 records|idx)"):
        RecordIOSource(rec)   # with its CRC file, which counts every record written, named at open
    os.remove(rec.with_suffix(".crc32c"))
    if edit != "middle dropped":
        with pytest.raises(CorruptRecordError, match=r"data\.idx.*(lists no record|starts at byte|listed twice)"):
            RecordIOSource(rec)
        return
    src = RecordIOSource(rec)
    assert len(src) == 3
    with pytest.raises(CorruptRecordError, match=f"{rec} \\[sample 0\\] at byte {starts[0]}: the record here spans"):
        src.parse(0, read_location(src.locate(0)))
    got = src.parse_batch([0, 1, 2], [read_location(src.locate(i)) for i in range(3)])
    assert isinstance(got[0], CorruptRecordError) and [r.label for r in got[1:]] == [2, 3]


@pytest.mark.parametrize("payload, message", [
    (b"short", "shorter than the 24-byte IRHeader"),
    (struct.pack("<IfQQ", 1000, 0, 0, 0) + b"x" * 12, "flag 1000 promises more float labels"),
    (struct.pack("<IfQQ", 0, 1, 0, 0), "no image bytes"),
])
def test_bad_payloads(tmp_path, payload, message):
    (tmp_path / "x.rec").write_bytes(recordio.chunks(payload))
    src = RecordIOSource(tmp_path / "x.rec")
    with pytest.raises(CorruptRecordError, match=f"x.rec \\[sample 0\\] at byte 0: .*{message}"):
        src.parse(0, read_location(src.locate(0)))


# -- im2rec's files and the Loader ----------------------------------------------------------------------

@pytest.mark.realworld
@pytest.mark.parametrize("with_index", [True, False])
def test_realworld_im2rec(tmp_path, with_index):
    root = realworld("mxnet_recordio") / "adaface_train"
    src = RecordIOSource(root / "train.rec", index=None if with_index else [None])
    check_format(src)
    assert len(src) == 8
    # im2rec's .lst: index<TAB>label<TAB>path, in the order it packed them; the header id is the index
    lst = [line.split("\t") for line in (root / "train.lst").read_text().splitlines()]
    got = [rec for _, rec in iter_records(src)]
    assert [r.fields["id"] for r in got] == [int(row[0]) for row in lst]
    assert [r.label for r in got] == [int(float(row[1])) for row in lst] == src.labels().tolist()
    for r in got:
        with Image.open(io.BytesIO(r.image)) as im:
            assert im.format == "JPEG" and im.size == (112, 112)


def test_loader_end_to_end(tmp_path):
    records = [Record(jpeg_bytes(24, 32, seed=i), i % 4) for i in range(7)]
    write(tmp_path, records)
    loader = ingest.Loader(str(tmp_path / "data.rec"), batch_size=3, device="cpu")
    labels, count = [], 0
    for images, batch_labels in loader:
        count += len(images)
        labels += batch_labels.tolist()
    assert count == 7 and labels == [r.label for r in records]


@pytest.mark.skipif(not (MX_PYTHON and os.path.exists(MX_PYTHON)), reason="no MXNet Python (INGEST_MX_PYTHON)")
def test_mxnet_reads_what_the_writer_wrote_and_writes_the_same_bytes(tmp_path):
    """dev/mx_crosscheck.py, run by MXNet's Python (a developer's check, not CI's): MXIndexedRecordIO + recordio.unpack (and MXRecordIO front
    to back) read our file; MXNet re-packing the same payloads writes byte-identical .rec and .idx files."""
    split = bytearray(jpeg_bytes(12, 12))
    split[8:12] = split[40:44] = MAGIC_BYTES
    boxes = np.array([4, 5, 1, 0.1, 0.2, 0.6, 0.7], np.float32)
    records = [Record(jpeg_bytes(10, 14), 3, {"label_values": np.array([3.0], np.float32), "id": 0}),
               Record(jpeg_bytes(16, 10, seed=1), -1, {"label_values": boxes, "id": 1}),
               Record(bytes(split), 5, {"label_values": np.array([5.0], np.float32), "id": 2})]
    fields = {"image": Field("image"), "label": Field("int"), "label_values": Field("floats"), "id": Field("int")}
    write(tmp_path, records, stem="ours", fields=fields)
    script = Path(__file__).resolve().parents[1] / "dev" / "mx_crosscheck.py"
    out = subprocess.run([MX_PYTHON, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300)
    if "No module named 'mxnet'" in out.stderr:
        pytest.skip("MXNet is not installed in that Python")
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])["records"]
    assert [r["flag"] for r in seen] == [0, 7, 0]
    assert [r["label"] for r in seen] == [3.0, pytest.approx(boxes.tolist()), 5.0]
    assert [r["id"] for r in seen] == [0, 1, 2]
    assert [r["image_sha256"] for r in seen] == [hashlib.sha256(r.image).hexdigest() for r in records]
    for suffix in (".rec", ".idx"):
        assert (tmp_path / f"mx{suffix}").read_bytes() == (tmp_path / f"ours{suffix}").read_bytes()


def test_header_edge_values_and_buffer_types(tmp_path):
    """The unsplit-record path reads what the general one does: a uint64 id above 2**63 becomes a negative
    int64, NaN / infinite / negative labels are no class, and a numpy buffer parses like bytes."""
    image = jpeg_bytes(8, 8)
    heads = [(0, 3.0, 2 ** 64 - 5), (0, float("nan"), 1), (0, float("inf"), 2), (0, -1.0, 2 ** 63)]
    (tmp_path / "x.rec").write_bytes(b"".join(recordio.chunks(struct.pack("<IfQQ", *h, 0) + image)
                                              for h in heads))
    src = RecordIOSource(tmp_path / "x.rec")
    got = [src.parse(i, np.frombuffer(read_location(src.locate(i)), np.uint8)) for i in range(len(heads))]
    assert [r.label for r in got] == [3, -1, -1, -1] == src.labels().tolist()
    assert [r.fields["id"] for r in got] == [-5, 1, 2, -2 ** 63]
    assert all(r.image.dtype == np.uint8 and r.image.tobytes() == image for r in got)
    raw = bytearray(read_location(src.locate(0)))
    raw[4:8] = struct.pack("<I", len(raw))   # the chunk length runs past the record's extent
    with pytest.raises(CorruptRecordError, match="runs past the record's extent"):
        src.parse(0, np.frombuffer(bytes(raw), np.uint8))


def test_a_batch_parses_as_each_record_does(tmp_path):
    """parse_batch (a batch's headers read as one array) against parse on the common record, split records,
    multi-value labels, edge headers and damaged records: the same Records, or the same errors."""
    from ingest.formats.base import _same_record, parse_or_error

    image = jpeg_bytes(8, 8)
    heads = [(0, 3.0, 2 ** 64 - 5), (0, float("nan"), 1), (0, float("inf"), 2), (0, -1.0, 2 ** 63),
             (0, 2.0 ** 31, 3), (0, 7.5, 4), (0, 2.0 ** 31 - 128, 5)]
    payloads = [struct.pack("<IfQQ", *h, 0) + image for h in heads]
    payloads.append(struct.pack("<IfQQ", 2, 0.0, 9, 0) + struct.pack("<2f", 1.5, 2.5) + image)   # multi-value
    payloads.append(struct.pack("<IfQQ", 0, 1.0, 8, 0) + MAGIC_BYTES + image)                    # split in two
    payloads.append(struct.pack("<IfQQ", 0, 1.0, 8, 0))                                          # no image
    (tmp_path / "x.rec").write_bytes(b"".join(recordio.chunks(p) for p in payloads))
    src = RecordIOSource(tmp_path / "x.rec")
    raws = [np.frombuffer(read_location(src.locate(i)), np.uint8) for i in range(len(src))]
    damaged = [raws[0][:20], raws[0][:31], np.frombuffer(b"\0" * 40, np.uint8)]
    indices = list(range(len(src))) + [0, 0, 0]
    batch = src.parse_batch(indices, raws + damaged)
    for i, got, raw in zip(indices, batch, raws + damaged):
        want = parse_or_error(src, i, raw)
        if isinstance(want, Exception):
            assert type(got) is type(want) and str(got) == str(want)
        else:
            assert _same_record(got, want) and got.image.dtype == np.uint8
    assert [r.label for r in batch[:7]] == [3, -1, -1, -1, -1, -1, 2 ** 31 - 128]
    assert batch[7].fields["label_values"].tolist() == [1.5, 2.5] and batch[8].image.tobytes() == MAGIC_BYTES + image
    assert isinstance(batch[9], CorruptRecordError) and all(isinstance(e, CorruptRecordError) for e in batch[-3:])
    assert src.parse_batch([], []) == []
    common = [0, 5, 6]   # one unsplit chunk, one label: read from the batch's header array, never through parse
    src.parse = lambda i, raw: pytest.fail(f"record {i} went through parse")
    assert [r.label for r in src.parse_batch(common, [raws[i] for i in common])] == [3, -1, 2 ** 31 - 128]


def test_realworld_im2rec_batch_parses_as_each_record_does():
    from ingest.formats.base import _same_record

    src = RecordIOSource(realworld("mxnet_recordio") / "adaface_train" / "train.rec")
    raws = [np.frombuffer(read_location(src.locate(i)), np.uint8) for i in range(len(src))]
    batch = src.parse_batch(list(range(len(src))), raws)
    assert len(batch) == 8 and all(_same_record(b, src.parse(i, r)) for i, (b, r) in enumerate(zip(batch, raws)))
