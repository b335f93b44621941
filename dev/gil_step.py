"""Developer script (device machine): does Python work beside a training loop lengthen its steps on the GPU?
ResNet-18 (bench_gpu.py's step) on one fixed batch: the GPU time per step and the stream's stall between steps
(bench_gpu's ``gpu_timeline``) alone, beside a pure-Python thread holding the GIL part of the time (busy W ms
every P ms), and beside the in-process Loader over DATA_DIR pulled by a thread of its own (the loader's Python,
GPU decode and ops, none of its batches used).

Usage: python dev/gil_step.py DATA_DIR > out.json
"""
import argparse
import json
import sys
import threading
import time
from pathlib import Path

import torch

import ingest  # noqa: F401 - before bench_gpu's model imports torchvision: ingest's nvJPEG first (ingest.decode._nvjpeg)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_gpu  # noqa: E402



def measure(step, x, y, seconds=6.0):
    for _ in range(10):
        step(x, y)
    torch.cuda.synchronize()
    marks, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        b, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        b.record()
        step(x, y)
        e.record()
        marks.append((b, e))
    torch.cuda.synchronize()
    el = time.perf_counter() - t0
    return {"img_s": round(len(marks) * 256 / el), **bench_gpu.gpu_timeline(marks)}


def busy(stop, work_ms, sleep_ms):
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < work_ms / 1000:
            pass
        time.sleep(sleep_ms / 1000)


def main() -> None:
    dev = torch.device("cuda", 0)
    args = argparse.Namespace(model="resnet18", batch=256, data=sys.argv[1], ingest_workers=None, prefetch=2)
    step, _ = bench_gpu.make_step(dev, args)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 3, 224, 224, generator=g).to(dev)
    y = torch.randint(0, 100, (256,), generator=g).to(dev)
    out = {"alone": measure(step, x, y)}
    for work, sleep in ((2, 8), (5, 15), (5, 5)):
        stop = threading.Event()
        th = threading.Thread(target=busy, args=(stop, work, sleep), daemon=True)
        th.start()
        out[f"busy_{work}ms_every_{work + sleep}ms"] = measure(step, x, y)
        stop.set()
        th.join()
    feed = bench_gpu.build_ingest(args, dev, "mixed")
    gen = feed.endless()
    stop = threading.Event()
    count, failed = [0], []

    def pull():
        # its own stream: on the default stream, which the training loop also uses, each hand-over would make the
        # training wait for the loader's batch and the loader's output bound wait for the training
        try:
            with torch.cuda.stream(torch.cuda.Stream(dev)):
                while not stop.is_set():
                    next(gen)
                    count[0] += 1
        except Exception as err:  # noqa: BLE001 - reported in the JSON: a dead loader thread measures nothing
            failed.append(f"{type(err).__name__}: {err}")

    th = threading.Thread(target=pull, daemon=True)
    th.start()
    time.sleep(3)
    c0, t0 = count[0], time.perf_counter()
    beside = out["beside_ingest_loader_pulled_by_a_thread"] = measure(step, x, y)
    beside["loader_img_s"] = round((count[0] - c0) * 256 / (time.perf_counter() - t0))
    stats = bench_gpu.loader_stats(feed.stats)
    beside["loader_stages"] = stats.get("stages") if isinstance(stats, dict) else stats
    if failed:
        beside["loader_error"] = failed[0]
    stop.set()
    th.join()
    out["alone_again"] = measure(step, x, y)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
