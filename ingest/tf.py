"""The TensorFlow adapter: a `Loader`'s batches as ``tf.Tensor``s or a ``tf.data.Dataset``
(``pip install 'ingest[tf]'``).

::

    for images, labels in ingest.tf.batches(loader):    # tf.Tensor on the loader's device (DLPack, no copy)
        ...
    ds = ingest.tf.dataset(loader)                      # tf.data.Dataset: every iteration is a loader epoch
    model.fit(ds, epochs=3)

Notes
-----
`batches` hands each tensor over by DLPack: the same memory, on the same device. `dataset` wraps the same
batches in ``tf.data.Dataset.from_generator``, whose values pass through a Python function that TensorFlow
places on the host, so on a GPU each batch is copied to host memory and back; use `batches` where that copy
matters. A dataset holds tensor fields only: the Python-object fields of ``output="dict"`` (names, lists of
boxes) are left out. Its element signature comes from the first batch, read when `dataset` is called (the
first iteration goes on from it).

Stream order and lifetime are those of `ingest.jax`: on CUDA the iterator waits on the host for the stream the
loader delivered the batch on before handing it over (a DLPack capsule carries no stream), and a batch stays
valid while any tensor made from it is referenced.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
import torch.utils.dlpack

from .torch import Loader


def _tf():
    try:
        import tensorflow as tf
    except ImportError as err:
        raise ImportError("ingest.tf needs TensorFlow: pip install 'ingest[tf]'") from err
    return tf


def to_tf(tensor: torch.Tensor) -> Any:
    """``tensor`` as a ``tf.Tensor`` over the same memory (DLPack)."""
    return _tf().experimental.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(tensor.contiguous()))


def _convert(value: Any, tensors_only: bool) -> Any:
    if isinstance(value, torch.Tensor):
        return to_tf(value)
    if isinstance(value, tuple):
        return tuple(_convert(v, tensors_only) for v in value)
    if isinstance(value, dict):
        return {k: _convert(v, tensors_only) for k, v in value.items()
                if not tensors_only or isinstance(v, torch.Tensor)}
    return value


def _batches(loader: Loader, batches: Iterator[Any], tensors_only: bool) -> Iterator[Any]:
    cuda = loader.device.type == "cuda"
    for batch in batches:
        if cuda:
            torch.cuda.current_stream(loader.device).synchronize()
        yield _convert(batch, tensors_only)


def batches(loader: Loader) -> Iterator[Any]:
    """The next epoch of ``loader`` with every tensor of each batch as a ``tf.Tensor`` (see the Notes)."""
    _tf()
    return _batches(loader, iter(loader), False)


def _signature(value: Any) -> Any:
    tf = _tf()
    if isinstance(value, tuple):
        return tuple(_signature(v) for v in value)
    if isinstance(value, dict):
        return {k: _signature(v) for k, v in value.items()}
    return tf.TensorSpec(shape=[None, *value.shape[1:]], dtype=value.dtype)


def dataset(loader: Loader) -> Any:
    """A ``tf.data.Dataset`` of ``loader``'s batches, one loader epoch per iteration (see the Notes)."""
    tf = _tf()
    epoch = iter(loader)
    batch = next(epoch, None)
    if batch is None:
        raise ValueError("the loader has no batch to take the dataset's signature from")
    first = next(_batches(loader, iter([batch]), True))
    pending = [(first, epoch)]

    def generate() -> Iterator[Any]:
        if pending:   # the epoch whose first batch gave the signature
            head, rest = pending.pop()
            yield head
            yield from _batches(loader, rest, True)
        else:
            yield from _batches(loader, iter(loader), True)

    return tf.data.Dataset.from_generator(generate, output_signature=_signature(first))
