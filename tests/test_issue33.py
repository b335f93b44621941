"""Regression tests of issue 33's defects 4-10: a sample's fields, shard discovery, closing LMDBs, the failure
report, batch types and the command line."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


# -- 7: one skipped record is reported once --------------------------------------------------------------

SKIP_SCRIPT = """
import sys
from pathlib import Path
from conftest import make_image_folder
import ingest.torch as it

def main():
    root = make_image_folder(Path(sys.argv[1]), {"a": 5, "b": 5})
    (root / "a" / "0002.jpg").write_bytes(b"\\xff\\xd8garbage" * 10)
    loader = it.Loader(str(root), batch_size=4, max_failures=3, device="cpu", num_workers=int(sys.argv[2]),
                       ragged=True)
    n = sum(len(images) for images, _ in loader)
    print("FAILURES", len(loader.stats()["failures"]), "SAMPLES", n, flush=True)
    loader.close()

if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("workers", [0, 1])
def test_one_bad_record_is_reported_once(tmp_path, workers):
    # Worker processes logged what they sent on, and the epoch read ahead logged the record again.
    out = run_python(SKIP_SCRIPT, str(tmp_path / "t"), str(workers))
    assert out.returncode == 0, out.stderr
    assert "FAILURES 1 SAMPLES 9" in out.stdout
    assert out.stderr.count("skipping") == 1, out.stderr


# -- 6: an LMDB is closed when its last user closes --------------------------------------------------------

def _write_lmdb(directory: Path) -> str:
    from conftest import jpeg_bytes
    from ingest.formats.base import Field, Record
    from ingest.formats.lmdb import LMDBWriter
    writer = LMDBWriter(directory, "db", {"image": Field("image"), "label": Field("int")})
    for i in range(6):
        writer.add(Record(jpeg_bytes(20, 24, seed=i), i % 2))
    writer.close()
    return str(directory / "db.lmdb")


def _reopen(path: str) -> None:
    import lmdb
    lmdb.open(path, readonly=True, lock=False).close()   # "already open in this process" while one is open


def test_lmdb_is_closed_by_loader_close_and_by_collection(tmp_path):
    import gc
    import ingest.torch as it
    path = _write_lmdb(tmp_path)
    loader = it.Loader(path, batch_size=4, device="cpu")
    assert sum(len(images) for images, _ in loader) == 6
    loader.close()
    _reopen(path)
    for workers in (0, 1):
        loader = it.Loader(path, batch_size=4, device="cpu", num_workers=workers)
        assert sum(len(images) for images, _ in loader) == 6
        del loader
        gc.collect()
        _reopen(path)


def test_lmdb_stays_open_while_another_source_holds_it(tmp_path):
    import lmdb
    from ingest.formats.base import read_location
    from ingest.formats.lmdb import LMDBSource
    path = _write_lmdb(tmp_path)
    a, b = LMDBSource(path), LMDBSource(path)
    a._dbs[0].ranges = b._dbs[0].ranges = None   # looked up through liblmdb per read: each holds the environment
    a.parse(0, read_location(a.locate(0)))
    b.parse(1, read_location(b.locate(1)))
    a.close()
    with pytest.raises(lmdb.Error, match="already open"):
        _reopen(path)
    assert b.parse(2, read_location(b.locate(2))).label == 0
    b.close()
    _reopen(path)


# -- 4: a feature spec's (key, kind) pair may be a list, as JSON gives it -----------------------------------

def _write_tfrecord(directory: Path, stem: str = "s", n: int = 3) -> Path:
    from conftest import jpeg_bytes
    from ingest.formats.base import Field, Record
    from ingest.formats.tfrecord import TFRecordWriter
    writer = TFRecordWriter(directory, stem, {"image": Field("image"), "label": Field("int"), "note": Field("bytes")})
    for i in range(n):
        writer.add(Record(jpeg_bytes(20, 24, seed=i), i, {"note": b"note %d" % i}))
    writer.close()
    return directory / f"{stem}.tfrecord"


