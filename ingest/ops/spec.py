"""A list of ops as versioned JSON: what `ingest serve` loads and what a training config can record.

::

    text = dumps([Resize(256), CenterCrop(224), Normalize(mean=[124, 116, 104], std=[58, 57, 57])])
    ops = loads(text)           # equal ops: same classes, same parameters (`same_ops`)

The document::

    {"format": "ingest.ops", "version": 1,
     "ops": [{"op": "Resize", "params": {"size": null, "shorter": 256, ...}}, ...]}

Notes
-----
An op is written as its class name (one of `OP_CLASSES`) and the keyword arguments of its constructor, read
back from the op's attributes of the same names, so every parameter is written, defaults included, as the op
holds it after validation (``Resize(256)`` is written ``shorter=256``). Tuples become lists, a ``torch.dtype``
``{"dtype": "float32"}``. A user's function (`BatchFunction`'s ``fn``) is written as a reference
``{"callable": "module:qualified.name"}`` and imported when loaded, so only a function importable by that name
can be written; a `Torchvision` op holds a transform object no name reaches, and is refused. Reading refuses
an unknown format, version, op or parameter with a ConfigError naming the op's position.
"""

from __future__ import annotations

import importlib
import inspect
import json
from typing import Any, Sequence

import torch

from ..errors import ConfigError
from . import augment, color, detection, geometry, mix, normalize, user
from .base import Op
from .mix import BatchOp

FORMAT = "ingest.ops"
VERSION = 1

#: Every op a spec can name, by class name.
OP_CLASSES: dict[str, type] = {cls.__name__: cls for cls in (
    geometry.Resize, geometry.CenterCrop, geometry.RandomResizedCrop, geometry.Flip, geometry.HorizontalFlip,
    geometry.VerticalFlip, geometry.Rotate, detection.RandomIoUCrop, detection.ZoomOut, detection.PadTo,
    color.ColorJitter, normalize.Normalize, augment.RandAugment, augment.TrivialAugmentWide, augment.AutoAugment,
    augment.RandomErasing, augment.GaussianBlur, augment.RandomGrayscale, augment.RandomAffine, mix.MixUp,
    mix.CutMix, mix.MixUpCutMix, user.BatchFunction, user.Torchvision)}

#: Constructor parameters an op holds under another attribute name.
_HELD_AS = {"MixUp": {"alpha": "mixup_alpha"}, "CutMix": {"alpha": "cutmix_alpha"}}

_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                                     torch.uint8, torch.int8, torch.int16, torch.int32)}


def dumps(ops: Sequence[Any], *, indent: int | None = 1) -> str:
    """``ops`` (a list of ingest ops) as the JSON spec `loads` reads back (see the module docstring)."""
    if isinstance(ops, (Op, BatchOp)) or not isinstance(ops, (list, tuple)):
        raise ConfigError(f"`ops` must be a list of ops, got {type(ops).__name__}")
    return json.dumps({"format": FORMAT, "version": VERSION,
                       "ops": [_op_entry(op, k) for k, op in enumerate(ops)]}, indent=indent)


def loads(text: str | bytes) -> list:
    """The ops of a spec `dumps` wrote: a ConfigError for text that is not such a spec, naming what is wrong
    (an unknown version, op or parameter, and where)."""
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"an ops spec must be JSON: {err}") from err
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"not an ops spec: expected a JSON object with \"format\": \"{FORMAT}\"")
    if doc.get("version") != VERSION:
        raise ConfigError(f"ops spec version {doc.get('version')!r} is not supported (this ingest reads "
                          f"version {VERSION})")
    entries = doc.get("ops")
    if not isinstance(entries, list):
        raise ConfigError("an ops spec's \"ops\" must be a list")
    return [_op_of(entry, k) for k, entry in enumerate(entries)]


