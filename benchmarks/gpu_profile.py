"""Where a training step's GPU time goes beside a loader: a few steps under ``torch.profiler`` (CUPTI), summed per
CUDA stream of the device.

The profiler sees every kernel, copy and driver call of the process, the loader's native threads included, so the
summary tells apart the two ways a loader slows the step it feeds:

- **on the GPU**: its kernels share the SMs with the model's (``overlap_ms``: the loader's kernel time that ran
  while a training kernel did) and the training kernels themselves take longer than on a fixed batch
  (``train_kernel_ms``);
- **on the CPU**: the thread that launches the model's kernels falls behind the GPU, which then idles between
  them (``train_gap_ms``: the training stream's span per step minus its busy time).

Streams are told apart by their kernels: the one with the most kernels that are not NCCL's is the training
stream, NCCL's stream is ``nccl``, the rest are the loader's (beyond its four busiest, summed into one row). The
CPU side lists the CUDA runtime and driver calls
per step, split by the thread that made them (the training loop's, or another: autograd's backward, NCCL's, the
loader's) and by the stream whose kernel or copy they queued (``queues_on``, through CUPTI's correlation ids; "-"
for calls that queue nothing, such as an event synchronize), with the time each took.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections import defaultdict


def profile(run_step, steps: int, dev) -> dict:
    """Runs ``run_step()`` ``steps`` times under the profiler (after one unprofiled step) and summarizes the trace."""
    import torch
    from torch.profiler import ProfilerActivity
    run_step()
    torch.cuda.synchronize(dev)
    main_tid = threading.get_native_id()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run_step()
        torch.cuda.synchronize(dev)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    return summarize(trace.get("traceEvents", []), steps, main_tid, dev.index or 0)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _intersection(xs, ys) -> float:
    """Length of the overlap of two sorted disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _folded(streams: dict[str, dict], keep: int = 4) -> dict[str, dict]:
    """``streams`` with the loader's beyond its ``keep`` busiest (kernel and copy time) summed into one row: a
    decoder keeps a stream per thread, dozens of near-identical rows."""
    loader = sorted((s for s, row in streams.items() if row["role"] not in ("train", "nccl")),
                    key=lambda s: -(streams[s].get("kernel_ms", 0) + streams[s].get("copy_ms", 0)))
    rest = loader[keep:]
    if len(rest) < 2:
        return streams
    out = {s: row for s, row in streams.items() if s not in rest}
    merged: dict = {"role": "loader", "streams": len(rest)}
    names: dict[str, float] = defaultdict(float)
    for s in rest:
        for key in ("kernels_per_step", "kernel_ms", "busy_ms", "copies_per_step", "copy_ms", "copy_mb"):
            if key in streams[s]:
                merged[key] = round(merged.get(key, 0) + streams[s][key], 3)
        for name, ms in streams[s].get("top", []):
            names[name] += ms
    merged["top"] = [[n, round(ms, 3)] for n, ms in sorted(names.items(), key=lambda kv: -kv[1])[:6]]
    out[f"{len(rest)} more loader streams"] = merged
    return out


def summarize(events: list[dict], steps: int, main_tid: int, device: int) -> dict:
    """The per-step summary of a chrome trace's events (times in ms per step)."""
    kernels: dict[int, list[dict]] = defaultdict(list)
    copies: dict[int, list[dict]] = defaultdict(list)
    calls: list[dict] = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, args = e.get("cat", ""), e.get("args") or {}
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            if args.get("device", device) != device:
                continue
            (kernels if cat == "kernel" else copies)[args.get("stream", -1)].append(e)
        elif cat in ("cuda_runtime", "cuda_driver"):
            calls.append(e)
    if not kernels:
        return {"error": "no kernel in the trace (CUPTI not available?)"}

    def is_nccl(ks):
        return sum(k.get("name", "").startswith("nccl") for k in ks) > len(ks) / 2

    roles = {s: "nccl" for s, ks in kernels.items() if is_nccl(ks)}
    rest = [s for s in kernels if s not in roles]
    train = max(rest, key=lambda s: len(kernels[s])) if rest else None
    for s in rest:
        roles[s] = "train" if s == train else "loader"
    per = 1000.0 * steps   # trace times are microseconds

    def iv(es):
        return _union([(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in es])

    streams = {}
    busy = {s: iv(ks) for s, ks in kernels.items()}
    for s, ks in kernels.items():
        by_name: dict[str, float] = defaultdict(float)
        for k in ks:
            by_name[k.get("name", "?")[:90]] += float(k.get("dur", 0))
        top = sorted(by_name.items(), key=lambda kv: -kv[1])[:6]
        streams[str(s)] = {"role": roles[s], "kernels_per_step": round(len(ks) / steps, 1),
                           "kernel_ms": round(sum(float(k.get("dur", 0)) for k in ks) / per, 3),
                           "busy_ms": round(_length(busy[s]) / per, 3),
                           "top": [[n, round(t / per, 3)] for n, t in top]}
    for s, cs in copies.items():
        row = streams.setdefault(str(s), {"role": roles.get(s, "copies only")})
        row["copies_per_step"] = round(len(cs) / steps, 1)
        row["copy_ms"] = round(sum(float(c.get("dur", 0)) for c in cs) / per, 3)
        row["copy_mb"] = round(sum(float((c.get("args") or {}).get("bytes", 0)) for c in cs) / steps / 2**20, 2)
    out: dict = {"steps": steps, "streams": _folded(streams)}
    if train is not None:
        t = busy[train]
        span = t[-1][1] - t[0][0]
        loader = _union([x for s in kernels if roles[s] == "loader" for x in busy[s]])
        out.update(train_span_ms=round(span / per, 3), train_busy_ms=round(_length(t) / per, 3),
                   train_gap_ms=round((span - _length(t)) / per, 3),
                   train_kernel_ms=streams[str(train)]["kernel_ms"],
                   loader_kernel_ms=round(sum(streams[str(s)]["kernel_ms"] for s in kernels if roles[s] == "loader"), 3),
                   overlap_ms=round(_intersection(t, loader) / per, 3),
                   train_gaps_over_50us=sum(1 for (a0, b0), (a1, _) in zip(t, t[1:]) if a1 - b0 > 50) / steps)
    # a call that queued a kernel or a copy is that stream's (by CUPTI's correlation id), whichever thread made it
    queued = {e["args"]["correlation"]: roles.get(s, "copies only")
              for s, es in list(kernels.items()) + list(copies.items()) for e in es
              if (e.get("args") or {}).get("correlation") is not None}
    api: dict[tuple[str, bool, str], list[float]] = defaultdict(list)
    for e in calls:
        correlation = (e.get("args") or {}).get("correlation")
        target = queued.get(correlation, "-") if correlation is not None else "-"
        api[(e.get("name", "?"), e.get("tid") == main_tid, target)].append(float(e.get("dur", 0)))
    top = sorted(api.items(), key=lambda kv: -sum(kv[1]))[:20]
    out["api"] = [{"name": n, "thread": "train" if main else "other", "queues_on": target,
                   "calls_per_step": round(len(d) / steps, 1), "ms_per_step": round(sum(d) / per, 3),
                   "us_per_call": round(sum(d) / len(d), 2), "max_ms": round(max(d) / 1000.0, 3)}
                  for (n, main, target), d in top]
    return out
