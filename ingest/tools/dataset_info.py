"""`ingest inspect PATH`: what a dataset holds: format, record count, fields and kinds, classes and the label
histogram, image size statistics (from image headers, on an evenly spaced sample of records, no decoding)
and its shards (count and bytes, from the converter's manifest when there is one).

A streamed source (GZIP TFRecords, gzipped tars) is read once: the pass counts the records, takes every
label and the header facts of every image (kept compactly), and the sample is picked from them after.

(The module is not called ``inspect`` so that running a file of this folder as a script never shadows the
standard library module of that name.)
"""

from __future__ import annotations

import json
import os
from array import array
from typing import Any, Optional

import numpy as np

from ..errors import IngestError
from ..formats import MANIFEST, _manifest, detect, fields_of, iter_records, open_source
from ..formats._images import image_extension
from ..decode.cpu import CpuDecoder
from .convert import _option
from .progress import human_bytes
from .source_view import SourceView
from . import COMMANDS

#: Records whose image headers are read for the size statistics, by default.
SAMPLE = 500
#: Classes shown in the label histogram.
TOP = 10


def inspect_dataset(path: str, *, source_format: str | None = None, sample: int = SAMPLE,
                    source_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON-able description of the dataset at ``path`` (see the module docstring); ``source_options`` go
    to the reader (e.g. ``images=`` for a COCO file)."""
    if not os.path.exists(path) and not any(c in path for c in "*?["):
        raise FileNotFoundError(f"path {path!r} does not exist")
    fmt = source_format or detect(path)
    source = open_source(path, format=fmt, **(source_options or {}))
    fields = fields_of(source)
    images = "image" in fields
    pixels = images and fields["image"].kind == "pixels"
    if getattr(source, "streamed", False):
        n, labels, rows = _read_stream(source, images, pixels, sample)
    else:
        n = len(source)
        labels = source.labels() if "label" in fields else None
        rows = _picked_rows(SourceView(source), _picks(n, sample), pixels) if images else []
    info: dict[str, Any] = {
        "path": path, "format": fmt, "records": n,
        "fields": {name: {"kind": f.kind, **({"shape": list(f.shape)} if f.shape else {}),
                          **({"dtype": f.dtype} if f.dtype else {})} for name, f in fields.items()},
        "classes": len(source.classes), "unread": dict(getattr(source, "unread", None) or {})}
    info["labels"] = _histogram(labels, list(source.classes)) if "label" in fields else None
    info["images"] = _image_stats(rows) if "image" in fields else None
    info["shards"] = _shards(path, source)
    if callable(getattr(source, "summary", None)):   # COCO: images, annotations, categories, crowd
        info["annotations"] = _jsonable(source.summary())
    return info


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _histogram(labels: np.ndarray, classes: list[str]) -> dict[str, Any]:
    known = labels[labels >= 0]
    values, counts = np.unique(known, return_counts=True)
    order = np.argsort(-counts, kind="stable")[:TOP]
    top = [{"label": int(values[i]), "count": int(counts[i]),
            **({"class": classes[values[i]]} if values[i] < len(classes) else {})} for i in order]
    return {"distinct": int(len(values)), "unlabeled": int((labels < 0).sum()), "top": top,
            "min_count": int(counts.min()) if len(counts) else 0, "max_count": int(counts.max()) if len(counts) else 0}


#: What the size statistics know of one image: (height, width, stored bytes, type), None when unreadable.
Row = Optional[tuple[int, int, int, str]]


def _picks(n: int, sample: int) -> np.ndarray:
    """``sample`` evenly spaced record numbers of ``n`` (all of them when ``n`` is smaller)."""
    return np.unique(np.linspace(0, n - 1, min(sample, n)).astype(np.int64)) if n else np.zeros(0, np.int64)


def _image_row(decoder: CpuDecoder, pixels: bool, name: str, record: Any) -> Row:
    """A record's image size (from its header), bytes and type."""
    image = record.image
    if pixels:
        array = np.asarray(image)
        return array.shape[0], array.shape[1], array.nbytes, "pixels"
    try:
        (h, w), _ = decoder.probe_header(image, name)
    except IngestError:
        return None
    return h, w, memoryview(image).nbytes, (image_extension(image) or ".unknown").lstrip(".")


def _picked_rows(view: SourceView, picks: np.ndarray, pixels: bool) -> list[Row]:
    """The rows of the records at ``picks`` of a seekable source, read one by one."""
    with CpuDecoder(threads=1) as decoder:
        return [None if err is not None else _image_row(decoder, pixels, name, record)
                for i in picks.tolist() for name, record, err in view.read(i, i + 1)]


def _read_stream(source: Any, images: bool, pixels: bool, sample: int) -> tuple[int, np.ndarray, list[Row]]:
    """One pass over a streamed source: its record count, every label, and (``images``) the rows of the
    records `_picks` chooses (every record's row is kept, as numbers, until the count is known)."""
    labels, sizes, types, kinds = array("q"), array("q"), array("H"), ["unreadable"]
    with CpuDecoder(threads=1) as decoder:
        for name, record in iter_records(source):
            labels.append(record.label)
            if images:
                row = _image_row(decoder, pixels, name, record) or (0, 0, 0, "unreadable")
                sizes.extend(row[:3])
                if row[3] not in kinds:
                    kinds.append(row[3])
                types.append(kinds.index(row[3]))
    n = len(labels)
    picks = _picks(n, sample).tolist() if images else []
    rows = [None if types[i] == 0 else (*sizes[3 * i:3 * i + 3], kinds[types[i]]) for i in picks]
    return n, np.frombuffer(labels, np.int64) if n else np.zeros(0, np.int64), rows


def _image_stats(rows: list[Row]) -> dict[str, Any]:
    """Sizes (from headers) and types of the sampled images."""
    readable = [row for row in rows if row is not None]
    types: dict[str, int] = {}
    for _, _, _, kind in readable:
        types[kind] = types.get(kind, 0) + 1

    def stats(values: list[int]) -> dict[str, float]:
        if not values:
            return {}
        a = np.asarray(values)
        return {"min": int(a.min()), "median": float(np.median(a)), "mean": round(float(a.mean()), 1),
                "max": int(a.max())}

    return {"sampled": len(readable), "unreadable": len(rows) - len(readable),
            "height": stats([r[0] for r in readable]), "width": stats([r[1] for r in readable]),
            "bytes": stats([r[2] for r in readable]), "types": types}


def _shards(path: str, source: Any) -> dict[str, Any]:
    manifest_path = os.path.join(path, MANIFEST) if os.path.isdir(path) else None
    if manifest_path and os.path.isfile(manifest_path):
        data = _manifest.load(manifest_path)
        shards = data["shards"]
        return {"count": len(shards), "bytes": int(sum(s.get("bytes", 0) for s in shards)), "from": "manifest"}
    files = [str(s) for s in getattr(source, "shards", [])]
    if files:
        return {"count": len(files), "bytes": int(sum(os.path.getsize(f) for f in files if os.path.isfile(f))),
                "from": "files"}
    total = sum(e.stat().st_size for e in _walk(path)) if os.path.isdir(path) else os.path.getsize(path)
    return {"count": 1, "bytes": int(total), "from": "files"}


def _walk(directory: str):
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
            yield from _walk(entry.path)
        elif entry.is_file():
            yield entry


def describe(info: dict[str, Any]) -> str:
    """`inspect_dataset`'s result as text."""
    lines = [f"{info['path']}: {info['format']}, {info['records']} records, {info['shards']['count']} "
             f"shard{'s' if info['shards']['count'] != 1 else ''}, {human_bytes(info['shards']['bytes'])}",
             "fields: " + ", ".join(f"{name} ({f['kind']}{' ' + 'x'.join(map(str, f['shape'])) if 'shape' in f else ''}"
                                    f"{' ' + f['dtype'] if 'dtype' in f else ''})"
                                    for name, f in info["fields"].items())]
    if info["unread"]:   # what the source holds that no field reads (a conversion refuses to lose it)
        lines += [f"not read: {name}: {why}" for name, why in info["unread"].items()]
    labels = info["labels"]
    if labels is not None:
        lines.append(f"labels: {labels['distinct']} distinct ({info['classes']} class names), "
                     f"{labels['unlabeled']} unlabeled, per label {labels['min_count']}..{labels['max_count']}")
        for entry in labels["top"]:
            name = f" {entry['class']}" if "class" in entry else ""
            lines.append(f"  {entry['label']:>6}{name}: {entry['count']}")
    images = info["images"]
    if images is not None and images["sampled"]:
        h, w, b = images["height"], images["width"], images["bytes"]
        lines.append(f"images ({images['sampled']} sampled): height {h['min']}..{h['max']} (median {h['median']:g}), "
                     f"width {w['min']}..{w['max']} (median {w['median']:g}), {human_bytes(b['mean'])} mean, "
                     + ", ".join(f"{k} {v}" for k, v in sorted(images["types"].items())))
    if images is not None and images["unreadable"]:
        lines.append(f"  {images['unreadable']} sampled images unreadable (ingest verify --decode names them)")
    notes = info.get("annotations")
    if notes:
        lines.append("annotations: " + ", ".join(f"{notes[k]} {k}" for k in ("images", "annotations", "categories",
                                                                         "crowd") if k in notes))
        per = sorted((notes.get("per_category") or {}).items(), key=lambda kv: -kv[1])[:TOP]
        if per:
            lines.append("  objects per category: " + ", ".join(f"{k} {v}" for k, v in per))
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    from ..formats import FORMATS
    p = sub.add_parser(
        "inspect", help=COMMANDS["inspect"].help,
        description="Describe the dataset at PATH: format, record count, fields and their kinds, the label "
                    f"histogram (top {TOP}), image size statistics read from the headers of an evenly spaced "
                    "sample of records (no decoding), and its shards' count and bytes.")
    p.add_argument("path", help="dataset: directory, shard file or glob")
    p.add_argument("--from", dest="source_format", metavar="FORMAT", choices=sorted(FORMATS),
                   help="format (default: detected from PATH)")
    p.add_argument("--sample", type=int, default=SAMPLE, metavar="N",
                   help=f"records whose image headers are read (default {SAMPLE})")
    p.add_argument("-s", "--source-option", dest="source_options", type=_option, action="append", default=[],
                   metavar="KEY=VALUE", help="reader option, e.g. -s images=train2017/ for a COCO file")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(run=run)


def run(args: Any) -> int:
    info = inspect_dataset(args.path, source_format=args.source_format, sample=max(args.sample, 0),
                           source_options=dict(args.source_options))
    print(json.dumps(info, indent=1) if args.json else describe(info))
    return 0
