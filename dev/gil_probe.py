"""Developer probe: which parts of a native-engine batch slow down beside a busy Python thread, and why.

Usage: python dev/gil_probe.py [--out FILE.json] [DATA_DIR]
(default data: the JPEGs dev/decode_contention.py writes to /dev/shm/ingest-contention, made if absent)

1. Steps of one `GpuDecoder.decode_batch` (256 images, headers given) and a few torch calls it makes, each
   timed alone and beside a thread spinning on `sum(range(2000))`. A step that gives the GIL up (and so waits
   a switch interval to get it back) shows up as milliseconds beside the busy thread.
2. Where the decoding thread is while the busy thread runs: faulthandler dumps every thread's stack from its
   own C thread every 2 ms (no GIL needed); the decoding thread's innermost frames are counted.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import json
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from ingest.decode import _nvimgcodec as native
from ingest.decode.cpu import CpuDecoder
from ingest.decode.gpu import GpuDecoder, clip_regions, gpu_decodable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_gpu import Busy  # noqa: E402 - the benchmark's busy thread, so both measure the same thing


def timed(fn, repeat: int = 3) -> float:
    """Best of ``repeat`` runs of ``fn``, in ms."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return round(best * 1e3, 3)


def steps(gpu: GpuDecoder, datas, headers, stream) -> dict:
    names = [str(i) for i in range(len(datas))]
    size = 200 * 300 * 3
    arena = torch.empty(len(datas) * 300_000, dtype=torch.uint8, device="cuda")

    def decode():
        gpu.decode_batch(datas, names, stream=stream, headers=headers)
        stream.synchronize()

    def submit_only():  # the per-image ctypes calls (the compiled loop's fallback), no decode
        dec = gpu._decoders[0]
        heights, widths = headers[:, 1].copy(), headers[:, 2].copy()
        addresses = (np.arange(len(datas)) * 300_000 + arena.data_ptr()).astype(np.uint64)
        saved, saved_loop = dec.lib.DecoderDecode, native.LOOP
        dec.lib.DecoderDecode, native.LOOP = (lambda *args: 1), None
        try:
            dec.submit(datas, np.zeros((len(datas), 4), np.int32), heights, widths, addresses,
                       stream.cuda_stream).wait()
        finally:
            dec.lib.DecoderDecode, native.LOOP = saved, saved_loop

    event = torch.cuda.Event()

    def plan():  # decode_batch's planning: eligibility, regions, arena offsets (numpy over the header table)
        index = np.flatnonzero(gpu_decodable(headers, 1 << 30))
        regions = clip_regions(np.zeros((len(index), 4), np.int64), headers[index])
        hw = headers[index][:, 1:3]
        padded = -(-(hw[:, 0] * hw[:, 1] * 3) // 768) * 768
        np.concatenate(([0], np.cumsum(padded)[:-1]))
        return regions

    def stream_ctx():
        with torch.cuda.stream(stream):
            pass

    probes = {
        "decode_batch": decode,
        "plan_numpy": plan,
        "1_stream_ctx": stream_ctx,
        "1_event_record": lambda: event.record(stream),
        "1_wait_event": lambda: stream.wait_event(event),
        "submit_loop_no_decode": submit_only,
        "256_slice_view": lambda: [arena[k * 300_000:k * 300_000 + size].view(200, 300, 3) for k in range(256)],
        "256_slice": lambda: [arena[k * 300_000:k * 300_000 + size] for k in range(256)],
        "1_split": lambda: torch.split(arena, 300_000),
        "256_split_view": lambda: [t[:size].view(200, 300, 3) for t in torch.split(arena, 300_000)],
        "1_empty_cuda": lambda: torch.empty(10_000_000, dtype=torch.uint8, device="cuda"),
        "1_synchronize": stream.synchronize,
        "1_device_ctx": lambda: torch.cuda.device(0).__enter__(),
    }
    out = {}
    for name, fn in probes.items():
        fn()
        alone = timed(fn)
        with Busy():
            beside = timed(fn)
        out[name] = {"alone_ms": alone, "beside_busy_ms": beside}
        print(name, out[name], flush=True)
    return out


def sample(gpu: GpuDecoder, datas, headers, stream, seconds: float = 2.0) -> list:
    """Innermost frames of the decoding thread while a busy thread runs, most frequent first."""
    names = [str(i) for i in range(len(datas))]
    with tempfile.TemporaryFile("w+") as log, Busy():
        faulthandler.dump_traceback_later(0.002, repeat=True, file=log)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            gpu.decode_batch(datas, names, stream=stream, headers=headers)
            stream.synchronize()
        faulthandler.cancel_dump_traceback_later()
        log.seek(0)
        text = log.read()
    me = f"{threading.get_ident():#018x}"
    counts = collections.Counter()
    for block in re.split(r"\n(?=Thread 0x|Current thread 0x)", text):
        if me in block.splitlines()[0]:
            frames = [ln.strip() for ln in block.splitlines()[1:] if ln.strip().startswith("File")]
            counts[" | ".join(frames[:2])] += 1
    total = sum(counts.values()) or 1
    return [{"share": round(c / total, 3), "frames": f} for f, c in counts.most_common(12)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", nargs="?", default="/dev/shm/ingest-contention")
    parser.add_argument("--out")
    args = parser.parse_args()
    from decode_contention import make_data  # this folder, on sys.path when run as a script
    datas = make_data(Path(args.data), 256)
    cpu = CpuDecoder(threads=2)
    headers = cpu.probe_batch(datas, [str(i) for i in range(len(datas))])[1]
    stream = torch.cuda.Stream()
    with GpuDecoder("cuda", cpu, engine="native") as gpu:
        result = {"nvimgcodec": native.version_string(native.load().version), "steps": steps(gpu, datas, headers,
                                                                                             stream)}
        result["samples_beside_busy"] = sample(gpu, datas, headers, stream)
    for row in result["samples_beside_busy"]:
        print(row)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    cpu.close()


if __name__ == "__main__":
    main()
