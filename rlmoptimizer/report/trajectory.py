"""``optimized.agent_trajectory``: still the plain list of turn dicts (JSON as it is), shown turn by turn.

In a notebook the list renders as a table, one short row per turn (what the agent meant, the first lines of its
code, the first lines of the output); ``trajectory.show(i)`` renders one turn in full. ``rich.print(trajectory)``
gives the same table in a terminal.
"""

from __future__ import annotations

import html
from typing import Any

_SHORT = 160


def _first_lines(text: Any, lines: int = 3, limit: int = _SHORT) -> str:
    text = str(text or "").strip()
    kept = text.splitlines()[:lines]
    short = "\n".join(kept)
    if len(short) > limit:
        short = short[:limit].rstrip() + " ..."
    elif len(kept) < len(text.splitlines()):
        short += "\n..."
    return short


class Trajectory(list):
    """A list of agent turns (``{"iteration", "reasoning", "code", "output", "final", ...}``) that renders
    readably in Jupyter (``_repr_html_``) and with rich (``__rich__``). Equal to, and serialized as, a plain list."""

    def __repr__(self) -> str:
        return f"Trajectory({len(self)} turns; .show(i) for one turn, list(...) for the raw dicts)"

    def summary_rows(self) -> list[dict[str, str]]:
        rows = []
        for index, turn in enumerate(self):
            if not isinstance(turn, dict):
                rows.append({"turn": str(index), "reasoning": _first_lines(turn), "code": "", "output": ""})
                continue
            number = str(turn.get("iteration", index + 1)) + (" (submitted)" if turn.get("final") else "")
            rows.append(
                {
                    "turn": number,
                    "reasoning": _first_lines(turn.get("reasoning"), lines=2),
                    "code": _first_lines(turn.get("code")),
                    "output": _first_lines(turn.get("output")),
                }
            )
        return rows

    # -- Jupyter -----------------------------------------------------------------------------------
    def _repr_html_(self) -> str:
        cell = 'style="text-align:left;vertical-align:top;white-space:pre-wrap;font-family:monospace;font-size:12px"'
        head = "".join(f"<th {cell}>{name}</th>" for name in ("turn", "reasoning", "code", "output"))
        body = "".join(
            "<tr>"
            + "".join(f"<td {cell}>{html.escape(row[key])}</td>" for key in ("turn", "reasoning", "code", "output"))
            + "</tr>"
            for row in self.summary_rows()
        )
        caption = f"{len(self)} agent turn(s); <code>.show(i)</code> shows turn i in full"
        return f"<table><caption style='text-align:left'>{caption}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    # -- rich --------------------------------------------------------------------------------------
    def __rich__(self):
        from rich.table import Table

        table = Table(title=f"{len(self)} agent turn(s)", show_lines=True, expand=True)
        table.add_column("turn", no_wrap=True)
        table.add_column("reasoning", ratio=2)
        table.add_column("code", ratio=3)
        table.add_column("output", ratio=3)
        for row in self.summary_rows():
            table.add_row(row["turn"], row["reasoning"], row["code"], row["output"])
        return table

    def show(self, index: int = -1) -> TurnView:
        """One turn in full (the last by default), rendered in a notebook or by rich."""
        return TurnView(self[index])


class TurnView:
    """One agent turn: reasoning, code (syntax highlighted with rich), output."""

    def __init__(self, turn: dict[str, Any]) -> None:
        self.turn = turn if isinstance(turn, dict) else {"output": str(turn)}

    def __repr__(self) -> str:
        parts = [f"turn {self.turn.get('iteration', '?')}" + (" (submitted)" if self.turn.get("final") else "")]
        for key in ("reasoning", "code", "output"):
            parts.append(f"--- {key} ---\n{self.turn.get(key, '')}")
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        pre = 'style="white-space:pre-wrap;font-family:monospace;font-size:12px;margin:0 0 8px 0"'
        title = f"turn {self.turn.get('iteration', '?')}" + (" (submitted)" if self.turn.get("final") else "")
        blocks = "".join(
            f"<b>{key}</b><pre {pre}>{html.escape(str(self.turn.get(key, '')))}</pre>"
            for key in ("reasoning", "code", "output")
        )
        return f"<div><h4>{html.escape(title)}</h4>{blocks}</div>"

    def __rich__(self):
        from rich.console import Group
        from rich.panel import Panel
        from rich.syntax import Syntax
        from rich.text import Text

        parts = [
            Panel(Text(str(self.turn.get("reasoning", ""))), title="reasoning", border_style="blue"),
            Panel(Syntax(str(self.turn.get("code", "")), "python", word_wrap=True), title="code", border_style="green"),
            Panel(Text(str(self.turn.get("output", ""))), title="output", border_style="yellow"),
        ]
        title = f"agent turn {self.turn.get('iteration', '?')}" + (" (submitted)" if self.turn.get("final") else "")
        return Panel(Group(*parts), title=title, border_style="magenta")
