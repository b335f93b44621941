"""The compiled parts, both optional: where a C compiler is missing the install goes on without them.

- ``ingest._readv``: a batch of file reads on native threads with the GIL released once per batch; without
  it `ingest.io` reads on Python threads.
- ``ingest.ops._jpeg``: the JPEG headers of a batch in one call; without it `ingest.ops.decode` reads them one
  by one in Python.
- ``ingest.formats._wire``: a batch of TFRecord records' ``tf.train.Example`` features located in one call;
  without it `ingest.formats.tfrecord` parses each record with protobuf (which stays the fallback for records
  the scan does not take).
- ``ingest._random``: a batch's per-sample uniform numbers (`ingest.random.SampleRandom.random`), and its
  RandomResizedCrop regions, in one call holding the GIL each; without it numpy makes the same numbers, in
  many more calls, letting the GIL go on large arrays.
- ``ingest.ops._boxes``: a detection batch's RandomIoUCrop draws, and its boxes through each op, in one call
  each holding the GIL; without it `ingest.ops.detection` and `ingest.ops.affine` do the same in numpy.
- ``ingest.ops._nvloop``: nvImageCodec's per-image batch loop without the GIL; without it the GPU decoder runs
  the same loop through ctypes, slower beside busy Python threads (``ingest.ops._nvimgcodec``).

They need only a C compiler and Python's headers (no CUDA, no nvImageCodec header). Everything else is
declared in pyproject.toml.
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]

setup(ext_modules=[
    Extension("ingest._readv", ["ingest/_readv.c"], optional=True, extra_compile_args=FLAGS),
    # no fused multiply-adds: its arithmetic must round as numpy's (the fallback) does
    Extension("ingest._random", ["ingest/_random.c"], optional=True, extra_compile_args=FLAGS + ["-ffp-contract=off"],
              libraries=["m"], depends=["ingest/_splitmix.h"]),
    Extension("ingest.formats._wire", ["ingest/formats/_wire.c"], optional=True, extra_compile_args=FLAGS),
    Extension("ingest.ops._jpeg", ["ingest/ops/_jpeg.c"], optional=True, extra_compile_args=FLAGS),
    Extension("ingest.ops._boxes", ["ingest/ops/_boxes.c"], optional=True,
              extra_compile_args=FLAGS + ["-ffp-contract=off"], depends=["ingest/_splitmix.h"]),
    Extension("ingest.ops._nvloop", ["ingest/ops/_nvloop.c"], optional=True, extra_compile_args=FLAGS),
])
