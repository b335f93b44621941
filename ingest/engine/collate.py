"""Batching of non-image fields, by kind (`ingest.formats.KINDS`).

The image field goes through decode and the ops; every other field of a batch's records is collated here:

| kind          | batched as                                                                 |
|---------------|----------------------------------------------------------------------------|
| int / float   | int64 / float32 tensor ``[B]``                                             |
| ints / floats | ``[B, L]`` (declared length) or padded to the longest (-1 / 0) + ``<name>_lengths`` |
| array         | stacked ``[B, ...]`` when shapes agree, else padded along dim 0 + ``<name>_lengths`` (a list  |
|               | of tensors + lengths when they differ beyond dim 0: COCO's ``[K, H, W]`` masks, no ops)     |
| image         | decoded to ``[H, W, 3]`` uint8 (CPU), stacked when sizes agree, else a list   |
| pixels        | like image, without decoding                                               |
| mask          | ``[H, W]`` values (`ingest.decode.masks`; the pipeline moves them with the image), stacked |
|               | when sizes agree, else a list                                                              |
| text / bytes  | a list                                                                     |

Tensors are on the CPU; `to_device` moves the numeric ones (pinned, non-blocking) to the loader's device,
except the per-sample counts and sizes (``<name>_lengths``, ``image_sizes``): splitting a padded batch needs
them on the host (`ingest.torch.detection_targets`), and reading a device copy there would make the host
wait for the GPU every step.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

from ..decode.masks import decode_mask
from ..errors import CorruptRecordError, IngestError
from ..formats.base import Field

PAD = {"ints": -1, "floats": 0.0, "array": 0}


def collate(name: str, field: Field, values: Sequence[Any], *, decode: Callable[[Any, str], np.ndarray],
            names: Sequence[str]) -> dict[str, Any]:
    """The batched form of one field: ``{name: batched}`` plus ``{name_lengths: ...}`` for ragged kinds.
    ``decode(bytes, sample_name)`` decodes an encoded image field; ``names`` name the samples for errors."""
    kind = field.kind
    try:
        if kind == "int":
            return {name: torch.tensor([int(v) for v in values], dtype=torch.int64)}
        if kind == "float":
            return {name: torch.tensor([float(v) for v in values], dtype=torch.float32)}
        if kind in ("ints", "floats"):
            dtype = np.int64 if kind == "ints" else np.float32
            arrays = [np.asarray(v, dtype=dtype).reshape(-1) for v in values]
            return _padded(name, arrays, PAD[kind], fixed=field.shape is not None)
        if kind == "array":
            if values and all(isinstance(v, torch.Tensor) for v in values):  # e.g. masks warped on the GPU
                return _padded_tensors(name, list(values), PAD[kind])
            arrays = [np.asarray(v) for v in values]
            return _padded(name, arrays, PAD[kind], fixed=False)
        if kind == "mask":   # without the pipeline's decode stage (which decodes and moves them): decoded here
            maps = [torch.from_numpy(decode_mask(v, n)) for v, n in zip(values, names)]
            if maps and all(m.shape == maps[0].shape for m in maps):
                return {name: torch.stack(maps)}
            return {name: maps}
        if kind in ("image", "pixels"):
            images = [torch.from_numpy(np.ascontiguousarray(decode(v, n) if kind == "image" else np.asarray(v)))
                      for v, n in zip(values, names)]
            if images and all(im.shape == images[0].shape for im in images):
                return {name: torch.stack(images)}
            return {name: images}
        return {name: list(values)}  # text, bytes
    except IngestError:
        raise
    except (TypeError, ValueError) as err:
        raise CorruptRecordError(f"field {name!r} ({kind}) cannot be batched: {err}",
                                 path=", ".join(names[:3]) + (" ..." if len(names) > 3 else "")) from err


def _padded(name: str, arrays: list[np.ndarray], pad: Any, *, fixed: bool) -> dict[str, torch.Tensor]:
    """Stack arrays that agree in shape; otherwise pad along dim 0 to the longest and report lengths."""
    lengths = torch.tensor([a.shape[0] if a.ndim else 1 for a in arrays], dtype=torch.int64)
    if arrays and all(a.shape == arrays[0].shape for a in arrays):
        out = {name: torch.from_numpy(np.stack(arrays))}
        if not fixed and arrays[0].ndim:
            out[f"{name}_lengths"] = lengths
        return out
    tails = {a.shape[1:] for a in arrays}
    if len(tails) != 1:   # nothing to pad to: one tensor per sample
        return {name: [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays], f"{name}_lengths": lengths}
    tail = tails.pop()
    dtype = np.result_type(*arrays)
    out = np.full((len(arrays), int(lengths.max()), *tail), pad, dtype=dtype)
    for k, a in enumerate(arrays):
        out[k, :len(a)] = a
    return {name: torch.from_numpy(out), f"{name}_lengths": lengths}


class Rows(NamedTuple):
    """Where a batch's values go in a padded ``[N, longest, ...]`` batch: sample n's are rows
    ``starts[n]:starts[n + 1]`` of one array of every sample's values; ``slot`` is each row's (sample, position)
    index into the padded batch. Made once for the fields that share the offsets (`padded_rows`)."""

    counts: np.ndarray
    longest: int
    slot: tuple[np.ndarray, np.ndarray]

    @classmethod
    def of(cls, starts: np.ndarray) -> "Rows":
        counts = np.diff(starts)
        owner = np.repeat(np.arange(len(counts)), counts)
        return cls(counts, int(counts.max()) if len(counts) else 0, (owner, np.arange(int(starts[-1])) - starts[owner]))


def padded_rows(name: str, flat: np.ndarray, rows: Rows, pad: Any, *, fixed: bool) -> dict[str, torch.Tensor]:
    """`_padded` of a field given as one array for the batch, ``flat``, whose rows `rows` places (each sample's
    array one slice of it): the same tensors `_padded` makes of the slices, from one reshape or one scatter
    instead of a copy per sample."""
    counts, longest = rows.counts, rows.longest
    lengths = torch.from_numpy(counts.astype(np.int64))
    if not len(counts):
        return {name: [], f"{name}_lengths": lengths}
    n = len(counts)
    if (counts == longest).all():   # every sample as long: stacked
        out = {name: torch.from_numpy(np.ascontiguousarray(flat.reshape(n, longest, *flat.shape[1:])))}
        if not fixed:
            out[f"{name}_lengths"] = lengths
        return out
    padded = np.full((n, longest, *flat.shape[1:]), pad, dtype=flat.dtype)
    padded[rows.slot] = flat
    return {name: torch.from_numpy(padded), f"{name}_lengths": lengths}


def _padded_tensors(name: str, tensors: list[torch.Tensor], pad: Any) -> dict[str, torch.Tensor]:
    """`_padded` for tensors that stay on their device."""
    lengths = torch.tensor([t.shape[0] if t.dim() else 1 for t in tensors], dtype=torch.int64)
    if all(t.shape == tensors[0].shape for t in tensors):
        out = {name: torch.stack(tensors)}
        if tensors[0].dim():
            out[f"{name}_lengths"] = lengths
        return out
    if len({tuple(t.shape[1:]) for t in tensors}) != 1:   # nothing to pad to: one tensor per sample
        return {name: list(tensors), f"{name}_lengths": lengths}
    ref = tensors[0]
    out = torch.full((len(tensors), int(lengths.max()), *ref.shape[1:]), pad, dtype=ref.dtype, device=ref.device)
    for k, t in enumerate(tensors):
        out[k, :len(t)] = t
    return {name: out, f"{name}_lengths": lengths}


def stays_on_host(name: str) -> bool:
    """Whether field ``name`` is a batch's per-sample counts or sizes, kept on the CPU (see the module doc)."""
    return name.endswith("_lengths") or name == "image_sizes"


def to_device(fields: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Numeric tensors (and lists of them) moved to ``device`` without blocking the host, but for the counts
    and sizes that stay on the host."""
    if device.type != "cuda":
        return fields

    def move(v):
        if isinstance(v, torch.Tensor):
            return v if v.is_cuda else v.pin_memory().to(device, non_blocking=True)
        if isinstance(v, list) and v and all(isinstance(t, torch.Tensor) for t in v):
            return [move(t) for t in v]
        return v
    return {k: v if stays_on_host(k) else move(v) for k, v in fields.items()}
