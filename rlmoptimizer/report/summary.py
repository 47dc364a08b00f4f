"""A person's summary of a run directory: ``python -m rlmoptimizer report RUN_DIR``.

Prints the status (finished, interrupted, in flight, empty), the budget, the cost where it was recorded (and, beside
it, what the compile was predicted to cost before its first paid call), every
evaluation run with its score, the prompt versions, the selection and where the returned instructions came from
(their ancestry, one line per generation), and writes the picture of the run (:mod:`rlmoptimizer.report.plot`) when
matplotlib is installed, else says how to get it.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from rlmoptimizer.display import terminal_text
from rlmoptimizer.report.costs import CostEstimate
from rlmoptimizer.report.results import DetailedResults
from rlmoptimizer.report.rundir import RunDirectory, read_run_directory
from rlmoptimizer.usage import dollars

_STATUS = {
    "finished": ("green", "finished: result.json holds the returned instructions"),
    "interrupted": (
        "yellow",
        "interrupted: the process stopped before it finished; run compile() again with this "
        "run_storage_dir to resume where it stopped (nothing paid for is evaluated again)",
    ),
    "in flight": ("cyan", "in flight: a compile() is writing this directory now"),
    "empty": ("dim", "empty: no run has been written here yet"),
}


def _clip(text: Any, limit: int = 100) -> str:
    """``text`` on one line, at most ``limit`` characters, with what an LM wrote that a terminal would act on (escape
    sequences, control characters) written out (:func:`~rlmoptimizer.display.terminal_text`)."""
    text = " ".join(terminal_text(str(text or "")).plain.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _when(timestamp: Any) -> str:
    if not isinstance(timestamp, (int, float)) or timestamp <= 0:
        return ""
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def _budget_text(rundir: RunDirectory) -> Text:
    budget = rundir.budget
    if not budget:
        return Text("budget: unknown (no ledger yet)")
    text = Text(f"budget: {budget.get('spent', 0)} of {budget['limit']} units spent, {budget.get('left', '?')} left")
    kinds = {k: v for k, v in (budget.get("spent_by_kind") or {}).items() if v}
    if kinds:
        text.append(" (" + ", ".join(f"{k} {v}" for k, v in kinds.items()) + ")")
    return text


def _cell(column: str, value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and column.endswith("usd"):
        return dollars(value).lstrip("$")  # the column says the unit; a tiny cost keeps its digits
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _usage_table(rundir: RunDirectory) -> Table | Text:
    usage = rundir.usage
    if not usage:
        return Text("cost: not recorded in this run directory", style="dim")
    table = Table(title="LM usage and cost", title_justify="left", show_edge=False)
    rows = {role: data for role, data in usage.items() if isinstance(data, dict)}
    columns = sorted({key for data in rows.values() for key in data if isinstance(data[key], (int, float))})
    table.add_column("role")
    for column in columns:
        table.add_column(column, justify="right")
    for role, data in rows.items():
        table.add_row(role, *[_cell(c, data.get(c, "")) for c in columns])
    cost = rundir.cost
    unpriced = (usage.get("total") or {}).get("unpriced_models") if isinstance(usage.get("total"), dict) else None
    if cost is not None:
        table.caption = f"total cost: {dollars(cost)}"
    elif unpriced:
        table.caption = f"total cost: unknown (no price for {', '.join(map(str, unpriced))})"
    return table


def _cost_check(rundir: RunDirectory) -> Text | None:
    """What the compile was predicted to cost beside what it spent (so far, for a run that did not finish)."""
    if not rundir.estimate:
        return None
    estimate = CostEstimate.from_dict(rundir.estimate)
    if not rundir.usage:
        return Text(str(estimate))
    return Text(str(estimate.against(rundir.usage)))


_RUN_COLUMNS = (
    ("split", "left"),
    ("label", "left"),
    ("score", "right"),
    ("passed", "right"),
    ("charged", "right"),
    ("spent after", "right"),
)
_NOTES_MIN_WIDTH = 30  # narrower than this, a run's notes go on their own line under the table


def _run_rows(rundir: RunDirectory) -> list[tuple[list[str], str]]:
    """Each run's cells (the run column and :data:`_RUN_COLUMNS`) and its notes (rich markup; may be empty)."""
    selection = rundir.selection or {}
    candidates = {c.get("run_id") for c in selection.get("candidates", [])}
    chosen = selection.get("chosen_run_id")
    initial = rundir.initial_instructions
    rows = []
    for run in rundir.runs:
        marks = []
        if run.run_id == chosen:
            marks.append("[bold green]returned[/]")
        elif run.run_id in candidates:
            marks.append("candidate")
        if initial is not None and run.instructions != initial and run.label != "baseline":
            changed = sorted(step for step, text in run.instructions.items() if initial.get(step) != text)
            if changed:
                marks.append("changed: " + ", ".join(changed))
        if run.note:
            marks.append(f"[dim]{escape(_clip(run.note, 60))}[/]")
        cells = [
            run.run_id,
            run.split,
            run.label,
            f"{run.score:.3f}",
            f"{run.passed_count}/{run.evaluated_count}"
            + ("" if run.evaluated_count == run.requested_count else f" of {run.requested_count}"),
            str(run.budget_spent),
            str(rundir.spent_after(run)),
        ]
        rows.append((cells, "; ".join(marks)))
    for pending in rundir.pending:
        cells = [
            "[italic]unfinished[/]",
            pending.split,
            pending.label,
            f"{pending.score:.3f}",
            f"{sum(r.passed for r in pending.records)}/{pending.evaluated_count} of {pending.requested_count}",
            str(pending.evaluated_count if pending.charged else 0),
            "",
        ]
        rows.append((cells, "[yellow]" + ("being evaluated" if rundir.status == "in flight" else "see below") + "[/]"))
    return rows


