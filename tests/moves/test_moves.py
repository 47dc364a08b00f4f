"""The agent's moves as a library: proposal, paired comparison, rollouts, run diffs, the failure replay set
and the candidate pool. Real dspy.Predict / ChainOfThought programs over fake LMs; exact charges."""

from __future__ import annotations

import dataclasses
import json
import re
import threading

import dspy
import pytest
from support.evaluating import program_evaluator
from support.fakes import FunctionLM, system_text
from support.optimizing import proposer
from support.qa import Triage, TwoSteps, field, triage_lm

from rlmoptimizer.budget import SUB_LM_CALL, TRAIN_EXAMPLE, VAL_EXAMPLE, BudgetLedger
from rlmoptimizer.errors import AgentToolError
from rlmoptimizer.evaluation.evaluator import Evaluator
from rlmoptimizer.evaluation.runs import Runs
from rlmoptimizer.fingerprint import get_instructions
from rlmoptimizer.metric import Metric
from rlmoptimizer.moves import MAX_REFLECTION_EXAMPLES, Moves, reflective_example
from rlmoptimizer.moves.gepa import GepaHooks, GepaSpec
from rlmoptimizer.storage.run_store import RunStore

# -- a two-step program whose answers follow its instructions -------------------------------------------
#
# The task LM answers question q<i> with a<i> when the `generate` instructions say "PASS:<ids>" and i is
# listed, or, without "PASS:", when i is even. The `draft` step always drafts "D:<question>".


def passes(system: str, i: int, rollout: int | None) -> bool:
    match = re.search(r"PASS:([\d,]+)", system)
    if match:
        return str(i) in match.group(1).split(",")
    if "FLAKY" in system:  # example 1 passes on odd rollout ids only
        return i % 2 == 0 or (i == 1 and bool(rollout) and rollout % 2 == 1)
    return i % 2 == 0


def task_lm() -> FunctionLM:
    def reply(messages, settings):
        system = system_text(messages)
        question = field(messages, "question")
        if "`draft`" in system.split("Your output fields are:")[1].split("All interactions")[0]:
            return {"draft": "D:" + question}
        i = int(question[1:])
        answer = f"a{i}" if passes(system, i, settings.get("rollout_id")) else "wrong"
        return {"reasoning": "r", "answer": answer}

    return FunctionLM(reply, with_settings=True, name="task")


def metric(example, prediction):
    ok = example.answer == prediction.answer
    return dspy.Prediction(
        score=float(ok), feedback="correct" if ok else f"expected {example.answer}, not {prediction.answer}"
    )


def data(n: int, prefix: str = "q") -> list[dspy.Example]:
    return [dspy.Example(question=f"{prefix}{i}", answer=f"a{i}").with_inputs("question") for i in range(n)]


class World:
    """One optimization's worth of state: program, runs, ledger and the moves over them."""

    def __init__(
        self,
        tmp_path,
        *,
        limit: int = 100,
        train: int = 6,
        val: int = 4,
        proposal_lm=None,
        lm=None,
        program=None,
        **evaluator_kwargs,
    ):
        self.program = program or TwoSteps()
        self.lm = lm or task_lm()
        self.ledger = BudgetLedger(limit)
        self.runs = Runs(
            evaluator=Evaluator(metric=Metric(metric), lm=self.lm, num_threads=4, **evaluator_kwargs),
            store=RunStore(tmp_path / "runs"),
            ledger=self.ledger,
            splits={"train": data(train), "val": data(val)},
        )
        self.baseline = self.runs.evaluate(self.program, "train", label="baseline", charged=False)
        self.initial = get_instructions(self.program)
        self.moves = Moves(
            runs=self.runs,
            evaluate=program_evaluator(self.program, self.runs),
            ledger=self.ledger,
            step_names=[name for name, _ in self.program.named_predictors()],
            current=lambda: get_instructions(self.program),
            proposal_lm=proposal_lm,
            initial=self.initial,
        )


def proposal_reply(text: str = "Answer with a<i>. PASS:0,1,2,3,4,5") -> FunctionLM:
    """The sub-LM answering dspy's instruction proposer with ``text``; records what it was asked."""
    return proposer(text)


# -- reflective dataset -----------------------------------------------------------------------------------


def test_reflective_example_gives_the_metrics_feedback_as_dspy_gepa_does(tmp_path):
    world = World(tmp_path)
    record = world.baseline.records[1]  # q1 fails at baseline; the metric says why
    entry = reflective_example("generate.predict", record)
    assert entry["Inputs"] == {"question": "q1", "draft": "D:q1"}
    assert entry["Generated Outputs"] == {"reasoning": "r", "answer": "wrong"}
    assert entry["Feedback"] == "expected a1, not wrong"  # `generate` is the last step: its outputs are the final ones
    draft = reflective_example("draft", record)
    assert draft["Generated Outputs"] == {"draft": "D:q1"}
    assert draft["Feedback"].splitlines() == [
        'The program\'s final output: {"answer": "wrong", "reasoning": "r"}',
        "expected a1, not wrong",
    ]


def test_reflective_example_without_metric_feedback_gives_the_score_and_the_expected_fields(tmp_path):
    world = World(tmp_path)
    record = dataclasses.replace(world.baseline.records[1], feedback="", error="ValueError: no answer")
    feedback = reflective_example("generate.predict", record)["Feedback"].splitlines()
    assert feedback[0] == "Score: 0 (did not pass)."
    assert feedback[1].startswith("Expected (the example's labels): ") and '"answer": "a1"' in feedback[1]
    assert feedback[2:] == ["Error: ValueError: no answer"]


