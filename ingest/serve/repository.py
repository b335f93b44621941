"""A Triton model repository for a spec: ``REPO/NAME/config.pbtxt`` and ``REPO/NAME/1/{model.py, spec.json}``.

The model is Triton's Python backend running `ingest.serve.backend.TritonPythonModel` (so the server's Python
environment needs ingest installed): input ``ENCODED`` (TYPE_UINT8, dims [-1], ragged batching allowed), output
``IMAGES`` (the spec's output dtype, dims [-1, -1, -1]: ``[C, H, W]`` after ``Normalize(layout="NCHW")``, else
``[H, W, C]``) and, with a user model, ``OUTPUT`` (TYPE_FP32, dims [-1]), dynamic batching on.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

import torch

from ..errors import ConfigError
from ..ops import dumps, loads
from ..ops.base import PIXELS
from ..ops.mix import BatchOp

#: The Triton data type of each output dtype a spec may end in.
TRITON_TYPES = {torch.float32: "TYPE_FP32", torch.float16: "TYPE_FP16", torch.uint8: "TYPE_UINT8"}

MODEL_PY = '''"""Triton Python-backend model written by `ingest triton-export`: the ingest ops of spec.json beside it."""

import os
import sys

# The backend stub's Python leaves PYTHONPATH out of sys.path: its entries (ingest, a user's model) go in here.
for _path in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

from ingest.serve.backend import TritonPythonModel  # noqa: E402,F401  (the class Triton looks for)
'''

#: Where a GPU instance's outputs are handed over (`config_text`'s ``output_memory``).
OUTPUT_MEMORY = ("device", "host")

#: A model name Triton takes as a directory name.
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def output_dtype(ops: Sequence[Any]) -> torch.dtype:
    """The dtype of the images ``ops`` output (uint8 pixels unless an op such as Normalize changes it)."""
    spec = PIXELS
    for op in ops:
        if not isinstance(op, BatchOp):
            spec = op.declare(spec)
    return spec.dtype


def config_text(ops: Sequence[Any], *, name: str, max_batch_size: int = 64, queue_delay_us: int = 500,
                kind: str = "KIND_AUTO", gpus: Sequence[int] = (), instances: int = 1,
                model: str | None = None, output_memory: str = "device") -> str:
    """The ``config.pbtxt`` of the model (see the module docstring). ``output_memory``: where a GPU instance
    hands its outputs over, ``"device"`` (for a GPU consumer: an ensemble's next model) or ``"host"`` (one copy
    of the batch to pinned host memory, for clients that receive the images over HTTP or gRPC). ``instances``:
    the instance group's count; each instance is a backend process of its own running whole batches, so one
    batch's preprocessing overlaps another's hand-over."""
    dtype = output_dtype(ops)
    if dtype not in TRITON_TYPES:
        raise ConfigError(f"a served spec must output one of {', '.join(str(d) for d in TRITON_TYPES)}, got {dtype}")
    if kind not in ("KIND_AUTO", "KIND_CPU", "KIND_GPU"):
        raise ConfigError(f"Unknown instance kind {kind!r}. Available: KIND_AUTO, KIND_CPU, KIND_GPU")
    if output_memory not in OUTPUT_MEMORY:
        raise ConfigError(f"Unknown output memory {output_memory!r}. Available: {', '.join(OUTPUT_MEMORY)}")
    if max_batch_size < 1:
        raise ConfigError(f"`max_batch_size` must be >= 1, got {max_batch_size}")
    if instances < 1:
        raise ConfigError(f"`instances` must be >= 1, got {instances}")
    outputs = [f'  {{ name: "IMAGES" data_type: {TRITON_TYPES[dtype]} dims: [ -1, -1, -1 ] }}']
    if model is not None:
        outputs.append('  { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }')
    group = f"count: {instances} kind: {kind}" + (f" gpus: [ {', '.join(map(str, gpus))} ]" if gpus else "")
    values = {"ingest_model": model, "ingest_output_memory": None if output_memory == "device" else output_memory}
    params = "".join(f'parameters: {{ key: "{key}" value: {{ string_value: {json.dumps(value)} }} }}\n'
                     for key, value in values.items() if value is not None)
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
            f"dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us} }}\n"
            'input [\n  { name: "ENCODED" data_type: TYPE_UINT8 dims: [ -1 ] allow_ragged_batch: true }\n]\n'
            f"output [\n{(',' + chr(10)).join(outputs)}\n]\n"
            f"instance_group [ {{ {group} }} ]\n{params}")


def export(spec: str, repo: str | os.PathLike, *, name: str = "preprocess", **config: Any) -> Path:
    """Write the model ``name`` for ``spec`` (ops spec text) into the repository ``repo`` (made if missing);
    ``config``: `config_text`'s options. Returns the model's directory."""
    if not _NAME.match(name):
        raise ConfigError(f"a model name must be letters, digits, '_', '.' or '-', got {name!r}")
    ops = loads(spec)
    model_dir = Path(repo) / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config_text(ops, name=name, **config))
    (model_dir / "1" / "model.py").write_text(MODEL_PY)
    (model_dir / "1" / "spec.json").write_text(dumps(ops))
    return model_dir
