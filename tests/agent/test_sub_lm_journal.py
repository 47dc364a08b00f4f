"""Every sub-LM prompt a compile pays for is told as it is charged (``SubLMAnswered``), so the journal has it on
disk before the turn ends, through the real sandbox."""

from __future__ import annotations

import json

import pytest
from support.optimizing import SUBMIT_CURRENT, compile_tickets, proposer

from rlmoptimizer.events import AgentTurn, SubLMAnswered

pytestmark = pytest.mark.slow


class LedgerOnDisk:
    """A callback that, at each SubLMAnswered, reads the sub-LM prompts the run directory's ledger holds."""

    def __init__(self, directory) -> None:
        self.directory = directory
        self.events: list = []
        self.on_disk: list[int] = []

    def on_event(self, event) -> None:
        self.events.append(event)
        if isinstance(event, SubLMAnswered):
            ledger = json.loads((self.directory / "ledger.json").read_text())
            self.on_disk.append(ledger["spent_by_kind"]["sub_lm_call"])


def test_every_charged_sub_lm_prompt_is_journaled_as_it_is_charged_proposals_included(tmp_path):
    """Regression: propose_instructions never sent SubLMAnswered, so a compile with llm_query, llm_query_batched, a
    GEPA reflection and a proposal charged 5 prompts while the events added up to 4, and a process killed after
    propose_instructions(n=3) answered had none of its 3 prompts in the ledger on disk."""
    directory = tmp_path / "run"
    watcher = LedgerOnDisk(directory)
    result = compile_tickets(
        [
            {
                "reasoning": "ask and propose",
                "code": "a = llm_query('Name one queue.')\nb = llm_query_batched(['One word.', 'Two words.'])\n"
                "p = propose_instructions('route', n=3)\nprint(len(p['texts']), p['budget_spent'])",
            },
            {"reasoning": "gepa", "code": "r = run_gepa(budget=14)\nprint(r['reflections'])"},
            SUBMIT_CURRENT,
        ],
        sub_lm=proposer(),
        max_iterations=5,
        callbacks=[watcher],
        run_storage_dir=directory,
    )
    assert result.agent_trajectory[0]["output"].split()[-1] == "3", result.agent_trajectory[0]["output"]
    assert int(result.agent_trajectory[1]["output"].split()[-1]) >= 1  # gepa reflected
    charged = result.budget["spent_by_kind"]["sub_lm_call"]
    told = [e for e in watcher.events if isinstance(e, SubLMAnswered)]
    assert sum(e.prompts for e in told) == charged
    # each was on disk as it was told (the proposals run in parallel: a later one may be there already), the
    # proposals' 3 before the turn that asked for them ended
    told_counts = [e.budget["spent_by_kind"]["sub_lm_call"] for e in told]
    assert all(disk >= count for disk, count in zip(watcher.on_disk, told_counts, strict=True))
    first_turn = next(i for i, e in enumerate(watcher.events) if isinstance(e, AgentTurn))
    before_turn = [e for e in watcher.events[:first_turn] if isinstance(e, SubLMAnswered)]
    assert sum(e.prompts for e in before_turn) == 1 + 2 + 3
    assert max(watcher.on_disk[: len(before_turn)]) == 6
