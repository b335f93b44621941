"""The first training steps against the steady rate (issue 32's "no ramp"), ingest against DALI in one run.

Each case runs in its own subprocess (a fresh CUDA context): bench_gpu's training step (each of ``--model``,
bf16 autocast, channels_last, SGD, cuDNN's autotune on) is first run ``--model-warm-steps`` times on a synthetic
batch, so that cuDNN's autotuning and the model's own first-step costs fall outside the figures and on every feed
alike, then ``--synthetic-steps`` more, timed (``synthetic_img_s``: the model's rate without a loader); then the
loader is built (``build_seconds``) and its first batch taken (``first_batch_seconds``; DALI's iterator runs its
first batch while it is built, so ``start_seconds``, the two together, is what compares: reported, not in the
rates), and ``--steps`` training steps run from it at once, each step's end marked by a CUDA event on the
training stream (host timestamps on the CPU). From those:

  windows_img_s        images per second of each ``--window``-step window, from the first step on
  first_img_s          the first window's rate (steps 1-20 by default)
  first_steps_ms       the time of each step of the first two windows
  first_waits_ms       the host's time in each of those steps' ``next`` (the loader behind the loop)
  steady_wait_ms       the host's mean time in ``next`` over the steady steps
  head_img_s           the rate of the first ``--head`` steps (300: issue 32's "first 300 steps")
  steady_img_s         the rate from step ``--steady-from`` to the end
  first_over_steady    first over steady: issue 32's target is >= 0.9
  head_over_steady, all_over_steady    the first ``--head`` steps' and every step's rate over the steady rate
  steady_over_synthetic  the steady rate over ``synthetic_img_s`` (issue 32: >= 0.88)
  loader_stats.native_stage_ms, native_first_stage_ms   the native engine's stage times (its ``stats()``): the
                       mean per batch over the run and each of its first 64 batches (the ones made before the
                       first step included)

Feeds: ingest's Loader with bench_gpu's pipeline (mixed decode, RandomResizedCrop 224, flip, normalize; the
file tree at --data) under each ``--setting`` (named sets of ``INGEST_*`` variables, bench_settings' syntax;
default: the defaults alone) and each of ``--engines`` (the ``engine`` setting where this ingest has it), and
DALI's variant d of bench_gpu where ``nvidia.dali`` imports. Rounds alternate ingest and DALI and every other round
runs in reverse order; ``summary`` has each case's means over the rounds and ``derived`` ingest over DALI
(issue 32's target: >= 1.10 over the first 300 steps and at steady state, ``*_target_met``). With several
models (``--model resnet18,resnet50``) every case runs per model, its key prefixed with the model's name. Device
memory (bench_gpu's device-wide peak) is sampled from the loader's build to the end.

    python benchmarks/bench_ramp.py --smoke --out /tmp/ramp.json        # CPU, tiny: every code path
    python benchmarks/bench_ramp.py --data /dev/shm/ingest_bench_20k --out $OUT/bench_ramp.json \\
        --setting default= --setting nopad=INGEST_NVJPEG_HOST_PADDING=0 --rounds 2
    python benchmarks/bench_ramp.py --data /dev/shm/ingest_bench_20k --out $OUT/bench_ramp.json \\
        --model resnet18,resnet50 --engines auto --threads 16 --steps 340    # issue 32's two models
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import bench_gil  # noqa: E402
import bench_gpu  # noqa: E402
from bench_settings import parse_setting  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--data", help="ImageFolder JPEG tree (made with make_data.py when absent: 20000 images, "
                                  "or 48 with --smoke)")
    p.add_argument("--out", required=True, help="JSON file to write (logs go next to it)")
    p.add_argument("--setting", action="append", metavar="NAME=VAR=VALUE[,VAR=VALUE]",
                   help="a named set of INGEST_* variables for ingest's cases (default: 'default=', the defaults)")
    p.add_argument("--engines", default="python,native", help="ingest engines (the `engine` setting)")
    p.add_argument("--dali", choices=["auto", "off"], default="auto")
    p.add_argument("--model", default=None, help="torchvision model(s), comma-separated, each with all the cases "
                                                 "(resnet18; --smoke mobilenet_v3_small)")
    p.add_argument("--batch", type=int, default=None, help="batch size (256; --smoke 8)")
    p.add_argument("--threads", type=int, default=None, help="DALI's threads (default: the cores this process may use)")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--steps", type=int, default=None, help="training steps timed from the first batch (400; 12)")
    p.add_argument("--window", type=int, default=None, help="steps per window (20; --smoke 4)")
    p.add_argument("--steady-from", type=int, default=None, help="the steady rate's first step (200; --smoke 8)")
    p.add_argument("--head", type=int, default=None, help="steps of the head rate, from the first (300, or --steps "
                                                          "where fewer; --smoke 10)")
    p.add_argument("--model-warm-steps", type=int, default=None, help="synthetic steps before the loader (10; 1)")
    p.add_argument("--synthetic-steps", type=int, default=None, help="synthetic steps timed after those (30; 2)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="cuda (default) or cpu (--smoke)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny data and model steps: checks every code path")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for key, full, tiny in (("batch", 256, 8), ("steps", 400, 12), ("window", 20, 4), ("steady_from", 200, 8),
                            ("model_warm_steps", 10, 1), ("synthetic_steps", 30, 2),
                            ("device", "cuda", "cpu"), ("model", "resnet18", "mobilenet_v3_small")):
        if getattr(a, key) is None:
            setattr(a, key, tiny if a.smoke else full)
    a.head = a.head or min(10 if a.smoke else 300, a.steps)
    a.threads = a.threads or (2 if a.smoke else len(os.sched_getaffinity(0)))
    a.models = [m for m in a.model.split(",") if m]
    a.settings = [parse_setting(s) for s in (a.setting or ["default="])]
    a.engines = [e for e in a.engines.split(",") if e]
    if not 0 < a.window <= a.steady_from < a.steps:
        p.error(f"need 0 < --window <= --steady-from < --steps, got {a.window}, {a.steady_from}, {a.steps}")
    if not (0 < a.head <= a.steps and a.models and a.synthetic_steps >= 1):
        p.error(f"need 0 < --head <= --steps, a --model and --synthetic-steps >= 1, got {a.head}, {a.model!r}, "
                f"{a.synthetic_steps}")
    return a


# ==================================================================================================
# Parent


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    out = Path(args.out).resolve()
    logs = out.parent / (out.stem + "_logs")
    logs.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    if args.data is None:
        args.data = (str(Path(tempfile.gettempdir()) / "ingest_ramp_smoke_48") if args.smoke
                     else "/dev/shm/ingest_bench_20k")
    if not Path(args.data).is_dir():
        import make_data
        n = 48 if args.smoke else 20000
        make_data.make_dataset(args.data, n=n, classes=4 if args.smoke else 100, seed=0, workers=args.threads)
    report = {"benchmark": "bench_ramp", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:],
              "device": bench_gil.device_name(args.device), "host": bench_gpu.host_info(),
              "versions": bench_gpu.versions(), "ingest_env": bench_gpu.ingest_env(),
              "dataset": bench_gpu.dataset_stats(args.data),
              "config": {k: v for k, v in vars(args).items() if not k.startswith("child")}, "rounds": []}
    report["cores"] = report["host"]["affinity"]
    engines = bench_gil.engines_available(args.engines)
    dali = bench_gil.dali_available() if args.dali == "auto" else "off (--dali off)"
    cases = plan_cases(args, engines, dali)
    for rnd in range(args.rounds):
        results = {}
        for case in cases if rnd % 2 == 0 else cases[::-1]:
            key = case_key(case)
            print(f"[bench_ramp] round {rnd + 1}/{args.rounds}: {key} ...", flush=True)
            if case.get("skipped"):
                res = {"skipped": case["skipped"]}
            else:
                cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(case), "--out", str(out),
                       *child_argv(args)]
                env = {**os.environ, "PYTHONUNBUFFERED": "1", **case.get("env", {})}
                res = bench_gpu.run_json_child(cmd, env, 120 + args.steps * 0.3, logs / f"{key}.r{rnd}.log", key)
            results[key] = res
            print(f"[bench_ramp]   {one_line(res)}", flush=True)
            report["rounds"] = [*report["rounds"][:rnd], results]
            report["summary"] = summarize(report["rounds"])
            report["derived"] = derive(report["summary"])
            report["wall_seconds"] = round(time.perf_counter() - t_all, 1)
            bench_gpu._write(out, report)
    print_table(report)
    print(f"[bench_ramp] wrote {out} ({report['wall_seconds']} s)")
    return 0


def plan_cases(args, engines: dict, dali) -> list[dict]:
    """Per model, ingest's cases (each setting, each engine) with DALI after the first: ingest, DALI, ingest, ...
    A case names its model's key prefix (``prefix``) where there are several models."""
    cases = []
    for model in args.models:
        prefix = f"{model}_" if len(args.models) > 1 else ""
        ingest = [{"input": "filetree", "feed": "ingest", "engine": e, "path": args.data, "setting": name, "env": env,
                   "model": model, "prefix": prefix, **({} if ok is True else {"skipped": ok})}
                  for name, env in args.settings for e, ok in engines.items()]
        ref = {"input": "filetree", "feed": "dali", "path": args.data, "model": model, "prefix": prefix,
               **({} if dali is True else {"skipped": str(dali)})}
        cases += [ingest[0], ref, *ingest[1:]]
    return cases


