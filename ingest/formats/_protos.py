"""Protocol buffer messages of other tools' record formats, built at import time from descriptors (no
TensorFlow, no Caffe, no generated code):

- ``tf.train.Example`` / ``SequenceExample`` and their parts, with the field numbers of TensorFlow's
  ``tensorflow/core/example/{example,feature}.proto`` (proto3: numeric lists packed).
- Caffe's ``Datum`` (``caffe.proto``, proto2): channels=1, height=2, width=3, data=4, label=5,
  float_data=6, encoded=7.

The messages live in a private descriptor pool, so they never clash with TensorFlow's own classes when both
are imported in one process. Wire compatibility is all that matters: the bytes are the same.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED


def _field(msg, name: str, number: int, ftype: int, label: int = _OPTIONAL, type_name: str | None = None,
           oneof: int | None = None, packed: bool | None = None, default: str | None = None):
    f = msg.field.add(name=name, number=number, type=ftype, label=label)
    if type_name:
        f.type_name = type_name
    if oneof is not None:
        f.oneof_index = oneof
    if packed is not None:
        f.options.packed = packed
    if default is not None:
        f.default_value = default
    return f


def _map_field(msg, name: str, number: int, value_type: str, package: str) -> None:
    """A ``map<string, value_type>`` field: a repeated nested ``<Name>Entry`` message marked map_entry."""
    entry_name = "".join(part.capitalize() for part in name.split("_")) + "Entry"
    entry = msg.nested_type.add(name=entry_name)
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, _F.TYPE_MESSAGE, type_name=value_type)
    _field(msg, name, number, _F.TYPE_MESSAGE, _REPEATED, f".{package}.{msg.name}.{entry_name}")


def _tensorflow_file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="tensorflow/core/example/example.proto", package="tensorflow",
                                            syntax="proto3")
    _field(fd.message_type.add(name="BytesList"), "value", 1, _F.TYPE_BYTES, _REPEATED)
    _field(fd.message_type.add(name="FloatList"), "value", 1, _F.TYPE_FLOAT, _REPEATED, packed=True)
    _field(fd.message_type.add(name="Int64List"), "value", 1, _F.TYPE_INT64, _REPEATED, packed=True)
    feature = fd.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, kind) in enumerate((("bytes_list", "BytesList"), ("float_list", "FloatList"),
                                           ("int64_list", "Int64List")), start=1):
        _field(feature, name, number, _F.TYPE_MESSAGE, type_name=f".tensorflow.{kind}", oneof=0)
    _map_field(fd.message_type.add(name="Features"), "feature", 1, ".tensorflow.Feature", "tensorflow")
    _field(fd.message_type.add(name="FeatureList"), "feature", 1, _F.TYPE_MESSAGE, _REPEATED, ".tensorflow.Feature")
    _map_field(fd.message_type.add(name="FeatureLists"), "feature_list", 1, ".tensorflow.FeatureList", "tensorflow")
    _field(fd.message_type.add(name="Example"), "features", 1, _F.TYPE_MESSAGE, type_name=".tensorflow.Features")
    seq = fd.message_type.add(name="SequenceExample")
    _field(seq, "context", 1, _F.TYPE_MESSAGE, type_name=".tensorflow.Features")
    _field(seq, "feature_lists", 2, _F.TYPE_MESSAGE, type_name=".tensorflow.FeatureLists")
    return fd


def _caffe_file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="caffe/proto/caffe.proto", package="caffe", syntax="proto2")
    datum = fd.message_type.add(name="Datum")
    for number, name in enumerate(("channels", "height", "width"), start=1):
        _field(datum, name, number, _F.TYPE_INT32)
    _field(datum, "data", 4, _F.TYPE_BYTES)
    _field(datum, "label", 5, _F.TYPE_INT32)
    _field(datum, "float_data", 6, _F.TYPE_FLOAT, _REPEATED)
    _field(datum, "encoded", 7, _F.TYPE_BOOL, default="false")
    return fd


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_tensorflow_file())
_POOL.Add(_caffe_file())


def _cls(full_name: str):
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(full_name))


BytesList = _cls("tensorflow.BytesList")
FloatList = _cls("tensorflow.FloatList")
Int64List = _cls("tensorflow.Int64List")
Feature = _cls("tensorflow.Feature")
Features = _cls("tensorflow.Features")
FeatureList = _cls("tensorflow.FeatureList")
FeatureLists = _cls("tensorflow.FeatureLists")
Example = _cls("tensorflow.Example")
SequenceExample = _cls("tensorflow.SequenceExample")
Datum = _cls("caffe.Datum")

__all__ = ["BytesList", "FloatList", "Int64List", "Feature", "Features", "FeatureList", "FeatureLists", "Example",
           "SequenceExample", "Datum"]
