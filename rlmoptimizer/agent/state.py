"""The state block that closes every agent request, and the agent arguments of a long run.

The state block holds what the agent must not lose when old turns are compacted out of its view: the runs so
far with their scores, the current instructions, the budget, the spending against ``max_cost_usd``, the
agent's notes, and last the default loop's next action (:meth:`~rlmoptimizer.agent.pilot.Pilot.describe`).

May import: ``rlmoptimizer.agent.bounded_context``, ``.pilot``, ``.services``, ``.stop`` and ``rlmoptimizer.usage``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rlmoptimizer.agent.bounded_context import BoundedContext, ContextBudget, clip
from rlmoptimizer.agent.pilot import Pilot
from rlmoptimizer.agent.services import CompileServices, TurnAids
from rlmoptimizer.agent.stop import RunEnd
from rlmoptimizer.usage import ROOT, dollars

__all__ = ["long_run_aids", "no_check_left", "render_state_block", "state_block_of"]


def render_state_block(
    *,
    runs: Iterable[Mapping[str, Any]] = (),
    instructions: Mapping[str, str] | None = None,
    budget: Mapping[str, Any] | None = None,
    notes: str = "",
    spending: str = "",
    loop: str = "",
    max_chars: int = 8_000,
) -> str:
    """The state the agent must not lose to compaction, at most ``max_chars`` characters: the runs so far with
    their scores (newest last), the current instructions, the budget, the spending and the agent's notes, then
    ``loop`` (the default loop's next action and the line that takes it), never clipped: it is the last thing
    the root LM reads."""
    sections: list[str] = []
    run_lines = [
        f"{r.get('run_id')} {r.get('split')} {r.get('label') or ''}: score {float(r.get('score') or 0):.4f} "
        f"({r.get('evaluated_count', '?')} examples)".replace("  ", " ")
        for r in runs
    ]
    if len(run_lines) > 20:
        run_lines = [f"({len(run_lines) - 20} earlier runs: optimization_status() has them all)"] + run_lines[-20:]
    if run_lines:
        sections.append("Runs so far:\n" + "\n".join(run_lines))
    if budget:
        line = f"Budget: {budget.get('spent')} of {budget.get('limit')} units spent, {budget.get('left')} left."
        if budget.get("sub_lm_limit") is not None:
            line += f" Sub-LM prompts (not metric calls): {budget.get('sub_lm_left')} of {budget['sub_lm_limit']} left."
        sections.append(line)
    if spending:
        sections.append(spending)
    notes_share = max_chars // 3
    if instructions:
        per = max(200, (max_chars - notes_share) // (2 * max(1, len(instructions))))
        sections.append(
            "Current instructions:\n" + "\n".join(f"- {name}: {clip(text, per)}" for name, text in instructions.items())
        )
    sections.append("Your notes (add_note(text) adds one):\n" + (notes or "(none yet)"))
    block = "=== Optimizer state (always current) ===\n" + "\n\n".join(sections)
    if not loop:
        return clip(block, max_chars)
    return clip(block, max(0, max_chars - len(loop) - 2)) + "\n\n" + loop


def long_run_aids(
    services: CompileServices,
    root_lm: Any,
    window: int | None,
    max_output_chars: int,
    pilot: Pilot | None = None,
    decided: Callable[[], str | None] | None = None,
) -> TurnAids:
    """What a long run adds to the agent's turns: its bounded context (which learns the root LM's characters per
    token from the usage meter), its state block (closed by the default loop's next action, from the ``pilot``) and the
    stop after the spending cap (or at once, once ``decided()`` says why no turn can change the result)."""
    usage = services.usage
    return TurnAids(
        root_lm=root_lm,
        context=BoundedContext(
            ContextBudget.for_lm(root_lm, window),
            max_output_chars=max_output_chars,
            input_tokens=(lambda: usage.snapshot()[ROOT]["input_tokens"]) if usage is not None else None,
        ),
        state_block=state_block_of(services, pilot),
        pilot=pilot,
        run_end=RunEnd(
            lambda: usage.cap_message() if usage is not None and usage.cap_reached else None,
            decided=decided,
            spent_all=lambda: usage.cap_reason if usage is not None and usage.spent_all else None,
        ),
    )


def state_block_of(services: CompileServices, pilot: Pilot | None = None) -> Callable[[], str]:
    """The state block of a compile(), read fresh on every turn: its runs, the working program's instructions,
    the budget, the spending against ``max_cost_usd`` (when set) and the agent's notes."""
    usage = services.usage

    def block() -> str:
        spending = ""
        if usage is not None and usage.max_cost_usd is not None:
            spending = (
                f"Spending: {dollars(usage.spent_usd)} of max_cost_usd {dollars(usage.max_cost_usd)}"
                + (f" -- {usage.cap_message()}" if usage.cap_reached else "")
                + "."
            )
        return render_state_block(
            runs=[r.summary() for r in services.runs.all()],
            instructions=services.working.instructions(),
            budget=services.ledger.snapshot(),
            notes=services.notes.render(max_chars=3_000),
            spending=spending,
            loop=pilot.describe() if pilot is not None else "",
        )

    return block


def no_check_left(services: CompileServices, split: str) -> Callable[[], str | None]:
    """With ``max_metric_calls``: why no turn can change the result any more (too few calls are left to score a
    new candidate on the whole selection ``split``, so compile() returns the best candidate scored there), or
    None while a turn can."""

    def decided() -> str | None:
        need, left = services.runs.cheapest_check(split), services.ledger.left
        if left >= need:
            return None
        return (
            f"max_metric_calls has {left} call(s) left, fewer than the {need} a check of a new candidate on "
            f"{'validation' if split == 'val' else split} needs"
        )

    return decided
