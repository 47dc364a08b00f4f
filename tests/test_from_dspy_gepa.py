"""A dspy.GEPA user's script with ``dspy.GEPA(...)`` replaced by ``RLMDocstringOptimizer(...)`` and the same
arguments: it runs (with the one line dspy.GEPA has no counterpart for, the agent's LM or the loop without one), or is
refused in one line saying what to write instead; and code that reads dspy.GEPA's ``detailed_results`` reads ours."""

from __future__ import annotations

import json

import dspy
import numpy as np
import pytest
from support.optimizing import proposer
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, task_lm_reply

from rlmoptimizer import ConfigurationError, RLMDocstringOptimizer
from rlmoptimizer.budget import auto_metric_calls
from rlmoptimizer.report import DetailedResults
from rlmoptimizer.testing import FunctionLM


def metric_with_feedback(gold, pred, trace=None, pred_name=None, pred_trace=None):
    """A metric written for dspy.GEPA: five arguments, a score and feedback."""
    queue = (pred.queue or "").strip().lower()
    if queue == gold.queue:
        return dspy.Prediction(score=1.0, feedback="Correct queue.")
    return dspy.Prediction(score=0.0, feedback=f"Routed to {queue!r}; the policy sends this ticket to {gold.queue!r}.")


def gepa_arguments(tmp_path) -> dict:
    """What a dspy.GEPA script passes (its tutorial's arguments and a few of its defaults written out)."""
    return {
        "auto": "light",
        "reflection_lm": proposer(POLICY_PROMPT),
        "num_threads": 4,
        "track_stats": True,
        "track_best_outputs": True,
        "log_dir": str(tmp_path / "gepa-logs"),
        "seed": 0,
        "reflection_minibatch_size": 3,
        "candidate_selection_strategy": "pareto",
        "use_merge": True,
        "skip_perfect_score": True,
    }


def test_a_dspy_gepa_script_runs_with_the_optimizer_swapped_in(tmp_path):
    train, val = make_splits()
    # dspy.GEPA(metric_with_feedback, **arguments) with the agent's line added: here, the default loop with no agent
    optimizer = RLMDocstringOptimizer(metric_with_feedback, **gepa_arguments(tmp_path), rlm_autopilot="loop")
    with dspy.context(lm=FunctionLM(task_lm_reply)):  # the task LM, configured as a dspy.GEPA script does
        optimized = optimizer.compile(RouteTicket(), trainset=train, valset=val)

        # auto="light" sized the budget as dspy.GEPA sizes it: two steps, 8 validation examples
        assert optimized.budget["limit"] == auto_metric_calls("light", 2, len(val)) - len(val)  # the baseline paid
        assert optimizer.max_metric_calls is None and optimizer.auto == "light"  # sized per compile, not kept
        assert optimized.run_storage_dir == str(tmp_path / "gepa-logs")
        assert optimized.route.signature.instructions == POLICY_PROMPT

        # what dspy's docs and tutorials read of detailed_results
        results = optimized.detailed_results
        best = results.candidates[results.best_idx]
        assert isinstance(results.candidates, list) and all(isinstance(c, dspy.Module) for c in results.candidates)
        assert best is results.best_candidate
        assert best(ticket=train[3].ticket).queue == "disputes"  # a program that runs, with the best instructions
        assert results.candidates[0].route.signature.instructions == RouteTicket().route.signature.instructions
        assert results.val_aggregate_scores[results.best_idx] == 1.0 and optimized.score == 100.0
        assert results.val_aggregate_scores[0] == optimized.selection["baseline_score"] < 1.0
        assert results.parents[0] == [None]
        # every other candidate was made from one: a child GEPA did not keep is not a second seed
        assert all(results.parents[i] != [None] for i in range(1, len(results.parents))), results.parents
        assert all(p is None or p < i for i, parents in enumerate(results.parents) for p in parents)
        assert any(p == 0 for p in results.parents[results.best_idx])  # GEPA's child of the unchanged program
        assert sorted(results.per_val_instance_best_candidates) == list(range(len(val)))
        for val_id, best_ids in results.per_val_instance_best_candidates.items():
            assert isinstance(best_ids, set) and results.best_idx in best_ids
            assert results.highest_score_achieved_per_val_task[val_id] == 1.0
            for index, output in results.best_outputs_valset[val_id]:
                assert index in best_ids and output.queue == val[val_id].queue
        assert len(results.val_subscores) == len(results.candidates) == len(results.discovery_eval_counts)
        counts = results.discovery_eval_counts
        assert counts[0] == 0 and counts == sorted(counts) and counts[-1] < results.total_metric_calls
        # gepa's scale: the validation baseline's metric calls count too (the budget, in units, leaves them out)
        assert all(counts[i] - results.discovery_budget[i] == len(val) for i in range(1, len(counts)))
        spent = optimized.budget["spent"] + len(val)  # every metric call, the validation baseline's included
        assert results.total_metric_calls == spent and results.num_full_val_evals >= 2
        assert results.log_dir == str(tmp_path / "gepa-logs") and results.seed == 0
        data = json.loads(json.dumps(results.to_dict()))
        assert data["candidates"][results.best_idx]["route"] == POLICY_PROMPT and data["best_idx"] == results.best_idx
        assert data["parents"] == results.parents and data["val_aggregate_subscores"] is None

    # read back from the run directory: the same results; no program to build candidates on, no outputs unless asked
    again = DetailedResults.from_run_directory(tmp_path / "gepa-logs")
    assert again.instructions == results.instructions and again.val_aggregate_scores == results.val_aggregate_scores
    assert again.seed == 0 and again.best_outputs_valset is None
    with pytest.raises(ConfigurationError, match=r"no program to build candidates on.*results.instructions"):
        _ = again.candidates


