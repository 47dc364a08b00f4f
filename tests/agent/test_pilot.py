"""The pilot runs the default policy through the real tools and evaluation stack: ``rlm_autopilot="loop"`` with no
root LM and no sandbox, ``"assist"`` after a turn without progress, ``"off"`` never; the agent's own
``next_phase()``; one step as one phase. Compiles on the ticket task with a reflection LM that proposes the fix."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import pkgutil
from pathlib import Path
from types import SimpleNamespace

import dspy
import pytest
from support.fakes import FunctionLM, last_user_text
from support.metrics import CountingMetric
from support.optimizing import ORIGINAL_ROUTE, compile_tickets, copier, proposer, steps_seen
from support.tickets import POLICY_PROMPT, make_splits, metric, task_lm_reply

import rlmoptimizer
from rlmoptimizer import RLMDocstringOptimizer
from rlmoptimizer.agent.agent import OptimizerAgent
from rlmoptimizer.agent.pilot import NEXT_PHASE_LINE, Pilot, run_loop
from rlmoptimizer.agent.policy import BudgetView, Compared, GepaFinished, Proposed
from rlmoptimizer.errors import AgentToolError, ConfigurationError


def never_called(messages):
    raise AssertionError("the root LM was called")


def no_sandbox(monkeypatch) -> None:
    class Refused:
        def __init__(self, *args, **kwargs):
            raise AssertionError("the sandbox was started")

    monkeypatch.setattr("rlmoptimizer.flow.Sandbox", Refused)


def reflecting(in_gepa: str, elsewhere: str) -> FunctionLM:
    """A sub LM whose GEPA reflections answer ``in_gepa`` and whose other proposals answer ``elsewhere``."""

    def reply(messages):
        gepa = any(Path(frame.filename).name == "gepa_adapter.py" for frame in inspect.stack())
        return json.dumps({"new_instruction": in_gepa if gepa else elsewhere})

    return FunctionLM(reply, name="sub")


def test_the_loop_mode_runs_the_policy_to_submit_without_a_root_lm_or_a_sandbox(monkeypatch, tmp_path):
    no_sandbox(monkeypatch)
    counting = CountingMetric()
    settings = {"sub_lm": proposer(POLICY_PROMPT), "rlm_autopilot": "loop", "max_metric_calls": 60}
    result = compile_tickets(
        FunctionLM(never_called, name="root"), metric=counting, run_storage_dir=tmp_path / "run", **settings
    )
    assert counting.calls <= 60
    assert result.route.signature.instructions == POLICY_PROMPT
    assert result.selection["chosen_score"] == 1.0 > result.selection["baseline_score"]
    turns = result.agent_trajectory
    # one turn per step: GEPA's phase (the run, then its best adopted and checked on validation), then the end
    assert turns[0]["pilot"][0].startswith("run_gepa(budget=") and turns[0]["pilot"][1].startswith(
        "adopt_candidate('gepa-"
    )
    assert turns[-1]["final"] and turns[-1]["outputs"]["optimized_dspy_program"]["route"] == POLICY_PROMPT
    assert all(turn["reasoning"].startswith("rlm_autopilot='loop'") for turn in turns)
    assert result.usage["root"]["calls"] == 0
    # the result names who submitted: the loop, not an agent, also when the finished run is read back
    assert turns[-1]["submitted_by"] == "the default loop's submission"
    assert result.selection["reason"].startswith("the default loop's submission scored 1.0000 on val")
    root = FunctionLM(never_called, name="root")
    again = compile_tickets(root, metric=counting, run_storage_dir=tmp_path / "run", **settings)
    assert again.selection["reason"] == result.selection["reason"]


def test_the_loop_mode_needs_no_root_lm_but_an_lm_to_propose_with(monkeypatch):
    no_sandbox(monkeypatch)
    from support.tickets import RouteTicket, make_splits, task_lm_reply

    with pytest.raises(ConfigurationError, match="sub_lm is required"):
        RLMDocstringOptimizer(rlm_autopilot="loop")
    with pytest.raises(ConfigurationError, match="root_lm is required"):
        RLMDocstringOptimizer(rlm_autopilot="assist", sub_lm=proposer())
    with pytest.raises(ConfigurationError, match="rlm_autopilot must be 'off'"):
        RLMDocstringOptimizer(root_lm=proposer(), rlm_autopilot="on")
    assert RLMDocstringOptimizer(root_lm=proposer(), rlm_autopilot=True).rlm_autopilot == "assist"
    assert RLMDocstringOptimizer(root_lm=proposer(), rlm_autopilot=False).rlm_autopilot == "off"
    train, val = make_splits()
    optimizer = RLMDocstringOptimizer(
        rlm_autopilot="loop", sub_lm=proposer(POLICY_PROMPT), eval_lm=FunctionLM(task_lm_reply), max_iterations=3
    )
    result = optimizer.compile(RouteTicket(), trainset=train, valset=val, metric=metric)
    assert result.route.signature.instructions == POLICY_PROMPT


def test_a_sub_lm_whose_proposals_never_parse_ends_the_loop_instead_of_being_asked_again(monkeypatch):
    """Regression: a refused proposal (no usable instructions in the sub LM's reply) left the loop's memory as it
    was, so the policy asked for the same proposal again, a paid prompt each time, until the budget was gone (66
    identical refusals in 68 turns)."""
    no_sandbox(monkeypatch)
    prose = FunctionLM(lambda messages: "I think the instruction should be better.", name="prose")
    result = compile_tickets(FunctionLM(never_called), sub_lm=prose, rlm_autopilot="loop", max_iterations=6)
    calls = [call for turn in result.agent_trajectory for call in turn["pilot"]]
    proposals = [call for call in calls if call.startswith("propose_instructions(")]
    assert 1 <= len(proposals) <= 2 + 2  # the group's, then a round over the two steps: nothing new, the loop ends
    assert result.agent_trajectory[-1]["final"] and result.budget["left"] > result.budget["limit"] / 2


def test_a_loop_ended_by_a_refused_move_says_which_and_why(monkeypatch):
    """Regression: a sub LM failing every call with an error not known to be permanent ended the loop with "the
    loop's last phase changed nothing" and no word of the failure in the result."""
    no_sandbox(monkeypatch)

    def broken(messages):
        return RuntimeError("proxy said: 407 Proxy Authentication Required")

    result = compile_tickets(FunctionLM(never_called), sub_lm=FunctionLM(broken, name="sub"), rlm_autopilot="loop")
    why = result.agent_final_reasoning
    assert "the loop's last phase changed nothing (run_gepa(" in why and "was refused: " in why
    assert "407 Proxy Authentication Required" in why
    assert result.route.signature.instructions == ORIGINAL_ROUTE
    # and the result's reason says it, where a user reads why this program was returned
    reason = result.selection["reason"]
    assert reason.startswith("the default loop's submission (the loop stopped early: run_gepa(")
    assert "407 Proxy Authentication Required" in reason and "is the unchanged instructions" in reason


def test_failures_that_raise_before_a_step_are_not_proposed_for_and_the_reason_says_why_the_loop_ended(monkeypatch):
    """Train examples whose first LM call fails for good (too long for the model) fail for every instructions.
    Regression: the loop proposed for their group (refused: the step never ran on them), then for the next step on
    a sample of the same failures (refused again), and ended with advice meant for the agent ("pick examples where
    the step ran") as the result's reason."""
    from dspy.utils.exceptions import ContextWindowExceededError

    no_sandbox(monkeypatch)
    train, val = make_splits()
    long = " (attached log: " + "x" * 50 + ")"
    train = [e.copy(ticket=e.ticket + long) if i % 3 == 0 else e for i, e in enumerate(train)]

    def task(messages):
        user = last_user_text(messages)
        if long.strip() in user and "[[ ## ticket ## ]]" in user:
            return ContextWindowExceededError(model="fake")
        return task_lm_reply(messages)

    result = compile_tickets(
        FunctionLM(never_called),
        trainset=train,
        eval_lm=FunctionLM(task),
        sub_lm=proposer(POLICY_PROMPT),
        rlm_autopilot="loop",
        max_metric_calls=60,
    )
    calls = [call for turn in result.agent_trajectory for call in turn["pilot"]]
    assert not any(call.startswith("p = propose_instructions('summarize.predict', group=") for call in calls)
    assert result.route.signature.instructions == POLICY_PROMPT  # the failures instructions could fix, fixed
    reason = result.selection["reason"]
    assert "ran on none of the 4 failure(s)" in reason and "ContextWindowExceededError on 4" in reason
    assert "no instructions of 'route' can change" in reason and "pass ids=" not in reason


def test_a_budget_that_pays_targeted_rounds_gets_them_in_a_step_of_their_own(monkeypatch):
    no_sandbox(monkeypatch)

    sub_lm = reflecting("Route tickets carefully.", POLICY_PROMPT)  # GEPA's reflections never help

    result = compile_tickets(
        FunctionLM(never_called, name="root"),
        sub_lm=sub_lm,
        rlm_autopilot="loop",
        max_iterations=7,  # 92 units: GEPA gets 74, a fifth is left for the targeted rounds
    )
    turns = result.agent_trajectory
    assert turns[0]["pilot"][0] == "run_gepa(budget=74)"
    targeted = [call for turn in turns[1:] for call in turn["pilot"]]
    assert any(call.startswith("propose_instructions(") for call in targeted), targeted
    assert any(call.startswith("compare(['current', 'proposal-") for call in targeted), targeted
    assert result.budget["spent"] <= result.budget["limit"]
    assert turns[-1]["final"] and result.route.signature.instructions == POLICY_PROMPT


class Tools:
    """A toolbox that refuses or answers on cue and reports outcomes to the pilot as the real tools do."""

    def __init__(self, pilot: Pilot, left: list[int]):
        self.pilot, self.left, self.calls = pilot, left, []

    def run_gepa(self, budget=None):
        self.calls.append("run_gepa")
        self.left[0] -= budget
        self.pilot.record(GepaFinished(None))
        return {"summary": "gepa run 1: best current"}

    def propose_instructions(self, step):
        self.calls.append("propose")
        raise AgentToolError("no usable instructions -> try again")

    def adopt_candidate(self, candidate):
        raise AssertionError("nothing to adopt")

    def evaluate_program(self, split="train", ids=None):
        raise AssertionError("nothing to evaluate")

    def compare(self, candidates, ids=None):
        raise AssertionError("nothing to compare")


def test_a_step_is_one_phase_and_stops_at_a_refused_action():
    left = [100]
    pilot = Pilot(
        ["route"], lambda: BudgetView(left=left[0], val_size=8, reserve=8, proposals_left=50), lambda: left[0]
    )
    tools = Tools(pilot, left)
    pilot.tools = tools
    assert NEXT_PHASE_LINE in pilot.describe() and "run_gepa(budget=80)" in pilot.describe()
    first = pilot.take_phase()  # GEPA's phase: the run; the next action (a proposal) is a new phase
    assert first["ran"] == ["run_gepa(budget=80)"] and not first["submitted"]
    second = pilot.take_phase()  # the targeted rounds: the proposal is refused, and the step stops there
    assert second["ran"] == ["propose_instructions('route')"] and "refused: no usable instructions" in second["summary"]
    assert tools.calls == ["run_gepa", "propose"] and pilot.submitted is None
    left[0] = 0
    assert pilot.take_phase()["submitted"] and pilot.submitted == "the budget is spent"


class Silent(Tools):
    """Adopts without reporting it (and spends nothing): the same action would come back for ever."""

    def adopt_candidate(self, candidate):
        self.calls.append("adopt")
        return {"changed_steps": []}


def test_a_phase_that_would_repeat_an_action_with_nothing_changed_stops_and_the_loop_ends():
    left = [7]  # too few for the validation check: the adoption alone
    pilot = Pilot(["route"], lambda: BudgetView(left=left[0], val_size=8, reserve=8, proposals_left=0), lambda: 0)
    pilot.record(GepaFinished(None))
    pilot.record(Proposed("route", ("proposal-1",), (1, 2)))
    pilot.record(Compared(("current", "proposal-1"), 1, "train"))
    pilot.tools = Silent(pilot, left)
    report = pilot.take_phase()
    assert pilot.tools.calls == ["adopt"]  # once, then the same action with the same state: stopped
    assert report["ran"] == ["adopt_candidate('proposal-1')"]
    assert "the same action again changes nothing; stopped" in report["summary"]
    # in the loop mode, a phase that changed nothing ends the run with the current instructions
    events = []
    services = SimpleNamespace(
        usage=None,
        stop=SimpleNamespace(raise_if_requested=lambda: None),
        working=SimpleNamespace(instructions=lambda: {"route": "as it was"}),
        observer=SimpleNamespace(on_event=events.append),
        ledger=SimpleNamespace(snapshot=lambda: {"left": left[0]}),
    )
    outcome = run_loop(pilot, services)
    assert outcome.submitted == {"route": "as it was"}
    assert outcome.final_reasoning == "The default loop submitted: the loop's last phase changed nothing."
    assert len(events) == 1 and events[0].turn["final"] and events[0].turn["pilot"] == ["adopt_candidate('proposal-1')"]


class NoAnalysis(Tools):
    """Refuses the analysis (as when its prompts cannot all be paid); proposals are refused too."""

    def analyze_failures(self):
        self.calls.append("analyze")
        raise AgentToolError("analyze_failures: 3 prompts needed, 2 left -> pass use_lm=False")


def test_a_refused_analysis_is_recorded_and_the_loop_goes_on_with_a_plain_proposal():
    left = [40]
    budget = lambda: BudgetView(left=left[0], val_size=8, reserve=8, proposals_left=40, analysis_prompts=2)  # noqa: E731
    pilot = Pilot(["route"], budget, lambda: len(pilot.tools.calls))
    pilot.tools = NoAnalysis(pilot, left)
    pilot.record(GepaFinished(None))
    report = pilot.take_phase()
    assert pilot.tools.calls == ["analyze", "propose"]
    assert report["ran"] == ["analyze_failures()", "propose_instructions('route')"]
    assert "no analysis (analyze_failures: 3 prompts needed" in report["summary"]


class NoDemos(Tools):
    """Refuses demos (no passing example where a step ran); proposals are refused too."""

    def propose_demos(self):
        self.calls.append("demos")
        raise AgentToolError("propose_demos: no passing example where ['route'] ran -> evaluate more train examples")


def test_refused_demos_are_recorded_as_tried_and_the_loop_goes_on_with_a_proposal():
    """Regression: a refused propose_demos ended the phase, and with nothing changed the loop mode ended the run
    with most of its budget unspent."""
    left = [40]
    pilot = Pilot(
        ["route"], lambda: BudgetView(left=left[0], val_size=8, reserve=8, proposals_left=40, demos=True), lambda: 0
    )
    pilot.tools = NoDemos(pilot, left)
    pilot.record(GepaFinished(None))
    report = pilot.take_phase()
    assert pilot.tools.calls == ["demos", "propose"]
    assert report["ran"] == ["propose_demos()", "propose_instructions('route')"]
    assert "no demos (propose_demos: no passing example" in report["summary"]
    assert pilot.state().memory.demos_tried and pilot.state().memory.repeats == 1  # the proposal's, not the demos'


def test_a_proposal_recorded_makes_the_comparison_the_next_action():
    pilot = Pilot(["route"], lambda: BudgetView(left=40, val_size=8, reserve=8, proposals_left=40), lambda: 0)
    pilot.record(GepaFinished(None))
    pilot.record(Proposed("route", ("proposal-1",), (3, 1, 8), (3, 8)))
    assert "compare(['current', 'proposal-1'], ids='3,1,8')" in pilot.describe()


def test_no_class_of_the_package_is_a_dspy_rlm_and_the_async_entry_runs_the_same_loop(monkeypatch):
    for info in pkgutil.walk_packages(rlmoptimizer.__path__, "rlmoptimizer."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            assert not issubclass(cls, dspy.RLM), f"{cls.__module__}.{cls.__name__} subclasses dspy.RLM"
    agent = OptimizerAgent("task_brief -> optimized_dspy_program")
    seen = []
    monkeypatch.setattr(agent, "forward", lambda **kwargs: seen.append(kwargs) or dspy.Prediction(ok=True))
    assert asyncio.run(agent.acall(task_brief="brief")).ok and seen == [{"task_brief": "brief"}]


# -- through the real sandbox ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_assist_with_a_root_lm_that_copies_the_shown_line_ends_as_the_loop_does_in_two_turns(monkeypatch):
    seen: list[str] = []
    copying = copier(seen)
    assisted = compile_tickets(copying, sub_lm=proposer(POLICY_PROMPT), max_metric_calls=60, rlm_autopilot="assist")
    assert seen == [NEXT_PHASE_LINE] * len(seen) and 1 <= len(seen) <= 2
    assert len(assisted.agent_trajectory) <= 2 and assisted.agent_trajectory[-1]["final"]
    assert "next_phase" in assisted.agent_trajectory[0]["code"]
    no_sandbox(monkeypatch)
    looped = compile_tickets(
        FunctionLM(never_called), sub_lm=proposer(POLICY_PROMPT), max_metric_calls=60, rlm_autopilot="loop"
    )
    assert assisted.optimized_dspy_program == looped.optimized_dspy_program
    assert assisted.selection["chosen_score"] == looped.selection["chosen_score"] == 1.0
    assert assisted.budget["spent"] == looped.budget["spent"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["assist", "off"])
def test_a_turn_that_makes_no_progress_is_followed_by_the_loop_only_in_assist(mode):
    # what a 1.5B root wrote on the real-model benchmark: a comment, then an import of a tool, and so on
    idle = [
        {"reasoning": "No changes needed yet.", "code": "# No changes needed yet."},
        {"reasoning": "run GEPA", "code": "from gepa import run_gepa\nr = run_gepa(budget=44)"},
    ]
    root = FunctionLM(lambda messages: idle[steps_seen(messages) % 2], name="idle")
    result = compile_tickets(
        root, sub_lm=proposer(POLICY_PROMPT), max_iterations=3, rlm_max_iterations=4, rlm_autopilot=mode
    )
    turns = result.agent_trajectory
    if mode == "off":
        assert all("pilot" not in turn and "[pilot]" not in turn["output"] for turn in turns)
        assert len(turns) == 4 + 1 and result.route.signature.instructions == ORIGINAL_ROUTE  # + how it ended
        assert turns[-1]["code"] == "" and turns[-1]["final"]
        return
    assert turns[0]["code"] == idle[0]["code"]  # the cell stays the agent's; the phase ran after it
    assert "[pilot] this turn spent nothing, evaluated nothing new, made no candidate" in turns[0]["output"]
    assert turns[0]["pilot"][0] == "run_gepa(budget=44)"
    assert turns[-1]["final"] and len(turns) <= 2
    assert result.route.signature.instructions == POLICY_PROMPT


@pytest.mark.slow
@pytest.mark.parametrize("fixes_it", [True, False])
def test_assist_gives_a_turn_whose_cell_failed_one_more_turn_before_the_loop_takes_over(fixes_it):
    """Regression: a refused SUBMIT (a misspelled step) counted as a turn without progress, so the loop spent the
    budget and submitted in that same turn, before the agent could read the error and fix the name."""
    misspelled = {"reasoning": "submit", "code": f"SUBMIT(optimized_dspy_program={{'router': {POLICY_PROMPT!r}}})"}
    fixed = {"reasoning": "fix the name", "code": f"SUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})"}
    broken = {"reasoning": "again", "code": "r = run_gepa(budget=20"}  # a syntax error: no progress either
    turns_played = [misspelled, fixed if fixes_it else broken]
    root = FunctionLM(lambda messages: turns_played[min(steps_seen(messages), 1)], name="root")
    result = compile_tickets(root, sub_lm=proposer(POLICY_PROMPT), max_metric_calls=60, rlm_autopilot="assist")
    turns = result.agent_trajectory
    assert "Submission refused: unknown step name 'router'" in turns[0]["output"] and "pilot" not in turns[0]
    assert result.route.signature.instructions == POLICY_PROMPT
    if fixes_it:  # the agent's own submission, checked on validation: nothing of the budget on the loop
        assert len(turns) == 2 and "pilot" not in turns[1] and turns[1]["final"]
        assert result.budget["spent"] == 8  # the submission's check on the 8 validation examples
    else:  # a second failed turn in a row: the loop takes its next phase after it
        assert "[pilot] this turn spent nothing" in turns[1]["output"] and turns[1]["pilot"]


@pytest.mark.slow
def test_an_agent_that_analyses_and_takes_notes_is_not_taken_over():
    turns = [
        {"reasoning": "look", "code": "print(baseline_train['score'])\nadd_note('route decides every failure')"},
        {"reasoning": "one step of the loop", "code": NEXT_PHASE_LINE},
        {"reasoning": "done", "code": "SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"},
    ]
    result = compile_tickets(
        turns, sub_lm=FunctionLM(lambda m: json.dumps({"new_instruction": POLICY_PROMPT})), rlm_autopilot="assist"
    )
    trajectory = result.agent_trajectory
    assert [t["code"] for t in trajectory] == [t["code"] for t in turns[: len(trajectory)]]
    assert "[pilot]" not in trajectory[0]["output"]
    assert "run_gepa(budget=" in trajectory[1]["output"]
    assert result.route.signature.instructions == POLICY_PROMPT


# -- the loop's budget rules, end to end (loop mode: no sandbox) -------------------------------------------------
def test_without_a_validation_split_the_loop_stays_inside_max_metric_calls(monkeypatch):
    no_sandbox(monkeypatch)
    trainset, _ = make_splits()
    counting = CountingMetric()

    sub_lm = reflecting("Route tickets carefully.", POLICY_PROMPT)  # GEPA's reflections never help

    result = compile_tickets(
        FunctionLM(never_called),
        sub_lm=sub_lm,
        rlm_autopilot="loop",
        max_metric_calls=60,
        trainset=trainset,
        valset=None,
        metric=counting,
    )
    assert counting.calls <= 60
    assert result.selection["split"] == "train"
    # the start fails 2 of the 12 train examples: the fix wins those 2, a gain one example could undo, so the
    # unchanged program is returned, and the reason says why
    assert result.route.signature.instructions == ORIGINAL_ROUTE
    assert "won 2 and lost 0 of 12 train examples: a gain one example could undo" in result.selection["reason"]
    whole_train = [call for turn in result.agent_trajectory for call in turn["pilot"] if "ids='0,1,2,3,4,5,6" in call]
    assert len(whole_train) == 1  # the candidate ahead on part of train was checked on all of it, once
    # the proposal is a sub-LM prompt, not a metric call: counted apart, as dspy.GEPA counts
    assert result.budget["spent_by_kind"]["sub_lm_call"] >= 1 and "sub_lm_left" in result.budget


def test_what_gepa_leaves_too_little_to_compare_on_checks_the_largest_groups_proposal_on_validation(monkeypatch):
    no_sandbox(monkeypatch)

    sub_lm = reflecting("Route tickets carefully.", POLICY_PROMPT)  # GEPA's reflections never help

    # 30 calls: 8 for the validation baseline, 22 for GEPA, which stops with 11 left: too few for a child it could
    # keep (its parent's minibatch, its own and the 8 validation examples)
    result = compile_tickets(FunctionLM(never_called), sub_lm=sub_lm, max_metric_calls=30, rlm_autopilot="loop")
    turns = result.agent_trajectory
    assert "the 11 unit(s) left cannot pay a child that could be kept" in turns[0]["output"]
    targeted = turns[1]["pilot"]
    # besides the 8 a validation check takes, 3 would compare on 3 train examples, where a clear gain needs all 3:
    # the proposal for the analysis' largest group is checked on validation at once instead
    assert targeted[0] == "analyze_failures()"
    assert targeted[1].startswith("p = propose_instructions('route', group={'analysis': 'analysis-1', 'name': ")
    assert targeted[1].endswith("adopt_candidate(p['candidate_ids'][0]); evaluate_program(split='val')")
    assert targeted[2:] == ["SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"]
    assert result.route.signature.instructions == POLICY_PROMPT
    assert result.selection["basis"] == "submission" and result.selection["chosen_score"] == 1.0
    assert result.budget["spent"] == 11 + 8 <= result.budget["limit"] == 22


def test_a_last_draw_that_repeats_the_current_instructions_changes_nothing(monkeypatch):
    no_sandbox(monkeypatch)

    sub_lm = reflecting("Route tickets carefully.", ORIGINAL_ROUTE)  # GEPA's reflections never help

    # 24 calls: GEPA (16) stops with 13 left, 5 of them find failures on train, their analysis is free of the budget
    # (sub-LM prompts have their own allowance): the 8 left pay the last draw, for its largest group
    result = compile_tickets(FunctionLM(never_called), sub_lm=sub_lm, max_metric_calls=24, rlm_autopilot="loop")
    turns = result.agent_trajectory
    calls = turns[-1]["pilot"]
    assert calls[:2] == ["evaluate_program(ids='0,2,3,4,5')", "analyze_failures()"]
    assert calls[2].startswith("p = propose_instructions('route', group={'analysis': 'analysis-1', ")
    assert "adopted proposal-1 (changed: nothing)" in turns[-1]["output"]
    # the proposal was adopted: comparing it with the current instructions (itself) is no next action
    assert not any(call.startswith("compare(") for turn in turns for call in turn["pilot"])
    assert result.route.signature.instructions == ORIGINAL_ROUTE


def test_after_gepa_the_loop_analyses_the_failures_and_proposes_for_the_largest_group(monkeypatch):
    no_sandbox(monkeypatch)
    from support.analysing import DISPUTE_CAUSE, GROUP, analysis_answer

    def reply(messages):
        user = last_user_text(messages)
        if any(Path(frame.filename).name == "gepa_adapter.py" for frame in inspect.stack()):
            return json.dumps({"new_instruction": "Route tickets carefully."})  # GEPA's reflections never help
        answer = analysis_answer(user)
        if answer is not None:
            return answer
        # a proposal states the policy only when it was told the group's cause
        text = POLICY_PROMPT if DISPUTE_CAUSE in user else "Route each ticket to one queue."
        return json.dumps({"new_instruction": text})

    result = compile_tickets(
        FunctionLM(never_called, name="root"),
        sub_lm=FunctionLM(reply, name="sub"),
        rlm_autopilot="loop",
        max_iterations=7,
    )
    targeted = [call for turn in result.agent_trajectory[1:] for call in turn["pilot"]]
    assert targeted[0] == "analyze_failures()", targeted
    made_for = result.detailed_results.lineage["proposal-1"]["made_for"]
    assert targeted[1] == f"propose_instructions('route', group={{'analysis': 'analysis-1', 'name': {GROUP!r}}})"
    assert made_for["analysis"] == "analysis-1" and made_for["group"] == GROUP and made_for["example_ids"]
    assert targeted[2].startswith("compare(['current', 'proposal-1'], ids=")
    assert result.route.signature.instructions == POLICY_PROMPT
    assert result.selection["chosen_score"] == 1.0 > result.selection["baseline_score"]


def test_a_lead_on_validation_that_is_not_clear_is_confirmed_on_fresh_train_examples_and_returned(monkeypatch):
    no_sandbox(monkeypatch)
    train, val = make_splits()
    more = [  # the kind the unchanged instructions route to billing: the policy's gain shows on train too
        dspy.Example(ticket=f"My bank filed a chargeback for order {n}.", queue="disputes").with_inputs("ticket")
        for n in range(6)
    ]
    counting = CountingMetric()
    result = compile_tickets(
        FunctionLM(never_called),
        sub_lm=proposer(POLICY_PROMPT),
        max_metric_calls=40,
        rlm_autopilot="loop",
        trainset=train + more,
        valset=val[:6],  # the policy wins 2 of these 6 and loses none: a lead, not a clear gain
        metric=counting,
    )
    assert counting.calls <= 40
    calls = [call for turn in result.agent_trajectory for call in turn["pilot"]]
    confirm = next(call for call in calls if call.startswith("confirm_gain("))
    assert calls.index(confirm) == len(calls) - 2  # after GEPA's best was adopted and checked, before SUBMIT
    assert result.route.signature.instructions == POLICY_PROMPT
    reason = result.selection["reason"]
    assert "a clear gain: it won 2 and lost 0 of 6 val examples, won 2 and lost 0 of 3 fresh train examples" in reason
    # the fresh examples are ones no search saw (no candidate was evaluated on or written from them, a child GEPA
    # did not keep included), each run with the unchanged program too
    runs = [json.loads(p.read_text()) for p in sorted(Path(result.run_storage_dir, "runs").glob("run-*.json"))]
    confirmed = {run["instructions"]["route"]: run for run in runs if run["label"] == "confirm"}
    assert set(confirmed) == {POLICY_PROMPT, ORIGINAL_ROUTE}
    fresh = {r["example_id"] for r in confirmed[POLICY_PROMPT]["records"]}
    before = [run for run in runs if run["run_id"] < confirmed[POLICY_PROMPT]["run_id"]]
    seen = {
        r["example_id"]
        for run in before
        if run["split"] == "train" and run["instructions"]["route"] != ORIGINAL_ROUTE
        for r in run["records"]
    }
    reflected = {i for entry in result.detailed_results.lineage.values() for i in entry.get("reflected_on", ())}
    assert len(fresh) == 3 and not fresh & seen and not fresh & reflected and reflected
    not_kept = [
        e for e in result.detailed_results.lineage.values() if e["move"].startswith("gepa reflective proposal (not")
    ]
    assert not_kept and all(e["reflected_on"] and e["parents"] == ["current"] for e in not_kept)


@pytest.mark.parametrize("budget", [{"max_metric_calls": 80}, {"max_iterations": 6}])
def test_gepa_stops_when_its_reflections_only_repeat_instructions_already_tried(monkeypatch, budget):
    no_sandbox(monkeypatch)
    reflections = []

    def same_text(messages):
        reflections.append(1)
        return json.dumps({"new_instruction": "Route tickets carefully."})

    result = compile_tickets(
        FunctionLM(never_called), sub_lm=FunctionLM(same_text, name="sub"), rlm_autopilot="loop", **budget
    )
    gepa = result.agent_trajectory[0]["output"]
    # a repeated text's child is a candidate already scored where it was run: free, so without this stop the engine
    # would reflect until the sub-LM allowance (80 prompts) ran out
    assert (
        "proposed only instructions already tried and evaluated nothing new: the reflection LM repeats itself" in gepa
    )
    # (with max_iterations a reflection is a unit of the budget, which is no evaluation: the run stops the same)
    assert len(reflections) < 12


@pytest.mark.slow
def test_a_root_lm_that_repeats_the_same_evaluation_is_taken_over_after_the_first_repeat():
    # what a 1.5B root did on the real-model benchmark: the same train evaluation, turn after turn; the first one
    # paid and checked something, the repeats are answered from stored records and check nothing new
    same = {"reasoning": "look at train", "code": "r = evaluate_program(split='train')\nprint(r['score'])"}
    root = FunctionLM(lambda messages: same, name="repeater")
    result = compile_tickets(
        root, sub_lm=proposer(POLICY_PROMPT), max_iterations=3, rlm_max_iterations=6, rlm_autopilot="assist"
    )
    turns = result.agent_trajectory
    assert "[pilot]" not in turns[0]["output"]  # the first evaluation was new: the agent's turn, untouched
    assert "[pilot] this turn spent nothing, evaluated nothing new" in turns[1]["output"]
    assert turns[1]["pilot"][0].startswith("run_gepa(")
    assert turns[-1]["final"] and len(turns) <= 3
    assert result.route.signature.instructions == POLICY_PROMPT
