"""``max_metric_calls``: a budget counted as dspy.GEPA counts it, every run of the program on one example
(the baselines and the final validation check included), never exceeded; the train baseline paid only when read;
a submission the rest cannot check is not returned unchecked."""

from __future__ import annotations

import pytest
from support.fakes import FunctionLM, scripted_agent
from support.metrics import CountingMetric
from support.optimizing import ORIGINAL_ROUTE, compile_tickets
from support.tickets import POLICY_PROMPT, task_lm_reply

from rlmoptimizer import RLMDocstringOptimizer
from rlmoptimizer.errors import ConfigurationError

pytestmark = pytest.mark.slow

SUBMIT = "SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"


def compile_with(codes, max_metric_calls, **kwargs):
    counting = CountingMetric()  # on 12 train and 8 validation examples
    root = scripted_agent([{"reasoning": "step", "code": code} for code in codes])
    result = compile_tickets(root, max_metric_calls=max_metric_calls, metric=counting, **kwargs)
    return result, counting.calls, root


def test_every_run_counts_and_a_checked_submission_is_returned():
    result, calls, root = compile_with(
        [
            f"print(update_prompt('route', {POLICY_PROMPT!r})['version'])",
            "print(evaluate_program(split='val')['score'])",
            SUBMIT,
        ],
        max_metric_calls=40,
    )
    assert result.budget["limit"] == 40 - 8  # what the validation baseline leaves
    assert calls == 8 + 8  # the validation baseline and one validation run; the submission was already checked
    assert result.route.signature.instructions == POLICY_PROMPT
    assert "max_metric_calls=40, every run of the program counts" in str(root.calls[0])


def test_a_submission_the_rest_cannot_check_is_not_returned_and_the_limit_holds():
    result, calls, _ = compile_with(
        [
            f"print(update_prompt('route', {POLICY_PROMPT!r})['version'])",
            "print(evaluate_program()['score'])",
            "print(update_prompt('route', 'Route it.')['version'])",
            "print(evaluate_program(limit=12)['evaluated_count'])",  # only 8 fit
            SUBMIT,
        ],
        max_metric_calls=28,
    )
    assert calls == 28  # 8 for the validation baseline, 12 + 8 by the agent; no free check after that
    assert result.budget["left"] == 0
    # the submission ('Route it.') was never checked on validation: the best checked candidate is the baseline
    assert result.route.signature.instructions == ORIGINAL_ROUTE
    assert "max_metric_calls left too few calls" in result.selection["reason"]
    assert result.selection["basis"] == "best checked" and result.selection["spending_cap_reached"] is False


def test_max_metric_calls_is_checked_before_any_lm_call():
    with pytest.raises(ConfigurationError, match=r"pass one budget .* you set max_metric_calls=80, max_iterations=3"):
        RLMDocstringOptimizer(max_iterations=3, max_metric_calls=80, root_lm=FunctionLM(lambda m: {}))
    with pytest.raises(ConfigurationError, match="max_metric_calls must be an int >= 1, got 0"):
        RLMDocstringOptimizer(max_metric_calls=0, root_lm=FunctionLM(lambda m: {}))
    root, task = FunctionLM(lambda m: {}), FunctionLM(task_lm_reply)
    with pytest.raises(
        ConfigurationError,
        match=r"max_metric_calls=15 does not cover .* \(8 validation examples\) and one check .* "
        r"pass max_metric_calls >= 16",
    ):
        compile_tickets(root, eval_lm=task, max_metric_calls=15)
    assert root.calls == [] and task.calls == []


