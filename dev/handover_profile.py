"""Developer probe: what a batch costs the training thread in the Loader's hand-over, and where that time goes.

A plain loop takes batches from ``ingest.Loader(DIR)`` (bench_gpu's ops: RandomResizedCrop 224, Flip, Normalize
float32 NCHW) and drops each at once. Measured on the loop's thread: its CPU time per batch over ``--batches``
batches (``time.thread_time``: the GIL it holds and any native work it does without giving the GIL up; the
engine's waits, spent asleep, are not in it), then the same batches again under ``cProfile``, whose functions
sorted by own time say where that CPU goes (the profiler's own cost inflates every Python call alike, so compare
shares, not totals). Also ``Loader.stats()["native"]`` where the native engine ran.

Usage: python dev/handover_profile.py DIR [--batch 256] [--batches 300] [--output tuple|dict] [--engine auto]
                                         [--device cuda] [--json F]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time


def endless(loader, warmup: int):
    """The loader's batches epoch after epoch, ``warmup`` of them already taken."""
    def batches():
        while True:
            yield from loader

    it = batches()
    for _ in range(warmup):
        next(it)
    return it


def profiled(it, batches: int, top: int) -> str:
    """``batches`` batches taken from ``it`` under cProfile: its ``top`` functions by own time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(batches):
        next(it)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--output", choices=("tuple", "dict"), default="tuple")
    p.add_argument("--engine", default="auto")
    p.add_argument("--device", default="cuda")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json")
    a = p.parse_args()

    import torch

    import ingest
    from ingest import defaults
    from ingest.ops import Flip, Normalize, RandomResizedCrop

    mean, std = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)
    ops = [RandomResizedCrop(224), Flip(p=0.5), Normalize(mean=mean, std=std, dtype=torch.float32, layout="NCHW")]
    decode = "mixed" if a.device.startswith("cuda") else "cpu"
    with defaults.set(engine=a.engine):
        loader = ingest.Loader(a.data, batch_size=a.batch, device=a.device, decode=decode, ops=ops, shuffle=True,
                               seed=0, last_batch="drop", output=a.output)

    it = endless(loader, a.warmup)
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(a.batches):
        next(it)
    cpu, wall = time.thread_time() - c0, time.perf_counter() - t0

    profile = profiled(it, a.batches, a.top)
    stats = loader.stats()
    report = {"engine": stats.get("engine"), "output": a.output, "batch": a.batch, "batches": a.batches,
              "thread_cpu_ms_per_batch": round(1e3 * cpu / a.batches, 4),
              "img_s": round(a.batches * a.batch / wall, 1), "native": stats.get("native")}
    if hasattr(loader, "close"):
        loader.close()
    print(json.dumps(report, indent=1))
    print(profile)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({**report, "profile": profile}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
