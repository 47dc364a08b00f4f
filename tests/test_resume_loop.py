"""A loop-mode compile interrupted anywhere and resumed pays what one uninterrupted run pays and returns what it
returns: the resumed turn draws the same examples for its comparisons and the same demos, and a GEPA run cut off
in the middle goes on with its own budget, its paid work replayed.

Regressions: the comparison sample was seeded by the number of stored runs and the demos by the number of
candidates, both changed by the interrupted process, so the resumed turn paid for other examples (83 units where
one run paid 66); the policy asked for GEPA with the budget left, not the interrupted run's, so that run started
anew and the child it had found and paid for was dropped; a resume cut in the phase after GEPA's replayed GEPA's
phase for free, took that as a phase that changed nothing and ended the run with half its budget unspent."""

from __future__ import annotations

import _thread
import hashlib
import json
import threading

import pytest
from support.tickets import RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import OptimizationInterrupted, RLMDocstringOptimizer
from rlmoptimizer.testing import FunctionLM, last_user_text

VARIANTS = (
    "Route by topic. Any chargeback goes to disputes.",
    "Route by topic. An unknown login goes to security.",
    "Choose billing, technical, how-to, disputes or security by the main topic.",
)


def digest(text: str) -> int:
    return int(hashlib.sha1(text.encode()).hexdigest(), 16)


class Lms:
    """Deterministic task and reflection LMs; the task LM interrupts the main thread at its ``interrupt_at``-th
    call, as Ctrl-C does."""

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.interrupt_at, self.eval_calls, self.lock = interrupt_at, 0, threading.Lock()
        self.eval = FunctionLM(self._task, name="task")
        self.sub = FunctionLM(self._reflect, name="reflection")

    def _task(self, messages):
        with self.lock:
            self.eval_calls += 1
            if self.eval_calls == self.interrupt_at:
                _thread.interrupt_main()
        user = last_user_text(messages)
        if "[[ ## summary ## ]]" in user and digest(user.split("[[ ## summary ## ]]", 1)[1][:80]) % 4 == 0:
            return {"queue": "unknown"}  # a quarter of the tickets fail whatever the instructions
        return task_lm_reply(messages)

    def _reflect(self, messages):
        text = json.dumps(messages, sort_keys=True, default=str)
        parts = ["Route the summary by topic."] + (["Any chargeback goes to disputes."] if "chargeback" in text else [])
        return json.dumps({"new_instruction": " ".join([*parts, VARIANTS[digest(text) % len(VARIANTS)]])})

    def compile(self, directory, max_metric_calls: int):
        train, val = make_splits()
        optimizer = RLMDocstringOptimizer(
            rlm_autopilot="loop",
            max_metric_calls=max_metric_calls,
            sub_lm=self.sub,
            eval_lm=self.eval,
            run_storage_dir=directory,
            num_threads=1,
        )
        return optimizer.compile(student=RouteTicket(), trainset=train, valset=val, metric=metric)


@pytest.mark.parametrize(
    ("max_metric_calls", "where"),
    [
        (150, "the comparisons after GEPA"),
        (150, "the phase after GEPA's"),
        (150, "a GEPA iteration"),
        (40, "GEPA's check of its child"),
    ],
)
def test_an_interrupted_loop_resumed_pays_what_one_run_pays(tmp_path, max_metric_calls, where):
    whole = Lms()
    reference = whole.compile(tmp_path / "whole", max_metric_calls)
    at = {
        "the comparisons after GEPA": whole.eval_calls - 1,
        "the phase after GEPA's": 110,
        "a GEPA iteration": 88,
        "GEPA's check of its child": 60,
    }
    first = Lms(interrupt_at=at[where])
    with pytest.raises(OptimizationInterrupted):
        first.compile(tmp_path / "cut", max_metric_calls)
    second = Lms()
    resumed = second.compile(tmp_path / "cut", max_metric_calls)
    assert resumed.budget["spent"] == reference.budget["spent"]
    assert first.eval_calls + second.eval_calls <= whole.eval_calls + 2  # (the example under way when cut: 2 calls)
    assert resumed.optimized_dspy_program == reference.optimized_dspy_program
    assert resumed.selection["chosen_score"] == reference.selection["chosen_score"]


