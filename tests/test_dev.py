"""Every developer probe in dev/ still imports against this tree (a probe whose ingest internals moved fails
here, not on the next person's GPU machine), and dev/README.md says what each one is for."""

import importlib.util
import sys
from pathlib import Path

import pytest

DEV = Path(__file__).resolve().parents[1] / "dev"
SCRIPTS = sorted(DEV.glob("*.py"))
#: Third-party packages a cross-check runs under (another Python's), not installed with ingest.
FOREIGN = {"mxnet", "tensorflow"}


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_probe_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(DEV))
    monkeypatch.setattr(sys, "argv", [str(script)])
    spec = importlib.util.spec_from_file_location(f"dev_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)   # definitions only: each runs its work under ``__main__``
    except ModuleNotFoundError as err:
        if err.name not in FOREIGN:
            raise
        pytest.skip(f"needs {err.name}")
    assert module.__doc__, f"{script.name} says what it measures"


def test_every_probe_has_a_readme_line():
    readme = (DEV / "README.md").read_text()
    assert SCRIPTS
    for script in SCRIPTS:
        assert f"| `{script.name}` |" in readme, script.name
