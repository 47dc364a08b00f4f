"""A run directory belongs to one live compile(), reading a finished one back writes nothing, and a resume
knows what its stored scores depend on (the evaluation LM, pass_threshold) and recognises the same examples
in a new process, even examples holding objects."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path

import dspy
import pytest
from support.fakes import FunctionLM, scripted_agent
from support.objects import Attachment, object_splits
from support.optimizing import TURNS, compile_in, compile_tickets, dies_after, proposer
from support.processes import kill_group, run_script, start_script, wait_for_file
from support.readonly import read_only_filesystem
from support.tickets import POLICY_PROMPT, RouteTicket, task_lm_reply

from rlmoptimizer import (
    ConfigurationError,
    OptimizationInterrupted,
    RLMDocstringOptimizer,
    RunDirectoryInUseError,
    RunDirectoryMismatchError,
)
from rlmoptimizer.fingerprint import examples_digest
from rlmoptimizer.storage.run_store import RunStore

# -- one live compile per directory -----------------------------------------------------------------------

HOLDER = """
from support.optimizing import TURNS, compile_tickets
from support.processes import reached
from rlmoptimizer.testing import FunctionLM

compile_tickets(TURNS, eval_lm=FunctionLM(lambda messages: reached({marker!r})), num_threads=1,
                run_storage_dir={directory!r})  # the directory is held and an evaluation is under way
"""


@pytest.mark.slow
def test_a_second_compile_on_a_directory_another_process_holds_is_refused_and_a_killed_holder_blocks_nothing(tmp_path):
    directory, marker = tmp_path / "run", tmp_path / "holding"
    holder = start_script(tmp_path, "holder", HOLDER.format(marker=str(marker), directory=str(directory)))
    try:
        wait_for_file(marker, holder)
        root, task = scripted_agent(TURNS), FunctionLM(task_lm_reply)
        with pytest.raises(RunDirectoryInUseError) as refused:
            compile_in(directory, root, task)
        message = str(refused.value)
        assert f"process {holder.pid} on host {socket.gethostname()!r}" in message
        assert "running since 20" in message and "UTC" in message
        assert str(directory) in message and "another run_storage_dir" in message
        assert root.calls == [] and task.calls == []  # refused before any LM call
        assert holder.poll() is None  # and the holder was left alone
    finally:
        kill_group(holder)  # the holder and the sandbox it started
    assert holder.returncode == -signal.SIGKILL
    assert json.loads((directory / "holder.json").read_text())["pid"] == holder.pid  # left behind by the dead

    result = compile_in(directory, scripted_agent(TURNS), FunctionLM(task_lm_reply))
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT
    assert not (directory / "holder.json").exists()  # a compile that ends gives the directory up


@pytest.mark.slow
def test_a_second_compile_in_the_same_process_is_refused_while_the_first_runs(tmp_path):
    go_on, started = threading.Event(), threading.Event()

    def slow_reply(messages):
        started.set()
        go_on.wait(timeout=120)
        return task_lm_reply(messages)

    outcome: dict = {}

    def first():
        try:
            outcome["result"] = compile_in(tmp_path, scripted_agent(TURNS), FunctionLM(slow_reply))
        except BaseException as exc:  # reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert started.wait(timeout=120)
        root, task = scripted_agent(TURNS), FunctionLM(task_lm_reply)
        with pytest.raises(RunDirectoryInUseError, match=f"this same process \\(pid {os.getpid()}"):
            compile_in(tmp_path, root, task)
        assert root.calls == [] and task.calls == []
    finally:
        go_on.set()
        thread.join(timeout=300)
    assert "error" not in outcome, outcome
    assert outcome["result"].optimized_dspy_program["route"] == POLICY_PROMPT
    # the first compile is over: the directory is free again, and reading it back costs nothing
    root, task = scripted_agent(TURNS), FunctionLM(task_lm_reply)
    again = compile_in(tmp_path, root, task)
    assert again.optimized_dspy_program == outcome["result"].optimized_dspy_program
    assert root.calls == [] and task.calls == []


# -- reading back a finished run writes nothing -------------------------------------------------------------


def test_the_write_guard_really_refuses_writes(tmp_path):
    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    with read_only_filesystem() as attempts:
        for write in (
            lambda: (tmp_path / "x.json").write_text("{}"),
            lambda: (tmp_path / "made").mkdir(),
            lambda: (tmp_path / "touched").touch(),
            lambda: tempfile.mkstemp(dir=tmp_path),
            lambda: open(kept, "a"),
            lambda: os.replace(kept, tmp_path / "moved.json"),
            lambda: kept.unlink(),
        ):
            refused_before = len(attempts)
            with pytest.raises(OSError, match="Read-only"):
                write()
            assert len(attempts) > refused_before  # refused by the guard, and recorded
        assert kept.read_text() == "{}"  # reading still works
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]  # none of the writes happened


@pytest.mark.slow
def test_a_finished_run_on_a_read_only_file_system_returns_its_result_and_writes_nothing(tmp_path):
    first = compile_in(tmp_path, TURNS, FunctionLM(task_lm_reply))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    root, task = scripted_agent(TURNS), FunctionLM(task_lm_reply)
    with read_only_filesystem() as attempts:
        again = compile_in(tmp_path, root, task)
    assert attempts == []
    assert again.optimized_dspy_program == first.optimized_dspy_program
    assert again.budget == first.budget and again.selection == first.selection
    assert root.calls == [] and task.calls == []
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before

    # an archived copy without the lock file (hidden files dropped) reads back too, still writing nothing
    (tmp_path / ".lock").unlink()
    with read_only_filesystem() as attempts:
        again = compile_in(tmp_path, TURNS, FunctionLM(task_lm_reply))
    assert attempts == [] and again.optimized_dspy_program == first.optimized_dspy_program


@pytest.mark.slow
def test_a_run_that_is_not_finished_on_a_read_only_file_system_is_refused_clearly(tmp_path):
    with pytest.raises(OptimizationInterrupted):
        compile_in(tmp_path, dies_after(1, dspy.LMAuthError("invalid api key")), FunctionLM(task_lm_reply))
    (tmp_path / ".lock").unlink()
    with read_only_filesystem(), pytest.raises(ConfigurationError, match="cannot be written.*writable run_storage_dir"):
        compile_in(tmp_path, TURNS, FunctionLM(task_lm_reply))


# -- what the stored scores depend on ---------------------------------------------------------------------


def partial_metric(example, prediction, trace=None):
    """1.0 for the right queue, 0.6 for a wrong one: which examples pass depends on pass_threshold."""
    return 1.0 if example.queue == (prediction.queue or "").strip().lower() else 0.6


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run directory (compiled once for the module); tests copy it."""
    directory = tmp_path_factory.mktemp("finished")
    compile_in(directory, scripted_agent(TURNS), FunctionLM(task_lm_reply), metric=partial_metric)
    return directory


