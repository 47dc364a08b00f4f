"""The agent's tools without a sandbox: id selection parsed once, refusals that say what to do, the stop
request a systemic failure leaves for the agent loop."""

from __future__ import annotations

import dspy
import pytest
from support.fakes import FunctionLM
from support.qa import echo_lm, examples, make_evaluator

from rlmoptimizer.agent.services import CompileServices
from rlmoptimizer.agent.stop import StopRequest
from rlmoptimizer.agent.tools import AgentTools, select_ids
from rlmoptimizer.agent.working_program import WorkingProgram
from rlmoptimizer.budget import BudgetLedger
from rlmoptimizer.errors import AgentToolError, EvaluationLMError
from rlmoptimizer.evaluation.runs import Runs
from rlmoptimizer.fingerprint import structural_fingerprint
from rlmoptimizer.storage.run_store import RunStore


def test_select_ids_defaults_ids_failed_sample_and_limit():
    assert select_ids(5) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"out-of-range \[12, 13, .*, 21\] and 9978 more; valid ids are 0..11$"):
        select_ids(12, ids=list(range(10_000)))  # (the 9,988 ids are not all echoed back)
    assert select_ids(50, ids="3, 7,12") == [3, 7, 12]
    assert select_ids(50, ids=[12, 3, 12]) == [12, 3]
    assert select_ids(50, ids=[12, 3], failed_ids_from_run=[3, 4]) == [3]
    assert select_ids(10, failed_ids_from_run=[9, 2]) == [2, 9]
    assert select_ids(10, failed_ids_from_run=[]) == []
    assert select_ids(10, limit=3) == [0, 1, 2]
    assert select_ids(10, limit=0) == []
    shuffled = select_ids(50, sample="random", seed=7)
    assert sorted(shuffled) == list(range(50)) and shuffled != list(range(50))
    assert select_ids(50, sample="random", seed=7, limit=5) == shuffled[:5]
    assert select_ids(50, sample="random", seed=8) != shuffled


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ids": "3,x"}, r"comma-separated integers like '3,7,12', got '3,x'; valid ids are 0\.\.49"),
        ({"ids": [3, 50]}, r"out-of-range \[50\]; valid ids are 0\.\.49"),
        ({"ids": ""}, "empty string"),
        ({"ids": []}, "ids is empty"),
        ({"limit": -1}, r"limit must be an integer >= 0.*got -1"),
        ({"sample": "top"}, r"sample must be 'random'.*got 'top'"),
        ({"failed_ids_from_run": [99]}, "out-of-range"),
    ],
)
def test_select_ids_explains_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        select_ids(50, **kwargs)


# -- the run service -----------------------------------------------------------------------------


def make_tools(tmp_path, lm):
    ledger, store = BudgetLedger(100), RunStore(tmp_path)
    runs = Runs(
        evaluator=make_evaluator(lm, num_threads=2),
        store=store,
        ledger=ledger,
        splits={"train": examples(6), "val": examples(3)},
    )
    program = dspy.Predict("question -> answer")
    stop = StopRequest()
    working = WorkingProgram(program=program, fingerprint=structural_fingerprint(program), runs=runs, stop=stop)
    return AgentTools(CompileServices(runs=runs, ledger=ledger, working=working)), stop


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.evaluate_program(split="test"), r"unknown split 'test' -> use one of \['train', 'val'\]"),
        (lambda t: t.evaluate_program(split="val", limit=2), "validation always runs on the whole split"),
        (lambda t: t.evaluate_program(ids="1,x"), "comma-separated integers"),
        (lambda t: t.evaluate_program(failed_from_run="run-0042"), r"no run with id 'run-0042' -> use one of \[\]"),
        (lambda t: t.update_prompt("nope", "text"), r"unknown step name 'nope' -> use one of \['self'\]"),
        (lambda t: t.update_prompt("self", "  "), "are empty -> pass non-empty instructions text"),
        # an empty selection would be a run scoring 0 (the agent's "did my fix break things?" read 0.0)
        (lambda t: t.evaluate_program(limit=0), r"the selection is empty -> select at least one example"),
    ],
)
def test_a_refused_tool_call_says_what_to_do_and_changes_nothing(tmp_path, call, message):
    tools, _ = make_tools(tmp_path, echo_lm())
    with pytest.raises(AgentToolError, match=message):
        call(tools)
    assert tools.runs.all() == [] and tools.working.prompt_versions == [] and tools.ledger.spent == 0


def test_failures_asked_of_a_run_with_none_are_refused_naming_the_run(tmp_path):
    tools, _ = make_tools(tmp_path, echo_lm())
    run_id = tools.evaluate_program(ids=[0, 1])["run_id"]  # the echo LM answers every example right
    with pytest.raises(AgentToolError, match=rf"the selection is empty \(run '{run_id}' has no failures\)"):
        tools.evaluate_program(failed_from_run=run_id)
    assert len(tools.runs.all()) == 1


