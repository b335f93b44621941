"""A decoded batch in one buffer: what the GPU decoder returns and the warp reads without a tensor per image."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch


class ImageArena(Sequence):
    """A ragged batch of contiguous ``[H, W, C]`` uint8 images in one buffer: image k is ``hw[k]`` pixels of
    ``channels`` bytes at byte ``offsets[k]`` of ``storage`` (1-D uint8). Indexing makes that view; the warp
    and :func:`sizes_of` read ``offsets`` and ``hw`` instead, so a batch costs no Python call per image."""

    def __init__(self, storage: torch.Tensor, offsets: np.ndarray, hw: np.ndarray, channels: int = 3):
        self.storage, self.channels = storage, channels
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.hw = np.asarray(hw, dtype=np.int64).reshape(-1, 2)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        (h, w), start = self.hw[k].tolist(), int(self.offsets[k])
        return self.storage[start:start + h * w * self.channels].view(h, w, self.channels)

    def __iter__(self):
        return (self[k] for k in range(len(self)))

    @property
    def device(self) -> torch.device:
        return self.storage.device

    def pointers(self) -> np.ndarray:
        """Each image's address."""
        return self.storage.data_ptr() + self.offsets


def arena_under(images: Any) -> torch.Tensor | None:
    """The 1-D buffer a decoded batch lives in: an `ImageArena`'s storage, or that of a list whose images
    are views of one (a batch with an image turned or decoded on the CPU comes back as a list); else None."""
    if isinstance(images, ImageArena):
        return images.storage
    if isinstance(images, list):
        for im in images:
            base = im._base if isinstance(im, torch.Tensor) else None
            if base is not None and base.dim() == 1 and base.dtype == torch.uint8:
                return base
    return None
