"""Runs on disk: atomic writes, ids that continue across restarts, exact round trips."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading

import pytest

from rlmoptimizer.records import EvalRun, ExampleResult, StepTrace
from rlmoptimizer.storage import files as run_store
from rlmoptimizer.storage.files import WriteFailed, atomic_write_json, atomic_write_text
from rlmoptimizer.storage.run_store import RunStore


def make_run(run_id: str = "run-0001", split: str = "train") -> EvalRun:
    records = (
        ExampleResult(
            example_id=3,
            inputs={"question": "Qu'est-ce que c'est ? ✓", "context": ["a", "b"]},
            expected={"answer": "un test"},
            predicted={"reasoning": "…", "answer": "un test", "meta": {"n": 1, "f": 0.1}},
            score=1.0,
            passed=True,
            feedback="exact",
            steps=(
                StepTrace("generate.predict", {"question": "Qu'est-ce que c'est ? ✓"}, {"answer": "un test"}),
                StepTrace("polish", {"draft": None}, {"answer": "un test"}),
            ),
        ),
        ExampleResult(
            example_id=1,
            inputs={"question": "q1"},
            expected={"answer": "a1"},
            predicted={},
            score=0.0,
            passed=False,
            error="ValueError: boom",
        ),
    )
    return EvalRun(
        run_id=run_id,
        split=split,
        label="agent",
        instructions={"generate.predict": "Answer.", "polish": "Polish."},
        records=records,
        requested_count=5,
        budget_spent=2,
        budget_left=98,
        note="budget allowed 2 of 5 requested examples; 98 units left",
        created_at=1700000000.123456,
    )


def test_atomic_write_json_writes_and_replaces(tmp_path):
    path = tmp_path / "sub" / "state.json"
    atomic_write_json(path, {"a": 1, "text": "é"})
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": 1, "text": "é"}
    atomic_write_text(path, "replaced")
    assert path.read_text() == "replaced"
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]


def test_half_a_character_is_written_escaped_and_reads_back_the_same(tmp_path):
    """A lone surrogate (an LM's answer may hold one) has no UTF-8 form: the file and the pending log escape it."""
    path = tmp_path / "state.json"
    atomic_write_json(path, {"text": "half \ud83d", "other": "é"})
    assert json.loads(path.read_text(encoding="utf-8")) == {"text": "half \ud83d", "other": "é"}

    store = RunStore(tmp_path / "runs")
    run = make_run()
    odd = dataclasses.replace(run.records[1], predicted={"answer": "a \udc80"})
    log = store.open_pending({"split": "train", "instructions": run.instructions, "label": "agent", "requested": 2})
    log.append(odd)
    log.close()
    [(_, _, records)] = store.pending()
    assert records[0].predicted == {"answer": "a \udc80"}


def test_a_crash_while_writing_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    atomic_write_json(path, {"version": 1})

    def crash(src, dst):
        raise OSError("disk pulled out")

    monkeypatch.setattr(run_store.os, "replace", crash)
    with pytest.raises(WriteFailed, match="could not write .*state.json: disk pulled out") as failed:
        atomic_write_json(path, {"version": 2})  # a stop no `except Exception` of a move takes for a failed move
    assert isinstance(failed.value.error, OSError) and not isinstance(failed.value, Exception)
    assert json.loads(path.read_text()) == {"version": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]

    with pytest.raises(TypeError):  # unserialisable data fails before the file is touched
        atomic_write_json(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"version": 1}


def test_runs_round_trip_exactly_through_files(tmp_path):
    store = RunStore(tmp_path)
    run = make_run()
    store.save(run)
    assert (tmp_path / "runs" / "run-0001.json").exists()
    reread = RunStore(tmp_path).get("run-0001")
    assert reread == run
    assert reread.score == 0.5 and reread.passed_count == 1 and [r.example_id for r in reread.records] == [1, 3]


def test_ids_continue_after_the_highest_on_disk_and_order_is_numeric(tmp_path):
    store = RunStore(tmp_path)
    assert store.next_run_id() == "run-0001"
    store.save(make_run("run-0009"))
    store.save(make_run("run-10000"))
    store.save(make_run("run-0010"))
    assert store.next_run_id() == "run-10001"
    assert [r.run_id for r in store.all()] == ["run-0009", "run-0010", "run-10000"]

    reopened = RunStore(tmp_path)
    assert len(reopened) == 3 and "run-0010" in reopened and "run-0002" not in reopened
    assert reopened.next_run_id() == "run-10001"


def test_next_run_id_is_unique_across_threads(tmp_path):
    store = RunStore(tmp_path)
    ids: list[str] = []
    lock = threading.Lock()

    def take():
        mine = [store.next_run_id() for _ in range(50)]
        with lock:
            ids.extend(mine)

    threads = [threading.Thread(target=take) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == len(set(ids)) == 800
    assert max(ids) == "run-0800"


def test_unknown_ids_list_the_known_ones(tmp_path):
    store = RunStore(tmp_path)
    with pytest.raises(KeyError, match="unknown run_id 'run-0001'; known run ids: none yet"):
        store.get("run-0001")
    store.save(make_run("run-0001"))
    store.save(make_run("run-0002"))
    with pytest.raises(KeyError, match="unknown run_id 'run-7'; known run ids: run-0001, run-0002"):
        store.get("run-7")


def test_stray_temporary_and_unreadable_files_are_ignored(tmp_path):
    store = RunStore(tmp_path)
    store.save(make_run("run-0001"))
    runs = tmp_path / "runs"
    (runs / ".run-0002.json.abc123.tmp").write_text('{"half": ')
    (runs / "run-0003.json").write_text('{"run_id": "run-0003", "spl')
    (runs / "notes.json").write_text("{}")
    reopened = RunStore(tmp_path)
    assert [r.run_id for r in reopened.all()] == ["run-0001"]


def test_bad_run_ids_are_rejected_before_writing(tmp_path):
    store = RunStore(tmp_path)
    with pytest.raises(ValueError, match="run_id must look like 'run-0001'"):
        store.save(make_run("../escape"))
    assert list((tmp_path / "runs").iterdir()) == []


def test_no_directory_means_a_fresh_temporary_one():
    store = RunStore(None)
    assert store.is_temporary and store.directory.name.startswith("rlmoptimizer-")
    assert os.path.isdir(store.directory / "runs") and len(store) == 0
    assert not RunStore(store.directory).is_temporary


def test_a_run_saved_with_its_pending_log_is_written_in_the_background_and_then_the_log_goes(tmp_path):
    """The run file leaves the agent's path; until it is on disk the pending log still holds the records."""
    store = RunStore(tmp_path)
    record = ExampleResult(0, {"q": "x"}, {"a": "y"}, {"a": "y"}, 1.0, True)
    pending = store.open_pending(
        {"label": "agent", "split": "train", "instructions": {}, "requested": 1, "charged": True}
    )
    pending.append(record)
    run = EvalRun("run-0001", "train", "agent", {}, (record,), 1, 1, 0)
    store.save(run, settles=pending)
    assert store.get("run-0001") == run  # in memory at once
    store.flush()
    assert RunStore(tmp_path).get("run-0001") == run
    assert not pending.path.exists()


def test_a_damaged_pending_log_keeps_every_record_it_can_and_is_never_deleted_with_records(tmp_path, caplog):
    """Regressions: a damaged line in the middle of an in-flight log dropped every record after it, and a log
    whose header was damaged was deleted with its records."""
    store = RunStore(tmp_path)
    run = make_run()
    header = {"split": "train", "instructions": run.instructions, "label": "agent", "requested": 4}
    log = store.open_pending(header)
    for example_id in (0, 1, 2):
        log.append(dataclasses.replace(run.records[0], example_id=example_id))
    log.close()
    lines = log.path.read_bytes().split(b"\n")
    lines[2] = b'{"example_id": 1, "sco'  # damaged in place (not the kill's torn last line)
    log.path.write_bytes(b"\n".join(lines) + b'{"example_id": 3, "sc')  # and a torn last line after it
    with caplog.at_level(logging.WARNING, logger="rlmoptimizer"):
        [(_, _, records)] = store.pending()
    assert [r.example_id for r in records] == [0, 2]
    assert "1 damaged record line(s) skipped, 2 record(s) kept" in caplog.text

    log.path.write_bytes(b'{"split": "tra' + b"\n" + b"\n".join(lines[1:]))  # the header damaged, records after it
    with caplog.at_level(logging.WARNING, logger="rlmoptimizer"):
        assert store.pending() == []
    assert log.path.exists() and "its header cannot be read, but 3 record line(s) follow it" in caplog.text

    log.path.write_bytes(b'{"split": "tra')  # a header cut while it was written, nothing after it: nothing paid
    assert store.pending() == [] and not log.path.exists()


def test_a_step_called_with_its_examples_inputs_keeps_them_once_on_disk_and_reads_back_whole(tmp_path):
    """Regression: every record held its example's inputs twice (as the record's and as its first step's), so
    examples of long documents took twice their size in each run file and pending log."""
    document = {"document": "x" * 100_000, "question": "q"}
    record = ExampleResult(
        example_id=0,
        inputs=document,
        expected={"answer": "a"},
        predicted={"answer": "a"},
        score=1.0,
        passed=True,
        steps=(StepTrace("read", dict(document), {"notes": "n"}), StepTrace("answer", {"notes": "n"}, {"answer": "a"})),
        error="AdapterParseError: no answer",
        error_kind="program",
        failed_call=StepTrace("check", dict(document), {}),
    )
    run = dataclasses.replace(make_run(), records=(record,), requested_count=1)
    store = RunStore(tmp_path / "runs")
    store.save(run)
    log = store.open_pending({"split": "train", "instructions": run.instructions, "label": "agent", "requested": 1})
    log.append(record)
    log.close()
    written = [path for path in (tmp_path / "runs").rglob("*") if path.suffix in (".json", ".jsonl")]
    assert len(written) == 2
    for path in written:
        assert 100_000 < path.stat().st_size < 150_000, path.name  # the document once, not three times
    assert RunStore(tmp_path / "runs").get(run.run_id).records == (record,)
    [(_, _, recovered)] = RunStore(tmp_path / "runs").pending()
    assert recovered == [record] and recovered[0].steps[0].inputs == document
    assert run.to_dict()["records"][0]["steps"][0]["inputs"] == document  # what the agent and callers see: whole
    # values equal but of another type are written as they are (3.0 is not 3, 1 not True: an analysis hashes them)
    typed = dataclasses.replace(
        record, inputs={"k": 3, "flag": True}, steps=(StepTrace("read", {"k": 3.0, "flag": 1}, {}),)
    )
    assert "inputs" in typed.to_dict(compact=True)["steps"][0]
    assert ExampleResult.from_dict(json.loads(json.dumps(typed.to_dict(compact=True)))).steps[0].inputs == {
        "k": 3.0,
        "flag": 1,
    }
    assert type(ExampleResult.from_dict(typed.to_dict(compact=True)).steps[0].inputs["k"]) is float


def test_an_in_flight_log_settled_while_a_store_opens_is_skipped(tmp_path, monkeypatch):
    """Regression: a log another store removed (its run saved) between listing and reading raised FileNotFoundError."""
    store = RunStore(tmp_path / "runs")
    gone = tmp_path / "runs" / "runs" / "pending-0123456789abcdef.jsonl"
    monkeypatch.setattr(type(store.layout), "pending_logs", lambda self: [gone])
    assert store.pending() == []


def test_a_pending_log_whose_last_lines_cannot_be_flushed_stops_the_run_naming_it(tmp_path):
    """Regression: a full disk met when the log was closed escaped as a bare OSError, naming no file; discarding the
    log (its records saved in a run) still removes it."""
    from rlmoptimizer.storage.run_store import PendingLog

    def on_a_full_disk(log):
        real_close = log._handle.close

        def close():
            real_close()
            raise OSError(28, "No space left on device")

        log._handle.close = close
        return log

    log = on_a_full_disk(PendingLog(tmp_path / "pending-1.jsonl", {"split": "train"}))
    with pytest.raises(WriteFailed, match="pending-1.jsonl: No space left on device"):
        log.close()
    on_a_full_disk(PendingLog(tmp_path / "pending-2.jsonl", {"split": "train"})).discard()
    assert not (tmp_path / "pending-2.jsonl").exists()
