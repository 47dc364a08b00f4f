"""MLflow tracking against a real local store (SQLite file in a temporary directory), read back with MlflowClient."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sqlite3
import sys
from pathlib import Path

import pytest
from support.analysing import GROUP, compile_with_analysis
from support.fakes import FunctionLM, scripted_agent
from support.lineage import compile_with_lineage
from support.optimizing import TURNS, compile_tickets

from rlmoptimizer import ConfigurationError, RLMDocstringOptimizer
from rlmoptimizer.records import EvalRun, ExampleResult


@pytest.fixture(scope="module")
def mlflow():
    """MLflow, for the tests that need it. CI installs the mlflow extra: there a missing MLflow is a failure, not a
    skip. The tests of what happens without MLflow need no fixture and always run."""
    return importlib.import_module("mlflow") if os.environ.get("CI") else pytest.importorskip("mlflow")


@pytest.fixture
def store(tmp_path, mlflow):
    """A fresh SQLite tracking store and experiment, set the usual MLflow way; the global MLflow state is restored."""
    previous = mlflow.get_tracking_uri()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("rlmoptimizer-test", artifact_location=(tmp_path / "artifacts").as_uri())
    mlflow.set_experiment(experiment_id=experiment)
    yield {"uri": uri, "experiment_id": experiment, "db": tmp_path / "mlflow.db", "artifacts": tmp_path / "artifacts"}
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(previous)


def run(number: int, split: str, scores: list[float], left: int) -> EvalRun:
    records = tuple(
        ExampleResult(
            example_id=i,
            inputs={"q": str(i)},
            expected={"a": "x"},
            predicted={"a": "x" if s else "y"},
            score=s,
            passed=s >= 1.0,
        )
        for i, s in enumerate(scores)
    )
    return EvalRun(
        run_id=f"run-{number:04d}",
        split=split,
        label="agent",
        instructions={"step": f"v{number}"},
        records=records,
        requested_count=len(scores),
        budget_spent=len(scores),
        budget_left=left,
    )


def artifact_paths(client, run_id, path=None):
    found = []
    for item in client.list_artifacts(run_id, path):
        found += artifact_paths(client, run_id, item.path) if item.is_dir else [item.path]
    return sorted(found)


def test_use_mlflow_without_mlflow_names_the_extra(monkeypatch):
    from rlmoptimizer.report.tracking import MlflowTracker

    monkeypatch.setitem(sys.modules, "mlflow", None)  # what an environment without the extra looks like
    with pytest.raises(ConfigurationError, match=r'pip install "rlmoptimizer\[mlflow\]"'):
        MlflowTracker()


def test_the_tracker_logs_params_steps_turns_versions_and_artifacts_nested_under_the_active_run(
    store, tmp_path, mlflow
):
    from rlmoptimizer.report.tracking import MlflowTracker

    picture = tmp_path / "run.png"
    picture.write_bytes(b"\x89PNG fake bytes are enough for an artifact")
    with mlflow.start_run(run_name="user's run") as parent:
        tracker = MlflowTracker()
        tracker.compile_started({"max_iterations": 2, "budget_limit": 32, "root_lm": "openai/gpt-4o", "sub_lm": None})
        tracker.evaluation_finished(run(1, "train", [1, 0, 1, 1], 32), {"spent": 0, "left": 32})
        tracker.agent_turn({"iteration": 1, "reasoning": "look", "code": "print(1)", "output": "1", "final": False})
        tracker.prompt_updated(
            {"version": 1, "step": "step", "text": "new", "previous": "old", "source": "update_prompt"}
        )
        tracker.evaluation_finished(run(2, "train", [1], 31), {"spent": 1, "left": 31}, cost=0.25)
        tracker.evaluation_finished(run(3, "val", [1, 1, 0, 1], 27), {"spent": 5, "left": 27}, cost=0.5)
        tracker.agent_turn({"iteration": 2, "reasoning": "submit", "code": "SUBMIT()", "output": "", "final": True})
        selection = {
            "split": "val",
            "chosen_run_id": "run-0003",
            "chosen_score": 0.75,
            "baseline_score": 0.5,
            "reason": "better",
        }
        lineage = {
            "returned": "gepa-1",
            "lineage": {"gepa-1": {"parents": ["current"], "move": "gepa merge"}},
            "ancestry": [{"label": "the unchanged program"}, {"label": "gepa-1"}],
            "candidate_ids": [[], ["gepa-1"]],
        }
        tracker.compile_finished(
            instructions={"step": "v3"},
            selection=selection,
            trajectory=[{"iteration": 1}],
            picture=picture,
            detailed_results={"best_idx": 1},
            budget={"spent": 5},
            lineage=lineage,
        )
        assert mlflow.active_run().info.run_id == parent.info.run_id  # ours closed, the user's still active

    client = mlflow.MlflowClient(store["uri"])
    logged = client.get_run(tracker.run_id)
    assert logged.info.status == "FINISHED"
    assert logged.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert logged.info.experiment_id == store["experiment_id"]
    assert logged.data.params == {"max_iterations": "2", "budget_limit": "32", "root_lm": "openai/gpt-4o"}
    spent = client.get_metric_history(tracker.run_id, "budget_spent")
    assert [(m.step, m.value) for m in sorted(spent, key=lambda m: m.step)] == [(1, 0), (2, 1), (3, 5)]
    assert [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, "train_score")] == [
        (1, 0.75),
        (2, 1.0),
    ]
    assert [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, "val_score")] == [(3, 0.75)]
    assert [m.value for m in client.get_metric_history(tracker.run_id, "cost_usd")] == [0.25, 0.5]
    assert logged.data.metrics["final_score"] == 0.75
    assert artifact_paths(client, tracker.run_id) == [
        "detailed_results.json",
        "lineage.json",
        "optimized_instructions.json",
        "prompts/v-0001.json",
        "run.png",
        "selection.json",
        "trajectory.json",
        "turns/turn-0001.json",
        "turns/turn-0002.json",
    ]
    assert logged.data.tags["returned_candidate"] == "gepa-1"
    assert logged.data.tags["returned_ancestry"] == "the unchanged program -> gepa-1"
    local = client.download_artifacts(tracker.run_id, "turns/turn-0002.json", str(tmp_path / "down"))
    assert '"final": true' in open(local).read()


def test_a_tracking_store_that_breaks_mid_run_is_reported_once_and_the_run_goes_on(store, caplog, mlflow):
    from rlmoptimizer.report.tracking import MlflowTracker

    tracker = MlflowTracker(run_name="breaks")
    tracker.compile_started({"max_iterations": 1})
    tracker.evaluation_finished(run(1, "train", [1, 0], 10), {"spent": 0, "left": 10})
    with sqlite3.connect(store["db"]) as db:  # the store breaks: its metric table is gone
        db.execute("DROP TABLE metrics")
        db.execute("DROP TABLE latest_metrics")
    with caplog.at_level(logging.WARNING, logger="rlmoptimizer.report.tracking"):
        tracker.evaluation_finished(run(2, "train", [1], 9), {"spent": 1, "left": 9})
        tracker.agent_turn({"iteration": 1, "code": "x", "output": ""})
        tracker.evaluation_finished(run(3, "val", [1, 1], 7), {"spent": 3, "left": 7})
        tracker.compile_finished(instructions={"step": "v"}, selection={"chosen_score": 1.0}, trajectory=[])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "MLflow tracking stopped" in warnings[0].getMessage()
    assert "goes on" in warnings[0].getMessage()
    assert not tracker.active
    assert mlflow.active_run() is None  # the run was closed (popped) even though the store is broken


@pytest.mark.slow
def test_compile_with_use_mlflow_is_logged_to_the_users_store(store, tmp_path, mlflow):
    with mlflow.start_run(run_name="my experiment") as parent:
        optimized = compile_tickets(
            scripted_agent(TURNS, name="scripted-agent"), run_storage_dir=tmp_path / "run", use_mlflow=True
        )

    client = mlflow.MlflowClient(store["uri"])
    [child] = client.search_runs(
        [store["experiment_id"]], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    run_id = child.info.run_id
    assert child.info.status == "FINISHED"
    params = child.data.params
    assert params["max_iterations"] == "2" and params["budget_limit"] == str(optimized.budget["limit"])
    assert params["root_lm"] == "scripted-agent" and params["trainset_size"] == "12" and params["valset_size"] == "8"
    assert params["run_storage_dir"] == str(tmp_path / "run")

    # one metric point per evaluation run, in order (the step is the run number)
    runs = optimized.trial_logs
    left = sorted(client.get_metric_history(run_id, "budget_left"), key=lambda m: (m.timestamp, m.step))
    assert [(m.step, m.value) for m in left] == [(int(r["run_id"][-4:]), r["budget_left"]) for r in runs]
    for split in ("train", "val"):
        history = sorted(client.get_metric_history(run_id, f"{split}_score"), key=lambda m: m.step)
        assert [(m.step, m.value) for m in history] == [
            (int(r["run_id"][-4:]), r["score"]) for r in runs if r["split"] == split
        ]
    assert child.data.metrics["final_score"] == optimized.selection["chosen_score"]

    paths = artifact_paths(client, run_id)
    assert {
        "optimized_instructions.json",
        "selection.json",
        "trajectory.json",
        "detailed_results.json",
        "run.png",
    } <= set(paths)
    assert [p for p in paths if p.startswith("turns/")] == [f"turns/turn-{i:04d}.json" for i in range(1, 5)]
    assert [p for p in paths if p.startswith("prompts/")] == ["prompts/v-0001.json"]
    downloaded = Path(client.download_artifacts(run_id, "optimized_instructions.json", str(tmp_path / "down")))
    assert json.loads(downloaded.read_text()) == optimized.optimized_dspy_program
    picture = Path(client.download_artifacts(run_id, "run.png", str(tmp_path / "down")))
    assert picture.read_bytes() == (tmp_path / "run" / "run.png").read_bytes()


@pytest.mark.slow
def test_compile_logs_where_the_returned_instructions_came_from(store, tmp_path, mlflow):
    """The returned program is gepa-1, which run_gepa made from proposal-1 (support.lineage): MLflow has the chain as
    tags and every candidate's lineage and the ancestry with scores in lineage.json."""
    optimized = compile_with_lineage(tmp_path / "run", use_mlflow=True)

    client = mlflow.MlflowClient(store["uri"])
    [logged] = client.search_runs([store["experiment_id"]])
    assert logged.data.tags["returned_candidate"] == "gepa-1"
    assert logged.data.tags["returned_ancestry"] == "the unchanged program -> proposal-1 -> gepa-1"
    lineage = json.loads(
        Path(client.download_artifacts(logged.info.run_id, "lineage.json", str(tmp_path / "down"))).read_text()
    )
    stored = json.loads((tmp_path / "run" / "candidates.json").read_text())["lineage"]
    assert lineage["returned"] == "gepa-1"
    assert {
        name: {k: v for k, v in entry.items() if k != "candidate"} for name, entry in lineage["lineage"].items()
    } == stored
    assert [(n["label"], n["move"], n["parents"], n["val_score"]) for n in lineage["ancestry"]] == [
        ("the unchanged program", "the program as given", [], 0.5),
        ("proposal-1", "reflective proposal (propose_instructions)", ["the unchanged program"], 0.5),
        ("gepa-1", "gepa reflective proposal", ["proposal-1"], 1.0),
    ]
    assert lineage["ancestry"][2]["reflected_on"] == stored["gepa-1"]["reflected_on"]
    assert lineage == json.loads(json.dumps(optimized.detailed_results.lineage_record()))


