"""A compile whose returned instructions have an ancestry of two generations: ``propose_instructions`` makes
``proposal-1`` from the unchanged program (a rewording that fixes nothing), the agent adopts it, ``run_gepa`` starts
from it and finds ``gepa-1`` (the policy), the agent adopts that, checks it on validation and submits.

The sub-LM answers dspy's instruction proposer with the rewording first, then gepa's reflection prompt with the
policy (:func:`support.optimizing.proposer`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dspy

from support.optimizing import SUBMIT_LINE, compile_tickets, proposer
from support.tickets import POLICY_PROMPT

REWORDED = "Given the ticket summary, answer with exactly one queue: billing, technical, how-to, disputes or security."
"""``proposal-1``: the queues named, no policy stated (the fake task LM routes as before)."""

TURNS = [
    {"reasoning": "propose", "code": "p = propose_instructions('route'); print(p['candidate_ids'])"},
    {
        "reasoning": "adopt",
        "code": "print(adopt_candidate('proposal-1')); print(evaluate_program(split='val')['score'])",
    },
    {"reasoning": "gepa", "code": "r = run_gepa(budget=40); print(r['summary'])"},
    {"reasoning": "adopt", "code": "print(adopt_candidate(r['best'])); print(evaluate_program(split='val')['score'])"},
    {"reasoning": "submit", "code": SUBMIT_LINE},
]


def compile_with_lineage(directory: str | Path, **kwargs: Any) -> dspy.Module:
    """Play :data:`TURNS` into ``directory``; the returned program is ``gepa-1``, made from ``proposal-1``."""
    return compile_tickets(
        TURNS, sub_lm=proposer(REWORDED, POLICY_PROMPT), max_iterations=6, run_storage_dir=directory, **kwargs
    )
