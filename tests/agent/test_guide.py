"""The default loop as the state block names it, one runnable line per turn: a root LM that does nothing but
copy that line optimizes a real two-step program through the real sandbox, and a stuck agent's repeat notice
names the line that moves it on."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
from support.fakes import FunctionLM
from support.optimizing import ORIGINAL_ROUTE, compile_tickets, copier, proposer, steps_seen
from support.tickets import POLICY_PROMPT, make_splits, metric

from rlmoptimizer.agent._dspy import REPLHistory
from rlmoptimizer.agent.guide import SUBMIT_LINE, LoopGuide, refused_repeat

pytestmark = pytest.mark.slow


# The default loop starts with GEPA (tests/agent/test_gepa.py follows a copying root LM through it). These tests
# follow the targeted round after it: the agent runs GEPA itself on a one-unit slice first (too little to pay a
# child that could be kept: GEPA stops before its first iteration, nothing to adopt), and the loop goes on with
# propose -> compare -> adopt.
GEPA_FIRST = {"reasoning": "GEPA on a slice of one unit", "code": "r = run_gepa(budget=1); print(r['summary'])"}


def gepa_first(then) -> FunctionLM:
    """A root LM whose first turn is :data:`GEPA_FIRST`, then ``then(messages)`` (a turn)."""
    return FunctionLM(lambda messages: GEPA_FIRST if steps_seen(messages) == 0 else then(messages), name="agent")


def playing(*turns) -> FunctionLM:
    """:data:`GEPA_FIRST`, then ``turns`` in order."""
    return gepa_first(lambda messages: turns[min(steps_seen(messages), len(turns)) - 1])


def compile_with(root_lm, sub_lm, **kwargs):
    return compile_tickets(root_lm, sub_lm=sub_lm, **kwargs)


def test_a_root_lm_that_only_copies_the_suggested_line_optimizes_the_program():
    seen: list[str] = []
    # a useless first proposal, then the policy
    sub_lm = proposer("Answer with the queue.", POLICY_PROMPT)
    result = compile_with(gepa_first(copier(seen).fn), sub_lm, max_iterations=3, rlm_max_iterations=13)

    assert "0 new candidate(s); spent 0 of 1 unit(s)" in result.agent_trajectory[0]["output"]
    codes = [turn["code"] for turn in result.agent_trajectory][1:]
    # the failures 3 and 8, each followed by one of a sample of 5 other examples, then the rest of the sample
    compare = r"r = compare\(\['current', 'proposal-{}'\], ids='3,\d+,8(,\d+){{4}}'\); print\(r\['summary'\]\)"
    assert codes[0] == "p = propose_instructions('route'); print(p['texts'])"  # round robin: the last step first
    assert re.fullmatch(compare.format(1), codes[1])
    # the first proposal did not win: nothing to adopt; propose again, for the other step
    assert codes[2] == "p = propose_instructions('summarize.predict'); print(p['texts'])"
    assert re.fullmatch(compare.format(2), codes[3])
    assert codes[4] == "p = propose_instructions('route'); print(p['texts'])"
    # 44 units - 3 proposals - 14 compared - 8 kept for validation: 19 to spend, a third of it (6) on this one
    assert re.fullmatch(compare.format(3).replace("{4}", "{3}"), codes[5])
    checked = {int(i) for i in re.search(r"ids='([\d,]+)'", codes[5]).group(1).split(",")}
    unseen = [str(i) for i in range(12) if i not in checked]
    # 44 units: 3 proposals, 7 + 7 + 6 compared, 8 for validation leave 13, of which 8 stay kept for a check
    unseen = ",".join(unseen[:5])
    assert codes[6:8] == [
        "print(adopt_candidate('proposal-3')); print(evaluate_program(split='val'))",
        # the policy passes every example it was checked on: more of train is evaluated before anything else
        f"print(evaluate_program(ids='{unseen}')['score'])",
    ]
    assert codes[8] == SUBMIT_LINE  # what is left is kept for a validation check
    assert all("Error" not in turn["output"] for turn in result.agent_trajectory), result.agent_trajectory

    assert result.optimized_dspy_program["route"] == POLICY_PROMPT
    assert result.route.signature.instructions == POLICY_PROMPT
    # three proposal calls, each a distinct sample: the second one on the same failures was not dspy's cached reply
    assert len(sub_lm.calls) == 3
    spent = result.budget["spent_by_kind"]
    assert spent["sub_lm_call"] == 3
    # compares: 7 + 7 + 6 new records (the baseline's are free); 8 for validation; 5 more of train
    assert spent["train_example"] == 7 + 7 + 6 + 5 and spent["val_example"] == 8


def test_a_repeated_cell_is_answered_with_the_next_line():
    stuck = {"reasoning": "nothing to change", "code": "print(baseline_train['score'])"}
    result = compile_with(
        playing(stuck, stuck, {"reasoning": "done", "code": SUBMIT_LINE}),
        proposer(POLICY_PROMPT),
        max_iterations=2,
        rlm_max_iterations=4,
    )
    repeated = result.agent_trajectory[2]["output"]
    assert "This code already ran once (step 2)" in repeated
    assert "Run this next instead: p = propose_instructions('route'); print(p['texts'])" in repeated


def test_adopt_candidate_refuses_what_it_cannot_adopt_and_names_what_it_takes():
    bad = (
        "for c in ['proposal-9', 'current', 'run-0099', {'routing': 'x'}, 42]:\n"
        "    try:\n        adopt_candidate(c)\n    except Exception as e:\n        print('REFUSED', e)\n"
    )
    turns = iter([{"reasoning": "try", "code": bad}, {"reasoning": "done", "code": SUBMIT_LINE}])
    result = compile_with(FunctionLM(lambda messages: next(turns)), proposer(POLICY_PROMPT), max_iterations=2)
    refused = [line for line in result.agent_trajectory[0]["output"].splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 5
    assert (
        "no candidate with id 'proposal-9' -> use an id propose_instructions or run_gepa returned: none yet"
        in refused[0]
    )
    assert "'current' is already the current instructions" in refused[1]
    assert "no run with id 'run-0099' -> use one of ['run-0001', 'run-0002']" in refused[2]
    assert "routing" in refused[3] and "route" in refused[3]
    assert "the candidate is int 42" in refused[4]
    assert result.route.signature.instructions == ORIGINAL_ROUTE


def test_the_guide_keeps_a_validation_check_paid_for_and_stops_at_submit():
    left = [20]
    guide = LoopGuide(["a", "b"], lambda: left[0], val_size=8, train_status=lambda: ([], 2))
    assert guide.next_line() == f"r = run_gepa(budget={guide.gepa_budget(20)}); print(r['summary'])"  # GEPA first
    guide.gepa_finished(None)  # it found nothing better: the targeted round
    guide.proposed("b", ["proposal-1", "proposal-2"], [1, 2, 3, 4, 5, 6, 7], failure_ids=[1, 2])
    # 20 left, 8 kept for validation: 6 units per candidate, a third of it (at least 3 examples) for this
    # comparison; the failures and the others taken in turn
    assert guide.next_line() == "r = compare(['current', 'proposal-1', 'proposal-2'], ids='1,3,2'); print(r['summary'])"
    left[0] = 200  # a large budget compares on every check id
    assert (
        guide.next_line()
        == "r = compare(['current', 'proposal-1', 'proposal-2'], ids='1,3,2,4,5,6,7'); print(r['summary'])"
    )
    left[0] = 20
    guide.compared(["current", "proposal-1", "proposal-2"], 2, "train")
    assert guide.next_line() == "print(adopt_candidate('proposal-2')); print(evaluate_program(split='val'))"
    left[0] = 7  # too little for the checkpoint: the adoption alone
    assert guide.next_line() == "print(adopt_candidate('proposal-2'))"
    guide.changed()
    left[0] = 9
    assert guide.next_line() == "print(evaluate_program(split='val'))"
    guide.validated()
    left[0] = 1 + 8 + 3  # a proposal and a 2-example comparison still fit beside the next check
    assert guide.next_line() == "p = propose_instructions('a'); print(p['texts'])"
    left[0] = 8 + 2
    assert guide.next_line() == SUBMIT_LINE
    guide.changed()
    left[0] = 7  # an unchecked change, and validation no longer fits: nothing else to do
    assert guide.next_line() == SUBMIT_LINE


def test_without_a_validation_split_the_copied_loop_stays_inside_max_metric_calls():
    trainset, _ = make_splits()
    calls = []

    def counting(example, prediction, trace=None):
        calls.append(1)
        return metric(example, prediction, trace)

    seen: list[str] = []
    result = compile_with(
        gepa_first(copier(seen).fn),
        proposer(POLICY_PROMPT),
        max_metric_calls=30,
        rlm_max_iterations=9,
        trainset=trainset,
        valset=None,
        metric=counting,
    )
    codes = [turn["code"] for turn in result.agent_trajectory][1:]
    assert codes[:3] == [
        "p = propose_instructions('route'); print(p['texts'])",
        codes[1],  # the comparison on 3, 8 and others (checked in the test above)
        "print(adopt_candidate('proposal-1'))",
    ]
    assert codes[1].startswith("r = compare(['current', 'proposal-1'], ids='3,")
    # 18 units: 12 kept for one check on train, 1 for the proposal; the comparison took 3 (a third, at least 3)
    assert len(codes[1].split("ids='")[1].split("'")[0].split(",")) == 3
    assert result.route.signature.instructions == POLICY_PROMPT
    assert result.selection["split"] == "train" and result.selection["chosen_label"] == "submission"
    # the baseline's 12, the comparison's 3, and the check of the submission on the 9 train examples it had not seen;
    # the proposal is a sub-LM prompt, not a metric call: counted apart, as dspy.GEPA counts
    assert len(calls) == 12 + 3 + 9 and result.budget["spent"] == 3 + 9
    assert result.budget["spent_by_kind"]["sub_lm_call"] == 1 and result.budget["sub_lm_left"] == 29


def test_a_cell_repeated_with_a_new_output_is_answered_with_the_next_line_when_that_differs():
    again = {"reasoning": "propose", "code": "p = propose_instructions('route'); print(p['texts'])"}
    result = compile_with(
        playing(again, again, {"reasoning": "done", "code": SUBMIT_LINE}),
        proposer("First text.", "Second text."),
        max_iterations=2,
        rlm_max_iterations=4,
    )
    first, second = (turn["output"] for turn in result.agent_trajectory[1:3])
    assert "[Notice]" not in first and "Second text." in second
    # the copied cell sampled a new proposal; what the loop does next is compare it
    assert re.search(
        r"\[Notice\] The same code ran at step 2\. The default loop's next line is: "
        r"r = compare\(\['current', 'proposal-2'\], ids='3,",
        second,
    )


@pytest.mark.parametrize("autopilot", [True, False])
def test_an_agent_stuck_on_a_cell_that_changes_nothing_is_driven_by_the_autopilot(autopilot):
    stuck = {"reasoning": "No modifications needed.", "code": "print(baseline_train['score'])"}
    result = compile_with(
        FunctionLM(lambda messages: stuck),
        proposer(POLICY_PROMPT),
        max_iterations=3,
        rlm_max_iterations=9,
        rlm_autopilot=autopilot,
    )
    turns = result.agent_trajectory
    assert [t["code"] for t in turns[:2]] == [stuck["code"]] * 2
    assert "running it again changes nothing" in turns[1]["output"]  # told once, with the line to run
    if not autopilot:
        assert all(t["code"] == stuck["code"] for t in turns)
        assert result.route.signature.instructions == ORIGINAL_ROUTE
        return
    # from then on each turn runs the default loop's next line in place of the stuck cell, and says so: GEPA with
    # the whole budget (too small for a targeted round after it), then in the same turn its best adopted and
    # checked (a line that asks for no decision), then SUBMIT
    adopt = "print(adopt_candidate('gepa-1')); print(evaluate_program(split='val'))"
    assert turns[2]["code"] == f"r = run_gepa(budget=44); print(r['summary'])\n{adopt}"
    assert (
        "[Autopilot] ran the default loop's next line in place of a cell that repeated step 1" in turns[2]["reasoning"]
    )
    assert turns[2]["output"].startswith(
        "[Autopilot] this line ran in place of a cell that repeated step 1 and changed nothing.\n"
    )
    assert turns[3]["final"] and turns[3]["code"] == SUBMIT_LINE and len(turns) == 4
    assert result.route.signature.instructions == POLICY_PROMPT
    assert result.selection["chosen_score"] == 1.0


def test_cells_that_do_nothing_are_told_once_then_the_autopilot_runs_the_loop_after_them():
    # what a 1.5B root wrote on the real-model benchmark: a comment, then a function it never calls, and so on
    idle = [
        {"reasoning": "No changes needed yet.", "code": "# No changes needed yet."},
        {"reasoning": "A helper.", "code": "def route_predict(ticket):\n    return 'billing'"},
    ]
    result = compile_with(
        FunctionLM(lambda messages: idle[steps_seen(messages) % 2]),
        proposer(POLICY_PROMPT),
        max_iterations=3,
        rlm_max_iterations=5,
    )
    turns = result.agent_trajectory
    assert turns[0]["code"] == idle[0]["code"]
    assert (
        "[Notice] This cell called no tool and printed nothing: it changed nothing. After a next cell like it, the "
        "default loop's next line runs: r = run_gepa(budget=44)"
    ) in turns[0]["output"]
    # the second such cell runs (its function is defined), then the next line runs after it, in the same turn, and
    # the adoption of GEPA's best after that (a line that asks for no decision)
    gepa = "r = run_gepa(budget=44); print(r['summary'])"
    adopt = "print(adopt_candidate('gepa-1')); print(evaluate_program(split='val'))"
    assert turns[1]["code"] == f"{idle[1]['code']}\n{gepa}\n{adopt}"
    assert "the cell above called no tool and printed nothing, as step 1 did" in turns[1]["output"]
    assert "gepa run 1: best gepa-1" in turns[1]["output"]
    # then the next line is SUBMIT, which is never run after an idle cell: ending the run is the agent's
    assert [t["code"] for t in turns[2:4]] == [idle[0]["code"], idle[1]["code"]]
    # ... or the autopilot's, in place of a cell known to change nothing (step 3 was told so)
    assert turns[4]["code"] == SUBMIT_LINE and "in place of a cell that repeated step 1" in turns[4]["reasoning"]
    assert result.route.signature.instructions == POLICY_PROMPT


def test_a_silent_helper_cell_then_a_cell_that_calls_it_is_not_taken_over():
    turns = [
        {"reasoning": "a helper", "code": "def score_of(ids):\n    return evaluate_program(ids=ids)['score']"},
        {"reasoning": "use it", "code": "s = score_of('0,1')"},  # calls a tool through the helper, prints nothing
        {"reasoning": "oops", "code": "undefined_name"},
        {"reasoning": "fix quietly", "code": "import collections"},  # silent, but after an error: not idle before
        {"reasoning": "submit", "code": SUBMIT_LINE},
    ]
    result = compile_with(turns, proposer(POLICY_PROMPT), max_iterations=3, rlm_max_iterations=6)
    codes = [t["code"] for t in result.agent_trajectory]
    assert codes == [t["code"] for t in turns]  # every cell ran as written
    assert not any("[Autopilot]" in t["output"] for t in result.agent_trajectory)
    assert "called no tool and printed nothing" in result.agent_trajectory[0]["output"]  # told, not taken over
    assert "called no tool" not in result.agent_trajectory[1]["output"]


def test_no_proposal_is_suggested_when_no_sub_lm_prompt_can_be_paid():
    sub_left = [5]
    guide = LoopGuide(
        ["route"], lambda: 30, val_size=4, train_status=lambda: ([], 2), proposals_left=lambda: sub_left[0]
    )
    guide.gepa_finished(None)
    assert guide.next_line() == "p = propose_instructions('route'); print(p['texts'])"
    sub_left[0] = 0  # with max_metric_calls, the sub-LM prompts' own allowance is spent: metric calls are left
    assert guide.next_line() == SUBMIT_LINE


LAST_DRAW = (
    "p = propose_instructions('route'); print(adopt_candidate(p['candidate_ids'][0])); "
    "print(evaluate_program(split='val'))"
)


def test_what_gepa_leaves_that_pays_a_validation_check_buys_one_more_proposal_checked_there():
    seen: list[str] = []
    copying = copier(seen)

    def sub_lm(messages):  # GEPA's reflections are useless; the proposal of the last-draw line is the fix
        gepa = any(Path(frame.filename).name == "gepa_adapter.py" for frame in inspect.stack())
        return json.dumps({"new_instruction": "Route tickets carefully." if gepa else POLICY_PROMPT})

    # 30 calls: 8 for the validation baseline, 22 for GEPA, which stops with 8 left: too few for a child it could
    # keep (a minibatch of 3 and the 8 validation examples), exactly one validation check
    result = compile_with(copying, FunctionLM(sub_lm, name="sub"), max_metric_calls=30, rlm_max_iterations=8)

    codes = [turn["code"] for turn in result.agent_trajectory]
    assert "the 8 unit(s) left cannot pay a child that could be kept" in result.agent_trajectory[0]["output"]
    # the last draw asks for no decision: it runs in the same turn; then no call was left, and the run ended
    assert codes == [f"r = run_gepa(budget=22); print(r['summary'])\n{LAST_DRAW}"]
    assert seen == ["r = run_gepa(budget=22); print(r['summary'])"]  # the root LM was asked once
    assert result.route.signature.instructions == POLICY_PROMPT
    assert result.selection["basis"] == "submission" and result.selection["chosen_score"] == 1.0
    assert result.budget["spent"] == result.budget["limit"] == 22


def test_the_last_draw_is_offered_once_after_gepa_and_only_when_its_check_can_be_paid():
    left, failing = [22], [2]
    guide = LoopGuide(
        ["a", "route"],
        lambda: left[0],
        val_size=20,
        train_status=lambda: ([], failing[0]),
        proposals_share_budget=False,
    )
    assert guide.next_line().startswith("r = run_gepa(")  # GEPA first
    assert guide.follow_on() is None  # how much to give GEPA is the agent's decision
    guide.gepa_finished(None)
    assert guide.next_line() == LAST_DRAW
    assert guide.follow_on() == LAST_DRAW  # the one move left: it asks for no decision
    left[0] = 19  # the check cannot be paid
    assert guide.next_line() == SUBMIT_LINE
    assert guide.follow_on() is None  # ending the run is never run after a cell
    left[0], failing[0] = 20, 0  # nothing failing to learn from
    assert guide.next_line() == SUBMIT_LINE
    failing[0] = 2
    assert guide.next_line() == LAST_DRAW
    guide.proposed("route", ["proposal-1"], [1, 2], failure_ids=[1])
    guide.changed()
    guide.validated()
    assert guide.next_line() == SUBMIT_LINE  # once

    # GEPA's best is adopted with its check, free (GEPA scored it on validation): no decision either
    guide.gepa_finished("gepa-3")
    adopt = "print(adopt_candidate('gepa-3')); print(evaluate_program(split='val'))"
    assert guide.next_line() == guide.follow_on() == adopt
    guide.compared(["current", "proposal-2"], 1, "train")  # a winner of the agent's own comparison: its decision
    assert guide.next_line() == "print(adopt_candidate('proposal-2')); print(evaluate_program(split='val'))"
    assert guide.follow_on() is None

    # when a proposal is paid from the same units, the check needs one more
    shared = LoopGuide(["route"], lambda: 20, val_size=20, train_status=lambda: ([], 2))
    shared.gepa_finished(None)
    assert shared.next_line() == SUBMIT_LINE


def test_a_cell_repeated_and_refused_is_followed_by_the_next_line_in_the_same_turn():
    # what a 1.5B root does after GEPA: it runs its last cell again, whose budget is no longer there
    gepa = {"reasoning": "GEPA", "code": "r = run_gepa(budget=40); print(r['summary'])"}
    result = compile_with(
        FunctionLM(lambda messages: gepa),
        FunctionLM(lambda messages: json.dumps({"new_instruction": "Route tickets carefully."}), name="sub"),
        max_iterations=4,
        rlm_max_iterations=6,
    )
    turns = result.agent_trajectory
    assert turns[0]["code"] == gepa["code"]  # its own budget, not the line shown: nothing runs after it
    # run again, refused (the budget is not there any more): it changed nothing, and the loop's next line runs
    # after it in the same turn
    propose = "p = propose_instructions('route'); print(p['texts'])"
    assert turns[1]["code"] == f"{gepa['code']}\n{propose}"
    output = turns[1]["output"]
    assert output.startswith("[Error] AgentToolError: ['run_gepa: budget=40 but only ")
    assert (
        "[Autopilot] the cell above repeated step 1 and a tool refused it; the default loop's next line ran after "
        f"it: {propose}\n['Route tickets carefully.']"
    ) in output
    assert "[Autopilot]" in turns[1]["reasoning"]
    assert result.budget["spent_by_kind"]["sub_lm_call"] >= 1


def test_a_refused_cell_that_repeats_nothing_is_left_to_the_agent():
    bad = {"reasoning": "too much", "code": "r = run_gepa(budget=100000); print(r['summary'])"}
    result = compile_with(
        playing(bad, {"reasoning": "done", "code": SUBMIT_LINE}), proposer(POLICY_PROMPT), max_iterations=3
    )
    turns = result.agent_trajectory
    assert turns[1]["code"] == bad["code"] and turns[1]["output"].startswith("[Error] AgentToolError")
    assert "[Autopilot]" not in turns[1]["output"]  # a first refusal is the agent's to fix
    assert turns[2]["code"] == SUBMIT_LINE and len(turns) == 3


def _history(*cells: tuple[str, str]) -> REPLHistory:
    history = REPLHistory()
    for code, output in cells:
        history = history.append(reasoning="", code=code, output=output)
    return history


def test_a_refused_repeat_ends_the_run_only_when_the_cell_once_ran():
    gepa = "r = run_gepa(budget=40); print(r['summary'])"
    refused = "[Error] AgentToolError: ['run_gepa: budget=40 but only 0 unit(s) are left -> pass budget=0 or less']"
    ran_once = _history((gepa, "gepa run 1: best gepa-1"))
    # run, then copied and refused: it changed nothing, the next line runs after it, SUBMIT included
    assert refused_repeat(ran_once, gepa, refused, SUBMIT_LINE) == "repeated step 1 and a tool refused it"
    assert refused_repeat(ran_once, gepa, refused, "print(evaluate_program(split='val'))") is not None
    # refused both times (bad arguments, likely): the loop may go on, but ending the run waits for the notice
    refused_twice = _history((gepa, refused))
    assert refused_repeat(refused_twice, gepa, refused, SUBMIT_LINE) is None
    assert refused_repeat(refused_twice, gepa, refused, "print(evaluate_program(split='val'))") is not None
    # not a repeat, not refused, or the next line is the cell itself: nothing runs after it
    assert refused_repeat(ran_once, "r = run_gepa(budget=41); print(r['summary'])", refused, SUBMIT_LINE) is None
    assert refused_repeat(ran_once, gepa, "gepa run 2: best current", SUBMIT_LINE) is None
    assert refused_repeat(ran_once, gepa, refused, gepa) is None


def test_a_helper_cell_after_a_turn_that_followed_the_loop_is_the_agents_own():
    seen: list[str] = []
    copying = copier(seen)
    helper = {"reasoning": "a helper", "code": "def failing(run):\n    return [e for e in run if not e['passed']]"}

    def root(messages):
        step = steps_seen(messages)
        return (
            copying.fn(messages) if step == 0 else helper if step == 1 else {"reasoning": "done", "code": SUBMIT_LINE}
        )

    result = compile_with(FunctionLM(root, name="agent"), proposer(POLICY_PROMPT), max_iterations=3)
    turns = result.agent_trajectory
    assert "[Autopilot]" in turns[0]["output"]  # GEPA's line as shown: its adoption followed in the same turn
    # the silent helper cell after it is not taken over: nothing ran after it, it was told once
    assert turns[1]["code"] == helper["code"] and "[Autopilot]" not in turns[1]["output"]
    assert "This cell called no tool and printed nothing" in turns[1]["output"]
    assert turns[2]["code"] == SUBMIT_LINE and len(turns) == 3


def test_a_line_that_failed_is_not_run_again_in_the_same_turn():
    seen: list[str] = []
    copying = copier(seen)
    own_gepa = {"reasoning": "GEPA, my way", "code": "r = run_gepa(budget=22)\nprint(r['summary'])"}

    def root(messages):
        return own_gepa if steps_seen(messages) == 0 else copying.fn(messages)

    def sub_lm(messages):  # GEPA's reflections are useless; the last draw's proposal does not parse
        gepa = any(Path(frame.filename).name == "gepa_adapter.py" for frame in inspect.stack())
        return json.dumps({"new_instruction": "Route tickets carefully."}) if gepa else "no instruction here"

    result = compile_with(
        FunctionLM(root, name="agent"), FunctionLM(sub_lm, name="sub"), max_metric_calls=30, rlm_max_iterations=2
    )
    turns = result.agent_trajectory
    assert turns[0]["code"] == own_gepa["code"]  # its own cell: what follows is its decision, nothing ran after it
    assert "[Autopilot]" not in turns[0]["output"]
    # the last draw as shown, refused (no usable instructions); still the next line, but not run again in the turn
    assert seen == [LAST_DRAW] and turns[1]["code"] == LAST_DRAW
    assert turns[1]["output"].startswith("[Error] AgentToolError") and "[Autopilot]" not in turns[1]["output"]


def test_gepas_best_is_adopted_and_checked_even_with_nothing_left():
    guide = LoopGuide(["route"], lambda: 0, val_size=20, train_status=lambda: ([], 2))
    assert guide.next_line() == SUBMIT_LINE
    guide.gepa_finished("gepa-2")  # scored on the whole validation split by GEPA: the check is free
    adopt = "print(adopt_candidate('gepa-2')); print(evaluate_program(split='val'))"
    assert guide.next_line() == guide.follow_on() == adopt
    guide.changed()
    guide.validated()
    assert guide.next_line() == SUBMIT_LINE


def test_a_tool_imported_gets_a_hint_and_its_copy_is_followed_by_the_loop_at_once():
    # what a 1.5B root wrote on the real-model benchmark, twice: the tools are defined in the REPL, not a module
    importing = {
        "reasoning": "run GEPA",
        "code": "from gepa import run_gepa\nr = run_gepa(budget=44)\nprint(r['summary'])",
    }
    result = compile_with(
        FunctionLM(lambda messages: importing, name="agent"), proposer(POLICY_PROMPT), max_iterations=3
    )
    turns = result.agent_trajectory
    assert turns[0]["output"].startswith("[Error] ModuleNotFoundError")
    assert "[Hint] run_gepa is a tool of this REPL, already defined: call it without an import." in turns[0]["output"]
    assert "[Autopilot]" not in turns[0]["output"]  # a first error is the agent's to fix
    # the same cell, the same error: it changed nothing, and the loop's line runs after it in the same turn, then
    # the adoption of GEPA's best (a line that asks for no decision)
    gepa = "r = run_gepa(budget=44); print(r['summary'])"
    adopt = "print(adopt_candidate('gepa-1')); print(evaluate_program(split='val'))"
    assert turns[1]["code"] == f"{importing['code']}\n{gepa}\n{adopt}"
    assert "the cell above repeated step 1 and it failed as it did then" in turns[1]["output"]
    assert "gepa run 1: best gepa-1" in turns[1]["output"]
    # the next copy is followed by SUBMIT only after the notice (the cell failed every time)
    assert "[Autopilot]" not in turns[2]["output"] and "running it again changes nothing" in turns[2]["output"]
    assert turns[3]["code"] == SUBMIT_LINE and len(turns) == 4
    assert result.route.signature.instructions == POLICY_PROMPT


def test_a_last_draw_that_repeats_the_current_instructions_leaves_nothing_to_compare():
    seen: list[str] = []

    def sub_lm(messages):  # GEPA's reflections are useless; the last draw writes the current instructions again
        gepa = any(Path(frame.filename).name == "gepa_adapter.py" for frame in inspect.stack())
        return json.dumps({"new_instruction": "Route tickets carefully." if gepa else ORIGINAL_ROUTE})

    result = compile_with(copier(seen), FunctionLM(sub_lm, name="sub"), max_metric_calls=30, rlm_max_iterations=4)
    turns = result.agent_trajectory
    assert turns[0]["code"] == f"r = run_gepa(budget=22); print(r['summary'])\n{LAST_DRAW}"
    assert "{'changed_steps': [], 'version': 0}" in turns[0]["output"]  # adopted: nothing changed, its check free
    # the proposal was adopted: comparing it with the current instructions (itself) is no next line
    assert seen == ["r = run_gepa(budget=22); print(r['summary'])", SUBMIT_LINE] and len(turns) == 2
    assert result.route.signature.instructions == ORIGINAL_ROUTE


def test_an_adopted_candidate_is_neither_compared_nor_adopted_again():
    guide = LoopGuide(["route"], lambda: 40, val_size=8, train_status=lambda: ([], 2))
    guide.gepa_finished(None)
    guide.proposed("route", ["proposal-1"], [1, 2, 3], failure_ids=[1])
    assert guide.next_line().startswith("r = compare(['current', 'proposal-1']")
    guide.adopted("proposal-1")  # the same text as the current instructions: nothing changed
    assert "proposal-1" not in guide.next_line()
    guide.gepa_finished("gepa-2")
    guide.adopted("gepa-2")
    assert "gepa-2" not in guide.next_line()