@pytest.fixture
def finished_copy(finished, tmp_path):
    return Path(shutil.copytree(finished, tmp_path / "run"))


@pytest.mark.slow
def test_an_evaluation_lm_with_other_settings_is_refused_naming_each_difference(finished_copy):
    other = FunctionLM(task_lm_reply, name="other-model")
    other.kwargs["temperature"] = 0.7
    root = scripted_agent(TURNS)
    with pytest.raises(RunDirectoryMismatchError) as refused:
        compile_in(finished_copy, root, other, metric=partial_metric)
    message = str(refused.value)
    assert 'lm.model: "fake" (stored) -> "other-model" (now)' in message
    assert "lm.kwargs.temperature: 0.0 (stored) -> 0.7 (now)" in message
    assert "max_tokens" not in message  # only what differs
    assert "new run_storage_dir" in message and "allow_eval_lm_change=True" in message
    assert root.calls == [] and other.calls == []

    # an LM pinned to one step is part of what the scores depend on too
    pinned = RouteTicket()
    pinned.route.lm = FunctionLM(task_lm_reply, name="route-model")
    with pytest.raises(
        RunDirectoryMismatchError, match='per_step.route.model: "<not set>" \\(stored\\) -> "route-model"'
    ):
        compile_in(finished_copy, TURNS, FunctionLM(task_lm_reply), student=pinned, metric=partial_metric)


@pytest.mark.slow
def test_allow_eval_lm_change_resumes_with_the_stored_scores_and_records_the_new_lm(finished_copy, caplog):
    first = json.loads((finished_copy / "result.json").read_text())
    other = FunctionLM(task_lm_reply, name="other-model")
    with caplog.at_level(logging.WARNING, logger="rlmoptimizer"):
        result = compile_in(finished_copy, TURNS, other, allow_eval_lm_change=True, metric=partial_metric)
    assert other.calls == [] and result.optimized_dspy_program == first["optimized_dspy_program"]
    assert "allow_eval_lm_change=True" in caplog.text and "other-model" in caplog.text
    manifest = json.loads((finished_copy / "manifest.json").read_text())
    assert manifest["eval_lm"]["lm"]["model"] == "other-model"
    assert manifest["earlier_eval_lms"][0]["lm"]["model"] == "fake"
    # the new LM is now the recorded one: resuming with it needs no override
    compile_in(
        finished_copy, scripted_agent(TURNS), FunctionLM(task_lm_reply, name="other-model"), metric=partial_metric
    )


@pytest.mark.slow
def test_a_new_pass_threshold_recomputes_passed_from_the_stored_scores_for_free(finished_copy, caplog):
    before = RunStore(finished_copy).all()
    assert any(r.passed_count < r.evaluated_count for r in before)  # at 1.0 the 0.6 answers fail

    task = FunctionLM(task_lm_reply)
    with caplog.at_level(logging.WARNING, logger="rlmoptimizer"):
        result = compile_in(finished_copy, TURNS, task, pass_threshold=0.5, metric=partial_metric)
    assert task.calls == []
    assert "pass_threshold changed from 1.0 to 0.5" in caplog.text and "no LM call" in caplog.text
    assert [log["passed_count"] for log in result.trial_logs] == [log["evaluated_count"] for log in result.trial_logs]
    assert [log["score"] for log in result.trial_logs] == [r.score for r in before]
    assert json.loads((finished_copy / "manifest.json").read_text())["pass_threshold"] == 0.5

    # and back: the stored files were not rewritten, passed follows the threshold of the compile reading them
    result = compile_in(finished_copy, scripted_agent(TURNS), FunctionLM(task_lm_reply), metric=partial_metric)
    assert [log["passed_count"] for log in result.trial_logs] == [r.passed_count for r in before]


