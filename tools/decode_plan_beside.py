"""Developer probe (any machine, no GPU): the Python part of `GpuDecoder.decode_batch` (native engine) on 256 JPEG
headers, alone and beside a busy pure-Python thread, with ``time.sleep`` standing in for the native decode (which
gives the GIL up once). On an H100 the decode's ~1 ms of Python between native calls took ~13 ms beside a busy
thread (`tools/decode_beside.py`); numpy gives the GIL up on more than 500 items and in `np.zeros` of 1 KB
and more, which a profile hook does not see (operators and subscripts are not calls).

Usage: python tools/decode_plan_beside.py JPEG_DIR [--json F]   (PYTHONPATH picks the tree)
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np

import ingest
from ingest.ops import decode_gpu
from ingest.ops.decode import jpeg_headers


def plan(datas) -> None:
    """What decode_batch does in Python before and after the native call, on the library's own functions."""
    n = len(datas)
    table = jpeg_headers(datas)
    wanted = decode_gpu._region_array(None, n)
    index = np.flatnonzero(decode_gpu.gpu_decodable(table, 1 << 30))
    every = len(index) == n
    rows = table if every else table[index]
    regions = decode_gpu.clip_regions(wanted if every else wanted[index], rows)
    sizes = getattr(decode_gpu, "decoded_sizes", None)
    if sizes is not None:
        hw = sizes(regions, rows)
    else:   # the tree before: the [n, 2] form
        cropped = regions[:, 2] > regions[:, 0]
        hw = np.where(cropped[:, None], regions[:, [3, 2]] - regions[:, [1, 0]], rows[:, 1:3])
    padded = -(-(hw[:, 0] * hw[:, 1] * 3) // 768) * 768
    np.concatenate(([0], np.cumsum(padded)[:-1]))
    regions.astype(np.int32)
    cropped = regions[:, 2] > regions[:, 0]
    list(map(tuple, regions[:, :2].tolist()))
    np.where(cropped, "gpu-roi", "gpu").tolist()


def loop(datas, seconds: float) -> dict:
    python = k = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        plan(datas)
        python += time.perf_counter() - t
        time.sleep(0.012)   # the native decode: the GIL given up once
        k += 1
    return {"python_ms_per_batch": round(python / k * 1e3, 2), "batches": k}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--json")
    args = p.parse_args()
    files = sorted(q for q in Path(args.data).rglob("*") if q.suffix.lower() in (".jpg", ".jpeg"))[:256]
    datas = [q.read_bytes() for q in files]
    out = {"tree": str(Path(ingest.__file__).resolve().parents[1]), "images": len(datas),
           "alone": loop(datas, args.seconds)}
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            sum(range(2000))
    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    out["beside_busy"] = loop(datas, args.seconds)
    stop.set()
    thread.join()
    print(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
