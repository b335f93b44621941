"""The `ingest` command line's subcommands (`ingest.tools.cli`), one module each."""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    """A subcommand: the module of `ingest.tools` that adds its parser and runs it, its one-line help, and the
    module's function that adds the parser."""

    module: str
    help: str
    adder: str = "add_parser"


#: Every subcommand by name. The command line lists them from here without importing their modules (which
#: load torch), so ``ingest --help`` stays quick.
COMMANDS = {
    "demo": Command("demo", "make a small JPEG set, run the training pipeline on it, show the speed"),
    "convert": Command("convert", "convert a dataset into another format, in shards, in parallel, resumable"),
    "index": Command("index", "write index files for TFRecord, RecordIO and tar shards"),
    "verify": Command("verify", "check a dataset's framing, CRCs, manifest checksums and indexes (and decoding)"),
    "inspect": Command("dataset_info",
                       "show a dataset's format, record count, fields, labels, image sizes and shards"),
    "serve": Command("serve", "serve a pipeline spec with a Triton Inference Server"),
    "triton-export": Command("serve", "write a Triton model repository for a pipeline spec", "add_export_parser"),
}
