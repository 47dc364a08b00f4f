"""A request to stop the agent after its current turn, checked by the agent loop.

A tool that meets a systemic failure (the evaluation LM is unusable, the metric is broken) records it
here; the agent sees the tool's error in its REPL as usual, and the loop stops after that turn and raises
the recorded failure, so the work paid for so far is kept and the user gets the real error.

:class:`SpendingStop` ends the run a few turns after spending stopped (the spending cap), if the agent has not
submitted by then: its turns cost too, and it was told it can only submit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from dspy import Prediction

logger = logging.getLogger(__name__)


class StopRequest:
    """Set once, from any thread; the first reason wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self.reason: BaseException | None = None

    def request(self, reason: BaseException) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
                self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def raise_if_requested(self) -> None:
        """Raise the recorded failure, if a stop was requested."""
        if self.reason is not None:
            raise self.reason


class SpendingStop:
    """``reason()`` says why spending stopped (None while it goes on); after ``turns_after`` turns taken since,
    :meth:`ends_run` is True and :meth:`outcome` ends the run with the current instructions, without an LM call."""

    def __init__(self, reason: Callable[[], str | None], turns_after: int = 3) -> None:
        self.reason = reason
        self.turns_after = turns_after
        self._turns = 0

    def ends_run(self) -> bool:
        """Called before each turn."""
        if self.reason() is None:
            return False
        self._turns += 1
        return self._turns > self.turns_after

    def outcome(self, history: Any, output_field_names: list[str]) -> Prediction:
        reason = self.reason()
        logger.warning(
            "%s; the agent did not SUBMIT within %d turns, so the current instructions are submitted.",
            reason,
            self.turns_after,
        )
        return Prediction(
            trajectory=[entry.model_dump() for entry in history],
            final_reasoning=f"{reason}; the current instructions were submitted.",
            **{name: {} for name in output_field_names},
        )
