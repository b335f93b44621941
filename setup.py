"""The one compiled part: ``ingest.ops._nvloop``, nvImageCodec's per-image batch loop without the GIL.

It needs only a C compiler and Python's headers (no CUDA, no nvImageCodec header), and it is optional: where
it cannot be built the install goes on and the GPU decoder runs the same loop through ctypes, slower beside
busy Python threads (``ingest.ops._nvimgcodec``). Everything else is declared in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("ingest.ops._nvloop", ["ingest/ops/_nvloop.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"])])
