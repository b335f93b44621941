"""The `ingest` command line: `demo`, the dataset tools `convert`, `index`, `verify` and `inspect`, and `serve` /
`triton-export` (one module each in `ingest.tools`, each adding its parsers with ``add_parser`` and running
with ``run``).

Exit status: 0 done, 1 the data is bad (a corrupt record, the failure budget exceeded, `verify` found
problems), 2 bad arguments or a missing path, 130 interrupted. Errors are one line on stderr, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from .. import __version__
from ..errors import ConfigError, IngestError, SourceError
from . import COMMANDS


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status. Only the module of
    the subcommand named is imported (`COMMANDS` lists the others), so ``--help`` and ``--version`` load no
    torch."""
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)   # the top level takes no option values
    parser = argparse.ArgumentParser(prog="ingest", description="Training data from storage to the GPU.")
    parser.add_argument("--version", action="version", version=f"ingest {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        if name == chosen:
            getattr(importlib.import_module(f".{command.module}", __package__), command.adder)(sub)
        else:
            sub.add_parser(name, help=command.help)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:   # --help, or a usage error (argparse has printed it)
        return exit_.code if isinstance(exit_.code, int) else 2
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(message)s")
    return _run_tool(args)


def _run_tool(args: argparse.Namespace) -> int:
    """Run a subcommand; its errors become one line on stderr and an exit status."""
    try:
        return args.run(args)
    except BrokenPipeError:   # output piped into e.g. `head`, which stopped reading: nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # so exiting flushes nowhere
        return 141
    except (ConfigError, SourceError, FileNotFoundError, NotADirectoryError, IsADirectoryError) as err:
        print(f"ingest {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (IngestError, OSError) as err:
        print(f"ingest {args.command}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ingest {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
