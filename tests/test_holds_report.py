"""What a run directory holds never makes the report raise, and a log torn at any byte loses none of the records
before the tear.

Regressions: files that parse but have the wrong shape (a ledger without ``limit``, ``{"budget_limit": "lots"}``, a
``selection`` that is a string) made ``python -m rlmoptimizer report`` print a traceback and exit 1; a pending log
torn inside a multi-byte UTF-8 character (written with ``ensure_ascii=False``) made the report and a resumed
``compile()`` raise ``UnicodeDecodeError``, recovering nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import dspy
import pytest
from support.fakes import FunctionLM, scripted_agent
from support.tickets import POLICY_PROMPT, TICKETS, RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import RLMDocstringOptimizer, RLMOptimizerError
from rlmoptimizer.__main__ import main
from rlmoptimizer.report import DetailedResults, read_run_directory

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TURNS = [
    {
        "reasoning": "fix",
        "code": f"update_prompt('route', {POLICY_PROMPT!r})\nprint(evaluate_program(split='val')['score'])",
    },
    {"reasoning": "submit", "code": f"SUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})"},
]
POLICY_INSTRUCTIONS = {
    "summarize.predict": RouteTicket().summarize.predict.signature.instructions,
    "route": POLICY_PROMPT,
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    directory = tmp_path_factory.mktemp("finished") / "run"
    trainset, valset = make_splits()
    RLMDocstringOptimizer(
        max_iterations=2, root_lm=scripted_agent(TURNS), eval_lm=FunctionLM(task_lm_reply), run_storage_dir=directory
    ).compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)
    return directory


# (file, how to damage what it holds): each parses as JSON and has the wrong shape
DAMAGES = [
    ("ledger.json", lambda real: {"spent": 3, "left": 29}),
    ("ledger.json", lambda real: {"limit": "lots", "spent": 0, "left": 0}),
    ("ledger.json", lambda real: [1, 2, 3]),
    ("ledger.json", lambda real: {**real, "spent_by_kind": "everything"}),
    ("manifest.json", lambda real: {**real, "budget_limit": "lots"}),
    ("manifest.json", lambda real: ["not", "a", "manifest"]),
    ("manifest.json", lambda real: {**real, "created_at": "yesterday"}),
    ("result.json", lambda real: {**real, "selection": "chosen"}),
    (
        "result.json",
        lambda real: {
            **real,
            "selection": {**real["selection"], "chosen_score": "high", "baseline_score": [1], "candidates": "all"},
        },
    ),
    ("result.json", lambda real: {**real, "selection": {**real["selection"], "candidates": [{"run_id": ["x"]}, 7]}}),
    ("result.json", lambda real: {**real, "budget": {"limit": "x"}}),
    ("result.json", lambda real: {**real, "usage": {"total": "x", "eval": {"calls": "many", "unpriced_models": 5}}}),
    ("result.json", lambda real: {**real, "optimized_dspy_program": ["route"]}),
    ("result.json", lambda real: {**real, "optimized_dspy_program": {"route": 3}}),
    ("result.json", lambda real: "finished"),
    ("usage.json", lambda real: [0.5]),
    ("usage.json", lambda real: {"total": {"cost_usd": "1", "unpriced_models": 7}}),
    ("runs/run-0003.json", lambda real: {**real, "label": 5}),
    ("runs/run-0003.json", lambda real: {**real, "split": "test"}),
    ("runs/run-0003.json", lambda real: {**real, "run_id": ["run-0003"]}),
    ("runs/run-0003.json", lambda real: {**real, "instructions": {"route": 5}}),
    ("runs/run-0003.json", lambda real: {**real, "records": [{**real["records"][0], "score": "NaN"}]}),
    ("runs/run-0003.json", lambda real: {**real, "records": "all of them"}),
    ("prompts/v-0001.json", lambda real: ["text"]),
    ("turns/turn-0001.json", lambda real: 42),
    ("turns/turn-0002.json", lambda real: {**real, "final": "yes", "created_at": "noon"}),
    ("holder.json", lambda real: {"pid": "me", "host": 5}),
    ("candidates.json", lambda real: ["gepa-1", "gepa-2"]),
    (
        "candidates.json",
        lambda real: {
            "candidates": {"gepa-1": {"route": "x"}, "gepa-2": "text"},
            "lineage": {
                "gepa-1": {"parents": "current", "move": 5, "reflected_on": ["3"]},
                "gepa-2": {"parents": ["gepa-2"], "move": "a cycle"},
            },
        },
    ),
]


@pytest.mark.parametrize(("name", "damage"), DAMAGES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(DAMAGES)])
def test_a_file_of_the_wrong_shape_is_named_never_a_traceback(finished, tmp_path, capsys, name, damage):
    directory = Path(shutil.copytree(finished, tmp_path / "run"))
    path = directory / name
    real = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(damage(real)))

    assert main(["report", str(directory), "--out", str(tmp_path / "run.png")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (tmp_path / "run.png").stat().st_size > 0
    rundir = read_run_directory(directory)
    if name != "holder.json":  # a holder is only a hint of who runs the directory
        assert rundir.problems and "skipped:" in out and Path(name).name in out
    DetailedResults.from_run_directory(directory, program=RouteTicket()).to_dict()


def test_the_report_command_prints_no_traceback_for_a_damaged_directory(finished, tmp_path):
    directory = Path(shutil.copytree(finished, tmp_path / "run"))
    damaged = set()
    for name, damage in DAMAGES:  # the first damage of each file, all at once
        path = directory / name
        if name not in damaged and path.exists():
            path.write_text(json.dumps(damage(json.loads(path.read_text()))))
            damaged.add(name)
    done = subprocess.run(
        [sys.executable, "-m", "rlmoptimizer", "report", str(directory), "--no-plot"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr + done.stdout, done.stderr
    assert "skipped:" in done.stdout


def _record(example_id: int) -> dict:
    ticket, queue = TICKETS[example_id]
    return {
        "example_id": example_id,
        "inputs": {"ticket": ticket},
        "expected": {"queue": queue},
        "predicted": {"queue": queue},
        "score": 1.0,
        "passed": True,
        "feedback": f"réponse exacte ☕ {example_id}",
        "error": None,
        "error_kind": None,
        "steps": [],
    }


def test_a_log_torn_inside_a_multibyte_character_loses_only_the_torn_record(tmp_path, capsys):
    trainset, valset = make_splits()
    directory = tmp_path / "run"
    with pytest.raises(RLMOptimizerError):  # stopped after the baselines: the root LM's key is revoked
        RLMDocstringOptimizer(
            max_iterations=2,
            root_lm=FunctionLM(lambda m: dspy.LMAuthError("invalid api key")),
            eval_lm=FunctionLM(task_lm_reply),
            run_storage_dir=directory,
        ).compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)

    # the log of an evaluation killed while it wrote its third record, cut inside the 3-byte "☕"
    header = {
        "label": "agent",
        "split": "train",
        "instructions": POLICY_INSTRUCTIONS,
        "requested": 4,
        "charged": True,
        "rollout": 0,
    }
    lines = [json.dumps(item, ensure_ascii=False).encode() for item in (header, _record(0), _record(1), _record(2))]
    torn = lines[3][: lines[3].index("☕".encode()) + 2]
    (directory / "runs" / "pending-torn.jsonl").write_bytes(b"\n".join(lines[:3]) + b"\n" + torn)

    assert main(["report", str(directory), "--no-plot"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "status: interrupted" in out and "stopped after 2 of 4 examples" in out
    [pending] = read_run_directory(directory).pending
    assert [r.feedback for r in pending.records] == ["réponse exacte ☕ 0", "réponse exacte ☕ 1"]

    # resuming recovers the two records: an evaluation of the same instructions reuses them, paying for one
    task = FunctionLM(task_lm_reply)
    resumed = RLMDocstringOptimizer(
        max_iterations=2,
        eval_lm=task,
        run_storage_dir=directory,
        root_lm=scripted_agent(
            [
                {
                    "reasoning": "again",
                    "code": f"update_prompt('route', {POLICY_PROMPT!r})\n"
                    "r = evaluate_program(ids=[0, 1, 2])\n"
                    "print(r['budget_spent'], r['examples'][0]['feedback'])",
                },
                {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program={})"},
            ]
        ),
    ).compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)
    [recovered] = [log for log in resumed.trial_logs if log["label"] == "agent:recovered"]
    assert (recovered["split"], recovered["evaluated_count"], recovered["requested_count"]) == ("train", 2, 4)
    assert resumed.agent_trajectory[0]["output"].strip() == "1 réponse exacte ☕ 0"
    assert not list((directory / "runs").glob("pending-*"))
