"""Developer probe (CPU): JPEG 2000 decoded whole against only the area a RandomResizedCrop reads (OpenJPEG's
decode area, `ingest.decode.openjpeg`), through `CpuDecoder.decode_batch` on its thread pool.

The sets are bench_codecs.py's (made under ``--root`` where absent, from make_data.py's ImageNet-shaped photos):
j2k_lossy (9/7 at 20:1), j2k_lossless (5/3) and j2k_large (4x upscaled, 1024 x 1024 tiles). Per set, regions are
drawn as RandomResizedCrop draws them (area 0.08-1, ratio 3/4-4/3; bench_codecs.random_crops, seed 0); each round
times the whole decode and the region decode of every image once, in alternating order, and the first batch's
regions are checked against the whole decode's pixels.

``--busy``: bench_gpu's busy thread (pure Python) runs beside the decodes, as a training loop runs beside a
loader, and each round also gives the share of its count it kept against the same thread alone: a decode that
takes the GIL back often waits a switch interval at each take-back, and slows the thread beside it.

Usage: python dev/openjpeg_area.py [--root DIR] [--images 64] [--large-images 16] [--rounds 2] [--busy]
       [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default="/tmp/ingest_openjpeg_area")
    p.add_argument("--images", type=int, default=64, help="images of the ImageNet-shaped sets")
    p.add_argument("--large-images", type=int, default=16, help="images of j2k_large (each is slow to encode)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--busy", action="store_true", help="a counting Python thread beside the decodes")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import numpy as np
    import bench_codecs
    from ingest.decode import openjpeg
    from ingest.decode.cpu import CpuDecoder
    if not openjpeg.available():
        raise SystemExit("no libopenjp2 here: nothing to compare")
    report = {"probe": "openjpeg_area", "host": platform.node(), "cores": len(os.sched_getaffinity(0)),
              "threads": args.threads, "sets": {}}
    alone = 0.0
    if args.busy:   # the counting thread's rate with nothing beside it
        alone = busy_rate(lambda: time.sleep(2.0))[0]
        report["busy_alone_per_s"] = round(alone)
    for name, count in (("j2k_lossy", args.images), ("j2k_lossless", args.images), ("j2k_large", args.large_images)):
        made = argparse.Namespace(root=f"{args.root}_{count}", images=count, workers=args.threads, sets=[name])
        stats = bench_codecs.make_sets(made)[name]
        files = bench_codecs.list_files(Path(stats["path"]))
        datas, names = [f.read_bytes() for f in files], [str(f) for f in files]
        with CpuDecoder(threads=args.threads) as cpu:
            sizes = [cpu.probe(d, n) for d, n in zip(datas, names)]
            regions = bench_codecs.random_crops(sizes, np.random.default_rng(0))
            whole = cpu.decode_batch(datas[:8], names[:8])
            cropped = cpu.decode_batch(datas[:8], names[:8], regions=regions[:8])
            for a, b, (x0, y0, x1, y1) in zip(whole, cropped, regions[:8].tolist()):
                assert np.array_equal(a[y0:y1, x0:x1], b[y0:y1, x0:x1]), "region pixels differ from the whole decode"
            rows = []
            for r in range(args.rounds):
                row = {}
                for way in (("whole", "region") if r % 2 == 0 else ("region", "whole")):
                    def run(way=way):
                        cpu.decode_batch(datas, names, regions=regions if way == "region" else None)
                    rate, seconds = busy_rate(run) if args.busy else (0.0, timed(run))
                    row[f"{way}_img_s"] = round(len(datas) / seconds, 2)
                    if args.busy:
                        row[f"{way}_busy_kept"] = round(rate / alone, 3)
                row["region_over_whole"] = round(row["region_img_s"] / row["whole_img_s"], 3)
                rows.append(row)
                print(f"{name} round {r}: {row}", flush=True)
        area = (regions[:, 2] - regions[:, 0]) * (regions[:, 3] - regions[:, 1])
        full = np.array([h * w for h, w in sizes])
        report["sets"][name] = {**stats, "mean_crop_area_share": round(float((area / full).mean()), 3),
                                "rounds": rows}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))


def timed(run) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def busy_rate(run) -> tuple[float, float]:
    """``run()`` beside bench_gpu's busy thread: the thread's count per second over it, and its seconds."""
    import bench_gpu
    with bench_gpu.Busy() as busy:
        seconds = timed(run)
    return busy.count / seconds, seconds


if __name__ == "__main__":
    main()
