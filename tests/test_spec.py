"""ingest.ops.dumps / loads: every op class round-trips with its parameters; bad specs are ConfigErrors."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch

import ingest.ops as O
from ingest.errors import ConfigError
from ingest.ops import spec
from ingest.ops.base import Op
from ingest.ops.mix import BatchOp


def module_function(images, rand):
    return images


#: Each op class with parameters away from its defaults where it has any (so a parameter dropped on the way
#: shows); several forms where the constructor normalizes them (Resize(256) is shorter=256).
EXAMPLES = [
    O.Resize(256), O.Resize(size=(20, 30), interpolation="bicubic", antialias=False), O.Resize(longer=100),
    O.Resize(shorter=50, max_size=90), O.CenterCrop(24, fill=3), O.CenterCrop((10, 12)),
    O.RandomResizedCrop(32, scale=(0.2, 0.9), ratio=(0.5, 2.0), interpolation="nearest"),
    O.Flip(0.3, vertical=True), O.HorizontalFlip(0.2), O.VerticalFlip(0.7),
    O.Rotate(10, expand=True, fill=(1, 2, 3)), O.Rotate((-5, 5), interpolation="nearest"),
    O.RandomIoUCrop((0.1, 0.5), attempts=5, rounds=3), O.ZoomOut((1.0, 2.0), fill=7, p=0.3),
    O.PadTo(64, center=True), O.PadTo(multiple=32, batch=True),
    O.ColorJitter(0.4, (0.5, 1.5), 0.4, 0.1, p=0.8),
    O.Normalize(mean=[124.0, 116, 104], std=[58, 57, 57], dtype=torch.float16, layout="NHWC", scale=2.0),
    O.RandAugment(3, 5, 21, interpolation="bilinear"), O.TrivialAugmentWide(fill=10), O.AutoAugment(fill=(1, 2, 3)),
    O.RandomErasing(0.3, value="random"), O.RandomErasing(0.4, value=(1, 2, 3)), O.GaussianBlur(5, (0.2, 1.0)),
    O.RandomGrayscale(0.2), O.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=5, fill=4),
    O.MixUp(0.2, 10, p=0.5), O.CutMix(0.7, 10, label_smoothing=0.1), O.MixUpCutMix(0.5, 0.9, 10, switch_prob=0.3),
    O.BatchFunction(module_function, randoms=2, size=20),
]


def public(op) -> dict:
    """An op's public attributes with sequences as tuples and arrays as lists (what equal ops share)."""
    def norm(v):
        if isinstance(v, (list, tuple)):
            return tuple(norm(x) for x in v)
        if isinstance(v, (np.ndarray, torch.Tensor)):
            return (str(v.dtype), v.tolist())
        return v
    return {k: norm(v) for k, v in vars(op).items() if not k.startswith("_")}


def test_every_op_class_is_nameable_and_covered():
    classes = {c for c in vars(O).values() if inspect.isclass(c) and issubclass(c, (Op, BatchOp))
               and c not in (Op, BatchOp, O.GeometryOp)}
    assert classes == set(spec.OP_CLASSES.values())
    assert {type(op) for op in EXAMPLES} == classes - {O.Torchvision}   # Torchvision: refused, below


@pytest.mark.parametrize("op", EXAMPLES, ids=lambda op: type(op).__name__)
def test_an_op_round_trips_with_every_parameter(op):
    text = O.dumps([op])
    back = O.loads(text)
    assert len(back) == 1 and type(back[0]) is type(op)
    assert public(back[0]) == public(op)
    assert O.dumps(back) == text


def test_a_list_round_trips_in_order_and_runs_the_same():
    ops = [O.RandomResizedCrop(24), O.Flip(), O.ColorJitter(0.3, 0.3), O.Normalize(mean=[120.0], std=[60.0])]
    back = O.loads(O.dumps(ops))
    assert spec.same_ops(ops, back)
    images = torch.randint(0, 256, (4, 40, 50, 3), dtype=torch.uint8)
    assert torch.equal(O.run_ops(ops, images, 3), O.run_ops(back, images, 3))


def test_the_document_is_versioned_json():
    doc = json.loads(O.dumps([O.Resize(8)]))
    assert doc["format"] == "ingest.ops" and doc["version"] == spec.VERSION
    assert doc["ops"] == [{"op": "Resize", "params": {"size": None, "shorter": 8, "longer": None, "max_size": None,
                                                      "interpolation": "bilinear", "antialias": True}}]


def _doc(**over) -> str:
    doc = {"format": "ingest.ops", "version": 1, "ops": [{"op": "Resize", "params": {"shorter": 8}}]}
    doc.update(over)
    return json.dumps(doc)


@pytest.mark.parametrize("text, message", [
    ("{not json", "must be JSON"),
    (json.dumps([1, 2]), "not an ops spec"),
    (_doc(version=2), "version 2 is not supported"),
    (_doc(version=None), "version None is not supported"),
    (_doc(ops={"op": "Resize"}), "must be a list"),
    (_doc(ops=[{"op": "Resise", "params": {}}]), r"ops\[0\]: unknown op 'Resise'. Available: AutoAugment"),
    (_doc(ops=[{"op": "Resize", "params": {"shorter": 8}}, {"op": "Flip", "params": {"q": 1}}]),
     r"ops\[1\] \(Flip\): unknown parameter\(s\) q. Available: p, horizontal, vertical"),
    (_doc(ops=[{"op": "Resize", "params": {}}]), r"ops\[0\] \(Resize\): Resize needs exactly one of"),
    (_doc(ops=[{"op": "CenterCrop", "params": {}}]), r"ops\[0\] \(CenterCrop\).*size"),
    (_doc(ops=[{"op": "Normalize", "params": {"mean": [1], "std": [60], "dtype": {"dtype": "float7"}}}]),
     "unknown value"),
    (_doc(ops=[{"op": "BatchFunction", "params": {"fn": {"callable": "no_such_module_x:f"}}}]), "cannot import"),
    (_doc(ops=[{"op": "Resize", "params": {"shorter": 8}, "extra": 1}]), r"unknown keys \['extra'\]"),
])
def test_a_bad_spec_is_a_config_error_naming_what(text, message):
    with pytest.raises(ConfigError, match=message):
        O.loads(text)


def test_what_cannot_be_written_is_refused():
    with pytest.raises(ConfigError, match="not a lambda"):
        O.dumps([O.BatchFunction(lambda x, r: x)])
    v2 = pytest.importorskip("torchvision.transforms.v2")
    with pytest.raises(ConfigError, match=r"ops\[1\] is a Torchvision op"):
        O.dumps([O.Flip(), O.Torchvision(v2.RandomInvert())])
    with pytest.raises(ConfigError, match="must be a list"):
        O.dumps(O.Flip())

    class Mine(O.Flip):
        pass
    with pytest.raises(ConfigError, match="Mine, which an ops spec cannot name"):
        O.dumps([Mine()])