def test_a_ctrl_c_landing_as_an_evaluation_completes_keeps_its_paid_records_for_the_resume(tmp_path, monkeypatch):
    """Regression: an interrupt that reached the run after its examples completed but before it was saved (outside
    the evaluation's own Ctrl-C handling) deleted the pending log of those paid records: the resume paid them again
    and the program ran more often than max_metric_calls allows."""
    import concurrent.futures

    from rlmoptimizer.evaluation import evaluator

    whole = Lms()
    reference = whole.compile(tmp_path / "whole", 30)
    ended = {"n": 0}

    class Pool(concurrent.futures.ThreadPoolExecutor):
        def shutdown(self, wait=True, *, cancel_futures=False):
            super().shutdown(wait=wait, cancel_futures=cancel_futures)
            ended["n"] += 1
            if ended["n"] == 7:  # the 7th evaluation's examples have all completed: Ctrl-C now
                raise KeyboardInterrupt

    monkeypatch.setattr(evaluator, "ThreadPoolExecutor", Pool)
    first = Lms()
    with pytest.raises((KeyboardInterrupt, OptimizationInterrupted)):
        first.compile(tmp_path / "cut", 30)
    assert ended["n"] == 7
    monkeypatch.setattr(evaluator, "ThreadPoolExecutor", concurrent.futures.ThreadPoolExecutor)
    second = Lms()
    resumed = second.compile(tmp_path / "cut", 30)
    assert first.eval_calls + second.eval_calls == whole.eval_calls  # nothing paid twice
    assert resumed.budget["spent"] == reference.budget["spent"]
    assert resumed.optimized_dspy_program == reference.optimized_dspy_program


@pytest.mark.parametrize("unwritable", ["holder.json", "run-0002.json", "ledger.json", "pending-"])
def test_a_run_directory_that_cannot_be_written_once_stops_the_run_and_it_resumes_to_the_same_result(
    tmp_path, monkeypatch, unwritable
):
    """Regression: one failed write (a full disk) of a run file was taken for a move that failed: the loop
    submitted the unchanged program as a finished run, which compiling again only read back. Now the run stops,
    says what could not be written, and compiling again (with the disk fine) resumes it to what one run returns."""
    import errno
    import os

    whole = Lms()
    reference = whole.compile(tmp_path / "whole", 40)
    replace, failed = os.replace, []

    def disk_full(name):
        if unwritable in name and not failed:
            failed.append(name)
            raise OSError(errno.ENOSPC, "No space left on device", name)

    def failing_replace(src, dst, *args, **kwargs):
        disk_full(os.path.basename(str(dst)))
        return replace(src, dst, *args, **kwargs)

    class FailingHandle:  # the pending log's appends, after its header
        def __init__(self, handle):
            self._handle, self._lines = handle, 0

        def write(self, text):
            self._lines += 1
            if self._lines > 1:
                disk_full(os.path.basename(self._handle.name))
            return self._handle.write(text)

        def __getattr__(self, name):
            return getattr(self._handle, name)

    from rlmoptimizer.storage import run_store

    monkeypatch.setattr(os, "replace", failing_replace)
    monkeypatch.setattr(run_store, "open", lambda *a, **k: FailingHandle(open(*a, **k)), raising=False)
    first = Lms()
    with pytest.raises(OptimizationInterrupted, match=r"could not write .*No space left on device.*Free space") as e:
        first.compile(tmp_path / "cut", 40)
    assert failed and unwritable in str(e.value)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(run_store, "open", open, raising=False)
    second = Lms()
    resumed = second.compile(tmp_path / "cut", 40)  # the directory is not held by the compile that stopped
    assert resumed.optimized_dspy_program == reference.optimized_dspy_program
    assert resumed.selection["chosen_score"] == reference.selection["chosen_score"]
    assert first.eval_calls + second.eval_calls <= whole.eval_calls + 2  # (the record that could not be kept)


