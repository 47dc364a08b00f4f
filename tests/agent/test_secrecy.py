"""Validation is aggregate-only, checked where the agent sees things: an agent that asks every tool for
everything it will give about validation (``baseline_val``, a validation run and ``run_data`` of it, ``compare``
and ``run_gepa`` with a validation split, ``analyze_failures`` and a proposal for one of its groups, ``candidates``,
``hard_examples``, ``optimization_status``, ``diff_runs``, ``llm_query``), through the real sandbox, and prints all of it. No validation ticket appears in any REPL output, any
root-LM request or any sub-LM request, while the evaluation LM did run on every one of them and the train tickets
the agent may see do appear."""

from __future__ import annotations

import pytest
from support.fakes import FunctionLM, scripted_agent
from support.optimizing import SUBMIT_POLICY, compile_tickets, proposer
from support.tickets import make_splits, task_lm_reply

pytestmark = pytest.mark.slow

DUMP = "import json\ndef show(name, value):\n    print(name, json.dumps(value, default=repr))\n"
TURNS = [
    {
        "reasoning": "everything the REPL holds",
        "code": DUMP
        + (
            "for _name, _value in sorted(globals().items()):\n"
            "    if not _name.startswith('_') and not callable(_value) and _name not in ('json',):\n"
            "        print(_name, repr(_value))\n"
            "show('baseline_val', baseline_val)"
        ),
    },
    {
        "reasoning": "validation runs",
        "code": (
            "v = evaluate_program(split='val')\nshow('val run', v)\n"
            "show('run_data val', run_data(v['run_id']))\nshow('run_data baseline val', run_data(baseline_val['run_id']))\n"
            "try:\n    diff_runs(baseline_val['run_id'], v['run_id'])\nexcept Exception as e:\n    print('diff_runs', e)"
        ),
    },
    {
        "reasoning": "moves on validation",
        "code": (
            "p = propose_instructions('route')\nshow('proposal', p)\n"
            "show('analysis', analyze_failures())\nshow('group proposal', propose_instructions('route', group=0))\n"
            "show('compare val', compare(['current', *p['candidate_ids']], split='val'))\n"
            "show('gepa', run_gepa(budget=20, steps=['route']))"
        ),
    },
    {
        "reasoning": "the pools and the status",
        "code": (
            "show('candidates', candidates())\nshow('hard', hard_examples())\nshow('status', optimization_status())\n"
            "show('notes', read_notes())\nprint('sub-LM says', llm_query('What failed on validation? ' + json.dumps(baseline_val)))"
        ),
    },
    SUBMIT_POLICY,
]


def test_no_validation_example_reaches_the_agent_or_its_lms():
    root, sub, task = scripted_agent(TURNS), proposer(), FunctionLM(task_lm_reply)
    result = compile_tickets(root, sub_lm=sub, eval_lm=task, max_iterations=4)
    trainset, valset = make_splits()
    val_tickets = [example.ticket for example in valset]

    trajectory = result.agent_trajectory
    assert [turn["iteration"] for turn in trajectory] == [1, 2, 3, 4, 5] and trajectory[-1]["final"]
    shown = "\n".join(turn["output"] for turn in trajectory)
    for printed in (
        "baseline_val",
        "val run",
        "run_data val",
        "run_data baseline val",
        "diff_runs",
        "proposal",
        "analysis",
        "group proposal",
        "compare val",
        "gepa",
        "candidates",
        "hard",
        "status",
        "sub-LM says",
    ):
        assert f"\n{printed} " in f"\n{shown}", f"the agent's {printed!r} was not shown"
    assert "is a val run" in shown  # diff_runs refuses validation runs
    root_requests = "\n".join(str(messages) for messages in root.calls)
    sub_requests = "\n".join(str(messages) for messages in sub.calls)
    assert len(sub.calls) >= 3  # the proposal, gepa's reflections and llm_query reached the sub-LM

    for ticket in val_tickets:
        assert ticket not in shown, f"a REPL output shows the validation ticket {ticket!r}"
        assert ticket not in root_requests, f"a root-LM request shows the validation ticket {ticket!r}"
        assert ticket not in sub_requests, f"a sub-LM request shows the validation ticket {ticket!r}"
        assert any(ticket in str(messages) for messages in task.calls)  # the program did run on it
    # the scan sees example text where the agent may see it: every train ticket is in baseline_train's output
    for example in trainset:
        assert example.ticket in shown and example.ticket in root_requests
