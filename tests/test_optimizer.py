"""Full compile() runs: real DSPy programs, a fake task LM, a scripted root agent, the real sandbox."""

from __future__ import annotations

import json

import dspy
import pytest
from support.fakes import FunctionLM, scripted_agent, system_text
from support.optimizing import ORIGINAL_ROUTE, SUBMIT_CURRENT, SUBMIT_POLICY, compile_tickets, optimizer, outputs
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import ConfigurationError, RLMDocstringOptimizer
from rlmoptimizer.agent.prompts import AGENT_INSTRUCTIONS, TOOL_NAMES


@pytest.mark.slow
def test_agent_improves_the_program_and_the_result_is_an_ordinary_module(tmp_path):
    result = compile_tickets(
        [
            {"reasoning": "look", "code": "print(len(baseline_train['examples']), baseline_train['score'])"},
            {
                "reasoning": "fix",
                "code": f"update_prompt('route', {POLICY_PROMPT!r})\n"
                "r = evaluate_program(failed_from_run=baseline_train['run_id'])\n"
                "print('rerun', float(r['score']), r['evaluated_count'])",
            },
            SUBMIT_POLICY,
        ],
        run_storage_dir=tmp_path / "run",
    )

    assert result.optimized_dspy_program["route"] == POLICY_PROMPT
    assert result.route.signature.instructions == POLICY_PROMPT
    assert result.selection["chosen_score"] > result.selection["baseline_score"]
    assert outputs(result)[0].strip().startswith("12 ")
    assert "rerun 1.0" in outputs(result)[1]
    labels = [log["label"] for log in result.trial_logs]
    assert labels[:2] == ["baseline", "baseline"] and "submission" in labels
    assert result.latest_run_id == result.trial_logs[-1]["run_id"]
    assert result.agent_trajectory[-1]["final"] is True
    # the budget counted the re-evaluated failures and the submission's validation run, nothing else
    failures = sum(1 for log in result.trial_logs if log["label"] == "agent" for _ in range(log["evaluated_count"]))
    assert result.budget["spent"] == failures + len(make_splits()[1])

    path = tmp_path / "program.json"
    result.save(str(path))
    loaded = RouteTicket()
    loaded.load(str(path))
    assert loaded.route.signature.instructions == POLICY_PROMPT
    assert (
        json.loads((tmp_path / "run" / "result.json").read_text())["optimized_dspy_program"]["route"] == POLICY_PROMPT
    )


@pytest.mark.slow
def test_root_lm_in_context_never_runs_the_program():
    """The eval LM is pinned: the caller's dspy.context LM (here the root agent) is not used by the program."""
    trainset, valset = make_splits()
    root = scripted_agent([SUBMIT_POLICY])
    task = FunctionLM(task_lm_reply)
    opt = optimizer(root, eval_lm=task, max_iterations=1)
    with dspy.context(lm=root):
        opt.compile(student=RouteTicket(), trainset=trainset, metric=metric, valset=valset)
    assert root.calls and all("variables_info" in str(messages) for messages in root.calls)
    assert not any("variables_info" in str(messages) for messages in task.calls)
    assert len(task.calls) >= 2 * (len(trainset) + len(valset))


@pytest.mark.slow
def test_unknown_step_and_bad_submission_are_errors_the_agent_can_fix():
    result = compile_tickets(
        [
            {"reasoning": "typo", "code": "update_prompt('router', 'x')"},
            {"reasoning": "submit typo", "code": "SUBMIT(optimized_dspy_program={'router': 'x'})"},
            SUBMIT_POLICY,
        ]
    )
    first, second = outputs(result)[:2]
    assert "unknown step name 'router'" in first and "route" in first
    assert "Submission refused" in second and "router" in second
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT


@pytest.mark.slow
def test_one_optimizer_compiles_twice_without_sharing_state():
    trainset, valset = make_splits()
    opt = optimizer([SUBMIT_POLICY], max_iterations=1)
    first = opt.compile(student=RouteTicket(), trainset=trainset, metric=metric, valset=valset)
    second = opt.compile(student=RouteTicket(), trainset=trainset, metric=metric, valset=valset)
    assert first.run_storage_dir != second.run_storage_dir
    assert [t["run_id"] for t in first.trial_logs] == [t["run_id"] for t in second.trial_logs]
    assert not any(key.startswith("_") and "run" in key for key in vars(opt))


@pytest.mark.slow
def test_a_worse_submission_is_not_returned():
    bad = "Always answer billing."
    result = compile_tickets(
        [
            {
                "reasoning": "check good on val",
                "code": f"update_prompt('route', {POLICY_PROMPT!r})\nprint(evaluate_program(split='val')['score'])",
            },
            {"reasoning": "submit a bad one", "code": f"SUBMIT(optimized_dspy_program={{'route': {bad!r}}})"},
        ]
    )
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT
    assert result.selection["chosen_label"] == "agent"
    assert result.selection["submission_score"] < result.selection["chosen_score"]
    assert "returning that candidate instead" in result.selection["reason"]


