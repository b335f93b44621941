"""COCO object detection: ``instances_*.json`` plus an image root, one sample per image.

``CocoSource(annotations, images=ROOT)`` yields, per image, a `Record` whose fields follow torchvision's
detection target dict, except ``categories``, which torchvision calls ``labels`` (the loader's dict output
already uses ``labels`` for the per-image class label):

============  ======================  =====================================================================
field         kind                    value
============  ======================  =====================================================================
image         image                   the image file's encoded bytes (read like a file tree's file)
label         int                     always -1: a detection sample has no single class label
image_id      int                     the COCO image id
boxes         array float32 [N, 4]    ``[x, y, w, h]`` (``box_format="xywh"``, COCO's) or ``[x1, y1, x2, y2]``
                                      (``"ltrb"``, torchvision's), in pixels or, with ``relative=True``,
                                      divided by the image's width and height
categories    ints [N]                category: 1..C in sorted category-id order (``contiguous_ids=True``;
                                      0 is left to the background) or the file's category ids
iscrowd       ints [N]                COCO's iscrowd flag (0 or 1)
area          floats [N]              COCO's ``area`` (of the segmentation, not of the box)
masks         array uint8 [N, H, W]   with ``masks="masks"``: pycocotools' ``annToMask`` of each object
polygons      text                    with ``masks="polygons"``: a JSON list with one entry per object: its
                                      polygons ``[[x, y, x, y, ...], ...]`` (relative with ``relative=True``),
                                      a compressed RLE ``{"size": [h, w], "counts": "..."}`` for RLE
                                      objects, or null when the object has no segmentation
scores        floats [N]              only for results files (`CocoSource.results`)
============  ======================  =====================================================================

`classes` lists category names by label: ``classes[0] == "__background__"`` and, with the file's own ids, gaps are
named ``"N/A"`` (torchvision's COCO category list has the same shape). Samples are the images sorted by id.

**Images.** ``file_name`` is joined to ``images``; by default (``images=None``) to the JSON's directory,
which suits exports that store paths like ``JPEGImages/x.jpg`` (labelme, CVAT). The official COCO layout
keeps images elsewhere: pass ``images=".../train2017"``. Files are not checked at open (118k stats); a
missing one fails its read (the loader's `SourceError` naming it, under its failure budget).

**Options** (DALI's ``readers.coco`` names in brackets): ``box_format="ltrb"`` [``ltrb``],
``relative`` [``ratio``], ``skip_empty`` drops images left without objects after the other filters
[``skip_empty``], ``size_threshold`` drops objects whose clipped box is narrower or lower than it, in
pixels [``size_threshold``], ``image_ids`` keeps a subset [``image_ids``], ``include_crowd=False``
drops iscrowd objects [``skip_crowd``].

**Cache.** The JSON is parsed once into numpy arrays (segmentation packed as offsets into flat buffers),
saved as ``.npy`` files in a hidden directory next to the JSON when that directory is writable, else under
``$XDG_CACHE_HOME/ingest`` (``~/.cache/ingest``); ``cache=<dir>`` picks the place, ``cache=False`` turns it
off. Later opens memory-map the arrays; a JSON of another size or mtime is parsed again.

**Repairs** (counted in `repairs`, one warning per open): boxes reaching outside their image are clipped
to it; boxes of zero width or height after clipping are dropped with their object (torchvision's detectors
reject them); polygon parts of fewer than 3 points are dropped (they cover no pixel); null ``iscrowd`` is 0;
null ``area`` is computed from the segmentation (pycocotools ``area``) or the box; a null ``bbox`` is the
segmentation's bounding box; null category names become the id. Metadata fields (info, licenses, urls,
supercategory) are not read, so nulls there do not matter.

**Errors.** A file that is not a COCO instances file, a duplicate image or category id, or an annotation
whose ``image_id`` is not an image raises at open. Errors inside one image's annotations (negative box
width or height, unknown ``category_id``, RLE whose size differs from the image or whose counts do not sum
to height x width, non-finite or odd-length polygons, missing image size) make that image's `parse` raise
`CorruptRecordError` naming the JSON, the annotation's position and id, so the loader's failure budget
decides; `summary` counts them. With ``masks="masks"``, an object without segmentation, a polygon reaching
more than an image size outside its image (pycocotools' rasteriser allocates in proportion to the extent)
and masks of one image over `MAX_MASK_BYTES` fail the same way.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import reprlib
import shutil
import warnings
from typing import Any, Iterable

import numpy as np

from ..errors import ConfigError, CorruptRecordError, SourceError
from .base import Field, Location, Record, check_index

#: Version of the cache layout; bump it when the arrays change meaning.
CACHE_VERSION = 3
#: Segmentation kinds stored per annotation.
NO_SEG, POLYGONS, RLE = 0, 1, 2
BOX_FORMATS = ("xywh", "ltrb")
#: JSON number types (bool excluded: ``type(True) is bool``).
NUMBER = frozenset({int, float})
#: Pixel masks of one image larger than this (objects x height x width bytes) fail it instead of allocating.
MAX_MASK_BYTES = 1 << 31
#: Largest category id usable as a label as it is (``contiguous_ids=False``): `classes` has one name per id.
MAX_CLASS_ID = 1 << 20
MASK_MODES = (None, "polygons", "masks")


def _load_json(path: str) -> Any:
    """Parse an annotation or results file (the one slow step the cache avoids)."""
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except OSError as err:
        raise SourceError(f"cannot read {path!r}: {err.strerror}", path=path) from err
    except (ValueError, UnicodeDecodeError) as err:
        raise SourceError(f"{path} is not valid JSON: {err}", path=path) from err


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 80


def _short(value: Any) -> str:
    """A bounded repr of a value read from the file, for messages."""
    return _repr.repr(value)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def rle_string_total(counts: bytes) -> int | None:
    """Sum of the run lengths of a compressed COCO RLE string, or None when it is not one (bad character,
    negative run). Used only to validate: pycocotools decodes runs that fall short of height x width into
    uninitialised memory without an error, and exposes no way to read the runs back."""
    total, runs, pos, n = 0, [], 0, len(counts)
    while pos < n:
        x, k, more = 0, 0, True
        while more:
            if pos >= n:
                return None
            c = counts[pos] - 48
            if not 0 <= c < 64:
                return None
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            pos += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(runs) > 2:
            x += runs[-2]
        if x < 0:
            return None
        runs.append(x)
        total += x
    return total


class _Builder:
    """One pass over a parsed instances file: validated numpy arrays. Per-object arrays are grouped by image
    (``ann_start``); polygon coordinates and RLE bytes stay in file order, reached through ``part_lo/hi``
    (into ``part_start``, which indexes ``coords``) and ``rle_lo/hi`` (into ``rle``)."""

    def __init__(self, data: Any, path: str, results: list | None = None, results_path: str | None = None):
        self.path = path
        self.ann_path, self.ann_key = (path, "annotations") if results is None else (results_path, "results")
        self.errors: dict[int, str] = {}     # image index -> first problem found in it
        self.repairs = dict.fromkeys(REPAIR_KEYS, 0)
        if not isinstance(data, dict) or not isinstance(data.get("images"), list):
            raise SourceError(f"{path} is not a COCO instances file (expected an object with an 'images' "
                              "list)", path=path)
        self._images(data["images"])
        self._categories(data.get("categories") or [])
        anns = results if results is not None else data.get("annotations") or []
        if not isinstance(anns, list):
            raise SourceError(f"{path}: 'annotations' must be a list", path=path)
        self._annotations(anns, scored=results is not None)
        if results is not None:  # loadRes fills these in by definition: not repairs
            self.repairs["null_area"] = self.repairs["null_bbox"] = 0

    def _fail_open(self, where: str, msg: str, path: str | None = None) -> CorruptRecordError:
        return CorruptRecordError(f"{where}: {msg}", path=path or self.path)

    def _images(self, images: list) -> None:
        ids, files, widths, heights = [], [], [], []
        for k, im in enumerate(images):
            if type(im) is not dict or type(im.get("id")) is not int:
                raise self._fail_open(f"images[{k}]", f"'id' must be an integer, got {_short(_get(im, 'id'))}")
            name = im.get("file_name")
            if type(name) is not str or not name:
                raise self._fail_open(f"images[{k}] (id {im['id']})", f"'file_name' must be a path, got {_short(name)}")
            ids.append(im["id"])
            files.append(name)
            widths.append(im.get("width"))
            heights.append(im.get("height"))
        order = np.argsort(np.array(ids, dtype=np.int64), kind="stable")
        self.img_id = np.array(ids, dtype=np.int64)[order]
        dup = self.img_id[1:][self.img_id[1:] == self.img_id[:-1]]
        if len(dup):
            raise self._fail_open("images", f"image id {int(dup[0])} appears more than once")
        self.img_file, self.img_file_end = _pack([files[k] for k in order.tolist()])
        self.img_w = np.zeros(len(ids), dtype=np.int64)
        self.img_h = np.zeros(len(ids), dtype=np.int64)
        for j, k in enumerate(order.tolist()):
            w, h = widths[k], heights[k]
            if type(w) is int and type(h) is int and w > 0 and h > 0:
                self.img_w[j], self.img_h[j] = w, h
            else:
                self.errors[j] = (f"images[{k}] (id {ids[k]}): width and height must be integers > 0, got "
                                  f"{_short(w)} x {_short(h)}")
        self.img_pos = dict(zip(self.img_id.tolist(), range(len(ids))))

    def _categories(self, cats: list) -> None:
        found: dict[int, str] = {}
        for k, c in enumerate(cats):
            if type(c) is not dict or type(c.get("id")) is not int:
                raise self._fail_open(f"categories[{k}]", f"'id' must be an integer, got {_short(_get(c, 'id'))}")
            if c["id"] in found:
                raise self._fail_open(f"categories[{k}]", f"category id {c['id']} appears more than once")
            name = c.get("name")
            if type(name) is not str:
                self.repairs["null_category_name"] += 1
                name = str(c["id"])
            found[c["id"]] = name
        self.cat_id = np.array(sorted(found), dtype=np.int64)
        self.cat_name = np.array([found[i] for i in sorted(found)], dtype=str)
        self.cat_pos = {i: j for j, i in enumerate(sorted(found))}

    def _annotations(self, anns: list, scored: bool) -> None:
        """The hot loop (860k objects in instances_train2017): well-formed fields take the inline path,
        anything else goes through `_slow_fields`, which repairs or explains it."""
        img_pos, cat_pos, img_w, img_h = self.img_pos, self.cat_pos, self.img_w, self.img_h
        self._coords: list = []
        self._part_end: list[int] = [0]
        self._rle = bytearray()
        coords, part_end = self._coords, self._part_end
        owner, aid, cat, box, area, crowd, kind, plo, phi, rlo, rhi, score = ([] for _ in range(12))
        for k, a in enumerate(anns):
            if type(a) is not dict:
                raise self._fail_open(f"{self.ann_key}[{k}]", f"expected an object, got {type(a).__name__}",
                                      self.ann_path)
            iid = a.get("image_id")
            j = img_pos.get(iid) if type(iid) is int else None
            if j is None:
                raise self._fail_open(f"{self.ann_key}[{k}] (id {_short(a.get('id'))})",
                                      f"image_id {_short(iid)} is not in images", self.ann_path)
            owner.append(j)
            i = a.get("id")
            aid.append(i if type(i) is int else -1)
            c = a.get("category_id")
            cat.append(cat_pos.get(c, -1) if type(c) is int else -1)
            seg = a.get("segmentation")
            p0, r0, problem = len(part_end) - 1, len(self._rle), None
            if type(seg) is list:
                for part in seg:
                    if type(part) is list and len(part) >= 6 and not len(part) & 1:
                        coords.extend(part)
                        part_end.append(len(coords))
                    else:
                        problem = problem or self._bad_part(part)
                kind.append(POLYGONS if seg else NO_SEG)
            elif seg is None:
                kind.append(NO_SEG)
            else:
                problem = self._add_rle(seg, int(img_h[j]), int(img_w[j]))
                kind.append(RLE if problem is None else NO_SEG)
            plo.append(p0)
            phi.append(len(part_end) - 1)
            rlo.append(r0)
            rhi.append(len(self._rle))
            b, ar, cr = a.get("bbox"), a.get("area"), a.get("iscrowd")
            if not (type(b) is list and len(b) == 4 and type(b[0]) in NUMBER and type(b[1]) in NUMBER
                    and type(b[2]) in NUMBER and type(b[3]) in NUMBER and b[2] >= 0 and b[3] >= 0
                    and type(ar) in NUMBER and ar >= 0 and (cr == 0 or cr == 1) and type(cr) is int):
                b, ar, cr, slow = self._slow_fields(b, ar, cr, kind[-1], p0, r0, j)
                problem = problem or slow
            box.append(b)
            area.append(ar)
            crowd.append(cr)
            if scored:
                s = a.get("score")
                score.append(s if _is_number(s) else 0.0)
                problem = problem or (None if _is_number(s) else f"'score' must be a number, got {_short(s)}")
            if cat[-1] < 0:
                problem = problem or f"category_id {_short(c)} is not in categories"
            if problem and j not in self.errors:
                self.errors[j] = f"{self.ann_key}[{k}] (id {_short(i)}): {problem}"
        self._finish(anns, owner, aid, cat, box, area, crowd, kind, plo, phi, rlo, rhi, score)

    def _finish(self, anns: list, owner: list, aid: list, cat: list, box: list, area: list, crowd: list,
                kind: list, plo: list, phi: list, rlo: list, rhi: list, score: list) -> None:
        """Lists to arrays grouped by image (stable: file order within an image); non-finite numbers mark
        their image invalid."""
        owner_arr = np.array(owner, dtype=np.int64)
        order = np.argsort(owner_arr, kind="stable")
        self.ann_start = np.searchsorted(owner_arr[order], np.arange(len(self.img_id) + 1)).astype(np.int64)
        self.ann_id = np.array(aid, dtype=np.int64)[order]
        self.ann_cat = np.array(cat, dtype=np.int64)[order]
        self.ann_box = np.array(box, dtype=np.float64).reshape(-1, 4)[order]
        self.ann_area = np.array(area, dtype=np.float64)[order]
        self.ann_crowd = np.array(crowd, dtype=np.uint8)[order]
        self.ann_score = np.array(score, dtype=np.float32)[order] if score else np.zeros(0, np.float32)
        self.seg_kind = np.array(kind, dtype=np.uint8)[order]
        self.part_lo, self.part_hi = (np.array(v, dtype=np.int64)[order] for v in (plo, phi))
        self.rle_lo, self.rle_hi = (np.array(v, dtype=np.int64)[order] for v in (rlo, rhi))
        coords = np.array(self._coords)
        if coords.dtype.kind not in "iuf":  # strings or nulls among the coordinates: NaN marks them below
            coords = np.array([v if type(v) in NUMBER else np.nan for v in self._coords])
        self.coords = coords.astype(np.float64)
        self.part_start = np.array(self._part_end, dtype=np.int64)
        self.rle = np.frombuffer(bytes(self._rle), dtype=np.uint8)
        bad = ~np.isfinite(np.array(box, dtype=np.float64).reshape(-1, 4)).all(1)
        bad |= ~np.isfinite(np.array(area, dtype=np.float64))
        bad_parts = np.searchsorted(self.part_start, np.flatnonzero(~np.isfinite(self.coords)), side="right") - 1
        bad[np.searchsorted(np.array(plo, dtype=np.int64), bad_parts, side="right") - 1] = True
        for row in np.flatnonzero(bad).tolist():
            self.errors.setdefault(owner[row], f"{self.ann_key}[{row}] (id {_short(anns[row].get('id'))}): "
                                               "coordinates must be finite numbers")

    def _bad_part(self, part: Any) -> str | None:
        if type(part) is not list:
            return f"a polygon must be a list of coordinates, got {type(part).__name__}"
        if len(part) & 1:
            return f"a polygon has an odd number of coordinates ({len(part)})"
        self.repairs["short_polygon_parts"] += 1  # < 3 points: covers no pixel
        return None

    def _add_rle(self, seg: Any, h: int, w: int) -> str | None:
        """Validate an RLE segmentation and append it, compressed, to the RLE buffer."""
        if not isinstance(seg, dict) or "counts" not in seg or "size" not in seg:
            return "segmentation must be polygons (a list of lists) or an RLE {'size', 'counts'}"
        if seg["size"] != [h, w]:
            return f"RLE size {_short(seg['size'])} differs from the image's [height, width] [{h}, {w}]"
        counts = seg["counts"]
        if isinstance(counts, list):
            if not all(type(c) is int and c >= 0 for c in counts):
                return "uncompressed RLE counts must be integers >= 0"
            if sum(counts) != h * w:
                return f"RLE counts sum to {sum(counts)}, not height x width = {h * w}"
            from pycocotools import mask as mask_utils
            counts = mask_utils.frPyObjects({"size": [h, w], "counts": counts}, h, w)["counts"]
        elif isinstance(counts, str):
            counts = counts.encode("ascii", "replace")
            total = rle_string_total(counts)
            if total != h * w:
                return ("compressed RLE counts are not valid COCO RLE" if total is None
                        else f"RLE counts sum to {total}, not height x width = {h * w}")
        else:
            return f"RLE counts must be a list or a string, got {type(counts).__name__}"
        self._rle += counts
        return None

    def _slow_fields(self, box: Any, area: Any, crowd: Any, kind: int, p0: int, r0: int,
                     j: int) -> tuple[list, float, int, str | None]:
        """bbox, area and iscrowd that are null (repaired) or wrong (explained); returns them and the problem."""
        h, w = int(self.img_h[j]), int(self.img_w[j])
        rle, problem = None, None
        if kind != NO_SEG and h and (box is None or area is None):
            try:
                rle = self._segment_rle(p0, r0, kind, h, w)
            except ValueError as err:
                problem = str(err)
        if crowd is None:
            self.repairs["null_iscrowd"] += 1
            crowd = 0
        elif type(crowd) is not int or crowd not in (0, 1):
            problem, crowd = f"iscrowd must be 0 or 1, got {_short(crowd)}", 0
        if box is None and rle is not None:
            from pycocotools import mask as mask_utils
            self.repairs["null_bbox"] += 1
            box = mask_utils.toBbox(rle).tolist()
        if not (type(box) is list and len(box) == 4 and all(_is_number(v) for v in box)):
            problem = problem or f"bbox must be 4 finite numbers [x, y, width, height], got {_short(box)}"
            return [0.0] * 4, 0.0, crowd, problem
        if box[2] < 0 or box[3] < 0:
            problem = problem or (f"bbox {box} has a negative width or height (COCO boxes are [x, y, width, "
                                  "height]; is this [x1, y1, x2, y2]?)")
        if area is None:
            from pycocotools import mask as mask_utils
            self.repairs["null_area"] += 1
            area = float(mask_utils.area(rle)) if rle is not None else box[2] * box[3]
        if not _is_number(area) or area < 0:
            problem, area = problem or f"area must be a number >= 0, got {_short(area)}", 0.0
        return box, area, crowd, problem

    def _segment_rle(self, p0: int, r0: int, kind: int, h: int, w: int) -> dict:
        """The merged RLE of the segmentation just added (for null bbox/area repairs)."""
        if kind == RLE:
            return {"size": [h, w], "counts": bytes(self._rle[r0:])}
        ends = self._part_end
        return _polygon_rle([self._coords[ends[p]:ends[p + 1]] for p in range(p0, len(ends) - 1)], h, w)

    def arrays(self) -> dict[str, np.ndarray]:
        err = sorted(self.errors)
        return {**{n: getattr(self, n) for n in ARRAYS[:-4]}, "err_img": np.array(err, dtype=np.int64),
                **dict(zip(("err_msg", "err_msg_end"), _pack([self.errors[j] for j in err]))),
                "repairs": np.array([self.repairs[k] for k in REPAIR_KEYS], dtype=np.int64)}


#: The arrays a parsed file becomes (and its cache holds), the last four being the per-image errors and the
#: build-time repair counts. Strings are packed as UTF-8 bytes plus end offsets (`_pack`).
ARRAYS = ("img_id", "img_file", "img_file_end", "img_w", "img_h", "ann_start", "ann_id", "ann_cat", "ann_box",
          "ann_area", "ann_crowd", "ann_score", "seg_kind", "part_lo", "part_hi", "part_start", "coords", "rle_lo",
          "rle_hi", "rle", "cat_id", "cat_name", "err_img", "err_msg", "err_msg_end", "repairs")
#: Build-time repair counters, in the order stored in the cache's ``repairs`` array.
REPAIR_KEYS = ("null_iscrowd", "null_area", "null_bbox", "short_polygon_parts", "null_category_name")


def _pack(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as one UTF-8 byte buffer and the end offset of each (no fixed-width padding: one long file
    name must not multiply the size of all of them)."""
    encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
    ends = np.cumsum([len(e) for e in encoded], dtype=np.int64)
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), ends


