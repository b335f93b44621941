"""Developer script (device machine): where the time of the fused GPU ops goes on the raw-shard path.

For a CUDA batch of B decoded SIZE x SIZE x 3 uint8 images, RandomResizedCrop 224 + Flip + Normalize fp16 by
``ingest.ops.run_ops``: img/s of back-to-back calls (wall, ending with a synchronise), the host time of one
call (how long the Python side takes to queue the batch), the GPU time of one call (CUDA events around it
after the GPU has gone idle), and torch.profiler's top CUDA kernels and host functions. Where host time
per call exceeds GPU time, the GPU waits on Python: per-batch overhead, not pixels.

Usage: python tools/profile_ops_gpu.py [--batch 512] [--size 256] [--reps 50] [--json FILE]
"""

import argparse
import json
import time

import numpy as np
import torch

from ingest.ops import Flip, Normalize, RandomResizedCrop, run_ops

MEAN, STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--json")
    args = p.parse_args()
    ops = [RandomResizedCrop(224), Flip(), Normalize(MEAN, STD, dtype=torch.float16)]
    images = torch.randint(0, 256, (args.batch, args.size, args.size, 3), dtype=torch.uint8, device="cuda")
    rng = np.random.default_rng(0)
    for _ in range(5):
        run_ops(ops, images, rng, device_kind="cuda")
    torch.cuda.synchronize()
    out = {"batch": args.batch, "size": args.size, "device": torch.cuda.get_device_name()}

    t0 = time.perf_counter()
    for _ in range(args.reps):
        run_ops(ops, images, rng, device_kind="cuda")
    torch.cuda.synchronize()
    out["img_per_s_back_to_back"] = round(args.reps * args.batch / (time.perf_counter() - t0), 1)

    host, gpu = [], []
    for _ in range(args.reps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        start.record()
        run_ops(ops, images, rng, device_kind="cuda")
        end.record()
        host.append(time.perf_counter() - t)
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end) / 1e3)
    out["host_ms_per_call"] = round(float(np.median(host)) * 1e3, 3)
    out["gpu_ms_per_call"] = round(float(np.median(gpu)) * 1e3, 3)
    out["img_per_s_gpu_time"] = round(args.batch / float(np.median(gpu)), 1)

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            run_ops(ops, images, rng, device_kind="cuda")
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12)
    host_table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
    print(json.dumps(out, indent=1))
    print(table)
    print(host_table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**out, "profile_by_cuda": table, "profile_by_host": host_table}, f, indent=1)


if __name__ == "__main__":
    main()