_MOST_RUN_ROWS = 60  # more runs than this: the table shows the first, the last and those the selection compared
_FIRST_ROWS, _LAST_ROWS = 5, 20


def _elided(rows: list[tuple[list[str], str]], rundir: RunDirectory) -> list[tuple[list[str], str]]:
    """``rows`` cut to the first and last ones, those the selection compared and the unfinished ones, each gap a row
    saying how many runs it leaves out (``report --all-runs`` shows them)."""
    selection = rundir.selection or {}
    wanted = {c.get("run_id") for c in selection.get("candidates", [])} | {selection.get("chosen_run_id")}
    saved = len(rundir.runs)  # (the unfinished evaluations' rows come after the saved runs')
    shown = [
        i < _FIRST_ROWS or i >= len(rows) - _LAST_ROWS or i >= saved or cells[0] in wanted
        for i, (cells, _) in enumerate(rows)
    ]
    kept: list[tuple[list[str], str]] = []
    gap = 0
    for row, show in zip(rows, shown, strict=True):
        if not show:
            gap += 1
            continue
        if gap:
            kept.append(
                ([f"[dim]... {gap} run(s)[/]", *[""] * (len(row[0]) - 1)], "[dim]report --all-runs shows them[/]")
            )
            gap = 0
        kept.append(row)
    return kept


class _RunsTable:
    """The evaluation runs, one row each, laid out for the width it is printed at: with a column for each run's
    notes (returned, candidate, the steps it changed, its note) when they have room, else the notes under the
    table, one line per run that has any (a narrow terminal: a notes column would get a word a line)."""

    def __init__(self, rundir: RunDirectory, every: bool = False):
        self.title = f"evaluation runs ({len(rundir.runs)} saved, {len(rundir.pending)} in flight or unfinished)"
        rows = _run_rows(rundir)
        if not every and len(rows) > _MOST_RUN_ROWS:
            rows = _elided(rows, rundir)
            self.title += f"; the first {_FIRST_ROWS}, the last {_LAST_ROWS} and those compared shown"
        self.rows = rows

    def _table(self, with_notes: bool) -> Table:
        table = Table(title=self.title, title_justify="left", show_edge=False)
        table.add_column("run", no_wrap=True, min_width=10)
        for column, justify in _RUN_COLUMNS:
            table.add_column(column, justify=justify, no_wrap=True)
        if with_notes:
            table.add_column("", justify="left")
        for cells, notes in self.rows:
            table.add_row(*cells, *([notes] if with_notes else []))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        data = self._table(with_notes=False)
        room = options.max_width - Measurement.get(console, options, data).maximum - 3  # 3: the column separator
        if room >= _NOTES_MIN_WIDTH or not any(notes for _, notes in self.rows):
            yield self._table(with_notes=True)
            return
        yield data
        notes = Table.grid(padding=(0, 2))
        notes.add_column(no_wrap=True, min_width=10)
        notes.add_column()
        for cells, marks in self.rows:
            if marks:
                notes.add_row(cells[0], marks)
        yield Padding(notes, (0, 0, 0, 1))