def test_sub_lm_prompts_are_not_metric_calls_and_have_an_allowance_of_their_own():
    result, calls, root = compile_with(
        [
            "print('answers', len(llm_query_batched(['why?'] * 5)))",
            "s = optimization_status()\nprint('left', s['budget_left'], 'sub', s['budget_spent_by_kind']['sub_lm_call'],"
            " s['sub_lm_left'])",
            "print(llm_query_batched(['again?'] * 16))",  # 15 of the 20 allowed are left: refused, nothing charged
            "update_prompt('route', 'Route it.')\nprint('evaluated', evaluate_program(limit=12)['evaluated_count'])",
            SUBMIT,
        ],
        max_metric_calls=20,
        sub_lm=FunctionLM(lambda messages: "an answer"),
        rlm_max_llm_calls=100,
    )
    outputs = [turn["output"] for turn in result.agent_trajectory]
    assert "answers 5" in outputs[0] and "left 12 sub 5 15" in outputs[1]  # the 12 metric calls are still there
    assert "15 of the 20 sub-LM prompts allowed besides max_metric_calls left" in outputs[2]
    assert "evaluated 12" in outputs[3]
    assert calls == 20  # every metric call the budget allows was made, none more
    assert result.budget["spent"] == 12 and result.budget["spent_by_kind"]["sub_lm_call"] == 5
    assert result.budget["sub_lm_limit"] == 20 and result.budget["sub_lm_left"] == 15
    assert "Sub-LM prompts (not metric calls): 15 of 20 left." in str(root.calls[-1])
    # no call is left to check 'Route it.' on validation: the run ended before the SUBMIT turn, with the baseline
    assert len(result.agent_trajectory) == 4 + 1 and result.route.signature.instructions == ORIGINAL_ROUTE
    assert result.agent_trajectory[-1]["code"] == "" and result.agent_trajectory[-1]["final"]  # how it ended
    assert "no turn could change the result" in result.agent_final_reasoning


def test_the_train_baseline_is_paid_when_read_and_once():
    result, calls, root = compile_with(
        [
            "print('left', optimization_status()['budget_left'])",
            "print('read', baseline_train['evaluated_count'], optimization_status()['budget_left'])",
            "print('again', len(baseline_train['examples']), 'run_id' in baseline_train,"
            " optimization_status()['budget_left'])",
            SUBMIT,
        ],
        max_metric_calls=40,
    )
    outputs = [turn["output"] for turn in result.agent_trajectory]
    assert "left 32" in outputs[0]  # only the validation baseline was paid before the agent started
    assert "read 12 20" in outputs[1]  # the first read evaluates the 12 train examples, charged
    assert "again 12 True 20" in outputs[2]  # read again: the same run, free
    assert calls == 8 + 12
    baselines = [log for log in result.trial_logs if log["label"] == "baseline"]
    assert sorted((log["split"], log["budget_spent"]) for log in baselines) == [("train", 12), ("val", 0)]
    assert "`baseline_train` is evaluated the first time you read it" in str(root.calls[0])


def test_reading_the_train_baseline_takes_at_most_half_of_what_moves_may_spend():
    """Regression: with a train set larger than the budget, reading `baseline_train` evaluated all it could and
    spent every unit, so no candidate could be checked on validation and the run ended after one turn."""
    result, calls, _ = compile_with(
        [
            "print('read', baseline_train['evaluated_count'], baseline_train['requested_count'],"
            " sorted(e['example_id'] for e in baseline_train['examples']), optimization_status()['budget_left'])",
            # read again (as after a restart or a resume): the same sample, nothing more paid
            "again = run_data('baseline_train')\n"
            "print(sorted(e['example_id'] for e in again['examples']) == sorted(e['example_id'] for e in "
            "baseline_train['examples']), optimization_status()['budget_left'])",
            SUBMIT,
        ],
        max_metric_calls=30,
    )
    read = result.agent_trajectory[0]["output"].split()
    # 22 units after the validation baseline; 8 stay for a check; half of the 14 others: a sample of 7 train examples
    assert read[:3] == ["read", "7", "12"] and read[-1] == "15"
    sampled = [int(i) for i in " ".join(read[3:-1]).strip("[]").split(",")]
    assert len(sampled) == 7 and sampled != list(range(7))  # a sample, not the first ones
    assert result.agent_trajectory[1]["output"].split() == ["True", "15"]
    assert calls >= 8 + 7 and result.budget["spent"] <= 30 - 8


def test_a_train_baseline_never_read_is_never_paid():
    result, calls, _ = compile_with([SUBMIT], max_metric_calls=40)
    assert calls == 8  # the validation baseline only
    assert [log["split"] for log in result.trial_logs] == ["val"]
