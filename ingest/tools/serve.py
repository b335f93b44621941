"""`ingest serve SPEC.json` (a Triton Inference Server serving the spec) and `ingest triton-export SPEC.json
REPO_DIR` (the model repository for one's own Triton server). The serving code (`ingest.serve`, and torch) is
imported when a command runs, not when the parser is built."""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import COMMANDS


def _common(p: Any) -> None:
    p.add_argument("spec", metavar="SPEC.json", help="an ops spec, as ingest.ops.dumps writes it")
    p.add_argument("--max-batch-size", type=int, default=64, help="largest dynamic batch (default 64)")
    p.add_argument("--max-queue-delay-us", type=int, default=500,
                   help="how long the dynamic batcher waits to fill a batch, in microseconds (default 500)")
    p.add_argument("--model", metavar="MODULE:CALLABLE", default=None,
                   help="a model run on the preprocessed batch in the same server (output OUTPUT)")
    p.add_argument("--instances", type=int, default=1,
                   help="model instances, each its own backend process running whole batches (default 1)")
    p.add_argument("--output-memory", default="device", choices=("device", "host"),
                   help="where a GPU instance hands its outputs over: device (default; for a GPU consumer such as "
                        "an ensemble's next model) or host (the batch copied to pinned host memory at once)")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve", help=COMMANDS["serve"].help,
        description="Start a Triton Inference Server (the one nvidia-pytriton ships: pip install 'ingest[serve]') "
                    "serving a model that takes ENCODED (one encoded image per request item, UINT8 [-1]) and "
                    "returns IMAGES, the spec's output, with dynamic batching. Runs until interrupted.")
    _common(p)
    p.add_argument("--model-name", default="preprocess", help="the served model's name (default preprocess)")
    p.add_argument("--http-port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (default 8001)")
    p.add_argument("--device", default=None,
                   help="where decode and ops run: cuda:N or cpu (default cuda:0 when CUDA is there, else cpu)")
    p.add_argument("--repository", default=None, metavar="DIR",
                   help="write the model repository here (default: a temporary directory)")
    p.set_defaults(run=run_serve)


def add_export_parser(sub: Any) -> None:
    e = sub.add_parser(
        "triton-export", help=COMMANDS["triton-export"].help,
        description="Write REPO_DIR/NAME/config.pbtxt and REPO_DIR/NAME/1/{model.py,spec.json}: a Triton Python "
                    "backend model (needs ingest installed in the server's Python) that `ingest serve` would run.")
    _common(e)
    e.add_argument("repo", metavar="REPO_DIR", help="the model repository (made if missing)")
    e.add_argument("--name", default="preprocess", help="the model's name (default preprocess)")
    e.add_argument("--kind", default="KIND_AUTO", choices=("KIND_AUTO", "KIND_GPU", "KIND_CPU"),
                   help="Triton instance kind (default KIND_AUTO: a GPU where the server has one)")
    e.set_defaults(run=run_export)


def _spec_text(path: str) -> str:
    from ..ops import loads
    text = Path(path).read_text()
    loads(text)   # refused here, with the spec's own message, not in the server's log
    return text


def _device(device: str | None) -> tuple[str, list[int]]:
    import torch
    if device is None:
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cpu":
        return "KIND_CPU", []
    if dev.type != "cuda":
        raise ConfigError(f"`--device` must be cpu or cuda:N, got {device!r}")
    if not torch.cuda.is_available():
        raise ConfigError(f"`--device {device}` asks for CUDA, which this machine does not have")
    return "KIND_GPU", [dev.index or 0]


def _config(args: Any) -> dict[str, Any]:
    """The model config options both commands take (`ingest.serve.repository.config_text`'s)."""
    return {"max_batch_size": args.max_batch_size, "queue_delay_us": args.max_queue_delay_us, "model": args.model,
            "instances": args.instances, "output_memory": args.output_memory}


def run_export(args: Any) -> int:
    from ..serve import export
    model_dir = export(_spec_text(args.spec), args.repo, name=args.name, kind=args.kind, **_config(args))
    print(f"wrote {model_dir}")
    return 0


def run_serve(args: Any) -> int:
    from ..serve import TritonServer, export, load_model
    from ..serve.server import gpu_options
    kind, gpus = _device(args.device)
    load_model(args.model)   # an unimportable model is refused before the server starts
    repo = args.repository or tempfile.mkdtemp(prefix="ingest-repo-")
    export(_spec_text(args.spec), repo, name=args.model_name, kind=kind, gpus=gpus, **_config(args))
    server = TritonServer(repo, http_port=args.http_port, grpc_port=args.grpc_port, options=gpu_options(gpus))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # a SIGTERM stops the server as Ctrl-C does
    try:
        server.start()
        print(f"serving {args.model_name} ({'GPU ' + str(gpus[0]) if gpus else 'CPU'}) on http://localhost:"
              f"{args.http_port} and grpc localhost:{args.grpc_port}; server log: {server.log}", flush=True)
        server.process.wait()
        print(f"ingest serve: tritonserver exited with status {server.process.returncode}:\n{server.log_tail()}",
              file=sys.stderr)
        return 1
    finally:
        server.stop()
        if args.repository is None:
            shutil.rmtree(repo, ignore_errors=True)
