"""`ingest demo`: make a small labeled JPEG set and show ingest on it, in three parts (``--parts``):

- **files**: run the training pipeline over the file tree on the CPU (and the GPU when there is one), print
  what ran and how fast, and save a PNG grid of one augmented batch (`run`);
- **formats**: pack the same set into each writable record format with the converter, load each back with
  `ingest.Loader` (format detected from the path) and check it holds every sample with its label (`run_formats`);
- **detection**: make a small COCO set (coloured rectangles and ellipses with their boxes and polygons), load
  it through the box- and mask-aware ops and draw one batch with its boxes and masks to a PNG (`run_detection`);
- **segmentation**: make a small VOC-shaped TFRecord (DeepLab's keys: a JPEG and its palette PNG label map),
  load it with the label map read as a ``mask`` (inferred from the key) through RandomResizedCrop and Flip, and
  draw one batch with its masks tinted to a PNG (`run_segmentation`).

The speed is indicative: a few hundred small images on whatever else the machine runs. It is timed over whole
epochs for at least `MIN_SECONDS` (never fewer than two epochs) after a warm-up epoch, since a handful of
batches varies too much between runs to mean anything; `benchmarks/` holds the measurements to quote.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

from .convert import _size_hw
from .progress import human_bytes
from . import COMMANDS

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
#: Columns of the formats table.
FORMAT_COLUMNS = {
    "format": "what `ingest convert --to FORMAT` wrote (raw: decoded pixels, resized to --raw-size)",
    "on disk": "files and bytes the converter wrote (shards, indexes, manifest.json)",
    "read back": "samples `ingest.Loader(path)` read back, format detected from the path",
    "labels agree": "every sample's label equals the file tree's, in order",
    "img/s": "images per second reading back (decode + resize to --raw-size), indicative",
    "decode path": "decode paths that ran (cpu, gpu, none: raw pixels read straight into the batch)",
    "read path": "how file bytes were read (posix: os.preadv; kvikio)",
}
#: Columns of the detection table.
DETECTION_COLUMNS = {
    "images": "COCO images made (coloured rectangles and ellipses, polygons in instances.json)",
    "objects": "objects in the drawn batch after the IoU crop (boxes and masks pruned together)",
    "ops": "RandomIoUCrop, Flip, Resize(longer=S), PadTo(S): boxes and masks follow the pixels",
    "batch": "shape and dtype of the batch of images",
    "png": "the batch with its boxes and masks drawn (box outlines, masks tinted, category names)",
}
#: Columns of the segmentation table.
SEGMENTATION_COLUMNS = {
    "images": "VOC-shaped samples made (JPEG + palette PNG label map under DeepLab's TFRecord keys)",
    "classes": "class ids in the drawn batch's masks (255: VOC's 'ignore', the outlines and any padding)",
    "ops": "RandomResizedCrop(S), Flip: the masks follow the pixels, sampled nearest",
    "batch": "shapes and dtypes of the images and of the masks",
    "png": "the batch with its masks tinted by class",
}
PARTS = ("files", "formats", "detection", "segmentation")
#: Formats the formats part writes, in this order.
FORMATS = ("tfrecord", "recordio", "lmdb", "wds", "raw")
FORMAT_SECONDS = 0.5  # timed window (whole epochs) per format


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help=COMMANDS["demo"].help,
                       description="Make a small labeled JPEG set in a temporary directory, run the training "
                                   "pipeline (RandomResizedCrop 160, flip, normalize) over it on the CPU (and "
                                   "the GPU when there is one), print what ran and an indicative speed, and "
                                   "save a PNG grid of one augmented batch. Then pack the set into each record "
                                   "format and load it back, draw a batch of a small COCO set with its "
                                   "boxes and masks, and one of a small VOC-shaped set with its label maps.")
    p.add_argument("--out", default=".", help="where to write the PNG grid(s) (default: .)")
    p.add_argument("--per-class", type=int, default=24, help="images per class (4 classes; default: 24)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--parts", type=_parts, default=PARTS, metavar="PART,...",
                   help=f"which parts to run, of {','.join(PARTS)} (default: all)")
    p.add_argument("--raw-size", type=_size_hw, default=(64, 64), metavar="HxW",
                   help="pixel size of the raw shards in the formats part (default: 64x64)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(run=run_command)


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise argparse.ArgumentTypeError(f"must be some of {','.join(PARTS)}, got {text!r}")
    return parts


def run_command(args: argparse.Namespace) -> int:
    """`ingest demo`: run the parts asked for and print a table for each; errors (ConfigError) reach the CLI as
    one line, before any work."""
    devices = _devices(None if args.device == "auto" else (args.device,))
    _check_per_class(args.per_class)
    with tempfile.TemporaryDirectory(prefix="ingest-demo-") as tmp:
        root = make_dataset(Path(tmp) / "train", args.per_class)
        tables = []
        if "files" in args.parts:
            tables.append((run(args.out, per_class=args.per_class, devices=devices, root=root), COLUMNS))
        if "formats" in args.parts:
            tables.append((run_formats(root, Path(tmp) / "formats", raw_size=args.raw_size, device=devices[-1]),
                           FORMAT_COLUMNS))
        if "detection" in args.parts:
            tables.append((run_detection(Path(tmp) / "coco", args.out, device=devices[-1]), DETECTION_COLUMNS))
        if "segmentation" in args.parts:
            tables.append((run_segmentation(Path(tmp) / "voc", args.out, device=devices[-1]), SEGMENTATION_COLUMNS))
        for k, (rows, columns) in enumerate(tables):
            if k:
                print()
            print_table(rows, columns)
    return 0


def _devices(devices: tuple[str, ...] | None) -> tuple[str, ...]:
    """The devices to run on (all available when None); ConfigError for CUDA where there is none."""
    from ingest.errors import ConfigError
    devices = devices or (("cpu", "cuda") if torch.cuda.is_available() else ("cpu",))
    if "cuda" in devices and not torch.cuda.is_available():
        raise ConfigError("--device cuda, but CUDA is not available here; use --device cpu")
    return devices


def _check_per_class(per_class: Any) -> None:
    from ingest.errors import ConfigError
    if isinstance(per_class, bool) or not isinstance(per_class, int) or per_class < 1:
        raise ConfigError(f"`per_class` (--per-class) must be an int >= 1, got {per_class!r}")


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
    im = _background(w, h, rng)
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


def _background(w: int, h: int, rng: np.random.Generator) -> Image.Image:
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    c0, c1 = rng.uniform(30, 225, 3), rng.uniform(30, 225, 3)
    t = (x / w * np.cos(rng.uniform(0, 6.3)) + y / h * np.sin(rng.uniform(0, 6.3)) + 1) / 2
    bg = c0 * t[..., None] + c1 * (1 - t[..., None]) + rng.normal(0, 6, (h, w, 3))
    return Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))


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
        devices: tuple[str, ...] | None = None, root: Path | None = None) -> list[dict]:
    """The files part: one row per device (see `COLUMNS`), over the file tree at ``root`` (made with
    ``per_class`` images per class in a temporary directory when None). ConfigError for a bad ``per_class``
    or an unavailable device, before any work."""
    _check_per_class(per_class)
    devices = _devices(devices)
    out = Path(out or ".")
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if root is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="ingest-demo-"))
            root = make_dataset(Path(tmp) / "train", per_class)
        return [_run_device(root, device, out, batch_size, min_seconds) for device in devices]


def _run_device(root: Path, device: str, out: Path, batch_size: int, min_seconds: float) -> dict:
    """The training pipeline over ``root`` on ``device``: a warm-up epoch, then whole epochs timed for at least
    ``min_seconds`` (two at least); the first batch goes to ``out/ingest-demo-<device>.png``."""
    import ingest
    from ingest.ops import Flip, Normalize, RandomResizedCrop

    ops = [RandomResizedCrop(160), Flip(p=0.5), Normalize(MEAN, STD, dtype=torch.float32)]
    with ingest.Loader(root, batch_size=batch_size, device=device, ops=ops, shuffle=True, seed=0) as loader:
        first = None
        for images, labels in loader:  # first epoch warms up (thread pools, CUDA kernels)
            first = first if first is not None else images
        rate = _rate(loader, device, min_seconds, epochs=2)
        stats = loader.stats()
    grid = out / f"ingest-demo-{device}.png"
    _grid(first, grid)
    return {"device": device, "decode": stats["decode"],
            "decode paths": ",".join(f"{k}:{v}" for k, v in stats["decode_paths"].items()),
            "read path": stats["read_path"], "img/s": round(rate, 1),
            "batch": f"{tuple(first.shape)} {str(first.dtype).replace('torch.', '')}", "grid": str(grid)}


def _rate(loader: Any, device: str, min_seconds: float, epochs: int = 1) -> float:
    """Images per second over whole epochs of ``loader``, timed for at least ``min_seconds`` and ``epochs``."""
    if device == "cuda":
        torch.cuda.synchronize()
    t0, n, done = time.perf_counter(), 0, 0
    while done < epochs or time.perf_counter() - t0 < min_seconds:
        for _, labels in loader:
            n += len(labels)
        done += 1
    if device == "cuda":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


# -- formats ---------------------------------------------------------------------------------------------

def run_formats(root: Path, work: Path, *, raw_size: tuple[int, int] = (64, 64), device: str = "cpu",
                batch_size: int = 32, min_seconds: float = FORMAT_SECONDS,
                formats: tuple[str, ...] = FORMATS) -> list[dict]:
    """The formats part: convert the file tree at ``root`` into each of ``formats`` under ``work/<format>``
    (raw: pixels resized to ``raw_size``), read each back in order with `ingest.Loader` and compare its labels
    with the file tree's; one row per format (see `FORMAT_COLUMNS`)."""
    import ingest
    from ingest.ops import Resize
    from ingest.tools.convert import convert

    want = _labels(ingest.Loader(root, batch_size=batch_size, ragged=True))   # labels only: sizes may differ
    rows = []
    for fmt in formats:
        dst = work / fmt
        convert(str(root), str(dst), to=fmt, raw_size=raw_size if fmt == "raw" else None, progress=False)
        files = [f for f in dst.rglob("*") if f.is_file()]
        with ingest.Loader(dst, batch_size=batch_size, device=device, ops=[Resize(raw_size)]) as loader:
            got = _labels(loader)
            rate = _rate(loader, device, min_seconds)
            stats = loader.stats()
        rows.append({"format": fmt, "on disk": f"{len(files)} files, {human_bytes(sum(f.stat().st_size for f in files))}",
                     "read back": f"{len(got)}/{len(want)}", "labels agree": "yes" if got == want else "no",
                     "img/s": round(rate, 1), "decode path": ",".join(stats["decode_paths"]),
                     "read path": stats["read_path"]})
    return rows


