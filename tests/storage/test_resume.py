"""What a resume reads back from a run directory, once, as one frozen record."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from support.manifests import MANIFEST

from rlmoptimizer.errors import RunDirectoryMismatchError
from rlmoptimizer.storage.journal import RunJournal
from rlmoptimizer.storage.resume import Resume, open_run_directory


def test_a_fresh_directory_is_not_a_resume(tmp_path):
    assert open_run_directory(RunJournal(tmp_path), MANIFEST) == Resume(resumed=False)


def test_a_resume_reads_back_the_ledger_versions_and_turns_once(tmp_path):
    journal = RunJournal(tmp_path)
    open_run_directory(journal, MANIFEST)
    journal.write_ledger({"limit": 10, "spent": 3, "left": 7, "spent_by_kind": {}})
    journal.write_prompt_version({"version": 1, "step": "s", "text": "t", "previous": "o", "source": "update_prompt"})
    journal.write_turn({"iteration": 1, "code": "x", "output": "", "final": False})
    journal.write_turn({"iteration": 2, "code": "SUBMIT()", "output": "", "final": True})
    journal.flush()

    resume = open_run_directory(RunJournal(tmp_path), {**MANIFEST, "created_at": 2.0})
    assert resume.resumed and resume.ledger["spent"] == 3
    assert [v["text"] for v in resume.prompt_versions] == ["t"]
    assert [t["iteration"] for t in resume.turns] == [1, 2] and resume.final_turn["code"] == "SUBMIT()"
    with pytest.raises(dataclasses.FrozenInstanceError):
        resume.turns = ()


def test_a_directory_of_another_compile_is_refused(tmp_path):
    open_run_directory(RunJournal(tmp_path), MANIFEST)
    with pytest.raises(RunDirectoryMismatchError, match="metric"):
        open_run_directory(RunJournal(tmp_path), {**MANIFEST, "metric": "other"})


def test_a_changed_valset_under_the_same_budget_setting_is_not_called_a_changed_budget(tmp_path):
    """Regression: a valset of 6 instead of 8 under the same max_metric_calls was refused as "a different valset,
    budget", pointing at a setting the user never changed (the budget's units follow from the valset's size)."""
    open_run_directory(RunJournal(tmp_path), MANIFEST)
    smaller = {**MANIFEST, "valset": "other", "budget_limit": MANIFEST["budget_limit"] + 2}
    with pytest.raises(RunDirectoryMismatchError, match=r"a run of a different valset; it cannot be resumed"):
        open_run_directory(RunJournal(tmp_path), smaller)
    with pytest.raises(RunDirectoryMismatchError, match=r"a run of a different valset, budget;"):  # both changed
        open_run_directory(RunJournal(tmp_path), {**smaller, "budget_mode": {"max_metric_calls": 99}})


def test_a_changed_trainset_under_the_same_max_full_evals_is_not_called_a_changed_budget(tmp_path):
    """Regression: max_full_evals=1 sizes max_metric_calls from the data, so 24 train examples instead of 20 changed
    the stored budget too, and the refusal said to pass max_metric_calls=20 to resume: a setting never passed."""
    sized = {**MANIFEST, "budget_mode": {"max_metric_calls": 28}, "budget_setting": {"max_full_evals": 1}}
    open_run_directory(RunJournal(tmp_path), sized)
    more = {**sized, "trainset": "more", "budget_mode": {"max_metric_calls": 32}, "budget_limit": 24}
    with pytest.raises(RunDirectoryMismatchError) as refused:
        open_run_directory(RunJournal(tmp_path), more)
    assert "a run of a different trainset; it cannot" in str(refused.value)
    assert "max_metric_calls" not in str(refused.value)
    with pytest.raises(RunDirectoryMismatchError, match=r"a run of a different trainset, budget;"):
        open_run_directory(RunJournal(tmp_path), {**more, "budget_setting": {"max_full_evals": 2}})


def test_a_directory_whose_examples_were_digested_another_way_is_another_run(tmp_path):
    """0.1.0 reads no earlier digest of the examples: a manifest of another ``examples_digest_version`` holds
    other trainset/valset digests, so it is refused with the usual message and left as it was."""
    older = {**MANIFEST, "trainset": "t-v1", "valset": "v-v1", "examples_digest_version": 1}
    open_run_directory(RunJournal(tmp_path), older)
    with pytest.raises(RunDirectoryMismatchError, match=r"a run of a different trainset, valset; it cannot be resumed"):
        open_run_directory(RunJournal(tmp_path), MANIFEST)
    assert json.loads((tmp_path / "manifest.json").read_text()) == older


@pytest.mark.parametrize(
    ("missing", "message"),
    [("budget_mode", r"a run of a different budget;"), ("eval_lm", r"scores from a different evaluation LM")],
)
def test_a_manifest_without_a_key_every_manifest_holds_is_another_compiles(tmp_path, missing, message):
    """0.1.0 reads no manifest written before it: one without ``budget_mode`` or ``eval_lm`` is refused, and left as
    it was (no key is filled in from this compile)."""
    older = {key: value for key, value in MANIFEST.items() if key != missing}
    open_run_directory(RunJournal(tmp_path), older)
    with pytest.raises(RunDirectoryMismatchError, match=message):
        open_run_directory(RunJournal(tmp_path), MANIFEST)
    assert json.loads((tmp_path / "manifest.json").read_text()) == older


