"""The training loop's share of the GIL beside a loader at full speed (issue 32's measure), ingest against DALI.

A pure-Python thread (`bench_gpu.Busy`: ``sum(range(2000))`` in a loop, a stand-in for a training loop's Python
side) counts its iterations alone, then while the main thread takes the loader's batches as fast as they come.
``gil_share_left`` is its rate beside the loader over its rate alone: 1.0 means the loader took none of the
thread's time. Issue 32's target is >= 0.9 for the file tree and every record format (DALI: 0.77-0.81).

For every input (the JPEG file tree, and the same JPEGs packed by ``ingest convert`` into TFRecord, RecordIO,
LMDB, WebDataset and raw pixel shards) and every feed:

  ingest/<engine>  ``ingest.Loader`` with bench_gpu's training pipeline (mixed decode, RandomResizedCrop 224,
                   flip, normalize to float NCHW), the ``engine`` setting of `ingest.defaults` set to each of
                   ``--engines`` (where this ingest has no such setting: "python" only, the others recorded
                   as skipped). An engine the Loader reports it did not run (``stats()["engine"]``), or that
                   refuses the input with a ConfigError, is recorded as skipped with the reason.
  dali             DALI 2.4, where ``nvidia.dali`` imports, with the same augmentation as bench_gpu's variant
                   d: ``readers.file`` / ``readers.tfrecord`` / ``readers.mxnet`` / ``readers.webdataset``;
                   raw shards through ``readers.numpy`` over one .npy per sample (made once from the shards)
                   + ``random_resized_crop`` on the GPU. DALI has no reader for ingest's LMDB layout (its caffe
                   and caffe2 readers take Caffe Datum / Caffe2 TensorProtos): recorded as skipped.

Each case runs in its own subprocess (a fresh CUDA context): the loader is built, warmed up and run alone for
``--seconds`` (``img_s_alone``); then ``--pairs`` alone/beside pairs, each the busy thread alone for
``--busy-seconds`` while the loader idles (its prefetch full), then beside the loader taken at full speed for as
long. A pair's share is the ratio of its two adjacent rates (a host's clock and neighbours drift by tens of percent
between seconds apart); each figure is the median over the pairs, the pairs kept under ``pairs``. Also per case:
``busy_lost_ms_per_batch``, the busy thread's lost time over the batches taken meanwhile ((1 - share) x window /
batches: what a batch costs a training thread in GIL time, hand-off waits included); ``consumer_cpu_ms_per_batch``,
the consuming thread's own CPU time per batch (the GIL it holds, plus native work it does without releasing it);
and where the busy thread's time went, from the kernel's ``schedstat``: ``busy_beside_sleep_frac`` (asleep: it
waits on nothing but the GIL) against ``busy_beside_runqueue_frac`` (runnable, waiting for a core). On a host with
cores to spare the GIL's waits show as sleep; where the cores are all busy the thread's wake-ups queue too, and
part of the GIL's cost shows as run-queue time: compare with ``busy_alone_runqueue_frac``. The share splits
into ``gil_time_share_left`` (the wall time the busy thread kept on a CPU: what the GIL and the run queue took)
times ``busy_cpu_speed_beside`` (its rate per CPU second beside the loader over alone: what the cores gave it, a
hyperthread sibling or clock step slowing it with no GIL involved); on a host whose cores the loader keeps busy the
second part moves the share by tens of percent between pairs, the first does not.
Cases alternate within a round (ingest, DALI, ingest, ... per input); with ``--rounds`` > 1 every other round
runs in reverse order, and ``summary`` holds each figure's mean over the rounds.

The JSON goes to ``<--out-dir>/<device slug>/<--name>.json`` (default out-dir benchmarks/results/bench_gil),
with the device name, the host's core count, the versions and every figure.

    python benchmarks/bench_gil.py --smoke          # CPU, tiny data: every code path (about a minute on 2 cores)
    python benchmarks/bench_gil.py --data /dev/shm/ingest_gil_10k --work /dev/shm/ingest_gil_packed \\
        --n 10000 --batch 256 --threads 16 --out-dir $OUT --name gil     # GPU machine
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import bench_gpu  # noqa: E402
from bench_formats import convert  # noqa: E402

INPUTS = ("filetree", "tfrecord", "recordio", "lmdb", "wds", "raw")
DALI_SKIPS = {"lmdb": "DALI has no reader for ingest's LMDB layout (readers.caffe / caffe2 take Caffe Datum / "
                      "Caffe2 TensorProtos)"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--data", help="ImageFolder JPEG tree (made with make_data.py when absent; default "
                                  "/dev/shm/ingest_gil_<n>, or a temporary directory with --smoke)")
    p.add_argument("--work", help="where the packed copies go (default: <data>_packed); kept and reused")
    p.add_argument("--n", type=int, default=None, help="images to make when --data is absent (10000; --smoke 48)")
    p.add_argument("--inputs", default=",".join(INPUTS), help=f"comma-separated subset of {', '.join(INPUTS)}")
    p.add_argument("--engines", default="python,native", help="ingest engines (the `engine` setting)")
    p.add_argument("--dali", choices=["auto", "off"], default="auto", help="auto: DALI where nvidia.dali imports")
    p.add_argument("--batch", type=int, default=None, help="batch size (256; --smoke 16)")
    p.add_argument("--threads", type=int, default=None, help="DALI's threads and make_data/convert workers "
                                                              "(default: the cores)")
    p.add_argument("--raw-size", type=int, default=None, help="side of the raw shards' pixels (256; --smoke 64)")
    p.add_argument("--seconds", type=float, default=None, help="loader-alone and beside windows (2.5; --smoke 0.5)")
    p.add_argument("--busy-seconds", type=float, default=None, help="each alone and beside window of a pair "
                                                                 "(0.6; --smoke 0.2)")
    p.add_argument("--pairs", type=int, default=None, help="alone/beside pairs per case, medians reported (5; 2)")
    p.add_argument("--warmup-seconds", type=float, default=None, help="loader warm-up (1.5; --smoke 0.2)")
    p.add_argument("--warmup-batches", type=int, default=None, help="at least this many warm-up batches (10; 2)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--prefetch", type=int, default=2, help="ingest Loader prefetch (DALI's queue depth is 2)")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="cuda (default) or cpu (--smoke)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny data and windows: checks every code path")
    p.add_argument("--out-dir", default=None, help="default benchmarks/results/bench_gil (--smoke: a temporary "
                                                    "directory's bench_gil_smoke)")
    p.add_argument("--name", default="bench_gil", help="the JSON's file name, without .json")
    p.add_argument("--child", help=argparse.SUPPRESS)          # a case, as JSON
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    smoke = a.smoke
    for key, full, tiny in (("n", 10000, 48), ("batch", 256, 16), ("raw_size", 256, 64), ("seconds", 2.5, 0.5),
                            ("busy_seconds", 0.6, 0.2), ("pairs", 5, 2), ("warmup_seconds", 1.5, 0.2), ("warmup_batches", 10, 2),
                            ("device", "cuda", "cpu")):
        if getattr(a, key) is None:
            setattr(a, key, tiny if smoke else full)
    a.threads = a.threads or (2 if smoke else os.cpu_count() or 1)
    a.out_dir = a.out_dir or str(Path(tempfile.gettempdir()) / "bench_gil_smoke" if smoke
                                 else HERE / "results" / "bench_gil")
    a.inputs = [x for x in a.inputs.split(",") if x]
    a.engines = [x for x in a.engines.split(",") if x]
    unknown = set(a.inputs) - set(INPUTS)
    if unknown:
        p.error(f"Unknown input(s) {sorted(unknown)}. Available: {', '.join(INPUTS)}")
    if a.batch < 1 or a.n < a.batch or a.rounds < 1:
        p.error(f"`--batch` must be >= 1, `--n` >= `--batch` and `--rounds` >= 1, got {a.batch}, {a.n}, {a.rounds}")
    return a


# ==================================================================================================
# Parent: data, the cases in alternating order, one subprocess each, the JSON


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    t_all = time.perf_counter()
    report = {"benchmark": "bench_gil", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:],
              "host": bench_gpu.host_info(), "versions": bench_gpu.versions(), "ingest_env": bench_gpu.ingest_env(),
              "switch_interval_s": sys.getswitchinterval(),
              "config": {k: v for k, v in vars(args).items() if not k.startswith("child")}}
    report["device"] = device_name(args.device)
    report["cores"] = report["host"]["affinity"]
    out = Path(args.out_dir) / device_slug(report["device"], report["cores"]) / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    logs = out.parent / f"{args.name}_logs"
    logs.mkdir(exist_ok=True)
    report["data"], sources = prepare(args, logs)
    report["engines"] = engines_available(args.engines)
    dali = dali_available() if args.dali == "auto" else "off (--dali off)"
    report["dali"] = dali
    if dali is True and "raw" in sources:
        try:
            report["data"]["raw_npy"] = npy_copy(sources["raw"], args)
            sources["raw_npy"] = report["data"]["raw_npy"]["path"]
        except Exception as err:  # noqa: BLE001 - DALI's raw case is then skipped, the rest goes on
            report["data"]["raw_npy"] = {"error": f"{type(err).__name__}: {err}"}
    cases = plan_cases(args, sources, report["engines"], dali)
    report["rounds"] = []
    for rnd in range(args.rounds):
        order = cases if rnd % 2 == 0 else cases[::-1]
        results = {}
        for case in order:
            key = case_key(case)
            print(f"[bench_gil] round {rnd + 1}/{args.rounds}: {key} ...", flush=True)
            if case.get("skipped"):
                res = {"skipped": case["skipped"]}
            else:
                res = run_case(case, args, logs / f"{key.replace(':', '.')}.r{rnd}.log")
            results[key] = res
            print(f"[bench_gil]   {one_line(res)}", flush=True)
            report["rounds"] = [*report["rounds"][:rnd], results]
            report["summary"] = summarize(report["rounds"])
            report["wall_seconds"] = round(time.perf_counter() - t_all, 1)
            bench_gpu._write(out, report)
    report["summary"] = summarize(report["rounds"])
    report["wall_seconds"] = round(time.perf_counter() - t_all, 1)
    bench_gpu._write(out, report)
    print_table(report)
    print(f"[bench_gil] wrote {out} ({report['wall_seconds']} s)")
    return 0


def device_name(device: str) -> str:
    if device == "cpu":
        return "cpu"
    return bench_gpu._nvidia_smi_name() or "cuda"


def device_slug(name: str, cores: int) -> str:
    """A short folder name for a device and core count: "NVIDIA H100 80GB HBM3", 16 -> "h100-16cores"; a name
    without a model number is lowercased with dashes ("cpu", 2 -> "cpu-2cores")."""
    model = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    base = model.group(1).lower() if model else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"
    return f"{base}-{cores}cores"


def prepare(args, logs: Path) -> tuple[dict, dict[str, str]]:
    """The JPEG tree (made when absent) and its packed copies (made when absent): a description, and each
    input's path (an input whose conversion failed is left out, its error in the description)."""
    import make_data
    if args.data is None:
        args.data = (str(Path(tempfile.gettempdir()) / f"ingest_gil_smoke_{args.n}") if args.smoke
                     else f"/dev/shm/ingest_gil_{args.n}")
    args.work = args.work or args.data.rstrip("/") + "_packed"
    info: dict = {"jpegs": args.data, "work": args.work, "convert": {}}
    t0 = time.perf_counter()
    if not Path(args.data).is_dir():
        make_data.make_dataset(args.data, n=args.n, classes=100 if args.n >= 1000 else 4, seed=0,
                               workers=args.threads)
        info["make_seconds"] = round(time.perf_counter() - t0, 1)
    info["dataset"] = bench_gpu.dataset_stats(args.data)
    sources = {"filetree": args.data} if "filetree" in args.inputs else {}

    def packed(fmt: str) -> dict:
        dst = Path(args.work) / fmt
        if (dst / "manifest.json").exists():
            return {"reused": True}
        extra = ("--raw-size", f"{args.raw_size}x{args.raw_size}") if fmt == "raw" else ()
        return convert(args.data, dst, fmt, args.threads, logs / f"convert_{fmt}.log", extra)

    formats = [x for x in args.inputs if x != "filetree"]
    # The converters run side by side: each is mostly its interpreter's start and one pass over the files.
    with ThreadPoolExecutor(max(1, len(formats))) as pool:
        info["convert"] = dict(zip(formats, pool.map(packed, formats)))
    for fmt in formats:
        if "error" not in info["convert"][fmt]:
            sources[fmt] = str(Path(args.work) / fmt)
    info["prepare_seconds"] = round(time.perf_counter() - t0, 1)
    return info, sources