def _labels(loader: Any) -> list[int]:
    """Every label of one epoch of ``loader``, in order."""
    return [label for _, labels in loader for label in labels.tolist()]


# -- detection -------------------------------------------------------------------------------------------

#: The COCO categories of the detection part, with the colour each is drawn in.
SHAPES = {"rectangle": (255, 64, 64), "ellipse": (64, 160, 255)}


def make_coco(root: Path, n: int = 8, seed: int = 0) -> Path:
    """``root/img/<i>.jpg`` (sizes 160-320 a side, textured backgrounds, 1-4 coloured rectangles and ellipses)
    and ``root/instances.json`` with each object's box and polygon segmentation; returns the JSON's path."""
    rng = np.random.default_rng(seed)
    (root / "img").mkdir(parents=True, exist_ok=True)
    images, anns = [], []
    for i in range(n):
        w, h = (int(v) for v in rng.integers(160, 321, 2))
        im = _background(w, h, rng)
        d = ImageDraw.Draw(im)
        placed: list[tuple[int, int, int, int]] = []
        for _ in range(int(rng.integers(1, 5))):
            cat = int(rng.integers(1, 3))
            bw, bh = (int(v) for v in rng.integers(24, min(w, h) // 2, 2))
            x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            if any(x < x1 and x0 < x + bw and y < y1 and y0 < y + bh for x0, y0, x1, y1 in placed):
                continue   # no occlusion: every object's polygon is its visible pixels
            placed.append((x, y, x + bw, y + bh))
            color = tuple(int(v) for v in rng.uniform(0, 255, 3))
            if cat == 1:
                d.rectangle([x, y, x + bw - 1, y + bh - 1], fill=color)
                poly = [x, y, x + bw, y, x + bw, y + bh, x, y + bh]
            else:
                d.ellipse([x, y, x + bw - 1, y + bh - 1], fill=color)
                t = np.linspace(0, 2 * np.pi, 32, endpoint=False)
                poly = np.stack([x + bw / 2 * (1 + np.cos(t)), y + bh / 2 * (1 + np.sin(t))], 1).ravel().tolist()
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": cat, "bbox": [x, y, bw, bh],
                         "area": bw * bh, "iscrowd": 0, "segmentation": [poly]})
        im.save(root / "img" / f"{i:03d}.jpg", quality=90)
        images.append({"id": i + 1, "file_name": f"{i:03d}.jpg", "height": h, "width": w})
    path = root / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": k + 1, "name": name} for k, name in enumerate(SHAPES)]}))
    return path


