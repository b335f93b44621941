"""Encoded image types told by their leading bytes: the one table every format and tool uses to recognize an
image, name its file (a WebDataset member, a file tree file) or state its type (TFRecord's ``image/format``,
``inspect``'s image types).
"""

from __future__ import annotations

from typing import Any

#: ``(name, file extension, leading bytes)``, the bytes as ``(offset, bytes)`` pairs that must all match.
#: Names are the ``image/format`` values TensorFlow's converters write.
JPEG_SIGNATURE = b"\xff\xd8\xff"  # SOI, then a marker's first byte (the decoders' own quick check)
IMAGE_TYPES = (
    ("jpeg", ".jpg", ((0, JPEG_SIGNATURE),)),
    ("png", ".png", ((0, b"\x89PNG\r\n\x1a\n"),)),
    ("gif", ".gif", ((0, b"GIF87a"),)),
    ("gif", ".gif", ((0, b"GIF89a"),)),
    ("webp", ".webp", ((0, b"RIFF"), (8, b"WEBP"))),
    ("bmp", ".bmp", ((0, b"BM"),)),
    ("tiff", ".tif", ((0, b"II*\x00"),)),
    ("tiff", ".tif", ((0, b"MM\x00*"),)),
    ("tiff", ".tif", ((0, b"II+\x00"),)),                                    # BigTIFF
    ("tiff", ".tif", ((0, b"MM\x00+"),)),
    ("jp2", ".jp2", ((0, b"\x00\x00\x00\x0cjP  \r\n\x87\n"),)),           # JPEG 2000 file
    ("j2k", ".j2k", ((0, b"\xff\x4f\xff\x51"),)),                             # JPEG 2000 codestream
    ("ppm", ".ppm", ((0, b"P6"),)),
    ("pgm", ".pgm", ((0, b"P5"),)),
    ("pam", ".pam", ((0, b"P7"),)),
)
_HEAD = max(offset + len(magic) for _, _, parts in IMAGE_TYPES for offset, magic in parts)


def _match(data: Any) -> tuple[str, str] | None:
    """``(name, extension)`` of the `IMAGE_TYPES` row whose leading bytes ``data`` (any bytes-like) has."""
    head = bytes(memoryview(data).cast("B")[:_HEAD])
    for name, ext, parts in IMAGE_TYPES:
        if all(head[offset:offset + len(magic)] == magic for offset, magic in parts):
            return name, ext
    return None


def image_type(data: Any) -> str | None:
    """The type of encoded image bytes (``"jpeg"``, ``"png"``, ``"webp"``, ...), None if unknown."""
    found = _match(data)
    return found[0] if found else None


def image_extension(data: Any) -> str | None:
    """The file extension of encoded image bytes (``".jpg"``, ``".png"``, ...), None if unknown."""
    found = _match(data)
    return found[1] if found else None


def mask_bytes(value: Any) -> bytes:
    """A ``mask`` field's value as the encoded bytes writers store: encoded bytes as they are; a decoded
    ``[H, W]`` uint8/bool or uint16 array (a raw shard's, a user's) as a lossless PNG of its values (8-bit or
    16-bit gray: the values stay, a palette's colours are not made up)."""
    import numpy as np
    if isinstance(value, np.ndarray) and value.ndim >= 2:
        import io

        from PIL import Image
        a = value[..., 0] if value.ndim == 3 and value.shape[2] == 1 else value
        if a.ndim != 2 or a.dtype not in (np.bool_, np.uint8, np.uint16):
            raise ValueError(f"a decoded mask must be [H, W] uint8 or uint16, got {a.dtype} {value.shape}")
        out = io.BytesIO()
        if a.dtype == np.uint16:
            Image.fromarray(np.ascontiguousarray(a, dtype="<u2")).save(out, format="PNG")
        else:
            Image.fromarray(np.ascontiguousarray(a, dtype=np.uint8)).save(out, format="PNG")
        return out.getvalue()
    return bytes(memoryview(value).cast("B"))