def test_what_dspy_gepa_takes_and_this_optimizer_does_not_is_refused_in_one_line(tmp_path):
    arguments = gepa_arguments(tmp_path)
    refusals = [
        ({}, r"root_lm is required .* rlm_autopilot='loop'"),  # the script as it is: dspy.GEPA has no agent
        ({"use_merge": False}, r"use_merge=False: .* run_gepa\(use_merge=False\); drop use_merge"),
        ({"reflection_minibatch_size": 5}, r"reflection_minibatch_size=5: .*run_gepa\(minibatch_size=N\)"),
        ({"candidate_selection_strategy": "current_best"}, r"Pareto front only; drop candidate_selection_strategy"),
        ({"max_metric_calls": 300}, r"pass one budget .* you set auto='light', max_metric_calls=300"),
        ({"sub_lm": FunctionLM(lambda m: {})}, r"pass reflection_lm or sub_lm, not both"),
        ({"seed": None}, r"seed=None: .* pass a number"),
        ({"gepa_kwargs": {"use_cloudpickle": True}}, r"drop gepa_kwargs"),
        ({"max_iters": 10}, r"unexpected argument max_iters \(write rlm_max_iterations=N"),
        ({"reflection_lm_model": "gpt-5"}, r"unexpected argument reflection_lm_model \(did you mean reflection_lm"),
    ]
    for changes, message in refusals:
        with pytest.raises(ConfigurationError, match=message) as refused:
            RLMDocstringOptimizer(metric_with_feedback, **{**arguments, **changes})
        assert "\n" not in str(refused.value)


def test_a_miprov2_script_is_told_where_each_of_its_arguments_went():
    """MIPROv2's constructor and compile() names are refused before any LM call, each with what to write here."""
    lm = FunctionLM(lambda m: {})
    refusals = [
        ({"prompt_model": lm}, r"prompt_model \(write sub_lm=\.\.\."),
        ({"task_model": lm}, r"task_model \(write eval_lm=\.\.\."),
        ({"max_bootstrapped_demos": 2}, r"max_bootstrapped_demos \(write max_demos=N"),
    ]
    for given, message in refusals:
        with pytest.raises(ConfigurationError, match=message):
            RLMDocstringOptimizer(metric_with_feedback, root_lm=lm, **given)
    train, val = make_splits()
    optimizer = RLMDocstringOptimizer(metric_with_feedback, rlm_autopilot="loop", sub_lm=lm, eval_lm=lm)
    with pytest.raises(ConfigurationError) as refused:
        optimizer.compile(
            RouteTicket(), trainset=train, valset=val, requires_permission_to_run=False, max_labeled_demos=0
        )
    said = str(refused.value)
    assert "max_labeled_demos: RLMDocstringOptimizer(max_demos=N)" in said
    assert "requires_permission_to_run: drop it" in said and "optimizer.estimate(" in said
    assert lm.calls == []