def engines_available(wanted: list[str]) -> dict[str, str | bool]:
    """Each wanted engine: True where this ingest can be asked for it, else why it is skipped."""
    from ingest import defaults
    if "engine" not in defaults.names():
        return {e: True if e == "python" else "this ingest has no `engine` setting: only its Python stages run"
                for e in wanted}
    out: dict[str, str | bool] = {}
    for e in wanted:
        try:
            with defaults.set(engine=e):
                pass
            out[e] = True
        except Exception as err:  # noqa: BLE001 - a value the setting refuses
            out[e] = f"the `engine` setting refuses {e!r}: {err}"
    return out


def dali_available() -> bool | str:
    try:
        import nvidia.dali  # noqa: F401
        import nvidia.dali.plugin.pytorch  # noqa: F401
        return True
    except Exception as err:  # noqa: BLE001 - ImportError, or a missing shared library
        return f"unavailable: {type(err).__name__}: {err}"


def npy_copy(raw_dir: str, args) -> dict:
    """The raw shards as one .npy per sample under ``<work>/raw_npy`` (for DALI's numpy reader), made once."""
    from bench_raw import npy_files
    from ingest.formats.raw import RawSource
    root, src, t0 = Path(args.work) / "raw_npy", RawSource(raw_dir), time.perf_counter()
    made = npy_files(src, root)
    return {"path": str(root), "files": len(src), "reused": not made, "seconds": round(time.perf_counter() - t0, 1)}


