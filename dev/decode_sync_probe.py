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

With ``--trace``, the ``beside_default`` case runs once more under torch.profiler (CUPTI), and the CUDA runtime
and driver calls made on any thread (nvImageCodec's and nvJPEG's included) are summed by name: count, total and
longest time, so a call that waits for the whole device (``cudaFree``, ``cudaFreeHost``...) shows ~SLEEP ms long.
``--options`` adds to the decoders' nvImageCodec options (nvJPEG's buffer paddings, say).

Run on an H100 (4,000 JPEGs of make_data.py, batches of 256, 100 ms queued; the decode did not wait for the
default stream as such): with nvJPEG's CUDA decoder in use (``auto``: the hw_decoder_load split, or ``hybrid``)
the batch decode waited the whole 100 ms in 2 batches of 15, even on the fourth pass over the same images, in
``cudaFreeHost`` (a thread's pinned buffer grown for a larger image); with DALI's host padding in ``cudaFree``
(its device buffer); with both paddings in neither once the buffers had grown; the hardware decoder alone never
waited (`benchmarks/results/decode_sync_probe/h100/decode_sync_probe.json`). Kept off: on an H200 the paddings did not train faster
(0.93/0.95 of DALI against 0.96/0.95 without) and took 144 MB more GPU memory
(`benchmarks/results/bench_settings/h200/nvjpeg_padding.json`).

Usage: python dev/decode_sync_probe.py DATA_DIR OUT.json [--batch 256] [--batches 10] [--sleep-ms 100] [--trace]
    [--backend auto|hw|hybrid]
"""

import argparse
import glob
import json
import statistics
import time

import ingest  # noqa: F401 - first: ingest's nvJPEG (ingest.decode._nvjpeg)
import torch
from ingest.decode.cpu import CpuDecoder
from ingest.decode import gpu as decode_gpu
from ingest.decode.gpu import GpuDecoder, cpu_threads_each


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


def api_calls(work, trace_path: str) -> dict:
    """CUDA runtime / driver calls made while `work` runs, on any thread: name -> count, total and longest ms."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        work()
    prof.export_chrome_trace(trace_path)
    rows: dict[str, dict] = {}
    for e in json.load(open(trace_path))["traceEvents"]:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "dur" in e:
            row = rows.setdefault(e["name"], {"count": 0, "total_ms": 0.0, "max_ms": 0.0, "threads": set()})
            row["count"] += 1
            row["total_ms"] += e["dur"] / 1000
            row["max_ms"] = max(row["max_ms"], e["dur"] / 1000)
            row["threads"].add(e.get("tid"))
    ranked = sorted(rows.items(), key=lambda kv: -kv[1]["max_ms"])
    return {name: {**row, "total_ms": round(row["total_ms"], 2), "max_ms": round(row["max_ms"], 2),
                   "threads": len(row["threads"])} for name, row in ranked}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--sleep-ms", type=float, default=100.0)
    p.add_argument("--backend", default="auto", help="GpuDecoder backend: auto, hw, hybrid")
    p.add_argument("--options", default="", help="appended to the decoders' nvImageCodec options, e.g. "
                   "':host_memory_padding=8388608 :device_memory_padding=16777216' (DALI's paddings)")
    p.add_argument("--trace", action="store_true", help="profile the beside_default case's CUDA API calls")
    a = p.parse_args()
    if a.options:
        base = decode_gpu.decoder_options
        decode_gpu.decoder_options = lambda: base() + " " + a.options
    files = sorted(glob.glob(f"{a.data}/*/*.jpg"))[: a.batch * a.batches]
    datas = [open(f, "rb").read() for f in files]
    batches = [datas[k:k + a.batch] for k in range(0, len(datas), a.batch)]
    names = [f"{k}.jpg" for k in range(a.batch)]
    rate = cycles_per_ms()
    decode_stream = torch.cuda.Stream()
    side = torch.cuda.Stream()
    out = {"device": torch.cuda.get_device_name(), "backend": a.backend, "options": decode_gpu.decoder_options(),
           "batch": a.batch, "sleep_ms": a.sleep_ms,
           "side_stream_flags": "torch.cuda.Stream() (non-blocking)"}
    with CpuDecoder() as cpu, GpuDecoder("cuda", cpu, backend=a.backend, cpu_threads=cpu_threads_each(2)) as gpu:
        for batch in batches[:3]:   # warm-up: nvJPEG's buffers reach their size
            gpu.decode_batch(batch, names[:len(batch)], stream=decode_stream)
        decode_stream.synchronize()
        def run(stream):
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
            return {"host_ms": round(statistics.median(host), 2), "done_ms": round(statistics.median(done), 2),
                    "host_ms_each": [round(x, 1) for x in host]}

        for case, stream in (("alone", None), ("beside_default", torch.cuda.default_stream()),
                             ("beside_side", side)):
            out[case] = run(stream)
            print(case, out[case]["host_ms"], out[case]["done_ms"], flush=True)
        if a.trace:
            out["traced"] = {}
            out["trace"] = api_calls(lambda: out["traced"].update(run(torch.cuda.default_stream())),
                                     a.out + ".trace.json")
            for name, row in list(out["trace"].items())[:12]:
                print("trace", name, row, flush=True)
        out["gpu_fallbacks"] = dict(gpu.fallbacks)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
