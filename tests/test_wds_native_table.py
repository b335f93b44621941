"""WebDataset `native_table` (one batch of reads per shard, headers and labels checked with numpy) against the
per-sample checks it replaces, on written shards and on damaged ones."""
from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile

import numpy as np
import pytest

from ingest.errors import CorruptRecordError
from ingest.formats import checks, tarindex, webdataset
from ingest.formats.base import Field, Record
from ingest.formats.webdataset import WebDatasetSource, WebDatasetWriter, decode_member
from conftest import jpeg_bytes

FIELDS = {"image": "jpg", "label": ["cls", "cls.gz"]}


def per_sample(src: WebDatasetSource) -> tuple[list[int], list[int]]:
    """(python flags, labels) by reading and checking each sample's members one by one (the reference)."""
    mem = src._members
    image = mem.columns["image"]
    label = mem.columns["label"] if "label" in src._exts else None
    flags, labels = [], []
    for i in range(len(src)):
        path, key = src._key(i)
        with open(path, "rb") as f:
            value = one(src, f.fileno(), key, image[i], None if label is None else label[i], mem.label_ints[i])
        flags.append(int(value is None))
        labels.append(-1 if value is None else value)
    return flags, labels


def one(src, fd, key, image, label, known):
    mem = src._members
    if image < 0 or tarindex.header_problem(os.pread(fd, 512, mem.offsets[image] - 512), key, mem.exts[image],
                                            mem.sizes[image]) is not None:
        return None
    if label is None:
        return -1
    if label < 0:
        return None
    part = os.pread(fd, 512 + mem.sizes[label], mem.offsets[label] - 512)
    data = part[512:]
    if len(data) != mem.sizes[label] or tarindex.header_problem(part, key, mem.exts[label],
                                                                mem.sizes[label]) is not None or \
            (src._crcs is not None and checks.crc(data) != src._crcs[label]):
        return None
    try:
        value = decode_member(mem.exts[label], data, path="x", where="label")
    except CorruptRecordError:
        return None
    return None if known != tarindex.NO_INT and value != known else value


def same_as_per_sample(src: WebDatasetSource) -> np.ndarray:
    flags, labels = per_sample(src)
    t = src.native_table()
    python = np.zeros(len(src), np.uint8) if t.python is None else t.python
    assert python.tolist() == flags and t.labels.tolist() == labels
    image = np.frombuffer(src._members.columns["image"], np.int64)
    want = np.where(np.array(flags) == 1, 0, np.frombuffer(src._members.sizes, np.int64)[np.maximum(image, 0)])
    assert t.sizes.tolist() == want.tolist()
    assert t.offsets.tolist() == np.frombuffer(src._members.offsets, np.int64)[np.maximum(image, 0)].tolist()
    return python


def hand_tar(path, members):
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def flip(path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x20]))


@pytest.mark.parametrize("chunk", [8192, 7])
def test_written_shards_give_the_per_sample_table(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(webdataset, "_TABLE_CHUNK", chunk)   # (7: a shard read in several batches)
    image = jpeg_bytes(8, 8, seed=1)
    for stem, n in (("a", 40), ("b", 3)):
        writer = WebDatasetWriter(tmp_path, stem, {"image": Field("image"), "label": Field("int")})
        for i in range(n):
            writer.add(Record(image, (i * 7919) % 100003 + (10 ** 17 if i == 5 else 0)))
        writer.close()
    src = WebDatasetSource(str(tmp_path))
    assert src._crcs is not None and not same_as_per_sample(src).any()
    assert src.native_table().labels[5] == 10 ** 17 + 5 * 7919


@pytest.mark.parametrize("native", [True, False], ids=["readv", "python-reads"])
def test_damaged_and_unusual_members_give_the_per_sample_table(tmp_path, monkeypatch, native):
    if not native:
        monkeypatch.setattr(webdataset, "NATIVE", None)   # (where ingest._readv was not built)
    monkeypatch.setattr(webdataset, "_TABLE_CHUNK", 5)
    image = jpeg_bytes(8, 8, seed=2)
    labels = {0: b"3", 1: b" 12\n", 2: b"+4", 3: b"abc", 4: b"", 5: None, 6: b"7", 7: b"8", 8: b"9", 9: b"10",
              10: b"1" * 19, 11: b"-2", 12: b"11", 13: b"5"}
    members = []
    for k, value in labels.items():
        key = "k" * 120 + str(k) if k == 9 else f"s{k:02d}"
        members.append((f"{key}.jpg", image))
        if value is not None:
            members.append((f"{key}.cls.gz", gzip.compress(value)) if k == 12 else (f"{key}.cls", value))
    path = hand_tar(tmp_path / "odd.tar", members)
    src = WebDatasetSource(path, fields=FIELDS, write_index=True)
    assert same_as_per_sample(src)[[0, 1, 2, 6, 9, 11, 12]].tolist() == [0] * 7
    mem = src._members
    label, image_col = mem.columns["label"], mem.columns["image"]
    flip(path, mem.offsets[image_col[6]] - 512 + 3)     # an image header's name: its checksum fails
    flip(path, mem.offsets[label[7]] - 512 + 2)         # a label header's name
    flip(path, mem.offsets[label[8]])                   # "9" -> "\x19": the index still says 9
    # (a header whose size field differs, but whose checksum is right: the full check names the size)
    with open(path, "r+b") as f:
        at = mem.offsets[label[13]] - 512
        f.seek(at)
        head = bytearray(f.read(512))
        head[124:136] = b"00000000002\0"
        head[148:156] = b"%06o\0 " % (sum(head[:148]) + 8 * 32 + sum(head[156:]))
        f.seek(at)
        f.write(head)
    src = WebDatasetSource(path, fields=FIELDS)
    assert same_as_per_sample(src)[[6, 7, 8, 13]].tolist() == [1] * 4
    src = WebDatasetSource(path, fields={"image": "jpg"})
    assert same_as_per_sample(src)[[0, 5, 6, 7]].tolist() == [0, 0, 1, 0]


def test_a_bad_crc_and_a_cut_member_give_the_per_sample_table(tmp_path):
    image = jpeg_bytes(8, 8, seed=3)
    writer = WebDatasetWriter(tmp_path, "c", {"image": Field("image"), "label": Field("int")})
    for i in range(6):
        writer.add(Record(image, 20 + i))
    writer.close()
    path = str(tmp_path / "c.tar")
    src = WebDatasetSource(path)
    label = src._members.columns["label"]
    flip(path, src._members.offsets[label[2]])          # "22" -> "\x122": its CRC32C fails
    assert same_as_per_sample(WebDatasetSource(path))[2] == 1
    shutil.copy(path, tmp_path / "cut.tar")
    src = WebDatasetSource(str(tmp_path / "cut.tar"))   # (its index is made before the cut)
    last = max(label[5], src._members.columns["image"][5])
    os.truncate(tmp_path / "cut.tar", src._members.offsets[last] + 1)
    assert same_as_per_sample(src)[[2, 5]].tolist() == [1, 1]
