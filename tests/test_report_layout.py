"""How a run reads at a glance: the report at the width of a terminal, the picture's labels, legend and baselines.

Regressions: at 80 columns the report's runs table left its notes column one word a line ("changed:" / "route" /
...); the picture's labels of close runs overlapped (``#4`` over ``#5``), its legend took 40% of its width, and a
validation baseline equal to the train baseline hid it."""

from __future__ import annotations

import dataclasses
import io
import itertools
import re

import numpy as np
import pytest
from matplotlib import image
from support.lineage import compile_with_lineage

from rlmoptimizer.__main__ import main
from rlmoptimizer.report.plot import draw_run
from rlmoptimizer.report.rundir import read_run_directory

pytestmark = pytest.mark.slow

TRAIN_BLUE = np.array([0x1F, 0x77, 0xB4]) / 255
VAL_RED = np.array([0xD6, 0x27, 0x28]) / 255


@pytest.fixture(scope="module")
def gepa_run(tmp_path_factory):
    """A run directory with a GEPA run in it (close runs: minibatches, their validation check) and an ancestry."""
    directory = tmp_path_factory.mktemp("layout") / "run"
    return directory, compile_with_lineage(directory)


@pytest.mark.parametrize("columns", [80, 120])
def test_the_report_reads_at_80_and_at_120_columns(gepa_run, columns, monkeypatch, capsys):
    directory, optimized = gepa_run
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["report", str(directory), "--no-plot"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= columns
    chosen = optimized.selection["chosen_run_id"]
    [row] = [line for line in lines if line.lstrip().startswith(chosen) and "returned" in line]
    # the returned run's notes read on one line: in the table's last column when it has room, else under the table
    assert "returned; changed: route" in row
    assert ("│" in row) == (columns == 120)
    runs = [log["run_id"] for log in optimized.trial_logs]
    table = [line for line in lines if line.lstrip().startswith(tuple(runs)) and "│" in line]
    assert len(table) == len(runs)  # one line per run: no cell of the table wraps


def test_a_run_with_many_evaluations_shows_the_first_the_last_and_those_compared(gepa_run, monkeypatch, capsys):
    """Regression: the table had a row for every run, and large runs have hundreds (57,000 characters at 337)."""
    from rlmoptimizer.report import summary

    directory, optimized = gepa_run
    runs = [log["run_id"] for log in optimized.trial_logs]
    compared = {c["run_id"] for c in optimized.selection["candidates"]} | {optimized.selection["chosen_run_id"]}
    monkeypatch.setattr(summary, "_MOST_RUN_ROWS", 3)
    monkeypatch.setattr(summary, "_FIRST_ROWS", 1)
    monkeypatch.setattr(summary, "_LAST_ROWS", 1)
    monkeypatch.setenv("COLUMNS", "160")
    assert main(["report", str(directory), "--no-plot"]) == 0
    out = capsys.readouterr().out
    shown = [run for run in runs if any(line.lstrip().startswith(run) for line in out.splitlines())]
    assert set(shown) == {runs[0], runs[-1], *compared}
    left_out = [int(n) for n in re.findall(r"\.\.\. (\d+) run\(s\)", out)]
    assert sum(left_out) == len(runs) - len(shown) > 0 and "report --all-runs shows them" in out
    assert main(["report", str(directory), "--no-plot", "--all-runs"]) == 0
    out = capsys.readouterr().out
    assert all(any(line.lstrip().startswith(run) for line in out.splitlines()) for run in runs)
    assert not re.search(r"\.\.\. \d+ run\(s\)", out)


def _label_boxes(figure):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()
    [axes] = figure.axes
    texts = [t for t in axes.texts if t.get_gid() in ("run", "ancestry") and t.get_visible()]
    return axes, renderer, {t.get_text(): t.get_window_extent(renderer) for t in texts}


def _assert_readable(figure):
    axes, renderer, boxes = _label_boxes(figure)
    inside = axes.get_window_extent(renderer)
    for (name, box), (other, other_box) in itertools.combinations(boxes.items(), 2):
        assert not box.overlaps(other_box), f"{name!r} overlaps {other!r}"
    for name, box in boxes.items():
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1, name
    legend = axes.get_legend().get_window_extent(renderer)
    assert legend.y1 <= inside.y0  # under the axes, not beside them
    assert inside.width >= 0.85 * figure.bbox.width
    return boxes


def test_the_pictures_labels_overlap_nothing_and_its_legend_is_under_the_axes(gepa_run):
    directory, optimized = gepa_run
    boxes = _assert_readable(draw_run(directory))
    assert {"unchanged", "proposal-1", "gepa-1"} <= set(boxes)  # the ancestry is always named
    # every run keeps its label but the returned one (the star the legend names), and a run whose point sits
    # between two neighbours at its score, where no place around it is free
    logs = optimized.trial_logs
    labelled = {int(name[1:].split()[0]) for name in boxes if name.startswith("#")}
    missing = [n for n in range(1, len(logs)) if n not in labelled]
    assert len(missing) <= 1, missing
    for n in missing:  # (#n is trial_logs[n - 1])
        assert logs[n - 2]["score"] == logs[n - 1]["score"] == logs[n]["score"], (n, logs)


def test_runs_in_one_place_keep_apart_what_labels_fit(gepa_run):
    directory, _ = gepa_run
    rundir = read_run_directory(directory)
    gepa = next(run for run in rundir.runs if run.label == "gepa" and run.split == "train")
    crowd = tuple(dataclasses.replace(gepa, run_id=f"run-{900 + i}") for i in range(12))  # 12 runs, one point
    figure = draw_run(dataclasses.replace(rundir, runs=rundir.runs + crowd))
    boxes = _assert_readable(figure)
    # the places around the point that overlap nothing are used; the labels left over are left out
    assert 1 <= sum(name.startswith("#9") for name in boxes) < len(crowd)


def test_equal_baselines_show_both_colours(gepa_run):
    directory, _ = gepa_run
    rundir = read_run_directory(directory)
    train = next(run for run in rundir.runs if run.label == "baseline" and run.split == "train")
    runs = tuple(
        dataclasses.replace(run, records=train.records, requested_count=train.requested_count)
        if run.label == "baseline" and run.split == "val"
        else run
        for run in rundir.runs
    )
    figure = draw_run(dataclasses.replace(rundir, runs=runs))
    [axes] = figure.axes
    baselines = [line for line in axes.lines if line.get_label().startswith("unchanged program")]
    assert len(baselines) == 2 and baselines[0].get_ydata()[0] == baselines[1].get_ydata()[0]
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    buffer.seek(0)
    pixels = image.imread(buffer, format="png")[..., :3]
    _, y = axes.transData.transform((0, train.score))
    height, width = pixels.shape[:2]
    left, right = axes.get_window_extent().x0, axes.get_window_extent().x1
    row = pixels[height - round(y) - 1 : height - round(y) + 2, int(left + 0.5 * (right - left)) : int(right) - 5]
    row = row.reshape(-1, 3)

    def near(colour):  # the line's colour, whatever alpha blends it with the white axes
        direction = (1 - colour) / np.linalg.norm(1 - colour)
        offsets = 1 - row
        along = offsets @ direction
        return int(((np.linalg.norm(offsets - np.outer(along, direction), axis=1) < 0.05) & (along > 0.3)).sum())

    assert near(TRAIN_BLUE) > 20 and near(VAL_RED) > 20
