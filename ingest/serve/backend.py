"""The Triton Python-backend model: what a repository's ``1/model.py`` runs (`ingest.serve.repository`).

Triton's Python backend calls ``initialize(args)`` once per instance, ``execute(requests)`` once per dynamic
batch (one request per client call, each with its own ``ENCODED``: ragged inputs need no padding) and
``finalize()``. Every request gets its own response: a request whose item was refused gets an error response
naming why, the others of the same batch their images, and an exception while running the batch fails only
that batch's requests.

Notes
-----
Outputs leave as DLPack tensors (``pb_utils.Tensor.from_dlpack``): on a GPU instance the batch stays in device
memory, for Triton to copy out to a client or hand to the next model of an ensemble. The stream the outputs
were made on is synchronized before they are handed over, since a DLPack capsule carries no stream.
With the model parameter ``ingest_output_memory`` set to ``host`` (`ingest.serve.repository.config_text`'s
``output_memory``) a GPU instance instead copies the batch's outputs to pinned host memory in one copy and hands
over host tensors: for clients that receive the images over HTTP or gRPC, which the Python backend otherwise
serves by copying each request's device tensor out on its own.

With the environment variable ``INGEST_SERVE_TIMINGS`` set to a directory, each instance adds up the wall
time of ``execute``'s steps (reading the requests, the preprocessing, the wait for the device, building the
responses) past its first few batches, and writes them to ``DIR/<model>-<pid>.json`` every second and
when it is finalized: what a benchmark reads to split Triton's ``compute_infer`` into its parts.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.dlpack

from .. import defaults
from .preprocess import ItemError, Outcome, Preprocessor, as_items

log = logging.getLogger(__name__)

INPUT = "ENCODED"
OUTPUT_IMAGES = "IMAGES"
OUTPUT_MODEL = "OUTPUT"


def parameter(config: dict, key: str, default: str | None = None) -> str | None:
    """A ``parameters`` entry of a model config (its ``string_value``), or ``default``."""
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


class TritonPythonModel:
    """The ``preprocess`` model: ``ENCODED`` (uint8 ``[L]`` per item) -> ``IMAGES`` (and ``OUTPUT`` with a
    user model). Its spec is ``spec.json`` beside the ``model.py`` that imports this class."""

    def initialize(self, args: dict[str, Any]) -> None:
        self.pb = importlib.import_module("triton_python_backend_utils")
        config = json.loads(args["model_config"])
        version_dir = Path(args["model_repository"]) / str(args["model_version"])
        spec = (version_dir / "spec.json").read_text()
        if args.get("model_instance_kind") == "GPU" and torch.cuda.is_available():
            device = torch.device("cuda", int(args.get("model_instance_device_id") or 0))
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        # This process is the instance's: every thread in it (the transport's, the decode pool's, execute's) runs
        # torch CPU ops on the ops_threads setting's threads, not on every core beside the server and its clients
        torch.set_num_threads(defaults.ops_threads())
        self.preprocessor = Preprocessor(spec, device=device, model=parameter(config, "ingest_model"))
        self.dtypes = {o["name"]: self.pb.triton_string_to_numpy(o["data_type"]) for o in config["output"]}
        # "host": a GPU batch's outputs leave in one copy to pinned memory (clients over HTTP/gRPC), not one
        # device tensor per request for the stub to copy out one at a time
        self.host_outputs = parameter(config, "ingest_output_memory", "device") == "host" and device.type == "cuda"
        self.timings = Timings(config.get("name", "model"), os.environ.get("INGEST_SERVE_TIMINGS"))
        log.info("ingest: %s serving on %s", config.get("name"), device)

    def execute(self, requests: list) -> list:
        clock = self.timings.start()
        items, owners, responses = [], [], [None] * len(requests)
        for r, request in enumerate(requests):
            try:
                request_items = as_items(self._input(request))
            except ItemError as err:
                responses[r] = self._error(str(err))
                continue
            items.extend(request_items)
            owners.extend([r] * len(request_items))
        clock.lap("inputs")
        try:
            outcomes = self.preprocessor.run(items) if items else []
        except Exception as err:   # a fault of the whole batch: its requests fail, the server stays up
            log.exception("ingest: a batch of %d requests failed", len(requests))
            return [resp or self._error(f"the batch failed: {type(err).__name__}: {err}") for resp in responses]
        clock.lap("preprocess")
        if self.host_outputs:
            outcomes = _to_host(outcomes)
        by_request: dict[int, list[Outcome]] = {}
        for r, outcome in zip(owners, outcomes):
            by_request.setdefault(r, []).append(outcome)
        if self.preprocessor.device.type == "cuda":   # DLPack carries no stream: the outputs must be done
            torch.cuda.current_stream(self.preprocessor.device).synchronize()
        clock.lap("device_wait")
        for r, mine in by_request.items():
            responses[r] = self._response(requests[r], mine)
        clock.lap("responses")
        self.timings.add(clock, requests=len(requests), items=len(items))
        return responses

    def finalize(self) -> None:
        self.timings.write()
        self.preprocessor.close()

    def _input(self, request: Any) -> np.ndarray:
        tensor = self.pb.get_input_tensor_by_name(request, INPUT)
        if tensor is None:
            raise ItemError(f"the request has no {INPUT} input")
        # By DLPack, not as_numpy: the stub's numpy view is built for numpy 1's ABI and reads as empty under 2
        return torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).cpu().numpy()

    def _error(self, message: str) -> Any:
        return self.pb.InferenceResponse(output_tensors=[], error=self.pb.TritonError(message))

    def _response(self, request: Any, outcomes: list[Outcome]) -> Any:
        for k, outcome in enumerate(outcomes):
            if outcome.error is not None:
                where = f"item {k} of the request" if len(outcomes) > 1 else "the request's image"
                return self._error(f"{where} was refused: {outcome.error}")
        wanted = set(request.requested_output_names() or self.dtypes)
        tensors = []
        for name, field in ((OUTPUT_IMAGES, "image"), (OUTPUT_MODEL, "output")):
            if name not in wanted or name not in self.dtypes:
                continue
            rows = [getattr(o, field) for o in outcomes]
            if len({tuple(x.shape) for x in rows}) > 1:
                return self._error(f"the request's {len(rows)} items gave {name} of different shapes; send them "
                                   "one image per request, or end the spec with a fixed-size op")
            batch = rows[0].unsqueeze(0) if len(rows) == 1 else torch.stack(rows)   # one image: no copy
            batch = batch.to(_torch_dtype(self.dtypes[name])).contiguous()
            tensors.append(self.pb.Tensor.from_dlpack(name, torch.utils.dlpack.to_dlpack(batch)))
        return self.pb.InferenceResponse(output_tensors=tensors)


class Timings:
    """Wall seconds per step of ``execute``, added up over batches and written as JSON to
    ``directory/<name>-<pid>.json`` (every ``every`` seconds and on `write`); nothing without a directory.
    The first ``skip`` batches (the decoders' and the device's first use) are left out."""

    def __init__(self, name: str, directory: str | None, every: float = 1.0, skip: int = 10):
        self.path = Path(directory) / f"{name}-{os.getpid()}.json" if directory else None
        self.every, self.skip = every, skip
        self.totals: dict[str, float] = {}
        self.counts = {"batches": 0, "requests": 0, "items": 0}
        self._written = time.monotonic()

    def start(self) -> "_Clock":
        return _Clock(self.path is not None)

    def add(self, clock: "_Clock", **counts: int) -> None:
        if self.path is None:
            return
        if self.skip > 0:
            self.skip -= 1
            return
        self.counts["batches"] += 1
        for key, n in counts.items():
            self.counts[key] += n
        for step, seconds in clock.laps.items():
            self.totals[step] = self.totals.get(step, 0.0) + seconds
        if time.monotonic() - self._written > self.every:
            self.write()

    def write(self) -> None:
        if self.path is None:
            return
        self._written = time.monotonic()
        doc = {**self.counts, "seconds": {k: round(v, 6) for k, v in self.totals.items()}}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.path)


class _Clock:
    """One ``execute``'s laps (``laps``: step -> seconds; nothing is timed when not ``on``)."""

    def __init__(self, on: bool):
        self.on = on
        self.laps: dict[str, float] = {}
        self.last = time.perf_counter() if on else 0.0

    def lap(self, step: str) -> None:
        if not self.on:
            return
        now = time.perf_counter()
        self.laps[step] = now - self.last
        self.last = now


