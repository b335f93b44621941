"""Format readers: one module per format. See `base` for the contract."""

from .base import Location, Record, Source, check_format
from .filetree import IMAGE_EXTENSIONS, FileList, FileTree
from .memory import MemorySource

__all__ = ["Location", "Record", "Source", "check_format", "FileTree", "FileList", "MemorySource",
           "IMAGE_EXTENSIONS"]