def plan_cases(args, sources: dict, engines: dict, dali) -> list[dict]:
    """Per input, ingest's engines and DALI alternating: ingest, DALI, ingest, ..."""
    cases = []
    for name in args.inputs:
        if name not in sources:
            continue
        ingest_cases = [{"input": name, "feed": "ingest", "engine": e, "path": sources[name],
                         **({} if ok is True else {"skipped": ok})} for e, ok in engines.items()]
        if dali is not True:
            dali_case = {"skipped": str(dali)}
        elif name in DALI_SKIPS:
            dali_case = {"skipped": DALI_SKIPS[name]}
        elif name == "raw" and "raw_npy" not in sources:
            dali_case = {"skipped": "no .npy copy of the raw shards (see data.raw_npy)"}
        else:
            dali_case = {"path": sources["raw_npy" if name == "raw" else name]}
        dali_case.update(input=name, feed="dali")
        cases += [ingest_cases[0], dali_case, *ingest_cases[1:]]
    return cases


def case_key(case: dict) -> str:
    return f"{case['input']}:{case['feed']}" + (f"_{case['engine']}" if case.get("engine") else "")


def run_case(case: dict, args, log: Path) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(case), *child_argv(args)]
    budget = args.pairs * (2 * args.busy_seconds + 0.2) + args.warmup_seconds + args.seconds + 120
    return bench_gpu.run_json_child(cmd, dict(os.environ, PYTHONUNBUFFERED="1"), budget, log, case_key(case))