def test_a_loop_stopped_after_gepa_finished_and_before_it_adopted_gepas_best_adopts_it_on_resume(tmp_path):
    """Regression: a Ctrl-C after GEPA's run had finished (here: in a callback told of GEPA's candidate) and before
    the loop adopted its best left the resumed loop believing GEPA had found nothing: it never adopted GEPA's best
    and paid for more proposals than one run does."""
    whole = Lms()
    reference = whole.compile(tmp_path / "whole", 40)

    def interrupt(event):
        if type(event).__name__ == "CandidateAdded":
            raise KeyboardInterrupt

    first = Lms()
    train, val = make_splits()
    optimizer = RLMDocstringOptimizer(
        rlm_autopilot="loop",
        max_metric_calls=40,
        sub_lm=first.sub,
        eval_lm=first.eval,
        run_storage_dir=tmp_path / "cut",
        num_threads=1,
        callbacks=[interrupt],
    )
    with pytest.raises(OptimizationInterrupted):
        optimizer.compile(student=RouteTicket(), trainset=train, valset=val, metric=metric)
    assert json.loads((tmp_path / "cut" / "gepa_runs.json").read_text())["gepa run 1"]["finished"]
    second = Lms()
    resumed = second.compile(tmp_path / "cut", 40)
    assert resumed.optimized_dspy_program == reference.optimized_dspy_program
    assert resumed.budget["spent"] == reference.budget["spent"]
    assert first.eval_calls + second.eval_calls == whole.eval_calls  # nothing paid twice
    assert first.sub.calls and len(first.sub.calls) + len(second.sub.calls) == len(whole.sub.calls)


def test_a_baseline_whose_run_file_was_damaged_is_paid_from_the_budget_on_resume(tmp_path):
    """Regression: a resume whose validation baseline's run file could not be read evaluated it again uncharged, so
    the program ran more often than max_metric_calls allows. Now it is paid from the budget when the budget has
    enough left (the limit holds), and a warning says so when it has not."""
    train, val = make_splits()
    first = Lms(interrupt_at=60)
    with pytest.raises(OptimizationInterrupted):
        first.compile(tmp_path, 40)
    baseline = tmp_path / "runs" / "run-0001.json"
    assert json.loads(baseline.read_text())["label"] == "baseline"
    baseline.write_text('{"run_id": "run-0001", "spl')  # damaged, as a disk error or an editor leaves it
    second = Lms()
    resumed = second.compile(tmp_path, 40)
    ran = (first.eval_calls + second.eval_calls) // 2  # two steps: two LM calls a program run
    examples = resumed.budget["spent_by_kind"]["train_example"] + resumed.budget["spent_by_kind"]["val_example"]
    # every program run is paid from the budget but the first validation baseline (free, outside the limit): the
    # baseline run again is paid too (one more run at most: the example under way when the first process stopped)
    assert ran - (examples + len(val)) in (0, 1), (ran, resumed.budget)
    assert ran <= 40 + 1 and resumed.budget["spent"] <= resumed.budget["limit"]


def test_running_out_of_memory_stops_the_loop_resumably(tmp_path):
    """Regression: a MemoryError in an evaluation was taken by the loop for a phase that failed: it submitted the
    unchanged program as a finished run, which compiling again only read back."""
    whole = Lms()
    reference = whole.compile(tmp_path / "whole", 40)

    class OutOfMemory(Lms):
        def _task(self, messages):
            if self.eval_calls == 40:
                self.eval_calls += 1
                raise MemoryError("cannot allocate")
            return super()._task(messages)

    first = OutOfMemory()
    with pytest.raises(OptimizationInterrupted, match="MemoryError") as stopped:
        first.compile(tmp_path / "cut", 40)
    assert "resume" in str(stopped.value)
    resumed = Lms().compile(tmp_path / "cut", 40)
    assert resumed.optimized_dspy_program == reference.optimized_dspy_program
    assert resumed.selection["chosen_score"] == reference.selection["chosen_score"]