@pytest.mark.slow
def test_compile_logs_the_failure_group_a_returned_proposal_was_written_for(store, tmp_path, mlflow):
    """The returned program is proposal-1, written for the largest group of analysis-1 (support.analysing): MLflow's
    lineage.json names the analysis, the group and its example ids, in the lineage and in the ancestry."""
    optimized = compile_with_analysis(tmp_path / "run", use_mlflow=True)

    client = mlflow.MlflowClient(store["uri"])
    [logged] = client.search_runs([store["experiment_id"]])
    assert logged.data.tags["returned_candidate"] == "proposal-1"
    lineage = json.loads(
        Path(client.download_artifacts(logged.info.run_id, "lineage.json", str(tmp_path / "down"))).read_text()
    )
    made_for = {"analysis": "analysis-1", "group": GROUP, "example_ids": [3, 8]}
    assert lineage["lineage"]["proposal-1"]["made_for"] == made_for == lineage["ancestry"][-1]["made_for"]
    assert lineage == json.loads(json.dumps(optimized.detailed_results.lineage_record()))


def test_use_mlflow_is_checked_when_the_optimizer_is_built(monkeypatch):
    with pytest.raises(ConfigurationError, match="use_mlflow must be True or False"):
        RLMDocstringOptimizer(root_lm=FunctionLM(lambda m: "x"), use_mlflow="yes")
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ConfigurationError, match=r"rlmoptimizer\[mlflow\]"):
        RLMDocstringOptimizer(root_lm=FunctionLM(lambda m: "x"), use_mlflow=True)