def child_argv(args) -> list[str]:
    out = []
    for key in ("batch", "threads", "seconds", "busy_seconds", "pairs", "warmup_seconds", "warmup_batches", "prefetch",
                "device", "n"):
        out += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    return out + (["--smoke"] if args.smoke else [])


FIGURES = ("gil_share_left", "gil_time_share_left", "busy_cpu_speed_beside", "busy_lost_ms_per_batch", "img_s_alone",
           "img_s_beside", "img_s_beside_over_alone", "busy_beside_sleep_frac", "busy_beside_runqueue_frac",
           "consumer_cpu_ms_per_batch")


def summarize(rounds: list[dict], figures: tuple[str, ...] = FIGURES, done: str = "gil_share_left",
              keep: tuple[str, ...] = ("engine_reported",)) -> dict:
    """Each case's ``figures``, the mean over the rounds where it gave ``done`` (and each round's value), plus
    the first such round's ``keep`` fields; a case that never did: its skip reason or error."""
    out: dict = {}
    for key in dict.fromkeys(k for r in rounds for k in r):
        runs = [r[key] for r in rounds if key in r]
        ran = [x for x in runs if x.get(done) is not None]
        if not ran:
            out[key] = {"skipped": runs[0]["skipped"]} if runs[0].get("skipped") else {"error": runs[0].get("error")}
            continue
        row = {}
        for f in figures:
            vals = [x[f] for x in ran if x.get(f) is not None]
            if vals:
                row[f] = round(sum(vals) / len(vals), 4 if "over" in f or "share" in f or "frac" in f else 2)
                row[f + "_rounds"] = vals
        row.update({k: ran[0].get(k) for k in keep})
        out[key] = row
    return out