def test_records_read_from_disk_count_as_passed_at_the_threshold_of_the_store(tmp_path):
    from rlmoptimizer.records import EvalRun, ExampleResult

    records = tuple(
        ExampleResult(example_id=i, inputs={}, expected={}, predicted={}, score=s, passed=s >= 1.0, error=e)
        for i, (s, e) in enumerate([(1.0, None), (0.6, None), (0.0, "ValueError: boom")])
    )
    RunStore(tmp_path).save(EvalRun("run-0001", "train", "baseline", {"a": "x"}, records, 3, 0, 10))
    pending = RunStore(tmp_path).open_pending({"split": "train", "instructions": {"a": "y"}})
    for record in records:
        pending.append(record)
    assert [r.passed for r in RunStore(tmp_path).get("run-0001").records] == [True, False, False]
    lenient = RunStore(tmp_path, pass_threshold=0.5)
    assert [r.passed for r in lenient.get("run-0001").records] == [True, True, False]
    assert lenient.get("run-0001").passed_count == 2
    assert [r.passed for r in lenient.pending()[0][2]] == [True, True, False]


# -- the same examples in a new process ---------------------------------------------------------------------


STOPPED_WITH_OBJECTS = """
import dspy
from support.objects import object_splits
from support.optimizing import compile_tickets, dies_after
from rlmoptimizer import OptimizationInterrupted
trainset, valset = object_splits()
try:
    compile_tickets(dies_after(2, dspy.LMAuthError("invalid api key")), trainset=trainset, valset=valset,
                    run_storage_dir={directory!r})
except OptimizationInterrupted:
    print("stopped")
"""


@pytest.mark.slow
def test_examples_holding_objects_resume_in_a_new_process(tmp_path):
    directory = tmp_path / "run"
    assert "stopped" in run_script(tmp_path, "first", STOPPED_WITH_OBJECTS.format(directory=str(directory)))

    # another process, other objects with the same data: a different trainset only when the data differs
    with pytest.raises(RunDirectoryMismatchError, match="trainset, valset"):
        trainset, valset = object_splits(attachment_name="invoice.pdf")
        compile_in(directory, scripted_agent(TURNS), FunctionLM(task_lm_reply), trainset=trainset, valset=valset)

    trainset, valset = object_splits()
    task, root = FunctionLM(task_lm_reply), scripted_agent(TURNS)
    result = compile_in(directory, root, task, trainset=trainset, valset=valset)
    assert "resumed" in str(root.calls[0])
    assert len(task.calls) == 2 * len(valset)  # the baselines and the agent's re-run were not paid again
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT


DIGEST = """
from support.objects import object_splits
from rlmoptimizer.fingerprint import examples_digest
print(examples_digest(object_splits()[0]))
"""


def test_the_examples_digest_is_the_same_in_every_process_and_follows_the_data(tmp_path):
    digests = [
        run_script(tmp_path, f"digest-{seed}", DIGEST, timeout=120, PYTHONHASHSEED=seed).strip() for seed in ("1", "2")
    ]
    trainset = object_splits()[0]
    assert digests == [examples_digest(trainset)] * 2  # set order and addresses play no part

    def changed(**fields):
        return [dspy.Example(**{**trainset[0], **fields}).with_inputs("ticket"), *trainset[1:]]

    assert examples_digest(changed(raw=b"other")) != digests[0]
    assert examples_digest(changed(received=datetime.datetime(2027, 1, 1))) != digests[0]
    assert examples_digest(changed(attachment=Attachment("receipt.pdf", {"a", "b"}))) != digests[0]
    assert examples_digest(changed(image=dspy.Image("https://example.com/other.png"))) != digests[0]
    assert examples_digest([trainset[0].with_inputs("ticket", "queue"), *trainset[1:]]) != digests[0]
    looped = Attachment("x", set())
    looped.me = looped  # a cycle is described, not followed forever
    assert len(examples_digest([dspy.Example(a=looped).with_inputs("a")])) == 64


# -- numeric settings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan"), -1, 0, True, 86_401, 1e300, "60"])
def test_sandbox_timeout_must_be_a_finite_number_of_seconds_up_to_a_day(bad):
    with pytest.raises(ConfigurationError, match=r"greater than 0 and at most 86400 \(one day\)"):
        RLMDocstringOptimizer(root_lm=FunctionLM(task_lm_reply), sandbox_timeout_s=bad)


