"""Regression tests of issue 33's defects 1, 2, 8 and the rest of 9: fields and their kinds through a
conversion, one box convention, one batch type per Loader, a quick command line."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import jpeg_bytes, make_image_folder

REPO = Path(__file__).resolve().parents[1]


def _python(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, env=env)


# -- 9: --help and --version load no torch; a torchvision transform in ops ------------------------------------

@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_do_not_import_torch(flag):
    out = _python("-X", "importtime", "-m", "ingest.tools.cli", flag)
    assert out.returncode == 0, out.stderr
    assert ("usage: ingest" in out.stdout) if flag == "--help" else out.stdout.startswith("ingest ")
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time")}
    assert "ingest.tools" in imported   # the command line ran (as __main__, not listed itself)
    assert not {m for m in imported if m.split(".")[0] in ("torch", "numpy")}, "--help imported torch or numpy"


def test_every_subcommand_is_listed_and_runs_its_own_help():
    out = _python("-m", "ingest.tools.cli", "--help")
    for name in ("demo", "convert", "index", "verify", "inspect"):
        assert re.search(rf"^\s+{name}\s+\S", out.stdout, re.M), name
    out = _python("-m", "ingest.tools.cli", "inspect", "--help")
    assert out.returncode == 0 and "usage: ingest inspect" in out.stdout


def test_a_torchvision_v1_transform_in_ops_is_a_clear_config_error(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    import ingest
    from ingest.errors import ConfigError
    from torchvision.transforms import v2
    root = make_image_folder(tmp_path / "t", {"a": 2}, size=(20, 24))
    with pytest.raises(ConfigError, match=r"ops\[0\] .*not an op.*torchvision.transforms.v2"):
        ingest.Loader(str(root), batch_size=2, ops=[torchvision.transforms.RandomHorizontalFlip()])
    images, _ = next(iter(ingest.Loader(str(root), batch_size=2, ops=[ingest.ops.Resize((16, 16)),
                                                                      v2.RandomHorizontalFlip(p=1.0)])))
    assert images.shape == (2, 3, 16, 16)


# -- 8: one batch type per Loader ------------------------------------------------------------------------------

def _mixed(tmp_path: Path) -> Path:
    """Six images: the first batch of two has one size, the others differ within their batch."""
    root = tmp_path / "mixed" / "a"
    root.mkdir(parents=True)
    for i, (h, w) in enumerate([(20, 24), (20, 24), (20, 24), (30, 18), (16, 16), (22, 40)]):
        (root / f"{i}.jpg").write_bytes(jpeg_bytes(h, w, seed=i))
    return root.parent


def test_images_of_different_sizes_without_a_size_op_are_a_clear_error(tmp_path):
    import ingest
    from ingest.errors import ConfigError
    loader = ingest.Loader(str(_mixed(tmp_path)), batch_size=2)
    batches = iter(loader)
    assert isinstance(next(batches)[0], torch.Tensor)   # same sizes: a tensor ...
    with pytest.raises(ConfigError, match=r"differ in size .*Resize\(\(h, w\)\), CenterCrop, RandomResizedCrop.*"
                                          r"ragged=True"):
        next(batches)                                   # ... and different ones never a list
    loader.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_ragged_always_gives_lists_and_dense_always_tensors(tmp_path, workers):
    import ingest
    root = str(_mixed(tmp_path))
    with ingest.Loader(root, batch_size=2, ragged=True, num_workers=workers) as loader:
        batches = [images for images, _ in loader]
    assert all(isinstance(b, list) and len(b) == 2 for b in batches)
    assert [tuple(im.shape) for im in batches[0]] == [(3, 20, 24)] * 2
    assert tuple(batches[1][1].shape) == (3, 30, 18)
    with ingest.Loader(root, batch_size=2, ragged=True, ops=[ingest.ops.Resize((8, 8))], output="dict") as loader:
        assert all(isinstance(b["images"], list) and b["images"][0].shape == (3, 8, 8) for b in loader)
    with ingest.Loader(root, batch_size=2, ops=[ingest.ops.CenterCrop(12)], num_workers=workers) as loader:
        assert all(isinstance(images, torch.Tensor) and images.shape == (2, 3, 12, 12) for images, _ in loader)


def test_ragged_must_be_a_bool():
    import ingest
    from ingest.errors import ConfigError
    with pytest.raises(ConfigError, match="`ragged` must be True or False"):
        ingest.Loader([jpeg_bytes(8, 8)], batch_size=1, ragged="yes")
