"""The worked run of docs/analysis-and-demos.md (examples/analysis_and_demos.py): the default loop past GEPA
analyses the failures its best leaves, proposes for the largest group, does not pay to compare a proposal that only
repeats the current instructions, and returns a program whose demos teach what no instruction could."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "analysis_and_demos.py"


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    return out.getvalue()


def test_the_worked_run_groups_the_failures_gepa_left_and_names_the_group_a_proposal_was_for(printed):
    assert "analysis-1: 2 group(s) of the failures GEPA's best left on train" in printed
    assert "  feedback tickets (3: train [5, 9, 14]): A feature idea belongs to feedback" in printed
    assert "proposal-1, written for group 'feedback tickets' of analysis-1: " in printed
    actions = printed.split("\n\n", 1)[0].splitlines()[1:]
    assert actions[:4] == [
        "  run_gepa(budget=122)",
        "  adopt_candidate('gepa-1'); evaluate_program(split='val')",
        "  analyze_failures()",
        "  propose_instructions('route', group={'analysis': 'analysis-1', 'name': 'feedback tickets'})",
    ]
    # proposal-1 repeated the current instructions: nothing to learn from comparing it, so it was not compared
    assert not any("'proposal-1'" in action for action in actions)
    assert "  compare(['current', 'demos-1'], ids='3,0,5,1,9,2,14,4,6,10,11,12')" in actions


def test_the_worked_run_returns_demos_that_teach_what_no_instruction_could(printed):
    assert "demos of the returned program, from train examples [13, 8, 15, 7]:" in printed
    assert "  'Feature request: keyboard shortcuts in the app.' -> feedback" in printed
    assert "validation: 0.12 unchanged -> 0.88 returned" in printed


def test_the_docs_show_what_the_example_prints(printed):
    """Regression: the page showed a run of an older version (47 metric calls where the example spent 51, an
    evaluation of the demos' own examples missing)."""
    page = (EXAMPLE.parent.parent / "docs" / "analysis-and-demos.md").read_text(encoding="utf-8")
    shown = page.split("```text\n", 1)[1].split("```", 1)[0]
    assert shown.strip() == printed.strip()


def test_the_loop_never_pays_to_evaluate_the_current_demos_own_examples(printed):
    """A demo sees its own answer: evaluating the current instructions on its example can find no failure."""
    import re

    demos = {int(i) for i in re.search(r"from train examples \[([\d, ]+)\]", printed).group(1).split(", ")}
    adopted = printed.index("adopt_candidate('demos-1')")
    evaluated = re.findall(r"evaluate_program\(ids='([\d,]+)'\)", printed[adopted : printed.index("\n\n")])
    assert not demos & {int(i) for ids in evaluated for i in ids.split(",")}
