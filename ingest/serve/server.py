"""A Triton Inference Server process: the ``tritonserver`` that the ``nvidia-pytriton`` wheel ships, run on a
model repository (`ingest.serve.repository`) with its Python backend.

Notes
-----
PyTriton's own binding (``Triton.bind``) runs the model in the calling process and moves every tensor
through shared host memory, which would take a GPU batch off the device; here Triton's Python backend runs the
model in its stub process and outputs leave by DLPack. From the wheel this takes: the server binary and its
libraries, the Python backend, and the backend stub built for this Python version. The stub embeds
libpython: it is pointed at this interpreter's shared library (where it has one) and finds this environment's
packages through ``PATH`` and ``PYTHONPATH``, as PyTriton does.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

from ..errors import ConfigError, IngestError


class ServerError(IngestError):
    """The Triton server could not start, or stopped."""


def pytriton_dist() -> tuple[Path, Path]:
    """The ``tritonserver`` directory of the installed ``nvidia-pytriton`` wheel and its libraries' directory
    (a ConfigError naming the ``serve`` extra when it is not installed)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("serving needs nvidia-pytriton: pip install 'ingest[serve]'")
    root = Path(next(iter(spec.submodule_search_locations)))
    return root / "tritonserver", root.parent / "nvidia_pytriton.libs"


def _backends(dist: Path, into: Path) -> Path:
    """A backend directory for the server: the wheel's Python backend with the stub for this Python."""
    python = into / "python"
    python.mkdir(parents=True)
    for item in (dist / "backends" / "python").iterdir():
        if item.is_file():
            (python / item.name).symlink_to(item)
    stub = dist / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}" / "triton_python_backend_stub"
    if not stub.is_file():
        raise ConfigError(f"nvidia-pytriton has no Python backend stub for Python "
                          f"{sys.version_info[0]}.{sys.version_info[1]} (looked for {stub})")
    shutil.copy(stub, python / "triton_python_backend_stub")
    return into


def server_env(libs: Path) -> dict[str, str]:
    """The environment of the server process: its libraries and this interpreter's libpython on the library
    path, this environment's ``bin`` first on ``PATH`` (the stub's Python finds its prefix there) and the
    directory holding ``ingest`` on ``PYTHONPATH``."""
    env = dict(os.environ)
    paths = [str(libs)]
    libdir, library = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    if libdir and library and library.endswith(".so") and (Path(libdir) / library).exists():
        paths.insert(0, libdir)   # the stub was linked against a libpython; this one matches the stdlib
    env["LD_LIBRARY_PATH"] = os.pathsep.join(paths + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    env["PATH"] = os.pathsep.join([str(Path(sys.exec_prefix) / "bin"), env.get("PATH", "")])
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([package_parent] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


#: The CUDA memory pool per GPU a GPU model gets (`gpu_options`): the Python backend hands GPU outputs over
#: through it, and Triton's default, 64 MB, holds about one batch of 64 images of 3 x 224 x 224 float32.
CUDA_POOL_BYTES = 512 << 20


def gpu_options(gpus: Sequence[int]) -> list[str]:
    """The server options a model on ``gpus`` needs: each GPU's CUDA memory pool (`CUDA_POOL_BYTES`)."""
    return [f"--cuda-memory-pool-byte-size={gpu}:{CUDA_POOL_BYTES}" for gpu in gpus]


class TritonServer:
    """``tritonserver`` serving the model repository ``repo`` on ``http_port`` and ``grpc_port`` (metrics off);
    ``options``: more ``tritonserver`` options (`gpu_options` for a GPU model).

    ``start()`` returns once the server reports ready (a ServerError with the end of its log if it exits or
    ``timeout`` passes first); ``stop()`` (or leaving ``with``) stops it and its backend processes, and waits
    for them. ``log`` (a path) receives the server's output; by default a file that lasts while the server runs.
    """

    def __init__(self, repo: str | os.PathLike, *, http_port: int = 8000, grpc_port: int = 8001,
                 log: str | os.PathLike | None = None, verbose: bool = False, options: Sequence[str] = ()):
        self.repo = Path(repo)
        self.options = list(options)
        self.http_port, self.grpc_port = http_port, grpc_port
        self.verbose = verbose
        self._log = Path(log) if log is not None else None
        self._work: Path | None = None   # made when the server starts, removed when it stops
        self.process: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self._log if self._log is not None else self._workdir() / "server.log"

    def _workdir(self) -> Path:
        if self._work is None:
            self._work = Path(tempfile.mkdtemp(prefix="ingest-triton-"))
        return self._work

    def command(self) -> list[str]:
        dist, _ = pytriton_dist()
        backends = self._workdir() / "backends"
        if not backends.exists():
            _backends(dist, backends)
        return [str(dist / "bin" / "tritonserver"), f"--model-repository={self.repo}",
                f"--backend-directory={backends}", f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
                "--allow-metrics=false", "--exit-timeout-secs=5", f"--log-verbose={1 if self.verbose else 0}",
                *self.options]

    def start(self, timeout: float = 120.0) -> "TritonServer":
        _, libs = pytriton_dist()
        command = self.command()
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=server_env(libs),
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.process.poll() is not None:
                message = f"tritonserver exited with status {self.process.returncode}:\n{self.log_tail()}"
                self.stop()
                raise ServerError(message)
            if time.monotonic() > deadline:
                message = f"tritonserver was not ready after {timeout:.0f} s:\n{self.log_tail()}"
                self.stop()
                raise ServerError(message)
            time.sleep(0.2)
        return self

    def ready(self) -> bool:
        """Whether the server answers ready on its HTTP port (every model loaded)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def pids(self) -> list[int]:
        """The server's process and its descendants (the backend stubs)."""
        if self.process is None or self.process.poll() is not None:
            return []
        return process_tree(self.process.pid)

    def rss_bytes(self) -> int:
        """The resident memory of the server and its backend processes together."""
        total = 0
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                pass
        return total

    def log_tail(self, lines: int = 40) -> str:
        if self._log is None and self._work is None:   # stopped: its log went with it
            return ""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server (SIGINT; SIGKILL after ``timeout``) and wait until it and its backend processes
        are gone."""
        pids = self.pids()
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        deadline = time.monotonic() + 10
        for pid in pids[1:]:   # the stubs leave once the server is gone; one that stays is killed
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self._work is not None:   # the backend directory, and the log unless given
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def process_tree(pid: int) -> list[int]:
    """Process ``pid`` and its descendants, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
