"""What ``verbose=True`` shows: each agent turn as rich panels, evaluations as a progress line.

``Display(enabled=False)`` prints nothing at all. The console is injectable (tests pass one that
records into a string). A :class:`Display` is an observer (:mod:`rlmoptimizer.events`): it only shows.

May import: rich, ``rlmoptimizer.events``.
"""

from __future__ import annotations

import threading
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from rlmoptimizer.events import AgentTurn, EvaluationFinished, EvaluationStarted, Event, ExampleEvaluated

_MAX_SHOWN = 4000


def _clip(text: str, limit: int = _MAX_SHOWN) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit:,} more characters)"


class Display:
    """Rich output for one compile(); silent when ``enabled`` is False."""

    def __init__(self, enabled: bool, console: Console | None = None) -> None:
        self.enabled = enabled
        self.console = console if console is not None else Console(stderr=True)
        self._lock = threading.Lock()
        self._progress: dict[str, Any] = {}

    def on_event(self, event: Event) -> None:
        if not self.enabled:
            return
        if isinstance(event, ExampleEvaluated):
            self.example_done(event.record.passed)
        elif isinstance(event, EvaluationStarted):
            self.evaluation_started(event.split, event.label, event.total)
        elif isinstance(event, EvaluationFinished):
            if event.complete:
                self.run_finished(event.run.summary())
        elif isinstance(event, AgentTurn):
            self.turn(event.turn)

    def message(self, text: str, style: str = "") -> None:
        if self.enabled:
            self.console.print(Text(text, style=style))

    def turn(self, turn: dict[str, Any]) -> None:
        """One agent turn: reasoning, code, output."""
        if not self.enabled:
            return
        parts = []
        if turn.get("reasoning"):
            parts.append(Panel(Text(_clip(turn["reasoning"])), title="reasoning", border_style="blue"))
        if turn.get("code"):
            parts.append(Panel(Syntax(_clip(turn["code"]), "python", word_wrap=True), title="code", border_style="green"))
        parts.append(Panel(Text(_clip(turn.get("output", ""))), title="output", border_style="yellow"))
        title = f"agent turn {turn.get('iteration', '?')}" + (" (submitted)" if turn.get("final") else "")
        self.console.print(Panel(Group(*parts), title=title, border_style="magenta"))

    def evaluation_started(self, split: str, label: str, total: int) -> None:
        if self.enabled:
            with self._lock:
                self._progress = {"split": split, "label": label, "total": total, "done": 0, "passed": 0}

    def example_done(self, passed: bool) -> None:
        if not self.enabled:
            return
        with self._lock:
            progress = self._progress
            if not progress:
                return
            progress["done"] += 1
            progress["passed"] += int(passed)
            done, total = progress["done"], progress["total"]
            step = max(1, total // 10)
            if done == total or done % step == 0:
                self.console.print(
                    f"[dim]evaluating {progress['label']} on {progress['split']}: {done}/{total} "
                    f"({progress['passed']} passed)[/dim]"
                )

    def run_finished(self, summary: dict[str, Any]) -> None:
        if self.enabled:
            self.console.print(
                f"[bold]{summary['run_id']}[/bold] {summary['label']} on {summary['split']}: "
                f"score {summary['score']:.3f} ({summary['passed_count']}/{summary['evaluated_count']} passed), "
                f"budget left {summary['budget_left']}"
            )
