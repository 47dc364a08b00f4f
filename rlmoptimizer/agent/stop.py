"""A request to stop the agent after its current turn, checked by the agent loop.

A tool that meets a systemic failure (the evaluation LM is unusable, the metric is broken) records it
here; the agent sees the tool's error in its REPL as usual, and the loop stops after that turn and raises
the recorded failure, so the work paid for so far is kept and the user gets the real error.
"""

from __future__ import annotations

import threading


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
