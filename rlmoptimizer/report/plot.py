"""The picture of a run: score against budget spent, one mark per evaluation run.

Train runs are circles, validation runs squares; a run that evaluated fewer examples than it asked for (stopped,
recovered, or still in flight) is drawn hollow. Dashed lines are the unchanged program's scores; the candidates
checked on the whole selection split are ringed, and the one returned is a star (named in the legend); a dotted
green line joins the returned candidate's ancestors (:attr:`DetailedResults.ancestry`: the unchanged program, the
candidates it was made from), each labelled with its id, at the run that scored it on the selection split. The
score axis follows the scores (any finite scale; the whole of 0..1 when every score lies in it). The two baselines
are dashed in each other's gaps, so equal scores still show both colours; the labels are placed where they overlap
no other label and no mark (a label with no such place is left out: the report lists every run); the legend sits
under the axes. Drawn on a bare matplotlib Figure (Agg canvas, no display needed, pyplot untouched); 8x4.5 inches
at 100 dpi, readable in a notebook at its default size.

matplotlib is the optional extra ``plot`` (``pip install "rlmoptimizer[plot]"``): without it nothing else of
rlmoptimizer changes, and :func:`picture_unavailable` says how to get the picture.
"""

from __future__ import annotations

import importlib.util
import math
import os
import threading
import warnings
from pathlib import Path
from typing import Any

from rlmoptimizer.errors import ConfigurationError
from rlmoptimizer.report.rundir import RunDirectory, read_run_directory
from rlmoptimizer.storage.layout import RunLayout

