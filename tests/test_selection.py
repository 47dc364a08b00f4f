"""Never worse, as a pure policy over runs: the submission only when it beats the unchanged program."""

from __future__ import annotations

from dataclasses import replace

import dspy
import pytest

from rlmoptimizer.errors import ConfigurationError
from rlmoptimizer.optimizer import RLMDocstringOptimizer
from rlmoptimizer.records import EvalRun, ExampleResult
from rlmoptimizer.selection import confirmed_differences, never_worse, small_split_note

INITIAL = {"step": "old"}


def run(run_id: str, label: str, instructions: dict[str, str], scores: list[float]) -> EvalRun:
    records = tuple(ExampleResult(i, {}, {}, {}, s, s >= 1.0) for i, s in enumerate(scores))
    return EvalRun(run_id, "val", label, instructions, records, len(scores), 0, 0)


def against_baseline(baseline: EvalRun, submitted: EvalRun, **kwargs):
    """``never_worse`` over the unchanged program's run and a submission of ``{"step": "new"}`` on its split."""
    return never_worse(
        split=submitted.split,
        complete=[baseline, submitted],
        submitted_run=submitted,
        submission={"step": "new"},
        initial=INITIAL,
        **kwargs,
    )


def test_a_better_submission_is_chosen_with_the_reason_and_every_candidate():
    baseline = run("run-0001", "baseline", INITIAL, [1, 0, 0, 0])
    submitted = run("run-0002", "submission", {"step": "new"}, [1, 1, 1, 1])
    selection = against_baseline(baseline, submitted)
    assert selection.instructions == {"step": "new"} and selection.chosen_run_id == "run-0002"
    assert selection.baseline_score == 0.25 and "more than the unchanged program" in selection.reason
    assert [c["run_id"] for c in selection.to_dict()["candidates"]] == ["run-0001", "run-0002"]
    assert "instructions" not in selection.to_dict()
    assert selection.to_dict()["basis"] == "submission"


def test_a_tie_with_the_unchanged_program_returns_the_unchanged_instructions():
    baseline = run("run-0001", "baseline", INITIAL, [1, 0])
    submitted = run("run-0002", "submission", {"step": "new"}, [0, 1])
    selection = against_baseline(baseline, submitted)
    assert selection.instructions == INITIAL and "the same as the unchanged program" in selection.reason
    assert selection.basis == "unchanged"


def test_a_worse_submission_loses_to_the_best_other_candidate():
    baseline = run("run-0001", "baseline", INITIAL, [0, 0, 0, 0])
    checkpoint = run("run-0002", "agent", {"step": "mid"}, [1, 1, 1, 1])
    submitted = run("run-0003", "submission", {"step": "new"}, [1, 1, 1, 0])
    selection = never_worse(
        split="val",
        complete=[baseline, checkpoint, submitted],
        submitted_run=submitted,
        submission={"step": "new"},
        initial=INITIAL,
    )
    assert selection.instructions == {"step": "mid"} and "returning that candidate instead" in selection.reason
    assert selection.basis == "other candidate"


def test_a_gain_one_example_could_undo_returns_the_unchanged_program_and_says_why():
    baseline = run("run-0001", "baseline", INITIAL, [1, 0, 0, 0, 1, 1])
    submitted = run("run-0002", "submission", {"step": "new"}, [1, 1, 1, 0, 1, 1])  # 2 wins, 0 losses
    selection = against_baseline(baseline, submitted)
    assert selection.instructions == INITIAL and selection.basis == "unchanged"
    assert "won 2 and lost 0 of 6 val examples: a gain one example could undo" in selection.reason