def test_a_call_whose_output_did_not_parse_is_an_entry_only_with_format_failures(tmp_path):
    """dspy.GEPA's add_format_failure_as_feedback: False (GEPA's runs here, dspy.GEPA's default) reflects on the
    step's calls that returned, if any; True (a targeted proposal) on the call that did not parse."""
    world = World(tmp_path, program=Triage(), lm=triage_lm("billing"))
    (record,) = [r for r in world.baseline.records if r.error]  # billing's second call did not parse on q1
    assert record.failed_call.step_name == "billing"
    kept = reflective_example("billing", record, format_failures=False)
    assert kept["Inputs"] == {"question": "q1"} and kept["Generated Outputs"] == {"billing_reply": "a1"}
    assert "Error (raised by a later call of this step): AdapterParseError" in kept["Feedback"]
    route = reflective_example("route", record)["Feedback"]  # the error is another step's, and says so
    assert "Error (raised by step 'billing', after this step ran): AdapterParseError" in route
    entry = reflective_example("billing", record)
    assert entry["Inputs"] == {"question": "q1 a1"}
    assert entry["Feedback"].startswith("Your output failed to parse, so the program raised AdapterParseError")
    assert "Sorry, I will answer in my own words." in entry["Feedback"]
    assert reflective_example("route", record) == reflective_example("route", record, format_failures=False)
    assert reflective_example("tech", record) is None


@pytest.mark.parametrize("format_failures", [False, True])
def test_gepa_reflects_on_a_steps_own_parse_failures_only_when_asked_as_dspy_gepa_is(tmp_path, format_failures):
    """dspy.GEPA's add_format_failure_as_feedback: every failure of 'tech' is a reply that did not parse, so
    without it GEPA's reflections on that step read only its passing examples; with it, also the parse errors."""
    proposer = proposal_reply("Reply in the tech_reply field.")
    world = World(tmp_path, program=Triage(), lm=triage_lm("tech"), proposal_lm=proposer, train=8)
    world.moves.gepa_hooks = GepaHooks(format_failures=format_failures)
    world.moves.run_gepa(GepaSpec(budget=20, steps=["tech"]))
    asked = ["\n".join(str(m["content"]) for m in call) for call in proposer.calls]
    assert asked  # the minibatches' passing examples are reflected on either way, as dspy.GEPA does
    read = [a for a in asked if "Your output failed to parse, so the program raised AdapterParseError" in a]
    assert bool(read) is format_failures
    assert world.ledger.spent <= 20


def killed_in_gepa(tmp_path, limit: int, *, paid: int, **progress: int) -> World:
    """A world whose ledger has ``paid`` units spent and whose GEPA run 1 an earlier process was killed in, its
    progress as ``progress`` says (``budget``, ``taken``, ``reserved``)."""
    import time

    world = World(tmp_path, limit=limit, proposal_lm=proposal_reply())
    with world.ledger.reserve(paid, TRAIN_EXAMPLE) as reservation:
        reservation.spend(paid)
    killed = {"finished": False, "checks": [], "evaluations": [], "start": "", "started_at": time.time(), **progress}
    world.moves.gepa_hooks = GepaHooks(progress={"gepa run 1": killed})
    return world


def test_a_gepa_run_replayed_with_less_left_than_its_budget_had_goes_on_with_what_is_left(tmp_path, caplog):
    """Regression: a resume that paid again for a damaged run file had less left than the killed GEPA run's budget
    still had; its replay was refused, and the loop ended early with the unchanged program and units unspent."""
    world = killed_in_gepa(tmp_path, 30, paid=18, budget=30, taken=10)  # its 10, and 8 paid again since
    with caplog.at_level("WARNING", logger="rlmoptimizer.moves.gepa"):
        world.moves.run_gepa(GepaSpec(budget=30, steps=["generate.predict"]))
    assert world.ledger.spent == 30  # it went on, and stopped at the limit
    assert any("replayed with 12 unit(s) left of the 20" in r.getMessage() for r in caplog.records)


def test_a_gepa_run_killed_with_units_reserved_for_an_evaluation_replays_without_them(tmp_path):
    """Regression: a run killed while a child was being scored on validation had its reservation for that
    evaluation kept as taken; the replay then had 7 units where the child needed 8, dropped it, and the loop paid
    sub-LM calls for other moves."""
    world = killed_in_gepa(tmp_path, 60, paid=17, budget=32, taken=25, reserved=8)
    kept = []
    world.moves.gepa_hooks.keep_progress = lambda progress: kept.append(dict(progress["gepa run 1"]))
    result = world.moves.run_gepa(GepaSpec(budget=32, steps=["generate.predict"]))
    assert result["spent_before_resume"] == 17  # the reservation was never paid
    assert world.ledger.spent <= 17 + 15 and kept[-1]["taken"] <= 32 and "reserved" not in kept[-1]


def test_the_records_a_killed_gepa_evaluation_completed_count_as_its_run_paid_them(tmp_path):
    """What the killed run had completed of the evaluation it was in was charged when the resume recovered it, and
    is reused free by the replay: the run counts it as paid, and its two processes spend no more than its budget."""
    world = killed_in_gepa(tmp_path, 200, paid=0, budget=30, taken=4, reserved=4)
    world.runs.evaluate(world.program, "val", label="gepa:recovered", ids=[0, 1, 2])  # as the resume recovered them
    world.runs.recovered_now = {"gepa": 3}
    result = world.moves.run_gepa(GepaSpec(budget=30, steps=["generate.predict"]))
    assert result["spent_before_resume"] == 3
    assert world.ledger.spent <= 30