_COLORS = {"train": "#1f77b4", "val": "#d62728"}
_NAMES = {"train": "train", "val": "validation"}
_ANCESTRY = "#2ca02c"
_LABEL_ALL_UP_TO = 30
# The baselines dash in each other's gaps: equal scores draw one line of both colours, not one hiding the other.
_BASELINE_DASHES = {"train": (0, (5, 5)), "val": (5, (5, 5))}
_LEGEND_ORDER = (
    "unchanged program",
    "train run",
    "validation run",
    "candidate checked for selection",
    "ancestry of the returned candidate",
    "returned",
)
_LABEL_BOX = {"bbox": {"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.75}}
# Where a label may go around its mark, in order: (dx, dy) in units of the mark's radius plus a gap, alignment.
_LABEL_PLACES = (
    (1, -1, "left"),
    (1, 1, "left"),
    (-1, -1, "right"),
    (-1, 1, "right"),
    (1.3, 0, "left"),
    (-1.3, 0, "right"),
    (0, -1.6, "center"),
    (0, 1.6, "center"),
    (1, -2.4, "left"),
    (1, 2.4, "left"),
    (-1, -2.4, "right"),
    (-1, 2.4, "right"),
)
PLOT_EXTRA = 'pip install "rlmoptimizer[plot]"'
"""The command that installs what the picture needs (matplotlib)."""
NO_PICTURE = f"the picture of a run (run.png) needs matplotlib, which is not installed: {PLOT_EXTRA}"


def picture_unavailable() -> str | None:
    """Why no picture can be drawn here, with the command that fixes it; None when matplotlib is installed.
    Cheap: it looks for matplotlib without importing it."""
    try:
        found = importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        found = False
    return None if found else NO_PICTURE


def _figure_class() -> Any:
    """matplotlib's ``Figure`` class. A bare Figure renders PNG with the Agg canvas whatever backend pyplot uses,
    so nothing here touches pyplot's state or opens a window."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # the optional extra "plot"
        raise ConfigurationError(NO_PICTURE) from exc
    return Figure


def score_limits(scores: list[Any]) -> tuple[float, float]:
    """The score axis for ``scores``: all of 0..1 when every finite score lies in it (the usual scale), else
    from the lowest to the highest score; a margin on both sides for the rings and labels."""
    finite = [float(y) for y in scores if isinstance(y, (int, float)) and not isinstance(y, bool) and math.isfinite(y)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if low >= 0.0 and high <= 1.0:
        low, high = 0.0, 1.0
    span = high - low
    if not span > 0.0 or not math.isfinite(span):
        span = max(abs(high), 1.0) if math.isfinite(high) else 1.0
    return low - 0.08 * span, high + 0.08 * span


def _points(rundir: RunDirectory) -> list[dict[str, Any]]:
    """One point per run (saved, then in flight), with its x (budget spent), y (score) and how to draw it."""
    points = []
    for run in rundir.runs:
        partial = run.evaluated_count < run.requested_count or run.label.endswith((":partial", ":recovered"))
        points.append(
            {
                "run_id": run.run_id,
                "split": run.split,
                "label": run.label,
                "x": rundir.spent_after(run),
                "y": run.score,
                "n": run.evaluated_count,
                "partial": partial,
                "instructions": run.instructions,
                "requested": run.requested_count,
            }
        )
    spent = (rundir.budget or {}).get("spent")
    last_x = max((p["x"] for p in points), default=0)
    for number, pending in enumerate(rundir.pending, start=1):
        if not pending.records:
            continue
        x = int(spent) if isinstance(spent, (int, float)) else last_x + len(pending.records)
        points.append(
            {
                "run_id": ("in flight" if rundir.status == "in flight" else "unfinished")
                + (f" {number}" if number > 1 else ""),
                "split": pending.split,
                "label": pending.label,
                "x": max(x, last_x),
                "y": pending.score,
                "n": pending.evaluated_count,
                "partial": True,
                "instructions": pending.instructions,
                "requested": pending.requested_count,
            }
        )
    return points


def _ancestry_points(rundir: RunDirectory, points: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(ancestry node, point)`` for each ancestor of the returned candidate that has a run to stand for it: the
    returned run for the returned candidate, else its first run on the whole selection split, else its largest."""
    if not rundir.selection:
        return []
    from rlmoptimizer.report.results import DetailedResults

    results = DetailedResults.from_run_directory(rundir)
    by_run = {p["run_id"]: p for p in points}
    split = results.selection_split or "val"
    placed = []
    for node in results.ancestry:
        runs = [by_run[r] for r in node["run_ids"] if r in by_run]
        chosen = by_run.get(rundir.selection.get("chosen_run_id")) if node.get("returned") else None
        whole = [p for p in runs if p["split"] == split and not p["partial"]]
        point = chosen or (whole[0] if whole else max(runs, key=lambda p: p["n"], default=None))
        if point is not None:
            placed.append((node, point))
    return placed


def _draw_ancestry(axes: Any, placed: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    """Join each ancestor to its parents with a dotted line and label it with its id."""
    at = {node["label"]: point for node, point in placed}
    labelled = False
    for node, point in placed:
        for parent in node["parents"]:
            if parent in at:
                start = at[parent]
                axes.plot(
                    [start["x"], point["x"]],
                    [start["y"], point["y"]],
                    linestyle=":",
                    linewidth=1.6,
                    color=_ANCESTRY,
                    zorder=2,
                    label="_nolegend_" if labelled else "ancestry of the returned candidate",
                )
                labelled = True
    if not labelled:
        return
    for node, point in placed:
        name = "unchanged" if node["id"] is None and node["label"].startswith("the unchanged") else node["label"]
        axes.annotate(
            name,
            (point["x"], point["y"]),
            xytext=(6, 8),  # a first place: _place_labels moves it where it overlaps nothing
            textcoords="offset points",
            fontsize=7.5,
            color=_ANCESTRY,
            fontweight="bold",
            gid="ancestry",
            **_LABEL_BOX,
        )


def draw_run(rundir: RunDirectory | str | Path):
    """A matplotlib ``Figure`` of the run (not attached to pyplot, so nothing pops up and nothing leaks)."""
    if not isinstance(rundir, RunDirectory):
        rundir = read_run_directory(rundir)
    Figure = _figure_class()
    figure = Figure(figsize=(8, 4.5), dpi=100)
    axes = figure.add_subplot()
    points = _points(rundir)
    selection = rundir.selection or {}
    candidate_ids = {c.get("run_id") for c in selection.get("candidates", [])}
    chosen_id = selection.get("chosen_run_id")

    for split in ("train", "val"):
        baseline = next((p for p in points if p["split"] == split and p["label"] == "baseline"), None)
        if baseline is not None:
            axes.axhline(
                baseline["y"],
                color=_COLORS[split],
                linestyle=_BASELINE_DASHES[split],
                linewidth=1.2,
                alpha=0.8,
                label=f"unchanged program, {_NAMES[split]} ({baseline['y']:.2f})",
                zorder=1,
            )
        for partial in (False, True):
            chosen = [p for p in points if p["split"] == split and p["partial"] == partial]
            if not chosen:
                continue
            marker = "o" if split == "train" else "s"
            axes.scatter(
                [p["x"] for p in chosen],
                [p["y"] for p in chosen],
                marker=marker,
                s=[24 + 4 * min(p["n"], 40) for p in chosen],
                facecolors="none" if partial else _COLORS[split],
                edgecolors=_COLORS[split],
                linewidths=1.5,
                zorder=3,
                label=f"{_NAMES[split]} run"
                + (" (partial)" if partial else "")
                + ("" if split == "val" else ", size = examples"),
            )
    # every run is labelled while that stays readable; past that only the candidates and the unfinished runs. The
    # returned run is the star, named in the legend.
    labelled = [
        p
        for p in points
        if p["run_id"] != chosen_id
        and (len(points) <= _LABEL_ALL_UP_TO or p["run_id"] in candidate_ids or not p["run_id"].startswith("run-"))
    ]
    # placed in this order where they overlap nothing: the candidates' labels first
    for p in sorted(labelled, key=lambda p: p["run_id"] not in candidate_ids):
        short = p["run_id"].replace("run-", "#").lstrip("#0") or "0"
        short = f"#{short}" if p["run_id"].startswith("run-") else p["run_id"]
        axes.annotate(
            f"{short} ({p['n']}/{p['requested']})" if p["partial"] or p["split"] == "train" else short,
            (p["x"], p["y"]),
            xytext=(6, -11),  # a first place: _place_labels moves it where it overlaps nothing
            textcoords="offset points",
            fontsize=7,
            color="#444444",
            gid="run",
            **_LABEL_BOX,
        )
    candidates = [p for p in points if p["run_id"] in candidate_ids and p["run_id"] != chosen_id]
    if candidates:
        axes.scatter(
            [p["x"] for p in candidates],
            [p["y"] for p in candidates],
            s=260,
            facecolors="none",
            edgecolors="#555555",
            linewidths=1.2,
            zorder=4,
            label="candidate checked for selection",
        )
    _draw_ancestry(axes, _ancestry_points(rundir, points))
    chosen = next((p for p in points if p["run_id"] == chosen_id), None)
    if chosen is not None:
        axes.scatter(
            [chosen["x"]],
            [chosen["y"]],
            marker="*",
            s=420,
            color="#f2b705",
            edgecolors="black",
            linewidths=1,
            zorder=5,
            label=f"returned ({chosen['run_id']}, {chosen['y']:.2f})",
        )

    limit = rundir.budget_limit
    right = max([limit or 0, *(p["x"] for p in points)]) or 1
    axes.set_xlim(-0.02 * right, right * 1.04)
    axes.set_ylim(*score_limits([p["y"] for p in points]))
    axes.set_xlabel(f"budget units spent (limit {limit})" if limit is not None else "budget units spent")
    axes.set_ylabel("score")
    title = Path(rundir.directory).name or rundir.directory
    axes.set_title(f"{title}: {rundir.status}, {len(points)} evaluation run(s)", fontsize=11)
    axes.grid(True, alpha=0.3)
    if not points:
        axes.text(
            0.5,
            0.5,
            "no evaluation runs yet",
            transform=axes.transAxes,
            ha="center",
            va="center",
            fontsize=12,
            color="#777777",
        )
    else:  # under the axes, across the figure's width: the baselines, the runs, then the selection
        handles, names = axes.get_legend_handles_labels()
        order = sorted(range(len(names)), key=lambda i: (_LEGEND_ORDER.index(names[i].split(" (")[0].split(",")[0]), i))
        axes.legend(
            [handles[i] for i in order],
            [names[i] for i in order],
            loc="upper center",
            bbox_to_anchor=(0.5, -0.13),
            ncol=3,
            fontsize=7.5,
            frameon=False,
            markerscale=0.6,
            handlelength=3.0,
            columnspacing=1.6,
        )
    figure.tight_layout(pad=0.6)
    _place_labels(figure, axes)
    return figure


def _marks(axes: Any, renderer: Any) -> list[Any]:
    """The display-space boxes of every mark drawn (scatter points, rings, the star), sized as drawn."""
    from matplotlib.collections import PathCollection
    from matplotlib.transforms import Bbox

    boxes = []
    for collection in axes.collections:
        if not isinstance(collection, PathCollection):
            continue
        sizes = collection.get_sizes()
        for index, (x, y) in enumerate(axes.transData.transform(collection.get_offsets())):
            area = sizes[index % len(sizes)] if len(sizes) else 36.0
            radius = math.sqrt(area) / 2 * renderer.points_to_pixels(1.0)
            boxes.append(Bbox.from_extents(x - radius, y - radius, x + radius, y + radius))
    return boxes


def _place_labels(figure: Any, axes: Any) -> None:
    """Move each label (the ancestry's first, then the runs') to the first of a few places around its mark where
    it overlaps no label placed before it and no mark, inside the axes; a label with no such place is hidden."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()
    labels = [t for t in axes.texts if t.get_gid() == "ancestry"] + [t for t in axes.texts if t.get_gid() == "run"]
    if not labels:
        return
    marks = _marks(axes, renderer)
    inside = axes.get_window_extent(renderer).padded(-2)
    placed: list[Any] = []
    pixel = renderer.points_to_pixels(1.0)
    for label in labels:
        x, y = axes.transData.transform(label.xy)
        own = max((m.width / 2 / pixel for m in marks if m.contains(x, y)), default=4.0)  # its mark's radius (pt)
        gap = own + 2.0
        for dx, dy, ha in _LABEL_PLACES:
            label.set_position((dx * gap, dy * gap))
            label.set_horizontalalignment(ha)
            label.set_verticalalignment("center")
            box = label.get_window_extent(renderer).padded(1)
            if (
                inside.contains(box.x0, box.y0)
                and inside.contains(box.x1, box.y1)
                and not any(box.overlaps(other) for other in placed)
                and not any(box.overlaps(mark) for mark in marks)
            ):
                placed.append(box)
                break
        else:
            label.set_visible(False)


def write_run_picture(rundir: RunDirectory | str | Path, path: str | Path | None = None) -> Path:
    """Draw the run and write it as a PNG (default: ``run.png`` in the run directory). Returns the path."""
    if not isinstance(rundir, RunDirectory):
        rundir = read_run_directory(rundir)
    target = Path(path) if path is not None else RunLayout(rundir.directory).picture
    target.parent.mkdir(parents=True, exist_ok=True)
    # a name of its own: two reports at once (or a report as the compile ends) never write the same file
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with warnings.catch_warnings():  # a title in a script the font lacks (a run directory in Japanese): boxes
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font", category=UserWarning)
            draw_run(rundir).savefig(tmp, format="png")
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)  # (a full disk left a half-written one behind)
    return target