def _pending_text(rundir: RunDirectory) -> Text | None:
    if not rundir.pending or rundir.status == "in flight":
        return None
    text = Text(style="yellow")
    for pending in rundir.pending:
        text.append(
            f"unfinished: {pending.label} evaluation on {pending.split} stopped after {pending.evaluated_count} of "
            f"{pending.requested_count} examples; its records are kept in runs/{Path(pending.path).name} and are "
            "saved as a run (not paid again) when compile() resumes this directory\n"
        )
    text.rstrip()
    return text


def _prompts_table(rundir: RunDirectory) -> Table | Text:
    if not rundir.prompt_versions:
        return Text("prompt versions: none (the instructions were never changed)", style="dim")
    table = Table(title=f"prompt versions ({len(rundir.prompt_versions)})", title_justify="left", show_edge=False)
    table.add_column("v", justify="right")
    table.add_column("step")
    table.add_column("source")
    table.add_column("text")
    for version in rundir.prompt_versions:
        table.add_row(
            str(version.get("version", "")),
            str(version.get("step", "")),
            str(version.get("source", "")),
            _clip(version.get("text", ""), 110),
        )
    return table


def _selection_text(rundir: RunDirectory) -> Panel | Text:
    selection = rundir.selection
    if not selection:
        return Text("selection: none yet (made when compile() finishes)", style="dim")
    lines = Text()
    lines.append(
        f"returned {selection.get('chosen_run_id')} ({selection.get('chosen_label')}) with "
        f"{selection.get('split')} score {selection.get('chosen_score', 0):.3f}",
        style="bold",
    )
    if selection.get("baseline_score") is not None:
        lines.append(f"; the unchanged program scored {selection['baseline_score']:.3f}")
    lines.append(f"\nwhy: {selection.get('reason', '')}")
    instructions = rundir.optimized_instructions or {}
    initial = rundir.initial_instructions or {}
    for step, text in instructions.items():
        if initial.get(step) != text:
            lines.append(f"\n{step}: ", style="bold")
            lines.append(_clip(text, 400))
    return Panel(lines, title="selection", title_align="left", border_style="green")


def _ids(ids: Any) -> str:
    return ", ".join(str(i) for i in ids)


def ancestry_lines(ancestry: Any, split: str | None) -> list[tuple[int, str]]:
    """``(generation, line)`` per generation of the returned candidate's ancestry
    (:attr:`DetailedResults.ancestry`), the unchanged program first: id, move, parents, the train ids reflected on,
    the failure group it was made for, the score on the whole selection split."""
    where = "validation" if split != "train" else "train"
    lines = []
    for node in ancestry:
        line = str(node["label"])
        if node["id"] is not None or node["move"] != "the program as given":
            line += f": {node['move']}" + (f" in {node['run']}" if node.get("run") else "")
        if node["parents"]:
            line += f", from {_ids(node['parents'])}"
        if node["changed_steps"]:
            line += f"; changed {_ids(node['changed_steps'])}"
        if node.get("reflected_on"):
            line += f"; reflected on train {_ids(node['reflected_on'])}"
        made_for = node.get("made_for")
        if made_for:
            line += (
                f"; made for group {made_for['group']!r} of {made_for['analysis']} "
                f"(train {_ids(made_for['example_ids'])})"
            )
        line += f"; {where} {node['score']:.3f}" if node.get("score") is not None else f"; not scored on all of {where}"
        if node.get("returned"):
            line += " (returned)"
        lines.append((node["generation"], line))
    return lines


def _ancestry_section(rundir: RunDirectory) -> Group | None:
    if not rundir.selection:
        return None
    results = DetailedResults.from_run_directory(rundir)
    if not results.ancestry:
        return None
    grid = Table.grid(padding=(0, 1))
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column()
    for generation, line in ancestry_lines(results.ancestry, results.selection_split):
        grid.add_row(f"{generation}.", line)
    return Group(Text("where the returned instructions came from", style="bold"), grid)


