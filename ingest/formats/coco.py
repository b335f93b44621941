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
boxes         array float32 [N, 4]    ``[x1, y1, x2, y2]`` (``box_format="xyxy"``, the default,
                                      torchvision's; also ``"ltrb"``), ``[x, y, w, h]`` (``"xywh"``, COCO's
                                      ``bbox``) or ``[cx, cy, w, h]`` (``"cxcywh"``; `ingest.formats.boxes`),
                                      in pixels or, with ``relative=True``, divided by the image's width and
                                      height
categories    ints [N]                category: 1..C in sorted category-id order (``contiguous_ids=True``;
                                      0 is left to the background) or the file's category ids
iscrowd       ints [N]                COCO's iscrowd flag (0 or 1)
area          floats [N]              COCO's ``area`` (of the segmentation, not of the box; the geometry ops
                                      prune it with its box and leave its value: `ingest.ops.planner`)
masks         array uint8 [N, H, W]   with ``masks="masks"``: pycocotools' ``annToMask`` of each object
polygons      text                    with ``masks="polygons"``: a JSON list with one entry per object: its
                                      polygons ``[[x, y, x, y, ...], ...]`` (relative with ``relative=True``),
                                      a compressed RLE ``{"size": [h, w], "counts": "..."}`` for RLE
                                      objects, or null when the object has no segmentation
scores        floats [N]              only for results files (`CocoSource.results`)
============  ======================  =====================================================================

**Frame.** Boxes, polygons and masks are in pixels of the image as displayed, EXIF orientation applied: the
frame the Loader decodes to (its CPU and GPU decoders orient), the one annotation tools that show a photo
upright save (labelme, RectLabel) and the one detectron2's ``read_image`` assumes. A file annotated
on the stored pixels of an EXIF-rotated photo (by a tool that ignores the tag) does not fit it: its
``width`` and ``height`` then disagree with the decoded size. The geometry ops move boxes, masks and
polygons with the image (`ingest.ops.planner`), and ``ingest convert --max-side`` rescales them with it.

