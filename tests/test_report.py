"""Reading run directories back for a person: the report command, the picture, the detailed results and the
trajectory display, on a finished run (a real scripted compile), a run whose returned instructions GEPA made from
a proposal (their ancestry), a run killed mid-evaluation (SIGKILL) and an empty directory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image
from rich.console import Console
from support.fakes import FunctionLM
from support.lineage import REWORDED, compile_with_lineage
from support.optimizing import TURNS, compile_tickets, killed_in_validation_script
from support.processes import ROOT, kill_group, start_script, wait_for_file
from support.readonly import read_only_filesystem, tree_bytes
from support.tickets import POLICY_PROMPT, RouteTicket, task_lm_reply

from rlmoptimizer import ConfigurationError
from rlmoptimizer.__main__ import main
from rlmoptimizer.report.lineage import UNCHANGED
from rlmoptimizer.report.plot import draw_run
from rlmoptimizer.report.results import DetailedResults
from rlmoptimizer.report.rundir import read_run_directory
from rlmoptimizer.report.trajectory import Trajectory

STAR = np.array([0xF2, 0xB7, 0x05]) / 255  # the colour of the "returned" mark


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A run directory left by a real compile(): baselines, a re-run of the failures, a validation check, submit."""
    directory = tmp_path_factory.mktemp("finished") / "run"
    return directory, compile_tickets(TURNS, run_storage_dir=directory)


@pytest.fixture(scope="module")
def gepa_from_a_proposal(tmp_path_factory):
    """A run directory whose returned program is gepa-1, made by run_gepa from proposal-1 (support.lineage)."""
    directory = tmp_path_factory.mktemp("lineage") / "run"
    return directory, compile_with_lineage(directory)


def picture_pixels(path: Path) -> np.ndarray:
    pixels = image.imread(str(path))
    assert pixels.shape[:2] == (450, 800)  # 8x4.5 in at 100 dpi: readable at a notebook's default size
    assert pixels[..., :3].std() > 0.05  # not a blank canvas
    return pixels[..., :3]


def has_colour(pixels: np.ndarray, colour: np.ndarray) -> bool:
    return bool((np.abs(pixels - colour).max(axis=-1) < 0.03).sum() > 20)


@pytest.mark.slow
def test_compile_leaves_the_picture_and_attaches_detailed_results(finished, tmp_path):
    directory, optimized = finished
    pixels = picture_pixels(directory / "run.png")  # written by compile() itself
    assert has_colour(pixels, STAR)
    assert optimized.detailed_results == DetailedResults.from_run_directory(directory)
    assert optimized.detailed_results.best_instructions == optimized.optimized_dspy_program
    # MIPROv2's scale for code written for it (dspy.Evaluate's percentage), dspy.GEPA's mean in detailed_results
    assert optimized.score == round(100 * optimized.selection["chosen_score"], 2)
    [best, baseline] = optimized.candidate_programs
    assert best["score"] == optimized.score and baseline["score"] == round(
        100 * optimized.selection["baseline_score"], 2
    )
    assert best["program"].route.signature.instructions == POLICY_PROMPT
    assert baseline["program"].route.signature.instructions == RouteTicket().route.signature.instructions
    # the returned program is still the same ordinary module: the candidates are not among its predictors
    assert [name for name, _ in optimized.named_predictors()] == ["summarize.predict", "route"]
    assert isinstance(optimized.agent_trajectory, Trajectory)
    optimized.save(str(tmp_path / "program.json"))
    loaded = RouteTicket()
    loaded.load(str(tmp_path / "program.json"))
    assert loaded.route.signature.instructions == POLICY_PROMPT


