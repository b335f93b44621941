"""`ingest serve` under load against the same preprocessing run in-process by DALI on the same bytes.

The pipeline (both sides): decode a JPEG, resize the shorter side to 256, centre-crop 224, ImageNet
normalisation to float32 CHW. The same ``--images`` JPEGs (from ``--data``, e.g. make_data.py's set; or
generated) are held in memory by every side.

Every server side starts its own server (`SERVER_SIDES` says what each changes):

- ``serve``: `ingest serve`'s model on the real Triton server (nvidia-pytriton's), ``--clients`` concurrent
  gRPC clients (spread over ``--client-procs`` processes, each request one image) for ``--seconds``: img/s and
  the request latency's p50/p99 under that load, and ``server_stats``: Triton's own account of the run (mean
  dynamic batch, time in the batcher's queue, and per batch the Python backend's input, execute and output
  steps; `stats_between`), which says whether the server waited on its batcher, its model or its copies; and
  ``backend_timings``: the model's own split of ``execute`` (reading the requests, the preprocessing, the wait
  for the device, building the responses; `read_timings`);
- ``serve_batch1``: one client, one request at a time (batch-1 load): p50/p99 latency (and its ``server_stats``);
  ``serve_batch1_delay0`` the same with the batcher's max queue delay 0 (what the 500 us default adds);
- ``serve_host_outputs``: ``serve`` with the model exported ``output_memory="host"``: a GPU batch's images
  copied to pinned host memory in one copy, instead of a device tensor per request that the Python backend
  copies out one at a time (on the CPU, the same model as ``serve``);
- ``serve_null``: the same server, clients and output (``[1, 3, 224, 224]`` float32 on the instance's device)
  from a model that does nothing but hand over one preallocated image per request (`NULL_MODEL`): the most any
  preprocessing gets through this server;
- ``serve_instances`` / ``serve_null_instances``: ``serve`` / ``serve_null`` with ``--variant-instances``
  model instances (each its own backend process: one batch's infer overlaps another's output);
- ``serve_fp16``: the spec's Normalize outputs float16 (half the bytes of each answer);
- ``serve_shm``: each client receives IMAGES in a Triton system shared memory region of its own (tritonclient's
  shared-memory utilities) instead of in the gRPC payload;
- ``serve_instances_fp16_shm``: the three together;
- ``serve_cuda_shm`` / ``serve_null_cuda_shm`` / ``serve_instances_cuda_shm`` / ``serve_null_instances_cuda_shm`` /
  ``serve_instances_fp16_cuda_shm``: each client receives IMAGES in a CUDA shared memory region of its own on
  the server's GPU (``cudaMalloc`` + ``cudaIpcGetMemHandle`` through CuPy, registered with the server): the
  answer never leaves the device, as for a consumer on the same GPU; each client first checks that the region
  holds what the gRPC payload holds for the same image, and again every `CHECK_EVERY` requests under load;
- ``inprocess``: the served model's preprocessing (`ingest.serve.Preprocessor`) called in-process on batches
  of ``--max-batch-size``: img/s, what the server wraps; ``inprocess_batch16`` the same on batches of 16 (about
  the dynamic batch 64 clients make of one instance: what ``serve``'s ``backend_timings`` preprocessing step
  compares with), ``inprocess_batch1`` one image a call (p50/p99 too);
- ``dali`` / ``dali_batch1``: DALI's pipeline (external_source, mixed decoder, resize, crop_mirror_normalize)
  in-process on batches of ``--max-batch-size`` (img/s, the ceiling) and of 1 (p50/p99 per image); without
  CUDA (``--dry-run``) the same pipeline with the CPU decoder and no device;
- derived (`derive`): ``serve_over_dali`` (the target: >= 0.8, ``serve_meets_0_8``), each other side over DALI
  and the best of them (``best``, ``best_over_dali``), ``serve_over_inprocess``, ``serve_over_null`` (how much
  of the transport's ceiling the preprocessing keeps), and the batch-1 latencies of the server and of DALI.

A client counts an answer of the wrong shape or dtype as an error.
The in-process sides (the ceiling) run first, then the server sides; the report is rewritten after each side,
so a run stopped part-way (``timeout -s INT``) keeps the sides it finished.

    python benchmarks/bench_serve.py --data /dev/shm/ingest_bench_20k --out benchmarks/results/bench_serve/<device>/bench_serve.json
    python benchmarks/bench_serve.py --dry-run --out /tmp/serve.json     # CPU, a few seconds per side
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_gpu  # noqa: E402  (versions, host_info, MEAN, STD)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="a directory of JPEGs (searched recursively); default: generated images")
    p.add_argument("--images", type=int, default=1024, help="how many JPEGs every side cycles through")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--client-procs", type=int, default=8, help="processes the clients are spread over")
    p.add_argument("--seconds", type=float, default=15.0, help="each timed window")
    p.add_argument("--warmup-seconds", type=float, default=5.0)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--queue-delay-us", type=int, default=500)
    p.add_argument("--instances", type=int, default=1, help="model instances (instance_group count) the server runs")
    p.add_argument("--variant-instances", type=int, default=4,
                   help="model instances of the *_instances sides (default 4; 2 with --dry-run)")
    p.add_argument("--device", default=None, help="cuda:N or cpu (default cuda:0 where there is CUDA)")
    p.add_argument("--threads", type=int, default=8, help="DALI's CPU threads")
    p.add_argument("--only", default=",".join([*SERVER_SIDES, *INPROCESS_SIDES, "dali", "dali_batch1"]))
    p.add_argument("--dry-run", action="store_true", help="CPU, a few images and seconds: every code path")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.dry_run:
        args.images, args.clients, args.client_procs = min(args.images, 32), min(args.clients, 8), 2
        args.seconds, args.warmup_seconds, args.device = min(args.seconds, 2.0), min(args.warmup_seconds, 1.0), "cpu"
        args.variant_instances = min(args.variant_instances, 2)
    unknown = set(args.only.split(",")) - {*SERVER_SIDES, *INPROCESS_SIDES, "dali", "dali_batch1"}
    if unknown:
        p.error(f"--only: unknown side(s) {', '.join(sorted(unknown))}")
    return args


def load_jpegs(args) -> list[bytes]:
    if args.data:
        paths = sorted(p for p in Path(args.data).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
        if not paths:
            raise SystemExit(f"no JPEGs under {args.data}")
        return [paths[k % len(paths)].read_bytes() for k in range(args.images)]
    import numpy as np
    from PIL import Image
    out = []
    rng = np.random.default_rng(0)
    for k in range(args.images):
        h, w = int(rng.integers(300, 500)), int(rng.integers(300, 500))
        pixels = (rng.random((h // 8, w // 8, 3)) * 255).astype(np.uint8)   # smooth enough to compress like a photo
        buf = io.BytesIO()
        Image.fromarray(pixels).resize((w, h)).save(buf, format="JPEG", quality=85)
        out.append(buf.getvalue())
    return out


def spec_text(fp16: bool = False) -> str:
    """The served spec; ``fp16``: Normalize outputs float16 (half the bytes of every answer)."""
    import torch
    from ingest.ops import CenterCrop, Normalize, Resize, dumps
    return dumps([Resize(256), CenterCrop(224), Normalize(mean=bench_gpu.MEAN, std=bench_gpu.STD,
                                                          dtype=torch.float16 if fp16 else torch.float32)])


def percentiles(latencies: list[float]) -> dict:
    import numpy as np
    if not latencies:
        return {}
    ms = np.asarray(latencies) * 1e3
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "mean_ms": round(float(ms.mean()), 3), "requests": int(ms.size)}


# -- the server side ------------------------------------------------------------------------------------
#: The largest difference (normalized units; about 1/58 per pixel level) a CUDA region's answer may have from the
#: payload's for the same image: the hardware and CUDA JPEG decoders differ by a few levels.
CHECK_TOLERANCE = 0.25
#: A CUDA-region client sends its first image again every this many requests and reads the answer back against
#: the payload's (answers under load, not only the first).
CHECK_EVERY = 16


def _unregister(unregister, key: str) -> None:
    """``unregister(key)`` (tritonclient's unregister of a shared memory region), retried: the server lets go of a
    region a moment after the last answer."""
    for _ in range(50):
        try:
            unregister(key)
            return
        except Exception:   # noqa: BLE001 - tritonclient's "currently in use"
            time.sleep(0.02)


class _CudaRegion:
    """A client's CUDA shared memory region: ``nbytes`` of ``cudaMalloc`` on GPU ``device`` (CuPy), registered
    with the server under ``key`` by its IPC handle; `difference` checks the answer it holds."""

    def __init__(self, client, key: str, nbytes: int, device: int):
        import base64
        import cupy
        self.cupy, self.client, self.key, self.device = cupy, client, key, device
        with cupy.cuda.Device(device):
            self.ptr = cupy.cuda.runtime.malloc(nbytes)
            handle = cupy.cuda.runtime.ipcGetMemHandle(self.ptr)
        client.register_cuda_shared_memory(key, base64.b64encode(bytes(handle)), device, nbytes)

    def difference(self, expected) -> float:
        """The largest difference between the answer in the region (copied to the host) and ``expected`` (the
        gRPC payload's for the same image)."""
        import numpy as np
        got = np.empty(expected.shape, expected.dtype)
        with self.cupy.cuda.Device(self.device):
            self.cupy.cuda.runtime.memcpy(got.ctypes.data, self.ptr, got.nbytes, 2)   # device to host
        return float(np.abs(got.astype(np.float32) - expected.astype(np.float32)).max())

    def close(self) -> None:
        _unregister(self.client.unregister_cuda_shared_memory, self.key)
        with self.cupy.cuda.Device(self.device):
            self.cupy.cuda.runtime.free(self.ptr)


def _client_proc(port: int, threads: int, jpegs: list[bytes], warmup: float, seconds: float, offset: int,
                 queue: mp.Queue, shm: bool = False, fp16: bool = False, cuda_shm: int | None = None) -> None:
    """``threads`` gRPC clients in this process: warm up, then time ``seconds`` of requests (errors counted,
    the first few distinct messages kept). With ``shm`` each
    client receives IMAGES in a system shared memory region of its own, registered with the server (the
    answer travels without the gRPC payload) and read there as an array; with ``cuda_shm`` (a GPU index) in a
    CUDA shared memory region of its own on that GPU (`_CudaRegion`): each answer's shape and dtype are checked
    from the response, and the first answer's pixels against the gRPC payload's for the same image, which is sent
    again every `CHECK_EVERY` requests and read back (the two may come from different decoders, the hardware's
    and the CUDA one, as the dynamic batch falls: their largest difference is reported, and one beyond
    `CHECK_TOLERANCE` is an error)."""

    def note(err: Exception) -> None:
        text = f"{type(err).__name__}: {err}"[:300]
        if text not in messages and len(messages) < 3:
            messages.append(text)
    import os
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.utils.shared_memory as shmutils
    results: list = []
    diffs: list[float] = []      # the CUDA region's first answer against the payload's, per client
    messages: list[str] = []     # the first few distinct errors, for the report
    dtype = np.float16 if fp16 else np.float32
    out_bytes = 3 * 224 * 224 * np.dtype(dtype).itemsize
    wire = {np.float16: "FP16", np.float32: "FP32"}[dtype]

    def request(k: int) -> list:
        x = np.frombuffer(jpegs[k % len(jpegs)], np.uint8)[None]
        tensor = grpcclient.InferInput("ENCODED", list(x.shape), "UINT8")
        tensor.set_data_from_numpy(x)
        return [tensor]

    def loop(t: int) -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        outputs, region, image, cuda = None, None, None, None
        key = f"bench_serve_{os.getpid()}_{t}"
        if shm or cuda_shm is not None:
            outputs = [grpcclient.InferRequestedOutput("IMAGES")]
            outputs[0].set_shared_memory(key, out_bytes)
        if shm:
            region = shmutils.create_shared_memory_region(key, "/" + key, out_bytes)
            client.register_system_shared_memory(key, "/" + key, out_bytes)
        lat, errors, k, sent, expected = [], 0, offset + t, 0, None
        first = k
        if cuda_shm is not None:
            cuda = _CudaRegion(client, key, out_bytes, cuda_shm)
            try:   # the region holds what the payload holds
                expected = client.infer("preprocess", request(first)).as_numpy("IMAGES")
                client.infer("preprocess", request(first), outputs=outputs)
                diffs.append(cuda.difference(expected))
                if diffs[-1] > CHECK_TOLERANCE:
                    raise ValueError(f"the CUDA region's answer differs from the payload's by {diffs[-1]:.3f}")
            except Exception as err:   # noqa: BLE001 - counted
                errors += 1
                note(err)
        start = time.perf_counter()
        timed_from, end = start + warmup, start + warmup + seconds
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            sent += 1
            check = expected is not None and sent % CHECK_EVERY == 0   # the first image again, read back
            try:
                result = client.infer("preprocess", request(first if check else k), outputs=outputs)
                if cuda is not None:   # the answer stays on the device: its description is checked
                    answer = result.get_output("IMAGES")
                    ok = tuple(answer.shape) == (1, 3, 224, 224) and answer.datatype == wire
                else:
                    if shm:
                        image = shmutils.get_contents_as_numpy(region, dtype, result.get_output("IMAGES").shape)
                    else:
                        image = result.as_numpy("IMAGES")
                    ok = image.shape == (1, 3, 224, 224) and image.dtype == dtype
                done = time.perf_counter()
                if ok and check:   # (read back outside the request's latency)
                    diffs.append(cuda.difference(expected))
                    ok = diffs[-1] <= CHECK_TOLERANCE
                    if not ok:
                        note(ValueError(f"an answer under load differs from the payload's by {diffs[-1]:.3f}"))
                errors += not ok
            except Exception as err:   # noqa: BLE001 - counted; the run goes on
                errors, ok, done = errors + 1, False, time.perf_counter()
                note(err)
            if now >= timed_from and ok:   # img/s and latency count answered requests only
                lat.append(done - now)
            k += 97
        results.append((lat, errors))
        if shm:
            del image   # a view of the region: it cannot be closed while one is alive
            _unregister(client.unregister_system_shared_memory, key)
            shmutils.destroy_shared_memory_region(region)
        if cuda is not None:
            cuda.close()
        client.close()

    workers = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    queue.put(([x for lat, _ in results for x in lat], sum(e for _, e in results), diffs, messages))


def load_run(port: int, clients: int, procs: int, jpegs: list[bytes], args, shm: bool = False,
             fp16: bool = False, cuda_shm: int | None = None) -> dict:
    procs = max(1, min(procs, clients))
    queue: mp.Queue = mp.get_context("spawn").Queue()
    ctx = mp.get_context("spawn")
    children = [ctx.Process(target=_client_proc, args=(port, clients // procs + (p < clients % procs), jpegs,
                                                       args.warmup_seconds, args.seconds, p * 1009, queue, shm,
                                                       fp16, cuda_shm))
                for p in range(procs)]
    for c in children:
        c.start()
    latencies, errors, checks, notes = [], 0, [], []
    for _ in children:
        lat, err, diffs, messages = queue.get(timeout=args.warmup_seconds + args.seconds + 300)
        latencies += lat
        errors += err
        checks += diffs
        notes += [m for m in messages if m not in notes]
    for c in children:
        c.join()
    out = {"img_s": round(len(latencies) / args.seconds, 1), "errors": errors, "clients": clients,
           **percentiles(latencies)}
    if notes:
        out["error_messages"] = notes[:5]
    if checks:
        out["check_max_abs_diff"] = round(max(checks), 4)
    return out


def model_stats(port: int) -> dict:
    """Triton's statistics of the ``preprocess`` model (its statistics extension, over gRPC), as numbers."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        (doc,) = client.get_inference_statistics("preprocess", as_json=True)["model_stats"]
    finally:
        client.close()
    return doc


def stats_between(before: dict, after: dict) -> dict:
    """Where the server's time went between two `model_stats`: the mean dynamic batch, each request's wait in
    the batcher, and per batch (one ``execute``) the Python backend's three steps: compute_input (the requests
    into shared memory), compute_infer (``execute`` in the stub, its reply included), compute_output (the
    outputs into the server's response buffers: device outputs copied out by the stub, then copied again)."""
    def total(doc: dict, *keys: str) -> int:
        for key in keys:
            doc = doc.get(key, {})
        return int(doc or 0)

    def batched(doc: dict, step: str) -> tuple[int, int]:
        rows = doc.get("batch_stats", [])
        return (sum(total(r, step, "count") for r in rows), sum(total(r, step, "ns") for r in rows))
    requests = total(after, "inference_count") - total(before, "inference_count")
    batches = total(after, "execution_count") - total(before, "execution_count")
    if not batches:
        return {}
    out = {"requests": requests, "batches": batches, "mean_batch": round(requests / batches, 2)}
    waits = total(after, "inference_stats", "queue", "count") - total(before, "inference_stats", "queue", "count")
    if waits:
        out["queue_ms_per_request"] = round((total(after, "inference_stats", "queue", "ns")
                                             - total(before, "inference_stats", "queue", "ns")) / waits / 1e6, 3)
    for step in ("compute_input", "compute_infer", "compute_output"):
        (n1, ns1), (n0, ns0) = batched(after, step), batched(before, step)
        if n1 > n0:
            out[f"{step}_ms_per_batch"] = round((ns1 - ns0) / (n1 - n0) / 1e6, 3)
    return out


#: What each server side changes from ``serve`` (every side starts its own server): ``batch1`` (one client, one
#: request at a time), ``queue_delay_us`` (the batcher's, instead of ``--queue-delay-us``), ``output_memory``,
#: ``instances`` (True: ``--variant-instances``), ``fp16`` (the spec's
#: Normalize outputs float16), ``shm`` (clients receive IMAGES in Triton system shared memory regions),
#: ``cuda_shm`` (in CUDA shared memory regions on the server's GPU; the side needs a GPU instance),
#: ``null`` (`NULL_MODEL`: no preprocessing at all, the transport's ceiling).
SERVER_SIDES = {
    "serve": {},
    "serve_batch1": {"batch1": True},
    "serve_batch1_delay0": {"batch1": True, "queue_delay_us": 0},
    "serve_host_outputs": {"output_memory": "host"},
    "serve_null": {"null": True},
    "serve_instances": {"instances": True},
    "serve_null_instances": {"null": True, "instances": True},
    "serve_fp16": {"fp16": True},
    "serve_shm": {"shm": True},
    "serve_instances_fp16_shm": {"instances": True, "fp16": True, "shm": True},
    "serve_cuda_shm": {"cuda_shm": True},
    "serve_null_cuda_shm": {"null": True, "cuda_shm": True},
    "serve_instances_fp16_cuda_shm": {"instances": True, "fp16": True, "cuda_shm": True},
    "serve_instances_cuda_shm": {"instances": True, "cuda_shm": True},
    "serve_null_instances_cuda_shm": {"null": True, "instances": True, "cuda_shm": True},
}

#: The ``null`` sides' model: every request answered with one preallocated [1, 3, 224, 224] image of the
#: output dtype on the instance's device, handed over as the served model hands its own (DLPack).
NULL_MODEL = '''"""bench_serve's transport ceiling: no decode, no ops; one preallocated image per request."""
import json

import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        dtype = {"TYPE_FP16": torch.float16}.get(config["output"][0]["data_type"], torch.float32)
        cuda = args.get("model_instance_kind") == "GPU" and torch.cuda.is_available()
        device = torch.device("cuda", int(args.get("model_instance_device_id") or 0)) if cuda else "cpu"
        if cuda:
            torch.cuda.set_device(device)
        self.image = torch.zeros((1, 3, 224, 224), dtype=dtype, device=device)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor.from_dlpack("IMAGES", torch.utils.dlpack.to_dlpack(self.image))]) for _ in requests]
'''


def server_side(args, jpegs: list[bytes], name: str) -> dict:
    """One server side of `SERVER_SIDES`: its own server and model repository, ``--clients`` clients (one for
    the ``batch1`` sides); with Triton's statistics over the clients' run, their warm-up included
    (``server_stats``), and the model's own account of ``execute`` over the same run less each instance's
    first 10 batches (``backend_timings``, `read_timings`)."""
    import os
    from ingest.serve import TritonServer, export
    from ingest.serve.server import gpu_options
    import torch
    side = SERVER_SIDES[name]
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    kind, gpus = ("KIND_CPU", []) if device == "cpu" else ("KIND_GPU", [torch.device(device).index or 0])
    if side.get("cuda_shm") and not gpus:
        return {"skipped": "CUDA shared memory answers need a GPU instance"}
    instances = args.variant_instances if side.get("instances") else args.instances
    output_memory = side.get("output_memory", "device")
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    repo, timings = work / "repo", work / "timings"   # the repository holds models only
    timings.mkdir()
    queue_delay_us = side.get("queue_delay_us", args.queue_delay_us)
    model_dir = export(spec_text(side.get("fp16", False)), repo, kind=kind, gpus=gpus, instances=instances,
                       max_batch_size=args.max_batch_size, queue_delay_us=queue_delay_us, output_memory=output_memory)
    if side.get("null"):
        (model_dir / "1" / "model.py").write_text(NULL_MODEL)
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    clients, procs = (1, 1) if side.get("batch1") else (args.clients, args.client_procs)
    saved = os.environ.get("INGEST_SERVE_TIMINGS")
    os.environ["INGEST_SERVE_TIMINGS"] = str(timings)   # the server's environment is this process's
    try:
        with TritonServer(repo, http_port=ports[0], grpc_port=ports[1], options=gpu_options(gpus)) as server:
            before = model_stats(ports[1])
            out = load_run(ports[1], clients, procs, jpegs, args, shm=side.get("shm", False),
                           fp16=side.get("fp16", False), cuda_shm=gpus[0] if side.get("cuda_shm") else None)
            out.update(server_stats=stats_between(before, model_stats(ports[1])), device=device,
                       output_memory=output_memory, instances=instances,
                       queue_delay_us=queue_delay_us, output_dtype="float16" if side.get("fp16") else "float32",
                       server_rss_mb=server.rss_bytes() >> 20,
                       answers="cuda_shm" if side.get("cuda_shm") else "shm" if side.get("shm") else "grpc")
        if not side.get("null"):
            out["backend_timings"] = read_timings(timings)
    finally:
        if saved is None:
            os.environ.pop("INGEST_SERVE_TIMINGS", None)
        else:
            os.environ["INGEST_SERVE_TIMINGS"] = saved
        shutil.rmtree(work, ignore_errors=True)
    return out


def read_timings(directory: Path) -> dict:
    """The served model's ``execute`` steps (`ingest.serve.backend.Timings` files, every instance's added
    up): ms per batch of each step and the mean batch."""
    docs = [json.loads(p.read_text()) for p in directory.glob("*.json")]
    batches = sum(d["batches"] for d in docs)
    if not batches:
        return {}
    steps: dict = {}
    for d in docs:
        for step, seconds in d["seconds"].items():
            steps[step] = steps.get(step, 0.0) + seconds
    return {"batches": batches, "mean_batch": round(sum(d["items"] for d in docs) / batches, 2),
            **{f"{step}_ms_per_batch": round(s / batches * 1e3, 3) for step, s in steps.items()}}


# -- in-process sides -----------------------------------------------------------------------------------
def timed(run_batch, batches: list, args) -> tuple[int, float, list[float]]:
    """Run ``run_batch`` over ``batches`` in turn: warm-up, then ``--seconds``; (images, seconds, per-call s)."""
    start = time.perf_counter()
    k = 0
    while time.perf_counter() - start < args.warmup_seconds:
        run_batch(batches[k % len(batches)])
        k += 1
    images, calls, t0 = 0, [], time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        t = time.perf_counter()
        images += run_batch(batches[k % len(batches)])
        calls.append(time.perf_counter() - t)
        k += 1
    return images, time.perf_counter() - t0, calls


#: The in-process sides and their batch (None: ``--max-batch-size``): the served preprocessing at the server's
#: largest batch, at about the dynamic batch 64 clients make of one instance, and one image at a time.
INPROCESS_SIDES = {"inprocess": None, "inprocess_batch16": 16, "inprocess_batch1": 1}


def inprocess_side(args, jpegs: list[bytes], batch: int | None = None) -> dict:
    """`ingest.serve.Preprocessor` called in-process on ``batch`` images a call (``--max-batch-size`` by
    default), waited for: img/s, and per call p50/p99 for batch 1."""
    import numpy as np
    import torch
    from ingest.serve import Preprocessor
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    batch = batch or args.max_batch_size
    pre = Preprocessor(spec_text(), device=device)
    arrays = [np.frombuffer(j, np.uint8) for j in jpegs]
    batches = [[arrays[(i + j) % len(arrays)] for j in range(batch)] for i in range(0, max(len(arrays), batch), batch)]

    def run(items) -> int:
        out = pre.run(items)
        if device != "cpu":
            torch.cuda.synchronize()
        return sum(o.error is None for o in out)
    try:
        images, seconds, calls = timed(run, batches, args)
    finally:
        pre.close()
    return {"img_s": round(images / seconds, 1), "batch": batch, "device": device,
            **(percentiles(calls) if batch == 1 else {})}


def dali_side(args, jpegs: list[bytes], batch: int) -> dict:
    """DALI's pipeline on ``batch`` images a call: on the GPU ("mixed" decoder, then device ops), or without
    CUDA the same operators with the CPU decoder and no device (so every operator and argument has run)."""
    import numpy as np
    import torch
    from nvidia.dali import fn, pipeline_def, types
    cuda = (args.device or "cuda:0") != "cpu" and torch.cuda.is_available()
    device_id = (torch.device(args.device).index or 0) if cuda and args.device else 0
    arrays = [np.frombuffer(j, np.uint8) for j in jpegs]
    batches = [[arrays[(i + j) % len(arrays)] for j in range(batch)] for i in range(0, max(len(arrays), batch), batch)]
    feed = {"k": 0}

    def source():
        b = batches[feed["k"] % len(batches)]
        feed["k"] += 1
        return b

    @pipeline_def
    def pipe():
        encoded = fn.external_source(source=source, dtype=types.UINT8)
        images = fn.decoders.image(encoded, device="mixed" if cuda else "cpu", output_type=types.RGB)
        images = fn.resize(images, resize_shorter=256)
        return fn.crop_mirror_normalize(images, crop=(224, 224), dtype=types.FLOAT, output_layout="CHW",
                                        mean=bench_gpu.MEAN, std=bench_gpu.STD)

    # batches: two in flight (DALI's default, its best throughput); batch-1 latency: one at a time
    p = pipe(batch_size=batch, num_threads=args.threads, device_id=device_id if cuda else None,
             prefetch_queue_depth=1 if batch == 1 else 2)
    p.build()

    def run(_) -> int:
        (out,) = p.run()
        if cuda:
            torch.cuda.synchronize(device_id)   # DALI's stream included: the batch is complete
        if len(out) != batch or tuple(out[0].shape()) != (3, 224, 224):
            raise RuntimeError(f"DALI gave {len(out)} images of shape {out[0].shape()}")
        return batch
    images, seconds, calls = timed(run, [None], args)
    return {"img_s": round(images / seconds, 1), "batch": batch, "device": f"cuda:{device_id}" if cuda else "cpu",
            **(percentiles(calls) if batch == 1 else {})}


def _guard(fn) -> dict:
    try:
        return fn()
    except Exception as err:   # noqa: BLE001 - a side that cannot run is recorded, the others go on
        return {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-2000:]}


def derive(results: dict) -> dict:
    """Each server side over DALI (``<side>_over_dali``; the target: ``serve`` >= 0.8, ``serve_meets_0_8``, and
    ``best_over_dali``, the best server side that preprocesses), ``serve`` over in-process, each side over its
    transport ceiling (``serve_over_null``, ``serve_instances_over_null_instances``) and the latencies."""
    def rate(key):
        return results.get(key, {}).get("img_s")
    out = {}
    served = [k for k, side in SERVER_SIDES.items() if not side.get("batch1") and not side.get("null") and rate(k)]
    if rate("dali"):
        for key in served:
            out[f"{key}_over_dali"] = round(rate(key) / rate("dali"), 3)
        if rate("serve"):
            out["serve_meets_0_8"] = out["serve_over_dali"] >= 0.8
        if served:
            best = max(served, key=rate)
            out["best"], out["best_over_dali"] = best, round(rate(best) / rate("dali"), 3)
    if rate("serve") and rate("inprocess"):
        out["serve_over_inprocess"] = round(rate("serve") / rate("inprocess"), 3)
    for key, ceiling in (("serve", "serve_null"), ("serve_instances", "serve_null_instances"),
                         ("serve_cuda_shm", "serve_null_cuda_shm"),
                         ("serve_instances_cuda_shm", "serve_null_instances_cuda_shm")):
        if rate(key) and rate(ceiling):
            out[f"{key}_over_{ceiling.removeprefix('serve_')}"] = round(rate(key) / rate(ceiling), 3)
    if rate("serve_host_outputs") and rate("serve"):
        out["serve_host_outputs_over_serve"] = round(rate("serve_host_outputs") / rate("serve"), 3)
    for key in ("serve_batch1", "serve_batch1_delay0", "inprocess_batch1", "dali_batch1", "serve"):
        for stat in ("p50_ms", "p99_ms"):
            if stat in results.get(key, {}):
                out[f"{key}_{stat}"] = results[key][stat]
    return out


def device_name(args) -> str:
    import torch
    if args.dry_run or args.device == "cpu" or not torch.cuda.is_available():
        return "cpu (dry run)" if args.dry_run else "cpu"
    return torch.cuda.get_device_name(torch.device(args.device or "cuda:0").index or 0)


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    jpegs = load_jpegs(args)
    results: dict = {}
    report = {"benchmark": "bench_serve", "device": device_name(args), "config": vars(args),
              "pipeline": "JPEG -> resize shorter 256 -> center crop 224 -> normalize float32 CHW",
              "images": {"count": len(jpegs), "mean_bytes": int(sum(map(len, jpegs)) / max(len(jpegs), 1))},
              "versions": bench_gpu.versions(), "host": bench_gpu.host_info(), "results": results}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        report["derived"] = derive(results)
        report["wall_seconds"] = round(time.perf_counter() - started, 1)
        out.write_text(json.dumps(report, indent=1))

    chosen = args.only.split(",")
    try:
        for name, batch in INPROCESS_SIDES.items():
            if name in chosen:
                results[name] = _guard(lambda: inprocess_side(args, jpegs, batch))
                write()
        if "dali" in chosen:
            results["dali"] = _guard(lambda: dali_side(args, jpegs, args.max_batch_size))
            write()
        if "dali_batch1" in chosen:
            results["dali_batch1"] = _guard(lambda: dali_side(args, jpegs, 1))
            write()
        for name in SERVER_SIDES:
            if name in chosen:
                results[name] = _guard(lambda: server_side(args, jpegs, name))
                write()
    except KeyboardInterrupt:   # `timeout -s INT`: the server is stopped on the way out; what finished is kept
        report["interrupted"] = True
        write()
        raise
    write()
    for key, res in results.items():
        line = res.get("error") or res.get("skipped") or " ".join(
            f"{k}={res[k]}" for k in ("img_s", "p50_ms", "p99_ms", "errors") if k in res)
        print(f"{key:14s} {line}")
    print("derived:", report["derived"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