def test_each_step_of_a_branching_program_gets_demos_from_the_passing_examples_it_ran_on(tmp_path):
    """Regression: demos were taken only from passing examples on which every step ran, which a program that
    branches never has: propose_demos was always refused there (and the loop mode ended the run on it)."""
    world = World(tmp_path, program=Triage(), lm=triage_lm("tech"), val=0)  # (a validation example is never a demo)
    assert sorted(r.example_id for r in world.baseline.records if r.passed) == [0, 1, 2, 4]
    result = world.moves.propose_demos()
    assert result["steps"] == ["route", "billing", "tech"] and result["demo_ids"] == [0, 1, 2, 4]
    demos = {
        key.split(":")[0]: json.loads(text) for key, text in world.moves.proposals[result["candidate_ids"][0]].items()
    }
    assert sorted(d["question"] for d in demos["route"]) == ["q0", "q1", "q2", "q4"]
    assert sorted(d["question"] for d in demos["tech"]) == ["q2", "q4"]  # the tickets routed to it
    # a step called twice on an example: the demos spread over its calls (first, last), not only its last ones, so
    # that they show each kind of call (ReAct's demos would otherwise all be its finishing call)
    assert [d["question"] for d in demos["billing"]] == ["q0", "q1 a1"]
    assert "2 demo(s) for 'tech' from train examples" in result["summary"]
    run = world.runs.evaluate(world.program, "train", label="agent", ids=[0, 1, 3])  # tech passes on none of these
    with pytest.raises(AgentToolError, match="no passing example where 'tech' ran"):
        world.moves.propose_demos("tech", run_id=run.run_id)
    others = world.moves.propose_demos(run_id=run.run_id)
    assert others["steps"] == ["route", "billing"]  # the others still get some, and the summary says which got none
    assert "none for ['tech']: it ran on no passing example" in others["summary"]


def test_demos_of_long_examples_are_as_many_as_the_length_limit_takes(tmp_path, monkeypatch):
    """Regression: demos copied from long train examples passed no length limit as a candidate, and once adopted
    every SUBMIT of the current instructions was refused for their length."""
    from rlmoptimizer.moves import demos as demos_module

    world = World(tmp_path, program=Triage(), lm=triage_lm("tech"), val=0)
    one = len(json.dumps([{"question": "q0", "team": "billing"}]))
    monkeypatch.setattr(demos_module, "MAX_DEMOS_CHARS", 2 * one + 1)  # two short demos fit, not three
    result = world.moves.propose_demos("route")
    assert len(result["demo_ids"]) == 2
    (text,) = world.moves.proposals[result["candidate_ids"][0]].values()
    assert len(json.loads(text)) == 2 and len(text) <= 2 * one + 1


def test_a_group_of_a_steps_own_parse_failures_leaves_that_step_something_to_reflect_on(tmp_path):
    """Regression: ``step_ran`` counted only a step's calls that returned, so the default loop dropped the group of
    a step's own replies that did not parse, and proposed for another step first."""
    world = World(tmp_path, program=Triage(), lm=triage_lm("tech"))
    (group,) = world.moves.analyze_failures(use_lm=False).groups
    assert (group.step, group.kind, group.example_ids) == ("tech", "program error (AdapterParseError)", (3, 5))
    assert group.step_ran == 2


# -- propose_instructions ----------------------------------------------------------------------------------


def test_propose_reflects_on_the_current_instructions_failures_and_charges_one_unit_per_call(tmp_path):
    proposer = proposal_reply()
    world = World(tmp_path, proposal_lm=proposer)
    result = world.moves.propose_instructions("generate.predict", n=2, guidance="Keep it under 20 words.")
    assert result["from"] == "the current instructions' train records" and result["example_ids"] == [1, 3, 5]
    assert result["check_ids"] == [1, 3, 5, 0, 2, 4]  # the failures, then a random sample of the others
    assert result["texts"] == ["Answer with a<i>. PASS:0,1,2,3,4,5"]  # the fake answers the same twice
    assert result["candidates"] == [{"generate.predict": "Answer with a<i>. PASS:0,1,2,3,4,5"}]
    assert "repeated" in result["note"]
    assert result["budget_spent"] == 2 == world.ledger.spent_by_kind[SUB_LM_CALL] == world.ledger.spent
    assert len(proposer.calls) == 2  # two real calls: the second ran with its own rollout_id
    asked = "\n".join(str(m["content"]) for m in proposer.calls[0])
    assert "Keep it under 20 words." in asked  # guidance reaches dspy's proposer as additional instructions
    assert world.initial["generate.predict"] in asked  # the current instruction
    for failing in ("q1", "q3", "q5"):
        assert failing in asked
    assert "q2" not in asked and "expected a3, not wrong" in asked
    assert get_instructions(world.program) == world.initial  # nothing changed
    # by default a proposal learns from the current instructions' records, wherever they were evaluated
    world.program.generate.predict.signature = world.program.generate.predict.signature.with_instructions("PASS:0,1")
    world.moves.compare(["current"], ids=[0, 1, 2, 3])
    assert world.moves.propose_instructions("generate.predict")["example_ids"] == [2, 3]
    assert world.ledger.spent == 2 + 4 + 1


def test_instructions_longer_than_a_step_may_have_are_no_proposal_and_no_gepa_child(tmp_path):
    """Regression: the length limit held for the agent's own texts only; a sub-LM writing 60k characters of
    instructions had them compared, adopted and returned, and every evaluation sent them."""
    from rlmoptimizer.fingerprint import MAX_INSTRUCTION_CHARS

    long = "Answer with a<i>. PASS:0,1,2,3,4,5 " + "x" * MAX_INSTRUCTION_CHARS
    world = World(tmp_path, proposal_lm=proposal_reply(long))
    with pytest.raises(
        AgentToolError, match=r"ProposalTooLong: an instruction of 50,035 characters, more than the 50,000"
    ):
        world.moves.propose_instructions("generate.predict", n=2)
    assert world.ledger.spent == 2  # both were answered: charged, as a reply that does not parse is
    result = world.moves.run_gepa(GepaSpec(budget=20, steps=["generate.predict"]))
    assert result["candidate_ids"] == [] and result["reflections_unusable"] == result["reflections"] >= 1
    assert all(len(text) <= MAX_INSTRUCTION_CHARS for run in world.runs.all() for text in run.instructions.values())


