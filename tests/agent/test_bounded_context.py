"""The bounded root-LM context: the view of the REPL history fits the limit at any length, grows by appends
between rare block compactions, and keeps real step numbers; context refusals are recognised."""

from __future__ import annotations

import dspy
import litellm
import pytest
from dspy.adapters.chat_adapter import ChatAdapter
from dspy.primitives.repl_types import REPLHistory
from dspy.utils.exceptions import LMInvalidRequestError

from rlmoptimizer.agent.bounded_context import (
    DEFAULT_CONTEXT_WINDOW,
    BoundedContext,
    ContextBudget,
    context_window_of,
    is_context_refusal,
)
from rlmoptimizer.agent.state import render_state_block
from rlmoptimizer.testing import FunctionLM


def _history(turns: int, output_chars: int = 9_500) -> REPLHistory:
    history = REPLHistory(max_output_chars=10_000)
    for t in range(turns):
        history = history.append(
            reasoning=f"Turn {t + 1}: looking at failures of kind {t % 7}. " * 3,
            code=f"rows = run_data('run-{t:04d}')['examples']\nprint(rows[:3])  # {t}",
            output=(f"example {t} line " * (output_chars // 16 + 1))[:output_chars],
        )
    return history


def test_every_view_fits_the_limit_and_most_turns_are_pure_appends():
    context = BoundedContext(ContextBudget(window_tokens=32_000), max_output_chars=10_000)
    full = _history(200)
    limit = context.limit(fixed_chars=6_000)
    previous = ""
    appends = sizes = 0
    for n in range(1, 201):
        text = context.view(REPLHistory(entries=full.entries[:n], max_output_chars=10_000), fixed_chars=6_000).format()
        assert len(text) <= limit, n
        if previous and text.startswith(previous):
            appends += 1
        sizes = max(sizes, len(text))
        previous = text
    # without compaction 200 turns would be ~2M chars; the view never passes the limit
    assert len(full.format()) > 10 * limit
    # compaction is rare and in blocks: most turns send the previous turn's history unchanged as their prefix
    assert context.compactions <= 200 // 3
    assert appends >= 199 - context.compactions
    assert appends >= 120


def test_the_view_is_the_history_itself_while_it_fits():
    context = BoundedContext(ContextBudget(window_tokens=128_000), max_output_chars=10_000)
    history = _history(5, output_chars=500)
    view = context.view(history, fixed_chars=5_000)
    assert view.format() == history.format()
    assert context.compactions == 0


def test_compacted_view_keeps_real_step_numbers_recent_turns_verbatim_and_old_ones_as_lines():
    context = BoundedContext(ContextBudget(window_tokens=16_000), max_output_chars=10_000, keep_recent=2)
    history = _history(40)
    text = context.view(history, fixed_chars=3_000).format()
    entries = history.entries
    # the last two steps are verbatim, with their real numbers
    assert entries[-1].format(index=39, max_output_chars=10_000) in text
    assert entries[-2].format(index=38, max_output_chars=10_000) in text
    assert "=== Step 40 ===" in text and "=== Step 1 ===" not in text
    assert "Earlier steps (compacted" in text
    assert context.plan["folded"] > 0


def test_a_refusal_compacts_harder():
    context = BoundedContext(ContextBudget(window_tokens=32_000), max_output_chars=10_000)
    history = _history(30)
    before = len(context.view(history, fixed_chars=5_000).format())
    context.refused()
    after = len(context.view(history, fixed_chars=5_000).format())
    assert after <= context.limit(5_000) < before


def test_the_limit_follows_the_tokenizer_the_root_lm_reports():
    """A model whose tokens hold 4 characters gets the room its window really has; one whose tokens hold 2 (code,
    CJK) gets less than the default estimate of 3, before it overflows."""
    for chars_per_token, grows in ((4.0, True), (2.0, False)):
        reported = [0]
        context = BoundedContext(
            ContextBudget(window_tokens=8_192, output_tokens=1_024),
            max_output_chars=10_000,
            input_tokens=lambda reported=reported: reported[0],
        )
        before = context.limit(16_000)
        history = _history(0)
        for _ in range(5):
            history = history.append(reasoning="r", code="print(1)", output="x" * 600)
            view = context.view(history, fixed_chars=16_000)
            reported[0] += int((len(view.format()) + 16_000) / chars_per_token)  # what the LM bills for it
        assert context.budget.chars_per_token == pytest.approx(0.95 * chars_per_token, rel=0.02)
        assert (context.limit(16_000) > before) is grows
        context.view(history, fixed_chars=16_000)
        assert (context.compactions == 0) is grows  # 5 short turns fit a 4-char tokenizer's window, not a 2-char one's


def test_a_resumed_long_history_starts_within_the_limit():
    context = BoundedContext(ContextBudget(window_tokens=8_000), max_output_chars=10_000)
    view = context.view(_history(150), fixed_chars=4_000)
    assert len(view.format()) <= context.limit(4_000)
    assert "=== Step 150 ===" in view.format()


def test_the_view_renders_through_dspys_adapter_as_the_repl_history_field():
    context = BoundedContext(ContextBudget(window_tokens=16_000), max_output_chars=10_000)
    view = context.view(_history(40), fixed_chars=3_000)
    signature = dspy.Signature({"repl_history": (REPLHistory, dspy.InputField()), "code": (str, dspy.OutputField())})
    messages = ChatAdapter().format(signature, demos=[], inputs={"repl_history": view})
    assert view.format() in messages[-1]["content"]


def test_context_window_comes_from_the_argument_then_litellm_then_the_default():
    known = FunctionLM(lambda m: "", name="openai/gpt-4o-mini")
    assert context_window_of(known, 50_000) == (50_000, "root_context_window")
    window, source = context_window_of(known)
    assert window == litellm.get_model_info("openai/gpt-4o-mini")["max_input_tokens"] and source.startswith("litellm")
    assert context_window_of(FunctionLM(lambda m: "", name="local/qwen-test")) == (DEFAULT_CONTEXT_WINDOW, "default")
    budget = ContextBudget.for_lm(dspy.LM("openai/gpt-4o-mini", max_tokens=2_000))
    assert budget.output_tokens == 2_000 and budget.request_chars < budget.window_tokens * 3


def test_context_refusals_are_recognised_and_other_errors_are_not():
    litellm_error = litellm.ContextWindowExceededError(message="too long", model="m", llm_provider="openai")
    assert is_context_refusal(litellm_error)
    wrapped = RuntimeError("engine failed")
    wrapped.__cause__ = litellm_error
    assert is_context_refusal(wrapped)
    assert is_context_refusal(dspy.ContextWindowExceededError(model="m"))
    words = LMInvalidRequestError("This model's maximum context length is 32768 tokens. However, you requested 40000")
    assert is_context_refusal(words)
    assert not is_context_refusal(LMInvalidRequestError("unsupported parameter: temperature"))
    assert not is_context_refusal(ValueError("bad value"))


def test_a_scripted_root_lm_over_its_window_gets_a_refusal_through_dspy():
    lm = FunctionLM(
        lambda messages: litellm.ContextWindowExceededError(message="too long", model="m", llm_provider="openai")
    )
    with pytest.raises(Exception) as raised, dspy.context(lm=lm):
        dspy.Predict("q -> a")(q="x")
    assert is_context_refusal(raised.value)


def test_state_block_holds_runs_instructions_budget_and_notes_within_its_size():
    runs = [
        {"run_id": f"run-{i:04d}", "split": "train", "label": "agent", "score": i / 100, "evaluated_count": 10}
        for i in range(1, 40)
    ]
    block = render_state_block(
        runs=runs,
        instructions={"qa": "Answer briefly. " * 400},
        budget={"spent": 30, "limit": 100, "left": 70},
        notes="[1] shorter is better",
        max_chars=4_000,
    )
    assert len(block) <= 4_100
    assert "run-0039" in block and "run-0001 " not in block and "19 earlier runs" in block
    assert "30 of 100 units spent, 70 left" in block
    assert "[1] shorter is better" in block
    assert "- qa: Answer briefly." in block


def test_the_state_block_shows_a_tiny_spending_cap_with_its_digits():
    """Regression: a cap of $0.000001 was shown to the agent as ``max_cost_usd $0.0000``."""
    from types import SimpleNamespace

    from rlmoptimizer.agent.state import state_block_of
    from rlmoptimizer.usage import UsageMeter

    services = SimpleNamespace(
        usage=UsageMeter(max_cost_usd=0.000001),
        runs=SimpleNamespace(all=list),
        working=SimpleNamespace(instructions=lambda: {"qa": "Answer."}),
        ledger=SimpleNamespace(snapshot=lambda: {"spent": 0, "limit": 10, "left": 10}),
        notes=SimpleNamespace(render=lambda max_chars: ""),
    )
    assert "Spending: $0.0000 of max_cost_usd $0.000001." in state_block_of(services)()


def test_a_multiturn_rendering_of_the_view_keeps_the_header_and_the_real_step_numbers():
    from rlmoptimizer.agent.root_lm import TurnRenderer

    context = BoundedContext(ContextBudget(window_tokens=16_000), max_output_chars=10_000)
    view = context.view(_history(40), fixed_chars=3_000)
    signature = dspy.Signature(
        {
            "variables_info": (str, dspy.InputField()),
            "repl_history": (REPLHistory, dspy.InputField()),
            "iteration": (str, dspy.InputField()),
            "code": (str, dspy.OutputField()),
        }
    )
    renderer = TurnRenderer(multiturn=True, max_iters=100)
    messages = renderer.messages(
        ChatAdapter(), renderer.signature(signature), variables_info="vars", history=view, iteration="41/100"
    )
    users = [m["content"] for m in messages if m["role"] == "user"]
    assert "Earlier steps (compacted" in users[0]
    assert f"=== Step {view.first_step} ===" in users[1] and "=== Step 40 ===" in users[-1]
    assert "41/100" in users[-1] and f"{view.first_step + 1}/100" in users[1]
