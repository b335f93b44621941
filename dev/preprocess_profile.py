"""Developer probe: what one served batch costs the `ingest.serve.Preprocessor`, and where that time goes.

The served spec (`benchmarks/bench_serve.py`'s: shorter side 256, centre crop 224, ImageNet normalisation to
float32 CHW) runs over batches of ``--sizes`` JPEGs from ``--data`` (or generated ones), one batch at a time on the
calling thread, as a Triton instance runs them. For each size: milliseconds per batch (wall, the device waited
for) and the fit ``fixed + per_image * n`` over the sizes, which says whether a served batch of about 20 pays
mostly a per-batch or a per-image cost. Then, at ``--profile-size``: cProfile's functions by own time (the
Python on the thread; the profiler's cost inflates every call alike, so compare shares) and, on CUDA,
`benchmarks/gpu_profile.py`'s account of the batch's streams and CUDA calls (``train`` there is the stream with
the most kernels: the ops'), which says whether the GPU or the host holds the batch.

Usage: python dev/preprocess_profile.py [--data DIR] [--sizes 1,16,64] [--profile-size 16] [--runs 50]
                                        [--device cuda:0] [--json F]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "benchmarks"))
sys.path.insert(0, str(HERE.parent))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="a directory of JPEGs (searched recursively); default: generated images")
    p.add_argument("--images", type=int, default=256, help="JPEGs held in memory and cycled through")
    p.add_argument("--sizes", default="1,16,64", help="batch sizes timed")
    p.add_argument("--profile-size", type=int, default=16, help="the batch size profiled")
    p.add_argument("--runs", type=int, default=50, help="timed batches per size (after 10 untimed)")
    p.add_argument("--device", default=None, help="cuda:N or cpu (default cuda:0 where there is CUDA)")
    p.add_argument("--top", type=int, default=25, help="cProfile rows kept")
    p.add_argument("--json", help="write the report here")
    return p.parse_args(argv)


def fit(points: dict[int, float]) -> dict[str, float]:
    """Least squares ``ms = fixed + per_image * n`` over (n, ms) points (two or more sizes)."""
    import numpy as np
    if len(points) < 2:
        return {}
    per_image, fixed = np.polyfit(list(points), list(points.values()), 1)
    return {"fixed_ms": round(float(fixed), 4), "per_image_ms": round(float(per_image), 5)}


def batches(items: list, size: int):
    """Endless batches of ``size`` items, cycling through ``items``."""
    k = 0
    while True:
        yield [items[(k + j) % len(items)] for j in range(size)]
        k += size


def main(argv=None) -> int:
    args = parse_args(argv)
    import numpy as np
    import torch

    import bench_serve
    from ingest.serve import Preprocessor
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    jpegs = bench_serve.load_jpegs(argparse.Namespace(data=args.data, images=args.images))
    items = [np.frombuffer(j, np.uint8) for j in jpegs]
    pre = Preprocessor(bench_serve.spec_text(), device=device)
    cuda = pre.device.type == "cuda"

    def run(batch) -> None:
        pre.run(batch)
        if cuda:
            torch.cuda.current_stream(pre.device).synchronize()

    report: dict = {"probe": "preprocess_profile", "device": device, "config": vars(args),
                    "images": {"count": len(items), "mean_bytes": int(sum(map(len, jpegs)) / len(jpegs))}}
    try:
        per_size = {}
        for size in [int(s) for s in args.sizes.split(",")]:
            it = batches(items, size)
            for _ in range(10):
                run(next(it))
            start = time.perf_counter()
            for _ in range(args.runs):
                run(next(it))
            per_size[size] = (time.perf_counter() - start) / args.runs * 1e3
        report["ms_per_batch"] = {str(n): round(ms, 4) for n, ms in per_size.items()}
        report["img_s"] = {str(n): round(n / ms * 1e3, 1) for n, ms in per_size.items()}
        report["fit"] = fit(per_size)

        it = batches(items, args.profile_size)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.runs):
            run(next(it))
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
        report["cprofile_by_own_time"] = out.getvalue().splitlines()
        if cuda:
            import gpu_profile
            report["gpu"] = gpu_profile.profile(lambda: run(next(it)), 10, pre.device)
    finally:
        pre.close()
    text = json.dumps(report, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    print(json.dumps({k: report[k] for k in ("ms_per_batch", "img_s", "fit") if k in report}))
    print("\n".join(report.get("cprofile_by_own_time", [])[:args.top + 8]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
