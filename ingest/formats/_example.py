"""``tf.train.Example`` features <-> the fields of a sample (`ingest.formats.base.Field`): the feature
spec a `TFRecordSource` takes, its inference from a first record, the extraction of every field from a
record (errors name file, offset and key) and the encoding `TFRecordWriter` uses. The rules are stated in
`ingest.formats.tfrecord`'s docstring.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from google.protobuf.message import DecodeError as ProtoDecodeError

from ..errors import ConfigError, CorruptRecordError
from . import _protos
from ._images import image_type, mask_bytes
from .base import Field, Record, parse_dtype
from .boxes import convert

#: Keys tried in order for the image of a record without a spec (TF-slim / Inception / Object Detection API,
#: TFDS-style and common hand-written layouts).
IMAGE_KEYS = ("image/encoded", "image", "image_raw", "image/raw", "img", "encoded", "jpeg", "jpg", "png",
              "image_bytes")
#: Keys tried in order for the class label.
LABEL_KEYS = ("image/class/label", "label", "image/label", "class", "cls", "target", "labels")
#: Feature keys `TFRecordWriter` uses for the two special fields (others: the field name).
WRITE_KEYS = {"image": "image/encoded", "label": "image/class/label"}
_PIXELS_KEY = "image/raw"
#: The TensorFlow Object Detection API layout of a detection sample: the per-object coordinates, normalized
#: to [0, 1] by ``image/width`` and ``image/height``, in the order of an ltrb box.
OD_BOX_KEYS = ("image/object/bbox/xmin", "image/object/bbox/ymin", "image/object/bbox/xmax", "image/object/bbox/ymax")
OD_SIZE_KEYS = ("image/height", "image/width")
#: The spec key of the 'boxes' field read from (written to) `OD_BOX_KEYS` and `OD_SIZE_KEYS`.
OD_BOXES = "image/object/bbox"
#: The image id: a decimal string, as the OD API's ``create_coco_tf_record`` writes it.
OD_SOURCE_ID = "image/source_id"
OD_CLASS_TEXT = "image/object/class/text"
#: Detection fields -> their OD API keys (the names `CocoSource` gives its fields).
#: DeepLab's segmentation layout (``build_voc2012_data.py``, ``build_ade20k_data.py``, ...): the label map, a
#: PNG, beside ``image/encoded``; read as the field `SEGMENTATION` of kind ``mask``.
SEGMENTATION_KEY = "image/segmentation/class/encoded"
SEGMENTATION = "mask"
OD_KEYS = {"boxes": OD_BOXES, "categories": "image/object/class/label", "iscrowd": "image/object/is_crowd",
           "area": "image/object/area", "image_id": OD_SOURCE_ID}
_LIST = {"image": "bytes_list", "mask": "bytes_list", "pixels": "bytes_list", "text": "bytes_list",
         "bytes": "bytes_list", "int": "int64_list", "ints": "int64_list", "float": "float_list", "floats": "float_list"}


def normalize_spec(features: Mapping[str, Any], first: Any) -> dict[str, tuple[str, Field]]:
    """``{field name: (feature key, Field)}`` from a user spec; ``first`` (the first record's feature map,
    or None) gives the kind of a bare key. A spec is a key, a Field, or a pair (key, kind or Field) given as a
    tuple or as a two-item list (JSON's form); anything else is a ConfigError naming the field."""
    if not isinstance(features, Mapping) or not features:
        raise ConfigError(f"`features` must be a non-empty mapping of field name -> feature spec, got {features!r}")
    spec = {}
    for name, value in features.items():
        if isinstance(value, Field):
            key, field = name, value
        elif isinstance(value, str):
            key, field = value, _default_field(name, value, first)
        elif (isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], str)
              and isinstance(value[1], (str, Field))):   # a list: JSON's form of (key, kind), as the CLI's -s gives
            key, field = value[0], value[1] if isinstance(value[1], Field) else _field(name, value[1])
        else:
            raise ConfigError(f"feature spec of {name!r} must be a key, (key, kind) (a tuple or a two-item list: "
                              f"[\"image/encoded\", \"image\"]), (key, Field) or a Field, got {value!r}")
        if name == "image" and field.kind not in ("image", "pixels"):
            raise ConfigError(f"the 'image' field must be of kind image or pixels, got {field.kind!r}")
        if name == "label" and field.kind != "int":
            raise ConfigError(f"the 'label' field must be of kind int, got {field.kind!r}")
        spec[name] = (key, field)
    return spec