@pytest.mark.slow
def test_the_longest_sandbox_timeout_reaches_the_sandbox_and_the_agents_instructions():
    root = scripted_agent([{"reasoning": "look", "code": "print('cell ran')"}, TURNS[-1]])
    result = compile_tickets(root, sandbox_timeout_s=86_400)
    assert result.agent_trajectory[0]["output"].strip() == "cell ran"
    assert "run for at most 86400 s of sandbox time" in str(root.calls[0])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), True, "1"])
def test_pass_threshold_must_be_a_finite_number(bad):
    with pytest.raises(ConfigurationError, match=r"pass_threshold must be a finite number"):
        RLMDocstringOptimizer(root_lm=FunctionLM(task_lm_reply), pass_threshold=bad)


def _edited_route_ticket() -> dspy.Module:
    """``RouteTicket`` after its author edited its code: the same class (module and name), another ``forward``."""

    def __init__(self):
        dspy.Module.__init__(self)
        self.summarize = dspy.ChainOfThought("ticket -> summary")
        self.route = dspy.Predict("summary -> queue")

    def forward(self, ticket):
        summary = self.summarize(ticket=ticket.strip()).summary
        return self.route(summary=summary)

    namespace = {"__init__": __init__, "forward": forward, "__module__": RouteTicket.__module__}
    edited = type("RouteTicket", (dspy.Module,), {**namespace, "__qualname__": RouteTicket.__qualname__})
    return edited()


@pytest.mark.slow
def test_a_resume_after_the_programs_code_changed_is_refused_naming_the_class(finished_copy):
    root, task = scripted_agent(TURNS), FunctionLM(task_lm_reply)
    with pytest.raises(RunDirectoryMismatchError) as refused:
        compile_in(finished_copy, root, task, student=_edited_route_ticket(), metric=partial_metric)
    message = str(refused.value)
    assert "the code of RouteTicket" in message
    assert "new run_storage_dir" in message and "allow_program_change=True" in message
    assert root.calls == [] and task.calls == []


@pytest.mark.slow
def test_allow_program_change_resumes_with_the_stored_records_and_records_the_new_code(finished_copy, caplog):
    first = json.loads((finished_copy / "result.json").read_text())
    task = FunctionLM(task_lm_reply)
    with caplog.at_level(logging.WARNING, logger="rlmoptimizer"):
        result = compile_in(
            finished_copy, TURNS, task, student=_edited_route_ticket(), allow_program_change=True, metric=partial_metric
        )
    assert task.calls == [] and result.optimized_dspy_program == first["optimized_dspy_program"]
    assert "allow_program_change=True" in caplog.text and "The code of RouteTicket" in caplog.text
    # the edited code is now the recorded one: the original is the change now
    compile_in(finished_copy, TURNS, FunctionLM(task_lm_reply), student=_edited_route_ticket(), metric=partial_metric)
    with pytest.raises(RunDirectoryMismatchError, match="the code of RouteTicket"):
        compile_in(finished_copy, TURNS, FunctionLM(task_lm_reply), metric=partial_metric)


@pytest.mark.slow
def test_a_directory_written_before_the_code_was_recorded_resumes_and_records_it(finished_copy):
    path = finished_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    recorded = manifest.pop("program_code")
    path.write_text(json.dumps(manifest))
    compile_in(finished_copy, TURNS, FunctionLM(task_lm_reply), metric=partial_metric)
    assert json.loads(path.read_text())["program_code"] == recorded


@pytest.mark.slow
def test_a_resume_under_another_python_is_refused_saying_the_code_cannot_be_compared(finished_copy):
    path = finished_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["program_code"]["python"] = "3.0"
    path.write_text(json.dumps(manifest))
    with pytest.raises(RunDirectoryMismatchError, match="written under Python 3.0 and this is Python 3") as refused:
        compile_in(finished_copy, TURNS, FunctionLM(task_lm_reply), metric=partial_metric)
    assert "allow_program_change=True" in str(refused.value)
    compile_in(finished_copy, TURNS, FunctionLM(task_lm_reply), allow_program_change=True, metric=partial_metric)


# -- a directory that is not (or no longer) what a compile can use ----------------------------------------------


def loop() -> dict:
    return {"rlm_autopilot": "loop", "max_metric_calls": 40, "sub_lm": proposer(POLICY_PROMPT)}


def test_a_folder_of_other_files_is_refused_and_left_as_it_was(tmp_path):
    """Regression: a project folder passed as run_storage_dir got its result.json and runs/run-0001.json written
    over without a word."""
    folder = tmp_path / "project"
    (folder / "runs").mkdir(parents=True)
    (folder / "result.json").write_text('{"mine": true}')
    (folder / "runs" / "run-0001.json").write_text("my notes")
    with pytest.raises(ConfigurationError, match=r"holds result\.json, runs/ but no manifest\.json"):
        compile_in(folder, None, FunctionLM(task_lm_reply), **loop())
    assert (folder / "result.json").read_text() == '{"mine": true}'
    assert (folder / "runs" / "run-0001.json").read_text() == "my notes"
    assert sorted(p.name for p in folder.iterdir()) == ["result.json", "runs"]  # no lock or holder left behind
    empty = tmp_path / "empty"
    (empty / ".git-keep-me").mkdir(parents=True)  # hidden entries and empty folders are nothing to write over
    assert compile_in(empty, None, FunctionLM(task_lm_reply), **loop()).selection["chosen_score"] is not None


