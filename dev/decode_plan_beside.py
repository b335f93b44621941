"""Developer probe (any machine, no GPU): the Python part of `GpuDecoder.decode_batch` (native engine) on 256 JPEG
headers (``--part decode``), or the host side of one fused warp launch on 256 images (``--part ops``:
`resample._setup` + `_warp_kernel.pack` for RandomResizedCrop 224 + flip + normalize fp16), alone and beside a
busy pure-Python thread, with ``time.sleep`` standing in for the native decode or the kernel. On an H100 the decode's ~1 ms of Python between native calls took ~13 ms beside a busy
thread (`dev/decode_beside.py`); numpy gives the GIL up on more than 500 items and in `np.zeros` of 1 KB
and more, which a profile hook does not see (operators and subscripts are not calls).

Usage: python dev/decode_plan_beside.py JPEG_DIR [--part decode|ops] [--json F]   (PYTHONPATH picks the tree)
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
from bench_gpu import Busy  # noqa: E402

from ingest.decode import gpu as decode_gpu  # noqa: E402
from ingest.decode.cpu import jpeg_headers  # noqa: E402


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


def ops_host() -> callable:
    """The host side of a fused warp launch on 256 images, for plans drawn once."""
    import torch
    from ingest.ops import Flip, Normalize, RandomResizedCrop, _warp_kernel, planner
    from ingest.ops.resample import _fill_values, _setup
    from ingest.random import SampleRandom
    ops = [RandomResizedCrop(224), Flip(), Normalize([124, 116, 104], [58, 57, 57], dtype=torch.float16)]
    images = torch.zeros((256, 256, 256, 3), dtype=torch.uint8)
    rng = np.random.default_rng(0)
    warps = [planner.plan(ops, [(256, 256)] * 256, SampleRandom.keyed(0, 0, rng.permutation(20000)[:256])).warp
             for _ in range(8)]
    turn = [0]

    def run(_datas) -> None:
        w = warps[turn[0] % len(warps)]
        turn[0] += 1
        _warp_kernel.pack(images, w.out_sizes, _setup(w, [(256, 256)] * 256), _fill_values(w.fill, 3), None)
    return run


def loop(datas, seconds: float, part=plan) -> dict:
    python = k = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        part(datas)
        python += time.perf_counter() - t
        time.sleep(0.012)   # the native decode: the GIL given up once
        k += 1
    return {"python_ms_per_batch": round(python / k * 1e3, 2), "batches": k}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("--part", choices=["decode", "ops"], default="decode")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--json")
    args = p.parse_args()
    files = sorted(q for q in Path(args.data).rglob("*") if q.suffix.lower() in (".jpg", ".jpeg"))[:256]
    datas = [q.read_bytes() for q in files]
    part = plan if args.part == "decode" else ops_host()
    out = {"tree": str(Path(ingest.__file__).resolve().parents[1]), "part": args.part, "images": len(datas),
           "alone": loop(datas, args.seconds, part)}
    with Busy():   # bench_gpu's busy thread, as the other probes use
        out["beside_busy"] = loop(datas, args.seconds, part)
    print(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