def _demos_text(rundir: RunDirectory) -> Text | None:
    """Which demos each step of the returned program got: the train example each came from."""
    sources = (rundir.result or {}).get("demo_sources") or {}
    if not sources:
        return None
    return Text(
        "demos of the returned program: "
        + "; ".join(
            f"{step}: {len(ids)} from train {_ids([i if i is not None else '(not from train)' for i in ids])}"
            for step, ids in sources.items()
        )
    )


def render(rundir: RunDirectory, picture: Path | str | None = None, *, all_runs: bool = False) -> Group:
    """The summary of ``rundir`` as one rich renderable (``all_runs``: a row for every evaluation run, not only the
    first, the last and those compared when there are many)."""
    color, meaning = _STATUS[rundir.status]
    header = Text()
    header.append(f"{rundir.directory}\n", style="bold")
    header.append(f"status: {meaning}", style=color)
    holder = rundir.holder or {}
    if rundir.status == "in flight" and holder.get("pid") is not None:
        header.append(f" (process {holder['pid']} on {holder.get('host')}, since {holder.get('since')})", style=color)
    if rundir.status == "interrupted" and rundir.stopped:
        stop = rundir.stopped
        header.append(f"\nstopped at {stop['at']} by {stop['error']}: {_clip(stop['message'], 300)}", style=color)
    manifest = rundir.manifest or {}
    if manifest.get("created_at"):
        header.append(f"\nstarted: {_when(manifest['created_at'])}")
    if rundir.turns:
        loop = (manifest.get("settings") or {}).get("rlm_autopilot") == "loop"  # no agent: the policy's phases
        header.append(
            (
                f"\nphases of the default loop (no agent): {len(rundir.turns)}"
                if loop
                else f"\nagent turns: {len(rundir.turns)}"
            )
            + (" (the last one submitted)" if rundir.turns[-1].get("final") else "")
            + (f", last at {_when(rundir.turns[-1].get('created_at'))}" if rundir.turns[-1].get("created_at") else "")
        )
    parts: list[Any] = [Panel(header, title="rlmoptimizer run", title_align="left"), _budget_text(rundir)]
    if rundir.status != "empty":
        parts.append(_usage_table(rundir))
        check = _cost_check(rundir)
        if check is not None:
            parts.append(check)
        parts.append(_RunsTable(rundir, every=all_runs))
        pending = _pending_text(rundir)
        if pending is not None:
            parts.append(pending)
        parts += [_prompts_table(rundir), _selection_text(rundir)]
        ancestry = _ancestry_section(rundir)
        if ancestry is not None:
            parts.append(ancestry)
        demos = _demos_text(rundir)
        if demos is not None:
            parts.append(demos)
    if rundir.problems:
        parts.append(Text("skipped: " + "; ".join(rundir.problems), style="yellow"))
    if isinstance(picture, Path):
        parts.append(Text(f"picture: {picture}"))
    elif picture is not None:  # why there is none
        parts.append(Text(f"picture: none, {picture}", style="yellow"))
    return Group(*parts)


def report(
    directory: str | Path,
    *,
    console: Console | None = None,
    picture: str | Path | None | bool = True,
    all_runs: bool = False,
) -> RunDirectory:
    """Print the summary of ``directory`` and write its picture.

    ``picture``: True writes ``run.png`` into the run directory, a path writes there, False writes none. An empty
    directory gets no picture; without matplotlib (the ``plot`` extra) the summary says how to get it. With more
    than 60 evaluation runs the table shows the first, the last and those the selection compared, unless
    ``all_runs``. Returns what was read."""
    from rlmoptimizer.report.plot import picture_unavailable, write_run_picture

    console = console if console is not None else Console()
    rundir = read_run_directory(directory)
    written: Path | str | None = None
    if picture is not False and rundir.status != "empty":
        written = picture_unavailable()
        if written is None and (picture is True or picture is None):
            try:  # into the run directory: a read-only one, or a full disk, still gets its summary
                written = write_run_picture(rundir)
            except OSError as exc:
                written = (
                    f"run.png could not be written ({exc.strerror or exc}): pass --out PATH.png to write it elsewhere"
                )
        elif written is None:
            written = write_run_picture(rundir, picture)
    console.print(render(rundir, written, all_runs=all_runs))
    return rundir