@pytest.mark.parametrize(
    ("files", "manifest"),
    [
        ({"index.html": "<html></html>"}, '{"name": "my-app", "version": "1.0"}'),
        ({"popup.js": ""}, '{\n  // an extension\'s manifest, with a comment\n  "name": "ext"\n}'),
        ({"runs/2024-01.csv": "step,loss"}, '{"experiments": ["2024-01"], "program": "train.py"}'),
    ],
    ids=["a web app", "not JSON", "its own runs"],
)
def test_a_folder_with_a_manifest_json_of_its_own_is_refused_and_left_as_it_was(tmp_path, files, manifest):
    """Regression: refused as "a run of a different program, trainset, valset, metric, budget" (delete it, it said),
    after .lock, prompts/, runs/ and turns/ were made in it."""
    for name, text in {"manifest.json": manifest, **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    listing = sorted(tmp_path.rglob("*"))
    with pytest.raises(ConfigurationError, match=r"its manifest\.json is not a run's.*Pass a new or empty directory"):
        compile_in(tmp_path, None, FunctionLM(task_lm_reply), **loop())
    assert sorted(tmp_path.rglob("*")) == listing
    assert (tmp_path / "manifest.json").read_text() == manifest


@pytest.fixture(scope="module")
def finished_loop(tmp_path_factory):
    """A finished loop-mode run directory (compiled once for the module); tests copy it."""
    directory = tmp_path_factory.mktemp("finished-loop")
    compile_in(directory, None, FunctionLM(task_lm_reply), **loop())
    return directory


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda d: (d / "manifest.json").unlink(), "no manifest.json"),
        (lambda d: (d / "manifest.json").write_text('{"program": '), "manifest.json cannot be read (JSONDecodeError"),
        (lambda d: (d / "manifest.json").write_text("[1, 2]"), "manifest.json cannot be read (it holds a JSON list"),
        (lambda d: (d / "ledger.json").write_text(""), "ledger.json cannot be read (JSONDecodeError"),
        (lambda d: _edit_json(d / "ledger.json", limit=540), "ledger.json in this run directory does not hold"),
        (lambda d: _edit_json(d / "ledger.json", spent_by_kind={"train_example": -100}), "does not hold this"),
        (lambda d: (d / "usage.json").write_text('{"root": '), "usage.json cannot be read (JSONDecodeError"),
        (lambda d: sorted((d / "turns").glob("*.json"))[0].write_text("{"), "turn-0001.json cannot be read"),
    ],
    ids=[
        "manifest deleted",
        "manifest cut",
        "manifest a list",
        "ledger empty",
        "ledger limit edited",
        "ledger spent edited",
        "usage cut",
        "turn cut",
    ],
)
def test_a_run_directory_with_a_damaged_record_file_is_refused_naming_the_file(finished_loop, tmp_path, damage, named):
    """Regression: a bare JSONDecodeError or AttributeError, or (manifest deleted) a fresh budget on top of the
    old runs."""
    directory = Path(shutil.copytree(finished_loop, tmp_path / "run"))
    damage(directory)
    task = FunctionLM(task_lm_reply)
    with pytest.raises((ConfigurationError, RunDirectoryMismatchError)) as refused:
        compile_in(directory, None, task, **loop())
    assert named in str(refused.value) and (
        "new run_storage_dir" in str(refused.value) or "new or empty" in str(refused.value)
    )
    assert not task.calls  # nothing was paid again


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_deleted_ledger_is_rebuilt_from_what_the_runs_spent_so_nothing_is_paid_again(finished_loop, tmp_path, caplog):
    """Regression: a run directory without ledger.json started a fresh budget on top of its runs."""
    directory = Path(shutil.copytree(finished_loop, tmp_path / "run"))
    runs_spent = sum(json.loads(p.read_text())["budget_spent"] for p in (directory / "runs").glob("run-*.json"))
    (directory / "ledger.json").unlink()
    task = FunctionLM(task_lm_reply)
    with caplog.at_level(logging.WARNING, logger="rlmoptimizer"):
        again = compile_in(directory, None, task, **loop())
    assert runs_spent > 0 and again.budget["spent"] >= runs_spent
    assert not task.calls and "ledger.json is missing" in caplog.text


def test_an_unreadable_run_file_is_never_written_over(finished_loop, tmp_path):
    directory = Path(shutil.copytree(finished_loop, tmp_path / "run"))
    last = sorted((directory / "runs").glob("run-*.json"))[-1]
    last.write_text("{ cut")
    store = RunStore(directory)
    assert last.stem not in {run.run_id for run in store.all()}
    new_id = store.next_run_id()
    assert int(new_id.split("-")[1]) > int(last.stem.split("-")[1])
    store.save(dataclasses.replace(store.all()[0], run_id=new_id))
    store.flush()
    assert last.read_text() == "{ cut"


