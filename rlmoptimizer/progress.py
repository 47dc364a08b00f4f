"""One live progress display per evaluation, in a terminal and in Jupyter.

* Jupyter: one output item per evaluation, updated in place (an IPython display handle; no widgets needed),
  ending as the run's one-line summary.
* Terminal: a live line (rich) redrawn as examples complete, replaced by the run's one-line summary.
* Anything else (a log file, CI output): no progress lines at all, only the summary line of each run.
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any

from rich.console import Console
from rich.text import Text

_BAR = 24
_MIN_INTERVAL_S = 0.1  # redraw at most this often (the last example is always drawn)


def _bar(done: int, total: int) -> str:
    filled = _BAR if total <= 0 else round(_BAR * done / total)
    return "█" * filled + "░" * (_BAR - filled)


def summary_line(summary: dict[str, Any]) -> str:
    return (
        f"{summary['run_id']} {summary['label']} on {summary['split']}: score {summary['score']:.3f} "
        f"({summary['passed_count']}/{summary['evaluated_count']} passed), budget left {summary['budget_left']}"
    )


class _Line:
    """What a Jupyter display handle shows: HTML for notebooks, text for other frontends."""

    def __init__(self, text: str, bold: bool = False) -> None:
        self.text, self.bold = text, bold

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        weight = "bold" if self.bold else "normal"
        return f'<pre style="margin:0;font-weight:{weight}">{html.escape(self.text)}</pre>'


class EvaluationProgress:
    """The live display of the evaluation in progress (one at a time). Thread safe: examples complete on the
    evaluator's threads."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._lock = threading.Lock()
        self._state: dict[str, Any] | None = None
        self._live: Any = None
        self._handle: Any = None
        self._drawn_at = 0.0

    @property
    def mode(self) -> str:
        if self.console.is_jupyter:
            return "jupyter"
        if self.console.is_terminal and not self.console.is_dumb_terminal:
            return "terminal"
        return "plain"

    def _line(self) -> str:
        state = self._state or {}
        return (
            f"evaluating {state['label']} on {state['split']}: {_bar(state['done'], state['total'])} "
            f"{state['done']}/{state['total']} ({state['passed']} passed)"
        )

    def started(self, split: str, label: str, total: int) -> None:
        with self._lock:
            self._close(None)
            self._state = {"split": split, "label": label, "total": total, "done": 0, "passed": 0}
            mode = self.mode
            if mode == "jupyter":
                try:
                    from IPython.display import display

                    self._handle = display(_Line(self._line()), display_id=True)
                except ImportError:
                    self._handle = None
            elif mode == "terminal":
                from rich.live import Live

                self._live = Live(Text(self._line(), style="dim"), console=self.console, transient=True,
                                  auto_refresh=False, redirect_stdout=False, redirect_stderr=False)
                self._live.start(refresh=True)
            self._drawn_at = time.monotonic()

    def example_done(self, passed: bool) -> None:
        with self._lock:
            state = self._state
            if state is None:
                return
            state["done"] += 1
            state["passed"] += int(passed)
            now = time.monotonic()
            if state["done"] < state["total"] and now - self._drawn_at < _MIN_INTERVAL_S:
                return
            self._drawn_at = now
            if self._handle is not None:
                self._handle.update(_Line(self._line()))
            elif self._live is not None:
                self._live.update(Text(self._line(), style="dim"), refresh=True)

    def finished(self, summary: dict[str, Any]) -> None:
        """Replace the live display with the run's summary line (printed in every mode)."""
        with self._lock:
            self._close(summary)

    def _close(self, summary: dict[str, Any] | None) -> None:
        line = summary_line(summary) if summary is not None else None
        if self._handle is not None:
            if line is not None:
                self._handle.update(_Line(line, bold=True))
            self._handle = None
            line = None  # shown in place of the progress
        if self._live is not None:
            self._live.stop()
            self._live = None
        if line is not None:
            self.console.print(Text(line))
        self._state = None
