"""The run directory's layout: every file the storage writes is one the layout names, and the report reads the
same files back."""

from __future__ import annotations

from support.manifests import MANIFEST

from rlmoptimizer.records import EvalRun, ExampleResult
from rlmoptimizer.report.rundir import read_run_directory
from rlmoptimizer.storage import layout
from rlmoptimizer.storage.answers import AnswerStore
from rlmoptimizer.storage.candidates import write_candidates, write_gepa_progress
from rlmoptimizer.storage.journal import RunJournal
from rlmoptimizer.storage.layout import PROMPT_VERSIONS, RUNS, TURNS, RunLayout
from rlmoptimizer.storage.lock import RunDirectoryLock
from rlmoptimizer.storage.notes import NotesStore
from rlmoptimizer.storage.run_store import RunStore


def _record(example_id: int) -> ExampleResult:
    return ExampleResult(example_id, {"q": "x"}, {"a": "y"}, {"a": "y"}, 1.0, True)


def test_numbered_names_round_trip_and_other_names_are_not_numbered():
    assert TURNS.name(7) == "turn-0007.json" and TURNS.number("turn-0007") == 7
    assert RUNS.stem(12345) == "run-12345" and RUNS.number("run-12345") == 12345
    assert PROMPT_VERSIONS.number("v-0003") == 3
    assert [TURNS.number(stem) for stem in ("turn-x-0001", "v-0001", "turn-", "turn-12a")] == [None] * 4


def test_every_file_the_storage_writes_is_named_by_the_layout_and_read_back_by_the_report(tmp_path):
    paths = RunLayout(tmp_path)
    lock = RunDirectoryLock(tmp_path)
    journal = RunJournal(tmp_path)
    assert not journal.open_manifest(MANIFEST)
    store = RunStore(tmp_path)
    pending = store.open_pending({"split": "train", "instructions": {"s": "i"}, "requested": 2})
    pending.append(_record(1))
    store.save(EvalRun(store.next_run_id(), "train", "agent", {"s": "i"}, (_record(0),), 1, 9, 1))
    journal.write_turn({"iteration": 1, "code": "x", "output": "", "final": False})
    journal.write_prompt_version({"version": 1, "step": "s", "text": "t", "previous": "i", "source": "update_prompt"})
    journal.write_ledger({"limit": 10, "spent": 1, "left": 9, "spent_by_kind": {}})
    journal.write_usage({"total": {"calls": 1}})
    NotesStore(tmp_path).add("a conclusion")
    write_candidates(tmp_path, {"proposal-1": {"s": "t"}}, {"proposal-1": {"move": "propose"}})
    write_gepa_progress(tmp_path, {"gepa-run-1": {"budget": 4, "taken": 2, "finished": False}})
    AnswerStore(tmp_path, name=layout.GEPA_REFLECTIONS).put("k", "an answer")
    journal.write_stop(RuntimeError("the sub LM is down"))
    stopped = read_run_directory(tmp_path)
    assert stopped.stopped["error"] == "RuntimeError"  # (shown once no compile holds the directory)
    assert stopped.stopped["message"] == "the sub LM is down"
    journal.write_result({"optimized_dspy_program": {"s": "t"}})

    named = {
        paths.lock,
        paths.holder,
        paths.manifest,
        paths.ledger,
        paths.usage,
        paths.notes,
        paths.candidates,
        paths.gepa_runs,
        tmp_path / layout.GEPA_REFLECTIONS,
        paths.result,
        paths.stopped,
        paths.run("run-0001"),
        paths.numbered_path(TURNS, 1),
        paths.numbered_path(PROMPT_VERSIONS, 1),
        pending.path,
    }
    assert {p for p in tmp_path.rglob("*") if p.is_file()} == named
    assert paths.pending_logs() == [pending.path] and [n for n, _ in paths.numbered(RUNS)] == [1]

    read = read_run_directory(tmp_path)
    assert read.status == "finished" and not read.problems
    assert [run.run_id for run in read.runs] == ["run-0001"] and len(read.pending[0].records) == 1
    assert len(read.turns) == 1 and len(read.prompt_versions) == 1 and read.ledger["spent"] == 1
    assert read.named_candidates == {"proposal-1": {"s": "t"}} and read.manifest["budget_limit"] == 10
    lock.release()
    store.flush()
