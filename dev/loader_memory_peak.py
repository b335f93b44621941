"""Developer script (device machine): which CUDA blocks are live at the in-process Loader's memory peak, the
loader alone over a JPEG tree (bench_gpu.py's pipeline: mixed decode, RandomResizedCrop 224 + flip + normalize
float32 NCHW). A thread samples torch's allocated bytes every millisecond and keeps the allocator's snapshot
whenever they reach a new high; the JSON lists the live blocks of 1 MB or more at that high by size and by
stream (outputs are the ops stream's, decode arenas each lane's).

Usage: python dev/loader_memory_peak.py DATA_DIR OUT.json [--batches 300] [--batch 256]
"""

import argparse
import collections
import json
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_gpu  # noqa: E402

import ingest  # noqa: E402
from ingest.ops import Flip, Normalize, RandomResizedCrop  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    dev = torch.device("cuda", 0)
    torch.ones(1, device=dev)
    ops = [RandomResizedCrop(224), Flip(p=0.5),
           Normalize(mean=bench_gpu.MEAN, std=bench_gpu.STD, dtype=torch.float32, layout="NCHW")]
    loader = ingest.Loader(args.data, batch_size=args.batch, device="cuda", decode="mixed", ops=ops,
                           shuffle=True, seed=0, last_batch="drop")
    best = {"allocated": 0, "snapshot": None}
    lock, stop = threading.Lock(), threading.Event()

    def sample() -> None:
        while not stop.is_set():
            allocated = torch.cuda.memory_allocated(dev)
            if allocated > best["allocated"]:
                snapshot = torch.cuda.memory_snapshot()
                with lock:
                    best.update(allocated=allocated, snapshot=snapshot)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    n, t0 = 0, time.perf_counter()
    with loader:
        while n < args.batches:
            for x, y in loader:   # a plain loop: only the step's batch is held
                n += 1
                if n >= args.batches:
                    break
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    stop.set()
    sampler.join()
    sizes: collections.Counter = collections.Counter()
    streams: dict = collections.defaultdict(collections.Counter)
    for segment in best["snapshot"] or []:
        for block in segment["blocks"]:
            mb = round(block["size"] / 2**20, 1)
            if block["state"] == "active_allocated" and mb >= 1:
                sizes[mb] += 1
                streams[str(segment["stream"])][mb] += 1
    result = {"device": torch.cuda.get_device_name(dev), "batch": args.batch, "batches": n,
              "img_s_with_sampler": round(n * args.batch / seconds),
              "peak_allocated_mb": round(best["allocated"] / 2**20, 1),
              "max_memory_allocated_mb": round(torch.cuda.max_memory_allocated(dev) / 2**20, 1),
              "max_memory_reserved_mb": round(torch.cuda.max_memory_reserved(dev) / 2**20, 1),
              "live_blocks_at_peak": sorted(sizes.items(), reverse=True),
              "live_blocks_at_peak_by_stream": {s: sorted(c.items(), reverse=True) for s, c in streams.items()}}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
