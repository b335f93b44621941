"""Raw tensor shards on the native engine without a GPU: `RawSource.native_table` (each sample's pixel bytes,
height and width, label and CRC32C; a sample of no pixels left to Python; what the engine cannot take refused),
and the engine's dry run planning what the Python stages plan (the sizes from the table, no decode region)."""

from __future__ import annotations

import numpy as np
import pytest

from ingest import native
from ingest.formats import checks
from ingest.formats.base import Field, Record
from ingest.formats.raw import RawSource, RawWriter
from ingest.ops import Flip, Normalize, RandomResizedCrop
from test_native import dry

pytestmark = pytest.mark.skipif(native.ENGINE is None, reason="ingest._engine was not built")


def write(root, shapes, labels=None) -> RawSource:
    rng = np.random.default_rng(3)
    root.mkdir(parents=True, exist_ok=True)
    with RawWriter(root, "part-0", {"image": Field("pixels"), "label": Field("int")}) as w:
        for i, shape in enumerate(shapes):
            w.add(Record(rng.integers(0, 256, shape, dtype=np.uint8), i % 3 if labels is None else labels[i]))
    return RawSource(root, check="crc")


def test_the_table_is_each_samples_pixels_size_label_and_crc(tmp_path):
    shapes = [(20 + i, 30 + 2 * i, 3) for i in range(6)]
    shapes[4] = (0, 7, 3)   # no pixels: the Python reader's
    src = write(tmp_path, shapes)
    t = src.native_table()
    assert t.kind == "pixels" and list(t.paths) == src.paths
    assert t.hw.tolist() == [list(s[:2]) for s in shapes]
    assert t.python.tolist() == [0, 0, 0, 0, 1, 0]
    for i, shape in enumerate(shapes):
        files, offsets = src.ranges([i])
        assert (t.files[i], t.offsets[i]) == (files[0], offsets[0])
        assert t.sizes[i] == np.prod(shape) and t.labels[i] == i % 3
        with open(src.paths[0], "rb") as f:
            f.seek(int(t.offsets[i]))
            data = f.read(int(t.sizes[i]))
        assert np.array_equal(np.frombuffer(data, np.uint8).reshape(shape),
                              src.parse(i, _sample_bytes(src, i)).image)
        assert int(t.crcs[i]) == checks.crc(np.frombuffer(data, np.uint8))


def _sample_bytes(src, i) -> bytes:
    loc = src.locate(i)
    with open(loc.path, "rb") as f:
        f.seek(loc.offset)
        return f.read(loc.length)


def test_pixels_the_engine_cannot_take_give_no_table(tmp_path):
    gray = write(tmp_path / "g", [(8, 9, 1)] * 3)
    with pytest.raises(native.NotNative, match="1 channel, and the native engine takes 3"):
        gray.native_table()
    rgba = write(tmp_path / "a", [(8, 9, 4)] * 3)
    with pytest.raises(native.NotNative, match="4 channels"):
        rgba.native_table()


@pytest.mark.parametrize("shape", ["one", "ragged"])
def test_dry_run_plans_what_the_python_stages_plan(tmp_path, shape):
    """The engine's plans (sizes from the table, the whole image as its source) equal the Python planner's over
    two epochs, for one pixel shape (the Python stages draw in the decode stage) and for shapes that differ."""
    shapes = [(40, 48, 3)] * 9 if shape == "one" else [(20 + 3 * i, 30 + i, 3) for i in range(9)]
    src = write(tmp_path, shapes)
    ops = [RandomResizedCrop(24), Flip(), Normalize((120.0,) * 3, (60.0,) * 3)]
    ex, pipe, sampler = dry(src, ops)
    try:
        for epoch in range(2):
            for batch, plan in zip(ex, sampler.batches(epoch)):
                work = pipe.read(plan)
                if work.ops_plan is None:   # a direct read: drawn in the decode stage
                    work = pipe.decode_stage.run(work)
                assert batch.column("index").tolist() == plan.indices.tolist()
                assert batch.column("label").tolist() == [i % 3 for i in plan.indices.tolist()]
                assert (batch.column("status") == 0).all()
                assert batch.rows[:, 3:5].tolist() == [list(s) for s in work.sizes]
                assert batch.rows[:, 5:9].tolist() == work.ops_plan.warp.regions().tolist()
                assert (batch.rows[:, 9:13] == 0).all()   # nothing decoded: no decode region
                assert batch.rows[:, 13:15].tolist() == [[24, 24]] * len(plan.indices)
            assert ex.ended.epoch == epoch + 1
    finally:
        ex.close()


def test_a_sample_of_no_pixels_is_left_to_python(tmp_path):
    shapes = [(10, 12, 3)] * 6
    shapes[2] = (0, 12, 3)
    src = write(tmp_path, shapes)
    ex, _, _ = dry(src, [RandomResizedCrop(8)], shuffle=False, batch_size=3)
    try:
        first = next(iter(ex))
        assert first.column("status").tolist() == [0, 0, 1] and ex.fallbacks == {"record": 1}
    finally:
        ex.close()