def _unpack(buf: np.ndarray, ends: np.ndarray, k: int) -> str:
    start = int(ends[k - 1]) if k else 0
    return buf[start:int(ends[k])].tobytes().decode("utf-8", "surrogatepass")


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else obj


def _polygon_rle(parts: list, h: int, w: int) -> dict:
    """pycocotools' polygon rasterising (``annToRLE``: frPyObjects, then merge of the parts). Raises
    ValueError for coordinates that are not finite or lie more than an image size outside the image: the
    rasteriser allocates memory in proportion to the polygon's extent."""
    from pycocotools import mask as mask_utils
    if not parts:
        return mask_utils.encode(np.zeros((h, w, 1), dtype=np.uint8, order="F"))[0]
    arrays = []
    for part in parts:
        try:
            xy = np.asarray(part, dtype=np.float64).reshape(-1, 2)
        except (TypeError, ValueError):
            raise ValueError("polygon coordinates must be finite numbers") from None
        if not np.isfinite(xy).all():
            raise ValueError("polygon coordinates must be finite numbers")
        if (xy.min(0) < (-w, -h)).any() or (xy.max(0) > (2 * w, 2 * h)).any():
            raise ValueError(f"polygon coordinates reach more than an image size outside the {w}x{h} image")
        arrays.append(xy.ravel().tolist())
    return mask_utils.merge(mask_utils.frPyObjects(arrays, h, w))


