"""The compiled parts, both optional: where a C compiler is missing the install goes on without them.

- ``ingest._readv``: a batch of file reads on native threads with the GIL released once per batch; without
  it `ingest.io` reads on Python threads.
- ``ingest.formats._jpeg``: the JPEG headers of a batch in one call; without it `ingest.decode.cpu` reads them one
  by one in Python.
- ``ingest.formats._wire``: a batch of TFRecord records' ``tf.train.Example`` features located in one call;
  without it `ingest.formats.tfrecord` parses each record with protobuf (which stays the fallback for records
  the scan does not take).
- ``ingest._random``: a batch's per-sample uniform numbers (`ingest.random.SampleRandom.random`), and its
  RandomResizedCrop regions, in one call holding the GIL each; without it numpy makes the same numbers, in
  many more calls, letting the GIL go on large arrays.
- ``ingest._plan``: the native planner (``ingest/_native/plan.c``: a batch's draws, composed warp and warp
  kernel arguments in C, as the Python planner makes them, and a detection batch's boxes) bound for
  `ingest.native_plan`, its tests and the Python engine's read stage (detection chains); the native engine
  compiles the same file. Without it the Python planner is the only one.
- ``ingest.decode._png``: a batch's palette and gray PNG masks decoded on native threads with the GIL released
  once (zlib loaded at run time); without it, or without libz.so.1, `ingest.decode.masks` decodes them with
  Pillow.
- ``ingest.ops._boxes``: a detection batch's RandomIoUCrop draws, and its boxes through each op, in one call
  each holding the GIL; without it `ingest.ops.detection` and `ingest.ops.affine` do the same in numpy.
- ``ingest.decode._openjpeg``: OpenJPEG's decode area for a JPEG 2000 crop (`ingest.decode.openjpeg`), one call
  an image with the GIL released once (libopenjp2 loaded at run time); without it JPEG 2000 images are decoded
  whole by imagecodecs.
- ``ingest.decode._nvloop``: nvImageCodec's per-image batch loop without the GIL; without it the GPU decoder runs
  the same loop through ctypes, slower beside busy Python threads (``ingest.decode._nvimgcodec``).
- ``ingest._engine``: the native engine (``ingest/_native/engine.c`` with the native planner, ``plan.c``): a
  batch from its indices to the device batch on native threads (`ingest.native`); without it the Python stages
  run. It loads libcuda at run time.

Shared pure-C pieces live in ``ingest/_native/*.h`` and are included by the modules that use them.

They need only a C compiler and Python's headers (no CUDA, no nvImageCodec header). Everything else is
declared in pyproject.toml.
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]
# no fused multiply-adds: arithmetic that the Python planner does in numpy must round as numpy's does
EXACT = FLAGS + ["-ffp-contract=off"]
NATIVE = ["ingest/_native"]   # headers shared by the extensions and the native engine

setup(ext_modules=[
    Extension("ingest._readv", ["ingest/_readv.c"], optional=True, extra_compile_args=FLAGS,
              depends=["ingest/_native/preadv.h", "ingest/_native/crc32c.h"]),
    Extension("ingest._random", ["ingest/_random.c"], optional=True, extra_compile_args=EXACT, include_dirs=NATIVE,
              depends=["ingest/_native/random_core.h"], libraries=["m"]),
    Extension("ingest._plan", ["ingest/_native/plan_py.c", "ingest/_native/plan.c"], optional=True,
              extra_compile_args=EXACT, include_dirs=NATIVE,
              depends=["ingest/_native/plan.h", "ingest/_native/random_core.h", "ingest/_native/boxes_core.h"],
              libraries=["m"]),
    Extension("ingest.formats._wire", ["ingest/formats/_wire.c"], optional=True, extra_compile_args=FLAGS,
              include_dirs=NATIVE, depends=["ingest/_native/example_scan.h"]),
    Extension("ingest.formats._jpeg", ["ingest/formats/_jpeg.c"], optional=True, extra_compile_args=FLAGS,
              depends=["ingest/_native/jpeg_scan.h"]),
    Extension("ingest.decode._png", ["ingest/decode/_png.c"], optional=True, extra_compile_args=FLAGS,
              include_dirs=NATIVE, depends=["ingest/_native/png_decode.h", "ingest/_native/dlsyms.h"],
              libraries=["dl", "pthread"]),
    Extension("ingest.ops._boxes", ["ingest/ops/_boxes.c"], optional=True, extra_compile_args=EXACT,
              depends=["ingest/_native/random_core.h", "ingest/_native/boxes_core.h"]),
    Extension("ingest.decode._openjpeg", ["ingest/decode/_openjpeg.c"], optional=True, extra_compile_args=FLAGS,
              include_dirs=NATIVE, depends=["ingest/_native/dlsyms.h"], libraries=["dl"]),
    Extension("ingest.decode._nvloop", ["ingest/decode/_nvloop.c"], optional=True, extra_compile_args=FLAGS,
              depends=["ingest/_native/nvloop.h"]),
    Extension("ingest._engine", ["ingest/_native/engine.c", "ingest/_native/plan.c"], optional=True,
              extra_compile_args=EXACT, include_dirs=NATIVE, libraries=["m", "dl", "pthread"],
              depends=["ingest/_native/" + h for h in ("boxes_core.h", "crc32c.h", "dlsyms.h", "engine_det.h", "example_scan.h",
                                                       "jpeg_scan.h", "nvloop.h", "plan.h", "png_decode.h", "record_parse.h",
                                                       "preadv.h", "random_core.h")]),
])