def _run_files(directory: Path, **fields) -> list[Path]:
    """The run files of ``directory`` whose record has every one of ``fields``."""
    return [
        path
        for path in sorted((directory / "runs").glob("run-*.json"))
        if all(json.loads(path.read_text()).get(k) == v for k, v in fields.items())
    ]


@pytest.mark.parametrize(
    ("run", "damage", "named"),
    [
        ({"label": "baseline", "split": "val"}, Path.unlink, "the unchanged program's run on val"),
        ({"label": "baseline", "split": "val"}, lambda p: p.write_text("{ cut"), "the unchanged program's run on val"),
        ({"split": "val"}, Path.unlink, "the submission's run on val"),  # every check of it (GEPA's, the loop's)
    ],
    ids=["baseline deleted", "baseline cut", "checks of the submission deleted"],
)
def test_a_finished_run_missing_a_run_it_was_chosen_from_is_refused_not_paid_again(
    finished_loop, tmp_path, run, damage, named
):
    """Regression: reading back a finished run whose baseline file was gone evaluated the baseline again (LM calls
    a finished run had already paid for)."""
    directory = Path(shutil.copytree(finished_loop, tmp_path / "run"))
    baseline = _run_files(directory, label="baseline", split="val")
    damaged = [path for path in _run_files(directory, **run) if "label" in run or path not in baseline]
    assert damaged
    for path in damaged:
        damage(path)
    task = FunctionLM(task_lm_reply)
    with pytest.raises(RunDirectoryMismatchError) as refused:
        compile_in(directory, None, task, **loop())
    message = str(refused.value)
    assert "holds a finished run" in message and named in message and "new run_storage_dir" in message
    assert "resume where it stopped" not in message  # nothing to resume: the same call fails the same way
    assert not task.calls


def test_a_directory_holds_one_attempt(finished_loop, tmp_path):
    """Regression: attempt= was not recorded, so another attempt given the same directory read back (or, unfinished,
    resumed) the first attempt's work as its own."""
    directory = Path(shutil.copytree(finished_loop, tmp_path / "run"))
    task = FunctionLM(task_lm_reply)
    with pytest.raises(RunDirectoryMismatchError) as refused:
        compile_in(directory, None, task, attempt=1, **loop())
    message = str(refused.value)
    assert "holds attempt=0 and this compile() is attempt=1" in message
    assert "its own run_storage_dir" in message and "attempt=0 to resume" in message and not task.calls
    with pytest.raises(RunDirectoryMismatchError, match=r"dspy\.GEPA's seed= is attempt= here"):
        compile_in(directory, None, task, seed=1, **loop())  # as a dspy.GEPA user writes it
    assert json.loads((directory / "manifest.json").read_text())["attempt"] == 0

    # a directory written before the attempt was recorded takes the attempt that resumes it, and keeps to it
    _edit_json(directory / "manifest.json", attempt=None)
    manifest = json.loads((directory / "manifest.json").read_text())
    del manifest["attempt"]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    first = json.loads((directory / "result.json").read_text())
    again = compile_in(directory, None, task, **loop())
    assert again.optimized_dspy_program == first["optimized_dspy_program"] and not task.calls
    assert json.loads((directory / "manifest.json").read_text())["attempt"] == 0


def test_a_resume_under_another_adapter_is_refused_and_dspys_default_named_is_the_same(tmp_path):
    """Regression: the adapter formats the prompts and parses the answers, yet a run directory resumed under
    dspy.context(adapter=dspy.JSONAdapter()) reused the ChatAdapter's scores (a baseline of 0.5 where the program
    under the JSONAdapter scored 1.0)."""
    first = compile_tickets([], rlm_autopilot="loop", max_metric_calls=60, run_storage_dir=tmp_path)
    task = FunctionLM(task_lm_reply)
    with dspy.context(adapter=dspy.JSONAdapter()), pytest.raises(RunDirectoryMismatchError) as refused:
        compile_tickets([], eval_lm=task, rlm_autopilot="loop", max_metric_calls=60, run_storage_dir=tmp_path)
    message = str(refused.value)
    assert "evaluation LM (or adapter)" in message and "adapter.class" in message and "JSONAdapter" in message
    assert task.calls == []
    with dspy.context(adapter=dspy.ChatAdapter()):  # what dspy uses when none is set: the same scores
        again = compile_tickets([], eval_lm=task, rlm_autopilot="loop", max_metric_calls=60, run_storage_dir=tmp_path)
    assert task.calls == [] and again.optimized_dspy_program == first.optimized_dspy_program


