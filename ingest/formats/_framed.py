"""The framed record: one sample's declared fields in one byte string (the value format of ingest's LMDB
layout, `ingest.formats.lmdb`). Version 1::

    record := b"IGR1" field*                    one field per declared field, in declaration order
    field  := kind:u8 length:u64 payload        little-endian; kind codes in `KIND_CODES`

Payloads by kind: ``image``/``bytes`` as they are; ``text`` UTF-8; ``int`` int64; ``float`` float64;
``ints`` int64 x L; ``floats`` float32 x L; ``pixels``/``array``: dtype string length u8, numpy dtype string
(e.g. ``|u1``, ``<f4``), ndim u8, ndim x u64 dimensions, then the C-order data. Decoding checks the magic,
every kind against the declaration, every length against what is left, array sizes against their shapes, and
that nothing trails: anything else is a `CorruptRecordError` naming the key.
"""

from __future__ import annotations

import struct
from typing import Any, Mapping

import numpy as np

from ..errors import CorruptRecordError
from ._images import mask_bytes
from .base import Field, Record, parse_dtype

MAGIC = b"IGR1"
KIND_CODES = {"image": 1, "pixels": 2, "int": 3, "float": 4, "ints": 5, "floats": 6, "text": 7, "bytes": 8,
              "array": 9, "mask": 10}
_HEAD = struct.Struct("<BQ")
_INT = struct.Struct("<q")
_LIST_DTYPES = {"ints": "<i8", "floats": "<f4"}


def _array_payload(value: Any) -> bytes:
    a = np.ascontiguousarray(value)
    if a.dtype.kind not in "biufc" or a.ndim > 255:
        raise ValueError(f"arrays of dtype {a.dtype} / {a.ndim} dimensions cannot be stored")
    dtype = a.dtype.str.encode()
    return (struct.pack("<B", len(dtype)) + dtype + struct.pack(f"<B{a.ndim}Q", a.ndim, *a.shape)
            + a.tobytes())


def _payload(kind: str, value: Any) -> bytes:
    if kind in ("image", "bytes"):
        return bytes(memoryview(value).cast("B"))
    if kind == "mask":
        return mask_bytes(value)
    if kind == "text":
        return str(value).encode("utf-8")
    if kind == "int":
        return struct.pack("<q", int(value))
    if kind == "float":
        return struct.pack("<d", float(value))
    if kind in _LIST_DTYPES:
        return np.asarray(value, dtype=_LIST_DTYPES[kind]).reshape(-1).tobytes()
    return _array_payload(np.asarray(value, dtype=np.uint8) if kind == "pixels" else value)


def encode(record: Record, fields: Mapping[str, Field]) -> bytes:
    """The framed bytes of ``record``'s declared ``fields``."""
    parts = [MAGIC]
    for name, field in fields.items():
        data = _payload(field.kind, record.get(name))
        parts += [_HEAD.pack(KIND_CODES[field.kind], len(data)), data]
    return b"".join(parts)


def _array(view: memoryview, bad) -> np.ndarray:
    if len(view) < 2:
        raise bad("array header is truncated")
    n = view[0]
    if len(view) < 2 + n:
        raise bad("array header is truncated")
    try:
        dtype = parse_dtype(bytes(view[1:1 + n]).decode("ascii"))
    except ValueError as err:   # UnicodeDecodeError is one
        raise bad(f"bad array dtype: {err}") from err
    if dtype.kind not in "biufc":
        raise bad(f"array dtype {dtype} is not numeric")
    ndim = view[1 + n]
    at = 2 + n
    if len(view) < at + 8 * ndim:
        raise bad("array shape is truncated")
    shape = struct.unpack_from(f"<{ndim}Q", view, at)
    at += 8 * ndim
    count = int(np.prod(shape, dtype=object))
    if count * dtype.itemsize != len(view) - at:
        raise bad(f"array of shape {shape} and dtype {dtype} needs {count * dtype.itemsize} bytes, "
                  f"{len(view) - at} stored")
    return np.frombuffer(view[at:], dtype=dtype).reshape(shape)


def _value(kind: str, view: memoryview, bad) -> Any:
    if kind in ("image", "mask"):
        return np.frombuffer(view, dtype=np.uint8)
    if kind == "bytes":
        return bytes(view)
    if kind == "text":
        try:
            return bytes(view).decode("utf-8")
        except UnicodeDecodeError as err:
            raise bad(f"text is not UTF-8: {err}") from err
    if kind in ("int", "float"):
        if len(view) != 8:
            raise bad(f"{kind} payload has {len(view)} bytes, expected 8")
        return struct.unpack("<q" if kind == "int" else "<d", view)[0]
    if kind in _LIST_DTYPES:
        dtype = np.dtype(_LIST_DTYPES[kind])
        if len(view) % dtype.itemsize:
            raise bad(f"{kind} payload of {len(view)} bytes is not a whole number of values")
        return np.frombuffer(view, dtype=dtype).astype(dtype.newbyteorder("="))
    array = _array(view, bad)
    if kind == "pixels" and (array.dtype != np.uint8 or array.ndim != 3):
        raise bad(f"pixels must be uint8 [H, W, C], got {array.dtype} {array.shape}")
    return array


def decode(raw: Any, fields: Mapping[str, Field], *, path: str, key: str) -> dict[str, Any]:
    """The declared fields' values of the framed record ``raw`` (any buffer); an image is a uint8 view."""
    view = memoryview(raw)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")

    def bad(message: str, offset: int | None = None) -> CorruptRecordError:
        return CorruptRecordError(message, path=path, index=key, offset=offset)

    if view[:4] != MAGIC:
        raise bad(f"not an ingest framed record (starts {bytes(view[:8])!r}, expected {MAGIC!r})")
    at, size, values = 4, len(view), {}
    for name, field in fields.items():
        kind = field.kind
        if size - at < _HEAD.size:
            raise bad(f"record ends before field {name!r}", at)
        code, length = _HEAD.unpack_from(view, at)
        if code != KIND_CODES[kind]:
            raise bad(f"field {name!r} is stored as kind code {code}, declared {kind!r} ({KIND_CODES[kind]})", at)
        at += _HEAD.size
        if length > size - at:
            raise bad(f"field {name!r} claims {length} bytes, {size - at} left", at)
        if kind == "image" or kind == "mask":
            values[name] = np.frombuffer(view, np.uint8, length, at)   # positional: keywords parse slowly
        elif kind == "int" and length == _INT.size:
            values[name] = _INT.unpack_from(view, at)[0]
        else:
            values[name] = _value(kind, view[at:at + length],
                                  lambda msg, _at=at, _name=name: bad(f"field {_name!r}: {msg}", _at))
        at += length
    if at != size:
        raise bad(f"{size - at} bytes after the last declared field", at)
    return values