def _started_against(mlflow, uri, caplog, monkeypatch):
    """A tracker started against the tracking server ``uri``, reached directly (no proxy); MLflow's URI restored."""
    from rlmoptimizer.report.tracking import MlflowTracker

    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        tracker = MlflowTracker()
        with caplog.at_level(logging.WARNING):
            tracker.compile_started({"max_metric_calls": 10})
    finally:
        mlflow.set_tracking_uri(previous)
    return tracker


def test_a_tracking_server_that_does_not_answer_is_given_up_at_once(mlflow, monkeypatch, caplog):
    """Regression: with a tracking server that was down, MLflow's own retries held the compile up for minutes before
    its first evaluation. A server that accepts no connection is now given up at the start, with a warning."""
    import socket

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there any more
    tracker = _started_against(mlflow, f"http://127.0.0.1:{port}", caplog, monkeypatch)
    assert not tracker.active and tracker.run_id is None
    assert f"the tracking server 127.0.0.1:{port} did not answer" in caplog.text
    assert "The optimization goes on" in caplog.text


def _http_server(handler_body):
    """A local HTTP server whose every request is answered by ``handler_body(handler)``; (server, url, seen paths)."""
    import http.server
    import threading

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _any(self):
            seen.append(self.path)
            handler_body(self)

        do_GET = do_POST = _any  # noqa: N815 (http.server's spelling)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}", seen


