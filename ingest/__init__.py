"""ingest: training data from storage to the GPU.

    loader = ingest.Loader("data/train", batch_size=256, device="cuda",
                           ops=[RandomResizedCrop(224), Flip(p=0.5), Normalize(mean, std)],
                           shuffle=True, seed=0)
    for images, labels in loader: ...

The public names below are imported on first use (PEP 562): ``import ingest`` alone loads neither torch nor
numpy, so the command line answers ``--help`` and ``--version`` without them.
"""

from .decode import _nvjpeg

_nvjpeg.preload()   # before anything loads another nvJPEG under the same soname (see ingest.decode._nvjpeg)

__version__ = "0.1.0"

#: Public name -> the module that defines it (a module itself where the two are the same).
_PUBLIC = {"Loader": "torch", "GenericIterator": "torch", "Pipeline": "engine", "Batch": "engine",
           "Sampler": "sampler", "FileTree": "formats", "FileList": "formats", "MemorySource": "formats",
           "IngestError": "errors", "ConfigError": "errors", "CorruptRecordError": "errors",
           "DecodeError": "errors", "FailureBudgetExceeded": "errors", "SourceError": "errors",
           "defaults": None, "errors": None, "formats": None}

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str):
    import importlib
    import importlib.util
    if name not in _PUBLIC:   # a submodule (ingest.ops, ingest.torch, ...), as an eager package would have it
        if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module 'ingest' has no attribute {name!r}")
        return importlib.import_module(f".{name}", __name__)
    module = importlib.import_module(f".{_PUBLIC[name] or name}", __name__)
    value = module if _PUBLIC[name] is None else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
