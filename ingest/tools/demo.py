"""`ingest demo`: make a small labeled JPEG set, run the training pipeline over it on the CPU (and the GPU
when there is one), print what ran and how fast, and save a PNG grid of one augmented batch.

The speed is indicative: a few hundred small images on whatever else the machine runs. It is timed over whole
epochs for at least `MIN_SECONDS` (never fewer than two epochs) after a warm-up epoch, not over the 192 images
of two epochs as before (722-1832 img/s between runs); `benchmarks/` holds the measurements to quote.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

CLASSES = ("circles", "stripes", "squares", "rings")
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
MIN_SECONDS = 3.0   # timed window (whole epochs) per device

#: What each column of the table means (printed under it).
COLUMNS = {
    "device": "where the batches end up",
    "decode": "decoder: cpu (libjpeg-turbo / Pillow threads) or mixed (nvImageCodec on the GPU)",
    "decode paths": "images per decode path (gpu, gpu-roi: region only, cpu, cpu-fallback)",
    "read path": "how file bytes were read (posix: os.preadv; kvikio)",
    "img/s": "images per second through the whole pipeline, indicative (see `ingest.tools.demo`)",
    "batch": "shape and dtype of one batch of images",
    "grid": "PNG of the first augmented batch, normalization undone",
}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="make a small JPEG set, run the training pipeline on it, show the speed",
                       description="Make a small labeled JPEG set in a temporary directory, run the training "
                                   "pipeline (RandomResizedCrop 160, flip, normalize) over it on the CPU (and "
                                   "the GPU when there is one), print what ran and an indicative speed, and "
                                   "save a PNG grid of one augmented batch.")
    p.add_argument("--out", default=".", help="where to write the PNG grid(s) (default: .)")
    p.add_argument("--per-class", type=int, default=24, help="images per class (4 classes; default: 24)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(run=run_command)


def run_command(args: argparse.Namespace) -> int:
    """`ingest demo`: run and print the table; errors (ConfigError) reach the CLI as one line."""
    rows = run(args.out, per_class=args.per_class, devices=None if args.device == "auto" else (args.device,))
    print_table(rows)
    return 0


def make_dataset(root: Path, per_class: int = 24, seed: int = 0) -> Path:
    """root/<class>/<i>.jpg: varied sizes (short side 160-320), textured backgrounds, class-specific shapes."""
    rng = np.random.default_rng(seed)
    for label, cls in enumerate(CLASSES):
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = (int(v) for v in rng.integers(160, 321, 2))
            im = _picture(label, w, h, rng)
            im.save(root / cls / f"{i:03d}.jpg", quality=int(rng.integers(75, 96)))
    return root


def _picture(label: int, w: int, h: int, rng: np.random.Generator) -> Image.Image:
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    c0, c1 = rng.uniform(30, 225, 3), rng.uniform(30, 225, 3)
    t = (x / w * np.cos(rng.uniform(0, 6.3)) + y / h * np.sin(rng.uniform(0, 6.3)) + 1) / 2
    bg = c0 * t[..., None] + c1 * (1 - t[..., None]) + rng.normal(0, 6, (h, w, 3))
    im = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(3, 8))):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(12, min(w, h) / 3)
        color = tuple(int(v) for v in rng.uniform(0, 255, 3))
        box = [cx - r, cy - r, cx + r, cy + r]
        if label == 0:
            d.ellipse(box, fill=color)
        elif label == 1:
            for k in range(-4, 5):
                d.line([cx - r, cy + k * r / 4 - r, cx + r, cy + k * r / 4 + r], fill=color, width=4)
        elif label == 2:
            d.rectangle(box, fill=color)
        else:
            d.ellipse(box, outline=color, width=int(r / 5) + 2)
    return im.filter(ImageFilter.GaussianBlur(0.6))


def _grid(images: torch.Tensor, path: Path, cols: int = 8) -> None:
    """Undo the normalization of an NCHW float batch and tile it into one PNG."""
    x = images.float().cpu() * torch.tensor(STD).view(1, 3, 1, 1) + torch.tensor(MEAN).view(1, 3, 1, 1)
    x = x.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    n, h, w, _ = x.shape
    rows = -(-n // cols)
    canvas = np.full((rows * (h + 2), cols * (w + 2), 3), 255, np.uint8)
    for k in range(n):
        r, c = divmod(k, cols)
        canvas[r * (h + 2):r * (h + 2) + h, c * (w + 2):c * (w + 2) + w] = x[k]
    Image.fromarray(canvas).save(path)


def run(out: Path | None = None, per_class: int = 24, batch_size: int = 32, min_seconds: float = MIN_SECONDS,
        devices: tuple[str, ...] | None = None) -> list[dict]:
    """One row per device (see `COLUMNS`). ConfigError for a bad ``per_class`` or an unavailable device,
    before any work."""
    import ingest
    from ingest.errors import ConfigError
    from ingest.ops import Flip, Normalize, RandomResizedCrop

    if isinstance(per_class, bool) or not isinstance(per_class, int) or per_class < 1:
        raise ConfigError(f"`per_class` (--per-class) must be an int >= 1, got {per_class!r}")
    devices = devices or (("cpu", "cuda") if torch.cuda.is_available() else ("cpu",))
    if "cuda" in devices and not torch.cuda.is_available():
        raise ConfigError("--device cuda, but CUDA is not available here; use --device cpu")
    out = Path(out or ".")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ingest-demo-") as tmp:
        root = make_dataset(Path(tmp) / "train", per_class)
        for device in devices:
            ops = [RandomResizedCrop(160), Flip(p=0.5), Normalize(MEAN, STD, dtype=torch.float32)]
            with ingest.Loader(root, batch_size=batch_size, device=device, ops=ops, shuffle=True,
                               seed=0) as loader:
                first = None
                for images, labels in loader:  # first epoch warms up (thread pools, CUDA kernels)
                    first = first if first is not None else images
                if device == "cuda":
                    torch.cuda.synchronize()
                t0, n, epochs = time.perf_counter(), 0, 0
                while epochs < 2 or time.perf_counter() - t0 < min_seconds:
                    for images, labels in loader:
                        n += len(labels)
                    epochs += 1
                if device == "cuda":
                    torch.cuda.synchronize()
                rate = n / (time.perf_counter() - t0)
                stats = loader.stats()
                grid = out / f"ingest-demo-{device}.png"
                _grid(first, grid)
                rows.append({"device": device, "decode": stats["decode"],
                             "decode paths": ",".join(f"{k}:{v}" for k, v in stats["decode_paths"].items()),
                             "read path": stats["read_path"], "img/s": round(rate, 1),
                             "batch": f"{tuple(first.shape)} {str(first.dtype).replace('torch.', '')}",
                             "grid": str(grid)})
    return rows


def print_table(rows: list[dict]) -> None:
    """The rows as a table, then what each column means."""
    cols = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths)))
    print()
    width = max(len(c) for c in cols)
    for c in cols:
        print(f"  {c.ljust(width)}  {COLUMNS.get(c, '')}")
