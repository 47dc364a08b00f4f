"""``run_gepa`` with reflections that yield nothing, through the real sandbox: such a reflection proposes nothing and
the run goes on, and the run says how many there were and what one said, where the agent and the user look."""

from __future__ import annotations

import json
import logging

import pytest
from support.fakes import FunctionLM
from support.optimizing import SUBMIT_CURRENT, compile_tickets
from support.tickets import POLICY_PROMPT

pytestmark = pytest.mark.slow

GEPA = {
    "reasoning": "gepa",
    "code": (
        "import json\n"
        "try:\n"
        "    r = run_gepa(budget=19)\n"
        "    print(r['summary'])\n"
        "    print(json.dumps({k: r[k] for k in ('reflections', 'reflections_unusable', 'candidate_ids', 'spent')}))\n"
        "except Exception as e:\n"
        "    print('REFUSED', type(e).__name__, e)\n"
    ),
}


def run_with(reply):
    return compile_tickets([GEPA, SUBMIT_CURRENT], sub_lm=FunctionLM(lambda messages: reply, name="reflection"))


def shown(result) -> tuple[str, dict]:
    output = result.agent_trajectory[0]["output"].strip()
    return output, json.loads(output.splitlines()[-1])


def test_a_reflection_answering_an_empty_instruction_proposes_nothing_and_the_run_goes_on(caplog):
    """Regression: a reflection LM answering {"new_instruction": ""} made dspy's InstructionProposer raise
    ValueError, and the whole GEPA run stopped with "the reflection LM (sub_lm) failed ... check sub_lm (its key,
    model name or provider)": the wrong diagnosis for an LM that answered."""
    with caplog.at_level(logging.WARNING, logger="rlmoptimizer.moves.gepa"):
        result = run_with(json.dumps({"new_instruction": ""}))
    output, outcome = shown(result)
    assert "REFUSED" not in output and "check sub_lm" not in output, output
    assert outcome["reflections"] >= 2 and outcome["reflections_unusable"] == outcome["reflections"]
    assert outcome["candidate_ids"] == []
    count = outcome["reflections_unusable"]
    assert f"{count} of {count} reflection(s) gave no usable instructions (e.g. ValueError: " in output
    assert "empty instruction" in output
    # the user sees it too: a warning, and the agent's trajectory in the result
    assert any("gave no usable instructions" in r.getMessage() for r in caplog.records)
    assert len(result.agent_trajectory) == 2 and result.agent_trajectory[-1]["final"]


def test_a_run_whose_reflections_do_not_parse_says_how_many_and_shows_one():
    """Regression: every reflection came back unusable, run_gepa spent 10 of 16 units with 0 new candidates, and
    nothing told the user or the agent why."""
    result = run_with("I would tell the router to follow the policy.")
    output, outcome = shown(result)
    count = outcome["reflections_unusable"]
    assert count >= 2 and count == outcome["reflections"] and outcome["candidate_ids"] == []
    assert f"{count} of {count} reflection(s) gave no usable instructions" in output
    assert "'I would tell the router to follow the policy.' did not parse" in output


def test_a_function_lm_replying_with_a_dict_of_output_fields_reflects_as_documented():
    """Regression: docs/testing.md says a FunctionLM may reply with a dict of output fields, but such a reply was
    formatted for ChatAdapter while dspy's InstructionProposer asks for JSON: every reflection came back unusable
    and run_gepa found nothing. The dict is answered as JSON when the request asks for a JSON object."""
    result = run_with({"new_instruction": POLICY_PROMPT})
    output, outcome = shown(result)
    assert outcome["reflections_unusable"] == 0 and outcome["candidate_ids"], output
    assert "gave no usable instructions" not in output


def test_proposals_whose_replies_do_not_parse_are_refused_saying_how_many_and_showing_one():
    """Regression (the same silence in propose_instructions): proposals that all came back unusable were refused
    with the parser's first line only, neither how many nor what the LM said."""
    result = compile_tickets(
        [
            {
                "reasoning": "propose",
                "code": "try:\n    propose_instructions('route', n=2)\nexcept Exception as e:\n    print('REFUSED', e)",
            },
            SUBMIT_CURRENT,
        ],
        sub_lm=FunctionLM(lambda messages: "Route by the policy, I suppose.", name="proposer"),
    )
    output = result.agent_trajectory[0]["output"]
    assert "REFUSED the proposal LM gave no usable instructions (2 of 2 asked)" in output, output
    assert "the reply 'Route by the policy, I suppose.' did not parse" in output
    assert result.budget["spent_by_kind"]["sub_lm_call"] == 2  # both answered: both are charged