def test_feature_spec_pairs_may_be_lists(tmp_path):
    from ingest.formats.base import read_location
    from ingest.formats.tfrecord import TFRecordSource
    path = _write_tfrecord(tmp_path)
    src = TFRecordSource(str(path), features={"image": "image/encoded", "label": ["image/class/label", "int"],
                                              "note": ["note", "bytes"]})
    assert src.fields["note"].kind == "bytes"
    record = src.parse(1, read_location(src.locate(1)))
    assert (record.label, record.fields["note"]) == (1, b"note 1")


@pytest.mark.parametrize("spec", [["note"], ["note", "bytes", "x"], [3, "bytes"], ["note", 7], {"key": "note"}])
def test_a_malformed_feature_spec_is_a_config_error(tmp_path, spec):
    from ingest.errors import ConfigError
    from ingest.formats.tfrecord import TFRecordSource
    path = _write_tfrecord(tmp_path)
    with pytest.raises(ConfigError, match=r"feature spec of 'note' must be .*two-item list"):
        TFRecordSource(str(path), features={"image": "image/encoded", "note": spec})


def test_cli_passes_a_json_feature_spec(tmp_path):
    path = _write_tfrecord(tmp_path)
    out = run_python("import sys; from ingest.tools.cli import main; sys.exit(main(sys.argv[1:]))", "inspect", str(path), "-s",
                     'features={"image": "image/encoded", "note": ["note", "bytes"]}')
    assert out.returncode == 0, out.stderr
    assert "note" in out.stdout


# -- 5: extension-less shards in a directory (TF-slim's names) are found by their content -------------------

def test_tf_slim_shard_names_are_found(tmp_path):
    import ingest.torch as it
    from ingest.formats import open_source
    from ingest.formats.tfrecord import find_shards
    built = tmp_path / "built"
    built.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    for k in range(2):
        shard = _write_tfrecord(built, f"s{k}", n=3)
        (data / f"validation-0000{k}-of-00002").write_bytes(shard.read_bytes())
    (data / ".validation-00009-of-00010").write_bytes(shard.read_bytes())   # hidden: never a shard
    (data / "LICENSE").write_text("not a record\n")                       # no extension, not a record
    assert [Path(p).name for p in find_shards(str(data))] == ["validation-00000-of-00002",
                                                              "validation-00001-of-00002"]
    assert len(open_source(str(data), format="tfrecord")) == 6
    loader = it.Loader(str(data), format="tfrecord", batch_size=4, device="cpu")
    assert sum(len(images) for images, _ in loader) == 6
    loader.close()


def test_extension_less_tar_shards_are_found(tmp_path):
    import tarfile
    from ingest.formats.webdataset import find_shards
    with tarfile.open(tmp_path / "train-00000-of-00001", "w") as tar:
        tar.add(__file__, arcname="000.txt")
    (tmp_path / "NOTES").write_text("no tar\n")
    assert [Path(p).name for p in find_shards(str(tmp_path))] == ["train-00000-of-00001"]


# -- 10: the tar index is ingest's own JSON, and the words say so --------------------------------------------

def test_docs_say_the_tar_index_is_ingests_own_json(tmp_path):
    import json
    import tarfile
    from ingest.formats import tarindex
    readme = (REPO / "README.md").read_text()
    assert "DALI-style" not in readme
    assert "ingest's own JSON index, not DALI's `wds2idx`" in " ".join(readme.split())
    assert "not\nDALI's ``wds2idx``" in tarindex.__doc__
    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        tar.add(__file__, arcname="000.txt")
    from ingest.formats.webdataset import WebDatasetSource
    WebDatasetSource(str(tmp_path / "s.tar"))
    index = tmp_path / "s.tar.idx"
    if index.exists():   # built beside the shard where it may be written
        assert json.loads(index.read_text())["format"] == "ingest-tar-index"


# -- 9: the command line ------------------------------------------------------------------------------------

CLI = "import sys; from ingest.tools.cli import main; sys.exit(main(sys.argv[1:]))"


