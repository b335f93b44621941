"""The batch scan of TFRecord records (`ingest.formats._wire`, `TFRecordSource.parse_batch`) against the
reference, protobuf's per-record parse: the same records or the same errors, on written, real, hand-encoded,
random and mutated records; what the scan takes and what it leaves to protobuf."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.errors import CorruptRecordError
from ingest.formats import Field, Record, read_location
from ingest.formats import tfrecord
from ingest.formats._protos import Example
from ingest.formats.base import _same_record, parse_or_error
from ingest.formats.tfrecord import TFRecordSource, TFRecordWriter, frame

from conftest import realworld
from test_fuzz_records import mutated

wire = pytest.importorskip("ingest.formats._wire", reason="the compiled scan was not built")

FAKE_JPEG = b"\xff\xd8\xff\xe0" + bytes(range(40))
SPEC = {"image": ("img", Field("image")), "label": ("lbl", Field("int")), "t": ("txt", Field("text")),
        "f": ("flt", Field("float")), "li": ("ints", Field("ints")), "lf": ("floats", Field("floats")),
        "b": ("raw", Field("bytes"))}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _example(img=FAKE_JPEG, lbl=3, txt="héllo", flt=0.25, ints=(1, -2, 2 ** 40), floats=(0.5, -1.0), raw=b"\x00x"):
    ex = Example()
    fmap = ex.features.feature
    fmap["img"].bytes_list.value.append(img)
    fmap["lbl"].int64_list.value.append(lbl)
    fmap["txt"].bytes_list.value.append(txt.encode())
    fmap["flt"].float_list.value.append(flt)
    fmap["ints"].int64_list.value.extend(ints)
    fmap["floats"].float_list.value.extend(floats)
    fmap["raw"].bytes_list.value.append(raw)
    return ex


@pytest.fixture()
def source(tmp_path):
    path = tmp_path / "one.tfrecord"
    path.write_bytes(frame(_example().SerializeToString()))
    src = TFRecordSource(str(path), features=SPEC)
    assert src._scan is not None
    return src


def _compare(src, records: list[bytes]) -> list:
    """parse_batch against parse, record by record: the same Record or the same error."""
    batch = src.parse_batch([0] * len(records), records)
    for got, raw in zip(batch, records):
        want = parse_or_error(src, 0, raw)
        if isinstance(want, Exception):
            assert type(got) is type(want) and str(got) == str(want)
        else:
            assert _same_record(got, want), (got, want)
    return batch


def _status(src, records: list[bytes], crc: int = 0) -> list[int]:
    keys, codes, _ = src._scan
    out = np.empty((len(records), 5 + 2 * len(keys)), np.int64)
    wire.examples(records, keys, codes, out, np.empty(256 * len(records), np.int64), crc)
    return out[:, 0].tolist()


def test_written_records_are_scanned_and_read_as_protobuf_reads_them(tmp_path):
    fields = {"image": Field("image"), "label": Field("int"), "name": Field("text"), "score": Field("float"),
              "tags": Field("ints"), "weights": Field("floats"), "blob": Field("bytes")}
    writer = TFRecordWriter(tmp_path, "w", fields)
    for i in range(20):
        writer.add(Record(FAKE_JPEG + bytes([i]), i, {"name": f"n{i}", "score": i / 3, "tags": np.arange(i),
                                                     "weights": np.linspace(0, 1, i % 5, dtype=np.float32),
                                                     "blob": bytes([i]) * i}))
    writer.close()
    src = TFRecordSource(str(tmp_path / "w.tfrecord"), features=tfrecord.writer_spec(fields))
    raws = [read_location(src.locate(i)) for i in range(len(src))]
    assert _status(src, raws) == [0] * 20
    batch = _compare(src, raws)
    assert [r.label for r in batch] == list(range(20))
    # the image is a view of the bytes read, not a copy out of a message
    arena = np.frombuffer(b"".join(raws), np.uint8)
    views, at = [], 0
    for raw in raws:
        views.append(arena[at:at + len(raw)])
        at += len(raw)
    image = src.parse_batch([0], views[:1])[0].image
    assert isinstance(image, np.ndarray) and image.base is not None and np.shares_memory(image, arena)


def test_hand_encoded_forms(source):
    """Unpacked lists, unknown fields, fields in any order, an empty Feature for a list: taken and read as
    protobuf reads them. A key given twice, a list given twice, SequenceExample feature lists, a map entry with
    an unknown field: left to protobuf, with the same result."""
    def field(number, wire_type, payload=b"", value=None):
        tag = bytes(_varint(number << 3 | wire_type))
        if wire_type == 0:
            return tag + bytes(_varint(value))
        if wire_type == 5:
            return tag + payload
        return tag + bytes(_varint(len(payload))) + payload

    def entry(key, feature):
        return field(1, 2, field(1, 2, key.encode()) + field(2, 2, feature))

    unpacked_ints = field(3, 2, field(1, 0, value=5) + field(1, 0, value=2 ** 64 - 7) + field(9, 0, value=1))
    unpacked_floats = field(2, 2, field(1, 5, struct.pack("<f", 1.5)) + field(1, 5, struct.pack("<f", -2.0)))
    base = [entry("img", field(1, 2, field(1, 2, FAKE_JPEG))), entry("lbl", field(3, 2, field(1, 0, value=7))),
            entry("txt", field(1, 2, field(1, 2, b"t"))),
            entry("flt", field(2, 2, field(1, 2, struct.pack("<f", 3.0)))), entry("raw", field(1, 2, field(1, 2, b"")))]
    taken = [
        field(1, 2, b"".join(base) + entry("ints", unpacked_ints) + entry("floats", unpacked_floats)),
        field(1, 2, b"".join(reversed(base)) + entry("ints", b"") + entry("floats", field(2, 2, b""))),
        field(7, 0, value=1) + field(1, 2, field(5, 2, b"zz") + b"".join(base) + entry("ints", unpacked_ints)
                                     + entry("floats", b"") + entry("other", field(3, 2, field(1, 0, value=1)))),
    ]
    left = [
        field(1, 2, b"".join(base) + entry("ints", b"") + entry("floats", b"")
              + entry("lbl", field(3, 2, b"\x08\x01"))),
        field(1, 2, b"".join(base) + entry("ints", unpacked_ints + unpacked_ints) + entry("floats", b"")),
        field(1, 2, b"".join(base) + entry("ints", b"") + entry("floats", b"")) + field(2, 2, b""),
        field(1, 2, b"".join(base)),   # "ints" is missing
        field(1, 2, b"".join(base[1:]) + entry("img", field(1, 2, b"")) + entry("ints", b"") + entry("floats", b"")),
        # a map entry with an unknown field: protobuf sets the entry aside ("floats" is missing)
        field(1, 2, b"".join(base) + entry("ints", b"")
              + field(1, 2, field(1, 2, b"floats") + field(2, 2, field(2, 2, b"")) + field(3, 2, b"x"))),
    ]
    records = [frame(m) for m in taken + left]
    assert _status(source, records) == [0] * len(taken) + [1] * len(left)
    batch = _compare(source, records)
    assert batch[0].fields["li"].tolist() == [5, -7] and batch[0].fields["lf"].tolist() == [1.5, -2.0]
    assert batch[0].label == 7 and batch[0].fields["f"] == 3.0 and batch[0].fields["b"] == b""


def _varint(x: int):
    while True:
        b = x & 0x7F
        x >>= 7
        yield b | (0x80 if x else 0)
        if not x:
            return


def test_list_values_past_the_batch_room_go_to_protobuf(source):
    raws = [frame(_example(ints=range(600)).SerializeToString()), frame(_example().SerializeToString())]
    assert _status(source, raws) == [1, 0]
    assert _compare(source, raws)[0].fields["li"].tolist() == list(range(600))


def test_the_crc32c_package_function_is_found():
    """The package's own CRC function serves the batch check on this machine (x86-64, crc32c 2.x)."""
    assert tfrecord._CRC
    good = frame(_example().SerializeToString())
    bad = good[:-1] + bytes([good[-1] ^ 0x80])
    src_spec = tfrecord._scan_plan(SPEC)
    out = np.empty((2, 5 + 2 * len(src_spec[0])), np.int64)
    wire.examples([good, bad], src_spec[0], src_spec[1], out, np.empty(512, np.int64), tfrecord._CRC)
    assert out[:, 0].tolist() == [0, 1]


