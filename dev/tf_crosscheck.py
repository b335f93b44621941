"""Cross-check ingest's TFRecords against TensorFlow (developer script; run by a Python that has TensorFlow,
e.g. ``/tmp/tfvenv/bin/python dev/tf_crosscheck.py DIR``; `tests/test_tfrecord.py` runs it when one exists).

Reads ``DIR/part-0.tfrecord`` and ``DIR/gz.tfrecord.gz`` (written by `ingest.formats.tfrecord.TFRecordWriter`
with the test's fields) through ``tf.data.TFRecordDataset`` + ``tf.io.parse_single_example``, decodes the
JPEGs with TensorFlow, and writes what it parsed back with ``tf.io.TFRecordWriter`` as ``DIR/tf_written.tfrecord``,
``DIR/tf_written.tfrecord.gz`` (GZIP) and ``DIR/tf_written_zlib.tfrecord`` (ZLIB), for ingest to read back. Prints one JSON line: per file, labels, captions and decoded image sizes.
"""

from __future__ import annotations

import json
import os
import sys

import tensorflow as tf

SPEC = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/format": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    "caption": tf.io.FixedLenFeature([], tf.string),
    "weight": tf.io.FixedLenFeature([], tf.float32),
    "boxes": tf.io.VarLenFeature(tf.float32),
    "mask": tf.io.FixedLenFeature([], tf.string),
    "mask/shape": tf.io.VarLenFeature(tf.int64),
    "mask/dtype": tf.io.FixedLenFeature([], tf.string),
}


def read(path: str, compression: str) -> tuple[dict, list]:
    seen = {"labels": [], "captions": [], "image_sizes": []}
    parsed = []
    for raw in tf.data.TFRecordDataset(path, compression_type=compression):
        ex = tf.io.parse_single_example(raw, SPEC)
        assert ex["image/format"].numpy() == b"jpeg"
        image = tf.io.decode_jpeg(ex["image/encoded"])
        seen["labels"].append(int(ex["image/class/label"]))
        seen["captions"].append(ex["caption"].numpy().decode("utf-8"))
        seen["image_sizes"].append([int(image.shape[0]), int(image.shape[1])])
        parsed.append(ex)
    return seen, parsed


def feature(kind: str, values) -> tf.train.Feature:
    return tf.train.Feature(**{f"{kind}_list": getattr(tf.train, f"{kind.capitalize()}List")(value=values)})


def write(path: str, parsed: list, compression: str) -> None:
    with tf.io.TFRecordWriter(path, tf.io.TFRecordOptions(compression_type=compression)) as w:
        for ex in parsed:
            features = {
                "image/encoded": feature("bytes", [ex["image/encoded"].numpy()]),
                "image/class/label": feature("int64", [int(ex["image/class/label"])]),
                "caption": feature("bytes", [ex["caption"].numpy()]),
                "weight": feature("float", [float(ex["weight"])]),
                "boxes": feature("float", tf.sparse.to_dense(ex["boxes"]).numpy().tolist()),
                "mask": feature("bytes", [ex["mask"].numpy()]),
                "mask/shape": feature("int64", tf.sparse.to_dense(ex["mask/shape"]).numpy().tolist()),
                "mask/dtype": feature("bytes", [ex["mask/dtype"].numpy()]),
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())


def main(directory: str) -> None:
    out = {}
    for name, compression in (("part-0.tfrecord", ""), ("gz.tfrecord.gz", "GZIP")):
        out[name], parsed = read(os.path.join(directory, name), compression)
        if name == "part-0.tfrecord":
            for written, codec in (("tf_written.tfrecord", ""), ("tf_written.tfrecord.gz", "GZIP"),
                                   ("tf_written_zlib.tfrecord", "ZLIB")):
                write(os.path.join(directory, written), parsed, codec)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