def case_key(case: dict) -> str:
    prefix = case.get("prefix", "")
    if case["feed"] == "dali":
        return prefix + "dali"
    return prefix + f"ingest_{case['engine']}" + (f"_{case['setting']}" if case["setting"] != "default" else "")


def child_argv(args) -> list[str]:
    out = []
    for key in ("model", "batch", "threads", "prefetch", "steps", "window", "steady_from", "head", "model_warm_steps",
                "synthetic_steps", "device"):
        out += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    return out + (["--smoke"] if args.smoke else [])


FIGURES = ("first_img_s", "head_img_s", "steady_img_s", "first_over_steady", "head_over_steady", "all_over_steady",
           "synthetic_img_s", "steady_over_synthetic", "start_seconds", "device_peak_mb")


def summarize(rounds: list[dict]) -> dict:
    return bench_gil.summarize(rounds, FIGURES, "first_over_steady", keep=())


def derive(summary: dict) -> dict:
    """Each ingest case over its model's DALI case: the first window, the head (issue 32: >= 1.10), the steady
    rate (>= 1.10) and device memory; ``*_target_met`` where both rates are there."""
    out = {}
    for key, row in summary.items():
        if key.endswith("dali") or "first_img_s" not in row:
            continue
        d = summary.get(key[:key.index("ingest_")] + "dali", {})
        out[f"{key}_first_over_dali_first"] = bench_gpu._ratio(row.get("first_img_s"), d.get("first_img_s"))
        if "head_img_s" in row:
            out[f"{key}_head_over_dali_head"] = bench_gpu._ratio(row.get("head_img_s"), d.get("head_img_s"))
        out[f"{key}_steady_over_dali_steady"] = bench_gpu._ratio(row.get("steady_img_s"), d.get("steady_img_s"))
        out[f"{key}_memory_over_dali"] = bench_gpu._ratio(row.get("device_peak_mb"), d.get("device_peak_mb"))
        head = out.get(f"{key}_head_over_dali_head")
        if head is not None and out[f"{key}_steady_over_dali_steady"] is not None:
            out[f"{key}_target_met"] = head >= 1.10 and out[f"{key}_steady_over_dali_steady"] >= 1.10
    return out


