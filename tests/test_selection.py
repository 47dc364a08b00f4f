"""Never worse, as a pure policy over runs: the submission only when it beats the unchanged program."""

from __future__ import annotations

from rlmoptimizer.records import EvalRun, ExampleResult
from rlmoptimizer.selection import never_worse

INITIAL = {"step": "old"}


def run(run_id: str, label: str, instructions: dict[str, str], scores: list[float]) -> EvalRun:
    records = tuple(ExampleResult(i, {}, {}, {}, s, s >= 1.0) for i, s in enumerate(scores))
    return EvalRun(run_id, "val", label, instructions, records, len(scores), 0, 0)


def test_a_better_submission_is_chosen_with_the_reason_and_every_candidate():
    baseline = run("run-0001", "baseline", INITIAL, [1, 0])
    submitted = run("run-0002", "submission", {"step": "new"}, [1, 1])
    selection = never_worse(
        split="val",
        complete=[baseline, submitted],
        submitted_run=submitted,
        submission={"step": "new"},
        initial=INITIAL,
    )
    assert selection.instructions == {"step": "new"} and selection.chosen_run_id == "run-0002"
    assert selection.baseline_score == 0.5 and "more than the unchanged program" in selection.reason
    assert [c["run_id"] for c in selection.to_dict()["candidates"]] == ["run-0001", "run-0002"]
    assert "instructions" not in selection.to_dict()
    assert selection.to_dict()["basis"] == "submission"


def test_a_tie_with_the_unchanged_program_returns_the_unchanged_instructions():
    baseline = run("run-0001", "baseline", INITIAL, [1, 0])
    submitted = run("run-0002", "submission", {"step": "new"}, [0, 1])
    selection = never_worse(
        split="val",
        complete=[baseline, submitted],
        submitted_run=submitted,
        submission={"step": "new"},
        initial=INITIAL,
    )
    assert selection.instructions == INITIAL and "the same as the unchanged program" in selection.reason
    assert selection.basis == "unchanged"


def test_a_worse_submission_loses_to_the_best_other_candidate():
    baseline = run("run-0001", "baseline", INITIAL, [0, 0])
    checkpoint = run("run-0002", "agent", {"step": "mid"}, [1, 1])
    submitted = run("run-0003", "submission", {"step": "new"}, [1, 0])
    selection = never_worse(
        split="val",
        complete=[baseline, checkpoint, submitted],
        submitted_run=submitted,
        submission={"step": "new"},
        initial=INITIAL,
    )
    assert selection.instructions == {"step": "mid"} and "returning that candidate instead" in selection.reason
    assert selection.basis == "other candidate"
