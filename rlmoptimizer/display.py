"""What ``verbose=True`` shows: each agent turn as rich panels, each evaluation as one live progress display.

The progress of an evaluation is one display, updated in place: in Jupyter one output item (an IPython display
handle; no widgets needed), in a terminal one line redrawn by rich; each ends as the run's one-line summary.
Where nothing can be redrawn (a log file, CI output) only the summary line of each run is printed.

``Display(enabled=False)`` prints nothing at all. The console is injectable (tests pass one that
records into a string). A :class:`Display` is an observer (:mod:`rlmoptimizer.events`): it only shows.

May import: rich, IPython (in Jupyter only), ``rlmoptimizer.events``.
"""

from __future__ import annotations

import html
import re
import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from rlmoptimizer.events import AgentTurn, EvaluationFinished, EvaluationStarted, Event, ExampleEvaluated

_MAX_SHOWN = 4000


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

                self._live = Live(
                    Text(self._line(), style="dim"),
                    console=self.console,
                    transient=True,
                    auto_refresh=False,
                    redirect_stdout=False,
                    redirect_stderr=False,
                )
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


# A colour (select graphic rendition): the one escape sequence shown for what it means.
_SGR = re.compile(r"\x1b\[([0-9;]*)m")
# What can hide or disguise other text, written out instead: control characters other than newline and tab (C0 with
# ESC, DEL, C1: a backspace, a carriage return, an escape sequence other than a colour), bidirectional overrides and
# zero-width characters (text that reads otherwise than it runs).
_HIDING = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u202a-\u202e\u2060\u2066-\u2069\ufeff]")


def _colour(parameters: str) -> str:
    """An SGR sequence's parameters without 8 (concealed text); a 256-colour or RGB colour's own numbers are kept."""
    items, kept, i = parameters.split(";"), [], 0
    while i < len(items):
        width = {"5": 3, "2": 5}.get(items[i + 1], 2) if items[i] in ("38", "48", "58") and i + 1 < len(items) else 1
        if items[i : i + width] != ["8"]:
            kept += items[i : i + width]
        i += width
    return ";".join(kept)


def terminal_text(text: Any) -> Text:
    """What an LM or a program printed, as it is safe to show a person: colours kept (concealed text shown), every
    other escape sequence, control character, bidirectional override and zero-width character written out (``\\x1b``,
    ``\\x08``, ``\\u202e``), so that printed text cannot hide or disguise other text, or act on the terminal."""
    text = str(text or "").replace("\r\n", "\n")
    written, pos = [], 0
    for found in _SGR.finditer(text):
        written += [_HIDING.sub(_written_out, text[pos : found.start()]), f"\x1b[{_colour(found.group(1))}m"]
        pos = found.end()
    written.append(_HIDING.sub(_written_out, text[pos:]))
    shown = "".join(written)
    return Text.from_ansi(shown) if "\x1b" in shown else Text(shown)


def _written_out(found: re.Match) -> str:
    return repr(found.group())[1:-1]


def _clip(text: str, limit: int = _MAX_SHOWN) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit:,} more characters)"


class Display:
    """Rich output for one compile(); silent when ``enabled`` is False."""

    def __init__(self, enabled: bool, console: Console | None = None) -> None:
        self.enabled = enabled
        self.console = console if console is not None else Console(stderr=True)
        self._progress = EvaluationProgress(self.console)

    def on_event(self, event: Event) -> None:
        if not self.enabled:
            return
        if isinstance(event, ExampleEvaluated):
            self.example_done(event.record.passed)
        elif isinstance(event, EvaluationStarted):
            self.evaluation_started(event.split, event.label, event.total)
        elif isinstance(event, EvaluationFinished):  # a run cut short ends its progress display too
            self.run_finished(event.run.summary())
        elif isinstance(event, AgentTurn):
            self.turn(event.turn)

    def message(self, text: str, style: str = "") -> None:
        if self.enabled and text:  # an empty message (nothing to say) prints nothing
            self.console.print(Text(text, style=style))

    def turn(self, turn: dict[str, Any]) -> None:
        """One agent turn: reasoning, code, output."""
        if not self.enabled:
            return
        parts = []
        if turn.get("reasoning"):
            parts.append(Panel(terminal_text(_clip(turn["reasoning"])), title="reasoning", border_style="blue"))
        if turn.get("code"):
            parts.append(
                Panel(
                    Syntax(terminal_text(_clip(turn["code"])).plain, "python", word_wrap=True),
                    title="code",
                    border_style="green",
                )
            )
        parts.append(Panel(terminal_text(_clip(turn.get("output", ""))), title="output", border_style="yellow"))
        title = f"agent turn {turn.get('iteration', '?')}" + (" (submitted)" if turn.get("final") else "")
        self.console.print(Panel(Group(*parts), title=title, border_style="magenta"))

    def evaluation_started(self, split: str, label: str, total: int) -> None:
        if self.enabled:
            self._progress.started(split, label, total)

    def example_done(self, passed: bool) -> None:
        if self.enabled:
            self._progress.example_done(passed)

    def run_finished(self, summary: dict[str, Any]) -> None:
        if self.enabled:
            self._progress.finished(summary)
