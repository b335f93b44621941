"""Developer script: the README's one-GPU speed table, from committed `bench_gpu.py` JSONs.

Usage: python dev/readme_speed.py RUN.json [RUN.json ...] [--extra "LABEL=FILE:VARIANT" ...]

Each RUN gives a column entry (joined with " / ") for ingest's default loader (variant a), DALI (d), their
ratios (the run's own `derived`, so ratios are only ever taken within a run) and synthetic data (s);
``--extra`` adds a row for one variant of another file. Paths are relative to ``benchmarks/results``. The
README names the command above its table, and ``tests/test_readme.py`` checks the table is its output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
HEADER = ("| loader | img/s | training img/s | data wait | GPU memory |\n"
          "|---|---|---|---|---|")
ROWS = (("ingest, GPU decode in the training process (default)", "ingest_mixed"),
        ("DALI 2.4, mixed decode", "dali_mixed"))


def _count(v) -> str:
    return "—" if v is None else f"{round(v):,}"


def _cells(result: dict) -> list[str]:
    train = result.get("train") or {}
    memory = (result.get("memory") or {}).get("device_peak_mb")
    wait = train.get("data_wait_frac")
    return [_count(result.get("img_s")), _count(train.get("img_s")),
            "—" if wait is None else f"{wait:.2f}", "—" if memory is None else f"{_count(memory)} MB"]


def _row(label: str, columns: list[list[str]]) -> str:
    """One table row: each cell the runs' values joined with " / " (one dash where no run has a value)."""
    cells = [" / ".join(c) if set(c) != {"—"} else "—" for c in zip(*columns)]
    return "| " + " | ".join([label] + cells) + " |"


def table(runs: list[str], extras: list[str] = ()) -> str:
    reports = [json.loads((RESULTS / name).read_text()) for name in runs]
    lines = [HEADER]
    for label, key in ROWS:
        lines.append(_row(label, [_cells(r["results"][key]) for r in reports]))
    ratios = [[str(d.get(k)) for k in ("a_over_d", "train_a_over_d")] + ["—", str(d.get("mem_a_over_d"))]
              for d in (r["derived"] for r in reports)]
    lines.append(_row("ingest / DALI", ratios))
    lines.append(_row("synthetic data (upper bound)", [_cells(r["results"].get("synthetic", {}))[:2] + ["—", "—"]
                                                        for r in reports]))
    for extra in extras:
        label, _, spec = extra.rpartition("=")   # the label may hold "=" itself
        name, _, variant = spec.rpartition(":")
        report = json.loads((RESULTS / name).read_text())
        lines.append(_row(label, [_cells(report["results"][variant])]))
    return "\n".join(lines)


def from_args(argv: list[str] | None = None) -> str:
    """The table for a command line (this script's arguments)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--extra", action="append", default=[])
    args = p.parse_args(argv)
    return table(args.runs, args.extra)


def main() -> None:
    print(from_args())


if __name__ == "__main__":
    main()
