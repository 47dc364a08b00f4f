"""What the report reads of a compile() while it runs (``CompileState``): the optimizer's compile holds every
attribute of it, and the MLflow parameters are read from exactly those."""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import dspy
import pytest
from support.fakes import FunctionLM

from rlmoptimizer import RLMDocstringOptimizer
from rlmoptimizer.flow import Compile
from rlmoptimizer.metric import Metric
from rlmoptimizer.report import CompileState, tracked
from rlmoptimizer.report.compile_state import compile_params
from rlmoptimizer.usage import UsageMeter

FLOW = Path(inspect.getfile(Compile))


def members(protocol: type) -> set[str]:
    return {name for name, value in vars(protocol).items() if isinstance(value, property)}


def attributes_set_on_self(class_name: str) -> set[str]:
    """The ``self.name = ...`` assignments in any method of ``class_name`` in the optimizer's module."""
    [cls] = [
        node
        for node in ast.walk(ast.parse(FLOW.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and node.name == class_name
    ]
    found = set()
    for node in ast.walk(cls):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == "self":
                    found.add(part.attr)
    return found


def test_the_optimizers_compile_holds_every_attribute_the_report_reads():
    wanted = members(CompileState)
    assert {"directory", "student", "tracker", "read_back", "usage", "metric", "budget_limit"} <= wanted
    assert wanted - attributes_set_on_self("Compile") == set()
    assert Metric(lambda example, prediction: 1.0, metric_id="exact").identity == "exact"


@dataclass
class State:
    """A CompileState of plain values."""

    directory: Path
    student: dspy.Module = field(default_factory=lambda: dspy.Predict("q -> a"))
    tracker: None = None
    read_back: bool = False
    usage: UsageMeter = field(default_factory=UsageMeter)
    budget_limit: int = 40
    trainset: list = field(default_factory=lambda: [dspy.Example(q="1", a="1").with_inputs("q")] * 3)
    valset: list = field(default_factory=list)
    root_lm: dspy.BaseLM | None = field(default_factory=lambda: FunctionLM(lambda m: "", name="root-model"))
    sub_lm: dspy.BaseLM | None = None
    eval_lm: dspy.BaseLM | None = field(default_factory=lambda: FunctionLM(lambda m: "", name="task-model"))
    metric: Metric = field(default_factory=lambda: Metric(lambda example, prediction: 1.0, metric_id="exact"))


def test_the_mlflow_parameters_of_a_compile_are_read_from_its_state(tmp_path):
    state: CompileState = State(tmp_path)
    optimizer = RLMDocstringOptimizer(root_lm=state.root_lm, max_metric_calls=40)
    params = compile_params(optimizer, state)
    assert params["budget_limit"] == 40 and params["budget_mode"] == "max_metric_calls"
    assert (params["trainset_size"], params["valset_size"]) == (3, 0)
    assert (params["root_lm"], params["sub_lm"], params["eval_lm"]) == ("root-model", None, "task-model")
    assert params["metric"] == "exact" and params["run_storage_dir"] == str(tmp_path)
    assert params["max_iterations"] == "None" and "root_lm" not in {k for k, v in params.items() if v is None}


def test_a_finished_run_read_back_opens_no_mlflow_run(tmp_path):
    pytest.importorskip("mlflow")
    from rlmoptimizer.report.tracking import MlflowTracker

    tracker = MlflowTracker()
    state = State(tmp_path, read_back=True)
    with tracked(tracker, object(), state):
        pass
    assert tracker.run_id is None and tracker.cost_source is None
