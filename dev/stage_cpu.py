"""Developer script: where a Loader's time goes, per stage, on the GPU path: each stage's busy and CPU
milliseconds per batch (`ingest.engine.StageStats`; CPU time is the stage thread's own, i.e. roughly the GIL
it holds), for each dataset given, each worker layout and each CPython switch interval asked for.

Usage: python dev/stage_cpu.py DATA [DATA ...] [--workers 0,4:read] [--switch-intervals-us 5000]
       [--batches 60] [--json FILE]

``--workers``: comma-separated layouts, ``N`` (the Loader's default stages) or ``N:read`` (reader processes).
"""

import argparse
import json
import sys
import time

import torch

import ingest
from ingest.ops import Flip, Normalize, RandomResizedCrop
from profile_raw_loader import endless  # this folder, on sys.path when run as a script

MEAN, STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)


def per_batch(stage: dict) -> tuple[float, float]:
    n = max(stage["batches"], 1)
    return round(stage["seconds"] / n * 1e3, 2), round(stage["cpu_seconds"] / n * 1e3, 2)


def run(path: str, workers: int, stages: str, batches: int, batch_size: int) -> dict:
    loader = ingest.Loader(path, batch_size=batch_size, shuffle=True, device="cuda", decode="mixed",
                           num_workers=workers, worker_stages=stages,
                           ops=[RandomResizedCrop(224), Flip(), Normalize(MEAN, STD)])
    batches_of = endless(loader)
    for _ in range(20):
        next(batches_of)
    torch.cuda.synchronize()
    t0, n = time.perf_counter(), 0
    for _ in range(batches):
        n += next(batches_of)[0].shape[0]
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    stats = loader.stats()
    out = {"img_s": round(n / seconds, 1),
           "ms_per_batch_busy_cpu": {name: per_batch(s) for name, s in stats["stages"].items()}}
    if "worker_read" in stats:
        out["ms_per_batch_busy_cpu"]["worker_read"] = per_batch(stats["worker_read"])
    batches_of.close()
    loader.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", nargs="+")
    ap.add_argument("--workers", default="0", help="layouts: N or N:read, comma-separated (default 0)")
    ap.add_argument("--switch-intervals-us", default="5000", help="comma-separated (default 5000: Python's)")
    ap.add_argument("--batches", type=int, default=60, help="timed batches per case, after 20 of warm-up")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    default = sys.getswitchinterval()
    results = {}
    for path in a.data:
        for layout in a.workers.split(","):
            workers, _, stages = layout.partition(":")
            for us in (float(v) for v in a.switch_intervals_us.split(",")):
                sys.setswitchinterval(us * 1e-6)
                try:
                    key = f"{path} workers={layout} switch_interval_us={us:g}"
                    results[key] = run(path, int(workers), stages or "auto", a.batches, a.batch)
                finally:
                    sys.setswitchinterval(default)
                print(key, json.dumps(results[key]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "batch": a.batch, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
