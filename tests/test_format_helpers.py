"""The mechanisms the formats share: shard-path resolution, gzip detection, the image-type table and
atomic writes, each checked once here and through the readers and tools that use them."""

from __future__ import annotations

import gzip
import io
import os
import tarfile

import numpy as np
import pytest
from PIL import Image

from conftest import textured
from ingest._atomic import atomic_write
from ingest.errors import SourceError
from ingest.formats import Field, Record, check_format, iter_records
from ingest.formats._images import IMAGE_TYPES, image_extension, image_type
from ingest.formats._protos import Example
from ingest.formats._shards import gzipped
from ingest.formats.recordio import RecordIOSource, RecordIOWriter
from ingest.formats.tfrecord import TFRecordSource, TFRecordWriter, frame
from ingest.formats.webdataset import WebDatasetSource, WebDatasetWriter
from ingest.tools import shardfiles

#: PIL format name -> the type `image_type` must give its output.
PIL_TYPES = {"JPEG": "jpeg", "PNG": "png", "GIF": "gif", "WEBP": "webp", "BMP": "bmp", "TIFF": "tiff",
             "PPM": "ppm"}


def encoded(fmt: str, pixels: np.ndarray | None = None) -> bytes:
    out = io.BytesIO()
    Image.fromarray(textured(8, 10) if pixels is None else pixels).save(out, fmt)
    return out.getvalue()


# -- the image-type table ----------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", sorted(PIL_TYPES))
def test_image_type_agrees_with_pillow(fmt):
    data = encoded(fmt)
    with Image.open(io.BytesIO(data)) as img:
        assert PIL_TYPES[img.format] == image_type(data)
    ext = image_extension(np.frombuffer(data, np.uint8))   # any bytes-like
    assert ext == next(e for name, e, _ in IMAGE_TYPES if name == image_type(data))


def test_image_type_of_gray_ppm_and_unknown_bytes():
    assert image_type(encoded("PPM", textured(6, 6)[..., 0])) == "pgm"
    for junk in (b"", b"RIFF\0\0\0\0WAVEfmt ", b"\xff\xd8", b"GIF90a", b"not an image"):
        assert image_type(junk) is None and image_extension(junk) is None


def test_tfrecord_infers_and_names_webp_images(tmp_path):
    webp = encoded("WEBP")
    path = tmp_path / "w.tfrecord"
    example = Example()
    example.features.feature["image/encoded"].bytes_list.value.append(webp)
    example.features.feature["image/class/label"].int64_list.value.append(3)
    path.write_bytes(frame(example.SerializeToString()))
    src = TFRecordSource(path)   # no spec: the image key is taken only when it holds a known image type
    assert src.fields["image"].kind == "image"
    writer = TFRecordWriter(tmp_path, "out", src.fields)
    writer.add(src.parse(0, path.read_bytes()))
    writer.close()
    written = Example.FromString((tmp_path / "out.tfrecord").read_bytes()[12:-4])   # the one record's data
    assert written.features.feature["image/format"].bytes_list.value == [b"webp"]


def test_webdataset_writer_names_members_by_image_type(tmp_path):
    fields = {"image": Field("image"), "label": Field("int")}
    writer = WebDatasetWriter(tmp_path, "s", fields)
    for k, fmt in enumerate(("WEBP", "PNG", "JPEG")):
        writer.add(Record(encoded(fmt), k))
    writer.close()
    with tarfile.open(tmp_path / "s.tar") as tar:
        assert [m.name for m in tar.getmembers() if not m.name.endswith(".cls")] == \
            ["000000000.webp", "000000001.png", "000000002.jpg"]
    src = WebDatasetSource(tmp_path / "s.tar")
    assert [image_type(record.image) for _, record in iter_records(src)] == ["webp", "png", "jpeg"]


# -- shard paths -------------------------------------------------------------------------------------
def write_tfrecords(directory, stems):
    for stem in stems:
        writer = TFRecordWriter(directory, stem, {"image": Field("image"), "label": Field("int")})
        writer.add(Record(encoded("PNG"), 1))
        writer.close()


def test_readers_and_tools_find_the_same_shards(tmp_path):
    write_tfrecords(tmp_path, ["b", "a"])
    (tmp_path / ".hidden.tfrecord").write_bytes(b"")
    (tmp_path / "notes.txt").write_bytes(b"")
    rec = RecordIOWriter(tmp_path, "r", RecordIOSource.fields)
    rec.add(Record(encoded("PNG"), 0, {"label_values": np.zeros(1, np.float32), "id": 0}))
    rec.close()
    (tmp_path / "._r.rec").write_bytes(b"AppleDouble junk")   # hidden files are never shards
    want = [str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")]
    assert TFRecordSource(tmp_path).shards == want
    assert shardfiles.shard_files(str(tmp_path), "tfrecord") == [("tfrecord", p) for p in want]
    assert shardfiles.shard_files(str(tmp_path / "*.tfrecord")) == [("tfrecord", p) for p in want]
    assert RecordIOSource(tmp_path).shards == [str(tmp_path / "r.rec")]
    assert shardfiles.shard_files(str(tmp_path), "recordio") == [("recordio", str(tmp_path / "r.rec"))]
    with pytest.raises(SourceError, match="no tar shard files in directory"):
        shardfiles.shard_files(str(tmp_path), "wds")
    with pytest.raises(SourceError, match="no tar shard files match"):
        WebDatasetSource(str(tmp_path / "*.tar"))
    with pytest.raises(FileNotFoundError, match="tar shard file .* does not exist"):
        WebDatasetSource([tmp_path / "missing.tar"])


def test_gzipped_by_magic_not_name(tmp_path):
    write_tfrecords(tmp_path, ["plain"])
    data = (tmp_path / "plain.tfrecord").read_bytes()
    (tmp_path / "named.gz").write_bytes(data)
    (tmp_path / "zipped.tfrecord").write_bytes(gzip.compress(data))
    assert not gzipped(str(tmp_path / "plain.tfrecord")) and not gzipped(str(tmp_path / "named.gz"))
    assert gzipped(str(tmp_path / "zipped.tfrecord"))
    src = TFRecordSource(tmp_path / "zipped.tfrecord")
    assert src.streamed
    check_format(src)


# -- atomic writes -----------------------------------------------------------------------------------
def test_atomic_write_replaces_on_success_and_keeps_the_old_file_on_failure(tmp_path):
    path = tmp_path / "f.json"
    with atomic_write(path) as f:
        f.write("one")
    assert path.read_text() == "one"

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with atomic_write(path, "wb") as f:
            f.write(b"half")
            raise Boom
    assert path.read_text() == "one" and os.listdir(tmp_path) == ["f.json"]


def test_parse_dtype_turns_every_refusal_into_a_value_error():
    from ingest.formats.base import parse_dtype
    assert parse_dtype("<f4") == np.float32 and parse_dtype("uint8") == np.uint8
    for text in ("02", "x", "(", "i4,("):   # "02": numpy's literal parser raised SyntaxError (found by fuzzing)
        with pytest.raises(ValueError, match="not a dtype"):
            parse_dtype(text)
