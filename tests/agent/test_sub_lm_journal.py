"""Every sub-LM prompt a compile pays for is told as it is charged (``SubLMAnswered``), so the journal has it on
disk before the turn ends, through the real sandbox."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.optimizing import SUBMIT_CURRENT, compile_tickets, proposer

from rlmoptimizer.events import AgentTurn, SubLMAnswered

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent.parent


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


KILLED_AFTER_PROPOSALS = textwrap.dedent("""
    import itertools, json, os, signal, sys
    sys.path[:0] = [{tests!r}]
    os.environ["DSPY_CACHEDIR"] = {cache!r}
    from support.fakes import FunctionLM, last_user_text
    from support.optimizing import compile_tickets
    from support.tickets import POLICY_PROMPT

    log = open(os.environ["PROPOSAL_TEST_LOG"], "a")
    answered = itertools.count(1)  # a distinct text per proposal (next() is atomic across the proposal threads)

    def sub_lm(messages):
        asked = last_user_text(messages)
        if "STOP HERE" in asked:
            if os.environ.get("PROPOSAL_TEST_KILL"):
                os.kill(os.getpid(), signal.SIGKILL)  # in the same turn, after the proposals answered
            log.write("query\\n"); log.flush()
            return "stopped"
        log.write("proposal\\n"); log.flush()
        return json.dumps({{"new_instruction": POLICY_PROMPT + " (" + str(next(answered)) + ")"}})

    turns = [
        {{"reasoning": "propose, then ask", "code": "p = propose_instructions('route', n=3)\\n"
          "print(len(p['texts']), p['budget_spent'])\\nprint(llm_query('STOP HERE'))"}},
        {{"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"}},
    ]
    result = compile_tickets(turns, sub_lm=FunctionLM(sub_lm), run_storage_dir={runs!r})
    print(json.dumps({{"sub": result.budget["spent_by_kind"]["sub_lm_call"], "out": result.agent_trajectory[0]["output"]}}))
""")


def test_proposals_answered_before_a_kill_are_on_disk_and_not_paid_again_on_resume(tmp_path):
    """Regression: a process killed right after propose_instructions(n=3) answered (in the same turn) had 0 sub-LM
    prompts in its ledger, and the resume asked the same 3 prompts again."""
    runs, cache = tmp_path / "run", tmp_path / "cache"
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSPY_")}
    script = KILLED_AFTER_PROPOSALS.format(tests=str(TESTS), cache=str(cache), runs=str(runs))

    def start(log, kill: bool) -> subprocess.CompletedProcess:
        extra = {"PROPOSAL_TEST_LOG": str(log), **({"PROPOSAL_TEST_KILL": "1"} if kill else {})}
        return subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env={**env, **extra}
        )

    first = start(logs[0], kill=True)
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    assert logs[0].read_text().split() == ["proposal"] * 3
    assert json.loads((runs / "ledger.json").read_text())["spent_by_kind"]["sub_lm_call"] == 3  # on disk
    second = start(logs[1], kill=False)
    assert second.returncode == 0, second.stderr[-3000:]
    done = json.loads(second.stdout.strip().splitlines()[-1])
    assert logs[1].read_text().split() == ["query"]  # the 3 proposals were replayed, not asked again
    assert done["out"].split()[:2] == ["3", "0"]  # the resumed turn got its 3 texts, for nothing
    assert done["sub"] == 3 + 1
