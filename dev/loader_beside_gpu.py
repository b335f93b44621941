"""Developer probe (device machine): the loader's rate beside GPU work that fills the device, and that work's rate
beside the loader. Does a training step starve the loader of the GPU, or the loader slow the step?

The GPU work runs on the main thread and needs almost no CPU and no GIL: bf16 8192^3 matrix products ("matmul":
bound by the tensor cores) or an in-place multiply over 2 GiB ("stream": bound by memory), synchronised every
four calls. The loader is bench_gpu's (mixed decode, RandomResizedCrop 224, flip, normalize; the engine the
``engine`` setting picks) over DATA_DIR, its batches taken as fast as they come on a second thread, on a stream
of its own that queues nothing, so each batch's slot goes back at once. Per round: the loader alone, then per
kind of work, the work alone and both together (``--seconds`` each); each figure is a rate and each "together"
one its ratio to the rate alone.

A loader whose batches take their time beside the work (its ratio far below the work's) spends it in GPU work
queued behind the work's kernels: in nvImageCodec's decode (its copies and per-image kernels run on streams it
makes, at the default priority) or in the loader's own kernels.

Usage: python dev/loader_beside_gpu.py DATA_DIR [--seconds 4] [--rounds 2] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def gpu_work_rate(call, seconds: float) -> float:
    """Calls of ``call`` (GPU work) per second over ``seconds``, synchronised every four calls and at the end."""
    import torch
    n = 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        call()
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="an ImageFolder JPEG tree (benchmarks/make_data.py)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import torch
    import bench_gpu
    dev = torch.device("cuda", 0)
    a, b = (torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) for _ in range(2))
    big = torch.ones(512 << 20, device=dev)
    work = {"matmul": lambda: torch.mm(a, b), "stream": lambda: big.mul_(1.0)}
    opts = argparse.Namespace(data=args.data, batch=args.batch, threads=len(os.sched_getaffinity(0)), prefetch=2,
                              ingest_workers=None)
    feed = bench_gpu.build_ingest(opts, dev, "mixed")
    batches = feed.endless()
    for _ in range(20):   # past the start
        next(batches)
    side = torch.cuda.Stream(dev)

    def loader_rate(stop: threading.Event, out: dict) -> None:
        torch.cuda.set_device(dev)
        n, t0 = 0, time.perf_counter()
        with torch.cuda.stream(side):
            while not stop.is_set():
                next(batches)
                n += 1
        out["img_s"] = args.batch * n / (time.perf_counter() - t0)

    def loader_alone() -> float:
        stop, out = threading.Event(), {}
        timer = threading.Timer(args.seconds, stop.set)
        timer.start()
        loader_rate(stop, out)
        return out["img_s"]

    def together(call) -> tuple[float, float]:
        stop, out = threading.Event(), {}
        thread = threading.Thread(target=loader_rate, args=(stop, out))
        thread.start()
        rate = gpu_work_rate(call, args.seconds)
        stop.set()
        thread.join()
        return out["img_s"], rate

    for call in work.values():   # cuBLAS's and the allocator's first calls out of the figures
        gpu_work_rate(call, 0.5)
    rounds = []
    for r in range(args.rounds):
        row = {"loader_alone_img_s": round(loader_alone(), 1)}
        for name, call in work.items():
            alone = gpu_work_rate(call, args.seconds)
            loader, beside = together(call)
            row[name] = {"alone_per_s": round(alone, 1), "beside_loader_per_s": round(beside, 1),
                         "work_ratio": round(beside / alone, 3), "loader_img_s": round(loader, 1),
                         "loader_ratio": round(loader / row["loader_alone_img_s"], 3)}
            print(f"round {r}: {name}: alone {alone:.1f}/s, beside the loader x{beside / alone:.3f}; loader "
                  f"{loader:.0f} img/s (x{loader / row['loader_alone_img_s']:.3f} of {row['loader_alone_img_s']:.0f})",
                  flush=True)
        rounds.append(row)
    stats = bench_gpu.loader_stats(feed.stats) if feed.stats is not None else None
    if feed.close is not None:
        feed.close()
    report = {"probe": "loader_beside_gpu", "device": torch.cuda.get_device_name(dev), "data": args.data,
              "batch": args.batch, "seconds": args.seconds, "engine": (stats or {}).get("engine"), "rounds": rounds}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