@pytest.mark.parametrize("native_crc", [True, False])
def test_bad_crc_and_framing_in_a_batch_name_the_record(source, monkeypatch, native_crc):
    if not native_crc:
        monkeypatch.setattr(tfrecord, "_CRC", 0)
    good = frame(_example().SerializeToString())
    flipped = bytearray(good)
    flipped[good.index(FAKE_JPEG) + 10] ^= 1   # inside the image: the message still parses
    short = good[:-1]
    batch = _compare(source, [good, bytes(flipped), short])
    assert isinstance(batch[0], Record)
    assert isinstance(batch[1], CorruptRecordError) and "bad data CRC" in str(batch[1])
    assert isinstance(batch[2], CorruptRecordError)
    unchecked = TFRecordSource(source.shards, features=SPEC, check_crc=False)
    assert isinstance(unchecked.parse_batch([0], [bytes(flipped)])[0], Record)


def test_without_the_compiled_scan_every_record_goes_through_protobuf(source, monkeypatch):
    monkeypatch.setattr(tfrecord, "_wire", None)
    plain = TFRecordSource(source.shards, features=SPEC)
    assert plain._scan is None
    raws = [frame(_example(lbl=k).SerializeToString()) for k in range(3)]
    assert [r.label for r in plain.parse_batch([0, 0, 0], raws)] == [0, 1, 2]