def _to_host(outcomes: list[Outcome]) -> list[Outcome]:
    """``outcomes`` with their tensors copied to pinned host memory, ready once the current stream is done."""
    fields = {}
    for field in ("image", "output"):
        rows = [getattr(o, field) for o in outcomes if o.error is None]
        if rows and rows[0] is not None:
            fields[field] = iter(_host_rows(rows))
    return [o if o.error is not None else Outcome(**{f: next(rows) for f, rows in fields.items()}) for o in outcomes]


def _host_rows(rows: list[torch.Tensor]) -> list[torch.Tensor]:
    if len({(tuple(r.shape), r.dtype) for r in rows}) == 1:   # one copy for the batch
        batch = torch.stack(rows)
        return list(torch.empty(batch.shape, dtype=batch.dtype, pin_memory=True).copy_(batch, non_blocking=True))
    return [torch.empty(r.shape, dtype=r.dtype, pin_memory=True).copy_(r, non_blocking=True) for r in rows]


def _torch_dtype(dtype: Any) -> torch.dtype:
    if np.dtype(dtype) == np.dtype(np.uint8):
        return torch.uint8
    return {np.dtype(np.float16): torch.float16, np.dtype(np.float64): torch.float64}.get(np.dtype(dtype),
                                                                                        torch.float32)