def test_a_tracking_server_that_answers_500_is_given_up_after_a_few_tries_not_minutes(mlflow, monkeypatch, caplog):
    """Regression: MLflow's own retries (7, backing off to minutes) held the compile up for 4 minutes at the first
    call to a server that answered 500, and again at each later call. The tracker's calls now try 3 times."""
    for name in (
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
        "MLFLOW_HTTP_REQUEST_TIMEOUT",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
    ):
        monkeypatch.delenv(name, raising=False)

    def fail(handler):
        handler.send_response(500)
        handler.end_headers()

    server, url, seen = _http_server(fail)
    try:
        tracker = _started_against(mlflow, url, caplog, monkeypatch)
    finally:
        server.shutdown()
    assert not tracker.active and "MLflow tracking stopped (starting the MLflow run failed" in caplog.text
    api_calls = [path for path in seen if "/api/" in path]
    assert 1 <= len(api_calls) <= 3  # one call, tried 3 times at most (MLflow alone: 8)
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # the bound was for the tracker's call only


def test_a_tracking_server_that_accepts_but_never_answers_is_given_up_at_the_start(mlflow, monkeypatch, caplog):
    """Regression: a server that accepted connections and never replied passed the start's check; MLflow then waited
    120 s a try, 8 tries, before the first evaluation."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections are accepted by the kernel; nothing ever answers
    try:
        tracker = _started_against(mlflow, f"http://127.0.0.1:{silent.getsockname()[1]}", caplog, monkeypatch)
    finally:
        silent.close()
    assert not tracker.active and tracker.run_id is None
    assert "did not answer (timed out)" in caplog.text


def test_a_launchers_run_is_the_parent_of_the_compiles_run_and_is_left_running(store, mlflow, monkeypatch):
    """Regression: under `mlflow run` (MLFLOW_RUN_ID set, no run started in Python) the tracker took the launcher's
    run over: its parameters collided with the user's, and the launcher's run was ended as FINISHED."""
    from rlmoptimizer.report.tracking import MlflowTracker

    client = mlflow.MlflowClient()
    launcher = client.create_run(store["experiment_id"], run_name="the launcher's").info.run_id
    client.log_param(launcher, "trainset_size", "99")
    monkeypatch.setenv("MLFLOW_RUN_ID", launcher)
    tracker = MlflowTracker(run_name="ours")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    tracker.compile_started({"trainset_size": 12})
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"  # bounded while the compile tracks
    tracker.compile_finished(instructions={"step": "v"}, selection={"chosen_score": 1.0}, trajectory=[])
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # and left as it was after
    ours = client.get_run(tracker.run_id)
    assert tracker.run_id != launcher and ours.data.tags["mlflow.parentRunId"] == launcher
    assert ours.data.params["trainset_size"] == "12" and ours.info.status == "FINISHED"
    assert client.get_run(launcher).info.status == "RUNNING" and os.environ["MLFLOW_RUN_ID"] == launcher

    broken = MlflowTracker(run_name="closing fails")  # the store breaks as the run closes: the launcher's id stays
    broken.compile_started({"trainset_size": 12})
    monkeypatch.setattr(mlflow.MlflowClient, "set_terminated", lambda *args, **kwargs: 1 / 0)
    broken.compile_failed(RuntimeError("stopped"))
    assert os.environ["MLFLOW_RUN_ID"] == launcher and mlflow.active_run() is None


def test_a_resumed_runs_agent_turns_metric_counts_the_turns_before_it(store, mlflow):
    """Regression: a compile resumed after 2 turns logged agent_turns 1, 2 for its turns 3 and 4."""
    from rlmoptimizer.report.tracking import MlflowTracker

    tracker = MlflowTracker(run_name="resumed")
    tracker.compile_started({"max_iterations": 1})
    for number in (3, 4):
        tracker.agent_turn({"iteration": number, "code": "x", "output": ""})
    history = mlflow.MlflowClient().get_metric_history(tracker.run_id, "agent_turns")
    assert [(m.step, m.value) for m in history] == [(3, 3.0), (4, 4.0)]