def test_a_higher_score_without_a_clear_gain_is_passed_over_for_one_with_it():
    baseline = run("run-0001", "baseline", INITIAL, [0, 0, 0, 0, 0, 1])
    clear = run("run-0002", "agent", {"step": "mid"}, [1, 1, 1, 0, 0, 1])  # 3 wins
    lucky = run("run-0003", "submission", {"step": "new"}, [1, 1, 1, 1, 1, 0])  # 5 wins, 1 loss: also clear
    narrow = run("run-0004", "agent", {"step": "narrow"}, [1, 1, 1, 1, 1, 1])  # 5 wins: the best, clear
    for best, runs in [("narrow", [baseline, clear, lucky, narrow]), ("mid", [baseline, clear])]:
        selection = never_worse(
            split="val", complete=runs, submitted_run=runs[-1], submission=runs[-1].instructions, initial=INITIAL
        )
        assert selection.instructions == {"step": best}
    ahead = run("run-0005", "submission", {"step": "u"}, [1, 1, 1, 1, 0, 0])  # 4 wins, 1 loss: net 3
    assert never_worse(
        split="val", complete=[baseline, ahead], submitted_run=ahead, submission=ahead.instructions, initial=INITIAL
    ).instructions == {"step": "u"}
    edge = run("run-0006", "submission", {"step": "e"}, [1, 1, 1, 0, 0, 0])  # 3 wins, 1 loss: one flip undoes it
    chosen = never_worse(
        split="val",
        complete=[baseline, clear, edge],
        submitted_run=edge,
        submission=edge.instructions,
        initial=INITIAL,
    )
    assert chosen.instructions == {"step": "mid"}  # edge ties mid's score; mid is clear, edge is not


def test_graded_scores_need_a_gain_that_survives_the_largest_single_gain_turned_into_a_loss():
    from rlmoptimizer.selection import clear_gain

    assert not clear_gain([])
    assert not clear_gain([0.9, 0.05, 0.05])  # one example carries it: 1.0 - 1.8 < 0
    assert clear_gain([0.5, 0.5, 0.5])  # 1.5 - 1.0 > 0
    assert not clear_gain([1, 1, -1, 0])  # net 1
    assert clear_gain([1, 1, 1, 0])


def test_a_small_selection_split_is_named_with_the_gain_it_takes():
    note = small_split_note(12, 100)
    assert "validation set" in note and "12 examples" in note and "at least 3" in note
    assert "train set (no valset)" in small_split_note(0, 20)
    assert small_split_note(30, 5) is None
    assert small_split_note(0, 40) is None


def test_max_demos_is_checked_when_the_optimizer_is_made():
    for bad in (-1, 17, True, 2.0):
        with pytest.raises(ConfigurationError, match=r"max_demos must be an int from 0 to 16 .*, got"):
            RLMDocstringOptimizer(rlm_autopilot="loop", sub_lm=dspy.utils.DummyLM([]), max_demos=bad)
    assert RLMDocstringOptimizer(rlm_autopilot="loop", sub_lm=dspy.utils.DummyLM([]), max_demos=16).max_demos == 16


def train_run(run_id: str, label: str, instructions: dict[str, str], scores: dict[int, float]) -> EvalRun:
    records = tuple(ExampleResult(i, {}, {}, {}, s, s >= 1.0) for i, s in scores.items())
    return EvalRun(run_id, "train", label, instructions, records, len(scores), 0, 0)


def test_fresh_train_examples_count_only_when_a_confirmation_made_the_first_record_of_them():
    new = {"step": "new"}
    chosen_on = train_run("run-0003", "compare", new, {0: 1, 1: 1})  # the comparison it won: never evidence
    unchanged = train_run("run-0004", "compare", INITIAL, {0: 0, 1: 0, 2: 0, 3: 1, 4: 0})
    confirmed = train_run("run-0005", "confirm", new, {1: 1, 2: 1, 3: 0, 4: 1, 5: 1})  # 1 was seen; 5 has no pair
    runs = [chosen_on, unchanged, confirmed]
    assert confirmed_differences(runs, new, INITIAL) == [1.0, -1.0, 1.0]  # ids 2, 3, 4
    assert confirmed_differences(runs, INITIAL, INITIAL) == []
    assert confirmed_differences([chosen_on, unchanged], new, INITIAL) == []