def _field(name: str, kind: Any) -> Field:
    try:
        return Field(kind)
    except ValueError as err:
        raise ConfigError(f"feature spec of {name!r}: {err}") from None


def _default_field(name: str, key: str, first: Any) -> Field:
    if name == "image":
        return Field("image")
    if name == "label":
        return Field("int")
    kind = first[key].WhichOneof("kind") if first is not None and key in first else None
    if kind is None:
        raise ConfigError(f"cannot tell the kind of feature {key!r} from the first record; give (key, kind)")
    return Field({"int64_list": "ints", "float_list": "floats", "bytes_list": "bytes"}[kind])


def infer_spec(first: Any) -> dict[str, tuple[str, Field]]:
    """The fields of a record without a spec (see the module docstring)."""
    kinds = {key: first[key].WhichOneof("kind") for key in first}

    def one(key):
        return kinds[key] is not None and len(getattr(first[key], kinds[key]).value) == 1

    spec: dict[str, tuple[str, Field]] = {}
    shaped = {k for k in kinds if kinds[k] == "bytes_list" and kinds.get(k + "/shape") == "int64_list" and one(k)}
    for key in IMAGE_KEYS:
        if kinds.get(key) == "bytes_list" and one(key):
            if key in shaped and key + "/dtype" not in kinds:
                spec["image"] = (key, Field("pixels"))
                break
            if image_type(first[key].bytes_list.value[0]) is not None:
                spec["image"] = (key, Field("image"))
                break
    for key in LABEL_KEYS:
        if kinds.get(key) == "int64_list" and one(key):
            spec["label"] = (key, Field("int"))
            break
    spec.update(_infer_detection(kinds, first))
    if kinds.get(SEGMENTATION_KEY) == "bytes_list" and one(SEGMENTATION_KEY) and SEGMENTATION not in spec:
        spec[SEGMENTATION] = (SEGMENTATION_KEY, Field("mask"))
    taken = {key for key, _ in spec.values()}
    if "boxes" in spec:
        taken |= set(OD_BOX_KEYS) | set(OD_SIZE_KEYS)
    siblings = {k + suffix for k in shaped for suffix in ("/shape", "/dtype")}
    for key, kind in sorted(kinds.items()):
        if key in taken or key in siblings:
            continue
        if kind == "int64_list":
            spec[key] = (key, Field("ints"))
        elif kind == "float_list":
            spec[key] = (key, Field("floats"))
        elif key in shaped:
            spec[key] = (key, Field("array" if key + "/dtype" in kinds else "pixels"))
        elif kind == "bytes_list" and one(key) and not key.startswith(OD_OBJECT) and key not in _derived(spec):
            spec[key] = (key, Field("bytes"))   # one string per record, as far as the first record tells
    return spec


#: The prefix of the Object Detection API's per-object features (lists of one value per object).
OD_OBJECT = "image/object/"


def _derived(spec: Mapping[str, tuple[str, Field]]) -> set[str]:
    """Feature keys `TFRecordWriter` derives from the fields of ``spec`` (the encoded image's format, the OD
    boxes' coordinates and image size, arrays' shapes and dtypes): read back through those fields."""
    keys = {key for key, _ in spec.values()}
    out = {suffixed for key in keys for suffixed in (key + "/shape", key + "/dtype")}
    if WRITE_KEYS["image"] in keys:
        out.add("image/format")
    if OD_BOXES in keys:
        out |= set(OD_BOX_KEYS) | set(OD_SIZE_KEYS)
    return out


