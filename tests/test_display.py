"""verbose=True shows each agent turn and the evaluations; verbose=False prints nothing at all."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from support.fakes import FunctionLM, scripted_agent
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import RLMDocstringOptimizer

pytestmark = pytest.mark.slow  # every test here runs compile() with a real sandbox

TURNS = [
    {"reasoning": "count the failures", "code": "print('failures:', baseline_train['evaluated_count'] - baseline_train['passed_count'])"},
    {"reasoning": "submit", "code": f"SUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})"},
]


def compile_once(**kwargs):
    trainset, valset = make_splits()
    opt = RLMDocstringOptimizer(
        max_iterations=1, root_lm=scripted_agent(TURNS), eval_lm=FunctionLM(task_lm_reply), **kwargs
    )
    return opt.compile(student=RouteTicket(), trainset=trainset, metric=metric, valset=valset)


def test_verbose_shows_turns_and_evaluations():
    buffer = io.StringIO()
    compile_once(verbose=True, console=Console(file=buffer, width=120, force_terminal=False))
    shown = buffer.getvalue()
    assert "agent turn 1" in shown and "agent turn 2 (submitted)" in shown
    assert "count the failures" in shown and "failures: 2" in shown
    assert "evaluating baseline on train: 12/12 (10 passed)" in shown
    assert "evaluating submission on val: 8/8" in shown
    assert "run-0001" in shown and "budget left" in shown


def test_quiet_prints_nothing(capsys):
    compile_once(verbose=False)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_verbose_ends_with_what_each_role_spent():
    buffer = io.StringIO()
    result = compile_once(verbose=True, console=Console(file=buffer, width=400, force_terminal=False))
    last = buffer.getvalue().strip().splitlines()[-1]
    usage = result.usage
    assert last.startswith("Done: ") and "LM usage: root 2 calls" in last
    assert f"eval {usage['eval']['calls']} calls, {usage['eval']['input_tokens']:,} in" in last
    assert usage["eval"]["calls"] == 2 * (12 + 8 + 8)  # both baselines and the submission's check, 2 steps each
    assert "sub 0 calls" in last and "$?" in last  # the fakes' model names have no price