def test_specs_the_scan_does_not_take(tmp_path):
    path = tmp_path / "px.tfrecord"
    TFRecordWriter(tmp_path, "px", {"image": Field("pixels")}).close()
    writer = TFRecordWriter(tmp_path, "px", {"image": Field("pixels"), "label": Field("int")})
    writer.add(Record(np.zeros((2, 3, 3), np.uint8), 1))
    writer.close()
    src = TFRecordSource(str(path))
    assert src._scan is None
    assert src.parse_batch([0], [read_location(src.locate(0))])[0].image.shape == (2, 3, 3)


@pytest.mark.parametrize("name", ["example.tfrecord", "sequence_example.tfrecord"])
def test_realworld_records_read_the_same(name):
    path = realworld("tfrecord") / name
    kwargs = {"sequence": True} if name.startswith("sequence") else {}
    src = TFRecordSource(str(path), **kwargs)
    raws = [read_location(src.locate(i)) for i in range(len(src))]
    batch = src.parse_batch(list(range(len(src))), raws)
    for i, (got, raw) in enumerate(zip(batch, raws)):
        want = parse_or_error(src, i, raw)
        assert _same_record(got, want) if isinstance(want, Record) else type(got) is type(want)


# -- random and mutated records --------------------------------------------------------------------------

KEYS = ["img", "lbl", "txt", "flt", "ints", "floats", "raw", "other", "", "é"]


@st.composite
def examples(draw) -> bytes:
    ex = _example() if draw(st.booleans()) else Example()   # from a valid record, so that the scan takes some
    fmap = ex.features.feature
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=4, unique=True)):
        kind = draw(st.sampled_from(["bytes", "int", "float", "none"]))
        n = draw(st.integers(0, 3))
        if kind == "bytes":
            fmap[key].bytes_list.value.extend(draw(st.lists(st.binary(max_size=12), min_size=n, max_size=n)))
        elif kind == "int":
            ints = st.integers(-2 ** 63, 2 ** 63 - 1)
            fmap[key].int64_list.value.extend(draw(st.lists(ints, min_size=n, max_size=n)))
        elif kind == "float":
            fmap[key].float_list.value.extend(draw(st.lists(st.floats(width=32, allow_nan=False), min_size=n,
                                                            max_size=n)))
        else:
            fmap[key].SetInParent()
    return ex.SerializeToString(deterministic=draw(st.booleans()))


@FUZZ
@given(data=st.data())
def test_random_and_mutated_examples_read_as_protobuf_reads_them(source, data):
    messages = data.draw(st.lists(examples(), min_size=1, max_size=4))
    records = [frame(data.draw(mutated(m))) for m in messages]
    _compare(source, records)


# -- DeepLab's segmentation layout: the mask is scanned too ----------------------------------------------

FAKE_PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(30))


def _deeplab(img=FAKE_JPEG, mask=FAKE_PNG, height=(4,), width=(6,)) -> Example:
    ex = Example()
    fmap = ex.features.feature
    fmap["image/encoded"].bytes_list.value.append(img)
    fmap["image/format"].bytes_list.value.append(b"jpeg")
    if mask is not None:
        fmap["image/segmentation/class/encoded"].bytes_list.value.append(mask)
    fmap["image/height"].int64_list.value.extend(height)
    fmap["image/width"].int64_list.value.extend(width)
    return ex


