"""Developer probe: GPU decode rate alone and beside a busy pure-Python thread, per nvImageCodec engine.

Usage: python dev/decode_contention.py [--out FILE.json] [--images 2048] [--batch 256] [--seconds 3] [DATA_DIR]

Without DATA_DIR it writes ImageNet-shaped JPEGs (random crops of real photos, short side 300-500, quality
75-95, mild noise) to /dev/shm/ingest-contention first. For each variant it decodes batches with
`GpuDecoder.decode_batch` (headers parsed beforehand, as the pipeline's read stage does) and reports img/s
alone, img/s beside one thread spinning on `sum(range(2000))`, their ratio, and how fast that thread got on
meanwhile (its iterations/s relative to running alone: what a training loop in the same process would keep).
Variants: native engine (whole images, random crops), the native engine with its future's wait releasing the
GIL (`ctypes.CDLL`), the native engine at a 1 ms switch interval, and the Python binding.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch

from ingest.decode import _nvimgcodec as native
from ingest.decode.cpu import CpuDecoder
from ingest.decode.gpu import GpuDecoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_gpu import Busy  # noqa: E402 - the benchmark's busy thread, so both measure the same thing


def _photos() -> list[np.ndarray]:
    try:
        from sklearn.datasets import load_sample_images
        return list(load_sample_images().images)
    except ImportError:
        from skimage import data
        return [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]


def _make_one(args) -> bytes:
    from PIL import Image
    seed, photos = args
    rng = np.random.default_rng(seed)
    photo = photos[seed % len(photos)]
    h, w = photo.shape[:2]
    ch, cw = int(h * rng.uniform(0.5, 1)), int(w * rng.uniform(0.5, 1))
    y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
    short = rng.integers(300, 501)
    scale = short / min(ch, cw)
    img = Image.fromarray(photo[y:y + ch, x:x + cw]).resize((int(cw * scale), int(ch * scale)))
    pixels = np.asarray(img).astype(np.int16) + rng.normal(0, 6, (img.height, img.width, 3)).astype(np.int16)
    out = Path(os.environ["CONTENTION_DIR"]) / f"{seed:05d}.jpg"
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=int(rng.integers(75, 96)))
    return out.read_bytes()


def make_data(folder: Path, count: int) -> list[bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    existing = sorted(folder.glob("*.jpg"))
    if len(existing) >= count:
        return [p.read_bytes() for p in existing[:count]]
    os.environ["CONTENTION_DIR"] = str(folder)
    photos = _photos()
    with Pool(min(16, os.cpu_count() or 1)) as pool:
        return pool.map(_make_one, [(i, photos) for i in range(count)], chunksize=16)


def busy_rate(seconds: float = 1.0) -> float:
    with Busy() as b:
        time.sleep(seconds)
    return b.count / seconds


def decode_rate(gpu: GpuDecoder, datas, headers, rois, batch: int, seconds: float) -> tuple[float, int]:
    """img/s of back-to-back decode_batch calls, each awaited (stream synchronized), over at least one batch."""
    stream = torch.cuda.Stream()
    n, k, start = 0, 0, time.perf_counter()
    while k == 0 or time.perf_counter() - start < seconds:
        lo = (k * batch) % len(datas)
        idx = range(lo, min(lo + batch, len(datas)))
        images, _, paths = gpu.decode_batch([datas[i] for i in idx], [str(i) for i in idx],
                                            rois=[rois[i] for i in idx], stream=stream,
                                            headers=headers[list(idx)])
        stream.synchronize()
        del images
        n, k = n + len(idx), k + 1
    return n / (time.perf_counter() - start), k


def measure(name, gpu, datas, headers, rois, args, alone_busy_rate) -> dict:
    decode_rate(gpu, datas, headers, rois, args.batch, 0.5)  # warm up
    alone, _ = decode_rate(gpu, datas, headers, rois, args.batch, args.seconds)
    with Busy() as b:
        t0 = time.perf_counter()
        beside, batches = decode_rate(gpu, datas, headers, rois, args.batch, args.seconds)
        spin = b.count / (time.perf_counter() - t0)
    row = {"variant": name, "engine": gpu.engine, "alone_img_s": round(alone), "beside_busy_img_s": round(beside),
           "ratio": round(beside / alone, 3), "busy_thread_progress": round(spin / alone_busy_rate, 3),
           "batches_beside": batches, "fallbacks": dict(gpu.fallbacks)}
    print(json.dumps(row), flush=True)
    return row


def _releasing(lib: native.Library, name: str):
    """``name`` bound through ctypes.CDLL: the call gives the GIL up."""
    fn = getattr(ctypes.CDLL(lib.path), name)
    fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_int
    return fn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?")
    parser.add_argument("--out")
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--skip-python", action="store_true", help="leave out the Python binding")
    args = parser.parse_args()
    t0 = time.perf_counter()
    if args.data:
        datas = [p.read_bytes() for p in sorted(Path(args.data).rglob("*.jpg"))[:args.images]]
    else:
        datas = make_data(Path("/dev/shm/ingest-contention"), args.images)
    print(f"{len(datas)} JPEGs, mean {np.mean([len(d) for d in datas]) / 1e3:.0f} KB "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    cpu = CpuDecoder(threads=4)
    headers = cpu.probe_batch(datas, [str(i) for i in range(len(datas))])[1]
    rng = np.random.default_rng(0)
    crops = []
    for h in headers:  # random-resized-crop-like regions: 25-100% of the area, aspect 3/4-4/3
        area = h.height * h.width * rng.uniform(0.25, 1)
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw, ch = min(h.width, int((area * aspect) ** 0.5)), min(h.height, int((area / aspect) ** 0.5))
        x0, y0 = rng.integers(0, h.width - cw + 1), rng.integers(0, h.height - ch + 1)
        crops.append((int(x0), int(y0), int(x0 + cw), int(y0 + ch)))
    whole = [None] * len(datas)
    alone_busy = busy_rate()
    rows = []
    for name, rois in (("native", whole), ("native-roi", crops)):
        with GpuDecoder("cuda", cpu, engine="native") as gpu:
            rows.append(measure(name, gpu, datas, headers, rois, args, alone_busy))
    lib = native.load()
    held = lib.FutureWaitForAll
    lib.FutureWaitForAll = _releasing(lib, "nvimgcodecFutureWaitForAll")
    with GpuDecoder("cuda", cpu, engine="native") as gpu:
        rows.append(measure("native-wait-releases-gil", gpu, datas, headers, whole, args, alone_busy))
    lib.FutureWaitForAll = held
    sys.setswitchinterval(0.001)
    with GpuDecoder("cuda", cpu, engine="native") as gpu:
        rows.append(measure("native-switchinterval-1ms", gpu, datas, headers, whole, args, busy_rate()))
    sys.setswitchinterval(0.005)
    if not args.skip_python:
        with GpuDecoder("cuda", cpu, engine="python") as gpu:
            rows.append(measure("python-binding", gpu, datas, headers, whole, args, alone_busy))
    result = {"device": torch.cuda.get_device_name(), "nvimgcodec": native.version_string(lib.version),
              "torch": torch.__version__, "python": sys.version.split()[0], "images": len(datas),
              "mean_kb": round(float(np.mean([len(d) for d in datas])) / 1e3, 1), "batch": args.batch,
              "seconds_per_measure": args.seconds, "busy_thread_alone_it_s": round(alone_busy),
              "default_switch_interval_s": 0.005, "variants": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    cpu.close()


if __name__ == "__main__":
    main()