`classes` lists category names by label: ``classes[0] == "__background__"`` and, with the file's own ids, gaps are
named ``"N/A"`` (torchvision's COCO category list has the same shape). Samples are the images sorted by id.

**Images.** ``file_name`` is joined to ``images``; by default (``images=None``) to the JSON's directory,
which suits exports that store paths like ``JPEGImages/x.jpg`` (labelme, CVAT). The official COCO layout
keeps images elsewhere: pass ``images=".../train2017"``. Files are not checked at open (118k stats); a
missing one fails its read (a `SourceError` naming it and the images root, and saying how to set ``images``;
under the loader's failure budget). A file is read
only when it stays inside the images root once links are resolved (an absolute ``file_name``, ``..`` or a
link to elsewhere is an `OutsideRootError` unless ``allow_outside_root=True``), is a regular file (not a
device or a pipe) and holds at most ``max_bytes`` (default: 8 bytes per pixel of the ``max_pixels``
setting, what an uncompressed 16-bit RGBA image of that size takes); it is read to its size at ``locate``.
With ``check_sizes`` (default) each image's header size, EXIF orientation applied, must be the declared
``width`` and ``height``, which its annotations are in: otherwise its read fails (`CorruptRecordError`).

**Options** (DALI's ``readers.coco`` names in brackets): ``box_format`` [``ltrb``],
``relative`` [``ratio``], ``skip_empty`` drops images left without objects after the other filters
[``skip_empty``], ``size_threshold`` drops objects whose clipped box is narrower or lower than it, in
pixels [``size_threshold``], ``image_ids`` keeps a subset [``image_ids``], ``include_crowd=False``
drops iscrowd objects [``skip_crowd``].

**Cache.** The JSON is parsed once into numpy arrays (segmentation packed as offsets into flat buffers),
saved as ``.npy`` files under ``$XDG_CACHE_HOME/ingest`` (``~/.cache/ingest``; never beside the JSON, whose
directory may be shared or read-only); ``cache=<dir>`` picks the place, ``cache=False`` turns it off. Later opens memory-map the arrays; a JSON of another size or mtime is parsed again. A pickled source
(sent to a worker process) carries its per-object targets and re-maps the cache; without a cache it
carries every parsed array.

**Repairs** (counted in `repairs`, one warning per open): boxes reaching outside their image are clipped
to it; boxes of zero width or height after clipping are dropped with their object (torchvision's detectors
reject them); polygon parts of fewer than 3 points are dropped (they cover no pixel); null ``iscrowd`` is 0;
null ``area`` is computed from the segmentation (pycocotools ``area``) or the box; a null ``bbox`` is the
segmentation's bounding box; null category names become the id. Metadata fields (info, licenses, urls,
supercategory) are not read, so nulls there do not matter.

**Errors.** A file that is not a COCO instances file, a duplicate image or category id, or an annotation
whose ``image_id`` is not an image raises at open. Errors inside one image's annotations (negative box
width or height, unknown ``category_id``, RLE whose size differs from the image or whose counts do not sum
to height x width, non-finite or odd-length polygons, numbers too large for a double, a missing image
size or one over 2**31 - 1, a ``file_name`` with a NUL or a lone surrogate) make that image's read raise
`CorruptRecordError` naming the JSON, the annotation's position and id, so the loader's failure budget
decides; `summary` counts them. With ``masks="masks"``, an object without segmentation, a polygon reaching
more than an image size outside its image (pycocotools' rasteriser allocates in proportion to the extent)
and masks of one image over `MAX_MASK_BYTES` or beyond the memory numpy can allocate fail the same way
(pycocotools decodes one mask at a time: it does not check its own allocations). Ids outside int64, a
``categories`` that is not a list or JSON nested past the recursion limit fail at open (`SourceError` or
`CorruptRecordError` naming the file).
"""

from __future__ import annotations

import inspect
import io
import json
import os
import stat
import struct
import warnings
from typing import Any, Iterable, Sequence

import numpy as np
from PIL import Image

from .. import defaults
from ..errors import ConfigError, CorruptRecordError, IngestError, OutsideRootError, SourceError
from ..io import read_error
from ._coco_index import (NO_SEG, POLYGONS, REPAIR_KEYS, RLE, is_number, load_cache, open_arrays, parse_instances,
                          parse_results, polygon_rle, short, unpack)
from ._native_table import NativeBoxes, NativeTable, NotNative
from .base import Field, Location, Record, check_index, parse_or_error
from .boxes import DEFAULT as DEFAULT_BOXES, box_format as check_box_format, convert as convert_boxes

try:  # a batch's JPEG frame headers in one call (setup.py builds it where a compiler is found), else Pillow's
    from . import _jpeg as NATIVE_HEADERS
except ImportError:
    NATIVE_HEADERS = None

#: Pixel masks of one image larger than this (objects x height x width bytes) fail it instead of allocating.
MAX_MASK_BYTES = 1 << 31
#: Largest category id usable as a label as it is (``contiguous_ids=False``): `classes` has one name per id.
MAX_CLASS_ID = 1 << 20
MASK_MODES = (None, "polygons", "masks")
#: Bytes per pixel an encoded image may take at the most (16-bit RGBA stored uncompressed), times the
#: ``max_pixels`` setting, is the default bound on an image file's size (`CocoSource` ``max_bytes``).
MAX_BYTES_PER_PIXEL = 8
#: What Pillow raises for a header it cannot read (its plugins raise more than OSError).
_PILLOW_ERRORS = (OSError, ValueError, SyntaxError, EOFError, TypeError, IndexError, KeyError, struct.error,
                  Image.DecompressionBombError)


class CocoSource:
    """One sample per image of a COCO instances file (see the module docstring for fields and options)."""

    streamed = False

    def __init__(self, annotations: str | os.PathLike, *, images: str | os.PathLike | None = None,
                 box_format: str = DEFAULT_BOXES, relative: bool = False, contiguous_ids: bool = True,
                 include_crowd: bool = True, masks: str | None = None, skip_empty: bool = False,
                 size_threshold: float = 0.0, image_ids: Iterable[int] | None = None, cache: Any = True,
                 allow_outside_root: bool = False, max_bytes: int | None = None, check_sizes: bool = True):
        path = os.fspath(annotations)
        self._setup(path, images, box_format, relative, contiguous_ids, include_crowd, masks, skip_empty,
                    size_threshold, image_ids, allow_outside_root=allow_outside_root, max_bytes=max_bytes,
                    check_sizes=check_sizes)
        self._paths = [path]
        arrays, self._stamp, self._cache = open_arrays(self._paths, cache, lambda: parse_instances(path))
        self._select(arrays)

    @classmethod
    def results(cls, results: str | os.PathLike, ground_truth: str | os.PathLike, **options: Any) -> "CocoSource":
        """A results file (a JSON list of detections, what ``COCO.loadRes`` reads) over the images and
        categories of its ``ground_truth`` instances file, filled in as pycocotools' ``loadRes`` does:
        bbox results get ``area = w * h`` and, without a segmentation, the box as a polygon; segm results
        (compressed RLE) get pycocotools' ``area`` and, without a bbox, ``toBbox``; keypoint results get the
        keypoints' extent as box and area. Every result is ``iscrowd = 0``; a ``scores`` field is added.
        ``options`` are the constructor's; ``images`` defaults to the ground truth's directory."""
        allowed = set(inspect.signature(cls.__init__).parameters) - {"self", "annotations"}
        if set(options) - allowed:
            raise ConfigError(f"Unknown option(s) {', '.join(sorted(set(options) - allowed))}. "
                              f"Available: {', '.join(sorted(allowed))}")
        self = cls.__new__(cls)
        path, gt = os.fspath(results), os.fspath(ground_truth)
        options.setdefault("images", os.path.dirname(os.path.abspath(gt)))
        self._setup(path, **options, scored=True)  # type: ignore[misc]
        self._paths = [path, gt]
        cache = options.get("cache", True)
        arrays, self._stamp, self._cache = open_arrays(self._paths, cache, lambda: parse_results(path, gt))
        self._select(arrays)
        return self

    def _setup(self, path: str, images: Any = None, box_format: str = DEFAULT_BOXES, relative: bool = False,
               contiguous_ids: bool = True, include_crowd: bool = True, masks: str | None = None,
               skip_empty: bool = False, size_threshold: float = 0.0, image_ids: Iterable[int] | None = None,
               cache: Any = True, scored: bool = False, allow_outside_root: bool = False,
               max_bytes: int | None = None, check_sizes: bool = True) -> None:
        box_format = check_box_format(box_format)
        if masks not in MASK_MODES:
            raise ConfigError(f"`masks` must be None, 'polygons' or 'masks'; got {masks!r}")
        if not is_number(size_threshold) or size_threshold < 0:
            raise ConfigError(f"`size_threshold` must be a number >= 0, got {size_threshold!r}")
        if max_bytes is None:
            max_bytes = MAX_BYTES_PER_PIXEL * defaults.get("max_pixels")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ConfigError(f"`max_bytes` must be an int >= 1, got {max_bytes!r}")
        self.path = path
        self.root = os.fspath(images) if images is not None else os.path.dirname(os.path.abspath(path))
        self._root_given = images is not None
        self.allow_outside_root, self.check_sizes = bool(allow_outside_root), bool(check_sizes)
        self.max_bytes = max_bytes
        self._real_dirs: dict[str, str] = {}
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
        self._errors = {int(j): unpack(a["err_msg"], a["err_msg_end"], e)
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
        boxes = convert_boxes(ltrb, "xyxy", self.box_format)
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
        """The whole image file, after the checks of `_image_file`."""
        path, size = self._image_file(i)
        return Location(path, 0, size)

    def name(self, i: int) -> str:
        path = self._joined(int(self._img[check_index(i, len(self._img))]))
        try:
            os.fsencode(path)
        except UnicodeEncodeError:   # printable in messages: a lone surrogate is no file name
            return path.encode("utf-8", "backslashreplace").decode("utf-8")
        return path

    def _joined(self, j: int) -> str:
        return os.path.join(self.root, unpack(self._a["img_file"], self._a["img_file_end"], j))

    def _image_file(self, i: int) -> tuple[str, int]:
        """Path and size of sample ``i``'s image file. Refused: a ``file_name`` that cannot name a file (a NUL,
        a lone surrogate: CorruptRecordError), one leading outside the images root (absolute, ``..`` or a link
        to elsewhere: OutsideRootError, unless ``allow_outside_root``), anything but a regular file and a file
        over ``max_bytes`` (SourceError)."""
        j = int(self._img[check_index(i, len(self._img))])
        image = f"image id {int(self._a['img_id'][j])}"
        name = unpack(self._a["img_file"], self._a["img_file_end"], j)
        path = os.path.join(self.root, name)
        try:
            if "\0" in name:
                raise ValueError("it holds a NUL character")
            os.fsencode(path)
        except (ValueError, UnicodeEncodeError) as err:
            reason = "it is not valid Unicode" if isinstance(err, UnicodeEncodeError) else err
            raise CorruptRecordError(f"{image}: file_name {short(name)} cannot name a file: {reason}",
                                     path=self.path, index=i) from None
        try:
            if self.allow_outside_root:
                st = os.stat(path)
            else:   # the directory resolved (once per directory), then the file itself: one lstat if no link
                real = self._real_dir(os.path.dirname(path))
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    real, st = os.path.realpath(path), os.stat(path)
                root = self._real_dir(self.root)
                if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
                    raise OutsideRootError(f"{self.path}: {image}: file_name {short(name)} leads outside the "
                                           f"images root {self.root} (to {real}); pass allow_outside_root=True "
                                           "to read it", path=path)
        except FileNotFoundError as err:
            raise SourceError(f"{path}: cannot read: {err.strerror or err}; {self._where_images()}",
                              path=path) from err
        except OSError as err:
            raise read_error(Location(path), err) from err
        if not stat.S_ISREG(st.st_mode):
            raise SourceError(f"{path}: {image} is not a regular file", path=path)
        if st.st_size > self.max_bytes:
            raise SourceError(f"{path}: {image} is {st.st_size} bytes, over `max_bytes` {self.max_bytes}",
                              path=path)
        return path, st.st_size

    # -- the native engine (`ingest.native`): the files as a table, the boxes and fields as arrays ------------
    def native_table(self) -> NativeTable:
        """Every image file as a "whole" table (labels -1). A sample the engine must leave to the Python reader is
        marked in ``python``: one whose annotations are invalid or whose file the checks of `_image_file` refuse
        (a name leaving the root, a link leading outside it, a missing file, a non-regular or too large one: the
        reader names the problem); a link inside the root is read where it leads. Raises `NotNative` for masks or polygons (the engine moves boxes
        only) and for relative boxes without ``check_sizes`` (they scale by the probed size)."""
        if self.masks is not None:
            raise NotNative(f"masks={self.masks!r}: the engine moves boxes and their fields, not masks or polygons")
        if self.relative and not self.check_sizes:
            raise NotNative("relative boxes with check_sizes=False scale by each image's probed size")
        n = len(self._img)
        paths = [self._joined(int(j)) for j in self._img.tolist()]
        sizes = np.full(n, -1, np.int64)
        python = np.zeros(n, np.uint8)
        root = self._real_dir(self.root).rstrip(os.sep) + os.sep
        for i, path in enumerate(paths):
            j = int(self._img[i])
            name = unpack(self._a["img_file"], self._a["img_file_end"], j)
            if j in self._errors or "\0" in name or os.path.isabs(name) or ".." in name.split("/"):
                python[i] = 1
                continue
            try:
                os.fsencode(path)
                st = os.lstat(path)
                real = self._real_dir(os.path.dirname(path)).rstrip(os.sep) + os.sep
                if stat.S_ISLNK(st.st_mode):   # read where it leads, checked as the reader checks it
                    paths[i] = os.path.realpath(path)
                    st, real = os.stat(paths[i]), paths[i]
            except (OSError, UnicodeEncodeError):
                python[i] = 1
                continue
            inside = self.allow_outside_root or real.startswith(root)
            if not stat.S_ISREG(st.st_mode) or st.st_size > self.max_bytes or not inside:
                python[i] = 1
                continue
            sizes[i] = st.st_size
        safe = [p if not python[i] else os.devnull for i, p in enumerate(paths)]   # (not read: left to Python)
        return NativeTable(safe, np.arange(n, dtype=np.int64), np.zeros(n, np.int64), sizes,
                           np.full(n, -1, np.int64), "whole", python=python)

    def native_boxes(self) -> NativeBoxes:
        """The samples' boxes (as the records hold them: `box_format`, relative or not) and fields as arrays:
        per box ``categories``, ``iscrowd``, ``area`` (and ``scores``), per sample ``image_id``, and the declared
        image sizes the boxes are in (None without ``check_sizes``: nothing to check them against)."""
        per_box = {"categories": self._cats.astype(np.int64), "iscrowd": self._crowd, "area": self._area}
        if self._score is not None:
            per_box["scores"] = np.asarray(self._score, np.float32)
        declared = None
        if self.check_sizes:
            declared = np.stack([np.asarray(self._a["img_h"])[self._img],
                                 np.asarray(self._a["img_w"])[self._img]], 1).astype(np.int64)
        return NativeBoxes(self._boxes, self._start.astype(np.int64), per_box,
                           {"image_id": self.image_ids.astype(np.int64)}, declared)

    def _where_images(self) -> str:
        """What a missing image file's message adds: the images root used and the option that sets it."""
        whence = "as given" if self._root_given else "the annotation file's directory, the default"
        return (f"images are looked up under {self.root} ({whence}); pass the directory holding them as the "
                "`images` option (reader_options={'images': DIR}; ingest -s images=DIR)")

    @property
    def unread(self) -> dict[str, str]:
        """What the annotations hold that no field reads, with how to read it: the objects' segmentation
        without ``masks`` (`ingest convert` refuses to leave it out unless told to, ``--drop segmentation``)."""
        seg = self._a.get("seg_kind") if isinstance(self._a, dict) else None
        if self.masks is None and seg is not None and bool((np.asarray(seg) != NO_SEG).any()):
            return {"segmentation": "the objects' polygons and RLE masks, read with masks='polygons' "
                                    "(-s masks=polygons) or masks='masks'"}
        return {}

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
        if self.check_sizes:
            self._check_size(i, j, raw)
        lo, hi = int(self._start[i]), int(self._start[i + 1])
        # Copies: a record's arrays belong to its user, who may change them in place.
        fields: dict[str, Any] = {"image_id": int(self._a["img_id"][j]), "boxes": self._boxes[lo:hi].copy(),
                                  "categories": self._cats[lo:hi].copy(), "iscrowd": self._crowd[lo:hi].copy(),
                                  "area": self._area[lo:hi].copy()}
        self._add_segmentation(fields, i, j, np.arange(lo, hi))
        if self._score is not None:
            fields["scores"] = self._score[lo:hi].copy()
        return Record(raw, -1, fields)

    def parse_batch(self, indices: Sequence[int], raws: Sequence[Any]) -> list[Any]:
        """`parse` of a batch (`ingest.formats.base.parse_each`: per sample a `Record` or the error parsing it
        raised), in a few array operations: the size check reads every JPEG's frame header in one native call
        (``_jpeg``, the decoders' own header scan) and each field's values of the whole batch are gathered in
        one copy, a record's arrays being slices of it (masks and polygons are made sample by sample, as `parse`
        makes them). A sample that needs more goes through `parse`, which gives it the same value or error: an
        index out of range, an image whose annotations are invalid, and, for the size check, a header the scan
        does not settle alone (not a JPEG, an EXIF or XMP orientation other than 1, or a size other than the
        declared one: Pillow reads it again)."""
        n = len(indices)
        try:
            idx = np.asarray(indices).astype(np.int64, casting="safe").reshape(n)
        except (TypeError, ValueError, OverflowError):   # not all integers: `parse` says what is wrong
            idx = np.full(n, -1 - len(self._img), dtype=np.int64)
        count = len(self._img)
        idx[idx < 0] += count
        fast = (idx >= 0) & (idx < count)
        j = self._img[np.where(fast, idx, 0)]
        if self._errors:
            fast &= ~np.isin(j, np.fromiter(self._errors, np.int64, len(self._errors)))
        if self.check_sizes and fast.any():
            fast &= self._sizes_agree(j, raws)
        out: list[Any] = [None] * n
        for k in np.flatnonzero(~fast).tolist():
            out[k] = parse_or_error(self, indices[k], raws[k])
        rows = np.flatnonzero(fast)
        if not len(rows):
            return out
        lo, hi = self._start[idx[rows]], self._start[idx[rows] + 1]
        counts = hi - lo
        bounds = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(counts, out=bounds[1:])
        take = np.arange(bounds[-1]) + np.repeat(lo - bounds[:-1], counts)   # the objects of every sample, in order
        edges = bounds.tolist()
        spans = list(zip(edges, edges[1:]))
        boxes, cats, crowd, area = self._boxes[take], self._cats[take], self._crowd[take], self._area[take]
        scores = self._score[take] if self._score is not None else None
        ids = np.asarray(self._a["img_id"])[j[rows]].tolist()
        for k, image_id, (a, b) in zip(rows.tolist(), ids, spans):
            fields = {"image_id": image_id, "boxes": boxes[a:b], "categories": cats[a:b], "iscrowd": crowd[a:b],
                      "area": area[a:b]}
            if self.masks is not None:
                try:
                    self._add_segmentation(fields, int(idx[k]), int(j[k]), take[a:b])
                except (IngestError, ValueError) as err:
                    out[k] = err
                    continue
            if scores is not None:
                fields["scores"] = scores[a:b]
            out[k] = Record(raws[k], -1, fields)
        return out

    def _add_segmentation(self, fields: dict[str, Any], i: int, j: int, objects: np.ndarray) -> None:
        """Sample ``i``'s (image ``j``'s) masks or polygons into ``fields``, from its ``objects`` (rows of the kept
        objects' arrays)."""
        if self.masks == "masks":
            fields["masks"] = self._pixel_masks(i, j, self._ann[objects])
        elif self.masks == "polygons":
            fields["polygons"] = self._polygons(j, self._ann[objects])

    def _sizes_agree(self, j: np.ndarray, raws: Sequence[Any]) -> np.ndarray:
        """Per sample, whether its bytes are a JPEG whose frame header is its image's declared width and height
        with no orientation to apply (False where that is unknown: no native scan, another format, a turned
        image, a header the scan refuses)."""
        if NATIVE_HEADERS is None:
            return np.zeros(len(j), dtype=bool)
        table = np.zeros((len(j), 9), dtype=np.int64)
        try:
            NATIVE_HEADERS.headers(raws, table)
        except (TypeError, ValueError, BufferError):   # a buffer the scan does not take: Pillow reads them all
            return np.zeros(len(j), dtype=bool)
        kind, h, w, orientation = table[:, 0], table[:, 1], table[:, 2], table[:, 6]
        return ((kind == 1) & (orientation == 1) & (h == np.asarray(self._a["img_h"])[j])
                & (w == np.asarray(self._a["img_w"])[j]))

    def _real_dir(self, directory: str) -> str:
        """``os.path.realpath(directory)``, remembered (a few directories hold a dataset's images)."""
        real = self._real_dirs.get(directory)
        if real is None:
            if len(self._real_dirs) >= 4096:
                self._real_dirs.clear()
            real = self._real_dirs[directory] = os.path.realpath(directory)
        return real

    def _check_size(self, i: int, j: int, raw: Any) -> None:
        """CorruptRecordError when the image's size (from its header, EXIF orientation applied) is not the
        declared width and height, which its boxes, polygons and masks are in. An image whose header Pillow
        cannot read is left to the decoder to refuse."""
        try:
            with Image.open(io.BytesIO(memoryview(raw).cast("B"))) as img:
                w, h = img.size
                if img.getexif().get(0x0112, 1) in (5, 6, 7, 8):   # turned a quarter: displayed sideways
                    w, h = h, w
        except _PILLOW_ERRORS:   # a header Pillow refuses is the decoder's to report
            return
        dw, dh = int(self._a["img_w"][j]), int(self._a["img_h"][j])
        if (w, h) != (dw, dh):
            raise CorruptRecordError(f"image id {int(self._a['img_id'][j])} ({self.name(i)}) declares width x "
                                     f"height {dw} x {dh}, but the image is {w} x {h} (EXIF orientation applied); "
                                     "its annotations are in the declared frame", path=self.path, index=i)

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
                rles.append(self._rle(ann, h, w) if kind == RLE else polygon_rle(self._parts(ann), h, w))
            except ValueError as err:
                raise CorruptRecordError(f"annotation id {int(self._a['ann_id'][ann])}: {err}", path=self.path,
                                         index=i) from None
        try:   # numpy allocates the whole batch (MemoryError if it cannot); pycocotools one mask at a time
            out = np.empty((len(rles), h, w), dtype=np.uint8)
        except MemoryError:
            raise CorruptRecordError(f"{len(rles)} masks of {h}x{w} do not fit in memory", path=self.path,
                                     index=i) from None
        for k, rle in enumerate(rles):   # pycocotools does not check its allocations: one h x w at a time
            out[k] = mask_utils.decode([rle])[:, :, 0]
        return out

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
        state["_real_dirs"] = {}   # resolved again where it is unpickled
        if self._cache is not None:
            state["_a"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._a is None:
            self._a = load_cache(self._cache, self._stamp)
            if self._a is None:
                raise SourceError(f"the annotation cache {self._cache!r} of {self.path} changed or vanished "
                                  "since the source was opened; open it again", path=self.path)