@pytest.fixture()
def deeplab(tmp_path):
    path = tmp_path / "seg.tfrecord"
    path.write_bytes(frame(_deeplab().SerializeToString()))
    src = TFRecordSource(str(path))   # the inferred spec: image, mask, and the size lists
    assert src.fields["mask"].kind == "mask" and src._scan is not None
    return src


@pytest.mark.parametrize("native_crc", [True, False])
def test_deeplab_records_are_scanned_and_damaged_ones_named_as_parse_names_them(deeplab, monkeypatch, native_crc):
    crc = tfrecord._CRC
    if not native_crc:
        monkeypatch.setattr(tfrecord, "_CRC", 0)
    good = [frame(_deeplab(mask=FAKE_PNG + bytes([k]), height=(k,)).SerializeToString()) for k in range(3)]
    flipped = bytearray(good[0])
    flipped[good[0].index(FAKE_PNG) + 3] ^= 1   # inside the mask: the message still parses
    no_mask = _deeplab(mask=None)
    int_mask = _deeplab(mask=None)
    int_mask.features.feature["image/segmentation/class/encoded"].int64_list.value.append(1)
    two_masks = _deeplab()
    two_masks.features.feature["image/segmentation/class/encoded"].bytes_list.value.append(FAKE_PNG)
    damaged = [bytes(flipped), good[1][:-3], b"\x00" * 20] + [frame(m.SerializeToString()) for m in
                                                              (no_mask, int_mask, two_masks, _deeplab(mask=b""))]
    records = good + damaged
    # the bad CRC and the truncated, missing, ill-typed and doubled masks are left to protobuf by the scan; an
    # empty mask is scanned, then refused by `_scanned`: protobuf's path names every one of them
    assert _status(deeplab, records, crc) == [0] * 3 + [1] * 6 + [0]
    batch = _compare(deeplab, records)
    for k, record in enumerate(batch[:3]):
        assert type(record.fields["mask"]) is bytes and record.fields["mask"] == FAKE_PNG + bytes([k])
        assert record.fields["image/height"].tolist() == [k] and record.fields["image/height"].dtype == np.int64
    assert "bad data CRC" in str(batch[3])
    assert [f"'image/segmentation/class/encoded': {what}" in str(e) for e, what in
            zip(batch[6:], ("missing", "holds a int64_list", "holds 2 values", "empty mask"))] == [True] * 4


