"""verbose=True shows one live progress display per evaluation: updated in place in Jupyter and in a terminal,
and only the summary line of each run where nothing can be redrawn (a log file, CI output)."""

from __future__ import annotations

import io
import threading

import pytest
from rich.console import Console

from rlmoptimizer.display import EvaluationProgress, summary_line


def summary(run_id: str, split: str, passed: int, total: int) -> dict:
    return {
        "run_id": run_id,
        "label": "agent",
        "split": split,
        "score": passed / total,
        "passed_count": passed,
        "evaluated_count": total,
        "budget_left": 7,
    }


def evaluate(progress: EvaluationProgress, run_id: str, split: str, total: int) -> None:
    """An evaluation as the evaluator reports it: examples completing on several threads."""
    progress.started(split, "agent", total)
    threads = [threading.Thread(target=progress.example_done, args=(i % 2 == 0,)) for i in range(total)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    progress.finished(summary(run_id, split, (total + 1) // 2, total))


def test_in_a_log_file_each_evaluation_is_one_summary_line():
    out = io.StringIO()
    progress = EvaluationProgress(Console(file=out, width=200))
    assert progress.mode == "plain"
    evaluate(progress, "run-0003", "train", 25)
    evaluate(progress, "run-0004", "val", 8)
    assert out.getvalue().splitlines() == [
        summary_line(summary("run-0003", "train", 13, 25)),
        summary_line(summary("run-0004", "val", 4, 8)),
    ]


def test_in_a_terminal_the_progress_line_is_redrawn_then_replaced_by_the_summary():
    out = io.StringIO()
    progress = EvaluationProgress(Console(file=out, width=200, force_terminal=True, color_system=None))
    assert progress.mode == "terminal"
    evaluate(progress, "run-0003", "train", 25)
    text = out.getvalue()
    assert "evaluating agent on train" in text and "25/25 (13 passed)" in text
    assert text.count(summary_line(summary("run-0003", "train", 13, 25))) == 1
    assert "\x1b[" in text  # drawn with cursor control (redrawn in place), not appended line by line
    # the summary line comes after the live line was erased
    assert text.rstrip().endswith(summary_line(summary("run-0003", "train", 13, 25)))


def test_in_jupyter_each_evaluation_is_one_output_updated_in_place():
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    InteractiveShell.instance()
    progress = EvaluationProgress(Console(force_jupyter=True, width=120))
    assert progress.mode == "jupyter"
    with capture_output() as captured:
        evaluate(progress, "run-0003", "train", 25)
        evaluate(progress, "run-0004", "val", 8)
    new = [o for o in captured.outputs if not o.update]
    assert len(new) == 2  # one output item per evaluation, however many examples
    for item, (run_id, split, total) in zip(new, [("run-0003", "train", 25), ("run-0004", "val", 8)], strict=True):
        display_id = item.transient["display_id"]
        updates = [o for o in captured.outputs if o.update and o.transient.get("display_id") == display_id]
        # updated in place: the last example is always drawn, then the line becomes the run's summary
        assert f"{total}/{total} ({(total + 1) // 2} passed)" in updates[-2].data["text/plain"]
        assert updates[-1].data["text/plain"] == summary_line(summary(run_id, split, (total + 1) // 2, total))
    assert captured.stdout == ""
