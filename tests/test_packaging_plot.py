"""The picture is the optional extra ``plot`` (matplotlib): ``import rlmoptimizer`` does not load it, compile() and
the report command work without it and say how to get the picture; with it, the picture shows scores on any finite
scale."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import dspy
import pytest
from support.fakes import FunctionLM, scripted_agent
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, task_lm_reply

from rlmoptimizer import RLMDocstringOptimizer
from rlmoptimizer.report.plot import PLOT_EXTRA, draw_run, picture_unavailable, score_limits

ROOT = Path(__file__).resolve().parent.parent

TURNS = [
    {
        "reasoning": "fix",
        "code": f"update_prompt('route', {POLICY_PROMPT!r})\nr = evaluate_program()\nprint(r['score'])",
    },
    {"reasoning": "validate", "code": "v = evaluate_program(split='val')\nprint(float(v['score']))"},
    {"reasoning": "submit", "code": f"SUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})"},
]


def off_scale_metric(example, prediction, trace=None):
    """A score on its own scale: +5 for the right queue, -12 for a wrong one."""
    return 5.0 if example.queue == (prediction.queue or "").strip().lower() else -12.0


def compile_run(directory: Path, metric=off_scale_metric) -> dspy.Module:
    trainset, valset = make_splits()
    return RLMDocstringOptimizer(
        max_iterations=3, root_lm=scripted_agent(TURNS), eval_lm=FunctionLM(task_lm_reply), run_storage_dir=directory
    ).compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)


def test_importing_the_package_does_not_load_matplotlib():
    code = "import sys, rlmoptimizer, rlmoptimizer.report.plot; print(sorted(m for m in sys.modules if m.startswith('matplotlib')))"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_score_axis_follows_the_scores():
    assert score_limits([0.0, 0.5, 1.0]) == score_limits([0.5]) == (-0.08, 1.08)  # the usual scale: all of 0..1
    low, high = score_limits([-3.0, 5.0, 2.0])
    assert low < -3.0 and high > 5.0 and high - low < 10
    low, high = score_limits([120.0, 180.0])  # far from 0..1: the axis does not reach down to 0
    assert 110 < low < 120 and 180 < high < 190
    low, high = score_limits([7.0, 7.0, float("nan"), None])  # one value: still a band around it
    assert low < 7.0 < high


@pytest.mark.slow
def test_the_picture_shows_scores_off_0_1(tmp_path):
    directory = tmp_path / "run"
    optimized = compile_run(directory)
    assert (directory / "run.png").exists()
    axes = draw_run(directory).axes[0]
    low, high = axes.get_ylim()
    marks = [y for collection in axes.collections for _, y in collection.get_offsets()]
    scores = [log["score"] for log in optimized.trial_logs]
    assert min(scores) < 0 and max(scores) > 1  # the run really is off 0..1
    assert marks and all(low < y < high for y in marks)
    assert min(marks) == min(scores) and max(marks) == max(scores)


@pytest.mark.slow
def test_compile_without_matplotlib_works_and_warns_of_nothing(tmp_path, monkeypatch, caplog):
    """The picture is an optional extra: a compile without it wrote a warning on every run, with ``verbose=False``
    too (the report command says how to get the picture)."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] or ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed: importing it raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert picture_unavailable() is not None and PLOT_EXTRA in picture_unavailable()
    directory = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        optimized = compile_run(
            directory,
            metric=lambda example, prediction, trace=None: float(
                example.queue == (prediction.queue or "").strip().lower()
            ),
        )
    assert optimized.route.signature.instructions == POLICY_PROMPT
    assert (directory / "result.json").exists() and not (directory / "run.png").exists()
    assert not [record.getMessage() for record in caplog.records if "picture" in record.getMessage()]


@pytest.mark.slow
def test_the_report_command_without_matplotlib_prints_the_summary_and_says_how_to_get_the_picture(tmp_path):
    """Regression: without matplotlib, ``python -m rlmoptimizer report RUN_DIR`` printed only an error and exited
    with status 2."""
    directory = tmp_path / "run"
    optimized = compile_run(directory)
    (directory / "run.png").unlink()
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"  # as if not installed
        "from rlmoptimizer.__main__ import main\n"
        f"sys.exit(main(['report', {str(directory)!r}]))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "status: finished" in done.stdout and f"returned {optimized.selection['chosen_run_id']}" in done.stdout
    assert f"picture: none, the picture of a run (run.png) needs matplotlib, which is not installed: {PLOT_EXTRA}" in (
        " ".join(done.stdout.split())
    )
    assert not (directory / "run.png").exists()
