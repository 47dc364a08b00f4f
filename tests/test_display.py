"""verbose=True shows each agent turn and the evaluations; verbose=False prints nothing at all."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from support.optimizing import SUBMIT_POLICY, compile_tickets

pytestmark = pytest.mark.slow  # every test here runs compile() with a real sandbox

TURNS = [
    {
        "reasoning": "count the failures",
        "code": "print('failures:', baseline_train['evaluated_count'] - baseline_train['passed_count'])",
    },
    SUBMIT_POLICY,
]


def compile_once(**kwargs):
    return compile_tickets(TURNS, max_iterations=1, **kwargs)


def test_verbose_shows_turns_and_one_line_per_evaluation_in_a_log():
    buffer = io.StringIO()
    result = compile_once(verbose=True, console=Console(file=buffer, width=200, force_terminal=False))
    shown = buffer.getvalue()
    assert "agent turn 1" in shown and "agent turn 2 (submitted)" in shown
    assert "count the failures" in shown and "failures: 2" in shown
    assert "evaluating" not in shown  # no progress lines where they cannot be redrawn
    for log in result.trial_logs:  # one summary line per evaluation run
        line = f"{log['run_id']} {log['label']} on {log['split']}: score {log['score']:.3f}"
        assert shown.count(line) == 1
    assert "run-0001 baseline on train: score 0.833 (10/12 passed)" in shown


def test_verbose_in_a_terminal_draws_a_live_progress_line_per_evaluation():
    buffer = io.StringIO()
    compile_once(verbose=True, console=Console(file=buffer, width=200, force_terminal=True, color_system=None))
    shown = buffer.getvalue()
    assert "evaluating baseline on train" in shown and "12/12 (10 passed)" in shown
    assert "evaluating submission on val" in shown and "8/8" in shown
    assert shown.count("run-0001 baseline on train: score 0.833 (10/12 passed)") == 1


def test_quiet_prints_nothing(capsys):
    compile_once(verbose=False)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_verbose_ends_with_what_each_role_spent():
    buffer = io.StringIO()
    result = compile_once(verbose=True, console=Console(file=buffer, width=1000, force_terminal=False))
    lines = buffer.getvalue().strip().splitlines()
    # the Done line, then what each role was predicted to cost before the run beside what it spent
    done = max(i for i, line in enumerate(lines) if line.startswith("Done: "))
    assert lines[done + 1].startswith("Cost: predicted before the run, and spent")
    assert lines[-1].startswith("at most: ")
    last = lines[done]
    usage = result.usage
    assert last.startswith("Done: ") and "LM usage: root 2 calls" in last
    assert f"eval {usage['eval']['calls']} calls, {usage['eval']['input_tokens']:,} in" in last
    assert usage["eval"]["calls"] == 2 * (12 + 8 + 8)  # both baselines and the submission's check, 2 steps each
    assert "sub 0 calls" in last and "no price for fake" in last  # the fakes' model names have no price
