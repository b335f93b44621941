"""Make an ImageNet-shaped JPEG set in ImageFolder layout (root/class_xxx/*.jpg) for the benchmarks.

Every file is a random crop of a real photo, resized to a short side of 300-500 px with a random aspect,
lightly colour-jittered, given mild sensor-like noise so sizes land in ImageNet's ~60-110 KB range, and saved
as a baseline 4:2:0 JPEG at quality 75-95. Photo sources, in order, whichever are importable/present:

* ``skimage.data`` (astronaut, chelsea, coffee, rocket, motorcycle, ...);
* ``sklearn.datasets.load_sample_images()`` (china, flower);
* ``matplotlib``'s sample data (grace_hopper);
* ``--photos DIR`` (any JPEG/PNG under DIR, read only);
* only when none of the above gave a photo: ../shared/data/realworld/coco (COCO/VOC samples), if present.

If none is available the sources are procedurally generated "natural-looking" scenes (1/f spectra, soft-edged
textured objects, shading): never blank or constant images. The sources used are printed and written to
``DIR.meta.json`` next to the set (not inside it, so no reader mistakes it for a class).

Progressive JPEGs: ImageNet holds a few percent of them, and they take a slower (CPU/hybrid) decode path in
nvJPEG/nvImageCodec. This set is baseline-only on purpose so the main comparison is not skewed by how each
system routes them; ``--progressive-frac`` adds them for a separate robustness run. ``--png-frac`` saves that
fraction of the images as RGB PNGs (``.png``, Pillow's default compression) instead: a file tree mixing codecs, for
the decode paths that take what the GPU's JPEG decoder cannot.

The set is written to a temporary sibling directory and renamed into place at the end, so a present DIR is a
complete set. Output is deterministic given ``--seed`` (whatever the worker count).

    python benchmarks/make_data.py --out /dev/shm/ingest_bench_20k --n 20000 --classes 100 --seed 0
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

MIN_SOURCE_SIDE = 256
# Real photos the project's interoperability tests read (COCO/VOC samples), used read-only when no package
# ships photos; relative to the repository root.
SHARED_PHOTOS = ("../shared/data/realworld/coco", "shared/data/realworld/coco")
PROCEDURAL_COUNT = 12
NOISE_TILE = 1024  # side of the precomputed noise tile every file takes a random window of
TARGET_KB = (60.0, 110.0)  # file sizes are steered into this range (ImageNet train: mean ~110 KB)
MAX_SIGMA = 10.0  # most noise (grey levels, std) added to reach the target size

_SOURCES: list[np.ndarray] = []   # HxWx3 uint8 photos, filled in the parent before the pool forks
_NOISE: np.ndarray | None = None  # NOISE_TILE x NOISE_TILE x 3 int16 unit-variance (x16) gaussian


# --------------------------------------------------------------------------------------------------
# Sources


def _rgb(arr) -> np.ndarray | None:
    arr = np.asarray(arr)
    if arr.ndim != 3 or arr.shape[2] < 3 or arr.dtype != np.uint8:
        return None
    arr = np.ascontiguousarray(arr[:, :, :3])
    if min(arr.shape[:2]) < MIN_SOURCE_SIDE or float(arr.std()) < 10.0:
        return None
    return arr


def _from_skimage() -> list[tuple[str, np.ndarray]]:
    try:
        import skimage.data as d
    except Exception:
        return []
    out = []
    for name in ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "hubble_deep_field",
                 "retina", "skin", "stereo_motorcycle"):
        try:
            img = getattr(d, name)()
        except Exception:
            continue
        if name == "stereo_motorcycle":
            img = img[0]
        a = _rgb(img)
        if a is not None:
            out.append((f"skimage.{name}", a))
    return out


def _from_sklearn() -> list[tuple[str, np.ndarray]]:
    try:
        from sklearn.datasets import load_sample_images
        imgs = load_sample_images()
    except Exception:
        return []
    out = []
    for fname, img in zip(imgs.filenames, imgs.images):
        a = _rgb(img)
        if a is not None:
            out.append((f"sklearn.{Path(fname).name}", a))
    return out


def _from_matplotlib() -> list[tuple[str, np.ndarray]]:
    try:
        from matplotlib import cbook
        with cbook.get_sample_data("grace_hopper.jpg") as f:
            a = _rgb(np.asarray(Image.open(f).convert("RGB")))
    except Exception:
        return []
    return [("matplotlib.grace_hopper", a)] if a is not None else []


def _from_dirs(dirs: list[str]) -> list[tuple[str, np.ndarray]]:
    out = []
    for d in dirs:
        for p in sorted(Path(d).rglob("*")):
            if p.suffix.lower() not in (".jpg", ".jpeg", ".png") or not p.is_file():
                continue
            try:
                with Image.open(p) as im:
                    a = _rgb(np.asarray(im.convert("RGB")))
            except Exception:
                continue
            if a is not None:
                out.append((f"file:{p}", a))
    return out


def _pink(rng: np.random.Generator, h: int, w: int, beta: float) -> np.ndarray:
    """A zero-mean unit-variance field with a 1/f^beta amplitude spectrum (natural images: beta ~ 1)."""
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    spec = (rng.standard_normal((h, w // 2 + 1)) + 1j * rng.standard_normal((h, w // 2 + 1))) / f ** beta
    spec[0, 0] = 0
    field = np.fft.irfft2(spec, s=(h, w))
    return (field - field.mean()) / (field.std() + 1e-9)


def procedural_scene(seed: int, h: int = 768, w: int = 1024) -> np.ndarray:
    """A natural-looking RGB scene: textured background, shaded soft-edged textured objects, a light falloff."""
    rng = np.random.default_rng([seed, 7919])
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    # background: a sky/ground-like vertical gradient of two palette colours, modulated by 1/f texture
    top, bottom = rng.uniform(30, 230, 3), rng.uniform(20, 200, 3)
    t = (yy / h)[..., None]
    img = top * (1 - t) + bottom * t
    lum = _pink(rng, h, w, 1.0)[..., None]
    chroma = np.stack([_pink(rng, h, w, 1.6) for _ in range(3)], -1)
    img = img + 28 * lum + 10 * chroma
    # objects: ellipses with their own colour and texture, a soft edge and a directional shading
    for _ in range(int(rng.integers(6, 14))):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        ry, rx = rng.uniform(0.05, 0.35) * h, rng.uniform(0.05, 0.35) * w
        ang = rng.uniform(0, np.pi)
        ca, sa = np.cos(ang), np.sin(ang)
        u = ((xx - cx) * ca + (yy - cy) * sa) / rx
        v = (-(xx - cx) * sa + (yy - cy) * ca) / ry
        r = np.sqrt(u * u + v * v)
        alpha = np.clip((1.0 - r) * rng.uniform(4, 30), 0, 1)[..., None]
        colour = rng.uniform(0, 255, 3)
        beta = rng.uniform(0.7, 1.4)
        tex = _pink(rng, h, w, beta)[..., None] * rng.uniform(10, 45)
        shade = (1.0 + 0.35 * np.clip(u * rng.uniform(-1, 1) + v * rng.uniform(-1, 1), -1, 1))[..., None]
        img = img * (1 - alpha) + (colour * shade + tex) * alpha
    # vignetting-like light falloff
    d = ((xx - w / 2) / w) ** 2 + ((yy - h / 2) / h) ** 2
    img = img * (1.0 - 0.5 * d)[..., None]
    return np.clip(img, 0, 255).astype(np.uint8)


def load_sources(photo_dirs: list[str], procedural_only: bool, seed: int,
                 workers: int = 1) -> list[tuple[str, np.ndarray]]:
    src = [] if procedural_only else (_from_skimage() + _from_sklearn() + _from_matplotlib()
                                      + _from_dirs(photo_dirs))
    if not src and not procedural_only:
        repo = Path(__file__).resolve().parent.parent
        src = _from_dirs([str(repo / d) for d in SHARED_PHOTOS if (repo / d).is_dir()])
    if not src:
        seeds = [seed * 1000 + i for i in range(PROCEDURAL_COUNT)]
        if workers > 1:
            with mp.get_context("fork").Pool(min(workers, PROCEDURAL_COUNT)) as pool:
                scenes = pool.map(procedural_scene, seeds)
        else:
            scenes = [procedural_scene(s) for s in seeds]
        src = [(f"procedural.{i}", a) for i, a in enumerate(scenes)]
    return src


# --------------------------------------------------------------------------------------------------
# One file


def _target_shape(rng: np.random.Generator) -> tuple[int, int]:
    """(height, width): short side 300-500, aspect (long/short) 1.0-1.6, ~70% landscape, like ImageNet."""
    short = int(rng.integers(300, 501))
    aspect = float(rng.choice([4 / 3, 3 / 2, 1.0, rng.uniform(1.0, 1.6)], p=[0.4, 0.2, 0.1, 0.3]))
    long = int(round(short * aspect))
    return (short, long) if rng.random() < 0.7 else (long, short)


def make_one(index: int, seed: int, progressive_frac: float, png_frac: float = 0.0) -> tuple[bytes, str]:
    """Image ``index`` of the set, encoded, and its file extension ("jpg" or "png")."""
    rng = np.random.default_rng([seed, index])
    src = _SOURCES[int(rng.integers(len(_SOURCES)))]
    sh, sw = src.shape[:2]
    th, tw = _target_shape(rng)
    # crop of the source with the target aspect, 35-100% of the largest such crop
    scale = rng.uniform(0.35, 1.0) ** 0.5
    ch = min(sh, sw * th / tw) * scale
    cw = ch * tw / th
    y0 = int(rng.uniform(0, sh - ch + 1e-6))
    x0 = int(rng.uniform(0, sw - cw + 1e-6))
    crop = src[y0:y0 + max(16, int(ch)), x0:x0 + max(16, int(cw))]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    im = Image.fromarray(np.ascontiguousarray(crop)).resize((tw, th), Image.BILINEAR)
    arr = np.asarray(im).astype(np.int32)
    # colour jitter (per-channel gain + brightness) and sensor-like noise from a shared tile
    gain = (rng.uniform(0.85, 1.15, 3) * rng.uniform(0.8, 1.2) * 256).astype(np.int32)
    arr = (arr * gain) >> 8
    ny, nx = int(rng.integers(0, NOISE_TILE - th)), int(rng.integers(0, NOISE_TILE - tw))
    noise = _NOISE[ny:ny + th, nx:nx + tw]
    progressive = bool(rng.random() < progressive_frac)
    if png_frac and np.random.default_rng([seed, index, 1]).random() < png_frac:   # (its own stream: the JPEGs
        # stay the images a set without PNGs has)
        buf = io.BytesIO()
        Image.fromarray(np.clip(arr + ((noise * 48) >> 8), 0, 255).astype(np.uint8)).save(buf, "PNG")
        return buf.getvalue(), "png"
    # Aim at a size drawn from ImageNet's typical range: start from a random quality and sigma 3, then move
    # the noise (linear model of bytes per pixel per grey level of noise, fitted on photos) and, when noise
    # alone cannot get there within MAX_SIGMA, the quality. At most 4 encodes; the last one is kept.
    target = rng.uniform(*TARGET_KB) * 1e3
    q, sigma = int(rng.integers(75, 96)), 3.0
    for _ in range(4):
        data = _encode(arr, noise, sigma, q, progressive)
        size = len(data)
        if 0.85 * target <= size <= 1.15 * target:
            break
        slope = th * tw * (0.008 + (q - 75) * 0.00075)
        want = sigma + (target - size) / slope
        if want > MAX_SIGMA and q < 95:
            q, sigma = min(95, q + 6), max(1.0, min(MAX_SIGMA, want) * 0.7)
        elif want < 0.5 and q > 75:
            q, sigma = max(75, q - 6), 1.0
        else:
            sigma = float(np.clip(want, 0.0, MAX_SIGMA))
    return data, "jpg"


def _encode(arr: np.ndarray, noise: np.ndarray, sigma: float, quality: int, progressive: bool) -> bytes:
    a = arr + ((noise * int(sigma * 16)) >> 8)  # tile holds 16x a unit gaussian
    buf = io.BytesIO()
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(
        buf, "JPEG", quality=quality, subsampling=2, optimize=False, progressive=progressive)
    return buf.getvalue()


def _work(args: tuple[int, int, str, int, int, float, float]) -> int:
    lo, hi, tmp, classes, seed, prog, png = args
    total = 0
    for i in range(lo, hi):
        data, ext = make_one(i, seed, prog, png)
        with open(os.path.join(tmp, f"class_{i % classes:03d}", f"{i:07d}.{ext}"), "wb") as f:
            f.write(data)
        total += len(data)
    return total


# --------------------------------------------------------------------------------------------------


def make_dataset(out: str, n: int, classes: int = 100, seed: int = 0, workers: int | None = None,
                 photo_dirs: list[str] | None = None, procedural: bool = False,
                 progressive_frac: float = 0.0, png_frac: float = 0.0, force: bool = False) -> dict:
    """Write the set (see module doc) and return its metadata, including ``mean_bytes``."""
    global _SOURCES, _NOISE
    if n < 1 or classes < 1:
        raise ValueError(f"`n` and `classes` must be >= 1, got n={n}, classes={classes}")
    classes = min(classes, n)  # an empty class directory is an error for ImageFolder-style readers
    out = os.path.abspath(out)
    if os.path.exists(out):
        if not force:
            raise FileExistsError(f"{out} exists (use --force to replace it)")
        shutil.rmtree(out)
    t0 = time.perf_counter()
    workers = workers or os.cpu_count() or 1
    sources = load_sources(photo_dirs or [], procedural, seed, workers)
    _SOURCES = [a for _, a in sources]
    _NOISE = (np.random.default_rng([seed, 1]).standard_normal((NOISE_TILE, NOISE_TILE, 3)) * 16).astype(np.int16)
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for c in range(classes):
        os.makedirs(os.path.join(tmp, f"class_{c:03d}"))
    chunk = max(16, min(256, n // (workers * 8) or 16))
    tasks = [(lo, min(n, lo + chunk), tmp, classes, seed, progressive_frac, png_frac) for lo in range(0, n, chunk)]
    if workers == 1:
        total = sum(map(_work, tasks))
    else:
        with mp.get_context("fork").Pool(workers) as pool:
            total = sum(pool.imap_unordered(_work, tasks))
    os.rename(tmp, out)
    meta = {"path": out, "n": n, "classes": classes, "seed": seed, "mean_bytes": total / n,
            "total_bytes": total, "progressive_frac": progressive_frac,
            "png_frac": png_frac,
            "sources": [name for name, _ in sources], "seconds": round(time.perf_counter() - t0, 2),
            "workers": workers}
    with open(out.rstrip("/") + ".meta.json", "w") as f:
        json.dump(meta, f, indent=1)
    return meta


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory to create (ImageFolder layout)")
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--photos", action="append", default=[], help="extra directory of photos to crop from")
    p.add_argument("--procedural", action="store_true", help="ignore photos; use generated scenes")
    p.add_argument("--progressive-frac", type=float, default=0.0, help="fraction saved as progressive JPEG")
    p.add_argument("--png-frac", type=float, default=0.0, help="fraction saved as RGB PNG (.png)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    a = p.parse_args(argv)
    meta = make_dataset(a.out, a.n, a.classes, a.seed, a.workers, a.photos, a.procedural,
                        a.progressive_frac, a.png_frac, a.force)
    print(f"wrote {meta['n']} files in {meta['seconds']} s to {meta['path']}: mean {meta['mean_bytes'] / 1e3:.1f} KB; "
          f"sources ({len(meta['sources'])}): {', '.join(s.rsplit('/', 1)[-1] for s in meta['sources'][:8])}"
          f"{' ...' if len(meta['sources']) > 8 else ''}")
    return meta


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
