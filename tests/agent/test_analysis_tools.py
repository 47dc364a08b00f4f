"""``analyze_failures`` and ``propose_instructions(group=...)`` as the agent's tools, through the real sandbox: what
the agent is shown, the charges, the reuse for nothing, and the lineage of the returned program in
``detailed_results`` and the report."""

from __future__ import annotations

import json

import pytest
from support.analysing import DISPUTE_CAUSE, GROUP, analyst, compile_with_analysis
from support.metrics import CountingMetric
from support.optimizing import SUBMIT_LINE, compile_tickets
from support.tickets import POLICY_PROMPT

from rlmoptimizer.__main__ import main
from rlmoptimizer.moves.analysis import prompts_for

pytestmark = pytest.mark.slow


def test_an_agent_analyses_proposes_for_a_group_and_the_returned_programs_lineage_names_it(tmp_path, capsys):
    sub = analyst()
    directory = tmp_path / "run"
    optimized = compile_with_analysis(directory, sub_lm=sub)
    outputs = [turn["output"] for turn in optimized.agent_trajectory]
    first = outputs[0].strip().splitlines()
    assert first[0].startswith("analysis-1 of the current instructions' train records: 2 failure(s) of 12"), outputs[0]
    assert f"0. {GROUP} (2): {DISPUTE_CAUSE}" in outputs[0]
    shown = json.loads(first[-1])
    [group] = shown["groups"]
    assert group["example_ids"] == [3, 8] and group["count"] == 2 and group["step"] == "route"
    assert group["labels"] == {"queue: 'disputes' -> 'billing'": 2}
    assert shown["spent"] == prompts_for(2) == 2  # one cause prompt, one merge
    made_for = {"analysis": "analysis-1", "group": GROUP, "example_ids": [3, 8]}
    assert json.loads(outputs[1].strip().splitlines()[0]) == made_for
    assert float(outputs[1].strip().splitlines()[-1]) == 1.0
    again = json.loads(outputs[2].strip().splitlines()[-1])
    assert again == {"reused": True, "same": True, "spent": 0, "left_before": again["left"], "left": again["left"]}
    # analysis-2 (the baseline run by id) asked the same prompts as analysis-1: replayed, not asked again
    assert len(sub.calls) == 2 + 1  # the analysis' two prompts and the proposal
    assert optimized.budget["spent_by_kind"]["sub_lm_call"] == 3

    assert optimized.optimized_dspy_program["route"] == POLICY_PROMPT
    results = optimized.detailed_results
    assert results.returned_candidate_id == "proposal-1"
    assert results.lineage["proposal-1"]["made_for"] == made_for
    assert results.ancestry[-1]["made_for"] == made_for and results.ancestry[0]["made_for"] is None
    kept = json.loads((directory / "analyses.json").read_text())
    assert [a["analysis_id"] for a in kept["analyses"]] == ["analysis-1", "analysis-2"]
    assert kept["latest"] == "analysis-2"
    assert main(["report", str(directory), "--no-plot"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"made for group '{GROUP}' of analysis-1 (train 3, 8)" in out


def test_with_max_metric_calls_an_analysis_is_paid_from_the_sub_lm_allowance_and_no_metric_call_is_made():
    counting = CountingMetric()  # on 12 train and 8 validation examples
    turns = [
        {"reasoning": "read the failures", "code": "print(baseline_train['passed_count'])"},
        {
            "reasoning": "analyse",
            "code": "a = analyze_failures()\ns = optimization_status()\n"
            "print(json.dumps([a['budget_spent'], s['budget_left'], s['sub_lm_left']]))",
        },
        {"reasoning": "submit", "code": SUBMIT_LINE},
    ]
    # (40: reading the train baseline takes at most half of the 32 - 8 units beyond a validation check: all 12)
    result = compile_tickets(turns, sub_lm=analyst(), max_metric_calls=40, metric=counting)
    outputs = [turn["output"] for turn in result.agent_trajectory]
    assert json.loads(outputs[1].strip().splitlines()[-1]) == [2, 40 - 8 - 12, 40 - 2]
    assert counting.calls == 8 + 12  # the validation baseline and the train baseline read: the analysis made none
    assert result.budget["spent_by_kind"] == {"train_example": 12, "val_example": 0, "sub_lm_call": 2}


def test_a_tool_result_left_as_a_cells_value_shows_its_summary_and_is_still_a_whole_dict():
    """Regression: ``analyze_failures()`` as a cell's last line showed the whole result's repr (10k characters on the
    benchmark), which every later turn of the root LM carried in its history."""
    turns = [
        {"reasoning": "analyse", "code": "analyze_failures()"},
        {
            "reasoning": "read it",
            "code": "a = analyze_failures()\nprint(isinstance(a, dict), a['groups'][0]['count'], sorted(dict(a)) == "
            "sorted(json.loads(json.dumps(a))), len(repr(dict(a))) > len(repr(a)))\n"
            "del a['summary']\nprint(repr(a) == repr(dict(a)))",  # without its summary: a plain dict's repr
        },
        {"reasoning": "submit", "code": SUBMIT_LINE},
    ]
    result = compile_tickets(turns, sub_lm=analyst(), max_iterations=3)
    shown, read = (turn["output"].strip() for turn in result.agent_trajectory[:2])
    assert shown.startswith("analysis-1 of the current instructions' train records: 2 failure(s) of 12"), shown
    assert f"0. {GROUP} (2): {DISPUTE_CAUSE}" in shown
    assert shown.splitlines()[-1].startswith("(a dict: result[key] reads one of 'analysis_id', ")
    assert "'groups'" in shown.splitlines()[-1] and "{'analysis_id'" not in shown
    assert read == "True 2 True True\nTrue"
