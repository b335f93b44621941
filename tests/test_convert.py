"""The converter: every writable format round-trips a generated image folder; output is byte-identical
whatever ran it and after a resume; sharding, re-encoding, the failure budget and the manifest."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import jpeg_bytes, make_image_folder

from ingest.errors import ConfigError, FailureBudgetExceeded
from ingest.formats import FileTree, iter_records, open_source, writer_class
from ingest.decode.cpu import CpuDecoder
from ingest.tools import convert as convert_mod
from ingest.tools import jobs as jobs_mod
from ingest.tools import manifest
from ingest.tools.convert import convert, parse_bytes, plan_shards

CLASSES = {"cat": 7, "dog": 5, "emu": 9}


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def writable(fmt: str) -> None:
    try:
        writer_class(fmt)
    except ImportError as err:   # a format module not there yet, or its optional dependency missing
        pytest.skip(f"{fmt} writer not importable: {err}")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "train", CLASSES)


def read_back(path: Path) -> list[tuple[int, bytes | np.ndarray]]:
    source = open_source(str(path))
    return [(r.label, r.image) for _, r in iter_records(source)]


@pytest.mark.parametrize("fmt", ["filetree", "tfrecord", "recordio", "wds", "lmdb"])
def test_round_trip_keeps_labels_and_bytes(folder, tmp_path, fmt):
    writable(fmt)
    out = tmp_path / fmt
    summary = convert(str(folder), str(out), to=fmt, shard_size=8, progress=False)
    source = FileTree(folder)
    expected = [(r.label, bytes(r.image)) for _, r in iter_records(source)]
    got = [(label, bytes(image)) for label, image in read_back(out)]
    assert got == expected
    assert summary.samples == len(expected) and summary.failures == []
    data = json.loads((out / "manifest.json").read_text())
    assert data["format"] == fmt and data["count"] == len(expected) and data["classes"] == ["cat", "dog", "emu"]
    assert data["fields"] == {"image": {"kind": "image"}, "label": {"kind": "int"}}
    ranges = [(s["start"], s["stop"]) for s in data["shards"]]
    assert ranges[0][0] == 0 and ranges[-1][1] == len(expected)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    if fmt != "lmdb":   # LMDB is one database whatever the shard size
        assert len(ranges) == 3
    for shard in data["shards"]:
        assert manifest.check_shard(str(out), shard) == []
    assert not (out / convert_mod.TMP_DIR).exists() and not (out / manifest.PARTIAL).exists()


def test_raw_output_holds_resized_pixels(folder, tmp_path):
    writable("raw")
    out = tmp_path / "raw"
    convert(str(folder), str(out), to="raw", raw_size=(24, 20), shard_size=10, progress=False)
    source = FileTree(folder)
    got = read_back(out)
    assert len(got) == len(source)
    decoder = CpuDecoder(threads=1)
    for (label, pixels), (_, record) in zip(got, iter_records(source)):
        assert label == record.label and pixels.shape == (24, 20, 3) and pixels.dtype == np.uint8
        reference = convert_mod.Transform(raw_size=(24, 20)).apply(record, "x", decoder).image
        np.testing.assert_array_equal(pixels, reference)
    # the pixels are the image resized, not something else of the right shape
    first = decoder.decode(bytes(next(iter_records(source))[1].image), "first").astype(np.float32)
    assert abs(float(got[0][1].mean()) - float(first.mean())) < 3


def test_workers_give_the_same_bytes(folder, tmp_path):
    writable("tfrecord")
    convert(str(folder), str(tmp_path / "one"), to="tfrecord", shard_size=4, progress=False)
    convert(str(folder), str(tmp_path / "two"), to="tfrecord", shard_size=4, workers=2, progress=False)
    one, two = tree_bytes(tmp_path / "one"), tree_bytes(tmp_path / "two")
    assert one == two and len(one) == 2 * 6 + 1   # 6 shards of .tfrecord + .idx, and the manifest


class Crash(Exception):
    pass


def crash_after(monkeypatch, k: int) -> None:
    """Make the (inline) converter die when it starts its shard number ``k``."""
    real, calls = jobs_mod.write_shard, []

    def write_shard(*args):
        calls.append(args)
        if len(calls) > k:
            raise Crash("killed")
        return real(*args)

    monkeypatch.setattr(jobs_mod, "write_shard", write_shard)


@pytest.mark.parametrize("fmt", ["tfrecord", "filetree"])
def test_resume_after_a_crash_is_byte_identical(folder, tmp_path, monkeypatch, fmt):
    writable(fmt)
    convert(str(folder), str(tmp_path / "whole"), to=fmt, shard_size=4, progress=False)
    out = tmp_path / "resumed"
    with monkeypatch.context() as m:
        crash_after(m, 3)
        with pytest.raises(Crash):
            convert(str(folder), str(out), to=fmt, shard_size=4, progress=False)
    partial, final = manifest.load(str(out))
    assert not final and [s["stem"] for s in partial["shards"]] == [f"shard-0000{k}-of-00006" for k in range(3)]
    assert not (out / "manifest.json").exists()
    with open(out / manifest.PARTIAL, "a") as f:   # a commit line cut short by the kill is ignored
        f.write('{"stem": "shard-00003-of-00006", "sta')
    with pytest.raises(ConfigError, match="--resume"):
        convert(str(folder), str(out), to=fmt, shard_size=4, progress=False)
    summary = convert(str(folder), str(out), to=fmt, shard_size=4, resume=True, progress=False)
    assert summary.resumed == 3 and summary.written == len(FileTree(folder)) - 12
    assert tree_bytes(out) == tree_bytes(tmp_path / "whole")


def test_resume_redoes_a_damaged_shard_and_refuses_other_options(folder, tmp_path):
    writable("tfrecord")
    out = tmp_path / "out"
    convert(str(folder), str(out), to="tfrecord", shard_size=8, progress=False)
    whole = tree_bytes(out)
    victim = out / "shard-00001-of-00003.tfrecord"
    data = bytearray(victim.read_bytes())
    data[40] ^= 0xFF
    victim.write_bytes(bytes(data))
    summary = convert(str(folder), str(out), to="tfrecord", shard_size=8, resume=True, progress=False)
    assert summary.resumed == 2 and summary.written == 8
    assert tree_bytes(out) == whole
    with pytest.raises(ConfigError, match="options"):
        convert(str(folder), str(out), to="tfrecord", shard_size=5, resume=True, progress=False)


def test_shards_by_bytes(folder, tmp_path):
    writable("tfrecord")
    sizes = [os.path.getsize(FileTree(folder).name(i)) for i in range(len(FileTree(folder)))]
    target = 3 * max(sizes)
    convert(str(folder), str(tmp_path / "out"), to="tfrecord", shard_bytes=target, progress=False)
    shards = json.loads((tmp_path / "out" / "manifest.json").read_text())["shards"]
    for s in shards:
        assert sum(sizes[s["start"]:s["stop"]]) <= target
    for a, b in zip(shards, shards[1:]):   # greedy: the next sample would not have fitted
        assert sum(sizes[a["start"]:a["stop"] + 1]) > target


def test_plan_shards():
    assert plan_shards(5, shard_size=2) == [(0, 2), (2, 4), (4, 5)]
    assert plan_shards(0, shard_size=2) == []
    sizes = np.array([5, 5, 20, 1, 1, 1])
    assert plan_shards(6, shard_bytes=10, sizes=sizes) == [(0, 2), (2, 3), (3, 6)]   # oversized: alone
    assert parse_bytes("256MB") == 256 * 10**6 and parse_bytes("1GiB") == 2**30 and parse_bytes("500k") == 500_000
    with pytest.raises(ConfigError, match="size"):
        parse_bytes("lots")


def test_max_side_and_quality(folder, tmp_path):
    writable("filetree")
    out = tmp_path / "small"
    convert(str(folder), str(out), to="filetree", max_side=60, shard_size=100, progress=False)
    decoder = CpuDecoder(threads=1)
    source = FileTree(folder)
    for (_, before), (label, after) in zip(iter_records(source), iter_records(open_source(str(out)))):
        h, w = decoder.probe(bytes(before.image), "in")
        if max(h, w) <= 60:
            assert bytes(after.image) == bytes(before.image)   # small enough: untouched
        else:
            h2, w2 = decoder.probe(bytes(after.image), "out")
            assert max(h2, w2) == 60 and abs(h2 / w2 - h / w) < 0.05
    out = tmp_path / "q"
    convert(str(folder), str(out), to="filetree", quality=20, shard_size=100, progress=False)
    assert sum(len(r.image) for _, r in iter_records(open_source(str(out)))) < \
        sum(len(r.image) for _, r in iter_records(source))


def corrupt_folder(root: Path) -> Path:
    make_image_folder(root, {"a": 3, "b": 3})
    (root / "b" / "0001.jpg").write_bytes(jpeg_bytes(40, 40)[:300])   # truncated JPEG
    return root


def test_bad_samples_fail_by_default_and_are_skipped_under_the_budget(tmp_path):
    writable("tfrecord")
    src = corrupt_folder(tmp_path / "src")
    with pytest.raises(FailureBudgetExceeded, match="0001.jpg"):
        convert(str(src), str(tmp_path / "strict"), to="tfrecord", max_side=30, progress=False)
    summary = convert(str(src), str(tmp_path / "lenient"), to="tfrecord", max_side=30, max_failures=1,
                      progress=False)
    assert summary.samples == 5 and len(summary.failures) == 1
    name, stage, reason = summary.failures[0]
    assert name.endswith("b/0001.jpg") and stage == "transform" and "DecodeError" in reason
    data = json.loads((tmp_path / "lenient" / "manifest.json").read_text())
    assert data["count"] == 5 and data["shards"][0]["failures"][0][0] == name
    assert [r.label for _, r in iter_records(open_source(str(tmp_path / "lenient")))] == [0, 0, 0, 1, 1]


def test_a_corrupt_source_record_is_named(tmp_path, folder):
    writable("tfrecord")
    convert(str(folder), str(tmp_path / "tf"), to="tfrecord", shard_size=100, progress=False)
    shard = tmp_path / "tf" / "shard-00000-of-00001.tfrecord"
    data = bytearray(shard.read_bytes())
    data[-30] ^= 0xFF   # inside the last record: its data CRC no longer matches
    shard.write_bytes(bytes(data))
    with pytest.raises(FailureBudgetExceeded, match=r"shard-00000-of-00001.tfrecord"):
        convert(str(tmp_path / "tf"), str(tmp_path / "back"), to="filetree", progress=False)
    summary = convert(str(tmp_path / "tf"), str(tmp_path / "back2"), to="filetree", max_failures=0.1,
                      progress=False)
    assert summary.samples == len(FileTree(folder)) - 1 and summary.failures[0][1] == "read"


def test_bad_options_and_paths(folder, tmp_path):
    with pytest.raises(ConfigError, match="Unknown format"):
        convert(str(folder), str(tmp_path / "x"), to="tfrec")
    with pytest.raises(FileNotFoundError):
        convert(str(tmp_path / "missing"), str(tmp_path / "x"), to="filetree")
    with pytest.raises(ConfigError, match="not both"):
        convert(str(folder), str(tmp_path / "x"), to="filetree", shard_size=2, shard_bytes="1MB")
    with pytest.raises(ConfigError, match="raw_size"):
        convert(str(folder), str(tmp_path / "x"), to="raw", raw_size=(8, 8), quality=50)
    with pytest.raises(ConfigError, match="workers"):
        convert(str(folder), str(tmp_path / "x"), to="filetree", workers=0)


def test_resume_after_a_real_kill(tmp_path):
    """SIGKILL a converting process part way, resume, and compare every byte with an uninterrupted run."""
    writable("tfrecord")
    src = make_image_folder(tmp_path / "src", {"a": 30, "b": 30})
    args = dict(to="tfrecord", shard_size=1, quality=60, progress=False)
    convert(str(src), str(tmp_path / "whole"), **args)
    out = tmp_path / "killed"
    code = ("import sys; from ingest.tools.convert import convert; "
            f"convert(sys.argv[1], sys.argv[2], **{args!r})")
    proc = subprocess.Popen([sys.executable, "-c", code, str(src), str(out)])
    partial = out / manifest.PARTIAL
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if partial.exists() and len(partial.read_text().splitlines()) > 5:   # header + 5 shards
                break
            time.sleep(0.01)
        proc.kill()
    finally:
        proc.wait()
    if (out / "manifest.json").exists():
        pytest.skip("the conversion finished before it could be killed")
    kept = len(manifest.load(str(out))[0]["shards"])
    summary = convert(str(src), str(out), resume=True, **args)
    assert summary.resumed == kept and summary.samples == 60
    assert tree_bytes(out) == tree_bytes(tmp_path / "whole")


def test_streamed_source_read_in_ranges(folder, tmp_path):
    """GZIP TFRecords can only be streamed: output shards that start inside a source shard skip into it."""
    writable("tfrecord")
    gz = tmp_path / "gz"
    convert(str(folder), str(gz), to="tfrecord", shard_size=5, writer_options={"compression": "gzip"},
            progress=False)
    assert len(list(gz.glob("*.tfrecord.gz"))) == 5 and not list(gz.glob("*.idx"))
    out = tmp_path / "back"
    summary = convert(str(gz), str(out), to="filetree", shard_size=4, progress=False)
    assert summary.shards == 6
    expected = [(r.label, bytes(r.image)) for _, r in iter_records(FileTree(folder))]
    assert [(r.label, bytes(r.image)) for _, r in iter_records(open_source(str(out)))] == expected


@pytest.mark.realworld
@pytest.mark.parametrize("sub", ["tfrecord/test.record", "mxnet_recordio/adaface_train/train.rec",
                                 "lmdb/mmocr_rec_toy/imgs.lmdb", "lmdb/caffe_verifycode/test_lmdb",
                                 "webdataset/sample.tgz", "coco/tiny_coco_train2017"])
def test_files_written_by_other_tools_convert(sub, tmp_path):
    """Files TensorFlow, im2rec, mmocr, Caffe, webdataset and COCO wrote convert with every sample and label."""
    from conftest import realworld
    writable("tfrecord")
    src = str(realworld(sub))
    source = open_source(src)
    expected = [(r.label, r.image) for _, r in iter_records(source)]
    unread = sorted(getattr(source, "unread", None) or ())   # what its reader cannot carry, dropped on purpose
    summary = convert(src, str(tmp_path / "out"), to="tfrecord", shard_size=16, progress=False, drop_fields=unread)
    assert summary.samples == len(expected) > 0 and not summary.failures
    got = [(r.label, r.image) for _, r in iter_records(open_source(str(tmp_path / "out")))]
    assert [label for label, _ in got] == [label for label, _ in expected]
    for (_, a), (_, b) in zip(got, expected):
        if isinstance(b, np.ndarray) and b.ndim == 3:   # decoded pixels (encoded bytes may be uint8 views)
            np.testing.assert_array_equal(a, b)
        else:
            assert bytes(a) == bytes(b)


def test_dropped_fields_and_a_writer_that_refuses_the_fields(folder, tmp_path):
    writable("tfrecord")
    out = tmp_path / "nolabel"
    convert(str(folder), str(out), to="tfrecord", drop_fields=["label"], progress=False)
    source = open_source(str(out))
    assert set(source.fields) == {"image"} and set(source.labels()) == {-1}
    assert json.loads((out / "manifest.json").read_text())["fields"] == {"image": {"kind": "image"}}
    with pytest.raises(ConfigError, match="needs a 'label' field"):
        convert(str(out), str(tmp_path / "tree"), to="filetree", progress=False)
    assert not (tmp_path / "tree").exists()   # refused before anything was written
    with pytest.raises(ConfigError, match="cannot be dropped"):
        convert(str(folder), str(tmp_path / "x"), to="tfrecord", drop_fields=["image"], progress=False)


def test_a_second_conversion_into_the_same_directory_is_refused(folder, tmp_path):
    writable("tfrecord")
    out = tmp_path / "out"
    out.mkdir()
    with open(out / convert_mod.LOCK, "w") as held:   # as a running conversion holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ConfigError, match="another conversion"):
            convert(str(folder), str(out), to="tfrecord", progress=False)
    (out / convert_mod.LOCK).unlink()
    convert(str(folder), str(out), to="tfrecord", progress=False)
    assert not (out / convert_mod.LOCK).exists()