# -- the cache ---------------------------------------------------------------------------------------------

def _stamp(paths: Iterable[str]) -> list:
    out = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError as err:
            raise SourceError(f"cannot read {p!r}: {err.strerror}", path=p) from err
        out.append([os.path.realpath(p), st.st_size, st.st_mtime_ns])
    return out


def _cache_dir(paths: list[str], cache: Any) -> str | None:
    """Where the arrays parsed from ``paths`` are kept (None: no cache)."""
    if cache is False or cache is None:
        return None
    if cache is True:
        root = os.path.dirname(os.path.abspath(paths[0]))
        if not os.access(root, os.W_OK):
            root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ingest")
    elif isinstance(cache, (str, os.PathLike)):
        root = os.fspath(cache)
    else:
        raise ConfigError(f"`cache` must be True, False or a directory, got {cache!r}")
    key = hashlib.sha1("\0".join(os.path.realpath(p) for p in paths).encode()).hexdigest()[:12]
    return os.path.join(root, f".{os.path.basename(paths[0])}.{key}.ingest-coco")


def _load_cache(directory: str, stamp: list) -> dict[str, np.ndarray] | None:
    """The cached arrays (memory-mapped) if ``directory`` holds a cache of files with ``stamp``."""
    try:
        with open(os.path.join(directory, "stamp.json")) as f:
            if json.loads(f.read()) != {"version": CACHE_VERSION, "sources": stamp}:
                return None
        return {name: np.load(os.path.join(directory, name + ".npy"), mmap_mode="r", allow_pickle=False)
                for name in ARRAYS}
    except (OSError, ValueError):
        return None


