"""The exceptions ingest raises. Every error about data names the source (path or key) and, where
there is one, the byte offset, so that a bad sample can be found and fixed."""

from __future__ import annotations


class IngestError(Exception):
    """Base of every error raised by ingest. Picklable with its attributes (worker processes send them)."""

    def __reduce__(self):
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls, args, state):
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class ConfigError(IngestError, ValueError):
    """An option has a wrong value or an unknown name."""


class SourceError(IngestError):
    """A dataset cannot be listed or opened (empty class, no images, unreadable directory)."""

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(message)
        self.path = path


class CorruptRecordError(IngestError, ValueError):
    """A sample's bytes are not what its format says they should be."""

    def __init__(self, message: str, *, path: str, index: int | str | None = None,
                 offset: int | None = None):
        where = path
        if index is not None:
            where += f" [sample {index}]"
        if offset is not None:
            where += f" at byte {offset}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.index = index
        self.offset = offset


class DecodeError(CorruptRecordError):
    """An encoded image could not be decoded (truncated, corrupt, unsupported)."""


class FailureBudgetExceeded(IngestError):
    """More samples failed than `max_failures` allows. `failures` lists (source, stage, reason)."""

    def __init__(self, message: str, failures: list[tuple[str, str, str]]):
        super().__init__(message)
        self.failures = failures


class WriteError(IngestError):
    """Output could not be written (a full disk, a file-size limit, an I/O error). Not a bad sample: it stops
    a conversion whatever its failure budget. ``path`` is the file (or directory) being written, ``errno``
    the operating system's error number when there is one."""

    def __init__(self, message: str, *, path: str, errno: int | None = None):
        super().__init__(f"{path}: {message}")
        self.path = path
        self.errno = errno


class OutsideRootError(SourceError):
    """A path a dataset's own files name (a COCO ``file_name``) leads outside the root it must stay in: an
    absolute path, ``..``, or a link to elsewhere. ``path`` is the path as named."""