def one_line(res: dict) -> str:
    if res.get("skipped"):
        return f"skipped: {res['skipped'][:200]}"
    if res.get("error"):
        return f"ERROR {res['error'][:300]}"
    return (f"first {res.get('first_img_s')} img/s, head {res.get('head_img_s')}, steady {res.get('steady_img_s')} "
            f"(synthetic {res.get('synthetic_img_s')}), ratio {res.get('first_over_steady')}, start {res.get('start_seconds')} s, windows "
            f"{res.get('windows_img_s')} ({res.get('child_seconds')} s)")


def print_table(report: dict) -> None:
    print(f"\n{report['device']} | {report['cores']} cores | batch {report['config']['batch']} | "
          f"{report['config']['steps']} steps, windows of {report['config']['window']}")
    print(f"{'case':<32}{'first':>9}{'head':>9}{'steady':>9}{'synthetic':>10}{'first/steady':>14}{'all/steady':>12}"
          f"{'peak MB':>9}  note")
    for key, row in report.get("summary", {}).items():
        note = (row.get("skipped") or row.get("error") or "")[:60]
        print(f"{key:<32}{bench_gpu._fmt(row.get('first_img_s')):>9}{bench_gpu._fmt(row.get('head_img_s')):>9}"
              f"{bench_gpu._fmt(row.get('steady_img_s')):>9}{bench_gpu._fmt(row.get('synthetic_img_s')):>10}"
              f"{bench_gpu._fmt(row.get('first_over_steady'), 3):>14}{bench_gpu._fmt(row.get('all_over_steady'), 3):>12}"
              f"{bench_gpu._fmt(row.get('device_peak_mb')):>9}  {note}")
    print("derived: " + ", ".join(f"{k}={v}" for k, v in report.get("derived", {}).items() if v is not None))


