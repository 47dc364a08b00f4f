"""Refusals of the agent's tools, through the real sandbox: one format that says what went wrong and the next step,
clipped where it echoes a long value; nothing spent by a call that is refused."""

from __future__ import annotations

import pytest
from support.optimizing import SUBMIT_CURRENT, compile_tickets, outputs, proposer
from support.tickets import POLICY_PROMPT

pytestmark = pytest.mark.slow

TRY = (
    "def attempt(label, call):\n"
    "    try:\n"
    "        call()\n"
    "        print(label, 'ACCEPTED')\n"
    "    except Exception as e:\n"
    "        print(label, 'REFUSED', type(e).__name__, str(e).replace(chr(10), ' '))\n"
)


def refusals(output: str) -> dict[str, str]:
    """``{label: what the attempt printed after the label}``."""
    return dict(line.split(" ", 1) for line in output.splitlines() if " REFUSED " in line or " ACCEPTED" in line)


def test_a_bool_nan_or_huge_argument_is_refused_clearly_and_spends_nothing():
    """Regression: the bridge's lenient coercion turned True into 1 before the moves' checks (which refuse bools), so
    compare(..., rollouts=True) and propose_instructions(step, n=True) were accepted and spent 4 train units and a
    sub-LM prompt; float('nan') / float('inf') in any argument gave a raw "Tool bridge error ... is not valid JSON";
    refusals echoed a 200,000-character argument whole; an int beyond 2**53 - 1 reached the host rounded, or as None
    ("argument 'seed' takes int, got NoneType None")."""
    result = compile_tickets(
        [
            {
                "reasoning": "hostile arguments",
                "code": TRY + "attempt('rollouts', lambda: compare(['current'], ids=[0, 1, 2, 3], rollouts=True))\n"
                "attempt('n', lambda: propose_instructions('route', n=True))\n"
                "attempt('nan', lambda: evaluate_program(limit=float('nan')))\n"
                "attempt('inf', lambda: compare(['current', {'route': 'x'}], ids=[0, float('inf')]))\n"
                "attempt('huge', lambda: update_prompt('x' * 200_000, 'text'))\n"
                "attempt('huge_candidate', lambda: compare(['current', 'y' * 200_000]))\n"
                "attempt('half', lambda: update_prompt('route', 'Route it \\ud83d'))\n"
                "attempt('items', lambda: llm_query_batched([1, 2]))\n"
                "attempt('bigint', lambda: evaluate_program(seed=10**400))\n"
                "attempt('bigint_limit', lambda: evaluate_program(limit=10**30))\n"
                "attempt('bigint_deep', lambda: evaluate_program(ids=eval('[' * 150 + str(2**60) + ']' * 150)))\n"
                "attempt('bigint_digits', lambda: evaluate_program(seed=10**5000))\n"
                "attempt('bigint_id', lambda: compare(['current', {'route': 'x'}], ids=[0, 2**53]))\n"
                "print('spent', optimization_status()['budget_spent'])",
            },
            SUBMIT_CURRENT,
        ],
        sub_lm=proposer(),
    )
    printed = outputs(result)[0]
    seen = refusals(printed)
    assert set(seen) == {
        "rollouts",
        "n",
        "nan",
        "inf",
        "huge",
        "huge_candidate",
        "half",
        "items",
        "bigint",
        "bigint_limit",
        "bigint_deep",
        "bigint_digits",
        "bigint_id",
    }
    assert "argument 'seed' is or holds a 1,329-bit integer" in seen["bigint"] and "2**53 - 1" in seen["bigint"]
    assert "argument 'limit' is or holds the integer 1000000000000000000000000000000," in seen["bigint_limit"]
    assert "argument 'ids' is or holds the integer 9007199254740992" in seen["bigint_id"]
    assert "argument 'ids' is or holds the integer 1152921504606846976" in seen["bigint_deep"]  # at any depth
    assert "argument 'seed' is or holds an integer of thousands of digits" in seen["bigint_digits"]
    assert "argument 'prompts' takes list[str], got list [1, 2]" in seen["items"]  # (not "takes list, got list")
    assert all(line.startswith("REFUSED AgentToolError") for line in seen.values()), printed
    assert "argument 'rollouts' takes int, got bool True" in seen["rollouts"]
    assert "argument 'n' takes int, got bool True" in seen["n"]
    for label in ("nan", "inf"):
        assert "float nan or inf" in seen[label] and "-> pass a finite number" in seen[label]
        assert "not valid JSON" not in seen[label]
    for label in ("huge", "huge_candidate"):
        assert len(seen[label]) < 1_500 and " -> " in seen[label], seen[label][:2_000]
    assert "characters cut" in seen["huge"]
    assert "argument 'text' holds half a character" in seen["half"] and "\\ud83d" in seen["half"]
    assert "spent 0" in printed
    assert result.budget["spent"] == 0 and result.budget["spent_by_kind"]["sub_lm_call"] == 0


def test_every_move_refused_for_a_spent_budget_says_the_budget_is_spent_and_to_submit():
    """Regression: with the budget spent, run_gepa() said "budget must be an int >= 1, got int 0" (the agent passed
    none), run_gepa(budget=1) said "pass budget=0 or less" and budget=0 was refused by the first rule; none said the
    budget was spent or to SUBMIT."""
    result = compile_tickets(
        [
            {
                "reasoning": "spend it all",
                "code": f"update_prompt('route', {POLICY_PROMPT!r})\n"
                "evaluate_program()\nevaluate_program(split='val')\n"
                "print('left', optimization_status()['budget_left'])",
            },
            {
                "reasoning": "ask for more",
                "code": TRY + "attempt('gepa_default', lambda: run_gepa())\n"
                "attempt('gepa_1', lambda: run_gepa(budget=1))\n"
                "attempt('gepa_0', lambda: run_gepa(budget=0))\n"
                "attempt('compare', lambda: compare(['current', {'route': 'Route it.'}], ids=[0, 1]))\n"
                "attempt('propose', lambda: propose_instructions('route'))\n",
            },
            SUBMIT_CURRENT,
        ],
        max_iterations=1,
        sub_lm=proposer(),
    )
    assert "left 0" in outputs(result)[0], outputs(result)[0]
    seen = refusals(outputs(result)[1])
    assert set(seen) == {"gepa_default", "gepa_1", "gepa_0", "compare", "propose"}, outputs(result)[1]
    for label, said in seen.items():
        assert said.startswith("REFUSED AgentToolError"), (label, said)
        assert "no budget unit is left" in said, (label, said)
        assert "-> the budget is spent: SUBMIT(" in said, (label, said)
        assert "pass budget=" not in said and "must be an int" not in said, (label, said)