def run_detection(work: Path, out: Path | str = ".", *, n: int = 8, size: int = 224, device: str = "cpu",
                  seed: int = 0) -> list[dict]:
    """The detection part: make ``n`` COCO images under ``work`` (`make_coco`), load one batch of all of them
    with boxes (ltrb) and masks through RandomIoUCrop, Flip, Resize(longer=size), PadTo(size), and draw it to
    ``out/ingest-demo-detection.png`` (`_draw_detection`); one row (see `DETECTION_COLUMNS`)."""
    import ingest
    from ingest.ops import Flip, PadTo, RandomIoUCrop, Resize

    path = make_coco(work, n, seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ops = [RandomIoUCrop(), Flip(p=0.5), Resize(longer=size), PadTo(size)]
    options = {"images": work / "img", "box_format": "ltrb", "masks": "masks", "cache": False}
    with ingest.Loader(path, batch_size=n, device=device, output="dict", reader_options=options, ops=ops,
                       seed=seed) as loader:
        batch = next(iter(loader))
    png = out / "ingest-demo-detection.png"
    _draw_detection(batch, png)
    images = batch["images"]
    return [{"images": n, "objects": int(batch["boxes_lengths"].sum()), "ops": "IoU crop, flip, resize, pad",
             "batch": f"{tuple(images.shape)} {str(images.dtype).replace('torch.', '')}", "png": str(png)}]


def _draw_detection(batch: dict, path: Path, cols: int = 4) -> None:
    """Tile the batch's uint8 NCHW images into one PNG, each with its masks tinted in its category's colour
    and its boxes outlined and named."""
    images = batch["images"].cpu().permute(0, 2, 3, 1).numpy()
    n, h, w, _ = images.shape
    names = list(SHAPES)
    canvas = Image.new("RGB", (cols * (w + 2), -(-n // cols) * (h + 2)), "white")
    for k in range(n):
        count = int(batch["boxes_lengths"][k])
        cats = batch["categories"][k, :count].tolist()
        pixels = images[k].astype(np.float32)
        for j, cat in enumerate(cats):
            mask = batch["masks"][k, j].cpu().numpy().astype(bool)
            pixels[mask] = 0.5 * pixels[mask] + 0.5 * np.array(SHAPES[names[cat - 1]], np.float32)
        tile = Image.fromarray(pixels.astype(np.uint8))
        d = ImageDraw.Draw(tile)
        for j, cat in enumerate(cats):
            x0, y0, x1, y1 = batch["boxes"][k, j].tolist()
            d.rectangle([x0, y0, x1 - 1, y1 - 1], outline=SHAPES[names[cat - 1]], width=2)
            d.text((x0 + 3, y0 + 2), names[cat - 1], fill=(255, 255, 255))
        r, c = divmod(k, cols)
        canvas.paste(tile, (c * (w + 2), r * (h + 2)))
    canvas.save(path)


# -- segmentation ----------------------------------------------------------------------------------------

def make_voc(root: Path, n: int = 8, seed: int = 0) -> Path:
    """``root/train-00000-of-00001.tfrecord``: ``n`` JPEGs (160-320 a side, textured backgrounds, 1-4
    rectangles (class 1) and ellipses (class 2)) with their label maps as palette PNGs under DeepLab's keys
    (``image/segmentation/class/encoded``), each object outlined with 255 as VOC's are; returns ``root``."""
    import io

    from ingest.formats.base import Field, Record
    from ingest.formats._example import SEGMENTATION_KEY
    from ingest.formats.tfrecord import TFRecordWriter

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    palette = [0, 0, 0, *SHAPES["rectangle"], *SHAPES["ellipse"]] + [224, 224, 192] * 253
    writer = TFRecordWriter(root, "train-00000-of-00001", {"image": Field("image"), "mask": Field("bytes")},
                            keys={"mask": SEGMENTATION_KEY})
    for _ in range(n):
        w, h = (int(v) for v in rng.integers(160, 321, 2))
        im, label = _background(w, h, rng), Image.new("P", (w, h), 0)
        draw, mark = ImageDraw.Draw(im), ImageDraw.Draw(label)
        for _ in range(int(rng.integers(1, 5))):
            cls = int(rng.integers(1, 3))
            bw, bh = (int(v) for v in rng.integers(24, min(w, h) // 2, 2))
            x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            color = tuple(int(v) for v in rng.uniform(0, 255, 3))
            shape = draw.rectangle if cls == 1 else draw.ellipse
            shape([x, y, x + bw - 1, y + bh - 1], fill=color)
            (mark.rectangle if cls == 1 else mark.ellipse)([x, y, x + bw - 1, y + bh - 1], fill=cls, outline=255,
                                                           width=2)
        label.putpalette(palette)
        jpeg, png = io.BytesIO(), io.BytesIO()
        im.save(jpeg, "JPEG", quality=90)
        label.save(png, "PNG")
        writer.add(Record(jpeg.getvalue(), fields={"mask": png.getvalue()}))
    writer.close()
    return root


def run_segmentation(work: Path, out: Path | str = ".", *, n: int = 8, size: int = 192, device: str = "cpu",
                     seed: int = 0) -> list[dict]:
    """The segmentation part: make ``n`` VOC-shaped samples under ``work`` (`make_voc`), load one batch of all
    of them (the label map inferred as a ``mask`` from its key) through RandomResizedCrop(size) and Flip, and
    draw it to ``out/ingest-demo-segmentation.png``; one row (see `SEGMENTATION_COLUMNS`)."""
    import ingest
    from ingest.ops import Flip, RandomResizedCrop

    root = make_voc(work, n, seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with ingest.Loader(root, batch_size=n, device=device, output="dict", seed=seed,
                       ops=[RandomResizedCrop(size, scale=(0.3, 1.0)), Flip(p=0.5)]) as loader:
        batch = next(iter(loader))
    images, masks = batch["images"], batch["mask"]
    png = out / "ingest-demo-segmentation.png"
    tints = {1: SHAPES["rectangle"], 2: SHAPES["ellipse"], 255: (255, 255, 255)}
    pixels = images.cpu().permute(0, 2, 3, 1).numpy().astype(np.float32)
    labels = masks.cpu().numpy()
    for value, colour in tints.items():
        where = labels == value
        pixels[where] = 0.45 * pixels[where] + 0.55 * np.array(colour, np.float32)
    cols, (h, w) = 4, labels.shape[1:]
    canvas = Image.new("RGB", (cols * (w + 2), -(-n // cols) * (h + 2)), "white")
    for k, tile in enumerate(pixels.astype(np.uint8)):
        r, c = divmod(k, cols)
        canvas.paste(Image.fromarray(tile), (c * (w + 2), r * (h + 2)))
    canvas.save(png)
    kind = lambda t: f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"   # noqa: E731
    return [{"images": n, "classes": ",".join(map(str, sorted(np.unique(labels).tolist()))),
             "ops": "random resized crop, flip", "batch": f"{kind(images)} + masks {kind(masks)}", "png": str(png)}]


def print_table(rows: list[dict], columns: dict[str, str] = COLUMNS) -> None:
    """The rows as a table, then what each column means (``columns``)."""
    cols = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths)))
    print()
    width = max(len(c) for c in cols)
    for c in cols:
        print(f"  {c.ljust(width)}  {columns.get(c, '')}")
