"""ingest under several settings, paired by round: which one trains faster beside the same model.

Each round runs `bench_gpu.py`'s variant ``a`` (the Loader alone, then feeding ResNet-18) once per setting, in
the order given, each in its own `bench_gpu.py` process with the setting's ``INGEST_*`` environment; ``--dali``
adds DALI's variant ``d`` to each round. Machines differ by more than most settings do (DALI's training rate
moved 18% between sessions), so a setting is only ever compared with the first one in the same round: the JSON
has every run's headline (loader img/s, training img/s, the GPU's time per step and the share it stalled for
batches, peak memory, each stage's cost beside training) and, per setting, its training rate over the first
setting's in each round. ``--synthetic`` adds the same model trained on synthetic data (variant ``s``) to each
round: its GPU time per step depends on nothing but the host, so a round whose synthetic step is over 5% above the
session's fastest ran on a slowed GPU (other tenants; H100 hosts here ran ResNet-18's step at 26 to 43 ms), and
each setting's ``mean_steady`` leaves such rounds out.

    python benchmarks/bench_settings.py --data /dev/shm/ingest_bench_20k --out $OUT/settings.json \\
        --setting auto=INGEST_HW_DECODER_LOAD=auto --setting split=INGEST_HW_DECODER_LOAD=0.65 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_gpu import _get, _ratio  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--data", help="ImageFolder-layout JPEG directory (benchmarks/make_data.py)")
    p.add_argument("--out", required=True, help="JSON file to write (each run's bench_gpu JSON goes next to it)")
    p.add_argument("--setting", action="append", required=True, metavar="NAME=VAR=VALUE[,VAR=VALUE]",
                   help="a named setting: INGEST_* variables for its runs (NAME= alone: the defaults)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dali", action="store_true", help="DALI's variant d in each round too")
    p.add_argument("--synthetic", action="store_true",
                   help="the model on synthetic data (variant s) in each round too, to flag rounds on a slowed host")
    p.add_argument("--seconds", type=float, default=5.0, help="bench_gpu --seconds (the loader alone)")
    p.add_argument("--train-seconds", type=float, default=10.0)
    p.add_argument("--warmup-seconds", type=float, default=2.0)
    p.add_argument("--dry-run", action="store_true", help="bench_gpu --dry-run (CPU, tiny): checks the code path")
    a = p.parse_args(argv)
    a.settings = [parse_setting(s) for s in a.setting]
    names = [n for n, _ in a.settings]
    if len(set(names)) != len(names):
        p.error(f"setting names must differ, got {names}")
    if {"dali", "synthetic"} & set(names):
        p.error("'dali' and 'synthetic' name the reference runs; give the setting another name")
    return a


def parse_setting(text: str) -> tuple[str, dict[str, str]]:
    """``NAME=VAR=VALUE,VAR=VALUE`` as (NAME, {VAR: VALUE}); each VAR must be one of ingest's ``INGEST_*``."""
    name, _, rest = text.partition("=")
    env = {}
    for item in filter(None, rest.split(",")):
        var, sep, value = item.partition("=")
        if not sep or not var.startswith("INGEST_"):
            raise SystemExit(f"--setting {text!r}: expected NAME=INGEST_VAR=VALUE[,INGEST_VAR=VALUE]")
        env[var] = value
    if not name:
        raise SystemExit(f"--setting {text!r}: the setting needs a name")
    return name, env


def headline(result: dict) -> dict:
    """What a run's comparison needs from its bench_gpu result."""
    train = result.get("train") or {}
    keys = ("img_s", "data_wait_frac", "gpu_step_ms", "gpu_data_stall_frac", "loader_stages", "error")
    memory = result.get("memory") or {}
    stats = result.get("loader_stats") if isinstance(result.get("loader_stats"), dict) else {}
    return {"loader_img_s": result.get("img_s"), "error": result.get("error"),
            "peak_mb": memory.get("device_peak_mb"), "torch_max_reserved_mb": memory.get("torch_max_reserved_mb"),
            "buffers": stats.get("buffers"), "train": {k: train[k] for k in keys if k in train}}