def _coco_elsewhere(tmp_path: Path) -> tuple[Path, Path]:
    """instances_x.json in ann/, its images in imgs/ (the official COCO layout)."""
    import json
    from conftest import jpeg_bytes
    (tmp_path / "ann").mkdir()
    (tmp_path / "imgs").mkdir()
    images = [{"id": i + 1, "file_name": f"{i:03d}.jpg", "height": 20, "width": 24} for i in range(3)]
    for i in range(3):
        (tmp_path / "imgs" / f"{i:03d}.jpg").write_bytes(jpeg_bytes(20, 24, seed=i))
    anns = [{"id": i + 1, "image_id": i + 1, "category_id": 1, "bbox": [1, 1, 5, 5], "area": 25, "iscrowd": 0}
            for i in range(3)]
    path = tmp_path / "ann" / "instances_x.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1, "name": "a"}]}))
    return path, tmp_path / "imgs"


def test_coco_without_its_images_says_what_to_pass(tmp_path):
    from ingest.errors import SourceError
    from ingest.formats.coco import CocoSource
    path, _ = _coco_elsewhere(tmp_path)
    with pytest.raises(SourceError, match=r"000\.jpg: cannot read: No such file or directory; images are looked "
                                          r"up under .*ann \(the annotation file's directory, the default\); "
                                          r"pass .* `images` option .*-s images=DIR"):
        CocoSource(str(path)).locate(0)
    with pytest.raises(SourceError, match=r"under .*elsewhere \(as given\)"):
        CocoSource(str(path), images=str(tmp_path / "elsewhere")).locate(0)


def test_verify_takes_reader_options(tmp_path):
    path, images = _coco_elsewhere(tmp_path)
    out = run_python(CLI, "verify", str(path), "--decode", "-s", f"images={images}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 records read, 3 images decoded, 0 problems" in out.stdout
    out = run_python(CLI, "verify", str(path))
    assert out.returncode == 1 and "-s images=DIR" in out.stdout


def test_index_of_a_directory_with_two_formats_indexes_both(tmp_path):
    from conftest import jpeg_bytes
    from ingest.formats.base import Field, Record
    from ingest.formats.recordio import RecordIOWriter
    writer = RecordIOWriter(tmp_path, "r", {"image": Field("image"), "label": Field("int")})
    for i in range(2):
        writer.add(Record(jpeg_bytes(20, 24, seed=i), i))
    writer.close()
    (tmp_path / "r.idx").unlink()
    tfrecord = _write_tfrecord(tmp_path, "t", n=3)
    Path(str(tfrecord) + ".idx").unlink()
    out = run_python(CLI, "index", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{tmp_path / 'r.idx'}: 2 records" in out.stdout
    assert f"{tfrecord}.idx: 3 records" in out.stdout


def test_convert_help_example_of_drop_works(tmp_path):
    import re
    out = run_python(CLI, "convert", "--help")
    (drop,) = re.findall(r"--drop (\S+) to leave them out of a COCO", " ".join(out.stdout.split()))
    path, images = _coco_elsewhere(tmp_path)
    out = run_python(CLI, "convert", str(path), str(tmp_path / "out"), "--to", "wds", "-s", f"images={images}",
                     "--drop", drop, "-q")
    assert out.returncode == 0, out.stdout + out.stderr
    from ingest.formats import open_source
    assert not set(drop.split(",")) & set(open_source(str(tmp_path / "out")).fields)
    out = run_python(CLI, "convert", str(path), str(tmp_path / "tree"), "--to", "filetree", "-s", f"images={images}")
    assert out.returncode == 2 and "--drop area,boxes,categories,image_id,iscrowd" in out.stderr


def test_progress_counts_never_go_backwards():
    import io
    import re
    from ingest.tools.progress import Progress
    stream = io.StringIO()
    bar = Progress(10, 2, stream=stream, interval=0)
    # in flight: 5 handled by running jobs; then the first shard (3 samples) commits, its job's count not in yet
    bar.update(5, 0, 100)
    bar.update(3, 1, 60, force=True)
    bar.update(8, 2, 200, force=True)
    shown = [int(m) for m in re.findall(r"convert: (\d+)/10", stream.getvalue())]
    assert shown == [5, 5, 8]
    assert "1/2 shards" in stream.getvalue().splitlines()[1]
