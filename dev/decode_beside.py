"""Developer probe: why GPU decode slows beside a busy thread. A busy Python thread costs the decoding thread GIL
hand-offs AND a core; a busy process costs only the core. nvImageCodec splits a batch's host work over its CPU
threads (one per core by default), so one of them sharing a core with a spinning thread can hold the batch up.

For each nvImageCodec CPU thread count: `GpuDecoder.decode_batch` in a loop (arenas handed back, as bench_gpu's
variant f) alone, beside a busy pure-Python thread, and beside a busy process; img/s and each batch's time in
the native decode call.

Usage: python dev/decode_beside.py [DATA_DIR] [--threads 0,14,8] [--seconds 3] [--json F]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "benchmarks")]

import torch  # noqa: E402

from bench_gpu import Busy  # noqa: E402
from ingest.decode import _nvimgcodec as native  # noqa: E402
from ingest.decode.cpu import CpuDecoder  # noqa: E402
from ingest.decode.gpu import GpuDecoder  # noqa: E402


class BusyProcess:
    """A process spinning on pure Python: takes a core, shares no GIL."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.2)
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def run(gpu: GpuDecoder, batches, seconds: float) -> dict:
    stream = torch.cuda.Stream()
    loop, spent = native.LOOP, [0.0]

    class Timed:   # the compiled loop's decode call, timed
        def __getattr__(self, name):
            return getattr(loop, name)

        def decode(self, *args):
            t = time.perf_counter()
            try:
                return loop.decode(*args)
            finally:
                spent[0] += time.perf_counter() - t
    native.LOOP = Timed()
    try:
        for datas, names in batches[:2]:
            gpu.recycle(gpu.decode_batch(datas, names, stream=stream)[0])
        stream.synchronize()
        spent[0], n, k = 0.0, 0, 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            datas, names = batches[k % len(batches)]
            images = gpu.decode_batch(datas, names, stream=stream)[0]
            gpu.recycle(images)
            n, k = n + len(datas), k + 1
        stream.synchronize()
        wall = time.perf_counter() - t0
    finally:
        native.LOOP = loop
    return {"img_s": round(n / wall, 1), "ms_per_batch": round(wall * 1e3 / k, 2),
            "decode_call_ms": round(spent[0] * 1e3 / k, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="?", default="/dev/shm/ingest_bench_20k")
    p.add_argument("--threads", default="0,14,8")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--json")
    args = p.parse_args()
    files = sorted(q for q in Path(args.data).rglob("*") if q.suffix.lower() in (".jpg", ".jpeg"))[:args.images]
    datas = [q.read_bytes() for q in files]
    b = args.batch
    batches = [(datas[i:i + b], [str(q) for q in files[i:i + b]]) for i in range(0, len(datas) - b + 1, b)]
    cpu = CpuDecoder(threads=4)
    out: dict = {"images": len(datas), "batch": b, "switch_interval_s": sys.getswitchinterval(), "runs": {}}
    for threads in [int(t) for t in args.threads.split(",")]:
        gpu = GpuDecoder("cuda", cpu, cpu_threads=threads)
        row = {}
        for mode, ctx in (("alone", None), ("busy_thread", Busy), ("busy_process", BusyProcess)):
            if ctx is None:
                row[mode] = run(gpu, batches, args.seconds)
            else:
                with ctx():
                    row[mode] = run(gpu, batches, args.seconds)
        for mode in ("busy_thread", "busy_process"):
            row[mode]["over_alone"] = round(row[mode]["img_s"] / row["alone"]["img_s"], 3)
        out["runs"][f"cpu_threads={threads}"] = row
        print(f"cpu_threads={threads}: {json.dumps(row)}", flush=True)
        gpu.close()
    cpu.close()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
