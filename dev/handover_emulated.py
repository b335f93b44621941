"""Developer probe: the training thread's CPU per batch in a plain ``for batch in Loader(...)`` loop on the native
engine, without a GPU: the engine runs on the stand-in CUDA driver and nvImageCodec of tests/test_native_emulated.py
(host memory as device memory, the warp kernel compiled for the CPU), so the NativeExecutor's per-batch Python and
the Loader's hand-over are the real ones.

A file tree of small JPEGs (all on the engine's GPU path, no fallback rows), RandomResizedCrop, Flip, Normalize
(float32 NCHW). Per run: the loop thread's CPU (``time.thread_time``: what it does holding the GIL or in native
code; the engine's waits, asleep, are not in it) per batch over ``--batches`` batches after a warm-up, and the
executor's own count, ``stats()["native"]["python_ms_per_batch"]``. Prints each run's figures and their median.

``--isolated``: after the warm-up the engine is closed and a Python stand-in takes its place whose next() has a
free slot's full batch ready at once (an epoch end every epoch's batches), so what is timed is the Python per
batch alone, steadier than beside the engine's threads on a busy machine.

``--split``: also the loop thread's CPU inside the engine's own next() and release() (its waits' wake-ups, the GIL
given up and taken back), the part of the per-batch CPU that is not Python.

Usage: python dev/handover_emulated.py [--images 5120] [--batch 256] [--batches 200] [--runs 5]
                                       [--output tuple|dict] [--isolated | --split] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from handover_profile import endless, profiled   # (dev/, beside this file)

TESTS = Path(__file__).resolve().parent.parent / "tests"


def stand_in(d: Path) -> Path:
    """The stand-in driver library compiled from the emulated tests' sources."""
    sys.path.insert(0, str(TESTS))
    from ingest.ops import _warp_kernel
    from test_native_emulated import _FAKE
    from test_ops import _DRIVER, _PRELUDE
    (d / "fake.cpp").write_text(_PRELUDE + _warp_kernel.SOURCE + _DRIVER + _FAKE)
    compiler = shutil.which("g++") or shutil.which("c++")
    subprocess.run([compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-Wno-unknown-pragmas", str(d / "fake.cpp"),
                    "-o", str(d / "fake.so")], check=True, capture_output=True)
    return d / "fake.so"


def tree(root: Path, images: int) -> Path:
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for c in range(4):
        (root / str(c)).mkdir(parents=True)
    for i in range(images):
        Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)).save(root / str(i % 4) / f"{i:06d}.jpg")
    return root


class ReadyEngine:
    """In place of the engine (``--isolated``): next() gives a full batch in a free slot at once (an epoch end
    every ``per_epoch`` batches), so the time measured is the Python around it."""

    def __init__(self, slots: int, per_epoch: int, rows: int, out: list, epoch: int, number: int):
        from ingest import native
        self.kinds = native.ENGINE.BATCH, native.ENGINE.EPOCH_END
        self.free = [k for k in range(slots) if k not in out]
        self.per_epoch, self.rows, self.epoch, self.number, self.handed = per_epoch, rows, epoch, number, 0

    def next(self):
        if self.number == self.per_epoch:
            self.number = 0
            self.epoch += 1
            return self.kinds[1], -1, self.epoch - 1, 0, 0, None
        if not self.free:
            return None
        self.number += 1
        self.handed += 1
        return self.kinds[0], self.free.pop(0), self.epoch, self.number - 1, self.rows, None

    def release(self, k: int, stream: int) -> None:
        self.free.append(k)

    def add_epoch(self, epoch: int, *arrays) -> None:
        pass

    def stats(self) -> dict:
        return {"handed": self.handed, "gil_ns": 0}

    def close(self) -> None:
        pass


class Timed:
    """The engine, with the loop thread's CPU inside its next() and release() summed (``--split``)."""

    def __init__(self, engine):
        self.engine, self.cpu = engine, 0.0

    def next(self):
        c0 = time.thread_time()
        try:
            return self.engine.next()
        finally:
            self.cpu += time.thread_time() - c0

    def release(self, *args):
        c0 = time.thread_time()
        self.engine.release(*args)
        self.cpu += time.thread_time() - c0

    def __getattr__(self, name):
        return getattr(self.engine, name)


def measure(lib: str, root: str, a) -> dict:
    sys.path.insert(0, str(TESTS))
    import torch

    import ingest
    from ingest import native
    from ingest.formats.filetree import FileTree
    from ingest.ops import Flip, Normalize, RandomResizedCrop
    from test_native_emulated import stand_in_gpu

    src = FileTree(root)
    ops = [RandomResizedCrop(16), Flip(p=0.5), Normalize((123.7, 116.3, 103.5), (58.4, 57.1, 57.4),
                                                         dtype=torch.float32, layout="NCHW")]
    _, gpu, _ = stand_in_gpu(lib, src, True, refused=-1)
    chain, why = native.chain_for(src, ops)
    assert chain is not None, why
    loader = ingest.Loader(src, ops=ops, device="cpu", decode="cpu", batch_size=a.batch, shuffle=True, seed=0,
                           last_batch="drop", output=a.output, num_workers=0)
    loader._native, native._gpu_arguments = chain, lambda pipeline, table: gpu   # (the stand-ins as the GPU)

    it = endless(loader, a.warmup)
    if a.isolated:   # the engine's part taken out: a stand-in that hands each slot back at once
        ex = loader._executor
        ex._engine.close()
        ex._engine = ReadyEngine(len(ex._slots), len(loader), a.batch, ex._out, loader.epoch, loader._next)
    elif a.split:
        ex = loader._executor
        ex._engine = Timed(ex._engine)
    cpu, engine = [], []
    for _ in range(a.runs):
        e0 = ex._engine.cpu if a.split else 0.0
        c0 = time.thread_time()
        for _ in range(a.batches):
            next(it)
        cpu.append(1e6 * (time.thread_time() - c0) / a.batches)
        engine.append(1e6 * (ex._engine.cpu - e0) / a.batches if a.split else 0.0)
    profile = profiled(it, a.batches, 20) if a.profile else None
    stats = loader.stats()
    assert stats["engine"] == "native" and not stats["native"]["fallbacks"], stats
    loader.close()
    return {"output": a.output, "batch": a.batch, "thread_cpu_us_per_batch": [round(c, 1) for c in cpu],
            "median_us": round(statistics.median(cpu), 1),
            **({"in_engine_next_release_us": [round(c, 1) for c in engine],
                "median_in_engine_us": round(statistics.median(engine), 1)} if a.split else {}),
            "python_us_per_batch (executor, whole run)": round(1e3 * stats["native"]["python_ms_per_batch"], 1),
            "profile": profile}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=5120)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--output", choices=("tuple", "dict"), default="tuple")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--isolated", action="store_true", help="the engine's part replaced by a stand-in ready at once")
    p.add_argument("--split", action="store_true", help="also the loop thread's CPU inside the engine's calls")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        report = measure(*a.child, a)
        profile = report.pop("profile")
        print(json.dumps(report, indent=1))
        if profile:
            print(profile)
        return 0
    with tempfile.TemporaryDirectory() as d:
        lib = stand_in(Path(d))
        root = tree(Path(d) / "tree", a.images)
        # a child process: the engine loads the stand-in driver (INGEST_CUDA_LIBRARY) once, at its first use
        env = dict(os.environ, INGEST_CUDA_LIBRARY=str(lib))
        return subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", str(lib), str(root)],
                              env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main())
