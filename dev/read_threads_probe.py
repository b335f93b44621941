"""Developer probe: per-batch time of the native batched reads at several thread counts (any machine).

Reads 256 small files (a JPEG tree) and 512 random 196,608-byte rows of one file (a raw shard's 256x256x3
samples), page-cached, through ``ByteReader("posix", threads=T)``, best of 5 x 20 calls per case. A batch's
fixed cost in threads (starting them, or waking kept ones) shows as the gap between T=2 and T=8/16 on the
small files; the rows are bound by copying. To compare two builds of ``ingest._readv``, run it once per build.

Usage: python dev/read_threads_probe.py JPEG_DIR [--threads 2,8,16] [--out FILE.json]
"""

import argparse
import json
import os
import platform
import tempfile
import time

import numpy as np
import torch

from ingest.formats import open_source
from ingest.io import ByteReader

ROW = 196_608


def best_ms(fn, reps: int = 5, calls: int = 20) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return round(best * 1e3, 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("jpegs")
    p.add_argument("--threads", default="2,8,16")
    p.add_argument("--out")
    args = p.parse_args()
    src = open_source(args.jpegs, "filetree")
    locations = [src.locate(i) for i in range(min(256, len(src)))]
    shard = os.path.join(tempfile.gettempdir(), "ingest_read_threads_probe.bin")
    if not os.path.exists(shard) or os.path.getsize(shard) != ROW * 1024:
        with open(shard, "wb") as f:
            f.write(os.urandom(ROW * 1024))
    rng = np.random.default_rng(0)
    out = torch.empty((512, ROW), dtype=torch.uint8)
    res = {}
    for t in (int(x) for x in args.threads.split(",")):
        with ByteReader("posix", threads=t) as r:
            res[f"files{len(locations)}_t{t}_ms"] = best_ms(lambda: r.read(locations))
            res[f"rows512_t{t}_ms"] = best_ms(lambda: r.read_rows(
                [shard], np.zeros(512, np.int64), rng.choice(1024, 512, replace=False) * ROW, out))
    report = {"host": {"cores": os.cpu_count(), "platform": platform.platform()}, "results": res}
    print(json.dumps(report))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