def unread_keys(first: Any, spec: Mapping[str, tuple[str, Field]]) -> dict[str, str]:
    """The feature keys of the first record that ``spec`` does not read (nor derive), each with its list type:
    what a conversion of the records would leave out."""
    taken = {key for key, _ in spec.values()} | _derived(spec)
    return {key: first[key].WhichOneof("kind") or "empty list" for key in sorted(first) if key not in taken}


def _infer_detection(kinds: Mapping[str, str], first: Any) -> dict[str, tuple[str, Field]]:
    """The detection fields of a record in the Object Detection API layout (none without ``bbox/xmin``):
    boxes, categories, iscrowd and area where their keys are present, image_id where ``image/source_id``
    holds a decimal id (some writers put a file name there)."""
    def holds(key: str, list_kind: str) -> bool:   # an image without objects may hold empty, untyped lists
        return key in kinds and kinds[key] in (list_kind, None)

    if not all(holds(k, "float_list") for k in OD_BOX_KEYS) or any(kinds.get(k) != "int64_list" for k in OD_SIZE_KEYS):
        return {}
    spec = {"boxes": (OD_BOXES, Field("array", dtype="float32"))}
    for name, kind, list_kind in (("categories", "ints", "int64_list"), ("iscrowd", "ints", "int64_list"),
                                  ("area", "floats", "float_list")):
        if holds(OD_KEYS[name], list_kind):
            spec[name] = (OD_KEYS[name], Field(kind))
    ids = first[OD_SOURCE_ID].bytes_list.value if kinds.get(OD_SOURCE_ID) == "bytes_list" else ()
    if len(ids) == 1 and bytes(ids[0]).isdigit():
        spec["image_id"] = (OD_SOURCE_ID, Field("int"))
    return spec


