"""Developer probe (any machine): `RawSource.read_batch` of shuffled rows into a CPU tensor, alone and beside a busy
pure-Python thread, in ms per batch (wall) and the reading thread's CPU. The read stage of a raw-shard loader
does this per batch; beside a thread that holds the GIL every call that gives it up costs up to a switch
interval. Makes a raw dataset of N 256x256x3 samples in /dev/shm with benchmarks/bench_raw.py if missing.

Usage: python dev/rows_beside_busy.py [--n 2048] [--batch 512] [--json F]   (PYTHONPATH picks the tree)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import ingest

sys.path.insert(0, str(Path(ingest.__file__).resolve().parents[1] / "benchmarks"))
import bench_raw  # noqa: E402
from bench_gpu import Busy  # noqa: E402

from ingest.formats.raw import RawSource  # noqa: E402
from ingest.io import ByteReader  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--json")
    args = p.parse_args()
    raw = bench_raw.parse_args(["--out", "/dev/null", "--device", "cpu", "--n", str(args.n), "--size", "256"])
    raw.data = f"/dev/shm/ingest_raw_{args.n}_256"
    bench_raw.make_dataset(raw)
    src, reader = RawSource(raw.data), ByteReader("posix", threads=8)
    out = src.batch_buffer(args.batch)
    rng = np.random.default_rng(0)
    batches = [rng.permutation(args.n)[:args.batch] for _ in range(args.batches)]
    def timed():
        wall, cpu = time.perf_counter(), time.thread_time()
        for idx in batches:
            src.read_batch(idx, out, reader)
        return {"ms_per_batch": round((time.perf_counter() - wall) / len(batches) * 1e3, 2),
                "thread_cpu_ms": round((time.thread_time() - cpu) / len(batches) * 1e3, 2)}
    timed()
    result = {"tree": str(Path(ingest.__file__).resolve().parents[1]), "batch": args.batch, "alone": timed()}
    with Busy():   # bench_gpu's busy thread, as the other probes use
        result["beside_busy"] = timed()
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