# ==================================================================================================
# Child: one case


def child_main(args) -> int:
    case = json.loads(args.child)
    args.model = case.get("model", args.model)
    return bench_gpu.run_in_child(case_key(case), args.child_out, args.device == "cpu",
                                  lambda dev, res, flush: measure(case, args, dev, res, flush))


def measure(case: dict, args, dev, res: dict, flush) -> None:
    import torch
    res.update(feed=case["feed"], engine=case.get("engine"), setting=case.get("setting"), model=args.model,
               ingest_env=bench_gpu.ingest_env())
    if dev.type == "cpu":   # a smoke run: torch's threads beside the loader's on a few cores ran 10x slower
        torch.set_num_threads(1)
    torch.backends.cudnn.benchmark = True   # as bench_gpu's training: autotuned in the warm steps
    step, res["amp_dtype"] = bench_gpu.make_step(dev, args)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224, generator=g).to(dev)
    y = torch.randint(0, bench_gpu.NUM_CLASSES, (args.batch,), generator=g).to(dev)
    for _ in range(args.model_warm_steps):   # cuDNN's autotuning and first-step costs, before any loader
        step(x, y)
    bench_gpu.sync(dev)
    t0 = time.perf_counter()
    for _ in range(args.synthetic_steps):   # the model's own rate, no loader
        step(x, y)
    bench_gpu.sync(dev)
    res["synthetic_img_s"] = round(args.batch * args.synthetic_steps / (time.perf_counter() - t0), 1)
    del x, y
    mem = bench_gpu.MemSampler(dev)
    mem.start()
    with contextlib.ExitStack() as stack:
        t0 = time.perf_counter()
        try:
            feed = bench_gil.build_feed(case, args, dev, stack, res)
            res["build_seconds"] = round(time.perf_counter() - t0, 3)
            gen = feed.endless()
            t0 = time.perf_counter()
            x, y = next(gen)
            res["first_batch_seconds"] = round(time.perf_counter() - t0, 3)
            # DALI's iterator runs its first batch while it is built: compare the two together
            res["start_seconds"] = round(res["build_seconds"] + res["first_batch_seconds"], 3)
            bench_gil.check_engine(case, feed, res)
        except bench_gil.Skip as why:
            res["skipped"] = str(why)
            return
        res["check"] = bench_gpu.describe_batch(x, y, args.batch)
        ends, waits = step_ends(gen, step, x, y, args.steps, dev)
        mem.stop()
        res.update(ramp(ends, args.batch, args.window, args.steady_from, args.head))
        res.update(step_figures(ends, waits, args.window, args.steady_from))
        res["steady_over_synthetic"] = round(res["steady_img_s"] / res["synthetic_img_s"], 4)
        res["memory"] = mem.result()
        res["device_peak_mb"] = res["memory"].get("device_peak_mb")
        if feed.stats is not None:
            stats = bench_gpu.loader_stats(feed.stats)
            res["loader_stats"] = {k: stats.get(k) for k in ("engine", "decode_paths", "buffers") if k in stats} \
                if isinstance(stats, dict) else stats
            native = stats.get("native") if isinstance(stats, dict) else None
            if isinstance(native, dict) and "stage_ms" in native:   # where the native engine's batches waited
                res["loader_stats"]["native_stage_ms"] = native["stage_ms"]
                res["loader_stats"]["native_first_stage_ms"] = native["first_stage_ms"]
        flush()
        if feed.close is not None:
            feed.close()


