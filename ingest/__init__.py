"""ingest: training data from storage to the GPU.

    loader = ingest.Loader("data/train", batch_size=256, device="cuda",
                           ops=[RandomResizedCrop(224), Flip(p=0.5), Normalize(mean, std)],
                           shuffle=True, seed=0)
    for images, labels in loader: ...
"""

from .decode import _nvjpeg

_nvjpeg.preload()   # before anything loads another nvJPEG under the same soname (see ingest.decode._nvjpeg)

from . import defaults, errors, formats  # noqa: E402
from .errors import (ConfigError, CorruptRecordError, DecodeError, FailureBudgetExceeded, IngestError,
                     SourceError)
from .formats import FileList, FileTree, MemorySource
from .engine import Batch, Pipeline
from .sampler import Sampler
from .torch import GenericIterator, Loader

__version__ = "0.1.0"

__all__ = ["Loader", "GenericIterator", "Pipeline", "Batch", "Sampler", "FileTree", "FileList", "MemorySource",
           "defaults", "errors", "formats", "IngestError", "ConfigError", "CorruptRecordError", "DecodeError",
           "FailureBudgetExceeded", "SourceError", "__version__"]
