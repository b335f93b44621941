"""`ingest convert --ray`: the same conversion as Ray tasks on a local 2-CPU Ray gives the same bytes, and
resumes a run that another runner started."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_image_folder

from ingest.tools import jobs as jobs_mod
from ingest.tools import manifest
from ingest.tools.cli import main
from ingest.tools.convert import convert

ray = pytest.importorskip("ray")

CLASSES = {"cat": 6, "dog": 5, "emu": 7}


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "train", CLASSES)


def test_ray_output_is_byte_identical(local_ray, folder, tmp_path, capsys):
    convert(str(folder), str(tmp_path / "local"), to="tfrecord", shard_size=4, max_side=50, progress=False)
    assert main(["convert", str(folder), str(tmp_path / "ray"), "--to", "tfrecord", "--shard-size", "4",
                 "--max-side", "50", "--ray", "-q"]) == 0
    assert "18 samples in 5 shards" in capsys.readouterr().out
    local, on_ray = tree_bytes(tmp_path / "local"), tree_bytes(tmp_path / "ray")
    assert local == on_ray and len(local) == 2 * 5 + 1


def test_ray_resumes_an_interrupted_run(local_ray, folder, tmp_path, monkeypatch):
    convert(str(folder), str(tmp_path / "whole"), to="wds", shard_size=4, progress=False)
    out = tmp_path / "out"
    real, calls = jobs_mod.write_shard, []

    def dies_at_third(*args):
        calls.append(args)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real(*args)

    with monkeypatch.context() as m:
        m.setattr(jobs_mod, "write_shard", dies_at_third)
        with pytest.raises(KeyboardInterrupt):
            convert(str(folder), str(out), to="wds", shard_size=4, progress=False)
    assert len(manifest.load(str(out))[0]["shards"]) == 2
    summary = convert(str(folder), str(out), to="wds", shard_size=4, resume=True, ray=True, progress=False)
    assert summary.resumed == 2 and summary.written == 18 - 8
    assert tree_bytes(out) == tree_bytes(tmp_path / "whole")


def test_ray_failure_names_the_sample(local_ray, tmp_path):
    src = make_image_folder(tmp_path / "src", {"a": 3})
    (src / "a" / "0002.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(Exception, match="0002.jpg"):
        convert(str(src), str(tmp_path / "o"), to="tfrecord", max_side=20, ray=True, progress=False)
