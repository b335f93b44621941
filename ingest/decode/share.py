"""How many of a batch's JPEG 2000 images the CPU decoder takes while the GPU decodes the rest.

nvJPEG2000 decodes one batch at a time, and a batch of JPEG 2000 images keeps it busy far longer than a training
step takes while most of the host's cores wait. So `GpuDecoder.decode_batch` hands a share of those images to the
CPU decoder's threads before its nvImageCodec call and collects them after it.

The ``host_jpeg2k_share`` setting fixes the share (0: every eligible image on the GPU), or "auto" finds it:
:class:`HostShare` starts at `FIRST` and after each batch multiplies the share by the square root of
(`AIM` x the GPU side's wall time / the CPU side's), each timed from the batch's start to its side's last image.
So the CPU side settles at finishing when the GPU side has `AIM` of its time behind it. Not at the same moment:
what the CPU's images cost after both sides (their uploads, one per image) and what its threads take from
nvJPEG2000's own host threads show in neither time, so ending both together gives the CPU too many. While
the CPU side has fewer images than threads its time stays one image's, so the share grows until the times reach
the aim; the square root damps the swings. The CPU keeps at least one image and the GPU at least a tenth of each
batch (`MOST`), so that both times stay measured, with one exception: where a single image takes the CPU side
longer than the GPU side's whole batch (very large images), the batch waits for the CPU, so "auto" gives the CPU
no image for the next batch, then 2, 4, ... up to `LONGEST_PAUSE` batches, trying one image between the pauses
and ending them once one image fits. (TIFFs are not shared: nvTIFF is fast enough that the CPU's images only
slowed the batch.)

Which images go: those whose decode region covers the least of the image (`pick`). Each side decodes just the
region (nvJPEG2000 the code blocks it touches, OpenJPEG its area: `ingest.decode.openjpeg`), and both pay a
part of an image's cost whatever its region. Given the smallest crops, the CPU side takes more images in its
time than given the largest, for a smaller cut in the GPU side's work; on the ImageNet-sized sets of
``benchmarks/bench_codecs.py`` that traded up on lossless images and evenly on lossy ones
(docs/measurements.md).
"""

from __future__ import annotations

import math
import threading

import numpy as np

#: The CPU's share of the first batch in "auto".
FIRST = 1 / 8
#: Where "auto" puts the CPU side's wall time: this fraction of the GPU side's.
AIM = 0.7
#: The largest share the CPU takes in "auto".
MOST = 0.9
#: The smallest share "auto" keeps (above it, at least one image a batch).
LEAST = 1 / 256
#: The most batches in a row "auto" gives the CPU no image, after one image outlasted the GPU side's batch.
LONGEST_PAUSE = 64


class HostShare:
    """The CPU decoder's share of a batch's images (see the module doc). ``share``: a fraction in
    [0, 1] or "auto". Safe to use from several threads."""

    def __init__(self, share: float | str):
        self.setting = share
        self._lock = threading.Lock()
        self._share = FIRST if share == "auto" else float(share)
        self._paused = 0   # batches left with no CPU image
        self._pause = 0    # the length of the last pause (0: none since one image last fitted)

    @property
    def share(self) -> float:
        """The share the next batch gets."""
        with self._lock:
            return self._share

    def count(self, n: int) -> int:
        """How many of ``n`` eligible images the CPU takes in the next batch."""
        k = int(round(self.share * n))
        if self.setting == "auto":
            with self._lock:
                if self._paused:
                    self._paused -= 1
                    return 0
            return min(n - 1, max(1, k)) if n > 1 else 0
        return k

    def record(self, cpu_seconds: float, gpu_seconds: float, images: int | None = None) -> None:
        """A batch's wall times, from its start to the last image of each side, and the CPU side's image count if
        known (in "auto": the next share, and a pause where its one image outlasted the GPU side)."""
        if self.setting != "auto" or cpu_seconds <= 0 or gpu_seconds <= 0:
            return
        with self._lock:
            self._share = min(MOST, max(LEAST, self._share * math.sqrt(AIM * gpu_seconds / cpu_seconds)))
            if images == 1 and cpu_seconds > gpu_seconds:
                self._pause = self._paused = min(LONGEST_PAUSE, 2 * self._pause or 1)
            elif images == 1:
                self._pause = 0


def pick(count: int, cover: np.ndarray) -> np.ndarray:
    """Positions, in order, of the ``count`` images the CPU takes among those whose decode regions cover
    ``cover`` of their images (1 for a whole image): the smallest covers first, ties in batch order."""
    if count <= 0:
        return np.zeros(0, np.int64)
    order = np.argsort(np.asarray(cover, np.float64), kind="stable")
    return np.sort(order[:count])
