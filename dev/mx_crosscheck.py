"""Cross-check ingest's RecordIO files against MXNet (developer script; run by a Python that has MXNet, e.g. a
venv with ``mxnet==1.9.1`` and ``numpy<1.24``: ``MXPYTHON dev/mx_crosscheck.py DIR``; `tests/test_recordio.py`
runs it when one is configured).

Reads ``DIR/ours.rec`` + ``DIR/ours.idx`` (written by `ingest.formats.recordio.RecordIOWriter`) with
``mx.recordio.MXIndexedRecordIO`` + ``recordio.unpack`` (and front to back with ``MXRecordIO``), and writes
``DIR/mx.rec`` + ``DIR/mx.idx`` with MXNet from the same payloads (scalar and array labels as they were) for
ingest to read back. Prints one JSON line: per record of ours, the header (flag, label(s), id) and the
image's length and SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import recordio


def describe(header, image: bytes) -> dict:
    label = header.label.tolist() if isinstance(header.label, np.ndarray) else float(header.label)
    return {"flag": int(header.flag), "label": label, "id": int(header.id), "image_len": len(image),
            "image_sha256": hashlib.sha256(image).hexdigest()}


def main(directory: str) -> None:
    ours = recordio.MXIndexedRecordIO(os.path.join(directory, "ours.idx"), os.path.join(directory, "ours.rec"), "r")
    seen, payloads = [], []
    for key in ours.keys:
        header, image = recordio.unpack(ours.read_idx(key))
        seen.append(describe(header, image))
        payloads.append((header, image))
    ours.close()
    sequential = recordio.MXRecordIO(os.path.join(directory, "ours.rec"), "r")
    count = 0
    while (item := sequential.read()) is not None:
        assert describe(*recordio.unpack(item)) == seen[count]
        count += 1
    assert count == len(seen)
    written = recordio.MXIndexedRecordIO(os.path.join(directory, "mx.idx"), os.path.join(directory, "mx.rec"), "w")
    for key, (header, image) in enumerate(payloads):
        written.write_idx(key, recordio.pack(header, image))
    written.close()
    print(json.dumps({"mxnet": mx.__version__, "records": seen}))


if __name__ == "__main__":
    main(sys.argv[1])
