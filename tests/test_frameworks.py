"""ingest.jax and ingest.tf: a Loader's batches as jax.Array / tf.Tensor equal the torch batches; NumPy by
``__dlpack__``. JAX runs where installed (`pip install 'ingest[jax]'`; jaxlib is too large for the test extra),
TensorFlow likewise (`ingest[tf]`): both importorskip on CI."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import requires_cuda
from ingest import Loader
from ingest.ops import CenterCrop, Normalize, Resize

ROOT = Path(__file__).resolve().parent.parent
OPS = [Resize(20), CenterCrop(16), Normalize(mean=[124.0, 116.0, 104.0], std=[58.0, 57.0, 57.0])]


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (30 + seed, 40, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


ITEMS = [jpeg(k) for k in range(10)]


def torch_batches(**options) -> list:
    with Loader(ITEMS, batch_size=4, ops=OPS, **options) as loader:
        return [tuple(t.clone() for t in batch) if isinstance(batch, tuple)
                else {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                for batch in loader]


def test_numpy_takes_a_batch_by_dlpack_without_a_copy():
    with Loader(ITEMS, batch_size=4, ops=OPS) as loader:
        images, labels = next(iter(loader))
        array = np.from_dlpack(images)
        assert array.ctypes.data == images.data_ptr() and np.array_equal(array, images.numpy())
        assert np.array_equal(np.from_dlpack(labels), labels.numpy())


def test_a_missing_framework_names_its_extra(monkeypatch):
    import ingest.jax
    import ingest.tf
    monkeypatch.setitem(sys.modules, "jax", None)
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    loader = Loader(ITEMS, batch_size=4, ops=OPS)
    with pytest.raises(ImportError, match=r"ingest\[jax\]"):
        next(ingest.jax.iterator(loader))
    with pytest.raises(ImportError, match=r"ingest\[tf\]"):
        ingest.tf.dataset(loader)
    loader.close()


# -- JAX ------------------------------------------------------------------------------------------------
def test_jax_batches_equal_the_torch_batches():
    jax = pytest.importorskip("jax")
    import ingest.jax
    expected = torch_batches()
    with Loader(ITEMS, batch_size=4, ops=OPS) as loader:
        got = list(ingest.jax.iterator(loader))
    assert len(got) == len(expected) == 3
    for (images, labels), (x, y) in zip(got, expected):
        assert isinstance(images, jax.Array) and images.dtype == np.float32
        assert labels.dtype == (np.int64 if jax.config.jax_enable_x64 else np.int32)   # JAX's 64-bit rule
        assert np.array_equal(np.asarray(images), x.numpy()) and np.array_equal(np.asarray(labels), y.numpy())


def test_jax_dict_batches_keep_their_fields():
    jax = pytest.importorskip("jax")
    import ingest.jax
    expected = torch_batches(output="dict")
    with Loader(ITEMS, batch_size=4, ops=OPS, output="dict") as loader:
        got = list(ingest.jax.iterator(loader))
    for batch, want in zip(got, expected):
        assert set(batch) == set(want)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert isinstance(batch[key], jax.Array) and np.array_equal(np.asarray(batch[key]), value.numpy())


def test_a_jax_batch_stays_valid_while_later_batches_come():
    pytest.importorskip("jax")
    import ingest.jax
    expected = torch_batches()
    with Loader(ITEMS, batch_size=4, ops=OPS, prefetch=1) as loader:
        iterator = ingest.jax.iterator(loader)
        first, _ = next(iterator)
        rest = list(iterator)
        assert len(rest) == 2 and np.array_equal(np.asarray(first), expected[0][0].numpy())


SHARDED = """
import jax, numpy as np, sys
sys.path.insert(0, {tests!r})
from test_frameworks import ITEMS, OPS, torch_batches
from ingest import Loader
import ingest.jax
mesh = jax.sharding.Mesh(jax.local_devices(), ("batch",))
sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
expected = torch_batches(last_batch="drop")
with Loader(ITEMS, batch_size=4, ops=OPS, last_batch="drop") as loader:
    got = list(ingest.jax.iterator(loader, sharding=sharding))
assert len(jax.local_devices()) == 2 and len(got) == len(expected) == 2
for (images, labels), (x, y) in zip(got, expected):
    assert images.sharding == sharding and len(images.addressable_shards) == 2
    assert {{s.device for s in images.addressable_shards}} == set(jax.local_devices())
    assert images.addressable_shards[1].data.shape == (2, 3, 16, 16)
    assert np.array_equal(np.asarray(images), x.numpy()) and np.array_equal(np.asarray(labels), y.numpy())
print("ok")
"""


def test_jax_sharding_makes_one_global_array_over_local_devices():
    pytest.importorskip("jax")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    code = SHARDED.format(tests=str(ROOT / "tests"))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


@pytest.mark.gpu
@requires_cuda
def test_jax_takes_a_cuda_batch_without_a_copy():
    jax = pytest.importorskip("jax")
    import ingest.jax
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU here")
    with Loader(ITEMS, batch_size=4, ops=OPS, device="cuda") as loader:
        images, labels = next(iter(loader))
        torch.cuda.current_stream().synchronize()
        array = ingest.jax.to_jax(images)
        assert array.unsafe_buffer_pointer() == images.data_ptr()
        assert np.array_equal(np.asarray(array), images.cpu().numpy())


# -- TensorFlow -----------------------------------------------------------------------------------------
def test_tf_batches_and_dataset_equal_the_torch_batches():
    tf = pytest.importorskip("tensorflow")
    import ingest.tf
    expected = torch_batches()
    with Loader(ITEMS, batch_size=4, ops=OPS) as loader:
        got = list(ingest.tf.batches(loader))
        for (images, labels), (x, y) in zip(got, expected):
            assert isinstance(images, tf.Tensor) and np.array_equal(images.numpy(), x.numpy())
            assert np.array_equal(labels.numpy(), y.numpy())
        dataset = ingest.tf.dataset(loader)
        for _ in range(2):   # each iteration of the dataset is an epoch
            epoch = list(dataset)
            assert len(epoch) == len(expected)
            for (images, labels), (x, y) in zip(epoch, expected):
                assert np.array_equal(images.numpy(), x.numpy()) and np.array_equal(labels.numpy(), y.numpy())