def test_each_proposal_reflects_on_another_sample_of_the_failures(tmp_path):
    world = World(tmp_path, train=12, proposal_lm=proposal_reply())
    assert [r.example_id for r in world.baseline.records if not r.passed] == [1, 3, 5, 7, 9, 11]
    first = world.moves.propose_instructions("generate.predict")["example_ids"]
    second = world.moves.propose_instructions("generate.predict")["example_ids"]
    assert len(first) == len(second) == MAX_REFLECTION_EXAMPLES == 5  # as GEPA, a minibatch, not every failure
    assert set(first) | set(second) <= {1, 3, 5, 7, 9, 11} and first != second


def test_propose_on_chosen_ids_and_runs(tmp_path):
    proposer = proposal_reply("Be exact.")
    world = World(tmp_path, proposal_lm=proposer)
    result = world.moves.propose_instructions("draft", run_id=world.baseline.run_id, ids=[0, 2])
    assert result["example_ids"] == [0, 2] and result["texts"] == ["Be exact."] and world.ledger.spent == 1
    asked = "\n".join(str(m["content"]) for m in proposer.calls[0])
    assert "q0" in asked and "q2" in asked and "q1" not in asked


def test_propose_refusals_say_what_to_do_and_charge_nothing(tmp_path):
    world = World(tmp_path, proposal_lm=proposal_reply())
    with pytest.raises(
        AgentToolError, match=r"unknown step name 'generate' -> use one of \['draft', 'generate.predict'\]"
    ):
        world.moves.propose_instructions("generate")
    with pytest.raises(AgentToolError, match=r"n must be an int from 1 to 8"):
        world.moves.propose_instructions("generate.predict", n=0)
    with pytest.raises(AgentToolError, match=r"no run with id 'run-9' -> use one of \['run-0001'\]"):
        world.moves.propose_instructions("generate.predict", run_id="run-9")
    world.runs.evaluate(world.program, "train", label="agent", ids=[0, 1])
    with pytest.raises(AgentToolError, match=r"example\(s\) \[4\] were not evaluated in run run-0002 -> pick ids"):
        world.moves.propose_instructions("generate.predict", run_id="run-0002", ids=[4])
    world.program.generate.predict.signature = world.program.generate.predict.signature.with_instructions("PASS:0,2")
    world.runs.evaluate(world.program, "train", label="agent", ids=[0, 2])
    with pytest.raises(AgentToolError, match=r"records show no failures to learn from -> evaluate new examples first"):
        world.moves.propose_instructions("generate.predict")
    world.runs.evaluate(world.program, "val", label="agent")
    with pytest.raises(AgentToolError, match="is a val run -> pass a train run id"):
        world.moves.propose_instructions("generate.predict", run_id="run-0004")
    assert world.ledger.spent_by_kind[SUB_LM_CALL] == 0


def test_a_step_whose_own_outputs_did_not_parse_is_proposed_for_from_its_parse_errors(tmp_path):
    """A failure whose output at the step did not parse leaves no call of that step in the trace; the call that
    raised is kept with its inputs, and a proposal reflects on it with the parse error as feedback (what
    dspy.GEPA's add_format_failure_as_feedback=True shows), so instructions that state the output format can come
    of it. It used to be refused."""
    answers = task_lm()

    def reply(messages, settings):
        if "`reasoning`" in system_text(messages) and int(field(messages, "question")[1:]) % 2:
            return "I think the answer is a1."  # no fields: AdapterParseError at 'generate.predict'
        return answers.fn(messages, settings)

    proposer = proposal_reply("Reply with the reasoning and answer fields.")
    world = World(tmp_path, lm=FunctionLM(reply, with_settings=True), proposal_lm=proposer)
    assert {r.example_id for r in world.baseline.records if not r.passed} == {1, 3, 5}
    result = world.moves.propose_instructions("generate.predict")
    assert result["example_ids"] == [1, 3, 5] and result["texts"] == ["Reply with the reasoning and answer fields."]
    asked = "\n".join(str(m["content"]) for m in proposer.calls[0])
    assert asked.count("Your output failed to parse, so the program raised AdapterParseError") == 3
    assert "I think the answer is a1." in asked and "D:q3" in asked  # the reply, and the inputs of the call
    assert world.ledger.spent_by_kind[SUB_LM_CALL] == 1


def test_a_parse_error_is_reflected_on_by_the_step_that_raised_when_the_program_branches(tmp_path):
    """Regression: which step's output did not parse was guessed from the trace (the first step, in the order the
    longest trace calls them, that left no call), so a branch's handler that failed was told its failures raised
    before it, and the other branch's handler, which never saw them, was told to state its output format."""
    proposer = proposal_reply("Answer tech tickets in the reply format.")
    world = World(tmp_path, program=Triage(), lm=triage_lm("tech"), proposal_lm=proposer)
    assert {r.example_id for r in world.baseline.records if not r.passed} == {3, 5}  # tech's replies out of format
    assert world.moves.propose_instructions("tech")["example_ids"] == [3, 5]
    with pytest.raises(AgentToolError) as billing:
        world.moves.propose_instructions("billing")
    assert "ran on none of the 2 failure(s)" in str(billing.value) and "AdapterParseError on 2" in str(billing.value)
    with pytest.raises(
        AgentToolError, match=r"the output of step\(s\) \['tech'\] did not parse there -> propose for 'tech'"
    ):
        world.moves.propose_instructions("billing", ids=[3, 5])  # chosen by hand: tech's parse failures
    assert world.ledger.spent_by_kind[SUB_LM_CALL] == 1


