"""The `ingest` command line: `ingest demo` (more subcommands arrive with the converter)."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ingest", description="Training data from storage to the GPU.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="make a small JPEG set, run the training pipeline on it, show the speed")
    demo.add_argument("--out", default=".", help="where to write the PNG grid(s) (default: .)")
    demo.add_argument("--per-class", type=int, default=24, help="images per class (4 classes)")
    demo.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    demo.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if args.command == "demo":
        from .demo import print_table, run
        devices = None if args.device == "auto" else (args.device,)
        rows = run(args.out, per_class=args.per_class, devices=devices)
        print_table(rows)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