def test_a_directory_that_names_no_adapter_is_refused_under_another_one_saying_how_to_resume_it(tmp_path):
    """Regression: a run directory of a version that did not record the adapter, made under dspy.JSONAdapter(), was
    refused under that same adapter with "adapter.class: <not set> (stored) -> ...JSONAdapter" and advice about
    another evaluation LM. It is still refused (a directory that names no adapter may as well have been made under
    dspy's default one), and the refusal now says so and how to resume it."""
    with dspy.context(adapter=dspy.JSONAdapter()):
        first = compile_tickets([], rlm_autopilot="loop", max_metric_calls=60, run_storage_dir=tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    del manifest["eval_lm"]["adapter"]  # as such a version wrote it
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    task = FunctionLM(task_lm_reply)
    with dspy.context(adapter=dspy.JSONAdapter()), pytest.raises(RunDirectoryMismatchError) as refused:
        compile_tickets([], eval_lm=task, rlm_autopilot="loop", max_metric_calls=60, run_storage_dir=tmp_path)
    assert "The directory names no adapter" in str(refused.value) and "allow_eval_lm_change=True resumes it" in str(
        refused.value
    )
    with dspy.context(adapter=dspy.JSONAdapter()):
        again = compile_tickets(
            [], eval_lm=task, rlm_autopilot="loop", max_metric_calls=60, run_storage_dir=tmp_path,
            allow_eval_lm_change=True,
        )  # fmt: skip
    assert task.calls == [] and again.optimized_dspy_program == first.optimized_dspy_program
    manifest["eval_lm"]["lm"]["model"] = "another-model"  # another LM: the hint about the adapter is not given
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RunDirectoryMismatchError) as refused:
        compile_tickets([], eval_lm=task, rlm_autopilot="loop", max_metric_calls=60, run_storage_dir=tmp_path)
    assert "lm.model" in str(refused.value) and "names no adapter" not in str(refused.value)


