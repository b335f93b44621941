"""The executor's stage contract (`ingest.engine.base`): each stage states it, and nothing outside a stage sets
its attributes."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import ingest
from ingest.engine import STAGES, Failures, Pipeline, Stage
from ingest.engine.decode import DecodeStage
from ingest.engine.ops import OpsStage
from ingest.engine.read import ReadStage
from ingest.formats import MemorySource

from conftest import jpeg_bytes

ROOT = Path(ingest.__file__).parent
SECTIONS = ("Takes:", "Returns:", "Owns:", "Stops:")


def check_stage(cls: type) -> None:
    """What every stage states: a `Stage` named in `STAGES`, its own `run`, and the contract's sections in its
    docstring (see `ingest.engine.base`)."""
    assert issubclass(cls, Stage) and cls.name in STAGES, cls
    assert cls.run is not Stage.run, f"{cls.__name__} does not define run"
    doc = inspect.getdoc(cls) or ""
    missing = [s for s in SECTIONS if f"\n{s}" not in doc]
    assert not missing, f"{cls.__name__}'s docstring lacks {missing}"


@pytest.mark.parametrize("cls", [ReadStage, DecodeStage, OpsStage])
def test_each_stage_states_its_contract(cls):
    check_stage(cls)


def test_every_stage_is_checked():
    assert {c.__name__ for c in Stage.__subclasses__()} == {"ReadStage", "DecodeStage", "OpsStage"}


def test_check_stage_fails_on_a_stage_without_its_sections():
    class Quiet(Stage):
        """Does something."""
        name = "read"

        def run(self, item):
            return item

    with pytest.raises(AssertionError, match=r"lacks \['Takes:', 'Returns:', 'Owns:', 'Stops:'\]"):
        check_stage(Quiet)


def test_a_pipeline_runs_its_stages_in_order_and_counts_each():
    pipe = Pipeline(MemorySource([jpeg_bytes(8, 8)] * 3, labels=[0, 1, 2]), num_threads=1)
    try:
        assert [s.name for s in pipe.stages] == list(STAGES)
        assert pipe.stage_stats == [s.stats for s in pipe.stages]
    finally:
        pipe.close()


def test_a_pipeline_is_changed_through_its_methods_not_its_attributes():
    pipe = Pipeline(MemorySource([jpeg_bytes(8, 8)] * 2, labels=[0, 1]), num_threads=1)
    try:
        budget = Failures(3, 0)
        pipe.start_epoch(budget)
        pipe.deliver(None, with_fields=False)
        assert pipe.failures is budget and pipe.with_fields is False and pipe.consumer_stream is None
        for name, value in [("failures", budget), ("with_fields", True), ("consumer_stream", None),
                            ("lanes", []), ("reader", None)]:
            with pytest.raises(AttributeError):
                setattr(pipe, name, value)
    finally:
        pipe.close()


def _outside_sets(tree: ast.AST) -> list[tuple[int, str]]:
    """Assignments to an attribute of a pipeline or a stage reached from outside it: ``pipeline.x = ...``,
    ``self.pipeline.x = ...``, ``self.read_stage.x = ...`` and the like."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for attr in ast.walk(t):
                if not isinstance(attr, ast.Attribute) or not isinstance(attr.ctx, ast.Store):
                    continue
                owner = attr.value
                name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) \
                    else ""
                if name in ("pipeline", "pipe", "_pipeline") or name.endswith("_stage") or name == "outputs":
                    found.append((attr.lineno, ast.unparse(attr)))
    return found


def test_nothing_outside_a_stage_sets_its_attributes():
    bad = [f"{path.relative_to(ROOT.parent)}:{line}: {target}" for path in sorted(ROOT.rglob("*.py"))
           for line, target in _outside_sets(ast.parse(path.read_text()))]
    assert bad == []


def test_the_attribute_check_finds_an_outside_set():
    code = "def f(loader, p):\n    loader.pipeline.failures = 1\n    self.ops_stage.with_fields = False\n" \
           "    p.read_stage.x += 1\n    work.failures = 2\n"
    assert _outside_sets(ast.parse(code)) == [(2, "loader.pipeline.failures"), (3, "self.ops_stage.with_fields"),
                                              (4, "p.read_stage.x")]
