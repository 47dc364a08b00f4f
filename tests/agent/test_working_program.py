"""The working program tries instructions in place (no copy) and puts back the very signatures it had."""

from __future__ import annotations

import dspy
import pytest
from dspy.utils.exceptions import LMAuthError
from support.fakes import FunctionLM, system_text
from support.qa import TwoSteps, examples, field, make_evaluator

from rlmoptimizer.agent.stop import StopRequest
from rlmoptimizer.agent.working_program import WorkingProgram
from rlmoptimizer.budget import BudgetLedger
from rlmoptimizer.errors import AgentToolError, ConfigurationError, EvaluationLMError
from rlmoptimizer.evaluation.runs import Runs
from rlmoptimizer.fingerprint import (
    MAX_DEMOS_CHARS,
    MAX_INSTRUCTION_CHARS,
    get_instructions,
    instructions_for_now,
    structural_fingerprint,
)
from rlmoptimizer.storage.run_store import RunStore


def exact_when_told(messages):
    """Answers ``a<i>`` to ``q<i>`` only when the instructions say EXACT."""
    answer = field(messages, "question").replace("q", "a")
    return {"answer": answer if "EXACT" in system_text(messages) else "no idea"}


def working_program(tmp_path, lm, program: dspy.Module | None = None) -> WorkingProgram:
    runs = Runs(
        evaluator=make_evaluator(lm), store=RunStore(tmp_path), ledger=BudgetLedger(100), splits={"train": examples(3)}
    )
    program = program or dspy.Predict("question -> answer")
    return WorkingProgram(program=program, fingerprint=structural_fingerprint(program), runs=runs, stop=StopRequest())


def test_a_trial_evaluation_scores_the_trial_instructions_and_leaves_the_very_signature(tmp_path):
    working = working_program(tmp_path, FunctionLM(exact_when_told))
    before = working.program.signature
    trial = working.evaluate("train", None, "trial", instructions={"self": "Give the EXACT answer."})
    assert trial.score == 1.0 and trial.instructions == {"self": "Give the EXACT answer."}
    assert working.program.signature is before
    assert working.evaluate("train", None, "current").score == 0.0


def test_a_trial_evaluation_that_fails_leaves_the_very_signature_and_requests_a_stop(tmp_path):
    working = working_program(tmp_path, FunctionLM(lambda m: LMAuthError("401: no such key")))
    before = working.program.signature
    with pytest.raises(EvaluationLMError):
        working.evaluate("train", None, "trial", instructions={"self": "Give the EXACT answer."})
    assert working.program.signature is before and working.stop.requested


def test_a_checked_map_changes_nothing_and_a_set_one_is_kept_as_a_version(tmp_path):
    working = working_program(tmp_path, FunctionLM(exact_when_told))
    before = working.program.signature
    assert working.validate_prompt_map({"self": "Give the EXACT answer."}) == {"self": "Give the EXACT answer."}
    assert working.program.signature is before
    working.set_instructions({"self": "Give the EXACT answer."}, source="update_prompt")
    assert working.instructions() == {"self": "Give the EXACT answer."}
    assert [v["previous"] for v in working.prompt_versions] == [before.instructions]


def test_instructions_for_now_puts_back_the_very_signatures_also_when_applying_them_fails():
    program = TwoSteps()
    before = {name: p.signature for name, p in program.named_predictors()}
    with instructions_for_now(program, {"draft": "Draft it."}):
        assert get_instructions(program)["draft"] == "Draft it."
    assert all(p.signature is before[name] for name, p in program.named_predictors())
    with pytest.raises(RuntimeError), instructions_for_now(program, {"generate.predict": "Think."}):
        raise RuntimeError("the block failed")
    # the first step is applied before the second is refused for not being text
    with (
        pytest.raises(ConfigurationError, match="must be a str"),
        instructions_for_now(program, {"draft": "Draft it.", "generate.predict": 3}),
    ):
        pass
    assert all(p.signature is before[name] for name, p in program.named_predictors())


def test_demos_with_none_of_the_steps_fields_are_refused_unless_they_are_the_programs_own(tmp_path):
    runs = Runs(
        evaluator=make_evaluator(FunctionLM(exact_when_told)),
        store=RunStore(tmp_path),
        ledger=BudgetLedger(100),
        splits={"train": examples(3)},
    )
    program = dspy.Predict("question -> answer")
    program.demos = [dspy.Example(old_question="q", old_answer="a")]  # the user's, from before a field was renamed
    working = WorkingProgram(
        program=program, fingerprint=structural_fingerprint(program), runs=runs, stop=StopRequest()
    )
    own = working.initial["self:demos"]

    with pytest.raises(AgentToolError, match=r"demo 1 has none of the step's fields \['answer', 'question'\]"):
        working.check_text("self:demos", [{"question": "q1", "answer": "a1"}, {"foo": "bar"}])
    working.set_instructions(
        {"self:demos": working.check_text("self:demos", [{"question": "q1", "answer": "a1"}])}, "x"
    )
    assert [dict(d) for d in working.program.demos] == [{"question": "q1", "answer": "a1"}]
    # the program's own demos can be put back after others were adopted, and evaluated with the unchanged map
    assert working.check_text("self:demos", own) == own
    run = working.evaluate("train", None, "baseline", instructions=working.initial)
    assert run.evaluated_count == 3


def test_instructions_past_the_length_limit_are_refused_before_anything_is_paid(tmp_path):
    """Regression: a 20 MB SUBMIT (or update_prompt) was accepted and evaluated, each evaluation-LM request carrying
    all of it."""
    lm = FunctionLM(exact_when_told)
    working = working_program(tmp_path, lm)
    long = "Give the EXACT answer. " * (MAX_INSTRUCTION_CHARS // 20)
    with pytest.raises(AgentToolError, match=r"more than the 50,000 a step may have"):
        working.validate_prompt_map({"self": long})
    assert working.validate_prompt_map({"self": long[:MAX_INSTRUCTION_CHARS]}) == {"self": long[:MAX_INSTRUCTION_CHARS]}
    demos = [{"question": "q" * 1_000, "answer": "a"}] * (MAX_DEMOS_CHARS // 1_000)
    with pytest.raises(AgentToolError, match="a step may have"):
        working.validate_prompt_map({"self:demos": demos})
    assert lm.calls == []


def test_a_program_whose_own_instructions_are_long_may_keep_them_and_grow_them(tmp_path):
    own = "Rule. " * MAX_INSTRUCTION_CHARS  # 300,000 characters of the user's own
    program = dspy.Predict(dspy.Signature("question -> answer", own))
    working = working_program(tmp_path, FunctionLM(exact_when_told), program)
    grown = own + " Give the EXACT answer."
    assert working.validate_prompt_map({"self": grown}) == {"self": grown}


def test_what_a_step_already_holds_passes_the_length_limit(tmp_path):
    """A candidate a move made (demos of long documents) and adopted is the step's text: submitting the current
    instructions must not be refused for it."""
    working = working_program(tmp_path, FunctionLM(exact_when_told))
    held = "Give the EXACT answer. " * (MAX_INSTRUCTION_CHARS // 10)  # past the limit
    working.set_instructions({"self": held}, source="adopt_candidate")
    assert working.validate_prompt_map({"self": held}) == {"self": held}
    with pytest.raises(AgentToolError, match="a step may have"):
        working.validate_prompt_map({"self": held + " More."})
