"""Developer script (device machine): the in-process Loader over a JPEG tree alone, then beside a ResNet-18
training loop in the same process (bench_gpu.py's step): img/s of each, the data wait, each stage's busy seconds
in each phase, and the native batch decode's mean time per call in each phase (what a training loop beside it
does to the decode). ``--sample`` adds the stage threads' sampled Python stacks during training; ``--switch``
sets CPython's switch interval. Settings come from the environment (``INGEST_NUM_WORKERS``, ``INGEST_GPU_DECODERS``,
``INGEST_HW_DECODER_LOAD``, ...), so variants are compared by running it again.

Usage: python dev/profile_train_loader.py DATA_DIR [--workers 0] [--stages auto] [--seconds 5]
       [--train-seconds 8] [--sample] [--switch S] [--json F]
"""

import argparse
import collections
import gc
import sys
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "benchmarks")]
import bench_gpu  # noqa: E402
from profile_raw_loader import endless, finish, sample_stacks  # noqa: E402

import ingest  # noqa: E402
from ingest.ops import Flip, Normalize, RandomResizedCrop  # noqa: E402
from ingest.decode import _nvimgcodec  # noqa: E402

CALLS = {"native_decode": [0.0, 0], "pipeline_decode": [0.0, 0]}


def timed_method(owner, name: str, key: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            CALLS[key][0] += time.perf_counter() - start
            CALLS[key][1] += 1
    setattr(owner, name, wrapper)


def take_calls() -> dict:
    """Mean ms per call and calls since the last take."""
    out = {k: {"ms": round(s / max(n, 1) * 1000, 2), "calls": n} for k, (s, n) in CALLS.items()}
    for v in CALLS.values():
        v[:] = [0.0, 0]
    return out


def gc_timer() -> dict:
    """Collections and seconds per generation from now on (gc.callbacks)."""
    stat = {"collections": [0, 0, 0], "seconds": [0.0, 0.0, 0.0], "_t": 0.0}

    def callback(phase, info):
        if phase == "start":
            stat["_t"] = time.perf_counter()
        else:
            g = info["generation"]
            stat["collections"][g] += 1
            stat["seconds"][g] += time.perf_counter() - stat["_t"]
    gc.callbacks.append(callback)
    return stat


def memory_report(mem) -> dict:
    """Device memory of the phase just run: bench_gpu's MemSampler readings, then torch's caching allocator
    (peak allocated, reserved, inactive split blocks) and its segments now, per stream: what the allocator
    keeps cached beyond what the loader uses, and where."""
    mem.stop()
    out = mem.result()
    mb = lambda v: round(v / 2 ** 20, 1)  # noqa: E731
    st = torch.cuda.memory_stats()
    out["torch_peak_inactive_split_mb"] = mb(st.get("inactive_split_bytes.all.peak", 0))
    out["torch_segments_peak"] = st.get("segment.all.peak", 0)
    out["torch_alloc_retries"] = st.get("num_alloc_retries", 0)
    streams: dict = collections.defaultdict(lambda: {"segments": 0, "reserved_mb": 0.0, "allocated_mb": 0.0})
    for seg in torch.cuda.memory_snapshot():
        s = streams[str(seg.get("stream"))]
        s["segments"] += 1
        s["reserved_mb"] = round(s["reserved_mb"] + mb(seg["total_size"]), 1)
        s["allocated_mb"] = round(s["allocated_mb"] + mb(seg["allocated_size"]), 1)
    out["segments_by_stream_now"] = dict(streams)
    free, total = torch.cuda.mem_get_info()
    out["device_used_now_mb"] = mb(total - free - mem.ctx_used)
    out["outside_torch_now_mb"] = round(out["device_used_now_mb"] - mb(torch.cuda.memory_reserved()), 1)
    return out


def stage_seconds(stats: dict) -> dict:
    return {k: v["seconds"] for k, v in stats["stages"].items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("--workers", type=int, default=None, help="num_workers (default: the Loader's)")
    p.add_argument("--stages", default="auto", help="worker_stages")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--train-seconds", type=float, default=8.0)
    p.add_argument("--switch", type=float, default=None)
    p.add_argument("--sample", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    if args.switch:
        sys.setswitchinterval(args.switch)
    from ingest.engine import pipeline
    timed_method(_nvimgcodec.BatchDecoder, "submit", "native_decode")
    timed_method(pipeline.Pipeline, "decode", "pipeline_decode")
    ops = [RandomResizedCrop(224), Flip(p=0.5),
           Normalize(mean=bench_gpu.MEAN, std=bench_gpu.STD, dtype=torch.float32, layout="NCHW")]
    torch.cuda.init()
    torch.empty(1, device="cuda")
    mem = bench_gpu.MemSampler(torch.device("cuda"))
    mem.start()
    loader = ingest.Loader(args.data, batch_size=args.batch, device="cuda", ops=ops, shuffle=True,
                           num_workers=args.workers, last_batch="drop", worker_stages=args.stages)
    batches = endless(loader)
    for _ in range(10):
        next(batches)
    torch.cuda.synchronize()
    take_calls()
    out = {"args": vars(args), "loader": repr(loader)}
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < args.seconds:
        n += len(next(batches)[0])
    torch.cuda.synchronize()
    out["alone"] = {"img_s": round(n / (time.perf_counter() - t0), 1), "calls": take_calls(),
                    "stage_seconds": stage_seconds(loader.stats()), "memory": memory_report(mem)}
    step, _ = bench_gpu.make_step(torch.device("cuda"), argparse.Namespace(model="resnet18"))
    for _ in range(10):
        step(*next(batches))
    torch.cuda.synchronize()
    take_calls()
    before = stage_seconds(loader.stats())
    stacks: dict = collections.defaultdict(collections.Counter)
    stop = threading.Event()
    if args.sample:
        threading.Thread(target=sample_stacks, args=(stop, stacks, {t.ident: t.name for t in threading.enumerate()}),
                         daemon=True).start()
    collections_ = gc_timer()
    t0, n, wait = time.perf_counter(), 0, 0.0
    while time.perf_counter() - t0 < args.train_seconds:
        s = time.perf_counter()
        x, y = next(batches)
        wait += time.perf_counter() - s
        step(x, y)
        n += len(x)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    stop.set()
    after = stage_seconds(loader.stats())
    out["training"] = {"img_s": round(n / wall, 1), "data_wait": round(wait / wall, 3), "calls": take_calls(),
                       "stage_seconds": {k: round(after[k] - before[k], 2) for k in after},
                       "gc": {k: v for k, v in collections_.items() if not k.startswith("_")}}
    finish(out, loader, stacks if args.sample else None, args.json)


if __name__ == "__main__":
    main()
