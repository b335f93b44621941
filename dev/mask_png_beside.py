"""Developer probe: PNG mask decode rate, Pillow against the native decoder (``ingest.decode._png``), alone and
beside a busy pure-Python thread, and the share of its own rate that the busy thread keeps meanwhile.

Masks are VOC-shaped: 375x500 palette PNGs of class-id blobs (ids 0-20 and a 255 border), written by Pillow.
Cases: one mask at a time on the calling thread (`decode_mask`), and `MaskDecoder.decode_batch` of a batch
(the loader's path: Pillow per mask on the pool, or one native batch on ``--threads`` threads); and, beside the
busy thread, the time the loader's decode stage spends collecting a batch's masks when it does so
``--overlap-ms`` after starting them (the images decode meanwhile).

The cases run in turn for ``--rounds`` rounds and the medians are printed, so that other load on a shared
machine falls on every case alike. A busy thread's "kept" share is its iterations per second beside the
decoding over its rate alone in the same round.

Usage: python dev/mask_png_beside.py [--seconds 1.5] [--rounds 5] [--batch 32] [--threads 2] [--overlap-ms 40]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "benchmarks")]

from bench_gpu import Busy  # noqa: E402 - the benchmark's busy thread, so both measure the same thing
from ingest.decode import masks  # noqa: E402


def voc_masks(n: int, seed: int = 0) -> list[bytes]:
    """``n`` palette PNGs of 375x500: a few filled ellipses and polygons of class ids with 255 outlines."""
    g = np.random.default_rng(seed)
    palette = [(i * 53 + c * 91) % 256 for i in range(256) for c in range(3)]
    out = []
    for _ in range(n):
        img = Image.new("P", (500, 375), 0)
        draw = ImageDraw.Draw(img)
        for _ in range(int(g.integers(1, 5))):
            x0, y0 = g.integers(0, 400), g.integers(0, 300)
            box = [x0, y0, x0 + g.integers(30, 250), y0 + g.integers(30, 200)]
            cls = int(g.integers(1, 21))
            if g.random() < 0.5:
                draw.ellipse(box, fill=cls, outline=255, width=5)
            else:
                pts = [(int(g.integers(box[0], box[2])), int(g.integers(box[1], box[3]))) for _ in range(6)]
                draw.polygon(pts, fill=cls, outline=255, width=5)
        img.putpalette(palette)
        buf = io.BytesIO()
        img.save(buf, "PNG")
        out.append(buf.getvalue())
    return out


def rate(fn, pngs: list[bytes], batch: int, seconds: float) -> float:
    """Masks per second of ``fn(batch of pngs)`` called in a loop for ``seconds``."""
    fn(pngs[:batch])
    done, k, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        start = (k * batch) % (len(pngs) - batch + 1)
        done += len(fn(pngs[start:start + batch]))
        k += 1
    return done / (time.perf_counter() - t0)


def overlapped_wait(pool, pngs: list[bytes], batch: int, seconds: float, overlap: float) -> float:
    """Milliseconds per batch spent in the wait `MaskDecoder.submit` returns, called ``overlap`` seconds after
    the submit (the caller sleeping meanwhile, as it waits on the GPU's image decode in the loader)."""
    waited, k, t0 = 0.0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        start = (k * batch) % (len(pngs) - batch + 1)
        wait = pool.submit(pngs[start:start + batch], ["m"] * batch)
        time.sleep(overlap)
        t1 = time.perf_counter()
        wait()
        waited += time.perf_counter() - t1
        k += 1
    return waited * 1e3 / k


def busy_alone(seconds: float) -> float:
    with Busy() as b:
        time.sleep(seconds)
    return b.count / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=1.5, help="per case and round")
    p.add_argument("--rounds", type=int, default=5, help="the cases run in turn this often; medians reported")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--overlap-ms", type=float, default=40.0, help="the image decode's stand-in (a sleep)")
    args = p.parse_args()
    if masks.NATIVE_PNG is None:
        raise SystemExit("ingest.decode._png is not built or libz.so.1 did not load")
    pngs = voc_masks(4 * args.batch)
    native_module = masks.NATIVE_PNG
    pools = {"pillow": masks.MaskDecoder(threads=args.threads), "native": masks.MaskDecoder(threads=args.threads)}

    def one_by_one(batch):
        return [masks.decode_mask(b, "m") for b in batch]

    def pooled(decoder):
        return lambda batch: pools[decoder].decode_batch(batch, ["m"] * len(batch))

    samples: dict[str, list[float]] = {}
    for _ in range(args.rounds):   # cases in turn, so that other load on the machine falls on all of them
        alone = busy_alone(args.seconds)
        samples.setdefault("busy_alone_iter_s", []).append(alone)
        for decoder in ("pillow", "native"):
            masks.NATIVE_PNG = native_module if decoder == "native" else None
            for case, fn in (("one_by_one", one_by_one), ("pool", pooled(decoder))):
                key = f"{decoder}_{case}"
                samples.setdefault(f"{key}_alone_masks_s", []).append(rate(fn, pngs, args.batch, args.seconds))
                with Busy() as b:
                    t0 = time.perf_counter()
                    beside = rate(fn, pngs, args.batch, args.seconds)
                    spent = time.perf_counter() - t0
                samples.setdefault(f"{key}_beside_busy_masks_s", []).append(beside)
                samples.setdefault(f"{key}_busy_kept", []).append(b.count / spent / alone)
            with Busy():
                samples.setdefault(f"{decoder}_pool_wait_ms_after_overlap_beside_busy", []).append(
                    overlapped_wait(pools[decoder], pngs, args.batch, args.seconds, args.overlap_ms / 1e3))
        masks.NATIVE_PNG = native_module
    for pool in pools.values():
        pool.close()
    results = {"bytes_per_mask": int(np.mean([len(x) for x in pngs])), "batch": args.batch,
               "threads": args.threads, "rounds": args.rounds, "cpus": len(os.sched_getaffinity(0)),
               "load_1min": round(os.getloadavg()[0], 2)}
    results.update({k: round(float(np.median(v)), 3 if k.endswith(("kept", "_ms")) else 1) for k, v in samples.items()})
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