def test_propose_with_no_budget_left_refuses_and_a_failed_call_costs_nothing(tmp_path):
    world = World(tmp_path, limit=0, proposal_lm=proposal_reply())
    with pytest.raises(AgentToolError, match=r"no budget unit is left.*-> the budget is spent: SUBMIT"):
        world.moves.propose_instructions("generate.predict")

    from dspy.utils.exceptions import LMTransportError

    down = FunctionLM(lambda m: LMTransportError("connection refused", model="proposer", provider="fake"))
    world = World(tmp_path / "b", proposal_lm=down)
    with pytest.raises(AgentToolError, match=r"no usable instructions \(1 of 1 asked\): LMTransportError"):
        world.moves.propose_instructions("generate.predict")
    assert world.ledger.spent == 0  # no answer, no charge
    garbled = FunctionLM(lambda m: "not json at all")
    world = World(tmp_path / "c", proposal_lm=garbled)
    with pytest.raises(AgentToolError, match="no usable instructions"):
        world.moves.propose_instructions("generate.predict")
    assert world.ledger.spent == 1  # the LM answered: the call is paid for


# -- compare -------------------------------------------------------------------------------------------------


def test_compare_is_paired_charges_only_new_records_and_changes_no_prompt(tmp_path):
    world = World(tmp_path)
    better = {"generate.predict": "PASS:0,1,2,3,4,5"}
    result = world.moves.compare(["current", better, {"generate.predict": "PASS:3"}], ids=[0, 1, 2, 3])
    # current is stored from the baseline (free); the two maps cost 4 examples each
    assert result["budget_spent"] == 8 == world.ledger.spent_by_kind[TRAIN_EXAMPLE] == world.ledger.spent
    assert result["example_ids"] == [0, 1, 2, 3]
    assert [c["score"] for c in result["candidates"]] == [0.5, 1.0, 0.25]
    assert [c["passed_count"] for c in result["candidates"]] == [2, 4, 1]
    assert [(c["wins"], c["losses"], c["ties"]) for c in result["candidates"]] == [(0, 0, 4), (2, 0, 2), (1, 2, 1)]
    assert result["examples"][3] == {"example_id": 3, "scores": [0.0, 1.0, 1.0]}
    assert result["best"] == 1 and [c["source"] for c in result["candidates"]] == ["current", "map", "map"]
    assert result["best_instructions"] == {**world.initial, **better}
    assert result["summary"] == (
        "best: candidate 1 | 0 (current): 0.500, 2/4 passed; 1 (map): 1.000, 4/4 passed, 2 wins 0 losses vs 0; "
        "2 (map): 0.250, 1/4 passed, 1 wins 2 losses vs 0"
    )
    assert get_instructions(world.program) == world.initial
    # the same comparison again reuses every record: free
    again = world.moves.compare([better, "current"], ids=[3, 1, 0, 2])
    assert again["budget_spent"] == 0 and world.ledger.spent == 8
    assert [c["score"] for c in again["candidates"]] == [1.0, 0.5] and again["best"] == 0
    # a run id stands for that run's instructions
    run_id = result["candidates"][1]["run_ids"][0]
    by_run = world.moves.compare(["current", run_id], ids=[5])
    assert by_run["candidates"][1]["source"] == run_id and by_run["candidates"][1]["score"] == 1.0
    assert by_run["budget_spent"] == 1  # example 5 was new for that run's instructions


def test_the_best_instructions_of_a_comparison_name_the_demos_they_lack_so_a_submission_of_them_drops_current_ones(
    tmp_path,
):
    world = World(tmp_path)
    run = world.baseline.run_id  # the unchanged program's map: no demos
    world.program.draft.demos = [dspy.Example(question="q9", draft="D:q9")]  # then demos were adopted
    result = world.moves.compare([run, "current"], ids=[0, 1])
    assert result["best"] == 0 and result["best_instructions"] == {**world.initial, "draft:demos": "[]"}


def test_compare_on_validation_returns_aggregates_only(tmp_path):
    world = World(tmp_path)
    result = world.moves.compare(["current", {"generate.predict": "PASS:0,1"}], split="val")
    assert result["budget_spent"] == 8 == world.ledger.spent_by_kind[VAL_EXAMPLE]
    assert "examples" not in result and "example_ids" not in result
    assert "q1" not in json.dumps(result)
    assert [c["score"] for c in result["candidates"]] == [0.5, 0.5] and result["best"] == 0  # a tie keeps the first
    with pytest.raises(AgentToolError, match="takes no selection"):
        world.moves.compare(["current", {"generate.predict": "x"}], split="val", ids=[0])


def test_compare_refuses_what_the_budget_cannot_cover_in_full_and_bad_candidates(tmp_path):
    world = World(tmp_path, limit=5)
    with pytest.raises(AgentToolError, match=r"needs 6 budget unit\(s\).*5 are left -> select fewer examples"):
        world.moves.compare(["current", {"generate.predict": "A"}, {"generate.predict": "B"}], ids=[0, 1, 2])
    assert world.ledger.spent == 0 and len(world.runs.all()) == 1  # nothing evaluated, nothing stored
    with pytest.raises(AgentToolError, match="candidates must be a non-empty list"):
        world.moves.compare({"generate.predict": "A"})
    with pytest.raises(AgentToolError, match=r"candidate 1 is str 'best' -> each candidate is 'current', a run id"):
        world.moves.compare(["current", "best"])
    with pytest.raises(AgentToolError, match="no run with id 'run-0042'"):
        world.moves.compare(["current", "run-0042"])
    with pytest.raises(AgentToolError, match="rollouts must be an int from 1 to 10"):
        world.moves.compare(["current"], rollouts=0)
    with pytest.raises(AgentToolError, match="the selection is empty"):
        world.moves.compare(["current"], ids=[])


# -- rollouts ------------------------------------------------------------------------------------------------


