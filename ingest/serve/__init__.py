"""Serving a pipeline spec: a Triton Inference Server model that decodes and preprocesses encoded images.

    preprocess   Preprocessor: a server's batch through the loader's pipeline, each item's outcome its own
    backend      TritonPythonModel: the Python-backend model (one response per request, errors per request)
    repository   export(): a model repository (config.pbtxt, 1/model.py, 1/spec.json) for the spec
    server       TritonServer: nvidia-pytriton's tritonserver running such a repository

`ingest serve` and `ingest triton-export` (`ingest.tools.serve`) are the command line; docs/serving.md the guide.
"""

from .preprocess import ItemError, Outcome, Preprocessor, load_model
from .repository import config_text, export
from .server import ServerError, TritonServer

__all__ = ["ItemError", "Outcome", "Preprocessor", "ServerError", "TritonServer", "config_text", "export",
           "load_model"]
