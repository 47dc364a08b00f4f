"""A compile whose returned instructions were written for a group of a failure analysis: the agent analyses the
unchanged program's train failures (``analyze_failures``), proposes for the largest group
(``propose_instructions('route', group=0)``), adopts the proposal, checks it on validation, asks for the same
analysis again (free) and submits.

The sub-LM (:func:`analyst`) names a cause per failure from its ticket, merges the causes into groups, and answers
dspy's instruction proposer with the policy, each by what it is asked; it records every request."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import dspy

from rlmoptimizer.testing import FunctionLM, last_user_text
from support.optimizing import SUBMIT_LINE, compile_tickets
from support.tickets import POLICY_PROMPT

DISPUTE_CAUSE = "A chargeback or bank dispute goes to disputes, even when it reads like billing."
GROUP = "chargebacks to disputes"

TURNS = [
    {
        "reasoning": "analyse the failures",
        "code": "a = analyze_failures()\nprint(a['summary'])\nprint(json.dumps({'groups': a['groups'], 'spent': "
        "a['budget_spent'], 'left': optimization_status()['budget_left']}))",
    },
    {
        "reasoning": "propose for the largest group",
        "code": "p = propose_instructions('route', group=0)\nprint(json.dumps(p['made_for']))\n"
        "print(adopt_candidate(p['candidate_ids'][0])); print(evaluate_program(split='val')['score'])",
    },
    {
        "reasoning": "the same analysis again",
        "code": "left = optimization_status()['budget_left']\nb = analyze_failures(run_id=baseline_train['run_id'])\n"
        "c = analyze_failures(run_id=baseline_train['run_id'])\n"
        "print(json.dumps({'reused': c['reused'], 'same': c['groups'] == b['groups'], 'spent': c['budget_spent'], "
        "'left_before': left, 'left': optimization_status()['budget_left']}))",
    },
    {"reasoning": "submit", "code": SUBMIT_LINE},
]


def analysis_answer(user: str) -> dict | None:
    """The sub-LM's answer to an analysis prompt (``user``: its last user message): one cause for every failure
    (:data:`DISPUTE_CAUSE`), or one group of them all for the merge; None for any other prompt."""
    if "[[ ## failures ## ]]" in user:
        ids = [int(i) for i in re.findall(r"\[failure (\d+)\]", user)]
        return {"causes": [{"failure_id": i, "cause": DISPUTE_CAUSE} for i in ids]}
    if "[[ ## causes ## ]]" in user:
        ids = [int(i) for i in re.findall(r"^(\d+): ", user.split("[[ ## causes ## ]]", 1)[1], re.M)]
        return {"groups": [{"name": GROUP, "cause": DISPUTE_CAUSE, "failure_ids": ids}]}
    return None


def analyst() -> FunctionLM:
    """The sub-LM: causes for the analysis' cause prompts, groups for its merge, the policy for a proposal."""

    def reply(messages):
        answer = analysis_answer(last_user_text(messages))
        return answer if answer is not None else json.dumps({"new_instruction": POLICY_PROMPT})

    return FunctionLM(reply, name="analyst")


def compile_with_analysis(directory: str | Path, sub_lm: FunctionLM | None = None, **kwargs: Any) -> dspy.Module:
    """Play :data:`TURNS` into ``directory``; the returned program is ``proposal-1``, made for the group."""
    return compile_tickets(TURNS, sub_lm=sub_lm or analyst(), max_iterations=3, run_storage_dir=directory, **kwargs)
