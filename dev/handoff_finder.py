"""Developer probe: every call that gives the GIL up, in whichever thread makes it, while a loop runs beside a busy
pure-Python thread.

A C function that releases the GIL returns quickly alone but waits up to a switch interval to get the GIL back
beside a thread that holds it. So: a busy thread spins on ``sum(range(2000))`` (the one of bench_gpu.py); a
profile hook (``sys.setprofile`` / ``threading.setprofile``, so every thread the loop starts has it) times each C
call; calls that took at least ``--slow`` of the switch interval are counted per (function, caller line, thread).
What it cannot see: numpy releasing the GIL inside an operator or a subscript (``a + b``, ``a[:, 1:3] = b``
on more than 500 items), which are not calls; `dev/decode_plan_beside.py` times such code as a whole.
The report is per batch of the loop: how many such calls, and where. The hook slows Python code down, not the
waits, so the counts are what matter, not the rates. It also gives each Python function's inclusive time per
batch in both runs, and the functions that grew most beside the busy thread: the innermost one that grew
with no slow C call inside is where the GIL went in a way no single call shows (a forced switch).

Usage: python dev/handoff_finder.py CASE [--seconds 4] [--json F] [--data DIR] [--batch 256] [--device cuda]
  CASE: decode (GpuDecoder.decode_batch in a loop, arenas handed back, as bench_gpu's variant f),
        loader (ingest.Loader over a JPEG tree, RandomResizedCrop 224 + Flip + Normalize fp16),
        raw (ingest.Loader over bench_raw.py's raw shards, the same ops, batch 512 by default)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "benchmarks")]

import torch  # noqa: E402

from bench_gpu import Busy  # noqa: E402 - the benchmark's busy thread, so both measure the same thing


class Hook:
    """Times leaf C calls (no Python code or other C call inside) per thread; counts those of at least ``slow``
    seconds by (function, caller, thread name). Also sums each Python function's inclusive time per thread
    (`python`): a function that grows beside the busy thread with no slow C call inside lost the GIL in
    Python code (a forced switch) or in a call this hook cannot see. Installed once, before the loop starts
    its threads; :meth:`reset` starts a new count."""

    def __init__(self, slow: float):
        self.slow = slow
        self.local = threading.local()
        self.reset()

    def reset(self) -> None:
        self.hits: collections.Counter = collections.Counter()
        self.waited: collections.Counter = collections.Counter()
        self.python: collections.Counter = collections.Counter()
        self.calls = 0

    def __call__(self, frame, event, arg):
        stack = getattr(self.local, "stack", None)
        if stack is None:
            if threading.current_thread().name == "busy":  # the stand-in for the training loop: not timed
                sys.setprofile(None)
                return
            stack = self.local.stack = []
            self.local.frames = []
            self.local.name = threading.current_thread().name
        if event == "c_call":
            if stack:
                stack[-1][1] = True
            stack.append([time.perf_counter(), False])
        elif event == "call":
            if stack:
                stack[-1][1] = True
            self.local.frames.append(time.perf_counter())
        elif event == "return":
            frames = self.local.frames
            if frames:
                code = frame.f_code
                key = (f"{Path(code.co_filename).name}:{code.co_firstlineno} {code.co_name}", self.local.name)
                self.python[key] += time.perf_counter() - frames.pop()
        elif event in ("c_return", "c_exception"):
            if not stack:
                return
            t0, inner = stack.pop()
            dt = time.perf_counter() - t0
            self.calls += 1
            if dt >= self.slow and not inner:
                name = getattr(arg, "__qualname__", None) or getattr(arg, "__name__", repr(arg))
                owner = getattr(arg, "__self__", None)
                if owner is not None and not isinstance(owner, type(sys)):
                    name = f"{type(owner).__name__}.{name}"
                where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}"
                key = (name, where, threading.current_thread().name)
                self.hits[key] += 1
                self.waited[key] += dt


def busy() -> Busy:
    b = Busy()
    b._thread.name = "busy"
    return b


def decode_case(args):
    from ingest.decode.cpu import CpuDecoder
    from ingest.decode.gpu import GpuDecoder
    files = sorted(p for p in Path(args.data).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))[:args.batch * 8]
    datas = [p.read_bytes() for p in files]
    names = [str(p) for p in files]
    batches = [(datas[i:i + args.batch], names[i:i + args.batch]) for i in range(0, len(datas), args.batch)]
    cpu = CpuDecoder(threads=4)
    gpu = GpuDecoder(args.device, cpu)
    stream = torch.cuda.Stream(args.device)
    state = {"j": 0}

    def step() -> int:
        d, n = batches[state["j"] % len(batches)]
        state["j"] += 1
        with torch.cuda.stream(stream):
            images, _, _ = gpu.decode_batch(d, n, stream=stream)
        gpu.recycle(images)
        return len(d)

    def close():
        gpu.close()
        cpu.close()
    return step, close


def loader_case(args, path: str, batch: int):
    import ingest
    from ingest.ops import Flip, Normalize, RandomResizedCrop
    ops = [RandomResizedCrop(224), Flip(), Normalize([124, 116, 104], [58, 57, 57], dtype=torch.float16)]
    loader = ingest.Loader(path, batch_size=batch, device=args.device, ops=ops, shuffle=True, num_workers=0)
    state = {"it": iter(loader)}

    def step() -> int:
        try:
            images, _ = next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            images, _ = next(state["it"])
        return len(images)
    return step, loader.close


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case", choices=["decode", "loader", "raw"])
    p.add_argument("--data", default="/dev/shm/ingest_bench_20k")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--slow", type=float, default=0.5, help="a call this share of the switch interval or longer "
                                                            "counts as a hand-off")
    p.add_argument("--json")
    args = p.parse_args()
    hook = Hook(args.slow * sys.getswitchinterval())
    threading.setprofile(hook)   # before the case starts its threads
    sys.setprofile(hook)
    if args.case == "raw":
        import bench_raw
        bargs = bench_raw.parse_args(["--out", "/dev/null"])
        bargs.data = f"/dev/shm/ingest_raw_{bargs.n}_{bargs.size}"
        bench_raw.make_dataset(bargs)
        step, close = loader_case(args, bargs.data, args.batch or 512)
    elif args.case == "loader":
        step, close = loader_case(args, args.data, args.batch or 256)
    else:
        args.batch = args.batch or 256
        step, close = decode_case(args)
    for _ in range(4):  # warm-up
        step()
    if args.device != "cpu":
        torch.cuda.synchronize()
    out: dict = {"case": args.case, "switch_interval_s": sys.getswitchinterval(), "alone": {}, "beside_busy": {}}
    for mode in ("alone", "beside_busy"):
        with busy() if mode == "beside_busy" else contextlib.nullcontext():
            hook.reset()
            t0, images, batches = time.perf_counter(), 0, 0
            while time.perf_counter() - t0 < args.seconds:
                images += step()
                batches += 1
            wall = time.perf_counter() - t0
        rows = [{"per_batch": round(n / batches, 2), "ms_per_batch": round(hook.waited[k] * 1e3 / batches, 2),
                 "call": k[0], "at": k[1], "thread": k[2]} for k, n in hook.hits.most_common(25)]
        python = {f"{k[1]} {k[0]}": round(v * 1e3 / batches, 3) for k, v in hook.python.most_common()}
        out[mode] = {"batches": batches, "img_s_with_hook": round(images / wall, 1),
                     "c_calls_per_batch": round(hook.calls / batches), "slow_calls": rows,
                     "python_ms_per_batch": python}
        print(f"{mode}: {batches} batches, {images / wall:.0f} img/s with the hook, "
              f"{hook.calls / batches:.0f} C calls per batch", flush=True)
        for r in rows:
            print(f"  {r['per_batch']:7.2f}/batch {r['ms_per_batch']:7.2f} ms  {r['thread']:<12} {r['call']}  "
                  f"({r['at']})", flush=True)
    sys.setprofile(None)
    threading.setprofile(None)
    alone, beside = out["alone"]["python_ms_per_batch"], out["beside_busy"]["python_ms_per_batch"]
    grew = sorted(((beside[k] - alone.get(k, 0.0), k) for k in beside), reverse=True)[:20]
    out["python_grew_ms_per_batch"] = {k: round(d, 3) for d, k in grew}
    print("Python functions (inclusive) that grew most per batch beside the busy thread:")
    for d, k in grew:
        print(f"  {d:9.2f} ms  {k}  (alone {alone.get(k, 0.0):.2f})")
    close()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
