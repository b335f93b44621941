"""Developer probe: where one native-engine batch spends its time, alone and beside a busy Python thread.

Usage: python tools/gil_probe.py [DATA_DIR]   (default: the JPEGs tools/decode_contention.py leaves in /dev/shm)

Splits `GpuDecoder.decode_batch` (256 images, headers given) into: the decode call and the wait (the two native
calls that release the GIL, each followed by a re-acquire that waits up to a switch interval beside a busy
thread) and everything else (per-image ctypes calls that keep the GIL, arena views). A busy thread should
lengthen only the first two, by about one switch interval each, whatever the batch size.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import torch

from ingest.ops import _nvimgcodec as native
from ingest.ops.decode import CpuDecoder
from ingest.ops.decode_gpu import GpuDecoder


class Timed:
    """Wraps a library function, summing the time spent in it (GIL re-acquire included)."""

    def __init__(self, fn):
        self.fn, self.total = fn, 0.0

    def __call__(self, *args):
        t = time.perf_counter()
        try:
            return self.fn(*args)
        finally:
            self.total += time.perf_counter() - t


def steps(gpu: GpuDecoder, datas, headers, calls: dict[str, Timed], stream) -> dict[str, float]:
    for c in calls.values():
        c.total = 0.0
    t = time.perf_counter()
    gpu.decode_batch(datas, [str(i) for i in range(len(datas))], stream=stream, headers=headers)
    stream.synchronize()
    total = time.perf_counter() - t
    out = {name: round(c.total * 1e3, 2) for name, c in calls.items()}
    out["other_ms"] = round((total - sum(c.total for c in calls.values())) * 1e3, 2)
    out["total_ms"] = round(total * 1e3, 2)
    return out


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "/dev/shm/ingest-contention")
    datas = [p.read_bytes() for p in sorted(folder.rglob("*.jpg"))[:256]]
    cpu = CpuDecoder(threads=2)
    headers = [cpu.probe_header(d, str(i))[1] for i, d in enumerate(datas)]
    lib = native.load()
    calls = {"decode_call_ms": Timed(lib.DecoderDecode), "wait_ms": Timed(lib.FutureWaitForAll)}
    lib.DecoderDecode, lib.FutureWaitForAll = calls["decode_call_ms"], calls["wait_ms"]
    stream = torch.cuda.Stream()
    with GpuDecoder("cuda", cpu, engine="native") as gpu:
        steps(gpu, datas, headers, calls, stream)
        print(json.dumps({"alone": steps(gpu, datas, headers, calls, stream)}))
        for interval in (0.005, 0.001):
            sys.setswitchinterval(interval)
            stop = threading.Event()
            th = threading.Thread(target=lambda: [sum(range(2000)) for _ in iter(stop.is_set, True)])
            th.start()
            print(json.dumps({f"busy, switch interval {interval}": steps(gpu, datas, headers, calls, stream)}))
            stop.set()
            th.join()
    cpu.close()


if __name__ == "__main__":
    main()
