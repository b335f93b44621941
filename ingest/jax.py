"""The JAX adapter: a `Loader`'s batches as ``jax.Array``, by DLPack (``pip install 'ingest[jax]'``).

::

    for images, labels in ingest.jax.iterator(loader):                 # jax.Array on the loader's device
        ...
    mesh = jax.sharding.Mesh(jax.local_devices(), ("batch",))
    shard = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
    for images, labels in ingest.jax.iterator(loader, sharding=shard): # one global array over the devices
        ...

Notes
-----
Without ``sharding`` a tensor becomes a ``jax.Array`` on the same device without a copy (DLPack); JAX may copy a
CPU tensor whose alignment it does not take. With ``sharding`` (a ``jax.sharding.Sharding`` over local devices)
each device's rows are copied to it from the loader's device, once per batch, and assembled into one global
array (``jax.make_array_from_single_device_arrays``); the batch size must divide among the devices as the
sharding says. JAX's own dtype rule holds: without ``jax_enable_x64`` the int64 labels arrive as int32 (a copy).

Stream order: on CUDA the loader makes the current torch stream wait for each batch; a DLPack capsule carries no
stream, so before handing a batch to JAX the iterator waits on the host for that stream (once per batch).
Lifetime: a batch's memory belongs to the arrays made from it and stays valid until they are dropped; the
loader does not reuse an output batch while any array still refers to its memory.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from .torch import Loader


def _jax():
    try:
        import jax
        import jax.dlpack
    except ImportError as err:
        raise ImportError("ingest.jax needs JAX: pip install 'ingest[jax]'") from err
    return jax


def to_jax(tensor: torch.Tensor, sharding: Any = None) -> Any:
    """``tensor`` as a ``jax.Array``: the same memory (DLPack), or with ``sharding`` a global array whose
    shards are copied to their devices. The tensor's stream must be done with it (see the module Notes)."""
    jax = _jax()
    array = jax.dlpack.from_dlpack(tensor.contiguous())
    if sharding is None:
        return array
    if tensor.dim() == 0:
        raise ValueError("a sharded batch needs a batch dimension; got a 0-d tensor")
    shape = tuple(tensor.shape)
    pieces = [jax.device_put(array[index], device)
              for device, index in sharding.addressable_devices_indices_map(shape).items()]
    return jax.make_array_from_single_device_arrays(shape, sharding, pieces)


def _convert(value: Any, sharding: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return to_jax(value, sharding)
    if isinstance(value, tuple):
        return tuple(_convert(v, sharding) for v in value)
    if isinstance(value, list):
        return [_convert(v, sharding) for v in value]
    if isinstance(value, dict):
        return {k: _convert(v, sharding) for k, v in value.items()}
    return value   # names, boxes lists and other fields the loader gives as Python objects


def iterator(loader: Loader, *, sharding: Any = None) -> Iterator[Any]:
    """The next epoch of ``loader`` with every tensor of each batch (``(images, labels)`` or the dict of
    ``output="dict"``) as a ``jax.Array``; ``sharding``: a ``jax.sharding.Sharding`` over local devices for
    global arrays split on the batch dimension (see the module Notes)."""
    _jax()
    cuda = loader.device.type == "cuda"
    for batch in loader:
        if cuda:
            torch.cuda.current_stream(loader.device).synchronize()
        yield _convert(batch, sharding)