class Extract:
    """Reads the declared fields out of one record's feature map; errors name path, sample, offset, key."""

    def __init__(self, fmap: Any, path: str, index: Any, offset: int):
        self.fmap, self.path, self.index, self.offset = fmap, path, index, offset

    def error(self, key: str, msg: str) -> CorruptRecordError:
        return CorruptRecordError(f"feature {key!r}: {msg}", path=self.path, index=self.index, offset=self.offset)

    def values(self, key: str, want: str | None) -> tuple[str, Any]:
        if key not in self.fmap:
            raise self.error(key, "missing")
        feat = self.fmap[key]
        kind = feat.WhichOneof("kind")
        if kind is None:  # a Feature with no list set: empty, of whatever type was asked (as TensorFlow reads it)
            return want or "bytes_list", ()
        if want is not None and kind != want:
            raise self.error(key, f"holds a {kind}, expected a {want}")
        return kind, getattr(feat, kind).value

    def single(self, key: str, want: str) -> Any:
        _, vals = self.values(key, want)
        if len(vals) != 1:
            raise self.error(key, f"holds {len(vals)} values, expected exactly 1")
        return vals[0]

    def shape(self, key: str, field: Field, count: int) -> tuple[int, ...]:
        if field.shape is not None:
            shape = tuple(field.shape)
        elif key + "/shape" in self.fmap:
            shape = tuple(int(d) for d in self.values(key + "/shape", "int64_list")[1])
        else:
            shape = (count,)
        if any(d < 0 for d in shape) or int(np.prod(shape, dtype=np.int64)) != count:
            raise self.error(key, f"{count} values do not fill shape {shape}")
        return shape

    def dtype(self, key: str, field: Field) -> np.dtype:
        name = field.dtype
        if name is None and key + "/dtype" in self.fmap:
            name = bytes(self.single(key + "/dtype", "bytes_list")).decode("ascii", "replace")
        try:
            dtype = parse_dtype(name or "uint8")
        except ValueError as err:
            raise self.error(key, f"unknown dtype {name!r}") from err
        if dtype.hasobject or dtype.itemsize == 0:
            raise self.error(key, f"dtype {name!r} cannot hold array data")
        return dtype.newbyteorder("<")

    def get(self, key: str, field: Field) -> Any:
        kind = field.kind
        if key == OD_BOXES:
            return self.od_boxes()
        if key == OD_SOURCE_ID and kind == "int":
            text = bytes(self.single(key, "bytes_list"))
            if not text.isdigit():
                raise self.error(key, f"{text[:40]!r} is not an integer image id")
            return int(text)
        if kind in ("image", "bytes", "mask"):
            value = bytes(self.single(key, "bytes_list"))
            if kind in ("image", "mask") and not value:
                raise self.error(key, f"empty {kind}")
            return value
        if kind == "text":
            try:
                return bytes(self.single(key, "bytes_list")).decode("utf-8")
            except UnicodeDecodeError as err:
                raise self.error(key, f"not UTF-8 text ({err.reason})") from None
        if kind == "int":
            return int(self.single(key, "int64_list"))
        if kind == "float":
            return float(self.single(key, "float_list"))
        if kind in ("ints", "floats"):
            arr = np.array(self.values(key, _LIST[kind])[1], dtype=np.int64 if kind == "ints" else np.float32)
            if field.shape is not None and arr.shape != tuple(field.shape):
                raise self.error(key, f"holds {arr.size} values, expected {field.shape[0]}")
            return arr
        return self.array(key, field)

    def od_boxes(self) -> np.ndarray:
        """``[N, 4]`` float32 ltrb boxes in pixels from the normalized OD API coordinates."""
        coords = [np.asarray(self.values(k, "float_list")[1], dtype=np.float64) for k in OD_BOX_KEYS]
        if len({len(c) for c in coords}) != 1:
            raise self.error(OD_BOXES, f"coordinate lists of different lengths {[len(c) for c in coords]}")
        height, width = (int(self.single(k, "int64_list")) for k in OD_SIZE_KEYS)
        if height <= 0 or width <= 0:
            raise self.error("image/height", f"image size {height}x{width} cannot scale normalized boxes")
        return (np.stack(coords, axis=1).reshape(-1, 4) * (width, height, width, height)).astype(np.float32)

    def array(self, key: str, field: Field) -> np.ndarray:
        if field.kind == "pixels" or self.values(key, None)[0] == "bytes_list":
            dtype = np.dtype(np.uint8) if field.kind == "pixels" else self.dtype(key, field)
            buf = bytearray(self.single(key, "bytes_list"))  # a writable copy: batches wrap it in tensors
            if len(buf) % dtype.itemsize:
                raise self.error(key, f"{len(buf)} bytes are not a whole number of {dtype.name} items")
            arr = np.frombuffer(buf, dtype=dtype)
        else:
            kind, vals = self.values(key, None)
            arr = np.array(vals, dtype=np.int64 if kind == "int64_list" else np.float32)
            if field.dtype is not None:
                arr = arr.astype(field.dtype)
        shape = self.shape(key, field, arr.size)
        try:
            arr = arr.reshape(shape)
        except ValueError as err:
            raise self.error(key, f"{arr.size} values do not fill shape {shape}") from err
        if field.kind == "pixels" and arr.ndim != 3:
            raise self.error(key, f"pixels must have shape (H, W, C), got {arr.shape}")
        return arr


def parse_features(data: Any, path: str, index: Any, offset: int) -> Any:
    try:
        return _protos.Example.FromString(data).features.feature
    except ProtoDecodeError as err:
        raise CorruptRecordError(f"not a tf.train.Example: {err}", path=path, index=index, offset=offset) from None


#: Kinds read as one value of a list, without `Extract`'s checks when the feature holds exactly one value.
_ONE_VALUE = {"image": "bytes_list", "mask": "bytes_list", "bytes": "bytes_list", "int": "int64_list",
              "float": "float_list"}


def field_value(fmap: Any, key: str, field: Field, path: str, index: Any, offset: int) -> Any:
    """The value of ``field`` (feature ``key``) in a record's feature map; errors name path, sample, offset
    and key. The common well-formed one-value feature (a non-empty image, bytes, an int or a float: exactly
    one value in the list of its kind) is read directly: a oneof holds one list at most, so one value in the
    list asked for also proves the feature's type. Every other case takes `Extract`'s path, which reads it
    or names the problem."""
    kind = field.kind
    if kind in _ONE_VALUE:
        feat = fmap.get(key)
        if feat is not None:
            vals = getattr(feat, _ONE_VALUE[kind]).value
            if len(vals) == 1:
                value = vals[0]
                if value or kind not in ("image", "mask"):
                    return value
    return Extract(fmap, path, index, offset).get(key, field)


