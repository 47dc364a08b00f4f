"""``optimized.agent_trajectory``: still the plain list of turn dicts (JSON as it is), shown turn by turn.

In a notebook the list renders as a table, one short row per turn (what the agent meant, the first lines of its
code, the first lines of the output); ``trajectory.show(i)`` renders turn ``i`` (as the table numbers it) in full. ``rich.print(trajectory)``
gives the same table in a terminal.
"""

from __future__ import annotations

import html
from typing import Any

from rlmoptimizer.display import terminal_text

_SHORT = 160


def _plain(text: Any) -> str:
    """``text`` as a person reads it: terminal escape codes taken out, other control characters written out."""
    return terminal_text(text).plain


def _first_lines(text: Any, lines: int = 3, limit: int = _SHORT) -> str:
    text = _plain(text).strip()
    kept = text.splitlines()[:lines]
    short = "\n".join(kept)
    if len(short) > limit:
        short = short[:limit].rstrip() + " ..."
    elif len(kept) < len(text.splitlines()):
        short += "\n..."
    return short


def _title(turn: dict[str, Any], index: int | str = "?") -> str:
    """``turn N``, with what the default loop took in it and how it ended (the agent's SUBMIT: "submitted")."""
    title = f"turn {turn.get('iteration', index)}"
    ran = turn.get("pilot")
    if isinstance(ran, list) and ran:
        title += f" (+ the default loop: {len(ran)} action(s))"
    if turn.get("final"):
        by = turn.get("submitted_by")
        title += f" (final: {_first_lines(by, lines=1, limit=80)})" if by else " (submitted)"
    return title


def _blocks(turn: dict[str, Any]) -> list[tuple[str, str]]:
    """The parts of a turn shown in full: reasoning, code, output, and the default loop's actions when it took some."""
    parts = [(key, _plain(turn.get(key, ""))) for key in ("reasoning", "code", "output")]
    ran = turn.get("pilot")
    if isinstance(ran, list) and ran:
        parts.append(("the default loop's actions", "\n".join(map(str, ran))))
    return parts


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
            rows.append(
                {
                    "turn": _title(turn, index + 1).removeprefix("turn "),
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

    def show(self, turn: int = -1) -> TurnView:
        """Turn ``turn`` in full, as the table numbers it (``show(1)`` is the first turn; negative numbers count from
        the end, ``show()`` is the last), rendered in a notebook or by rich."""
        if isinstance(turn, bool) or not isinstance(turn, int):
            raise TypeError(f"show() takes a turn number as the table shows it, got {turn!r}")
        if turn < 0 and -turn <= len(self):
            return TurnView(self[turn])
        numbered = {
            str(entry.get("iteration", index + 1)) if isinstance(entry, dict) else str(index + 1): entry
            for index, entry in enumerate(self)
        }
        if turn > 0 and str(turn) in numbered:
            return TurnView(numbered[str(turn)])
        known = list(numbered)
        shown = f"turns {known[0]} to {known[-1]}" if len(known) > 1 else (f"turn {known[0]}" if known else "no turn")
        raise IndexError(f"no turn {turn}: this trajectory has {shown} (show(-1) is the last)")


class TurnView:
    """One agent turn: reasoning, code (syntax highlighted with rich), output."""

    def __init__(self, turn: dict[str, Any]) -> None:
        self.turn = turn if isinstance(turn, dict) else {"output": str(turn)}

    def __repr__(self) -> str:
        parts = [_title(self.turn)]
        for key, text in _blocks(self.turn):
            parts.append(f"--- {key} ---\n{text}")
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        pre = 'style="white-space:pre-wrap;font-family:monospace;font-size:12px;margin:0 0 8px 0"'
        blocks = "".join(f"<b>{key}</b><pre {pre}>{html.escape(text)}</pre>" for key, text in _blocks(self.turn))
        return f"<div><h4>{html.escape(_title(self.turn))}</h4>{blocks}</div>"

    def __rich__(self):
        from rich.console import Group
        from rich.panel import Panel
        from rich.syntax import Syntax
        from rich.text import Text

        styles = {"reasoning": "blue", "code": "green", "output": "yellow"}
        parts = [
            Panel(
                Syntax(text, "python", word_wrap=True) if key == "code" else Text(text),
                title=key,
                border_style=styles.get(key, "cyan"),
            )
            for key, text in _blocks(self.turn)
        ]
        return Panel(Group(*parts), title=f"agent {_title(self.turn)}", border_style="magenta")