def _save_cache(directory: str, stamp: list, arrays: dict[str, np.ndarray]) -> None:
    """Write the arrays to a temporary directory and swap it in; a failure to write only costs speed."""
    tmp = f"{directory}.tmp{os.getpid()}"
    try:
        os.makedirs(tmp, exist_ok=True)
        for name, arr in arrays.items():
            np.save(os.path.join(tmp, name + ".npy"), arr, allow_pickle=False)
        with open(os.path.join(tmp, "stamp.json"), "w") as f:
            f.write(json.dumps({"version": CACHE_VERSION, "sources": stamp}))
        if os.path.exists(directory):  # stale: move it aside (readers keep their mappings), then swap
            old = f"{directory}.old{os.getpid()}"
            os.rename(directory, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp, directory)
    except OSError as err:
        warnings.warn(f"ingest: could not write the COCO annotation cache {directory!r} ({err}); "
                      "the JSON will be parsed again next time", stacklevel=3)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _open_arrays(paths: list[str], cache: Any, build) -> tuple[dict[str, np.ndarray], list, str | None]:
    """The parsed arrays of ``paths`` (from the cache when it is current), their stamp and the cache dir."""
    stamp = _stamp(paths)
    directory = _cache_dir(paths, cache)
    arrays = _load_cache(directory, stamp) if directory else None
    if arrays is None:
        arrays = build()
        if directory:
            _save_cache(directory, stamp, arrays)
            mapped = _load_cache(directory, stamp)  # pickles then re-map the files instead of carrying arrays
            arrays, directory = (arrays, None) if mapped is None else (mapped, directory)
    return arrays, stamp, directory