def test_deeplab_records_written_by_the_writer_read_the_same(tmp_path):
    fields = {"image": Field("image"), "mask": Field("mask"), "label": Field("int")}
    writer = TFRecordWriter(tmp_path, "seg", fields)
    for i in range(10):
        writer.add(Record(FAKE_JPEG + bytes([i]), i, {"mask": FAKE_PNG * (i + 1)}))
    writer.close()
    for features in (None, tfrecord.writer_spec(fields),
                     {"image": ["image/encoded", "image"], "mask": ["image/segmentation/class/encoded", "mask"]}):
        src = TFRecordSource(str(tmp_path / "seg.tfrecord"), features=features)
        raws = [read_location(src.locate(i)) for i in range(len(src))]
        assert src._scan is not None and _status(src, raws) == [0] * 10
        assert [r.fields["mask"] for r in _compare(src, raws)] == [FAKE_PNG * (i + 1) for i in range(10)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_deeplab_records_read_as_protobuf_reads_them(deeplab, data):
    messages = [_deeplab(mask=data.draw(st.binary(max_size=8)), height=data.draw(st.lists(st.integers(0, 9),
                                                                                         max_size=2)))
                for _ in range(data.draw(st.integers(1, 3)))]
    _compare(deeplab, [frame(data.draw(mutated(m.SerializeToString()))) for m in messages])


# -- the Object Detection API's layout: boxes and image ids are scanned too ------------------------------

def _od_records(tmp_path) -> str:
    fields = {"image": Field("image"), "boxes": Field("array", dtype="float32"), "categories": Field("ints"),
              "iscrowd": Field("ints"), "area": Field("floats"), "image_id": Field("int")}
    writer = TFRecordWriter(tmp_path, "od", fields)
    rng = np.random.default_rng(0)
    for i in range(6):
        xy = rng.uniform(0, 20, (i, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(1, 9, (i, 2))], axis=1)
        writer.add(Record(bytes(_tiny_png(24, 32)), -1, {"boxes": boxes, "categories": np.arange(i),
                                                      "iscrowd": np.zeros(i, np.int64),
                                                      "area": np.full(i, 2.5, np.float32), "image_id": 100 + i}))
    writer.close()
    return str(tmp_path / "od.tfrecord")


def _tiny_png(height: int, width: int) -> bytes:
    import io

    from PIL import Image
    out = io.BytesIO()
    Image.new("L", (width, height)).save(out, format="PNG")
    return out.getvalue()


def _od_example(**changes) -> bytes:
    """One OD API record with a box, ``changes`` replacing features (key -> (list kind, values), or None to
    leave the feature out)."""
    features = {"image/encoded": ("bytes_list", [FAKE_JPEG]), "image/height": ("int64_list", [10]),
                "image/width": ("int64_list", [20]), "image/object/class/label": ("int64_list", [1]),
                "image/source_id": ("bytes_list", [b"42"]),
                **{key: ("float_list", [v]) for key, v in zip(tfrecord.OD_BOX_KEYS, (0.1, 0.2, 0.5, 0.75))}}
    features.update(changes)
    ex = Example()
    for key, feature in features.items():
        if feature is not None:
            getattr(ex.features.feature[key], feature[0]).value.extend(feature[1])
    return frame(ex.SerializeToString())


@pytest.mark.parametrize("box_format", ["xyxy", "xywh", "cxcywh"])
def test_detection_records_are_scanned_and_read_as_parse_reads_them(tmp_path, box_format):
    path = _od_records(tmp_path)
    src = TFRecordSource(path, box_format=box_format)
    assert {"boxes", "categories", "iscrowd", "area", "image_id"} <= set(src.fields) and src._scan is not None
    raws = [read_location(src.locate(i)) for i in range(len(src))]
    assert _status(src, raws) == [0] * len(raws)
    batch = _compare(src, raws)
    assert [r.fields["image_id"] for r in batch] == list(range(100, 106))
    assert [r.fields["boxes"].shape for r in batch] == [(i, 4) for i in range(6)]
    assert batch[3].fields["boxes"].dtype == np.float32 and batch[3].fields["boxes"].any()
    spec = TFRecordSource(path, features={"image": "image/encoded", "boxes": ["image/object/bbox", "array"],
                                          "categories": "image/object/class/label"})
    assert spec._scan is not None and _status(spec, raws) == [0] * len(raws)
    _compare(spec, raws)


def test_damaged_detection_records_are_named_as_parse_names_them(tmp_path):
    spec = {"image": "image/encoded", "boxes": ["image/object/bbox", "array"], "image_id": ["image/source_id", "int"],
            "categories": "image/object/class/label"}
    path = tmp_path / "one.tfrecord"
    path.write_bytes(_od_example())
    src = TFRecordSource(str(path), features=spec)
    assert src._scan is not None
    ymax = tfrecord.OD_BOX_KEYS[3]
    records = [_od_example(), _od_example(**{ymax: ("float_list", [0.5, 0.6])}),
               _od_example(**{"image/height": ("int64_list", [0])}), _od_example(**{"image/width": None}),
               _od_example(**{"image/source_id": ("bytes_list", [b"img7.jpg"])}),
               _od_example(**{"image/source_id": ("bytes_list", [b""])}),
               _od_example(**{ymax: ("int64_list", [1])})]
    # taken by the scan but refused by `_od_boxes` or `_scanned` (list lengths, size, id), or left by the scan
    assert _status(src, records) == [0, 0, 0, 1, 0, 0, 1]
    batch = _compare(src, records)
    assert batch[0].fields["boxes"].tolist() == [[2.0, 2.0, 10.0, 7.5]] and batch[0].fields["image_id"] == 42
    assert ["coordinate lists of different lengths" in str(batch[1]), "image size 0x20" in str(batch[2]),
            "'image/width': missing" in str(batch[3]), "not an integer image id" in str(batch[4]),
            "not an integer image id" in str(batch[5]), "holds a int64_list" in str(batch[6])] == [True] * 6
    many = [_od_example(**{key: ("float_list", [0.5] * 70) for key in tfrecord.OD_BOX_KEYS})]
    assert _status(src, many) == [1]   # past the batch's list room: read by protobuf
    assert _compare(src, many)[0].fields["boxes"].shape == (70, 4)
