"""What the bounded context saves: the root LM's input per agent turn and in total, before and after.

Renders the requests the optimizer agent sends the root LM on every turn of one scripted long run (each turn
prints close to ``rlm_max_output_chars``), through dspy's ChatAdapter with the agent's real action signature:

- before: dspy.RLM's rendering, the whole REPL history on every turn (what the agent sent without a bounded
  context);
- after: the bounded context (``rlmoptimizer.context``): the view of the history that fits the root LM's window,
  and the state block at the end of the request.

For 10, 50 and 200 turns it prints the input of the last turn and the total, in characters and in estimated tokens
(characters / 4), side by side, and the share of each request that is a prefix of the previous request (what a
provider's or a local server's prompt cache can reuse), averaged over the turns. No LM, no sandbox, no network.

    python benchmarks/bench_context.py [--window 128000] [--output-chars 10000]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspy  # noqa: E402
from dspy.adapters.chat_adapter import ChatAdapter  # noqa: E402
from dspy.primitives.repl_types import REPLHistory  # noqa: E402

from rlmoptimizer.agent.agent import OptimizerAgent  # noqa: E402
from rlmoptimizer.agent.bounded_context import BoundedContext, ContextBudget  # noqa: E402
from rlmoptimizer.agent.prompts import render_instructions, render_task_brief  # noqa: E402
from rlmoptimizer.agent.services import TurnAids, TurnSettings  # noqa: E402
from rlmoptimizer.agent.state import render_state_block  # noqa: E402

CHECKPOINTS = (10, 50, 200)


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search on slices: C-speed on megabyte strings)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def turn(i: int, output_chars: int) -> dict[str, str]:
    line = f"example {i:03d}: expected 'disputes', predicted 'billing'; the summary drops the word chargeback.\n"
    return {
        "reasoning": f"Step {i + 1}: group the failures of run-{i:04d} by cause and look at the longest ones.",
        "code": f"rows = run_data('run-{i:04d}')['examples']\nfor r in rows:\n    print(r['example_id'], r['predicted'])",
        "output": (line * (output_chars // len(line) + 1))[: output_chars - 40],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=128_000, help="the root LM's input window in tokens")
    parser.add_argument("--output-chars", type=int, default=10_000, help="rlm_max_output_chars (printed per turn)")
    args = parser.parse_args()

    turns = max(CHECKPOINTS)
    signature = dspy.Signature(
        "task_brief: str -> optimized_dspy_program: dict[str, str]",
        render_instructions(120, "enough to evaluate the 20 train examples 5 time(s)"),
    )
    context = BoundedContext(
        ContextBudget(window_tokens=args.window, output_tokens=min(4_000, args.window // 4)),
        max_output_chars=args.output_chars,
    )
    state = render_state_block(
        runs=[{"run_id": "run-0001", "split": "train", "label": "baseline", "score": 0.6, "evaluated_count": 20}],
        instructions={"summarize": "Summarize the ticket.", "route": "Pick the queue."},
        budget={"spent": 40, "limit": 120, "left": 80},
        notes="[1] chargebacks are the main failure",
    )
    agent = OptimizerAgent(
        signature,
        TurnSettings(max_iters=turns, max_output_chars=args.output_chars),
        aids=TurnAids(context=context, state_block=lambda: state),
    )
    action_signature = agent.generate_action.signature
    adapter = ChatAdapter()
    brief = render_task_brief({"summarize": "ticket -> summary", "route": "summary -> queue"}, 20, 10, 80)
    variables_info = [v.format() for v in agent._build_variables(task_brief=brief)]

    def request(history: REPLHistory, step: str) -> str:
        inputs = {"variables_info": variables_info, "repl_history": history, "iteration": step}
        return "\n".join(m["content"] for m in adapter.format(action_signature, demos=[], inputs=inputs))

    history = REPLHistory(max_output_chars=args.output_chars)
    rows = {"before": [], "after": []}  # (chars, prefix share) per turn
    previous = {"before": "", "after": ""}
    for i in range(turns):
        shown, step = agent._turn_inputs(action_signature, variables_info, history, i)
        texts = {"before": request(history, f"{i + 1}/{turns}"), "after": request(shown, step)}
        for arm, text in texts.items():
            share = common_prefix(previous[arm], text) / len(text) if previous[arm] else 0.0
            rows[arm].append((len(text), share))
            previous[arm] = text
        history = history.append(**turn(i, args.output_chars))

    window_chars = args.window * 4
    print(
        f"Root LM input per agent turn, each turn printing ~{args.output_chars:,} chars; window {args.window:,} "
        f"tokens (~{window_chars:,} chars at 4 chars/token); tokens estimated as chars / 4."
    )
    print(
        f"{'turns':>5} | {'last turn before':>18} {'after':>10} | {'total before':>16} {'after':>12} | "
        f"{'prefix reused before':>20} {'after':>6} | {'over window before':>18} {'after':>5}"
    )
    for n in CHECKPOINTS:
        cells = []
        for arm in ("before", "after"):
            sizes = [c for c, _ in rows[arm][:n]]
            shares = [s for _, s in rows[arm][1:n]]
            cells.append(
                (sizes[-1] // 4, sum(sizes) // 4, sum(shares) / len(shares), sum(1 for c in sizes if c > window_chars))
            )
        (lb, tb, pb, ob), (la, ta, pa, oa) = cells
        print(f"{n:>5} | {lb:>18,} {la:>10,} | {tb:>16,} {ta:>12,} | {pb:>19.0%} {pa:>6.0%} | {ob:>18} {oa:>5}")
    print(f"After: {context.compactions} compactions in {turns} turns; the rest of the turns were pure appends.")


if __name__ == "__main__":
    main()