def one_line(res: dict) -> str:
    if res.get("skipped"):
        return f"skipped: {res['skipped'][:200]}"
    if res.get("error"):
        return f"ERROR {res['error'][:300]}"
    return (f"share left {res.get('gil_share_left')}, lost {res.get('busy_lost_ms_per_batch')} ms/batch, "
            f"{res.get('img_s_alone')} img/s alone, {res.get('img_s_beside')} beside ({res.get('child_seconds')} s)")


def print_table(report: dict) -> None:
    print(f"\n{report['device']} | {report['cores']} cores | batch {report['config']['batch']}")
    print(f"{'case':<26}{'share left':>11}{'ms/batch':>10}{'img/s alone':>13}{'img/s beside':>14}  note")
    for key, row in report["summary"].items():
        note = (row.get("skipped") or row.get("error") or "")[:70]
        print(f"{key:<26}{bench_gpu._fmt(row.get('gil_share_left'), 3):>11}"
              f"{bench_gpu._fmt(row.get('busy_lost_ms_per_batch'), 2):>10}{bench_gpu._fmt(row.get('img_s_alone')):>13}"
              f"{bench_gpu._fmt(row.get('img_s_beside')):>14}  {note}")


# ==================================================================================================
# Child: one case


def child_main(args) -> int:
    case = json.loads(args.child)
    return bench_gpu.run_in_child(case_key(case), args.child_out, args.device == "cpu",
                                  lambda dev, res, flush: measure(case, args, dev, res, flush))


class Skip(Exception):
    """The case does not run here (an engine that is not eligible); the message says why."""