@pytest.mark.slow
def test_a_submission_that_only_ties_the_unchanged_program_is_not_returned():
    reworded = "Pick the queue for this summary."  # the fake task LM routes it exactly like the original
    original = ORIGINAL_ROUTE
    result = compile_tickets(
        [
            {"reasoning": "submit a rewording", "code": f"SUBMIT(optimized_dspy_program={{'route': {reworded!r}}})"},
        ]
    )
    assert result.selection["submission_score"] == result.selection["baseline_score"]
    assert result.selection["chosen_label"] == "baseline"
    assert result.optimized_dspy_program["route"] == original
    assert "the same as the unchanged program" in result.selection["reason"]
    assert result.route.signature.instructions == original


@pytest.mark.slow
def test_submitting_the_unchanged_instructions_returns_them():
    original = ORIGINAL_ROUTE
    result = compile_tickets(
        [
            {"reasoning": "nothing better", "code": f"SUBMIT(optimized_dspy_program={{'route': {original!r}}})"},
        ]
    )
    assert result.selection["chosen_label"] == "baseline"
    assert result.selection["submission_run_id"] == result.selection["chosen_run_id"]
    assert result.selection["reason"].startswith("the agent's submission is the unchanged instructions")
    assert result.budget["spent"] == 0  # already evaluated by the free baseline: nothing paid for it


def test_the_root_lm_sees_each_tool_once_with_its_parameters_and_no_sub_agent_rules():
    root = scripted_agent([SUBMIT_CURRENT])
    compile_tickets(root)
    system = system_text(root.calls[0])
    from rlmoptimizer.agent.tools import AgentTools

    listed = [tool.__name__ for tool in AgentTools.tool_functions(AgentTools.__new__(AgentTools))]
    assert list(TOOL_NAMES) == listed  # (the window's estimate counts the tools by these names)
    for name in (*TOOL_NAMES, "llm_query", "llm_query_batched"):
        assert system.count(f"- {name}(") == 1, name
    assert "- evaluate_program(split='train', limit=None, sample=None, ids=None, failed_from_run=None" in system
    for name in ("SUBMIT(optimized_dspy_program=", "baseline_train", "baseline_val", "next_phase()"):
        assert name in AGENT_INSTRUCTIONS and name in system
    assert "dspy.ReActV2" not in system and "Sub-agents" not in system


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_iterations": 0}, "max_iterations must be an int >= 1"),
        ({"root_lm": None}, "root_lm is required"),
        ({"root_lm": "openai/gpt-4o"}, "root_lm must be a dspy.LM"),
        ({"pass_threshold": float("nan")}, "pass_threshold must be a finite number"),
        ({"pass_threshold": "high"}, "pass_threshold must be a finite number"),
        ({"metric": "accuracy"}, "metric must be callable"),
    ],
)
def test_bad_constructor_arguments_say_what_to_fix(kwargs, message):
    base = {"root_lm": scripted_agent([SUBMIT_POLICY])}
    with pytest.raises(ConfigurationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        RLMDocstringOptimizer(**{**base, **kwargs})


def test_bad_compile_input_fails_before_any_lm_call():
    root, task = scripted_agent([SUBMIT_POLICY]), FunctionLM(task_lm_reply)
    opt = optimizer(root, eval_lm=task)
    trainset, valset = make_splits()
    with pytest.raises(ConfigurationError, match="no metric"):
        opt.compile(student=RouteTicket(), trainset=trainset, valset=valset)
    with pytest.raises(ConfigurationError):
        opt.compile(student=RouteTicket(), trainset=[], metric=metric)
    with pytest.raises(ConfigurationError):
        opt.compile(student=RouteTicket(), trainset=[{"ticket": "x", "queue": "billing"}], metric=metric)
    with pytest.raises(ConfigurationError):
        opt.compile(student=dspy.Module(), trainset=trainset, metric=metric)
    assert root.calls == [] and task.calls == []


class SelfExtendingPredict(dspy.Predict):
    """A predictor whose signature grows an output field when its instructions mention 'confidence':
    setting such instructions would change the program's structure, which the optimizer must refuse."""

    def __setattr__(self, name, value):
        if (
            name == "signature"
            and "confidence" in (value.instructions or "")
            and "confidence" not in value.output_fields
        ):
            value = value.append("confidence", dspy.OutputField(), type_=str)
        super().__setattr__(name, value)


class RouteWithExtendingStep(RouteTicket):
    def __init__(self):
        super().__init__()
        self.route = SelfExtendingPredict("summary -> queue")


@pytest.mark.slow
def test_an_update_that_would_change_the_structure_is_refused_and_rolled_back():
    result = compile_tickets(
        [
            {"reasoning": "try", "code": "print(update_prompt('route', 'Also give your confidence.'))"},
            {"reasoning": "look", "code": "print(optimization_status()['current_prompts']['route'])"},
            {
                "reasoning": "submit it anyway",
                "code": "SUBMIT(optimized_dspy_program={'route': 'Also give your confidence.'})",
            },
            SUBMIT_POLICY,
        ],
        student=RouteWithExtendingStep(),
    )
    refused, current, submitted = outputs(result)[:3]
    assert "update refused" in refused and "output field 'confidence'" in refused
    assert current.strip() == "Given the fields `summary`, produce the fields `queue`."
    assert "confidence" in submitted and "refused" in submitted.lower()
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT
    assert list(result.route.signature.output_fields) == ["queue"]