def test_ids_are_selected_once_and_the_run_holds_exactly_them(tmp_path):
    tools, _ = make_tools(tmp_path, echo_lm())
    view = tools.evaluate_program(ids="4, 1,4", limit=1)
    assert [e["example_id"] for e in view["examples"]] == [4] and view["budget_spent"] == 1
    assert "error_kind" not in view["examples"][0]  # the agent sees records as before


def test_a_systemic_failure_in_a_tool_requests_a_stop_with_that_failure(tmp_path):
    """The agent loop checks the request after the turn and raises the failure (no error parked elsewhere)."""
    tools, stop = make_tools(tmp_path, FunctionLM(lambda m: dspy.LMAuthError("revoked", model="fake")))
    with pytest.raises(EvaluationLMError):
        tools.evaluate_program()
    assert stop.requested and isinstance(stop.reason, EvaluationLMError)
    with pytest.raises(EvaluationLMError, match="revoked"):
        stop.raise_if_requested()


def gepa_tools(directory, ledger):
    """The agent's tools over a run directory, with a task LM that always answers wrong (GEPA has failures to
    reflect on) and a reflection LM."""
    from support.optimizing import proposer

    runs = Runs(
        evaluator=make_evaluator(FunctionLM(lambda m: {"answer": "wrong"}), num_threads=2),
        store=RunStore(directory),
        ledger=ledger,
        splits={"train": examples(6), "val": examples(3)},
    )
    program = dspy.Predict("question -> answer")
    working = WorkingProgram(
        program=program, fingerprint=structural_fingerprint(program), runs=runs, stop=StopRequest()
    )
    return AgentTools(CompileServices(runs=runs, ledger=ledger, working=working, sub_lm=proposer("Answer with care.")))


def test_a_gepa_run_replayed_after_a_kill_takes_only_what_is_left_of_its_budget(tmp_path):

    from rlmoptimizer.storage.candidates import read_gepa_progress, write_gepa_progress

    # an earlier process finished "gepa run 1" and was killed in "gepa run 2" (budget=10) with 6 units taken
    write_gepa_progress(
        tmp_path,
        {
            "gepa run 1": {"budget": 5, "taken": 5, "finished": True},
            "gepa run 2": {"budget": 10, "taken": 6, "finished": False},
        },
    )
    ledger = BudgetLedger(100)
    tools = gepa_tools(tmp_path, ledger)

    replayed = tools.run_gepa(budget=10)  # the same call: it goes on with what is left of its 10
    assert replayed["summary"].startswith("gepa run 2:") and replayed["spent_before_resume"] == 6
    assert 0 < replayed["spent"] <= 4 and ledger.spent == replayed["spent"]
    kept = read_gepa_progress(tmp_path)["gepa run 2"]
    assert {key: kept[key] for key in ("budget", "taken", "finished")} == {
        "budget": 10,
        "taken": 6 + replayed["spent"],
        "finished": True,
    }
    assert len(kept["checks"]) == len(kept["evaluations"]) >= 1  # (what a later replay would make its checks by)

    another = tools.run_gepa(budget=3)  # a new call: a new name, its whole budget
    assert another["summary"].startswith("gepa run 3:") and another["spent_before_resume"] == 0
    assert another["spent"] <= 3


def test_a_gepa_run_killed_before_its_first_check_makes_that_check_when_replayed(tmp_path):
    """Regression: an interrupt after GEPA's start was scored on validation, before its first stop check was kept,
    left ``checks: []``; the replay skipped that check until it paid something new, so it paid a minibatch the run
    would never have paid (the units left could not pay a child) and took them from the agent's own moves."""

    from rlmoptimizer.storage.candidates import write_gepa_progress

    killed_process = gepa_tools(tmp_path, BudgetLedger(100))
    killed_process.evaluate_program(split="val")  # what the killed run paid: its start on validation
    killed_process.runs.store.flush()  # (its files settled, as when that process ended)
    killed = {"budget": 12, "taken": 3, "finished": False, "checks": [], "evaluations": []}
    write_gepa_progress(tmp_path, {"gepa run 1": killed})
    ledger = BudgetLedger(100)
    replayed = gepa_tools(tmp_path, ledger).run_gepa(budget=12)
    # 9 units left of its 12 cannot pay a child (a minibatch, a reflection, the child's minibatch, 3 val examples)
    assert replayed["spent"] == 0 and ledger.spent == 0, replayed["summary"]
    assert "cannot pay a child" in replayed["summary"]


def test_run_gepa_with_no_sub_lm_prompt_left_is_refused_before_paying_anything(tmp_path):
    """Regression: with the sub-LM prompts spent (the agent's llm_query draws on them too), run_gepa paid its parent's
    minibatch, then found it could not reflect."""
    ledger = BudgetLedger(100, spent_by_kind={"sub_lm_call": 10}, sub_lm_limit=10)
    tools = gepa_tools(tmp_path, ledger)
    with pytest.raises(AgentToolError, match="no sub-LM prompt is left for GEPA's reflections") as refused:
        tools.run_gepa(budget=20)
    assert "propose_demos()" in str(refused.value) and ledger.spent == 0 and tools.runs.all() == []