def test_rollouts_are_real_independent_calls_kept_apart_and_charged_per_sample(tmp_path):
    world = World(tmp_path, train=4)
    world.program.generate.predict.signature = world.program.generate.predict.signature.with_instructions("FLAKY")
    calls_before = len(world.lm.calls)
    view = world.moves.evaluate_rollouts(get_instructions(world.program), "train", [0, 1, 2, 3], 3)
    # 3 rollouts x 4 examples, none stored: 12 units, 2 LM calls (draft, generate) per sample
    assert view["budget_spent"] == 12 == world.ledger.spent
    assert len(world.lm.calls) - calls_before == 24
    assert [r.rollout for r in map(world.runs.get, view["run_ids"])] == [0, 1, 2]
    by_id = {e["example_id"]: e for e in view["examples"]}
    assert by_id[1]["rollout_scores"] == [0.0, 1.0, 0.0] and by_id[1]["pass_rate"] == pytest.approx(1 / 3)
    assert view["flaky_ids"] == [1] and view["always_failing_ids"] == [3]
    assert view["passed_count"] == 2 and view["score"] == pytest.approx((1 + 1 / 3 + 1 + 0) / 4)
    assert view["note"] is None  # the rollouts differ
    # stored per rollout: the same request again is free and calls nothing
    again = world.moves.evaluate_rollouts(get_instructions(world.program), "train", [0, 1, 2, 3], 3)
    assert again["budget_spent"] == 0 and len(world.lm.calls) - calls_before == 24
    # a rollout-1 record never stands in for rollout 0 of other instructions, nor the reverse
    assert set(world.runs.stored(get_instructions(world.program), "train", [1], rollout=1)) == {1}
    assert world.runs.stored(world.initial, "train", [1], rollout=1) == {}
    with pytest.raises(AgentToolError, match="validation takes one sample per example"):
        world.moves.evaluate_rollouts(get_instructions(world.program), "val", [0, 1, 2, 3], 2)


def test_compare_with_rollouts_reports_pass_rates_per_candidate_and_example(tmp_path):
    world = World(tmp_path, train=4)
    result = world.moves.compare(["current", {"generate.predict": "FLAKY"}], ids=[1, 3], rollouts=2)
    # current: rollout 0 stored (free), rollout 1 new (2); FLAKY: 2 rollouts x 2 examples new (4)
    assert result["budget_spent"] == 6 == world.ledger.spent
    assert result["examples"][0] == {"example_id": 1, "scores": [0.0, 0.5], "pass_rates": [0.0, 0.5]}
    assert [c["pass_rate"] for c in result["candidates"]] == [0.0, 0.25]
    assert result["candidates"][1]["wins"] == 1 and result["best"] == 1
    steady = world.moves.compare(["current", {"generate.predict": "PASS:1"}], ids=[1, 3], rollouts=2)
    assert "every rollout scored every example the same" in steady["note"]


# -- diff_runs -------------------------------------------------------------------------------------------------


def test_diff_runs_sorts_shared_examples_and_names_the_first_step_whose_outputs_differ(tmp_path):
    world = World(tmp_path)
    result = world.moves.compare(["current", {"generate.predict": "PASS:1,2,3"}], ids=[0, 1, 2, 3])
    after = result["candidates"][1]["run_ids"][0]
    diff = world.moves.diff_runs(world.baseline.run_id, after)
    assert diff["shared_count"] == 4 and diff["instructions_changed"] == ["generate.predict"]
    assert [f["example_id"] for f in diff["fixed"]] == [1, 3]
    assert [b["example_id"] for b in diff["broken"]] == [0]
    assert diff["still_passing"] == [2] and diff["still_failing"] == []
    fixed = diff["fixed"][0]
    assert (
        fixed["first_changed_step"] == "generate.predict" and fixed["call"] == 1
    )  # the draft step's output is the same
    assert fixed["outputs_a"]["answer"] == "wrong" and fixed["outputs_b"]["answer"] == "a1"
    with pytest.raises(AgentToolError, match="is a val run"):
        world.moves.diff_runs(world.baseline.run_id, world.runs.evaluate(world.program, "val", label="agent").run_id)


# -- candidates and hard examples -------------------------------------------------------------------------------


def test_candidates_keep_gepas_pareto_front_and_hard_examples_replay_failures(tmp_path):
    world = World(tmp_path, train=4)
    world.moves.compare(["current", {"generate.predict": "PASS:0,1,2"}, {"generate.predict": "PASS:3"}])
    pool = world.moves.candidates()
    rows = pool["candidates"]
    assert len(rows) == 3 and rows[0]["is_current"] and rows[0]["labels"] == ["baseline", "compare"]
    assert [r["train_score"] for r in rows] == [0.5, 0.75, 0.25]
    assert rows[1]["train_scores"] == {"0": 1.0, "1": 1.0, "2": 1.0, "3": 0.0}
    # the baseline is best on 0 and 2 only where candidate 1 is too: dominated, off the front
    assert pool["pareto_front"] == [1, 2] and [r["on_pareto_front"] for r in rows] == [False, True, True]
    assert rows[2]["best_on"] == [3] and rows[1]["best_on"] == [0, 1, 2]
    assert pool["best"] == 1 and pool["best_by"] == "train"
    hard = world.moves.hard_examples()
    assert hard["best_candidate"] == 1 and hard["failing_under_best"] == [3]
    assert hard["examples"][0] == {"example_id": 1, "failed": 2, "evaluated": 3, "fail_rate": 2 / 3}
    assert {e["example_id"]: e["failed"] for e in hard["examples"]} == {0: 1, 1: 2, 2: 1, 3: 2}
    # a validation check decides the best candidate once there is one
    world.moves.compare([rows[2]["instructions"]], split="val")
    assert world.moves.candidates()["best"] == 2 and world.moves.candidates()["best_by"] == "val"
    assert world.moves.candidates()["candidates"][2]["val_score"] == 0.25
    assert world.moves.hard_examples()["failing_under_best"] == [0, 1, 2]
    assert world.ledger.spent == 8 + 4  # candidates() and hard_examples() are free