def step_ends(gen, step, x, y, steps: int, dev) -> tuple[list[float], list[float]]:
    """Seconds from just after the first batch arrived to the end of each of ``steps`` training steps (the first
    on that batch): from CUDA events on the training stream, read after one synchronise at the end, so the
    loop runs as a user's would; on the CPU from host clocks. Also the host's seconds in each step's ``next``
    (0 for the first): where the loader, not the step, held the loop."""
    import torch
    cuda = dev.type == "cuda"
    if cuda:
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        marks = []
    t0, host, waits = time.perf_counter(), [], []
    for s in range(steps):
        t = time.perf_counter()
        if s:
            x, y = next(gen)
        waits.append(time.perf_counter() - t)
        step(x, y)
        if cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            marks.append(end)
        else:
            host.append(time.perf_counter() - t0)
    bench_gpu.sync(dev)
    return ([start.elapsed_time(e) / 1000 for e in marks] if cuda else host), waits


def step_figures(ends: list[float], waits: list[float], window: int, steady_from: int) -> dict:
    """Each step of the first two windows, ms (a few long steps are waits on a buffer's regrowth; all of them
    longer, a loader behind), the host's wait in each of their ``next`` calls, and its mean wait over the steady
    steps (from step ``steady_from``, counted from 1)."""
    steady = waits[steady_from - 1:]
    return {"first_steps_ms": [round(1000 * (b - a), 2) for a, b in zip([0.0, *ends], ends[:2 * window])],
            "first_waits_ms": [round(1000 * w, 2) for w in waits[:2 * window]],
            "steady_wait_ms": round(1000 * sum(steady) / len(steady), 3) if steady else None}


def ramp(ends: list[float], batch: int, window: int, steady_from: int, head: int | None = None) -> dict:
    """The figures of `step_ends`' times: each window's rate, the first window's, the first ``head`` steps' (where
    given) and the steady one's (from step ``steady_from``, counted from 1, to the last) and their ratios."""
    def rate(first: int, last: int) -> float:   # steps first..last, counted from 1
        before = ends[first - 2] if first > 1 else 0.0
        return batch * (last - first + 1) / (ends[last - 1] - before)

    n = len(ends)
    windows = [round(rate(k + 1, k + window), 1) for k in range(0, n - window + 1, window)]
    first, steady, whole = rate(1, window), rate(steady_from, n), rate(1, n)
    out = {"steps": n, "windows_img_s": windows, "first_img_s": round(first, 1), "steady_img_s": round(steady, 1),
           "all_img_s": round(whole, 1), "first_over_steady": round(first / steady, 4),
           "all_over_steady": round(whole / steady, 4)}
    if head is not None:
        rate_head = rate(1, min(head, n))
        out.update(head_steps=min(head, n), head_img_s=round(rate_head, 1), head_over_steady=round(rate_head / steady, 4))
    return out


if __name__ == "__main__":
    sys.exit(main())
