"""`ingest serve` under load against the same preprocessing run in-process by DALI on the same bytes.

The pipeline (both sides): decode a JPEG, resize the shorter side to 256, centre-crop 224, ImageNet
normalisation to float32 CHW. The same ``--images`` JPEGs (from ``--data``, e.g. make_data.py's set; or
generated) are held in memory by every side.

- ``serve``: `ingest serve`'s model on the real Triton server (nvidia-pytriton's), ``--clients`` concurrent
  gRPC clients (spread over ``--client-procs`` processes, each request one image) for ``--seconds``: img/s and
  the request latency's p50/p99 under that load, and ``server_stats``: Triton's own account of the run (mean
  dynamic batch, time in the batcher's queue, and per batch the Python backend's input, execute and output
  steps; `stats_between`), which says whether the server waited on its batcher, its model or its copies;
- ``serve_batch1``: one client, one request at a time (batch-1 load): p50/p99 latency (and its ``server_stats``);
- ``serve_host_outputs``: ``serve`` with the model exported ``output_memory="host"``: a GPU batch's images
  copied to pinned host memory in one copy, instead of a device tensor per request that the Python backend
  copies out one at a time (on the CPU, the same model as ``serve``);
- ``inprocess``: the served model's preprocessing (`ingest.serve.Preprocessor`) called in-process on batches
  of ``--max-batch-size``: img/s, what the server wraps;
- ``dali`` / ``dali_batch1``: DALI's pipeline (external_source, mixed decoder, resize, crop_mirror_normalize)
  in-process on batches of ``--max-batch-size`` (img/s, the ceiling) and of 1 (p50/p99 per image); without
  CUDA (``--dry-run``) the same pipeline with the CPU decoder and no device;
- derived: ``serve_over_dali`` (the target: >= 0.8, ``serve_meets_0_8``), ``serve_over_inprocess``, and the
  batch-1 latencies of the server and of DALI.

The report is rewritten after each side, so a run stopped part-way keeps the sides it finished.

    python benchmarks/bench_serve.py --data /dev/shm/ingest_bench_20k --out benchmarks/results/bench_serve/<device>/bench_serve.json
    python benchmarks/bench_serve.py --dry-run --out /tmp/serve.json     # CPU, a few seconds per side
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
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
    p.add_argument("--device", default=None, help="cuda:N or cpu (default cuda:0 where there is CUDA)")
    p.add_argument("--threads", type=int, default=8, help="DALI's CPU threads")
    p.add_argument("--only", default="serve,serve_batch1,serve_host_outputs,inprocess,dali,dali_batch1")
    p.add_argument("--dry-run", action="store_true", help="CPU, a few images and seconds: every code path")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.dry_run:
        args.images, args.clients, args.client_procs = min(args.images, 32), min(args.clients, 8), 2
        args.seconds, args.warmup_seconds, args.device = min(args.seconds, 2.0), min(args.warmup_seconds, 1.0), "cpu"
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


def spec_text() -> str:
    from ingest.ops import CenterCrop, Normalize, Resize, dumps
    return dumps([Resize(256), CenterCrop(224), Normalize(mean=bench_gpu.MEAN, std=bench_gpu.STD)])


def percentiles(latencies: list[float]) -> dict:
    import numpy as np
    if not latencies:
        return {}
    ms = np.asarray(latencies) * 1e3
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "mean_ms": round(float(ms.mean()), 3), "requests": int(ms.size)}


# -- the server side ------------------------------------------------------------------------------------
def _client_proc(port: int, threads: int, jpegs: list[bytes], warmup: float, seconds: float, offset: int,
                 queue: mp.Queue) -> None:
    """``threads`` gRPC clients in this process: warm up, then time ``seconds`` of requests."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    results: list = []

    def loop(t: int) -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        lat, errors, k = [], 0, offset + t
        start = time.perf_counter()
        timed_from, end = start + warmup, start + warmup + seconds
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            x = np.frombuffer(jpegs[k % len(jpegs)], np.uint8)[None]
            tensor = grpcclient.InferInput("ENCODED", list(x.shape), "UINT8")
            tensor.set_data_from_numpy(x)
            try:
                client.infer("preprocess", [tensor]).as_numpy("IMAGES")
                ok = True
            except Exception:   # noqa: BLE001 - counted; the run goes on
                errors, ok = errors + 1, False
            done = time.perf_counter()
            if now >= timed_from and ok:   # img/s and latency count answered requests only
                lat.append(done - now)
            k += 97
        client.close()
        results.append((lat, errors))

    workers = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    queue.put(([x for lat, _ in results for x in lat], sum(e for _, e in results)))


