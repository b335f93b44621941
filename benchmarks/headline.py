"""The README's headline table: same-run ratios read from the committed results JSON.

Usage: python benchmarks/headline.py            # print the table
       python benchmarks/headline.py --write    # rewrite it in README.md and docs/benchmarks.md, between markers

Every ratio is taken within one run (the baseline ran in the same session, on the same host), because the
shared GPU machines move ~±15% between sessions. A row names its file under ``benchmarks/results/``;
``benchmarks/results/INDEX.md`` says how each was made and ``docs/benchmarks.md`` how to make it again.
``tests/test_readme.py`` checks the README's and the docs' tables are this script's output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
#: The documents that show the table, between `BEGIN` and `END`.
DOCUMENTS = (README, ROOT / "docs" / "benchmarks.md")
BEGIN = "<!-- headline: python benchmarks/headline.py --write -->"
END = "<!-- /headline -->"

RAMP = "bench_ramp/h200/models_hw_split.json"
RAW = "bench_raw/h200/native_draws.json"
DETECTION = "bench_detection/h200/native_engine.json"
#: with the masks (the native engine; ingest and DALI only) / images only (ingest_images and dali_images), one session
SEGMENTATION = ("bench_segmentation/h200/native_masks.json", "bench_segmentation/h200/python_png.json")
CPU = "bench_cpu/cpu-2core/bench_cpu.json"
DDP = ("bench_ddp/h200x4/feed_ingest.json", "bench_ddp/h200x4/feed_dali.json")
GIL = "bench_gil/h200x2-16cores/native_vs_dali.json"
#: the second of two rounds against DALI in one run with the CPU share's default (the committed code; the first is
#: share_smallest_r2.json)
CODECS = "bench_codecs/h200/jpeg2k_smallest_final.json"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _joined(values: list[float], digits: int = 2) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


def rows() -> list[tuple[str, str, str, str]]:
    """(figure, ingest / baseline, run, files) for each headline figure (files: names joined by ", ")."""
    ramp = _load(RAMP)["summary"]
    raw = _load(RAW)["ratios"]
    det = _load(DETECTION)["derived"]
    masks, images = (_load(name)["derived"] for name in SEGMENTATION)
    cpu = _load(CPU)["derived"]
    ours, dali = (_load(name)["runs"] for name in DDP)
    gil = _load(GIL)["summary"]
    codecs = _load(CODECS)["results"]

    def ddp(field: str) -> str:
        return _joined([ours[g]["total"][field] / dali[g]["total"][field] for g in ("1", "2", "4")])

    # the ramp's ingest cases at hw_decoder_load 1.0 ("hw1"): the default since that run
    head = [ramp[f"{m}_ingest_auto_hw1"]["head_img_s"] / ramp[f"{m}_dali"]["head_img_s"] for m in ("resnet18", "resnet50")]
    return [
        ("ResNet-18 / ResNet-50 training img/s over the first 300 steps, vs DALI 2.4",
         _joined(head), "H200, 16 cores, one round", RAMP),
        ("ResNet-18 training img/s under torchrun, vs DALI 2.4: 1 / 2 / 4 GPUs", ddp("train_img_s"),
         "4x H200 host, 16 cores a rank, back to back in one session", f"{DDP[0]}, {DDP[1]}"),
        ("the loader alone under torchrun, img/s, vs DALI 2.4: 1 / 2 / 4 GPUs", ddp("loader_img_s"),
         "4x H200 host, 16 cores a rank, back to back in one session", f"{DDP[0]}, {DDP[1]}"),
        ("peak GPU memory per GPU (model included) under torchrun, vs DALI 2.4: 1 / 2 / 4 GPUs",
         ddp("max_gpu_peak_mb"), "4x H200 host, 16 cores a rank, back to back in one session", f"{DDP[0]}, {DDP[1]}"),
        ("the loader at full speed beside a busy Python thread, img/s vs DALI 2.4: file tree / TFRecord",
         _joined([gil[f"{x}:ingest_native"]["img_s_beside"] / gil[f"{x}:dali"]["img_s_beside"]
                  for x in ("filetree", "tfrecord")]), "H200, 16 cores, one run", GIL),
        ("raw uint8 shards (no decode) vs DALI's JPEG pipeline / its numpy reader",
         f"{raw['loader_over_dali_jpeg']:.2f} / {raw['loader_over_dali_numpy_cpu']:.2f}", "H200, 16 cores, batch 512", RAW),
        ("segmentation (VOC JPEG + PNG class map, crop 512 + flip), vs DALI 2.4: with the masks / images only",
         f"{masks['ingest_over_dali']:.2f} / {images['ingest_images_over_dali_images']:.2f}",
         "H200, batch 32, two runs of one session", ", ".join(SEGMENTATION)),
        ("detection in the training process (COCO boxes, IoU crop, resize 800/1333), vs DALI 2.4's best variant",
         f"{det['ingest_over_dali_best_any']:.2f}", "H200, batch 32, one run", DETECTION),
        ("JPEG 2000 (ImageNet-sized, RandomResizedCrop 224) vs DALI 2.4 mixed: lossy 9/7 / lossless 5/3",
         _joined([codecs[f"{s}/ingest_mixed"]["img_s"] / codecs[f"{s}/dali_mixed"]["img_s"]
                  for s in ("j2k_lossy", "j2k_lossless")]),
         "H200, 16 cores, batch 256, one of two rounds", CODECS),
        ("CPU decode + augmentation vs DataLoader + PIL (2 workers)",
         f"{cpu['ingest_over_dataloader']:.2f}", "2 CPU cores, 3 rounds", CPU),
    ]


def table() -> str:
    lines = ["| figure | ingest / baseline | run | file (`benchmarks/results/`) |", "|---|---|---|---|"]
    lines += [f"| {f} | **{r}** | {run} | {', '.join(f'`{n}`' for n in name.split(', '))} |"
              for f, r, run, name in rows()]
    return "\n".join(lines)


def shown_table(text: str) -> str:
    """The table between a document's markers."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip("\n")


def write() -> None:
    for path in DOCUMENTS:
        text = path.read_text()
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
        path.write_text(text[:start] + "\n" + table() + "\n" + text[end:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help="rewrite the table in README.md and docs/benchmarks.md")
    if p.parse_args().write:
        write()
    else:
        print(table())


if __name__ == "__main__":
    main()