def measure(case: dict, args, dev, res: dict, flush) -> None:
    res.update(input=case["input"], feed=case["feed"], engine=case.get("engine"), path=case["path"])
    with contextlib.ExitStack() as stack:
        try:
            feed = build_feed(case, args, dev, stack, res)
            gen = feed.endless()
            x, y = next(gen)
            check_engine(case, feed, res)
        except Skip as why:
            res["skipped"] = str(why)
            return
        bench_gpu.sync(dev)
        res["check"] = bench_gpu.describe_batch(x, y, args.batch) if y is not None else {"shape": list(x.shape)}
        del x, y
        n, t0 = 1, time.perf_counter()
        while n < args.warmup_batches or time.perf_counter() - t0 < args.warmup_seconds:
            next(gen)
            n += 1
        bench_gpu.sync(dev)
        res["warmup_batches"] = n
        flush()

        batches, seconds, _ = window(gen, args, dev)
        res.update(img_s_alone=round(batches * args.batch / seconds, 1), batches_alone=batches)
        pairs = [pair(gen, args, dev) for _ in range(args.pairs)]
        for key in pairs[0]:
            res[key] = round(statistics.median(p[key] for p in pairs), 4)
        res["pairs"] = pairs
        res["busy_lost_ms_per_batch"] = round(statistics.median(
            (1 - p["gil_share_left"]) * p["seconds_beside"] * 1000 / p["batches_beside"] for p in pairs), 3)
        res["img_s_beside_over_alone"] = round(res["img_s_beside"] / res["img_s_alone"], 4)
        if feed.stats is not None:
            stats = bench_gpu.loader_stats(feed.stats)
            res["loader_stats"] = {k: stats.get(k) for k in ("engine", "read_path", "decode_paths", "buffers",
                                                             "native") if k in stats} if isinstance(stats, dict) else stats
        flush()
        if feed.close is not None:
            feed.close()


def pair(gen, args, dev) -> dict:
    """One alone/beside pair: the busy thread alone while the loader idles (its prefetch full), then beside the
    loader taken at full speed; the share is the ratio of the two adjacent rates, so a host's slow drift (clock,
    neighbours) cancels out."""
    time.sleep(0.2)   # the loader fills its prefetch and idles
    out = {}
    with bench_gpu.Busy() as busy:
        t0, before = time.perf_counter(), schedstat(busy)
        time.sleep(args.busy_seconds)
        wall = time.perf_counter() - t0
        alone = busy.count / wall
        out.update(where_time_went(busy, before, wall, "busy_alone"))
    with bench_gpu.Busy() as busy:
        t0, before = time.perf_counter(), schedstat(busy)
        batches, seconds, cpu = window(gen, args, dev, args.busy_seconds)
        wall = time.perf_counter() - t0
        beside = busy.count / wall
        out.update(where_time_went(busy, before, wall, "busy_beside"))
    out.update(busy_rate_alone=round(alone, 1), busy_rate_beside=round(beside, 1),
               gil_share_left=round(beside / alone, 4), img_s_beside=round(batches * args.batch / seconds, 1),
               batches_beside=batches, seconds_beside=round(seconds, 3),
               consumer_cpu_ms_per_batch=round(1000 * cpu / batches, 4))
    out.update(split_share(out))
    return out


def split_share(p: dict) -> dict:
    """A pair's ``gil_share_left`` as the product of two parts, from the busy thread's ``schedstat``:
    ``gil_time_share_left``, the share of its wall time it kept on a CPU (1 less the growth of its time asleep,
    waiting for the GIL, and runnable in the run queue) and ``busy_cpu_speed_beside``, its rate per second on a
    CPU beside the loader over alone (what the cores gave it: a hyperthread sibling or a clock step slows it
    without the GIL). Empty where the kernel gave no ``schedstat``."""
    try:
        off = lambda side: p[f"busy_{side}_sleep_frac"] + p[f"busy_{side}_runqueue_frac"]   # noqa: E731
        speed = (p["busy_rate_beside"] / p["busy_beside_cpu_frac"]) / (p["busy_rate_alone"] / p["busy_alone_cpu_frac"])
    except (KeyError, ZeroDivisionError):
        return {}
    return {"gil_time_share_left": round(1 - max(0.0, off("beside") - off("alone")), 4),
            "busy_cpu_speed_beside": round(speed, 4)}