def to_record(fmap: Any, spec: Mapping[str, tuple[str, Field]], path: str, index: Any, offset: int) -> Record:
    values = {name: field_value(fmap, key, field, path, index, offset) for name, (key, field) in spec.items()}
    return Record(values.pop("image", None), values.pop("label", -1), values)


def writer_spec(fields: Mapping[str, Field], keys: Mapping[str, str] | None = None) -> dict[str, tuple[str, Field]]:
    """The feature keys `TFRecordWriter` uses for ``fields`` (``keys`` overriding the defaults), as the
    ``features`` spec that reads its shards back with every field of its declared kind."""
    keys = dict(keys or {})
    unknown = set(keys) - set(fields)
    if unknown:
        raise ConfigError(f"`keys` names fields that are not declared: {sorted(unknown)}")

    detection = "boxes" in fields and fields["boxes"].kind == "array" and "image" in fields

    def default(name: str, field: Field) -> str:
        if name == "image" and field.kind == "pixels":
            return _PIXELS_KEY
        if detection and name in OD_KEYS:
            return OD_KEYS[name]
        if name == SEGMENTATION and field.kind == "mask":
            return SEGMENTATION_KEY
        return WRITE_KEYS.get(name, name)

    return {name: (keys.get(name) or default(name, field), field) for name, field in fields.items()}


def put(fmap: Any, key: str, field: Field, value: Any) -> None:
    """Set feature ``key`` of feature map ``fmap`` to ``value`` of kind ``field.kind`` (see `TFRecordWriter`)."""
    kind = field.kind
    if value is None:
        raise ConfigError(f"field for key {key!r} is None")
    if key == OD_SOURCE_ID and kind == "int":
        fmap[key].bytes_list.value.append(str(int(value)).encode("ascii"))
    elif kind in ("image", "bytes"):
        fmap[key].bytes_list.value.append(bytes(value))
    elif kind == "mask":
        fmap[key].bytes_list.value.append(mask_bytes(value))
    elif kind == "text":
        fmap[key].bytes_list.value.append(str(value).encode("utf-8"))
    elif kind in ("int", "ints"):
        fmap[key].int64_list.value.extend(np.atleast_1d(np.asarray(value, dtype=np.int64)).tolist())
    elif kind in ("float", "floats"):
        fmap[key].float_list.value.extend(np.atleast_1d(np.asarray(value, dtype=np.float32)).tolist())
    else:  # pixels / array: raw little-endian bytes + shape (+ dtype)
        arr = np.asarray(value, dtype=np.uint8 if kind == "pixels" else None)
        if arr.dtype.hasobject:
            raise ConfigError(f"field for key {key!r}: cannot write an array of Python objects")
        arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        fmap[key].bytes_list.value.append(arr.tobytes())
        fmap[key + "/shape"].int64_list.value.extend(arr.shape)
        if kind == "array":
            fmap[key + "/dtype"].bytes_list.value.append(arr.dtype.name.encode("ascii"))


def put_boxes(fmap: Any, boxes: Any, size: tuple[int, int], box_format: str, relative: bool) -> None:
    """Set the OD API box features of ``boxes`` ([N, 4], in ``box_format`` of `ingest.formats.boxes`, in pixels
    or, ``relative``, divided by the image's width and height) for an image of ``size`` (height, width)."""
    b = np.array(boxes, dtype=np.float64)
    if b.size % 4 or (b.ndim != 2 and b.size):
        raise ConfigError(f"boxes must have shape [N, 4], got {b.shape}")
    b = convert(b, box_format, "xyxy")
    height, width = size
    if not relative:
        b /= (width, height, width, height)
    for k, key in enumerate(OD_BOX_KEYS):
        fmap[key].float_list.value.extend(b[:, k].tolist())
    fmap["image/height"].int64_list.value.append(height)
    fmap["image/width"].int64_list.value.append(width)
