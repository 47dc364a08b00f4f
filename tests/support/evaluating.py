"""An ``evaluate`` for :class:`rlmoptimizer.moves.Moves` on a program used on its own (the moves' tests), as
``AgentTools`` gives the moves the working program's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import dspy

from rlmoptimizer.budget import Reservation
from rlmoptimizer.fingerprint import apply_instructions
from rlmoptimizer.records import EvalRun


def program_evaluator(
    program: dspy.Module, runs: Any, on_run: Callable[[EvalRun], None] | None = None
) -> Callable[..., EvalRun]:
    """An ``evaluate`` for :class:`Moves` that runs ``instructions`` on ``program`` through the run service
    ``runs``, one evaluation at a time: the instructions are applied for that evaluation only and the
    program's signatures restored afterwards (no copy: a program may hold things that cannot be copied), so
    its current prompts never change."""
    lock = threading.Lock()

    def evaluate(
        instructions: dict[str, str],
        split: str,
        ids: list[int],
        *,
        rollout: int = 0,
        label: str = "agent",
        reservation: Reservation | None = None,
    ) -> EvalRun:
        with lock:
            saved = {name: predictor.signature for name, predictor in program.named_predictors()}
            apply_instructions(program, instructions)
            try:
                run = runs.evaluate(program, split, label=label, ids=ids, rollout=rollout, reservation=reservation)
            finally:
                for name, predictor in program.named_predictors():
                    predictor.signature = saved[name]
        if on_run is not None:
            on_run(run)
        return run

    return evaluate
