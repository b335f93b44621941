"""`ingest convert / index / verify / inspect` through the command line: exit codes, one-line errors, what
verify finds in damaged datasets, what index writes."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import jpeg_bytes, make_image_folder

from ingest.formats import tfrecord
from ingest.tools.cli import main

CLASSES = {"cat": 4, "dog": 3, "emu": 5}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "train", CLASSES)


@pytest.fixture
def tf_dir(folder, tmp_path) -> Path:
    out = tmp_path / "tf"
    assert main(["convert", str(folder), str(out), "--to", "tfrecord", "--shard-size", "5", "-q"]) == 0
    return out


def test_convert_prints_a_summary(folder, tmp_path, capsys):
    assert main(["convert", str(folder), str(tmp_path / "out"), "--to", "wds", "--shard-size", "5", "-q"]) == 0
    out = capsys.readouterr().out
    assert "12 samples in 3 shards" in out and "img/s" in out and "no failures" in out


def test_inspect(tf_dir, capsys):
    assert main(["inspect", str(tf_dir)]) == 0
    out = capsys.readouterr().out
    assert "tfrecord, 12 records, 3 shards" in out
    assert "image (image), label (int)" in out
    assert "      2 emu: 5" in out and "      0 cat: 4" in out and "      1 dog: 3" in out   # largest first, named
    assert "height 48..6" in out and "jpg 12" in out
    assert main(["inspect", str(tf_dir), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["records"] == 12 and info["labels"]["top"][0] == {"label": 2, "count": 5, "class": "emu"}
    assert info["images"]["sampled"] == 12 and info["shards"]["from"] == "manifest"


def test_inspect_reads_a_streamed_dataset_once_and_describes_it_as_the_seekable_one(tf_dir, tmp_path, monkeypatch):
    from ingest.tools.dataset_info import inspect_dataset
    gz = tmp_path / "gz"
    gz.mkdir()
    for shard in sorted(tf_dir.glob("*.tfrecord")):
        (gz / (shard.name + ".gz")).write_bytes(gzip.compress(shard.read_bytes()))
    classes = json.loads((tf_dir / "manifest.json").read_text())["classes"]
    (gz / "manifest.json").write_text(json.dumps({"format": "tfrecord", "classes": classes}))   # the class names
    passes = []
    iter_shard = tfrecord.TFRecordSource.iter_shard
    monkeypatch.setattr(tfrecord.TFRecordSource, "iter_shard", lambda self, k, skip=0: passes.append(k) or
                        iter_shard(self, k, skip))
    for sample in (500, 5):
        passes.clear()
        streamed = inspect_dataset(str(gz), sample=sample)
        assert sorted(passes) == [0, 1, 2]   # each shard decompressed once
        seekable = inspect_dataset(str(tf_dir), sample=sample)
        for key in ("records", "fields", "labels", "images"):
            assert streamed[key] == seekable[key], key
    assert streamed["images"]["sampled"] == 5 and streamed["labels"]["distinct"] == 3


def test_verify_clean_then_damaged(tf_dir, capsys):
    assert main(["verify", str(tf_dir), "--decode"]) == 0
    assert "12 records read, 12 images decoded, 0 problems" in capsys.readouterr().out
    shard = tf_dir / "shard-00001-of-00003.tfrecord"
    offsets = [int(line.split()[0]) for line in (tf_dir / (shard.name + ".idx")).read_text().splitlines()]
    data = bytearray(shard.read_bytes())
    data[offsets[2] + 40] ^= 0xFF   # inside record 2's data
    shard.write_bytes(bytes(data))
    assert main(["verify", str(tf_dir)]) == 1
    out = capsys.readouterr().out
    bad = [line for line in out.splitlines() if line.startswith("BAD")]
    assert any(f"{shard}:{offsets[2]}" in line and "CRC" in line for line in bad), out   # the record, by offset
    assert any(str(shard) in line and "sha256" in line for line in bad), out              # the manifest checksum
    assert "11 records read" in out


def test_verify_reports_a_stale_index_and_a_truncated_shard(tf_dir, capsys):
    idx = tf_dir / "shard-00000-of-00003.tfrecord.idx"
    lines = idx.read_text().splitlines()
    idx.write_text("\n".join(lines[:-1]) + "\n")   # one record missing from the index
    shard = tf_dir / "shard-00002-of-00003.tfrecord"
    shard.write_bytes(shard.read_bytes()[:-7])
    assert main(["verify", str(tf_dir)]) == 1
    out = capsys.readouterr().out
    assert f"BAD {idx}: CorruptRecordError: index entries end at byte" in out and f"{idx}: {idx}" not in out
    assert f"BAD {shard}" in out


def test_verify_decode_names_an_undecodable_image(tmp_path, capsys):
    root = make_image_folder(tmp_path / "src", {"a": 2})
    bad = root / "a" / "0001.jpg"
    bad.write_bytes(jpeg_bytes(40, 40)[:250])
    assert main(["verify", str(root)]) == 0          # bytes are read fine
    capsys.readouterr()
    assert main(["verify", str(root), "--decode"]) == 1
    out = capsys.readouterr().out
    assert f"BAD {bad} [image]: DecodeError" in out and "1 images decoded, 1 problems" in out


def test_index_writes_what_the_writers_write(tmp_path, folder, capsys):
    for fmt in ("tfrecord", "recordio", "wds"):
        out = tmp_path / fmt
        assert main(["convert", str(folder), str(out), "--to", fmt, "--shard-size", "5", "-q"]) == 0
        written = {p.name: p.read_bytes() for p in out.glob("*.idx")}
        for p in out.glob("*.idx"):
            p.unlink()
        capsys.readouterr()
        assert main(["index", str(out)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 3 and all(line.endswith(("5 records", "2 records", "5 samples", "2 samples"))
                                       for line in lines)
        again = {p.name: p.read_bytes() for p in out.glob("*.idx")}
        if fmt == "wds":   # the tar writer writes no index; what `index` wrote must match a fresh scan
            assert len(again) == 3 and main(["verify", str(out)]) == 0
        else:
            assert again == written
    shard = tmp_path / "tfrecord" / "shard-00000-of-00003.tfrecord"
    entries = tfrecord.read_index(str(shard) + ".idx", str(shard))   # DALI format: offset size
    assert entries[0, 0] == 0 and entries[1, 0] == entries[0, 1]


@pytest.mark.parametrize("argv", [
    ["convert", "{missing}", "{tmp}/o", "--to", "tfrecord"],
    ["convert", "{src}", "{tmp}/o", "--to", "tfrec"],
    ["convert", "{src}", "{tmp}/o", "--to", "raw", "--raw-size", "3"],
    ["convert", "{src}", "{tmp}/o", "--to", "tfrecord", "--shard-size", "1", "--shard-bytes", "1MB"],
    ["convert", "{src}", "{tmp}/o", "--to", "wds", "-o", "compression=gzip"],
    ["convert", "{src}", "{tmp}/o", "--to", "tfrecord", "-s", "nope=1"],
    ["convert", "{src}", "{tmp}/o", "--to", "tfrecord", "--drop", "boxes"],
    ["inspect", "{missing}"],
    ["verify", "{missing}"],
    ["index", "{missing}"],
    ["index", "{src}"],
])
def test_bad_arguments_exit_2_with_one_line(argv, folder, tmp_path, capsys):
    args = [a.format(missing=tmp_path / "nope", tmp=tmp_path, src=folder) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("ingest ")


def test_non_empty_output_needs_resume(folder, tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "x").write_text("x")
    assert main(["convert", str(folder), str(out), "--to", "tfrecord"]) == 2
    assert "--resume" in capsys.readouterr().err


def test_ray_not_installed_is_one_line(folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)   # import ray -> ImportError
    assert main(["convert", str(folder), str(tmp_path / "o"), "--to", "tfrecord", "--ray", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'ingest[ray]'" in err[0]
    assert not (tmp_path / "o").exists()


def test_help_texts(capsys):
    for tool, words in (("convert", "--shard-bytes"), ("index", "tfrecord2idx"), ("verify", "--decode"),
                        ("inspect", "histogram")):
        assert main([tool, "--help"]) == 0
        assert words in capsys.readouterr().out


def test_installed_entry_point(folder, tmp_path):
    exe = shutil.which("ingest", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("the ingest entry point is not installed in this environment")
    out = tmp_path / "o"
    run = subprocess.run([exe, "convert", str(folder), str(out), "--to", "recordio", "-q"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "12 samples in 1 shards" in run.stdout
    assert json.loads((out / "manifest.json").read_text())["count"] == 12


def test_inspect_an_annotation_file(capsys, tmp_path, monkeypatch):
    from conftest import realworld
    root = realworld("coco/tiny_coco_train2017")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["inspect", str(root / "instances_train2017_small.json"),
                 "-s", f"images={root / 'train_2017_small'}"]) == 0
    out = capsys.readouterr().out
    assert "annotations: 16 images, 197 annotations, 80 categories, 1 crowd" in out
    assert "objects per category: person 33" in out and "jpg 16" in out


def test_an_unknown_reader_option_is_one_line(tf_dir, capsys):
    assert main(["inspect", str(tf_dir), "-s", "bogus=1"]) == 2
    err = capsys.readouterr().err
    assert "has no option 'bogus'" in err and "Traceback" not in err