STEADY = 1.05   # a round whose synthetic GPU step is more than this over the session's fastest ran on a slowed host


def steady_rounds(rounds: list[dict]) -> list[int] | None:
    """The rounds whose synthetic-data GPU step is within `STEADY` of the fastest round's (None: no synthetic runs)."""
    steps = [_get(r.get("synthetic") or {}, "train", "gpu_step_ms") for r in rounds]
    if not any(steps):
        return None
    fastest = min(s for s in steps if s)
    return [k for k, s in enumerate(steps) if s and s <= fastest * STEADY]


def compare(rounds: list[dict], names: list[str]) -> dict:
    """Per setting, its training img/s over the first setting's in each round (None where either failed), their
    mean, and in how many rounds it was faster; with DALI, each setting's over DALI's in the same round. With
    synthetic runs, also ``steady_rounds`` (`steady_rounds`) and each setting's mean over those alone."""
    def train(run):
        return _get(run or {}, "train", "img_s")

    steady = steady_rounds(rounds)
    out = {} if steady is None else {"steady_rounds": steady}
    base = names[0]
    for name in names:
        per = [_ratio(train(r.get(name)), train(r.get(base))) for r in rounds]
        row = {"train_over_" + base: per}
        got = [x for x in per if x is not None]
        if got and name != base:
            row["mean"], row["faster_rounds"] = round(statistics.mean(got), 4), sum(x > 1 for x in got)
            calm = [per[k] for k in steady or () if per[k] is not None]
            if calm:
                row["mean_steady"] = round(statistics.mean(calm), 4)
        if any("dali" in r for r in rounds):
            row["train_over_dali"] = [_ratio(train(r.get(name)), train(r.get("dali"))) for r in rounds]
        out[name] = row
    return out


def run_bench(args, variants: str, env: dict[str, str], out: Path) -> dict:
    """One bench_gpu.py process: its report (``results`` by variant name, ``ingest_env``), or {"error": ...}."""
    cmd = [sys.executable, str(HERE / "bench_gpu.py"), "--only", variants, "--out", str(out),
           "--seconds", str(args.seconds), "--train-seconds", str(args.train_seconds),
           "--warmup-seconds", str(args.warmup_seconds)]
    cmd += ["--dry-run"] if args.dry_run else ["--data", args.data]
    full = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}   # only this setting's
    done = subprocess.run(cmd, env={**full, **env}, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        return {"error": f"bench_gpu exited {done.returncode}: {done.stderr[-2000:]}"}
    return json.loads(out.read_text())


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    runs_dir = out.with_suffix("").parent / (out.stem + "_runs")
    runs_dir.mkdir(parents=True, exist_ok=True)
    names = [n for n, _ in args.settings]
    report = {"benchmark": "bench_settings", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:],
              "settings": dict(args.settings), "rounds": []}
    for rnd in range(args.rounds):
        this = {}
        for name, env in args.settings:
            report_a = run_bench(args, "a", env, runs_dir / f"{name}_r{rnd}.json")
            this[name] = headline(report_a.get("results", {}).get("ingest_mixed", report_a))
            this[name]["ingest_env"] = report_a.get("ingest_env")
            print(f"[bench_settings] round {rnd + 1}: {name}: {this[name]['train']}", flush=True)
        if args.dali:
            report_d = run_bench(args, "d", {}, runs_dir / f"dali_r{rnd}.json")
            this["dali"] = headline(report_d.get("results", {}).get("dali_mixed", report_d))
        if args.synthetic:
            report_s = run_bench(args, "s", {}, runs_dir / f"synthetic_r{rnd}.json")
            this["synthetic"] = headline(report_s.get("results", {}).get("synthetic", report_s))
        report["rounds"].append(this)
        report["compared"] = compare(report["rounds"], names)
        out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["compared"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
