"""Developer script (device machine): does a GPU batch decode wait for unrelated work queued on the GPU?

The training loop usually queues its kernels on the legacy default stream. A stream created without
cudaStreamNonBlocking waits for the default stream's earlier work before each of its operations, and a
cudaFree / cudaMallocHost without a stream waits for the whole device. If nvImageCodec (or nvJPEG under it) does
either, each batch decode waits for the training step queued before it: the loader cannot run ahead of the
training stream, and its decode lanes spin meanwhile (25-36 ms of thread CPU per batch beside training on an
H200, against ~12 alone).

Three cases, one `GpuDecoder` (the Loader's settings) on a stream of its own, batches of JPEGs from DATA_DIR:
``alone``; ``beside_default``: before each batch ~SLEEP ms of `torch.cuda._sleep` queued on the legacy default
stream; ``beside_side``: the same on a non-blocking side stream. Per case, each decode_batch call's host time and
the time until its stream is done. Waiting for the default stream shows as ``beside_default`` ~SLEEP ms longer
than the others.

Usage: python tools/decode_sync_probe.py DATA_DIR OUT.json [--batch 256] [--batches 10] [--sleep-ms 100]

Written at the end of a session with no device time left: not yet run.
"""

import argparse
import glob
import json
import statistics
import time

import ingest  # noqa: F401 - first: ingest's nvJPEG (ingest._nvjpeg)
import torch
from ingest.ops.decode import CpuDecoder
from ingest.ops.decode_gpu import GpuDecoder, cpu_threads_each


def cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of `torch.cuda._sleep`, measured."""
    torch.cuda._sleep(1_000_000)
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    torch.cuda._sleep(50_000_000)
    end.record()
    end.synchronize()
    return 50_000_000 / begin.elapsed_time(end)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--sleep-ms", type=float, default=100.0)
    a = p.parse_args()
    files = sorted(glob.glob(f"{a.data}/*/*.jpg"))[: a.batch * a.batches]
    datas = [open(f, "rb").read() for f in files]
    batches = [datas[k:k + a.batch] for k in range(0, len(datas), a.batch)]
    names = [f"{k}.jpg" for k in range(a.batch)]
    rate = cycles_per_ms()
    decode_stream = torch.cuda.Stream()
    side = torch.cuda.Stream()
    out = {"device": torch.cuda.get_device_name(), "batch": a.batch, "sleep_ms": a.sleep_ms,
           "side_stream_flags": "torch.cuda.Stream() (non-blocking)"}
    with CpuDecoder() as cpu, GpuDecoder("cuda", cpu, cpu_threads=cpu_threads_each(2)) as gpu:
        for batch in batches[:3]:   # warm-up: nvJPEG's buffers reach their size
            gpu.decode_batch(batch, names[:len(batch)], stream=decode_stream)
        decode_stream.synchronize()
        for case, stream in (("alone", None), ("beside_default", torch.cuda.default_stream()),
                             ("beside_side", side)):
            host, done = [], []
            for batch in batches:
                torch.cuda.synchronize()
                if stream is not None:
                    with torch.cuda.stream(stream):
                        torch.cuda._sleep(int(a.sleep_ms * rate))
                t0 = time.perf_counter()
                gpu.decode_batch(batch, names[:len(batch)], stream=decode_stream)
                t1 = time.perf_counter()
                decode_stream.synchronize()
                t2 = time.perf_counter()
                host.append((t1 - t0) * 1000)
                done.append((t2 - t0) * 1000)
            torch.cuda.synchronize()
            out[case] = {"host_ms": round(statistics.median(host), 2), "done_ms": round(statistics.median(done), 2),
                         "host_ms_each": [round(x, 1) for x in host]}
            print(case, out[case]["host_ms"], out[case]["done_ms"], flush=True)
        out["gpu_fallbacks"] = dict(gpu.fallbacks)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