def test_the_gepa_runs_a_resume_runs_again_are_only_those_at_the_end():
    """Runs are named by number: a resume goes on after the last run an earlier process is done with, and replays
    under their own names only the runs at the end it did not finish or started in the turn it replays. Regression:
    a run an error stopped early in a compile, followed by finished runs, made the next run reuse a finished run's
    name (its progress overwritten, or the wrong run replayed)."""
    from rlmoptimizer.storage.candidates import gepa_runs_done

    def runs(*finished):
        return {f"gepa run {i + 1}": {"budget": 10, "taken": 5, "finished": done} for i, done in enumerate(finished)}

    assert gepa_runs_done({}, set(), set()) == 0
    assert gepa_runs_done(runs(True, True), set(), set()) == 2
    assert gepa_runs_done(runs(True, False), set(), set()) == 1  # the last was cut off: "gepa run 2" is replayed
    assert gepa_runs_done(runs(False, True), set(), set()) == 2  # stopped by an error, then another ran: go on
    assert gepa_runs_done(runs(False, True), set(), {"gepa run 2"}) == 1  # the turn replays run 2, not run 1 ...
    assert gepa_runs_done(runs(True, True), set(), {"gepa run 2"}) == 1  # ... its own run, after the finished one
    assert gepa_runs_done({}, {"gepa run 3", None, "other"}, set()) == 3  # older directories: the candidates' lineage


def test_an_answer_kept_after_a_torn_line_is_read_back(tmp_path):
    """Regression: the next answer was appended to a torn last line (a process killed mid-write), and that whole
    line was then unreadable: a resume paid for the answer again."""
    from rlmoptimizer.storage.answers import AnswerStore

    store = AnswerStore(tmp_path, name="answers.jsonl")
    store.put("a", "first")
    path = tmp_path / "answers.jsonl"
    path.write_bytes(path.read_bytes() + b'{"key": "b", "text": "cut sh')  # killed while writing the second
    AnswerStore(tmp_path, name="answers.jsonl").put("c", "third")
    again = AnswerStore(tmp_path, name="answers.jsonl")
    assert (again.get("a"), again.get("b"), again.get("c")) == ("first", None, "third")


def test_run_directory_files_get_the_mode_any_file_of_the_process_gets(tmp_path):
    """Regression: every JSON file of a run directory was written private (mkstemp's 0600) whatever the umask, so a
    teammate, a CI artifact reader or a container running as another user could not resume or report it, while the
    .jsonl files beside them were readable."""
    import stat

    from rlmoptimizer.storage.files import atomic_write_json

    atomic_write_json(tmp_path / "ledger.json", {"spent": 1})
    (tmp_path / "plain.jsonl").write_text("{}\n")
    mode = stat.S_IMODE((tmp_path / "ledger.json").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "plain.jsonl").stat().st_mode)


def not_readable(monkeypatch, path) -> None:
    """``path`` as another user's file reads to this one: every read of it is denied."""
    from pathlib import Path

    real = Path.read_text

    def denied(self, *args, **kwargs):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)


def test_a_run_file_this_user_cannot_read_is_told_apart_from_a_damaged_one(tmp_path, monkeypatch):
    """Regression: a manifest another user wrote (no read permission here) was called damaged, with the advice to
    restore it from a backup or start over, and so pay everything again."""

    from rlmoptimizer.errors import RunDirectoryMismatchError
    from rlmoptimizer.storage.journal import read_record_file

    path = tmp_path / "manifest.json"
    path.write_text("{}")
    not_readable(monkeypatch, path)
    with pytest.raises(RunDirectoryMismatchError, match="another user") as refused:
        read_record_file(path)
    assert "Permission denied" in str(refused.value) and "backup" not in str(refused.value)


def test_a_run_file_this_user_cannot_read_stops_the_resume_instead_of_being_paid_again(tmp_path, monkeypatch):
    """Regression: a run file another user wrote was skipped as damaged, and its examples were paid for again."""

    from rlmoptimizer.errors import RunDirectoryMismatchError
    from rlmoptimizer.records import EvalRun
    from rlmoptimizer.storage.run_store import RunStore

    RunStore(tmp_path).save(EvalRun("run-0001", "train", "baseline", {"s": "i"}, (), 0, 0, 10))
    not_readable(monkeypatch, tmp_path / "runs" / "run-0001.json")
    with pytest.raises(RunDirectoryMismatchError, match="another user"):
        RunStore(tmp_path)


def test_a_lock_a_report_is_testing_at_that_instant_is_waited_out(tmp_path):
    """Regression: a report testing the lock (shared, for an instant) as a compile started made the compile fail
    with RunDirectoryInUseError, naming whatever process the holder file named."""
    import threading

    fcntl = pytest.importorskip("fcntl")
    from rlmoptimizer.storage.lock import RunDirectoryLock

    (tmp_path / ".lock").touch()
    fd = os.open(tmp_path / ".lock", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)

    def report_done():
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    threading.Timer(0.03, report_done).start()
    RunDirectoryLock(tmp_path).release()
