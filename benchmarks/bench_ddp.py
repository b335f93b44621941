"""Scaling over GPUs under torchrun (issue 7): bench_gpu's classification pipeline (ingest's defaults, mixed
decode, RandomResizedCrop 224 + flip + normalize, batch 256 per GPU) feeding ResNet-18 wrapped in
DistributedDataParallel, on 1 GPU and on N, with the GPU memory each GPU holds.

    python benchmarks/bench_ddp.py --data /dev/shm/ingest_bench_20k --gpus 1,2 --out out/bench_ddp.json

runs ``torchrun --nproc_per_node G`` for every G of --gpus (this script's ``--rank-run`` mode), each rank:

1. the loader alone for --seconds: images per second of its shard (the Loader shards by rank itself);
2. DDP training for --train-seconds, the loader feeding it: images per second, the share of the time the
   training loop waited for data, the GPU's side of it (bench_gpu's ``gpu_step_ms`` and
   ``gpu_data_stall_frac``) and each loader stage's cost per batch meanwhile;
3. throughout, the device-wide GPU memory in use on its GPU (every 20 ms through NVML, else cudaMemGetInfo, as
   bench_gpu samples it), peak and before the loader started (the rank's own context);
4. with ``--diagnose N``, where the step's GPU time goes: the fixed batch's steps timed with the loader running
   beside them (its batches dropped), then N profiled steps of each case (fed, fixed batch, fixed batch beside
   the loader) summed per CUDA stream by ``gpu_profile.py``.

Rank 0 gathers every rank's figures; the JSON holds them per world size, totals (the sum over ranks) and
the ratios of N GPUs to one. Targets (issue 7): loader and training >= 1.9x one GPU on two, each GPU's
memory equal to the one-GPU run's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_gpu  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="ImageFolder JPEG directory (benchmarks/make_data.py)")
    p.add_argument("--out", help="JSON file to write (logs go next to it); not with --rank-run")
    p.add_argument("--gpus", default="1,2", help="comma-separated GPU counts to run (default 1,2)")
    p.add_argument("--batch", type=int, default=256, help="batch size per GPU")
    p.add_argument("--seconds", type=float, default=8.0, help="loader-alone window")
    p.add_argument("--train-seconds", type=float, default=10.0, help="DDP training window")
    p.add_argument("--warmup-seconds", type=float, default=3.0)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--feed", choices=["ingest", "dali"], default="ingest",
                   help="what feeds the ranks: ingest's Loader (default) or DALI's mixed pipeline, for reference")
    p.add_argument("--threads", type=int, help="DALI's num_threads per rank (default: the cores over the ranks)")
    p.add_argument("--blocking-sync", action="store_true",
                   help="each rank's CUDA context waits by blocking (CU_CTX_SCHED_BLOCKING_SYNC) instead of spinning: "
                        "the loader's and the training loop's waiting threads leave their cores to the others")
    p.add_argument("--diagnose", type=int, default=0, metavar="N",
                   help="also where the GPU step goes (gpu_profile.py): N profiled steps fed by the loader, on the "
                        "fixed batch, and on the fixed batch with the loader running beside (its batches dropped)")
    p.add_argument("--rank-run", metavar="JSON", help=argparse.SUPPRESS)   # a rank's part, under torchrun
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rank_run:
        return rank_main(args)
    if not args.out:
        raise SystemExit("--out is required")
    out = Path(args.out).resolve()
    logs = out.parent / (out.stem + "_logs")
    logs.mkdir(parents=True, exist_ok=True)
    report = {"benchmark": "bench_ddp", "feed": args.feed, "ingest_env": bench_gpu.ingest_env(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:],
              "host": bench_gpu.host_info(), "versions": bench_gpu.versions(),
              "config": {k: v for k, v in vars(args).items() if k != "rank_run"}, "runs": {}}
    for g in [int(x) for x in args.gpus.split(",")]:
        part = logs / f"gpus{g}.json"
        part.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={g}",
               str(Path(__file__).resolve()), "--data", args.data, "--rank-run", str(part),
               "--batch", str(args.batch), "--seconds", str(args.seconds), "--train-seconds", str(args.train_seconds),
               "--warmup-seconds", str(args.warmup_seconds), "--model", args.model, "--feed", args.feed]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        if args.diagnose:
            cmd += ["--diagnose", str(args.diagnose)]
        if args.blocking_sync:
            cmd += ["--blocking-sync"]
        print(f"[bench_ddp] {g} GPU(s) ...", flush=True)
        with open(logs / f"gpus{g}.log", "w") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                timeout=args.seconds + args.train_seconds + 240).returncode
        run = json.loads(part.read_text()) if part.exists() else {}
        if rc != 0:
            run["error"] = f"torchrun exited {rc}; see {logs.name}/gpus{g}.log"
        report["runs"][str(g)] = run
        print(f"[bench_ddp]   {json.dumps(run.get('total', run.get('error')))}", flush=True)
        report["derived"] = derive(report["runs"])
        bench_gpu._write(out, report)
    print(json.dumps(report["derived"], indent=1))
    print(f"[bench_ddp] wrote {out}")
    return 0


def derive(runs: dict) -> dict:
    one = (runs.get("1") or {}).get("total")
    out = {}
    for g, run in runs.items():
        total = run.get("total")
        if g == "1" or not one or not total:
            continue
        out[f"loader_{g}_over_1"] = bench_gpu._ratio(total["loader_img_s"], one["loader_img_s"])
        out[f"train_{g}_over_1"] = bench_gpu._ratio(total["train_img_s"], one["train_img_s"])
        out[f"synthetic_train_{g}_over_1"] = bench_gpu._ratio(total.get("synthetic_train_img_s"),
                                                              one.get("synthetic_train_img_s"))
        out[f"max_gpu_memory_{g}_over_1"] = bench_gpu._ratio(total["max_gpu_peak_mb"], one["max_gpu_peak_mb"])
        # torch's share (the loader's buffers and the model's): equal when only NCCL's buffers differ
        out[f"max_torch_reserved_{g}_over_1"] = bench_gpu._ratio(
            max(r["memory"].get("torch_max_reserved_mb") or 0 for r in run["ranks"]),
            max(r["memory"].get("torch_max_reserved_mb") or 0 for r in runs["1"]["ranks"]))
    return out


def rank_main(args) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    local = int(os.environ["LOCAL_RANK"])
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.ones(1, device=dev)   # this rank's context, before the memory baseline
    if args.blocking_sync:   # CU_CTX_SCHED_BLOCKING_SYNC: threads waiting on the GPU sleep instead of spinning
        import ctypes
        status = ctypes.CDLL("libcuda.so.1").cuCtxSetFlags(0x04)
        if status != 0:
            raise SystemExit(f"cuCtxSetFlags(CU_CTX_SCHED_BLOCKING_SYNC) failed: CUresult {status}")
    mem = bench_gpu.MemSampler(dev)
    mem.start()
    if args.feed == "dali":
        from ingest import defaults
        args.threads = args.threads or defaults.cores()   # this rank's share of the host, as ingest's threads take
        feed = bench_gpu.build_dali(args, dev, shard=(rank, world))
    else:
        args.ingest_workers = None   # ingest's defaults, as bench_gpu's variant a
        feed = bench_gpu.build_ingest(args, dev, "mixed")
    gen = feed.endless()
    res: dict = {"rank": rank, "device": torch.cuda.get_device_name(dev), "context_mb": round(mem.ctx_used / 2**20, 1)}

    # 1. the loader alone
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < args.warmup_seconds:
        next(gen)
    bench_gpu.sync(dev)
    dist.barrier()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        x, _ = next(gen)
        count += x.shape[0]
    bench_gpu.sync(dev)
    res["loader_img_s"] = round(count / (time.perf_counter() - t0), 1)
    dist.barrier()

    # 2. DDP training fed by the loader
    step, dtype = bench_gpu.make_step(dev, args, wrap=lambda m: DistributedDataParallel(m, device_ids=[local]))

    # Every rank takes the same number of steps, warm-up included: DDP's all-reduce hangs otherwise (ranks that
    # each warmed up for --warmup-seconds took different step counts). Three steps, then a warm-up of about
    # --warmup-seconds, then the timed window, each count taken from rank 0's rate in the phase before.
    count = torch.tensor([3], device=dev)
    for seconds in (args.warmup_seconds, args.train_seconds):
        dist.broadcast(count, 0)
        n, t0 = int(count.item()), time.perf_counter()
        for _ in range(n):
            step(*next(gen))
        bench_gpu.sync(dev)
        count = torch.tensor([max(3, round(seconds * n / (time.perf_counter() - t0)))], device=dev)
    dist.broadcast(count, 0)
    before = bench_gpu.loader_stats(feed.stats) if feed.stats is not None else None
    steps = int(count.item())
    el, wait, marks, (x, y) = timed_steps(steps, lambda: next(gen), step, dev)
    res.update(train_img_s=round(steps * args.batch / el, 1), steps=steps, data_wait_frac=round(wait / el, 4),
               amp_dtype=dtype, **bench_gpu.gpu_timeline(marks))
    if before is not None:   # each loader stage's cost per batch beside DDP training: which one holds it back
        res["loader_stages"] = bench_gpu.stage_delta(before, bench_gpu.loader_stats(feed.stats))
    # 3. the same steps on one fixed batch (no loader): what DDP itself scales to on this host
    x, y = x.clone(), y.clone()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(x, y)
    bench_gpu.sync(dev)
    res["synthetic_train_img_s"] = round(steps * args.batch / (time.perf_counter() - t0), 1)
    if args.diagnose:
        res["diagnose"] = diagnose(args, dev, step, gen, x, y, steps)
    mem.stop()
    res["memory"] = mem.result()
    if feed.close is not None:
        feed.close()

    everyone = [None] * world
    dist.all_gather_object(everyone, res)
    if rank == 0:
        peaks = [r["memory"].get("device_peak_mb") or 0 for r in everyone]
        total = {"gpus": world, "loader_img_s": round(sum(r["loader_img_s"] for r in everyone), 1),
                 "train_img_s": round(sum(r["train_img_s"] for r in everyone), 1),
                 "synthetic_train_img_s": round(sum(r["synthetic_train_img_s"] for r in everyone), 1),
                 "max_gpu_peak_mb": max(peaks), "gpu_peak_mb": peaks,
                 "gpu_data_stall_frac": [r.get("gpu_data_stall_frac") for r in everyone]}
        Path(args.rank_run).write_text(json.dumps({"total": total, "ranks": everyone}, indent=1))
    dist.destroy_process_group()
    return 0


def timed_steps(steps: int, batch, step, dev) -> tuple[float, float, list, tuple]:
    """``steps`` training steps on ``batch()``'s batches, a CUDA event recorded before and after each step: the
    seconds they took (the device synchronized at the end), the seconds spent in ``batch()``, the events (for
    `bench_gpu.gpu_timeline`) and the last batch."""
    import torch
    wait, marks, t0 = 0.0, [], time.perf_counter()
    for _ in range(steps):
        a = time.perf_counter()
        x, y = batch()
        wait += time.perf_counter() - a
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        step(x, y)
        end.record()
        marks.append((begin, end))
    bench_gpu.sync(dev)
    return time.perf_counter() - t0, wait, marks, (x, y)


def diagnose(args, dev, step, gen, x, y, steps: int) -> dict:
    """The fixed batch's steps with the loader running beside them (its batches dropped: its CPU and GPU work
    without the data dependency), timed as the fed window; then the profiler's view of the three cases."""
    import torch.distributed as dist
    import gpu_profile

    def fixed():   # the loader's batch taken and dropped, the fixed one trained on
        next(gen)
        return x, y

    dist.barrier()
    el, _, marks, _ = timed_steps(steps, fixed, step, dev)
    out = {"beside": {"train_img_s": round(steps * args.batch / el, 1), **bench_gpu.gpu_timeline(marks)}}
    for name, run in (("fed", lambda: step(*next(gen))), ("synthetic", lambda: step(x, y)),
                      ("beside", lambda: step(*fixed()))):
        dist.barrier()
        out[f"profile_{name}"] = gpu_profile.profile(run, args.diagnose, dev)
    return out


if __name__ == "__main__":
    sys.exit(main())