def test_dspy_gepas_names_mean_ours(tmp_path):
    reflection = FunctionLM(lambda m: {})
    optimizer = RLMDocstringOptimizer(
        metric_with_feedback,
        root_lm=FunctionLM(lambda m: {}),
        reflection_lm=reflection,
        log_dir=tmp_path,
        seed=7,
        perfect_score=5,
        num_threads=None,
        max_full_evals=3,
        warn_on_score_mismatch=False,
        failure_score=0.0,
        max_merge_invocations=5,
        add_format_failure_as_feedback=True,
    )
    assert optimizer.metric is metric_with_feedback and optimizer.sub_lm is reflection
    assert optimizer.run_storage_dir == tmp_path and optimizer.attempt == 7 and optimizer.pass_threshold == 5.0
    assert optimizer.num_threads == dspy.settings.num_threads and optimizer.track_best_outputs is False
    assert optimizer.max_full_evals == 3 and optimizer.max_iterations is None
    assert optimizer.add_format_failure_as_feedback is True
    assert RLMDocstringOptimizer(root_lm=reflection).add_format_failure_as_feedback is False  # dspy.GEPA's default
    numpy_values = RLMDocstringOptimizer(root_lm=reflection, seed=np.int64(3), failure_score=np.float64(0.0))
    assert numpy_values.attempt == 3 and type(numpy_values.attempt) is int  # a seed from numpy, as a notebook has it
    with pytest.raises(ConfigurationError, match=r"failure_score=.*drop failure_score"):
        RLMDocstringOptimizer(root_lm=reflection, failure_score=np.float64(0.5))
    with dspy.context(num_threads=3):  # left out, as in a dspy.GEPA script: dspy's setting, as dspy.GEPA takes it
        assert RLMDocstringOptimizer(root_lm=reflection).num_threads == 3
    with pytest.raises(ConfigurationError, match="add_format_failure_as_feedback must be True or False"):
        RLMDocstringOptimizer(root_lm=reflection, add_format_failure_as_feedback="yes")
    # the budget auto stands for is sized in compile(); the constructor's window check sizes it for the smallest
    assert RLMDocstringOptimizer(root_lm=reflection, auto="heavy").max_metric_calls is None
    # the same setting under both names agrees, or is refused
    assert RLMDocstringOptimizer(root_lm=reflection, sub_lm=reflection, reflection_lm=reflection).sub_lm is reflection
    # dspy.GEPA's defaults written out (None) are not a second value
    assert RLMDocstringOptimizer(root_lm=reflection, sub_lm=reflection, reflection_lm=None).sub_lm is reflection
    assert RLMDocstringOptimizer(root_lm=reflection, run_storage_dir=tmp_path, log_dir=None).run_storage_dir == tmp_path
    with pytest.raises(ConfigurationError, match="pass seed or attempt, not both"):
        RLMDocstringOptimizer(root_lm=reflection, seed=1, attempt=2)
    with pytest.raises(ConfigurationError, match="auto must be 'light', 'medium' or 'heavy'"):
        RLMDocstringOptimizer(root_lm=reflection, auto="fast")


def test_a_metric_in_gepas_form_gives_each_step_its_own_feedback_on_train_only(tmp_path):
    """Regression: a dspy.GEPA metric was only ever called with pred_name=None, so the per-step feedback it writes
    for GEPA's reflection never reached a proposal: the reflection LM saw the example's feedback for every step."""
    asked: list[tuple[str | None, int]] = []

    def per_step(gold, pred, trace=None, pred_name=None, pred_trace=None):
        asked.append((pred_name, len(pred_trace or [])))
        queue = (pred.queue or "").strip().lower()
        score = float(queue == gold.queue)
        if pred_name == "route":
            return dspy.Prediction(score=score, feedback=f"ROUTE NOTE: the policy sends this to {gold.queue}.")
        if pred_name is not None:
            return dspy.Prediction(score=score, feedback="SUMMARY NOTE: keep the customer's words.")
        return dspy.Prediction(score=score, feedback="EXAMPLE NOTE")

    train, val = make_splits()
    reflection = proposer(POLICY_PROMPT)
    with dspy.context(lm=FunctionLM(task_lm_reply)):
        optimized = RLMDocstringOptimizer(
            per_step,
            max_metric_calls=40,
            reflection_lm=reflection,
            rlm_autopilot="loop",
            num_threads=1,
            run_storage_dir=str(tmp_path / "run"),
        ).compile(RouteTicket(), trainset=train, valset=val)
    assert optimized.route.signature.instructions == POLICY_PROMPT
    # asked as dspy.GEPA asks: the step's name with its one call
    assert {("route", 1), ("summarize.predict", 1)} <= set(asked)
    prompts = [" ".join(str(m.get("content", "")) for m in messages) for messages in reflection.calls]
    for_route = [p for p in prompts if "ROUTE NOTE" in p]
    assert for_route and not any("SUMMARY NOTE" in p for p in for_route)  # each step reflects on its own feedback
    runs = [json.loads(p.read_text()) for p in sorted((tmp_path / "run" / "runs").glob("run-*.json"))]
    steps = {
        split: [s for r in runs if r["split"] == split for rec in r["records"] for s in rec["steps"]]
        for split in ("train", "val")
    }
    assert steps["train"] and all(s.get("feedback", "").startswith(("ROUTE", "SUMMARY")) for s in steps["train"])
    assert steps["val"] and not any("feedback" in s for s in steps["val"])  # validation is never reflected on


