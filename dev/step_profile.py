"""Developer script (device machine): where a training step's GPU time goes when a loader feeds it.
ResNet-18 (bench_gpu.py's step) trained on one feed's batches in a plain loop: ``synthetic`` (one fixed batch),
``ingest`` (bench_gpu's Loader, INGEST_* settings from the environment) or ``dali`` (bench_gpu's pipeline).

Unprofiled: img/s, bench_gpu's ``gpu_timeline`` (GPU step span and stall) and the loop thread's CPU time per
step. Then K steps under torch.profiler (CUPTI): the training stream's kernels (the stream most of the loop
thread's launches went to) against everything else on the GPU, per step:
- ``train_kernel_ms``: the sum of the training stream's kernel times. It grows over synthetic's when other
  work shares the SMs or memory (GPU contention);
- ``train_idle_ms``: the training stream's idle time inside its window (first kernel to last):
  the data stall between steps plus gaps while its kernels were not launched yet (CPU or GIL contention);
- ``other_kernel_ms`` and ``other_overlap_ms``: other streams' kernel and copy time, and how much of it ran
  while a training kernel ran.

Usage: python dev/step_profile.py DATA_DIR FEED OUT.json [--steps 30] [--seconds 8] [--torchvision-first]
"""

import argparse
import importlib
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_gpu  # noqa: E402


CONV = re.compile(r"conv|cudnn|xmma|wgrad|dgrad", re.I)


def union_ms(spans: list[tuple[float, float]]) -> float:
    """Total length (ms) of the union of [start, end) spans given in microseconds."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total / 1000


def overlap_ms(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length (ms) of the intersection of the unions of two span lists (microseconds)."""
    def merged(spans):
        out = []
        for s, e in sorted(spans):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out
    x, y, i, j, total = merged(a), merged(b), 0, 0, 0.0
    while i < len(x) and j < len(y):
        total += max(0.0, min(x[i][1], y[j][1]) - max(x[i][0], y[j][0]))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total / 1000


def analyse(trace_path: str, loop_tid: int, steps: int) -> dict:
    events = json.load(open(trace_path))["traceEvents"]
    launcher = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launcher[e["args"]["correlation"]] = e.get("tid")
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    by_loop = Counter(e["args"].get("stream") for e in gpu if launcher.get(e["args"].get("correlation")) == loop_tid)
    found = "launched by the loop thread"
    if not by_loop:  # the trace names threads otherwise: the stream of the model's convolutions
        by_loop = Counter(e["args"].get("stream") for e in gpu if CONV.search(e.get("name", "")))
        found = "convolution kernels"
    if not by_loop:
        return {"error": f"found no training stream: no kernel launched by tid {loop_tid}, none named like a conv"}
    stream = by_loop.most_common(1)[0][0]
    train = [(e["ts"], e["ts"] + e["dur"]) for e in gpu if e["args"].get("stream") == stream and e["cat"] == "kernel"]
    other = [(e["ts"], e["ts"] + e["dur"]) for e in gpu if e["args"].get("stream") != stream]
    window = max(e for _, e in train) - min(s for s, _ in train)
    busy = union_ms(train)
    streams = Counter(e["args"].get("stream") for e in gpu if e["args"].get("stream") != stream)
    return {
        "steps": steps, "training_stream": stream, "training_stream_found_by": found,
        "other_streams": dict(streams.most_common(8)),
        "train_kernels_per_step": round(len(train) / steps, 1),
        "train_kernel_ms": round(sum(e - s for s, e in train) / 1000 / steps, 3),
        "train_busy_ms": round(busy / steps, 3),
        "train_idle_ms": round((window / 1000 - busy) / steps, 3),
        "other_kernel_ms": round(sum(e - s for s, e in other) / 1000 / steps, 3),
        "other_busy_ms": round(union_ms(other) / steps, 3),
        "other_overlap_ms": round(overlap_ms(train, other) / steps, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("feed", choices=("synthetic", "ingest", "dali"))
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="DALI's num_threads")
    p.add_argument("--torchvision-first", action="store_true",
                   help="import torchvision before ingest (see ingest.decode._nvjpeg); by default ingest comes first")
    a = p.parse_args()
    for name in (["torchvision"] if a.torchvision_first else []) + ["ingest"]:
        importlib.import_module(name)
    dev = torch.device("cuda", 0)
    args = argparse.Namespace(model="resnet18", batch=256, data=a.data, ingest_workers=None, prefetch=2,
                              threads=a.threads)
    step, _ = bench_gpu.make_step(dev, args)
    if a.feed == "synthetic":
        g = torch.Generator().manual_seed(0)
        x0 = torch.randn(256, 3, 224, 224, generator=g).to(dev)
        y0 = torch.randint(0, 100, (256,), generator=g).to(dev)
        gen = iter(lambda: (x0, y0), None)
        feed = None
    else:
        feed = (bench_gpu.build_ingest(args, dev, "mixed") if a.feed == "ingest" else bench_gpu.build_dali(args, dev))
        gen = feed.endless()
    for _ in range(30):
        x, y = next(gen)
        step(x, y)
    torch.cuda.synchronize()
    marks, n, c0, t0 = [], 0, time.thread_time(), time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        x, y = next(gen)
        b, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        b.record()
        step(x, y)
        e.record()
        marks.append((b, e))
        n += 1
    torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    out = {"feed": a.feed, "device": torch.cuda.get_device_name(dev), "cores": os.cpu_count(),
           "imported_first": "torchvision" if a.torchvision_first else "ingest",
           "ingest_env": bench_gpu.ingest_env(),
           "img_s": round(n * 256 / wall), "loop_cpu_ms_per_step": round(cpu / n * 1000, 2),
           "loop_wall_ms_per_step": round(wall / n * 1000, 2), **bench_gpu.gpu_timeline(marks)}
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(a.steps):
            x, y = next(gen)
            step(x, y)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        out["profiled"] = analyse(path, threading.get_native_id(), a.steps)
    if feed is not None and feed.stats is not None:
        out["loader_stages"] = bench_gpu.loader_stats(feed.stats)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    os._exit(0)  # a DALI pipeline or loader threads left running must not hang the exit


if __name__ == "__main__":
    main()
