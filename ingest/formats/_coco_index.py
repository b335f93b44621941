"""Parsing of COCO instances and results files into validated numpy arrays, and the cache that keeps them
(see `ingest.formats.coco` for what is repaired, what fails and where the cache lives)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import reprlib
import shutil
import sys
import warnings
from typing import Any, Iterable

import numpy as np

from ..errors import ConfigError, CorruptRecordError, IngestError, SourceError

#: Version of the cache layout; bump it when the arrays change meaning.
CACHE_VERSION = 3
#: Segmentation kinds stored per annotation.
NO_SEG, POLYGONS, RLE = 0, 1, 2
#: JSON number types (bool excluded: ``type(True) is bool``).
NUMBER = frozenset({int, float})
#: Ids are int64 in the parsed arrays; JSON integers outside this range are refused (ids) or ignored.
INT64 = (-(1 << 63), (1 << 63) - 1)
#: Largest declared image width or height (int32, as every decoder's sizes are).
MAX_SIDE = (1 << 31) - 1
#: What a malformed file can make Python or numpy raise past the checks below (a number too large for a
#: double, a list where a number belongs); `parse_instances` and `parse_results` turn it into a SourceError.
_MALFORMED = (OverflowError, TypeError, ValueError, RecursionError, AttributeError, KeyError, IndexError)


def load_json(path: str) -> Any:
    """Parse an annotation or results file (the one slow step the cache avoids)."""
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except OSError as err:
        raise SourceError(f"cannot read {path!r}: {err.strerror}", path=path) from err
    except (ValueError, UnicodeDecodeError) as err:
        raise SourceError(f"{path} is not valid JSON: {err}", path=path) from err
    except RecursionError:
        raise SourceError(f"{path}: its JSON nests deeper than Python's recursion limit allows", path=path) from None


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 80


def short(value: Any) -> str:
    """A bounded repr of a value read from the file, for messages."""
    return _repr.repr(value)


def is_number(v: Any) -> bool:
    """A finite JSON number that fits a double (an int past 1.8e308 does not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return -sys.float_info.max <= v <= sys.float_info.max if isinstance(v, int) else math.isfinite(v)


def is_int64(v: Any) -> bool:
    return type(v) is int and INT64[0] <= v <= INT64[1]


def float_array(values: list) -> np.ndarray:
    """JSON numbers as float64; a value that is not one (a string, a null, a list, an int too large for a
    double) becomes NaN, which marks its image invalid."""
    try:
        arr = np.array(values)
        if arr.ndim == 1 and arr.dtype.kind in "iuf":
            return arr.astype(np.float64)
    except (ValueError, OverflowError, RecursionError):   # nested or ragged lists
        pass
    return np.array([float(v) if is_number(v) else np.nan for v in values], dtype=np.float64)


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


def parse_instances(path: str) -> dict[str, np.ndarray]:
    """The arrays (`ARRAYS`) of an instances file."""
    data = load_json(path)
    if isinstance(data, list):
        raise SourceError(f"{path} is a COCO results file ({len(data)} detections without images or categories), "
                          "not an instances file: open it with CocoSource.results(path, "
                          "ground_truth='instances_*.json')", path=path)
    return _build(path, lambda: Builder(data, path).arrays())


def parse_results(path: str, ground_truth: str) -> dict[str, np.ndarray]:
    """The arrays of a results file over the images and categories of its ground-truth instances file."""
    data, truth = load_json(path), load_json(ground_truth)
    if not isinstance(data, list):
        raise SourceError(f"{path} is not a COCO results file (expected a JSON list of detections)", path=path)
    return _build(path, lambda: Builder(truth, ground_truth, results_as_annotations(data, path), path).arrays())


def _build(path: str, build) -> dict[str, np.ndarray]:
    """``build()``, with what a malformed file makes Python or numpy raise past the checks as a SourceError."""
    try:
        return build()
    except IngestError:
        raise
    except _MALFORMED as err:
        raise SourceError(f"{path} is not a COCO file this reader can take ({type(err).__name__}: "
                          f"{short(str(err))})", path=path) from err


class Builder:
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
        cats = data.get("categories") or []
        if not isinstance(cats, list):
            raise SourceError(f"{path}: 'categories' must be a list, got {type(cats).__name__}", path=path)
        self._categories(cats)
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
            if type(im) is not dict or not is_int64(im.get("id")):
                raise self._fail_open(f"images[{k}]", f"'id' must be a 64-bit integer, got {short(_get(im, 'id'))}")
            name = im.get("file_name")
            if type(name) is not str or not name:
                raise self._fail_open(f"images[{k}] (id {im['id']})", f"'file_name' must be a path, got {short(name)}")
            ids.append(im["id"])
            files.append(name)
            widths.append(im.get("width"))
            heights.append(im.get("height"))
        order = np.argsort(np.array(ids, dtype=np.int64), kind="stable")
        self.img_id = np.array(ids, dtype=np.int64)[order]
        dup = self.img_id[1:][self.img_id[1:] == self.img_id[:-1]]
        if len(dup):
            raise self._fail_open("images", f"image id {int(dup[0])} appears more than once")
        self.img_file, self.img_file_end = pack([files[k] for k in order.tolist()])
        self.img_w = np.zeros(len(ids), dtype=np.int64)
        self.img_h = np.zeros(len(ids), dtype=np.int64)
        for j, k in enumerate(order.tolist()):
            w, h = widths[k], heights[k]
            if type(w) is int and type(h) is int and 0 < w <= MAX_SIDE and 0 < h <= MAX_SIDE:
                self.img_w[j], self.img_h[j] = w, h
            else:
                self.errors[j] = (f"images[{k}] (id {ids[k]}): width and height must be integers in [1, "
                                  f"{MAX_SIDE}], got {short(w)} x {short(h)}")
        self.img_pos = dict(zip(self.img_id.tolist(), range(len(ids))))

    def _categories(self, cats: list) -> None:
        found: dict[int, str] = {}
        for k, c in enumerate(cats):
            if type(c) is not dict or not is_int64(c.get("id")):
                raise self._fail_open(f"categories[{k}]",
                                      f"'id' must be a 64-bit integer, got {short(_get(c, 'id'))}")
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
                raise self._fail_open(f"{self.ann_key}[{k}] (id {short(a.get('id'))})",
                                      f"image_id {short(iid)} is not in images", self.ann_path)
            owner.append(j)
            i = a.get("id")
            aid.append(i if is_int64(i) else -1)
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
                score.append(s if is_number(s) else 0.0)
                problem = problem or (None if is_number(s) else f"'score' must be a number, got {short(s)}")
            if cat[-1] < 0:
                problem = problem or f"category_id {short(c)} is not in categories"
            if problem and j not in self.errors:
                self.errors[j] = f"{self.ann_key}[{k}] (id {short(i)}): {problem}"
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
        try:   # the values are numbers; only an int too large for a double fails (NaN marks it below)
            boxes, areas = np.array(box, dtype=np.float64).reshape(-1, 4), np.array(area, dtype=np.float64)
        except OverflowError:
            boxes, areas = float_array([v for b in box for v in b]).reshape(-1, 4), float_array(area)
        self.ann_box = boxes[order]
        self.ann_area = areas[order]
        self.ann_crowd = np.array(crowd, dtype=np.uint8)[order]
        self.ann_score = np.array(score, dtype=np.float32)[order] if score else np.zeros(0, np.float32)
        self.seg_kind = np.array(kind, dtype=np.uint8)[order]
        self.part_lo, self.part_hi = (np.array(v, dtype=np.int64)[order] for v in (plo, phi))
        self.rle_lo, self.rle_hi = (np.array(v, dtype=np.int64)[order] for v in (rlo, rhi))
        self.coords = float_array(self._coords)   # NaN where a coordinate is not a number: marked below
        self.part_start = np.array(self._part_end, dtype=np.int64)
        self.rle = np.frombuffer(bytes(self._rle), dtype=np.uint8)
        bad = ~np.isfinite(boxes).all(1)
        bad |= ~np.isfinite(areas)
        bad_parts = np.searchsorted(self.part_start, np.flatnonzero(~np.isfinite(self.coords)), side="right") - 1
        bad[np.searchsorted(np.array(plo, dtype=np.int64), bad_parts, side="right") - 1] = True
        for row in np.flatnonzero(bad).tolist():
            self.errors.setdefault(owner[row], f"{self.ann_key}[{row}] (id {short(anns[row].get('id'))}): "
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
            return f"RLE size {short(seg['size'])} differs from the image's [height, width] [{h}, {w}]"
        counts = seg["counts"]
        if isinstance(counts, list):
            if not all(type(c) is int and 0 <= c < 1 << 32 for c in counts):
                return "uncompressed RLE counts must be integers in [0, 2**32)"
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
            problem, crowd = f"iscrowd must be 0 or 1, got {short(crowd)}", 0
        if box is None and rle is not None:
            from pycocotools import mask as mask_utils
            self.repairs["null_bbox"] += 1
            box = mask_utils.toBbox(rle).tolist()
        if not (type(box) is list and len(box) == 4 and all(is_number(v) for v in box)):
            problem = problem or f"bbox must be 4 finite numbers [x, y, width, height], got {short(box)}"
            return [0.0] * 4, 0.0, crowd, problem
        if box[2] < 0 or box[3] < 0:
            problem = problem or (f"bbox {box} has a negative width or height (COCO boxes are [x, y, width, "
                                  "height]; is this [x1, y1, x2, y2]?)")
        if area is None:
            from pycocotools import mask as mask_utils
            self.repairs["null_area"] += 1
            area = float(mask_utils.area(rle)) if rle is not None else box[2] * box[3]
        if not is_number(area) or area < 0:
            problem, area = problem or f"area must be a number >= 0, got {short(area)}", 0.0
        return box, area, crowd, problem

    def _segment_rle(self, p0: int, r0: int, kind: int, h: int, w: int) -> dict:
        """The merged RLE of the segmentation just added (for null bbox/area repairs)."""
        if kind == RLE:
            return {"size": [h, w], "counts": bytes(self._rle[r0:])}
        ends = self._part_end
        return polygon_rle([self._coords[ends[p]:ends[p + 1]] for p in range(p0, len(ends) - 1)], h, w)

    def arrays(self) -> dict[str, np.ndarray]:
        err = sorted(self.errors)
        return {**{n: getattr(self, n) for n in ARRAYS[:-4]}, "err_img": np.array(err, dtype=np.int64),
                **dict(zip(("err_msg", "err_msg_end"), pack([self.errors[j] for j in err]))),
                "repairs": np.array([self.repairs[k] for k in REPAIR_KEYS], dtype=np.int64)}


#: The arrays a parsed file becomes (and its cache holds), the last four being the per-image errors and the
#: build-time repair counts. Strings are packed as UTF-8 bytes plus end offsets (`pack`).
ARRAYS = ("img_id", "img_file", "img_file_end", "img_w", "img_h", "ann_start", "ann_id", "ann_cat", "ann_box",
          "ann_area", "ann_crowd", "ann_score", "seg_kind", "part_lo", "part_hi", "part_start", "coords", "rle_lo",
          "rle_hi", "rle", "cat_id", "cat_name", "err_img", "err_msg", "err_msg_end", "repairs")
#: Build-time repair counters, in the order stored in the cache's ``repairs`` array.
REPAIR_KEYS = ("null_iscrowd", "null_area", "null_bbox", "short_polygon_parts", "null_category_name")


def pack(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as one UTF-8 byte buffer and the end offset of each (no fixed-width padding: one long file
    name must not multiply the size of all of them)."""
    encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
    ends = np.cumsum([len(e) for e in encoded], dtype=np.int64)
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), ends


def unpack(buf: np.ndarray, ends: np.ndarray, k: int) -> str:
    start = int(ends[k - 1]) if k else 0
    return buf[start:int(ends[k])].tobytes().decode("utf-8", "surrogatepass")


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else obj


def polygon_rle(parts: list, h: int, w: int) -> dict:
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
    if cache is True:  # never beside the user's data: a dataset directory is often shared or read-only
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ingest")
    elif isinstance(cache, (str, os.PathLike)):
        root = os.fspath(cache)
    else:
        raise ConfigError(f"`cache` must be True, False or a directory, got {cache!r}")
    key = hashlib.sha1("\0".join(os.path.realpath(p) for p in paths).encode()).hexdigest()[:12]
    return os.path.join(root, f".{os.path.basename(paths[0])}.{key}.ingest-coco")


def load_cache(directory: str, stamp: list) -> dict[str, np.ndarray] | None:
    """The cached arrays (memory-mapped) if ``directory`` holds a cache of files with ``stamp``."""
    try:
        with open(os.path.join(directory, "stamp.json")) as f:
            if json.loads(f.read()) != {"version": CACHE_VERSION, "sources": stamp}:
                return None
        # Plain ndarray views of the maps: indexing a np.memmap wraps every result in a memmap (several
        # microseconds per access, a few per sample read).
        return {name: np.asarray(np.load(os.path.join(directory, name + ".npy"), mmap_mode="r", allow_pickle=False))
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


def open_arrays(paths: list[str], cache: Any, build) -> tuple[dict[str, np.ndarray], list, str | None]:
    """The parsed arrays of ``paths`` (from the cache when it is current), their stamp and the cache dir."""
    stamp = _stamp(paths)
    directory = _cache_dir(paths, cache)
    arrays = load_cache(directory, stamp) if directory else None
    if arrays is None:
        arrays = build()
        if directory:
            _save_cache(directory, stamp, arrays)
            mapped = load_cache(directory, stamp)  # pickles then re-map the files instead of carrying arrays
            arrays, directory = (arrays, None) if mapped is None else (mapped, directory)
    return arrays, stamp, directory


def results_as_annotations(results: list, path: str) -> list[dict]:
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
        if kind == "bbox" and isinstance(box, list) and len(box) == 4 and all(is_number(v) for v in box):
            x1, y1, x2, y2 = box[0], box[1], box[0] + box[2], box[1] + box[3]
            a.setdefault("segmentation", [[x1, y1, x1, y2, x2, y2, x2, y1]])
            a["area"] = box[2] * box[3]
        elif kind == "keypoints":
            kp = r.get("keypoints")
            if isinstance(kp, list) and kp and len(kp) % 3 == 0 and all(is_number(v) for v in kp):
                xs, ys = kp[0::3], kp[1::3]
                a["bbox"] = [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]
                a["area"] = a["bbox"][2] * a["bbox"][3]
        out.append(a)
    return out