# -- the budget under threads -------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [30, 17])
def test_budget_is_exact_when_sixteen_threads_compare_and_propose_at_once(tmp_path, limit):
    """8 comparisons (4 new examples each, all or nothing) and 8 proposals (1 unit each) ask for 40 units at once,
    more than the limit: some are refused, and what was granted is exactly what was spent, counted four ways."""
    proposer = proposal_reply()
    world = World(tmp_path, limit=limit, train=8, proposal_lm=proposer)
    task_calls_before = len(world.lm.calls)
    done: dict[str, list[int]] = {"compare": [], "propose": []}
    refused: dict[str, list[str]] = {"compare": [], "propose": []}
    lock = threading.Lock()
    start = threading.Barrier(16)

    def work(k: int):
        kind = "propose" if k % 2 else "compare"
        start.wait()
        try:
            if kind == "propose":
                out = world.moves.propose_instructions("generate.predict")
            else:
                out = world.moves.compare(["current", {"generate.predict": f"PASS:{k}"}], ids=[0, 1, 2, 3])
        except AgentToolError as exc:
            with lock:
                refused[kind].append(str(exc))
        else:
            with lock:
                done[kind].append(out["budget_spent"])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    compared, proposed = len(done["compare"]), len(done["propose"])
    assert compared + len(refused["compare"]) == 8 and proposed + len(refused["propose"]) == 8
    assert refused["compare"] or refused["propose"], "demand above the limit must be refused somewhere"
    assert all("budget" in message for messages in refused.values() for message in messages)
    # each answer spent what its work costs; the ledger, the LM call logs and the stored runs agree exactly
    assert done["compare"] == [4] * compared and done["propose"] == [1] * proposed
    assert world.ledger.spent_by_kind[TRAIN_EXAMPLE] == 4 * compared
    assert world.ledger.spent_by_kind[SUB_LM_CALL] == proposed == len(proposer.calls)
    assert world.ledger.spent == 4 * compared + proposed <= limit
    assert len(world.lm.calls) - task_calls_before == 2 * 4 * compared  # 2 steps per example
    assert len(world.runs.all()) == 1 + 2 * compared  # the baseline, and a run per candidate of a granted comparison
    # a refusal means what was left could not pay for it: a refused comparison leaves fewer than 4 units, and a
    # refused proposal none at all
    if refused["compare"]:
        assert world.ledger.left < 4
    if refused["propose"]:
        assert world.ledger.left == 0


