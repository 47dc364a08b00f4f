"""A request to stop the agent after its current turn, checked by the agent loop.

A tool that meets a systemic failure (the evaluation LM is unusable, the metric is broken) records it
here; the agent sees the tool's error in its REPL as usual, and the loop stops after that turn and raises
the recorded failure, so the work paid for so far is kept and the user gets the real error.

:class:`RunEnd` ends the run a few turns after spending stopped (the spending cap), if the agent has not
submitted by then: its turns cost too, and it was told it can only submit; at once when what was spent is the
whole ``max_cost_usd`` (the agent's turns are LM calls too). It ends the run at once when the result is decided (``max_metric_calls`` has too few calls left to check any new candidate on the selection split,
so compile() will return the best candidate checked so far whatever the agent does).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from dspy import Prediction

from rlmoptimizer.errors import OptimizationInterrupted
from rlmoptimizer.evaluation.lm_failures import (
    SYSTEMIC,
    TRANSIENT,
    classify_lm_failure,
    failure_summary,
    is_outage,
)

logger = logging.getLogger(__name__)


class StopRequest:
    """Set once, from any thread; the first reason wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self.reason: BaseException | None = None
        self._silent_moves = 0  # moves in a row whose sub LM gave no answer (sub_lm_move_ended)

    def request(self, reason: BaseException) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
                self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def count_silent_move(self, silent: bool, answered: bool) -> int:
        """The moves in a row whose sub LM gave no answer, after one more that ended: ``silent`` (it got none at its
        end) or not (the count starts again); ``answered``: the sub LM answered earlier in it (it starts at 1)."""
        with self._lock:
            self._silent_moves = 0 if not silent else 1 if answered else self._silent_moves + 1
            return self._silent_moves

    def raise_if_requested(self) -> None:
        """Raise the recorded failure, if a stop was requested."""
        if self.reason is not None:
            raise self.reason


def stop_if_the_sub_lm_is_unusable(stop: StopRequest, exc: BaseException) -> None:
    """Request the compile's stop when ``exc`` says the sub LM failed with an error retrying cannot fix (a bad key,
    no billing, an unknown model, an unreachable host): every later prompt would fail the same way, and the run
    would end with the unchanged program as if nothing could be improved."""
    failure = classify_lm_failure(exc)
    if failure is not None and failure[0] == SYSTEMIC:  # (an unusable evaluation LM has asked to stop first)
        stop.request(
            OptimizationInterrupted(
                f"the sub LM is unusable: {failure_summary(failure[1])}. Check its model name, API key, billing and "
                "network access (sub_lm=..., or root_lm when sub_lm is not given)"
            )
        )


SILENT_SUB_LM_MOVES = 2
"""Moves in a row (a GEPA run, a proposal, an analysis) that failed because the sub LM gave no answer even after its
retries (a 5xx, a timeout, a rate limit), with no answer of the sub LM between them (to a move, or to the agent's own
``llm_query``), that stop the compile: the sub LM is down."""


def sub_lm_move_ended(stop: StopRequest, exc: BaseException | None, answered: bool) -> None:
    """A move that asks the sub LM ended: it returned (``exc`` None) or raised ``exc``; ``answered``: the sub LM
    answered a prompt of it. A sub LM that cannot be used stops the compile at once; one that gave no answer in
    :data:`SILENT_SUB_LM_MOVES` moves in a row stops it too (resumable, as an unusable one), instead of the run
    ending early with the unchanged program as if nothing could be improved, and finished, so never resumed. No
    answer: an outage (a rate limit, a timeout, a server error after retries; dspy's or litellm's own), or a custom
    LM's own code raising instead of answering (a bug in it, or its client's own outage). A reply that does not
    parse is an answer (charged): the moves go on without it."""
    if exc is not None:
        stop_if_the_sub_lm_is_unusable(stop, exc)
    failure = classify_lm_failure(exc) if exc is not None else None
    silent = stop.count_silent_move(failure is not None and failure[0] == TRANSIENT, answered)
    if silent >= SILENT_SUB_LM_MOVES:
        outage = failure is not None and is_outage(exc)
        why = (
            "it may be down, overloaded or rate-limiting"
            if outage
            else "its own code raised (an LM class of your own, or its client: see the error)"
        )
        stop.request(
            OptimizationInterrupted(
                f"the sub LM gave no answer in {silent} moves in a row, even after its retries (last: "
                f"{failure_summary(exc)}): {why}. Everything paid for is kept: once it answers again, compile again "
                "with the same run_storage_dir to resume (sub_lm=..., or root_lm when sub_lm is not given; a timeout= "
                "on the LM bounds a request that hangs)"
            )
        )


class RunEnd:
    """``reason()`` says why spending stopped (None while it goes on); after ``turns_after`` turns taken since,
    :meth:`ends_run` is True and :meth:`outcome` ends the run with the current instructions, without an LM call.
    ``decided()`` says why no turn can change the result any more (None while one can): it ends the run at once.
    ``spent_all()`` says why nothing may be spent any more, not even on a turn (None while something may): it ends
    the run at once."""

    def __init__(
        self,
        reason: Callable[[], str | None],
        turns_after: int = 3,
        decided: Callable[[], str | None] | None = None,
        spent_all: Callable[[], str | None] | None = None,
    ) -> None:
        self.reason = reason
        self.turns_after = turns_after
        self.decided = decided or (lambda: None)
        self.spent_all = spent_all or (lambda: None)
        self._turns = 0
        self._why: str | None = None

    def ends_run(self) -> bool:
        """Called before each turn."""
        decided = self.decided()
        if decided is not None:
            self._why = f"{decided}; the agent was stopped, since no turn could change the result"
            return True
        spent_all = self.spent_all()
        if spent_all is not None:
            self._why = f"{spent_all}; the agent was stopped at once, since its turns are LM calls too"
            return True
        reason = self.reason()
        if reason is None:
            return False
        self._turns += 1
        self._why = f"{reason}; the agent did not SUBMIT within {self.turns_after} turns"
        return self._turns > self.turns_after

    def outcome(self, history: Any, output_field_names: list[str]) -> Prediction:
        why = self._why or str(self.reason())
        logger.warning("%s, so the current instructions are submitted.", why)
        return current_instructions_submitted(history, output_field_names, why)


def current_instructions_submitted(history: Any, output_field_names: list[str], why: str) -> Prediction:
    """The agent's outcome when its run ends without a SUBMIT (``why``): empty outputs, so what is submitted is
    the current instructions (the agent's ``update_prompt`` edits and adopted candidates)."""
    return Prediction(
        trajectory=[entry.model_dump() for entry in history],
        final_reasoning=f"{why}; the current instructions were submitted.",
        submitted_by="the agent's current instructions (its run ended without a SUBMIT)",
        **{name: {} for name in output_field_names},
    )