def load_run(port: int, clients: int, procs: int, jpegs: list[bytes], args) -> dict:
    procs = max(1, min(procs, clients))
    queue: mp.Queue = mp.get_context("spawn").Queue()
    ctx = mp.get_context("spawn")
    children = [ctx.Process(target=_client_proc, args=(port, clients // procs + (p < clients % procs), jpegs,
                                                       args.warmup_seconds, args.seconds, p * 1009, queue))
                for p in range(procs)]
    for c in children:
        c.start()
    latencies, errors = [], 0
    for _ in children:
        lat, err = queue.get(timeout=args.warmup_seconds + args.seconds + 300)
        latencies += lat
        errors += err
    for c in children:
        c.join()
    return {"img_s": round(len(latencies) / args.seconds, 1), "errors": errors, "clients": clients,
            **percentiles(latencies)}


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


def serve_sides(args, jpegs: list[bytes], results: dict, output_memory: str = "device") -> None:
    """The server sides chosen by ``--only``: ``serve`` and ``serve_batch1`` with `ingest serve`'s model (device
    outputs on a GPU), or with ``output_memory="host"`` ``serve_host_outputs`` (the batch copied to host once)."""
    from ingest.serve import TritonServer, export
    from ingest.serve.server import gpu_options
    import torch
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    kind, gpus = ("KIND_CPU", []) if device == "cpu" else ("KIND_GPU", [torch.device(device).index or 0])
    repo = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    export(spec_text(), repo, kind=kind, gpus=gpus, max_batch_size=args.max_batch_size,
           queue_delay_us=args.queue_delay_us, instances=args.instances, output_memory=output_memory)
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    with TritonServer(repo, http_port=ports[0], grpc_port=ports[1], options=gpu_options(gpus)) as server:
        def side(clients: int, procs: int) -> dict:
            before = model_stats(ports[1])
            out = load_run(ports[1], clients, procs, jpegs, args)
            return {**out, "server_stats": stats_between(before, model_stats(ports[1])), "device": device,
                    "output_memory": output_memory}
        chosen = args.only.split(",")
        if output_memory == "host":
            results["serve_host_outputs"] = _guard(lambda: side(args.clients, args.client_procs))
            return
        if "serve" in chosen:
            results["serve"] = _guard(lambda: {**side(args.clients, args.client_procs),
                                               "server_rss_mb": server.rss_bytes() >> 20})
        if "serve_batch1" in chosen:
            results["serve_batch1"] = _guard(lambda: side(1, 1))


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


def inprocess_side(args, jpegs: list[bytes]) -> dict:
    import numpy as np
    import torch
    from ingest.serve import Preprocessor
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    pre = Preprocessor(spec_text(), device=device)
    arrays = [np.frombuffer(j, np.uint8) for j in jpegs]
    batches = [arrays[i:i + args.max_batch_size] for i in range(0, len(arrays) - args.max_batch_size + 1,
                                                                 args.max_batch_size)] or [arrays]

    def run(batch) -> int:
        out = pre.run(batch)
        if device != "cpu":
            torch.cuda.synchronize()
        return sum(o.error is None for o in out)
    try:
        images, seconds, _ = timed(run, batches, args)
    finally:
        pre.close()
    return {"img_s": round(images / seconds, 1), "batch": args.max_batch_size, "device": device}


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
    def rate(key):
        return results.get(key, {}).get("img_s")
    out = {}
    if rate("serve") and rate("dali"):
        out["serve_over_dali"] = round(rate("serve") / rate("dali"), 3)
        out["serve_meets_0_8"] = out["serve_over_dali"] >= 0.8
    if rate("serve") and rate("inprocess"):
        out["serve_over_inprocess"] = round(rate("serve") / rate("inprocess"), 3)
    if rate("serve_host_outputs") and rate("dali"):
        out["serve_host_outputs_over_dali"] = round(rate("serve_host_outputs") / rate("dali"), 3)
    if rate("serve_host_outputs") and rate("serve"):
        out["serve_host_outputs_over_serve"] = round(rate("serve_host_outputs") / rate("serve"), 3)
    for key in ("serve_batch1", "dali_batch1", "serve"):
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
        if {"serve", "serve_batch1"} & set(chosen):
            err = _guard(lambda: serve_sides(args, jpegs, results) or {})
            if err.get("error"):
                results["serve"] = err
            write()
        if "serve_host_outputs" in chosen:
            err = _guard(lambda: serve_sides(args, jpegs, results, output_memory="host") or {})
            if err.get("error"):
                results["serve_host_outputs"] = err
            write()
        if "inprocess" in chosen:
            results["inprocess"] = _guard(lambda: inprocess_side(args, jpegs))
            write()
        if "dali" in chosen:
            results["dali"] = _guard(lambda: dali_side(args, jpegs, args.max_batch_size))
            write()
        if "dali_batch1" in chosen:
            results["dali_batch1"] = _guard(lambda: dali_side(args, jpegs, 1))
    except KeyboardInterrupt:   # `timeout -s INT`: the server is stopped on the way out; what finished is kept
        report["interrupted"] = True
        write()
        raise
    write()
    for key, res in results.items():
        line = res.get("error") or " ".join(f"{k}={res[k]}" for k in ("img_s", "p50_ms", "p99_ms", "errors")
                                            if k in res)
        print(f"{key:14s} {line}")
    print("derived:", report["derived"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