def same_ops(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two lists of ops are equal: the same classes with the same parameters, in the same order."""
    return len(a) == len(b) and all(type(x) is type(y) and _params(x, -1) == _params(y, -1)
                                    for x, y in zip(a, b))


def _param_names(cls: type) -> list[str]:
    return [p.name for p in inspect.signature(cls.__init__).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _params(op: Any, k: int) -> dict[str, Any]:
    cls = type(op)
    if OP_CLASSES.get(cls.__name__) is not cls:
        raise ConfigError(f"ops[{k}] is a {cls.__name__}, which an ops spec cannot name. Available: "
                          f"{', '.join(sorted(OP_CLASSES))}")
    if cls is user.Torchvision:
        raise ConfigError(f"ops[{k}] is a Torchvision op: its transform object cannot be written to a spec; "
                          "wrap a module-level function in BatchFunction instead")
    out, held_as = {}, _HELD_AS.get(cls.__name__, {})
    for name in _param_names(cls):
        attr = held_as.get(name, name)
        if not hasattr(op, attr):
            raise ConfigError(f"ops[{k}] ({cls.__name__}) does not hold its parameter `{name}`")
        out[name] = _encode(getattr(op, attr), f"ops[{k}] ({cls.__name__}) `{name}`")
    return out


def _op_entry(op: Any, k: int) -> dict[str, Any]:
    return {"op": type(op).__name__, "params": _params(op, k)}


def _encode(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:   # numpy and torch scalars
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_encode(v, where) for v in value]
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if callable(value):
        ref = f"{getattr(value, '__module__', None)}:{getattr(value, '__qualname__', '')}"
        if "<" in ref or _resolve(ref, where, quiet=True) is not value:
            raise ConfigError(f"{where}: {value!r} cannot be written to a spec: only a function importable by "
                              "its module and name can be (not a lambda, a local function or an object)")
        return {"callable": ref}
    raise ConfigError(f"{where}: a {type(value).__name__} cannot be written to a spec")


def _decode(value: Any, where: str) -> Any:
    if isinstance(value, list):
        return tuple(_decode(v, where) for v in value)
    if isinstance(value, dict):
        if set(value) == {"dtype"} and value["dtype"] in _DTYPES:
            return _DTYPES[value["dtype"]]
        if set(value) == {"callable"} and isinstance(value["callable"], str):
            return _resolve(value["callable"], where)
        raise ConfigError(f"{where}: unknown value {value!r} (expected {{\"dtype\": one of "
                          f"{', '.join(_DTYPES)}}} or {{\"callable\": \"module:name\"}})")
    return value


def _resolve(ref: str, where: str, *, quiet: bool = False) -> Any:
    module, _, name = ref.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError, ValueError) as err:
        if quiet:
            return None
        raise ConfigError(f"{where}: cannot import {ref!r}: {err}") from err


def _op_of(entry: Any, k: int) -> Any:
    if not isinstance(entry, dict) or not isinstance(entry.get("op"), str):
        raise ConfigError(f"ops[{k}] of the spec must be an object {{\"op\": name, \"params\": {{...}}}}")
    name = entry["op"]
    cls = OP_CLASSES.get(name)
    if cls is None:
        raise ConfigError(f"ops[{k}]: unknown op {name!r}. Available: {', '.join(sorted(OP_CLASSES))}")
    params = entry.get("params", {})
    unknown = set(entry) - {"op", "params"}
    if not isinstance(params, dict) or unknown:
        raise ConfigError(f"ops[{k}] ({name}) must be {{\"op\": name, \"params\": {{...}}}}"
                          + (f"; unknown keys {sorted(unknown)}" if unknown else ""))
    allowed = _param_names(cls)
    extra = sorted(set(params) - set(allowed))
    if extra:
        raise ConfigError(f"ops[{k}] ({name}): unknown parameter(s) {', '.join(extra)}. Available: "
                          f"{', '.join(allowed)}")
    args = {key: _decode(v, f"ops[{k}] ({name}) `{key}`") for key, v in params.items()}
    try:
        return cls(**args)
    except ConfigError as err:
        raise ConfigError(f"ops[{k}] ({name}): {err}") from err
    except TypeError as err:   # a required parameter missing
        raise ConfigError(f"ops[{k}] ({name}): {err}") from err