@pytest.mark.slow
def test_report_of_a_finished_run(finished, capsys):
    directory, optimized = finished
    (directory / "run.png").unlink()
    assert main(["report", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "status: finished" in out
    budget = optimized.budget
    assert f"budget: {budget['spent']} of {budget['limit']} units spent" in out
    assert "LM usage and cost" in out  # the offline LMs have no price: the tokens are shown, the dollars unknown
    assert "total cost: unknown (no price for" in out and "$" not in out.split("LM usage and cost")[1][:2000]
    for log in optimized.trial_logs:  # every run with its score
        assert log["run_id"] in out and f"{log['score']:.3f}" in out
    assert "returned" in out and "prompt versions (1)" in out
    assert f"returned {optimized.selection['chosen_run_id']}" in out
    pixels = picture_pixels(directory / "run.png")
    assert has_colour(pixels, STAR)


@pytest.mark.slow
def test_report_shows_usage_and_cost_when_result_json_has_them(finished, tmp_path, capsys):
    directory, _ = finished
    copy = tmp_path / "run"
    shutil.copytree(directory, copy)
    (copy / "run.png").unlink(missing_ok=True)
    result = json.loads((copy / "result.json").read_text())
    result["usage"] = {"root": {"calls": 4, "cost": 0.125}, "eval": {"calls": 56, "cost": 0.5}}
    (copy / "result.json").write_text(json.dumps(result))
    assert main(["report", str(copy), "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "total cost: $0.6250" in out and "root" in out and "eval" in out
    assert not (copy / "run.png").exists()
    assert DetailedResults.from_run_directory(copy).cost == 0.625


@pytest.mark.slow
def test_detailed_results_give_what_gepa_and_miprov2_users_look_for(finished):
    directory, optimized = finished
    results = DetailedResults.from_run_directory(directory, program=RouteTicket())
    initial = RouteTicket().route.signature.instructions
    assert [c["route"] for c in results.instructions] == [initial, POLICY_PROMPT]
    assert results.val_aggregate_scores == [optimized.selection["baseline_score"], optimized.selection["chosen_score"]]
    assert results.best_idx == 1 and results.best_instructions["route"] == POLICY_PROMPT
    assert results.best_candidate.route.signature.instructions == POLICY_PROMPT  # dspy.GEPA's: the program
    assert results.score == optimized.selection["chosen_score"]
    # train scores per example: every example for the unchanged program, the re-run failures for the new prompt
    baseline_train = optimized.trial_logs[0]
    assert len(results.train_subscores[0]) == baseline_train["evaluated_count"]
    failed = sorted(i for i, s in results.train_subscores[0].items() if s < 1)
    assert sorted(results.train_subscores[1]) == failed and all(s == 1.0 for s in results.train_subscores[1].values())
    # the new prompt is best on the failures, the unchanged one is the only one seen on the rest: both on the front
    assert results.pareto_front == [0, 1]
    assert all(results.per_train_example_best_candidates[i] == {1} for i in failed)
    # MIPROv2's names: candidates evaluated on the whole selection split, best first, as programs
    programs = results.candidate_programs
    assert [p["score"] for p in programs] == [round(100 * s, 2) for s in sorted(results.val_aggregate_scores)[::-1]]
    assert programs[0]["program"].route.signature.instructions == POLICY_PROMPT and programs[0]["full_eval"] is True
    assert results.budget == optimized.budget and results.run_storage_dir == results.log_dir == str(directory)
    # before each candidate was first evaluated: nothing for the unchanged program; the baselines' metric calls (and
    # no budget unit: baselines are not charged) for the new prompt, as gepa counts them
    baselines = sum(log["evaluated_count"] for log in optimized.trial_logs if log["label"] == "baseline")
    assert results.discovery_eval_counts == [0, baselines] and results.discovery_budget == (0, 0) and baselines > 0
    data = json.loads(json.dumps(results.to_dict()))
    assert data["pareto_front"] == [0, 1] and data["best_idx"] == 1 and data["status"] == "finished"
    with pytest.raises(ConfigurationError, match="program"):
        _ = DetailedResults.from_run_directory(directory).candidate_programs[0]


@pytest.mark.slow
def test_the_trajectory_reads_turn_by_turn_and_stays_a_plain_list(finished):
    _, optimized = finished
    trajectory = Trajectory(optimized.agent_trajectory)
    assert trajectory == optimized.agent_trajectory and isinstance(trajectory, list)
    assert json.loads(json.dumps(trajectory)) == json.loads(json.dumps(list(optimized.agent_trajectory)))
    html = trajectory._repr_html_()
    assert html.count("<tr>") == len(trajectory) + 1  # a header and one short row per turn
    assert "val &lt;b&gt;" in html and "val <b>" not in html  # the agent's text is escaped
    assert "(submitted)" in html
    long = Trajectory([{"iteration": 1, "reasoning": "r", "code": "x = 1\n" * 500, "output": "y" * 20_000}])
    assert len(long._repr_html_()) < 2_000  # a short form per turn, not a wall of text
    assert long.show(1).__repr__().count("x = 1") == 500  # show(i) gives the whole turn
    console = Console(record=True, width=120)
    console.print(trajectory)
    console.print(trajectory.show(-1))
    text = console.export_text()
    assert "agent turn 4 (submitted)" in text and "SUBMIT" in text


def test_report_of_an_empty_directory_and_of_no_directory(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "status: empty" in out
    assert not (tmp_path / "run.png").exists()
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert DetailedResults.from_run_directory(tmp_path).instructions == ()


def assert_report_reads_only(directory: Path, tmp_path: Path) -> str:
    """Run the report twice on ``directory``: in this process with every write refused (``--no-plot``), and as
    ``python -m rlmoptimizer report`` in its own process. Neither changes a byte of the run's files; the command
    adds the picture, run.png, and nothing else. The command's output."""
    before = tree_bytes(directory)
    with read_only_filesystem() as attempts:
        assert main(["report", str(directory), "--no-plot"]) == 0
    assert attempts == []
    assert tree_bytes(directory) == before
    done = subprocess.run(
        [sys.executable, "-m", "rlmoptimizer", "report", str(directory)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    after = tree_bytes(directory)
    assert {path: data for path, data in after.items() if path != "run.png"} == {
        path: data for path, data in before.items() if path != "run.png"
    }
    assert "run.png" in after
    return done.stdout


def test_a_picture_that_cannot_be_written_leaves_the_summary_whole(finished, tmp_path, capsys):
    """Regression: the picture was written before the summary was printed, through one fixed temporary name: a run
    directory that could not take it (read-only, a full disk), or two reports at once, printed no summary at all."""
    directory, optimized = finished
    copy = Path(shutil.copytree(directory, tmp_path / "run"))
    (copy / "run.png").unlink()
    (copy / "run.png").mkdir()  # in the way: the picture cannot be written there, even by root
    assert main(["report", str(copy)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "status: finished" in out and f"returned {optimized.selection['chosen_run_id']}" in out
    assert "run.png could not be written" in out and "--out PATH.png" in out
    assert not [p.name for p in copy.iterdir() if p.name.endswith(".tmp")]  # nothing half-written left behind


def test_what_an_lm_wrote_reaches_the_terminal_written_out_not_acted_on(finished, tmp_path, capsys):
    """Regression: instructions and notes an LM wrote were printed as they were: an escape sequence in them could
    retitle the terminal or hide text, and a NUL went out raw."""
    directory, _ = finished
    copy = Path(shutil.copytree(directory, tmp_path / "run"))
    version = copy / "prompts" / "v-0001.json"
    data = json.loads(version.read_text())
    version.write_text(json.dumps({**data, "text": "Route \x1b]0;pwned\x07 tickets\x00 \x1b[8mhidden\x1b[0m"}))
    assert main(["report", str(copy), "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "\x1b]" not in out and "\x00" not in out and "\x07" not in out
    assert "\\x1b]0;pwned\\x07 tickets\\x00" in out


@pytest.mark.slow
def test_the_report_reads_a_finished_run_and_writes_nothing_but_its_picture(finished, tmp_path):
    directory, optimized = finished
    copy = Path(shutil.copytree(directory, tmp_path / "run"))
    (copy / "run.png").unlink()
    out = assert_report_reads_only(copy, tmp_path)
    assert "status: finished" in out and f"returned {optimized.selection['chosen_run_id']}" in out


def test_a_run_directory_named_in_a_script_the_plots_font_lacks_draws_without_warnings(finished, tmp_path):
    """Regression: a directory named ``日本語 ✓`` made matplotlib warn "Glyph ... missing from font" six times."""
    import warnings

    from rlmoptimizer.report.plot import write_run_picture

    directory, _ = finished
    copy = Path(shutil.copytree(directory, tmp_path / "rüns" / "日本語 ✓"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = write_run_picture(copy)
    picture_pixels(written)


@pytest.mark.slow
def test_report_of_a_run_killed_mid_evaluation(tmp_path, capsys):
    directory, marker = tmp_path / "run", tmp_path / "in-validation"
    process = start_script(tmp_path, "killed", killed_in_validation_script(str(directory), str(marker), after=4))
    try:
        wait_for_file(marker, process)  # the agent's validation run has 4 records and waits on the 5th example
        in_flight = read_run_directory(directory)  # while the compile() holds the directory
        in_flight_out = assert_report_reads_only(directory, tmp_path)
    finally:
        assert kill_group(process) == -signal.SIGKILL
    assert in_flight.status == "in flight" and in_flight.holder["pid"] == process.pid
    [pending] = in_flight.pending
    assert pending.split == "val" and pending.label == "agent" and pending.evaluated_count == 4
    assert "status: in flight" in in_flight_out
    assert_report_reads_only(directory, tmp_path)  # and after the kill
    capsys.readouterr()

    # a record being written when the process died: a torn last line is not read
    pending_file = next((directory / "runs").glob("pending-*.jsonl"))
    with pending_file.open("a") as handle:
        handle.write('{"example_id": 7, "inputs": {"ticket": "half wri')
    rundir = read_run_directory(directory)
    assert rundir.status == "interrupted" and rundir.result is None and rundir.problems == ()
    [pending] = rundir.pending
    assert pending.split == "val" and pending.label == "agent" and pending.evaluated_count == 4

    assert main(["report", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "status: interrupted" in out and "resume" in out
    assert "unfinished" in out and "stopped after 4 of 8" in " ".join(out.split())
    assert "selection: none yet" in out
    pixels = picture_pixels(directory / "run.png")
    assert not has_colour(pixels, STAR)  # nothing returned yet
    results = DetailedResults.from_run_directory(directory)
    assert results.status == "interrupted" and results.best_idx is None and results.score is None
    # the unchanged program is a candidate; the re-run with the new prompt, on a few examples, is listed apart
    assert len(results.instructions) == len(results.val_aggregate_scores) == 1
    assert [u["run_ids"] for u in results.unscored] == [["run-0003"]] and results.unscored[0]["parents"] == [None]

    # the killed holder's pid now belongs to a live process (a container's pid 1, say): the free lock says it is dead
    holder = json.loads((directory / "holder.json").read_text())
    (directory / "holder.json").write_text(json.dumps({**holder, "pid": os.getpid()}))
    assert read_run_directory(directory).status == "interrupted"


@pytest.mark.slow
def test_the_report_shows_what_the_run_spent_from_the_usage_meter(tmp_path, capsys):
    """The report reads the cost the usage meter wrote: result.json's at the end, usage.json's while running or
    after an interruption (here: result.json removed, as a killed run leaves it)."""
    directory = tmp_path / "run"
    optimized = compile_tickets(
        TURNS, run_storage_dir=directory, eval_lm=FunctionLM(task_lm_reply, name="openai/gpt-4o-mini")
    )  # litellm has its price
    spent = optimized.usage["total"]["cost_usd"]
    assert spent is None  # the scripted root LM has no price, so the total is unknown, never made up
    eval_cost = optimized.usage["eval"]["cost_usd"]
    assert eval_cost is not None and eval_cost > 0
    assert read_run_directory(directory).usage["eval"]["cost_usd"] == pytest.approx(eval_cost)
    (directory / "result.json").unlink()
    rundir = read_run_directory(directory)
    assert rundir.status == "interrupted"
    assert rundir.usage["eval"]["cost_usd"] == pytest.approx(eval_cost)  # from usage.json
    assert main(["report", str(directory), "--no-plot"]) == 0
    assert "LM usage and cost" in capsys.readouterr().out


@pytest.mark.slow
def test_detailed_results_name_each_candidate_and_give_the_returned_ones_ancestry(gepa_from_a_proposal):
    directory, optimized = gepa_from_a_proposal
    stored = json.loads((directory / "candidates.json").read_text())["lineage"]
    results = DetailedResults.from_run_directory(directory)
    assert optimized.detailed_results == results
    # each id stands for the instruction set it names: proposal-1 keeps only the step it wrote
    p1 = results.instructions.index({**results.instructions[0], "route": REWORDED})
    best = results.best_idx
    assert results.instructions[best]["route"] == POLICY_PROMPT
    assert results.candidate_ids[p1] == ("proposal-1",) and results.candidate_ids[best] == ("gepa-1",)
    assert results.candidate_ids[0] == ()
    kept = {name: entry for name, entry in results.lineage.items() if "(not kept" not in entry["move"]}
    assert kept == {
        "proposal-1": {**stored["proposal-1"], "candidate": p1},
        "gepa-1": {**stored["gepa-1"], "candidate": best},
    }
    for name, entry in results.lineage.items():  # children GEPA did not keep: evaluated in part, made from a parent
        assert entry == {**stored[name], "candidate": entry["candidate"]}
        if entry["candidate"] is None:
            (unscored,) = [u for u in results.unscored if name in u["candidate_ids"]]
            assert unscored["parents"] != [None] and unscored["run_ids"]
        else:
            assert results.parents[entry["candidate"]] != [None]
    assert all(isinstance(score, float) for score in results.val_aggregate_scores)  # dspy.GEPA's code reads them
    assert int(np.argmax(results.val_aggregate_scores)) == best
    assert results.candidate_lineage(best) == {"gepa-1": results.lineage["gepa-1"]}

    # the ancestry: the unchanged program, the proposal GEPA started from, GEPA's candidate (returned)
    ancestry = results.ancestry
    assert [n["label"] for n in ancestry] == [UNCHANGED, "proposal-1", "gepa-1"]
    assert [n["candidate"] for n in ancestry] == [0, p1, best]
    assert [n["generation"] for n in ancestry] == [0, 1, 2]
    assert [n["parents"] for n in ancestry] == [[], [UNCHANGED], ["proposal-1"]]
    assert [n["move"] for n in ancestry] == [
        "the program as given",
        "reflective proposal (propose_instructions)",
        "gepa reflective proposal",
    ]
    assert ancestry[2]["run"] == "gepa run 1" and [n["changed_steps"] for n in ancestry] == [[], ["route"], ["route"]]
    # proposal-1 reflected on the unchanged program's train failures (the two disputes), gepa-1 on a minibatch
    failures = sorted(i for i, s in results.train_subscores[0].items() if s < 1)
    assert ancestry[1]["reflected_on"] == failures == [3, 8]
    assert ancestry[2]["reflected_on"] == stored["gepa-1"]["reflected_on"] and len(ancestry[2]["reflected_on"]) == 3
    assert [n["val_score"] for n in ancestry] == [0.5, 0.5, 1.0] == [n["score"] for n in ancestry]
    assert [n["returned"] for n in ancestry] == [False, False, True]
    assert results.returned_candidate_id == "gepa-1"
    data = json.loads(json.dumps(results.to_dict()))
    assert [n["label"] for n in data["ancestry"]] == [UNCHANGED, "proposal-1", "gepa-1"]
    assert data["candidate_ids"][best] == ["gepa-1"] and data["lineage"]["gepa-1"]["parents"] == ["proposal-1"]


@pytest.mark.slow
def test_the_report_says_where_the_returned_instructions_came_from(gepa_from_a_proposal, capsys):
    directory, _ = gepa_from_a_proposal
    reflected = json.loads((directory / "candidates.json").read_text())["lineage"]["gepa-1"]["reflected_on"]
    assert main(["report", str(directory), "--no-plot"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    section = out.split("where the returned instructions came from", 1)[1]
    assert section.startswith(
        " 0. the unchanged program; validation 0.500"
        " 1. proposal-1: reflective proposal (propose_instructions), from the unchanged program; changed route;"
        " reflected on train 3, 8; validation 0.500"
        " 2. gepa-1: gepa reflective proposal in gepa run 1, from proposal-1; changed route; reflected on train "
        + ", ".join(map(str, reflected))
        + "; validation 1.000 (returned)"
    ), section[:600]


@pytest.mark.slow
def test_the_picture_joins_the_returned_candidates_ancestors(gepa_from_a_proposal):
    directory, optimized = gepa_from_a_proposal
    axes = draw_run(directory).axes[0]
    rundir = read_run_directory(directory)
    at = {run.run_id: (rundir.spent_after(run), run.score) for run in rundir.runs}
    # each ancestor at the run that scored it on validation: the baseline, the agent's check of proposal-1, the
    # returned run
    baseline = next(
        log["run_id"] for log in optimized.trial_logs if log["label"] == "baseline" and log["split"] == "val"
    )
    proposal = next(log["run_id"] for log in optimized.trial_logs if log["label"] == "agent" and log["split"] == "val")
    chosen = optimized.selection["chosen_run_id"]
    lines = [line for line in axes.lines if line.get_linestyle() == ":"]
    assert [list(zip(line.get_xdata(), line.get_ydata(), strict=True)) for line in lines] == [
        [at[baseline], at[proposal]],
        [at[proposal], at[chosen]],
    ]
    assert lines[0].get_label() == "ancestry of the returned candidate"
    assert [t.get_text() for t in axes.texts if t.get_gid() == "ancestry"] == ["unchanged", "proposal-1", "gepa-1"]
    pixels = picture_pixels(directory / "run.png")  # compile() drew it
    assert has_colour(pixels, np.array([0x2C, 0xA0, 0x2C]) / 255)


def test_a_turn_the_default_loop_took_actions_in_says_so_in_the_table_and_in_full():
    """Regression: a turn after which the pilot spent most of the budget and submitted showed only the agent's
    failed cell in the notebook's table, and "(submitted)" as if the agent had submitted."""
    turns = [
        {
            "iteration": 1,
            "reasoning": "r",
            "code": "x = (",
            "output": "[Error] SyntaxError",
            "pilot": ["run_gepa(budget=68)"],
        },
        {
            "iteration": 2,
            "reasoning": "r",
            "code": "",
            "output": "FINAL: ...",
            "final": True,
            "pilot": ["analyze_failures()", "SUBMIT(...)"],
            "submitted_by": "the default loop's submission",
        },
    ]
    trajectory = Trajectory(turns)
    rows = trajectory.summary_rows()
    assert rows[0]["turn"] == "1 (+ the default loop: 1 action(s))"
    assert rows[1]["turn"] == "2 (+ the default loop: 2 action(s)) (final: the default loop's submission)"
    shown = repr(trajectory.show(1))  # the turn the table numbers 1
    assert shown.startswith("turn 1") and "--- the default loop's actions ---\nrun_gepa(budget=68)" in shown
    assert repr(trajectory.show()).startswith("turn 2") and repr(trajectory.show(-2)).startswith("turn 1")
    for missing in (0, 3, -3):
        with pytest.raises(IndexError, match=f"no turn {missing}: this trajectory has turns 1 to 2"):
            trajectory.show(missing)
    console = Console(record=True, width=120)
    console.print(trajectory.show(2))
    text = console.export_text()
    assert "the default loop's actions" in text and "analyze_failures()" in text
    assert "(submitted)" in Trajectory([{**turns[0], "final": True, "pilot": []}]).summary_rows()[0]["turn"]