def schedstat(busy) -> tuple[float, float] | None:
    """The busy thread's seconds on a CPU and waiting in the run queue so far (Linux ``schedstat``), or None."""
    try:
        with open(f"/proc/self/task/{busy._thread.native_id}/schedstat") as f:
            on_cpu, queued, _ = (int(v) for v in f.read().split())
        return on_cpu / 1e9, queued / 1e9
    except (OSError, ValueError):
        return None


def where_time_went(busy, before, wall: float, prefix: str) -> dict:
    """Where the busy thread's wall time went since ``before`` (`schedstat`): on a CPU (``cpu_frac``), runnable but
    waiting for a core (``runqueue_frac``) and asleep (``sleep_frac``: waiting for the GIL, the only thing it waits
    on). Empty where the kernel does not report it."""
    after = schedstat(busy)
    if before is None or after is None or wall <= 0:
        return {}
    cpu, queued = after[0] - before[0], after[1] - before[1]
    return {f"{prefix}_cpu_frac": round(cpu / wall, 4), f"{prefix}_runqueue_frac": round(queued / wall, 4),
            f"{prefix}_sleep_frac": round(max(0.0, 1 - (cpu + queued) / wall), 4)}


def window(gen, args, dev, seconds: float | None = None) -> tuple[int, float, float]:
    """Batches taken as fast as they come for ``seconds`` (default ``--seconds``), ended by a device synchronise:
    (batches, wall seconds, this thread's CPU seconds: the consumer's own work per batch, GIL held)."""
    n, t0, c0 = 0, time.perf_counter(), time.thread_time()
    limit = args.seconds if seconds is None else seconds
    while n < 2 or time.perf_counter() - t0 < limit:
        next(gen)
        n += 1
    bench_gpu.sync(dev)
    return n, time.perf_counter() - t0, time.thread_time() - c0


def build_feed(case: dict, args, dev, stack: contextlib.ExitStack, res: dict) -> bench_gpu.Feed:
    opts = argparse.Namespace(data=case["path"], batch=args.batch, threads=args.threads, prefetch=args.prefetch,
                              ingest_workers=None)
    if case["feed"] == "ingest":
        from ingest import defaults
        from ingest.errors import ConfigError
        if "engine" in defaults.names():
            stack.enter_context(defaults.set(engine=case["engine"]))   # for the loader's whole life
        try:
            return bench_gpu.build_ingest(opts, dev, "mixed" if dev.type == "cuda" else "cpu")
        except ConfigError as err:
            if case["engine"] == "python":
                raise
            raise Skip(f"the Loader refused engine {case['engine']!r}: {err}") from err
    if case["input"] == "raw":
        res["dali_reader"] = "readers.numpy over one .npy per sample"
        return dali_numpy_feed(opts, dev)
    reader, res["dali_reader"] = DALI_READERS[case["input"]](case["path"])
    return bench_gpu.build_dali(opts, dev, reader=reader)


def check_engine(case: dict, feed, res: dict) -> None:
    """Record the engine the Loader reports; an engine other than the one asked for is a skip, with the
    Loader's reason where it gives one."""
    if case["feed"] != "ingest" or feed.stats is None:
        return
    stats = bench_gpu.loader_stats(feed.stats)
    reported = stats.get("engine") if isinstance(stats, dict) else None
    res["engine_reported"] = reported
    name = reported.get("name") if isinstance(reported, dict) else reported
    if reported is None:
        if case["engine"] != "python":
            raise Skip(f"the Loader reports no engine (asked for {case['engine']!r})")
        return
    if name != case["engine"] and case["engine"] != "auto":
        reason = ""
        if isinstance(reported, dict):
            reason = reported.get("reason") or reported.get("why") or ""
        reason = reason or (stats.get("engine_reason") or "" if isinstance(stats, dict) else "")
        raise Skip(f"asked for engine {case['engine']!r}, the Loader ran {name!r}" + (f": {reason}" if reason else ""))


