"""Encoded bytes to pixels: a batch of encoded images in, ``[H, W, C]`` uint8 RGB images out (or uint16, gray or
RGBA where a decoder is asked for them).

::

    cpu           CpuDecoder (libjpeg-turbo through simplejpeg, Pillow for the rest), the batch JPEG header
                  table (`jpeg_headers`; compiled in ``formats/_jpeg.c``, with a Python reference)
    codecs        JPEG 2000 and TIFF (imagecodecs), binary PNM/PAM, their headers and limits; the output rules
                  (dtype, channels) every decode ends in
    gpu           GpuDecoder: nvImageCodec on a CUDA stream (regions where the ops crop), the CPU decoder for
                  what the GPU does not take; decode arenas (`Arenas`)
    _nvimgcodec   nvImageCodec's C API through ctypes; its per-image batch loop compiled in ``_nvloop.c``
    _nvjpeg       which nvJPEG nvImageCodec gets (loaded by ``import ingest`` before anything else)

This package imports nothing from `ingest.ops` or above; ops read its output (`ImageArena` and lists of
images). Importing it imports nothing: ``import ingest`` loads `_nvjpeg` first.
"""