def test_proposals_started_together_each_pay_for_their_own_answer_while_the_answer_store_opens(tmp_path, monkeypatch):
    """The store of the proposal LM's answers opens on first use; proposals started together while it opens (slow
    here: a run directory on a loaded disk) share one store, so the same prompt asked twice is two askings, each paid
    and answered, never the other's answer replayed for free as if after a resume."""
    import time

    import rlmoptimizer.moves.proposal as proposal_module

    opened = []

    def slow_store(*args, **kwargs):
        time.sleep(0.05)
        opened.append(proposal_module.AnswerStore.__wrapped__(*args, **kwargs))
        return opened[-1]

    slow_store.__wrapped__ = proposal_module.AnswerStore
    monkeypatch.setattr(proposal_module, "AnswerStore", slow_store)
    proposer = proposal_reply()
    world = World(tmp_path, limit=30, train=8, proposal_lm=proposer)
    start = threading.Barrier(6)
    spent: list[int] = []

    def propose():
        start.wait()
        spent.append(world.moves.propose_instructions("generate.predict")["budget_spent"])

    threads = [threading.Thread(target=propose) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(opened) == 1
    assert spent == [1] * 6 and len(proposer.calls) == 6 == world.ledger.spent_by_kind[SUB_LM_CALL]


# -- rollouts in the evaluator, the run service and the records ------------------------------------------------


def test_rollout_lms_count_from_the_lms_own_rollout_id_and_are_made_once(tmp_path):
    lm = task_lm().copy(rollout_id=5, temperature=1.0)
    evaluator = Evaluator(metric=Metric(metric), lm=lm)
    assert evaluator.lm_for(0) is lm
    assert evaluator.lm_for(2).kwargs["rollout_id"] == 7 and evaluator.lm_for(2) is evaluator.lm_for(2)
    assert evaluator.lm_for(2).kwargs["temperature"] == 1.0  # the LM's own temperature is kept
    with pytest.raises(ValueError, match="rollout must be an int >= 0"):
        evaluator.lm_for(-1)


def test_a_run_keeps_its_rollout_through_json_and_a_recovered_evaluation(tmp_path):
    world = World(tmp_path, train=4)
    run = world.runs.evaluate(world.program, "train", label="agent", ids=[0, 1], rollout=2)
    assert run.rollout == 2 and run.summary()["rollout"] == 2 and "rollout" not in world.baseline.summary()
    assert type(run).from_dict(json.loads(json.dumps(run.to_dict()))) == run
    world.runs.store.flush()  # the runs so far are on disk and their own pending logs gone
    # an evaluation the process never finished comes back as a run of the same rollout, reused per rollout
    pending = world.runs.store.open_pending(
        {
            "label": "agent",
            "split": "train",
            "instructions": world.initial,
            "requested": 2,
            "charged": True,
            "rollout": 3,
        }
    )
    pending.append(run.records[0])
    pending.close()
    service = Runs(
        evaluator=world.runs.evaluator, store=RunStore(tmp_path / "runs"), ledger=world.ledger, splits=world.runs.splits
    )
    recovered = service.all()[-1]
    assert recovered.label == "agent:recovered" and recovered.rollout == 3
    assert set(service.stored(world.initial, "train", [0, 1], rollout=3)) == {0}
    assert set(service.stored(world.initial, "train", [0, 1], rollout=2)) == {0, 1}
    # the count a GEPA run asks for every candidate agrees with the records, per split and rollout
    for rollout in (0, 2, 3):
        expected = len(service.stored(world.initial, "train", range(4), rollout=rollout))
        assert service.stored_count(world.initial, "train", rollout=rollout) == expected
    assert service.stored_count(world.initial, "train", rollout=3) == 1
    assert service.stored_count({"nothing": "stored"}, "train") == 0


def test_an_evaluation_spends_from_a_callers_reservation_and_leaves_the_rest_reserved(tmp_path):
    world = World(tmp_path, limit=10, train=4)
    with world.ledger.reserve_exactly(6, TRAIN_EXAMPLE) as reservation:
        assert world.ledger.left == 4
        run = world.runs.evaluate(
            world.program, "train", label="agent", ids=[0, 1, 2], rollout=1, reservation=reservation
        )
        assert run.budget_spent == 3 and reservation.spent == 3 and reservation.remaining == 3
        assert world.ledger.left == 4  # the rest stays set aside for the caller
    assert world.ledger.left == 7 and world.ledger.spent == 3


def test_an_lm_call_that_failed_without_an_answer_is_not_held_against_the_instructions(tmp_path):
    base = task_lm()

    def reply(messages, settings):
        if field(messages, "question") == "q1":
            return dspy.LMRateLimitError("slow down", model="task", provider="fake")
        return base.fn(messages, settings)

    def failing_lm() -> FunctionLM:
        lm = FunctionLM(reply, with_settings=True)
        lm.num_retries = 0  # no provider-level retries: the failure is immediate
        return lm

    world = World(tmp_path, train=4, lm=failing_lm(), transient_retries=0)
    assert world.baseline.records[1].error.startswith("LMRateLimitError")
    assert world.moves.hard_examples()["examples"] == [{"example_id": 3, "failed": 1, "evaluated": 1, "fail_rate": 1.0}]
    assert world.moves.candidates()["candidates"][0]["train_scores"] == {"0": 1.0, "2": 1.0, "3": 0.0}
    proposal = World(tmp_path / "b", train=4, lm=failing_lm(), transient_retries=0, proposal_lm=proposal_reply())
    assert proposal.moves.propose_instructions("generate.predict")["example_ids"] == [3]


def test_rollouts_reach_steps_that_have_their_own_lm(tmp_path):
    own = task_lm()
    world = World(tmp_path, train=4, lm=task_lm())
    world.runs.evaluator.lm = None  # no pinned LM: every step runs its own (set_lm), as dspy.Evaluate does
    world.program.set_lm(own)
    world.program.generate.predict.signature = world.program.generate.predict.signature.with_instructions("FLAKY")
    view = world.moves.evaluate_rollouts(get_instructions(world.program), "train", [0, 1], 2)
    assert view["budget_spent"] == 4 and len(own.calls) == 8  # 2 rollouts x 2 examples x 2 steps, all real calls
    assert [e["rollout_scores"] for e in view["examples"]] == [[1.0, 1.0], [0.0, 1.0]]
    assert all(p.lm is own for _, p in world.program.named_predictors())  # the program keeps its own LMs
    assert get_instructions(world.program)["generate.predict"] == "FLAKY"


@pytest.mark.parametrize("raised", [RuntimeError, KeyboardInterrupt])
def test_paid_records_stay_pending_only_when_an_interrupt_ends_the_process(tmp_path, monkeypatch, raised):
    """A Ctrl-C landing after an evaluation's examples completed (outside its own interrupt handling) leaves their
    paid records pending, for the resume to take; an ordinary error there does not end the compile (an agent's tool
    call failed), and the ledger written after it counts them already: a log left then would be charged twice."""
    import concurrent.futures

    from rlmoptimizer.evaluation import evaluator

    world = World(tmp_path)
    world.runs.store.flush()  # the baselines' pending logs go on a background thread: gone before the one counted

    main = threading.current_thread()

    class Pool(concurrent.futures.ThreadPoolExecutor):
        def shutdown(self, wait=True, *, cancel_futures=False):
            super().shutdown(wait=wait, cancel_futures=cancel_futures)
            if threading.current_thread() is main and self._thread_name_prefix == "rlmoptimizer-eval":
                raise raised("after the examples completed")

    monkeypatch.setattr(evaluator, "ThreadPoolExecutor", Pool)
    with pytest.raises(raised):
        world.runs.evaluate(world.program, "val", label="agent")
    left = list(world.runs.store.layout.pending_logs())
    assert len(left) == (1 if raised is KeyboardInterrupt else 0)
    if left:  # its header and the 4 paid records
        assert len(left[0].read_text().splitlines()) == 1 + 4, left[0].read_text()


def test_a_demo_of_a_later_step_is_traced_to_the_example_whose_call_it_is_not_to_every_alike_input(tmp_path):
    """Regression: demos were traced by the inputs they show alone, so a demo of a step whose inputs take few
    values (explain: label -> explanation) was traced to every train example with that label: half the train set
    left the candidate's comparisons."""
    from rlmoptimizer.moves.context import DemoIndex

    index = DemoIndex()
    for i in range(20):
        label = "pos" if i % 2 == 0 else "neg"
        index.add_example({"question": f"review {i}"}, i)
        index.add_call({"question": f"review {i}", "label": label}, i)
        index.add_call({"label": label, "explanation": f"because of review {i}"}, i)
    assert index.train_ids({"label": "pos", "explanation": "because of review 4"}) == {4}
    # a first step's demo as dspy.BootstrapFewShot makes it: the example's inputs, a teacher's reasoning, its mark
    assert index.train_ids({"question": "review 7", "reasoning": "a teacher's", "label": "neg", "augmented": True}) == {
        7
    }
    assert index.train_ids({"label": "pos", "explanation": "written by hand"}) == set()