def test_a_metric_given_to_the_constructor_and_another_to_compile_is_warned_about_and_compiles_is_used(caplog):
    constructor_calls, compile_calls = [], []

    def constructor_metric(gold, pred, trace=None):
        constructor_calls.append(1)
        return 0.0

    def compile_metric(gold, pred, trace=None):
        compile_calls.append(1)
        return float(gold.queue == pred.queue)

    train, val = make_splits()
    optimizer = RLMDocstringOptimizer(
        constructor_metric,
        sub_lm=proposer(POLICY_PROMPT),
        eval_lm=FunctionLM(task_lm_reply),
        rlm_autopilot="loop",
        max_metric_calls=60,
    )
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        optimizer.compile(RouteTicket(), trainset=train, valset=val, metric=compile_metric)
    assert "compile()'s (compile_metric) is used" in caplog.text
    assert compile_calls and not constructor_calls


class JudgedTicket(RouteTicket):
    """A program that holds names compile()'s result also uses: a step called ``score``, a value ``budget`` and a
    method ``usage``."""

    budget = 3  # a class default of the user's

    def __init__(self):
        super().__init__()
        self.score = self.route  # the routing step, under a name a judge step plausibly has
        del self.route
        self.selection = {"mine": True}  # a value of the user's

    def usage(self):
        return "the user's own method"

    def forward(self, ticket):
        return self.score(summary=self.summarize(ticket=ticket).summary)


def test_the_result_never_replaces_a_step_or_an_attribute_of_the_users_program(tmp_path, caplog):
    train, val = make_splits()
    optimizer = RLMDocstringOptimizer(
        metric_with_feedback, **{**gepa_arguments(tmp_path), "use_merge": True}, rlm_autopilot="loop"
    )
    with dspy.context(lm=FunctionLM(task_lm_reply)):
        optimized = optimizer.compile(JudgedTicket(), trainset=train, valset=val)
        assert isinstance(optimized.score, dspy.Predict) and optimized.score.signature.instructions == POLICY_PROMPT
        assert [name for name, _ in optimized.named_predictors()] == ["summarize.predict", "score"]
        assert optimized.budget == 3 and optimized.usage() == "the user's own method"
        assert optimized.selection == {"mine": True}
        assert optimized(ticket=train[3].ticket).queue == "disputes"  # the program still runs, optimized
    said = " ".join(r.getMessage() for r in caplog.records if "left" in r.getMessage())
    assert "left selection, budget, usage, score of the returned program" in said and "values are not set" in said
    assert str(tmp_path / "gepa-logs") in said
    # the rest of the result is set, and says what the skipped names would have
    assert optimized.detailed_results.score == 1.0 and optimized.optimized_dspy_program["score"] == POLICY_PROMPT
    assert json.loads((tmp_path / "gepa-logs" / "result.json").read_text())["selection"]["chosen_score"] == 1.0
    path = tmp_path / "saved.json"
    optimized.save(str(path))
    loaded = JudgedTicket()
    loaded.load(str(path))
    assert loaded.score.signature.instructions == POLICY_PROMPT

    # a program compile() returned, compiled again: the names it set are set anew, and only the user's are kept
    caplog.clear()
    plain = RLMDocstringOptimizer(metric_with_feedback, **gepa_arguments(tmp_path / "again"), rlm_autopilot="loop")
    with dspy.context(lm=FunctionLM(task_lm_reply)):
        first = plain.compile(RouteTicket(), trainset=train, valset=val)
        first.score = 50.0  # as MIPROv2 or an earlier compile left it
        again = RLMDocstringOptimizer(metric_with_feedback, **gepa_arguments(tmp_path / "third"), rlm_autopilot="loop")
        second = again.compile(first, trainset=train, valset=val)
    assert second.score == 100.0 and second.run_storage_dir == str(tmp_path / "third" / "gepa-logs")
    assert not [r for r in caplog.records if "left" in r.getMessage() and "as they were" in r.getMessage()]