# -- the source --------------------------------------------------------------------------------------------

class CocoSource:
    """One sample per image of a COCO instances file (see the module docstring for fields and options)."""

    streamed = False

    def __init__(self, annotations: str | os.PathLike, *, images: str | os.PathLike | None = None,
                 box_format: str = "xywh", relative: bool = False, contiguous_ids: bool = True,
                 include_crowd: bool = True, masks: str | None = None, skip_empty: bool = False,
                 size_threshold: float = 0.0, image_ids: Iterable[int] | None = None, cache: Any = True):
        path = os.fspath(annotations)
        self._setup(path, images, box_format, relative, contiguous_ids, include_crowd, masks, skip_empty,
                    size_threshold, image_ids)
        self._paths = [path]
        arrays, self._stamp, self._cache = _open_arrays(self._paths, cache, self._parse_annotations)
        self._select(arrays)

    @classmethod
    def results(cls, results: str | os.PathLike, ground_truth: str | os.PathLike, **options: Any) -> "CocoSource":
        """A results file (a JSON list of detections, what ``COCO.loadRes`` reads) over the images and
        categories of its ``ground_truth`` instances file, filled in as pycocotools' ``loadRes`` does:
        bbox results get ``area = w * h`` and, without a segmentation, the box as a polygon; segm results
        (compressed RLE) get pycocotools' ``area`` and, without a bbox, ``toBbox``; keypoint results get the
        keypoints' extent as box and area. Every result is ``iscrowd = 0``; a ``scores`` field is added.
        ``options`` are the constructor's; ``images`` defaults to the ground truth's directory."""
        self = cls.__new__(cls)
        path, gt = os.fspath(results), os.fspath(ground_truth)
        options.setdefault("images", os.path.dirname(os.path.abspath(gt)))
        self._setup(path, **options, scored=True)  # type: ignore[misc]
        self._paths = [path, gt]
        cache = options.get("cache", True)
        arrays, self._stamp, self._cache = _open_arrays(self._paths, cache, lambda: self._parse_results(gt))
        self._select(arrays)
        return self

    def _setup(self, path: str, images: Any = None, box_format: str = "xywh", relative: bool = False,
               contiguous_ids: bool = True, include_crowd: bool = True, masks: str | None = None,
               skip_empty: bool = False, size_threshold: float = 0.0, image_ids: Iterable[int] | None = None,
               cache: Any = True, scored: bool = False) -> None:
        if box_format not in BOX_FORMATS:
            raise ConfigError(f"`box_format` must be one of {', '.join(BOX_FORMATS)}; got {box_format!r}")
        if masks not in MASK_MODES:
            raise ConfigError(f"`masks` must be None, 'polygons' or 'masks'; got {masks!r}")
        if not _is_number(size_threshold) or size_threshold < 0:
            raise ConfigError(f"`size_threshold` must be a number >= 0, got {size_threshold!r}")
        self.path = path
        self.root = os.fspath(images) if images is not None else os.path.dirname(os.path.abspath(path))
        self.box_format, self.relative, self.masks = box_format, bool(relative), masks
        self.contiguous_ids, self.include_crowd = bool(contiguous_ids), bool(include_crowd)
        self.skip_empty, self.size_threshold = bool(skip_empty), float(size_threshold)
        try:
            self._image_ids = None if image_ids is None else np.unique(np.asarray(list(image_ids), dtype=np.int64))
        except (TypeError, ValueError) as err:
            raise ConfigError(f"`image_ids` must be integers, got {image_ids!r}") from err
        self._scored = scored
        self.fields = {"image": Field("image"), "label": Field("int"), "image_id": Field("int"),
                       "boxes": Field("array", dtype="float32"), "categories": Field("ints"),
                       "iscrowd": Field("ints"), "area": Field("floats")}
        if masks == "masks":
            self.fields["masks"] = Field("array", dtype="uint8")
        elif masks == "polygons":
            self.fields["polygons"] = Field("text")
        if scored:
            self.fields["scores"] = Field("floats")

    def _parse_annotations(self) -> dict[str, np.ndarray]:
        data = _load_json(self.path)
        if isinstance(data, list):
            raise SourceError(f"{self.path} is a COCO results file ({len(data)} detections without images or "
                              "categories), not an instances file: open it with "
                              "CocoSource.results(path, ground_truth='instances_*.json')", path=self.path)
        return _Builder(data, self.path).arrays()

    def _parse_results(self, gt: str) -> dict[str, np.ndarray]:
        data, truth = _load_json(self.path), _load_json(gt)
        if not isinstance(data, list):
            raise SourceError(f"{self.path} is not a COCO results file (expected a JSON list of detections)",
                              path=self.path)
        return _Builder(truth, gt, _results_as_annotations(data, self.path), self.path).arrays()

    # -- options applied to the parsed arrays --------------------------------------------------------------
    def _select(self, a: dict[str, np.ndarray]) -> None:
        """Apply the options to the parsed arrays: the samples (images) and their objects' final targets."""
        self._a = a
        n_img = len(a["img_id"])
        owner = np.repeat(np.arange(n_img), np.diff(a["ann_start"]))
        chosen = self._chosen_images(a)
        invalid = np.zeros(n_img, dtype=bool)
        invalid[a["err_img"]] = True
        keep, ltrb = self._kept_objects(a, owner, chosen & ~invalid)
        per_image = np.bincount(owner[keep], minlength=n_img)
        if self.skip_empty:
            chosen &= invalid | (per_image > 0)
        self._img = np.flatnonzero(chosen)
        self._ann = np.flatnonzero(keep & chosen[owner])
        self._start = np.concatenate([[0], np.cumsum(per_image[self._img])]).astype(np.int64)
        self._errors = {int(j): _unpack(a["err_msg"], a["err_msg_end"], e)
                        for e, j in enumerate(a["err_img"].tolist()) if chosen[j]}
        self.repairs.update(zip(REPAIR_KEYS, np.asarray(a["repairs"]).tolist()))
        self._targets(a, keep & chosen[owner], ltrb)
        self.classes = self._class_names(a)
        fixed = {k: v for k, v in self.repairs.items() if v}
        if fixed:
            warnings.warn(f"{self.path}: repaired annotations: "
                          + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in fixed.items())
                          + " (see CocoSource.repairs and the coco module's docstring)", stacklevel=3)

    def _chosen_images(self, a: dict[str, np.ndarray]) -> np.ndarray:
        if self._image_ids is None:
            return np.ones(len(a["img_id"]), dtype=bool)
        missing = np.setdiff1d(self._image_ids, a["img_id"])
        if len(missing):
            raise ConfigError(f"`image_ids` names {len(missing)} ids not in {self.path}: "
                              f"{', '.join(map(str, missing[:10].tolist()))}{' ...' if len(missing) > 10 else ''}")
        return np.isin(a["img_id"], self._image_ids)

    def _kept_objects(self, a: dict[str, np.ndarray], owner: np.ndarray,
                      counted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which objects the options keep, and every object's box clipped to its image, as [x1, y1, x2, y2];
        counts the clipping repairs of the images in ``counted`` (starts `repairs`)."""
        w, h = a["img_w"][owner].astype(np.float64), a["img_h"][owner].astype(np.float64)
        box = np.asarray(a["ann_box"], dtype=np.float64)
        right, bottom = box[:, 0] + box[:, 2], box[:, 1] + box[:, 3]
        ltrb = np.stack([np.clip(box[:, 0], 0, w), np.clip(box[:, 1], 0, h), np.clip(right, 0, w),
                         np.clip(bottom, 0, h)], 1)
        counted = counted[owner]
        nonempty = (ltrb[:, 2] > ltrb[:, 0]) & (ltrb[:, 3] > ltrb[:, 1])
        moved = (ltrb != np.stack([box[:, 0], box[:, 1], right, bottom], 1)).any(1)
        self.repairs = {"clipped_boxes": int((counted & nonempty & moved).sum()),
                        "empty_boxes_dropped": int((counted & ~nonempty).sum())}
        keep = counted & nonempty
        if not self.include_crowd:
            keep &= a["ann_crowd"] == 0
        if self.size_threshold:
            size = ltrb[:, 2:] - ltrb[:, :2]
            keep &= (size >= self.size_threshold).all(1)
        return keep, ltrb

    def _targets(self, a: dict[str, np.ndarray], keep: np.ndarray, ltrb: np.ndarray) -> None:
        """Final per-object arrays of the kept objects, in sample order."""
        ltrb = ltrb[keep]
        boxes = ltrb.copy()
        if self.box_format == "xywh":
            boxes[:, 2:] -= boxes[:, :2]
        if self.relative:
            owner = np.repeat(self._img, np.diff(self._start))
            scale = np.stack([a["img_w"][owner], a["img_h"][owner]], 1).astype(np.float64)
            boxes /= np.tile(scale, 2)
        self._boxes = boxes.astype(np.float32)
        cat = np.asarray(a["ann_cat"])[keep]
        self._cats = cat + 1 if self.contiguous_ids else np.asarray(a["cat_id"])[np.maximum(cat, 0)]
        self._crowd = np.asarray(a["ann_crowd"])[keep].astype(np.int64)
        self._area = np.asarray(a["ann_area"])[keep].astype(np.float32)
        self._score = np.asarray(a["ann_score"])[keep] if self._scored else None

    def _class_names(self, a: dict[str, np.ndarray]) -> list[str]:
        names = [str(n) for n in a["cat_name"]]
        if self.contiguous_ids:
            return ["__background__", *names]
        ids = a["cat_id"].tolist()  # sorted
        if ids and not 0 <= ids[0] <= ids[-1] <= MAX_CLASS_ID:
            raise ConfigError(f"contiguous_ids=False needs category ids in [0, {MAX_CLASS_ID}] (they index "
                              f"`classes`); {self.path} has ids {ids[0]}..{ids[-1]}")
        out = ["N/A"] * (ids[-1] + 1 if ids else 0)
        if ids and ids[0] != 0:
            out[0] = "__background__"
        for i, n in zip(ids, names):
            out[i] = n
        return out

    # -- the source contract -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._img)

    def locate(self, i: int) -> Location:
        return Location(self.name(i))

    def name(self, i: int) -> str:
        j = int(self._img[check_index(i, len(self._img))])
        return os.path.join(self.root, _unpack(self._a["img_file"], self._a["img_file_end"], j))

    def labels(self) -> np.ndarray:
        return np.full(len(self._img), -1, dtype=np.int64)

    @property
    def image_ids(self) -> np.ndarray:
        """The COCO image id of every sample, in sample order."""
        return np.asarray(self._a["img_id"])[self._img]

    def parse(self, i: int, raw: Any) -> Record:
        i = check_index(i, len(self._img))
        j = int(self._img[i])
        if j in self._errors:
            raise CorruptRecordError(self._errors[j], path=self.path, index=i)
        lo, hi = int(self._start[i]), int(self._start[i + 1])
        # Copies: a record's arrays belong to its user, who may change them in place.
        fields: dict[str, Any] = {"image_id": int(self._a["img_id"][j]), "boxes": self._boxes[lo:hi].copy(),
                                  "categories": self._cats[lo:hi].copy(), "iscrowd": self._crowd[lo:hi].copy(),
                                  "area": self._area[lo:hi].copy()}
        if self.masks == "masks":
            fields["masks"] = self._pixel_masks(i, j, self._ann[lo:hi])
        elif self.masks == "polygons":
            fields["polygons"] = self._polygons(j, self._ann[lo:hi])
        if self._score is not None:
            fields["scores"] = self._score[lo:hi].copy()
        return Record(raw, -1, fields)

    def _parts(self, ann: int) -> list[np.ndarray]:
        a = self._a
        starts = a["part_start"][a["part_lo"][ann]:a["part_hi"][ann] + 1]
        return [a["coords"][s:e] for s, e in zip(starts[:-1], starts[1:])]

    def _rle(self, ann: int, h: int, w: int) -> dict:
        a = self._a
        return {"size": [h, w], "counts": a["rle"][a["rle_lo"][ann]:a["rle_hi"][ann]].tobytes()}

    def _pixel_masks(self, i: int, j: int, anns: np.ndarray) -> np.ndarray:
        """``annToMask`` of every object of image ``j``: [N, H, W] uint8."""
        from pycocotools import mask as mask_utils
        h, w = int(self._a["img_h"][j]), int(self._a["img_w"][j])
        if len(anns) * h * w > MAX_MASK_BYTES:
            raise CorruptRecordError(f"{len(anns)} masks of {h}x{w} would take more than {MAX_MASK_BYTES} bytes",
                                     path=self.path, index=i)
        rles = []
        for ann in anns.tolist():
            kind = self._a["seg_kind"][ann]
            if kind == NO_SEG:
                raise CorruptRecordError(f"annotation id {int(self._a['ann_id'][ann])} has no segmentation "
                                         "(masks='masks' needs one for every object)", path=self.path, index=i)
            try:
                rles.append(self._rle(ann, h, w) if kind == RLE else _polygon_rle(self._parts(ann), h, w))
            except ValueError as err:
                raise CorruptRecordError(f"annotation id {int(self._a['ann_id'][ann])}: {err}", path=self.path,
                                         index=i) from None
        if not rles:
            return np.zeros((0, h, w), dtype=np.uint8)
        return np.ascontiguousarray(mask_utils.decode(rles).transpose(2, 0, 1))

    def _polygons(self, j: int, anns: np.ndarray) -> str:
        h, w = int(self._a["img_h"][j]), int(self._a["img_w"][j])
        scale = np.array([w, h], dtype=np.float64) if self.relative else None
        out: list[Any] = []
        for ann in anns.tolist():
            kind = self._a["seg_kind"][ann]
            if kind == RLE:
                rle = self._rle(ann, h, w)
                out.append({"size": rle["size"], "counts": rle["counts"].decode("ascii")})
            elif kind == POLYGONS:
                parts = self._parts(ann)
                out.append([(p.reshape(-1, 2) / scale).ravel().tolist() if scale is not None else p.tolist()
                            for p in parts])
            else:
                out.append(None)
        return json.dumps(out)

    # -- inspect -------------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """What ``ingest inspect`` prints for an annotation file, after the options: images, objects,
        categories, crowd objects, objects per category name, images without objects, images whose
        annotations are invalid (with the first message) and the repairs made."""
        names = np.asarray(self._a["cat_name"])
        cats = np.asarray(self._a["ann_cat"])[self._ann]
        per_cat = np.bincount(cats[cats >= 0], minlength=len(names))
        counts = np.diff(self._start)
        first_error = next(iter(self._errors.values()), None)
        return {"images": len(self), "annotations": int(len(self._ann)), "categories": int(len(names)),
                "crowd": int(self._crowd.sum()), "empty_images": int((counts == 0).sum()),
                "per_category": {str(n): int(c) for n, c in zip(names, per_cat)},
                "invalid_images": len(self._errors), "first_error": first_error, "repairs": dict(self.repairs)}

    def __repr__(self) -> str:
        return (f"CocoSource({self.path!r}, {len(self)} images, {len(self._ann)} objects, "
                f"{len(self._a['cat_id'])} categories)")

    # -- pickling: a cached source travels as its paths and re-maps the cache ---------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self._cache is not None:
            state["_a"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._a is None:
            self._a = _load_cache(self._cache, self._stamp)
            if self._a is None:
                raise SourceError(f"the annotation cache {self._cache!r} of {self.path} changed or vanished "
                                  "since the source was opened; open it again", path=self.path)


def _results_as_annotations(results: list, path: str) -> list[dict]:
    """Results entries completed as pycocotools' ``loadRes`` does (the kind is decided by the first entry)."""
    if not results:
        return []
    first = results[0] if isinstance(results[0], dict) else {}
    kind = ("bbox" if first.get("bbox") not in (None, []) else "segmentation" if "segmentation" in first
            else "keypoints" if "keypoints" in first else None)
    if kind is None:
        raise SourceError(f"{path}: results entries must have a bbox, a segmentation or keypoints", path=path)
    out = []
    for k, r in enumerate(results):
        if not isinstance(r, dict):
            raise CorruptRecordError(f"results[{k}]: expected an object, got {type(r).__name__}", path=path)
        a = {**r, "id": k + 1, "iscrowd": 0, "area": None}
        box = r.get("bbox")
        if kind == "bbox" and isinstance(box, list) and len(box) == 4 and all(_is_number(v) for v in box):
            x1, y1, x2, y2 = box[0], box[1], box[0] + box[2], box[1] + box[3]
            a.setdefault("segmentation", [[x1, y1, x1, y2, x2, y2, x2, y1]])
            a["area"] = box[2] * box[3]
        elif kind == "keypoints":
            kp = r.get("keypoints")
            if isinstance(kp, list) and kp and len(kp) % 3 == 0 and all(_is_number(v) for v in kp):
                xs, ys = kp[0::3], kp[1::3]
                a["bbox"] = [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]
                a["area"] = a["bbox"][2] * a["bbox"][3]
        out.append(a)
    return out