@pytest.mark.parametrize(("fresh", "returned"), [({2: 1, 3: 1, 4: 0}, "new"), ({2: 0, 3: 1, 4: 0}, "old")])
def test_a_lead_on_validation_that_is_not_clear_is_returned_only_when_fresh_train_examples_confirm_it(fresh, returned):
    baseline = run("run-0001", "baseline", INITIAL, [1, 0, 0, 0, 1, 1])
    submitted = run("run-0002", "submission", {"step": "new"}, [1, 1, 1, 0, 1, 1])  # 2 wins, 0 losses: unclear
    train = [
        train_run("run-0003", "compare", INITIAL, {2: 0, 3: 0, 4: 1}),
        train_run("run-0004", "confirm", {"step": "new"}, fresh),
    ]
    selection = against_baseline(baseline, submitted, train_runs=train)
    assert selection.instructions == {"step": returned}
    if returned == "new":  # 2 + 2 - 1 = 3 net: clear, and the reason says what it won on
        assert (
            "a clear gain: it won 2 and lost 0 of 6 val examples, won 2 and lost 1 of 3 fresh train" in selection.reason
        )
    else:
        assert "won 2 and lost 0 of 6 val examples, won 1 and lost 1 of 3 fresh train examples" in selection.reason


def test_an_lm_call_that_failed_without_an_answer_is_no_evidence_either_way():
    failed = ExampleResult(2, {}, {}, {}, 0.0, False, error="timeout", error_kind="lm_call")
    baseline_records = (*run("x", "", INITIAL, [0, 1]).records, failed)
    baseline = EvalRun("run-0001", "val", "baseline", INITIAL, baseline_records, 3, 0, 0)
    submitted = run("run-0002", "submission", {"step": "new"}, [1, 1, 1])  # its win on 2 is against no answer
    selection = against_baseline(baseline, submitted)
    assert "won 1 and lost 0 of 2 val examples" in selection.reason


def test_without_a_valset_a_confirmation_adds_nothing_to_the_train_split_that_selects():
    baseline = train_run("run-0001", "baseline", INITIAL, {0: 1, 1: 0, 2: 0, 3: 1, 4: 1})
    submitted = train_run("run-0002", "submission", {"step": "new"}, {0: 1, 1: 1, 2: 1, 3: 1, 4: 1})
    confirm = train_run("run-0003", "confirm", {"step": "new"}, {5: 1})
    selection = against_baseline(baseline, submitted, train_runs=[baseline, submitted, confirm])
    assert selection.instructions == INITIAL and "won 2 and lost 0 of 5 train examples" in selection.reason
    assert "confirm_gain" not in selection.reason  # train selects: there is nothing fresh to add


def test_on_train_the_examples_a_candidate_holds_as_demos_are_no_evidence_for_it():
    """With no valset the choice is made on train, where a demo answers its own example: the examples either
    program holds as demos are left out of the comparison."""
    baseline = replace(run("run-0001", "baseline", INITIAL, [0, 0, 0, 0, 1, 1]), split="train")
    submitted = replace(run("run-0002", "submission", {"step": "new"}, [1, 1, 1, 1, 1, 1]), split="train")
    assert against_baseline(baseline, submitted).basis == "submission"  # 4 won, 0 lost

    def own_demos(instructions):
        return {0, 1, 2, 3} if instructions == {"step": "new"} else {5}

    selection = against_baseline(baseline, submitted, own_demos=own_demos)
    assert selection.basis == "unchanged" and "won 0 and lost 0 of 1 train examples" in selection.reason
    # on validation, demos are train examples: nothing is left out
    on_val = against_baseline(replace(baseline, split="val"), replace(submitted, split="val"), own_demos=own_demos)
    assert on_val.basis == "submission"
