"""The spending cap and unknown prices, as the user and the agent read them.

Regressions: a submission whose validation check the cap cut to 2 of 4 examples was returned as checked ("the
agent's submission scored 1.0 on val, more than the unchanged program", no word of the cap); a cap of $0.000001
was shown to the agent as ``max_cost_usd=$0.0000``; a model litellm cannot price printed as ``$?``."""

from __future__ import annotations

import re

import litellm
import pytest
from dspy.lm15 import Usage
from rich.console import Console
from support.fakes import FunctionLM, scripted_agent
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import RLMDocstringOptimizer
from rlmoptimizer.usage import price_of_call

pytestmark = pytest.mark.slow

MODEL = "openai/gpt-4o-mini"  # a model litellm prices
PER_CALL = litellm.cost_per_token(model=MODEL, prompt_tokens=100_000, completion_tokens=0)[0]


def priced_task_lm() -> FunctionLM:
    return FunctionLM(
        task_lm_reply, name=MODEL, usage=lambda messages, text: Usage(input_tokens=100_000, output_tokens=0)
    )


def test_a_submission_the_cap_cut_short_on_validation_is_not_returned_and_the_reason_names_the_cap(tmp_path, caplog):
    trainset, valset = make_splits()
    valset = valset[:4]  # the unchanged program passes 2 of them; the policy passes all, the first 2 included
    baseline_cost = 2 * PER_CALL * (len(trainset) + len(valset))  # two predictor calls per example

    def compile_with(task, cap=baseline_cost + 2.5 * 2 * PER_CALL):  # room for 2 more examples
        return RLMDocstringOptimizer(
            max_iterations=2,
            eval_lm=task,
            run_storage_dir=tmp_path,
            num_threads=1,
            max_cost_usd=cap,
            root_lm=scripted_agent(
                [
                    {"reasoning": "fix", "code": f"print(update_prompt('route', {POLICY_PROMPT!r})['step'])"},
                    {"reasoning": "submit", "code": f"SUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})"},
                ]
            ),
        ).compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)

    optimized = compile_with(priced_task_lm())

    [check] = [log for log in optimized.trial_logs if log["label"] == "submission"]
    assert (check["split"], check["evaluated_count"], check["requested_count"], check["score"]) == ("val", 2, 4, 1.0)
    selection = optimized.selection
    assert selection["chosen_label"] == "baseline" and optimized.optimized_dspy_program["route"] != POLICY_PROMPT
    assert selection["submission_run_id"] is None and selection["spending_cap_reached"] is True
    assert "spending cap reached" in selection["reason"] and "max_cost_usd=$" in selection["reason"]
    assert f"{check['run_id']}: 2 of 4 examples" in selection["reason"]
    # nothing paid is lost: the two records of the cut check are stored, and the returned program is checked
    assert optimized.candidate_programs[0]["instructions"] == optimized.optimized_dspy_program
    assert optimized.usage["eval"]["cost_usd"] <= optimized.usage["max_cost_usd"]  # the agent is unpriced
    # read back, the finished run gives the same choice without a call (its submission never had a complete check)
    task = priced_task_lm()
    again = compile_with(task)
    assert again.selection == selection and not task.calls
    # and so with a raised cap (a finished run is read back, never continued): the same program, nothing paid
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        raised = compile_with(task, cap=baseline_cost * 10)
    assert raised.optimized_dspy_program == optimized.optimized_dspy_program and not task.calls
    # shown as it ended: the cap it ran with was reached (not "not reached" under the new cap), and the user is told
    assert raised.selection == selection and raised.usage["max_cost_usd"] == optimized.usage["max_cost_usd"]
    assert "does not reopen it" in caplog.text and "new run_storage_dir" in caplog.text


def test_a_tiny_cap_is_shown_with_its_digits(tmp_path):
    trainset, valset = make_splits()
    optimized = RLMDocstringOptimizer(
        max_iterations=2,
        eval_lm=priced_task_lm(),
        run_storage_dir=tmp_path,
        max_cost_usd=0.000001,
        root_lm=scripted_agent(
            [
                {
                    "reasoning": "try",
                    "code": "update_prompt('route', 'Pick a queue.')\nprint(evaluate_program(limit=2)['note'])",
                },
                {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program={})"},
            ]
        ),
    ).compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)
    # the baselines spent the cap: the agent is stopped before its first turn, and says why with the cap's digits
    output = optimized.agent_final_reasoning
    assert "max_cost_usd=$0.000001" in output and "$0.0000 " not in output
    assert "the agent was stopped at once, since its turns are LM calls too" in output
    spent = re.search(r"spending cap reached: \$([\d.]+) of", output).group(1)
    assert float(spent) == pytest.approx(optimized.usage["eval"]["cost_usd"], rel=1e-3)
    assert optimized.usage["root"]["calls"] == 0


def test_a_model_without_a_price_is_named_not_shown_as_a_question_mark(tmp_path):
    trainset, valset = make_splits()
    console = Console(record=True, width=3000, force_terminal=False)
    RLMDocstringOptimizer(
        max_iterations=1,
        eval_lm=FunctionLM(task_lm_reply, name="local/unpriced-task-lm"),
        verbose=True,
        console=console,
        run_storage_dir=tmp_path,
        root_lm=scripted_agent(
            [{"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program={})"}], name="local/unpriced-agent"
        ),
    ).compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)
    shown = console.export_text()
    [last] = [line for line in shown.splitlines() if line.startswith("Done:")]  # the cost check follows it
    assert "$?" not in shown
    assert "no price for local/unpriced-task-lm" in last
    assert "dollars unknown: litellm has no price for local/unpriced-agent," in shown  # the estimate, first
    assert "no price for local/unpriced-agent" in last


def test_an_evaluation_of_instructions_far_larger_than_the_start_stops_once_the_cap_is_spent(tmp_path):
    """Regression: a reservation is priced at the average example so far, so instructions of megabytes evaluated on
    12 examples were all run: the evaluation LM spent 60x max_cost_usd. Now the examples not started once the cap is
    spent are not run (with one thread, at most one example passes it)."""
    trainset, valset = make_splits()

    def tokens(messages) -> int:  # (the long instructions as dense as a tokenizer of 0.4 characters a token)
        text = "".join(str(m["content"]) for m in messages)
        return len(text) * (10 if "w w w" in text else 1) // 4

    by_size = FunctionLM(
        task_lm_reply, name=MODEL, usage=lambda messages, text: Usage(input_tokens=tokens(messages), output_tokens=0)
    )
    huge = "Route the ticket. " + "w " * 20_000  # within the length instructions may have
    optimized = RLMDocstringOptimizer(
        max_iterations=2,
        eval_lm=by_size,
        run_storage_dir=tmp_path,
        num_threads=1,
        max_cost_usd=0.005,  # the baselines cost a fifth of it; one call with `huge` costs three times it
        rlm_autopilot="off",
        root_lm=scripted_agent(
            [
                {
                    "reasoning": "big",
                    "code": f"print(compare(['current', {{'route': {huge!r}}}], ids=list(range(12))))",
                },
                {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program={})"},
            ]
        ),
    ).compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)
    big_calls = [call for call in by_size.calls if "w w w" in str(call)]
    assert len(big_calls) == 1  # 12 before
    assert optimized.usage["cap_reached"] is True
    assert optimized.usage["eval"]["cost_usd"] < 0.005 + float(price_of_call(MODEL, 10 * (len(huge) + 4_000) // 4, 0))
    [cut] = [log for log in optimized.trial_logs if log["instructions"]["route"] == huge]
    assert "11 of 12 granted examples were not run: max_cost_usd was spent" in cut["note"]