def test_a_directory_that_left_dspys_default_adapter_out_of_its_identity_still_tells_a_change(tmp_path):
    """A version that recorded an adapter only when it was not dspy's default wrote none for the default: such a
    directory (made since adapters were recorded) resumes under the default, and is refused under another."""
    compile_tickets([], rlm_autopilot="loop", max_metric_calls=60, run_storage_dir=tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["eval_lm"]["adapter"] is None
    del manifest["eval_lm"]["adapter"]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    task = FunctionLM(task_lm_reply)
    with dspy.context(adapter=dspy.JSONAdapter()), pytest.raises(RunDirectoryMismatchError, match="adapter"):
        compile_tickets([], eval_lm=task, rlm_autopilot="loop", max_metric_calls=60, run_storage_dir=tmp_path)
    compile_tickets([], eval_lm=task, rlm_autopilot="loop", max_metric_calls=60, run_storage_dir=tmp_path)
    assert task.calls == []


def test_a_resume_from_other_instructions_is_refused_naming_the_steps(tmp_path):
    """Regression: a finished directory resumed with the student's instructions edited (or with the optimized
    program) said its baseline run "is missing from its runs/ folder ... Restore the file", though nothing was."""
    first = compile_tickets([], rlm_autopilot="loop", max_metric_calls=60, run_storage_dir=tmp_path)
    edited = RouteTicket()
    edited.route.signature = edited.route.signature.with_instructions("Route the ticket.")
    task = FunctionLM(task_lm_reply)
    with pytest.raises(RunDirectoryMismatchError) as refused:
        compile_tickets(
            [], student=edited, eval_lm=task, rlm_autopilot="loop", max_metric_calls=60, run_storage_dir=tmp_path
        )
    message = str(refused.value)
    assert "started from other instructions" in message and "step(s) 'route' differ" in message
    assert "missing" not in message and "new run_storage_dir" in message and task.calls == []
    again = compile_tickets([], eval_lm=task, rlm_autopilot="loop", max_metric_calls=60, run_storage_dir=tmp_path)
    assert task.calls == [] and again.optimized_dspy_program == first.optimized_dspy_program


def test_a_run_directory_deleted_while_the_compile_ran_is_warned_about(tmp_path, caplog):
    """Regression: the compile rebuilt part of the deleted directory, without its manifest, and returned without a
    word; the directory could then never be read back."""
    directory, calls = tmp_path / "run", {"n": 0}

    def deleting(messages):
        calls["n"] += 1
        if calls["n"] == 2 * 20 + 1:  # after the baselines (20 examples, two steps each)
            shutil.rmtree(directory)
        return task_lm_reply(messages)

    with caplog.at_level(logging.WARNING, logger="rlmoptimizer"):
        result = compile_tickets(
            [],
            eval_lm=FunctionLM(deleting),
            sub_lm=proposer(POLICY_PROMPT),
            rlm_autopilot="loop",
            max_metric_calls=60,
            run_storage_dir=directory,
        )
    assert result.optimized_dspy_program and "has no manifest.json any more" in caplog.text
    assert "cannot be resumed or read back" in caplog.text


@pytest.mark.parametrize(
    ("change", "named"),
    [({"max_demos": 0}, "max_demos=4"), ({"rlm_autopilot": "assist", "root_lm": "root"}, "rlm_autopilot='loop'")],
    ids=["demos off", "another pilot"],
)
def test_a_finished_run_made_under_other_settings_is_refused_naming_them(finished_loop, tmp_path, change, named):
    """Regression: max_demos=0 on a directory whose finished result held 4 demos returned those demos without a
    word (the setting was not recorded)."""
    run = Path(shutil.copytree(finished_loop, tmp_path / "run"))
    settings = {**loop(), **change}
    root = scripted_agent(TURNS) if settings.pop("root_lm", None) else None
    task = FunctionLM(task_lm_reply)
    with pytest.raises(RunDirectoryMismatchError, match="holds a run made with " + re.escape(named)) as refused:
        compile_in(run, root, task, **settings)
    assert "the run is finished" in str(refused.value) and "new run_storage_dir" in str(refused.value)
    assert task.calls == [] and (root is None or root.calls == [])
    # the same settings read it back, for nothing
    assert compile_in(run, None, task, **loop()).selection["chosen_score"] is not None and task.calls == []


def test_an_unfinished_run_written_without_its_settings_records_them_when_resumed(finished_loop, tmp_path):
    """A directory written before the settings were recorded is not checked against them; once resumed it goes on
    under this compile's, so they are recorded and the next resume is checked (regression: never recorded)."""
    run = Path(shutil.copytree(finished_loop, tmp_path / "run"))
    (run / "result.json").unlink()  # unfinished
    manifest = json.loads((run / "manifest.json").read_text())
    del manifest["settings"]
    (run / "manifest.json").write_text(json.dumps(manifest))
    compile_in(run, None, FunctionLM(task_lm_reply), **loop())
    assert json.loads((run / "manifest.json").read_text())["settings"]["max_demos"] == 4
    (run / "result.json").unlink()
    with pytest.raises(RunDirectoryMismatchError, match="holds a run made with max_demos=4"):
        compile_in(run, None, FunctionLM(task_lm_reply), **loop(), max_demos=0)


def test_a_program_whose_structure_changed_is_refused_naming_what_changed(finished_loop, tmp_path):
    """Regression: a new demo or output field was refused as "a run of a different program" without saying what
    differed."""
    run = Path(shutil.copytree(finished_loop, tmp_path / "run"))
    student = RouteTicket()
    student.route.demos = [dspy.Example(ticket="my card was charged twice", queue="billing")]
    task = FunctionLM(task_lm_reply)
    with pytest.raises(RunDirectoryMismatchError, match="What changed in the program: step 'route': ") as refused:
        compile_in(run, None, task, student=student, **loop())
    assert "demo" in str(refused.value).split("What changed in the program:")[1] and task.calls == []


def test_the_manifest_keeps_the_structure_small_whatever_the_demos_hold():
    from rlmoptimizer.fingerprint import diff_fingerprints, structural_fingerprint
    from rlmoptimizer.storage.resume import _compact_structure

    program = dspy.Predict("question -> answer")
    program.demos = [dspy.Example(question="x" * 50_000, answer="H")]
    kept = _compact_structure(structural_fingerprint(program))
    assert len(json.dumps(kept)) < 2_000 and "50,000 chars" in json.dumps(kept)
    program.demos = [dspy.Example(question="x" * 49_999 + "y", answer="H")]  # differs past what is kept whole
    [change] = diff_fingerprints(kept, _compact_structure(structural_fingerprint(program)))
    assert change.startswith("step 'self': demo 0 changed from ")


def _lower(text: str) -> str:
    return text.lower()


def _upper(text: str) -> str:
    return text.upper()


class CleanedTicket(RouteTicket):
    """A program holding a function it calls (as a dspy.ReAct holds its tools)."""

    def __init__(self, clean=_lower):
        super().__init__()
        self.clean = clean

    def forward(self, ticket):
        return super().forward(ticket=self.clean(ticket))


def test_a_directory_written_before_held_functions_were_recorded_is_read_back_and_records_them(tmp_path):
    """Regression: recording the functions a module holds as code refused every run directory an earlier version had
    written for such a program, even to read its finished result back."""
    compile_tickets(TURNS, student=CleanedTicket(), run_storage_dir=tmp_path, **loop())
    path = tmp_path / "manifest.json"
    manifest = json.loads(path.read_text())
    held = {
        name: digest for name, digest in manifest["program_code"]["classes"].items() if "functions it holds" in name
    }
    assert list(held) == ["CleanedTicket (the functions it holds)"]
    for name in held:  # as an earlier version wrote it
        del manifest["program_code"]["classes"][name]
    del manifest["program_code"]["held"]
    path.write_text(json.dumps(manifest))
    task = FunctionLM(task_lm_reply)
    compile_tickets(TURNS, student=CleanedTicket(), run_storage_dir=tmp_path, eval_lm=task, **loop())
    assert task.calls == []  # read back
    assert json.loads(path.read_text())["program_code"]["classes"].items() >= held.items()  # and now recorded
    with pytest.raises(RunDirectoryMismatchError, match="CleanedTicket \\(the functions it holds\\)"):
        compile_tickets(TURNS, student=CleanedTicket(_upper), run_storage_dir=tmp_path, **loop())

    # a directory written by this version for a program that held no function: one that holds one now is a change
    other = tmp_path / "none"
    compile_tickets(TURNS, student=CleanedTicket(clean=str), run_storage_dir=other, **loop())  # (a builtin: no code)
    with pytest.raises(RunDirectoryMismatchError, match="CleanedTicket \\(the functions it holds\\)"):
        compile_tickets(TURNS, student=CleanedTicket(), run_storage_dir=other, **loop())