# -- DALI's readers over the packed copies: each (fn, types, shard) -> (encoded images, labels) ------------


def _files(path: str, suffix: str) -> list[str]:
    return sorted(str(p) for p in Path(path).glob(f"*{suffix}"))


def dali_tfrecord(path: str):
    def reader(fn, types, shard):
        import nvidia.dali.tfrecord as tfrec
        files = _files(path, ".tfrecord")
        out = fn.readers.tfrecord(path=files, index_path=[f + ".idx" for f in files], random_shuffle=True,
                                  name="Reader", shard_id=shard[0], num_shards=shard[1],
                                  features={"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                                            "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
        return out["image/encoded"], out["image/class/label"]
    return reader, "readers.tfrecord (the converter's DALI indexes)"


def dali_recordio(path: str):
    def reader(fn, types, shard):
        files = _files(path, ".rec")
        return fn.readers.mxnet(path=files, index_path=[dali_recordio_index(files)], random_shuffle=True,
                                name="Reader", shard_id=shard[0], num_shards=shard[1])
    return reader, "readers.mxnet (one index over the shards, made from the converter's .idx files)"


def dali_recordio_index(files: list[str]) -> str:
    """DALI's mxnet reader takes one index for all its .rec files, its offsets counted through the files as one
    stream: the shards' own .idx files joined so (written once, beside the shards)."""
    out = Path(files[0]).with_name("dali_all.idx")
    if not out.exists():
        lines, base, key = [], 0, 0
        for f in files:
            for line in Path(f[:-4] + ".idx").read_text().split("\n"):
                if line.strip():
                    lines.append(f"{key}\t{base + int(line.split()[1])}")
                    key += 1
            base += os.path.getsize(f)
        tmp = out.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(out)
    return str(out)


def dali_wds(path: str):
    def reader(fn, types, shard):
        images, cls = fn.readers.webdataset(paths=_files(path, ".tar"), ext=["jpg", "cls"], random_shuffle=True,
                                            name="Reader", shard_id=shard[0], num_shards=shard[1])
        return images, fn.pad(cls, shape=[8])   # the label's ASCII bytes, padded: DALI does not parse text
    return reader, "readers.webdataset, no index (DALI scans the tars); labels as the cls member's bytes"


DALI_READERS = {"filetree": lambda path: (None, "readers.file"), "tfrecord": dali_tfrecord,
                "recordio": dali_recordio, "wds": dali_wds}


def dali_numpy_feed(opts, dev) -> bench_gpu.Feed:
    """DALI's numpy reader over one .npy per sample (on the CPU, then the GPU where there is one) + the same
    augmentation on pixels: random_resized_crop 224, flip, normalize to float NCHW. Images only."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    cuda = dev.type == "cuda"

    @pipeline_def
    def pipe():
        images = fn.readers.numpy(file_root=opts.data, file_filter="*.npy", random_shuffle=True, name="Reader")
        images = fn.random_resized_crop(images.gpu() if cuda else images, size=[224, 224],
                                        random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=bench_gpu.MEAN,
                                        std=bench_gpu.STD, mirror=fn.random.coin_flip(probability=0.5))

    p = pipe(batch_size=opts.batch, num_threads=opts.threads, device_id=(dev.index or 0) if cuda else None, seed=0,
             prefetch_queue_depth=2)
    p.build()
    it = DALIGenericIterator([p], ["data"], reader_name="Reader", last_batch_policy=LastBatchPolicy.DROP,
                             auto_reset=True)
    return bench_gpu.Feed(it, lambda b: (b[0]["data"], None), first_iter=it)


if __name__ == "__main__":
    sys.exit(main())
