"""Settings, as they are checked, stored and logged.

Regressions: ``rlm_autopilot="false"`` was taken as True through ``bool()`` (only ``use_mlflow`` was checked
strictly); a run directory finished under ``max_iterations`` whose unit count equalled a later
``max_metric_calls`` request was returned silently as if run that way; MLflow params left out
``max_metric_calls``, ``max_cost_usd``, ``root_context_window`` and ``rlm_autopilot``, and dropped
``max_iterations`` when it was None."""

from __future__ import annotations

import importlib
import inspect
import json
import os

import pytest
from support.fakes import FunctionLM, scripted_agent
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import ConfigurationError, RLMDocstringOptimizer, RunDirectoryMismatchError

FLAGS = (
    "root_stateful_session",
    "rlm_multiturn_history",
    "verbose",
    "allow_eval_lm_change",
    "allow_program_change",
    "use_mlflow",
)
TURNS = [
    {
        "reasoning": "fix",
        "code": f"update_prompt('route', {POLICY_PROMPT!r})\nprint(evaluate_program(split='val')['score'])",
    },
    {"reasoning": "submit", "code": f"SUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})"},
]


def test_every_boolean_argument_is_and_stays_a_bool():
    flags = [
        name
        for name, p in inspect.signature(RLMDocstringOptimizer.__init__).parameters.items()
        if p.default is True or p.default is False
    ]
    assert sorted(flags) == sorted(FLAGS)  # a new flag is added to this test
    root = FunctionLM(lambda m: "x")
    for name in FLAGS:
        for wrong in ("false", "True", 0, 1, None):
            with pytest.raises(ConfigurationError, match=f"{name} must be True or False"):
                RLMDocstringOptimizer(root_lm=root, **{name: wrong})
    # rlm_autopilot takes a mode, or True/False for "assist"/"off"; nothing that only looks like one
    for wrong in ("false", "True", 0, 1, None, "Loop"):
        with pytest.raises(ConfigurationError, match="rlm_autopilot must be 'off'"):
            RLMDocstringOptimizer(root_lm=root, rlm_autopilot=wrong)
    assert RLMDocstringOptimizer(root_lm=root, rlm_autopilot=False).rlm_autopilot == "off"
    assert not root.calls


@pytest.mark.slow
def test_a_directory_keeps_its_budget_mode_and_a_change_is_refused_naming_the_argument(tmp_path):
    trainset, valset = make_splits()
    task = FunctionLM(task_lm_reply)

    def compile_with(**budget):
        root = scripted_agent(TURNS)
        optimizer = RLMDocstringOptimizer(root_lm=root, eval_lm=task, run_storage_dir=tmp_path, **budget)
        return root, optimizer.compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)

    _, finished = compile_with(max_iterations=2)
    assert json.loads((tmp_path / "manifest.json").read_text())["budget_mode"] == {"max_iterations": 2}
    units = finished.budget["limit"]
    calls = len(task.calls)

    # the same number of units asked as metric calls (the baselines counted): not the run stored here
    same_units = units + len(trainset) + len(valset)
    root = scripted_agent(TURNS)
    with pytest.raises(RunDirectoryMismatchError) as refused:
        RLMDocstringOptimizer(
            root_lm=root, eval_lm=task, run_storage_dir=tmp_path, max_metric_calls=same_units
        ).compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)
    message = str(refused.value)
    assert "a run of a different budget;" in message and f"max_metric_calls={same_units}" in message
    assert "pass max_iterations=2 instead" in message
    assert not root.calls and len(task.calls) == calls  # refused before any LM call

    # the mode it was run with reads it back, as before
    _, again = compile_with(max_iterations=2)
    assert again.selection == finished.selection and len(task.calls) == calls


@pytest.mark.slow
def test_mlflow_params_hold_every_setting_that_shapes_a_run(tmp_path):
    mlflow = importlib.import_module("mlflow") if os.environ.get("CI") else pytest.importorskip("mlflow")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        experiment = mlflow.create_experiment("holds", artifact_location=(tmp_path / "artifacts").as_uri())
        mlflow.set_experiment(experiment_id=experiment)
        trainset, valset = make_splits()
        RLMDocstringOptimizer(
            max_metric_calls=60,
            root_lm=scripted_agent(TURNS, name="scripted-agent"),
            eval_lm=FunctionLM(task_lm_reply),
            run_storage_dir=tmp_path / "run",
            use_mlflow=True,
            max_cost_usd=5.0,
            root_context_window=64_000,
            rlm_autopilot=False,
            metric_id="queue-match",
        ).compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)
        [logged] = mlflow.MlflowClient().search_runs([experiment])
    finally:
        mlflow.set_tracking_uri(previous)

    params = logged.data.params
    assert params["max_metric_calls"] == "60" and params["max_iterations"] == "None"
    assert params["budget_mode"] == "max_metric_calls"
    assert params["max_cost_usd"] == "5.0" and params["root_context_window"] == "64000"
    assert params["rlm_autopilot"] == "off" and params["metric_id"] == "queue-match"
    # every constructor argument is there, but the objects logged as what the run uses and the display switches
    shown_elsewhere = {"root_lm", "sub_lm", "eval_lm", "metric", "run_storage_dir", "console", "verbose", "use_mlflow"}
    # (dspy.GEPA's names are logged as the settings of ours they stand for)
    signature = inspect.signature(RLMDocstringOptimizer.__init__).parameters.values()
    arguments = {p.name for p in signature if p.kind is not inspect.Parameter.VAR_KEYWORD} - {"self"}
    assert arguments - shown_elsewhere <= set(params)
    assert {"root_lm", "eval_lm", "run_storage_dir", "metric"} <= set(params)


def test_a_console_or_directory_of_the_wrong_kind_is_refused_when_constructed():
    root = FunctionLM(lambda m: "x")
    for wrong in ("x", 5, object()):
        with pytest.raises(ConfigurationError, match="console must be a rich.console.Console"):
            RLMDocstringOptimizer(root_lm=root, console=wrong, verbose=True)
    for name in ("run_storage_dir", "log_dir"):
        for wrong in (5, ["runs"], "  "):
            with pytest.raises(ConfigurationError, match=f"{'run_storage_dir'} must be a directory path"):
                RLMDocstringOptimizer(root_lm=root, **{name: wrong})
    assert not root.calls


def test_a_compile_stopped_during_its_setup_gives_its_run_directory_up(tmp_path, monkeypatch):
    """Regression: a Ctrl-C while the first compile loaded litellm (inside the cost estimate, after the directory
    was taken) kept the directory, and running the cell again was refused as "in use by another compile()"."""
    import rlmoptimizer.flow as flow_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    trainset, valset = make_splits()
    loop = {
        "rlm_autopilot": "loop",
        "eval_lm": FunctionLM(task_lm_reply),
        "run_storage_dir": tmp_path,
        "sub_lm": FunctionLM(lambda m: "x"),
    }
    with monkeypatch.context() as patched:
        patched.setattr(flow_module, "estimate_at_start", interrupted)
        with pytest.raises(KeyboardInterrupt):
            RLMDocstringOptimizer(max_iterations=1, **loop).compile(
                student=RouteTicket(), trainset=trainset, metric=metric, valset=valset
            )
    result = RLMDocstringOptimizer(max_iterations=1, **loop).compile(
        student=RouteTicket(), trainset=trainset, metric=metric, valset=valset
    )
    assert result.route.signature.instructions  # the same directory, compiled in the same process
