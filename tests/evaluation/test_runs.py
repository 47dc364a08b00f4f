"""Runs: a program on a split as one stored, charged, cached run; partial runs when it stops early."""

from __future__ import annotations

import json

import dspy
import pytest
from support.fakes import FunctionLM
from support.qa import echo_lm, exact, examples, field, make_evaluator

from rlmoptimizer.budget import TRAIN_EXAMPLE, VAL_EXAMPLE, BudgetLedger
from rlmoptimizer.errors import EvaluationLMError, MetricError
from rlmoptimizer.evaluation.runs import Runs
from rlmoptimizer.events import EvaluationStarted, Observers
from rlmoptimizer.fingerprint import apply_instructions
from rlmoptimizer.records import LM_CALL_ERROR, METRIC_ERROR, PROGRAM_ERROR, EvalRun, ExampleResult
from rlmoptimizer.storage.journal import RunJournal
from rlmoptimizer.storage.run_store import RunStore


def make_service(tmp_path, lm, limit=1000, metric=exact, splits=None, **kwargs):
    ledger = BudgetLedger(limit)
    store = RunStore(tmp_path)
    splits = splits or {"train": examples(10), "val": examples(4)}
    service = Runs(
        evaluator=make_evaluator(lm, metric=metric, num_threads=4, **kwargs), store=store, ledger=ledger, splits=splits
    )
    return service, ledger, store


def test_a_run_is_evaluated_charged_and_stored(tmp_path):
    lm = echo_lm()
    service, ledger, store = make_service(tmp_path, lm)
    run = service.evaluate(dspy.ChainOfThought("question -> answer"), "train", label="agent")
    assert (run.run_id, run.split, run.label) == ("run-0001", "train", "agent")
    assert run.instructions == {"predict": "Given the fields `question`, produce the fields `answer`."}
    assert (run.evaluated_count, run.requested_count, run.passed_count, run.score) == (10, 10, 10, 1.0)
    assert (run.budget_spent, run.budget_left, ledger.spent_by_kind[TRAIN_EXAMPLE]) == (10, 990, 10)
    assert run.note is None and run.created_at > 0
    assert store.get("run-0001") == run and service.get("run-0001") == run and service.all() == [run]

    val = service.evaluate(dspy.ChainOfThought("question -> answer"), "val", label="agent", ids=[3, 1])
    assert [r.example_id for r in val.records] == [1, 3] and val.requested_count == 2
    assert ledger.spent_by_kind[VAL_EXAMPLE] == 2 and val.budget_left == 988


def test_identical_instructions_reuse_records_and_charge_nothing(tmp_path):
    lm = echo_lm()
    service, ledger, _ = make_service(tmp_path, lm)
    program = dspy.ChainOfThought("question -> answer")
    first = service.evaluate(program, "train", label="agent", ids=[0, 1, 2])
    again = service.evaluate(program.deepcopy(), "train", label="agent", ids=[2, 1, 0, 3])
    assert len(lm.calls) == 4  # only example 3 was new
    assert again.records[:3] == first.records
    assert again.budget_spent == 1 and ledger.spent == 4
    assert "3 record(s) reused" in again.note

    changed = program.deepcopy()
    apply_instructions(changed, {"predict": "Answer tersely."})
    third = service.evaluate(changed, "train", label="agent", ids=[0])
    assert len(lm.calls) == 5 and third.budget_spent == 1 and third.instructions == {"predict": "Answer tersely."}


def test_a_resumed_run_directory_reuses_records_and_charges_nothing(tmp_path):
    lm = echo_lm()
    service, _, _ = make_service(tmp_path, lm)
    first = service.evaluate(dspy.ChainOfThought("question -> answer"), "train", label="agent")
    service.store.flush()  # what compile() does before it returns: the run is on disk, its pending log gone

    lm_after = echo_lm()
    resumed, ledger, store = make_service(tmp_path, lm_after)
    run = resumed.evaluate(dspy.ChainOfThought("question -> answer"), "train", label="agent")
    assert lm_after.calls == [] and ledger.spent == 0 and run.budget_spent == 0
    assert run.records == first.records and run.run_id == "run-0002"
    assert [r.run_id for r in store.all()] == ["run-0001", "run-0002"]


def test_a_budget_smaller_than_the_request_evaluates_what_fits_and_says_so(tmp_path):
    lm = echo_lm()
    splits = {"train": examples(50)}
    service, ledger, _ = make_service(tmp_path, lm, limit=12, splits=splits)
    order = list(range(49, -1, -1))
    run = service.evaluate(dspy.Predict("question -> answer"), "train", label="agent", ids=order)
    assert [r.example_id for r in run.records] == order[:12][::-1]
    assert run.note == "budget allowed 12 of 50 requested examples; 0 units left"
    assert (run.requested_count, run.evaluated_count, run.budget_spent, ledger.spent, ledger.left) == (
        50,
        12,
        12,
        12,
        0,
    )

    empty = service.evaluate(dspy.Predict("question -> answer"), "train", label="agent", ids=[0, 1])
    assert empty.evaluated_count == 0 and empty.note == "budget allowed 0 of 2 requested examples; 0 units left"
    assert ledger.spent == 12 and len(lm.calls) == 12


def test_an_uncharged_evaluation_leaves_the_ledger_alone(tmp_path):
    service, ledger, _ = make_service(tmp_path, echo_lm(), limit=0)
    run = service.evaluate(dspy.Predict("question -> answer"), "train", label="baseline", charged=False)
    assert run.evaluated_count == 10 and run.budget_spent == 0 and ledger.spent == 0


def test_records_whose_lm_call_failed_are_evaluated_again_not_reused(tmp_path):
    state = {"down": True}

    def reply(messages):
        question = field(messages, "question")
        if question == "q2" and state["down"]:
            return dspy.LMServerError("overloaded", model="fake")
        return {"answer": question.replace("q", "a")}

    lm = FunctionLM(reply)
    lm.num_retries = 0
    service, ledger, _ = make_service(tmp_path, lm, transient_retries=1, retry_backoff_s=0.0)
    first = service.evaluate(dspy.Predict("question -> answer"), "train", label="agent", ids=[1, 2, 3])
    assert first.records[1].error.startswith("LMServerError") and first.budget_spent == 2
    assert len(lm.calls) == 4  # q2 was tried twice (one retry), then recorded as an uncharged LM failure
    assert "1 example(s) failed in the LM call itself and were not charged" in first.note
    # its score is on the answered examples: the unanswered one is not held against the instructions
    assert first.score == 1.0 and first.passed_count == 2 and first.evaluated_count == 3

    state["down"] = False
    second = service.evaluate(dspy.Predict("question -> answer"), "train", label="agent", ids=[1, 2, 3])
    assert [r.passed for r in second.records] == [True, True, True]
    assert second.budget_spent == 1 and len(lm.calls) == 5 and ledger.spent == 3


def test_a_systemic_failure_saves_a_partial_run_then_raises(tmp_path):
    def reply(messages):
        number = int(field(messages, "question")[1:])
        return {"answer": f"a{number}"} if number < 2 else dspy.LMAuthError("revoked", model="fake")

    lm = FunctionLM(reply)
    ledger = BudgetLedger(100)
    store = RunStore(tmp_path)
    service = Runs(
        evaluator=make_evaluator(lm, num_threads=1), store=store, ledger=ledger, splits={"train": examples(10)}
    )
    with pytest.raises(EvaluationLMError):
        service.evaluate(dspy.Predict("question -> answer"), "train", label="agent")
    (partial,) = store.all()
    assert partial.label == "agent:partial" and "EvaluationLMError" in partial.note
    assert [r.example_id for r in partial.records] == [0, 1, 2, 3, 4]
    assert partial.budget_spent == 2 == ledger.spent and partial.requested_count == 10
    store.flush()
    assert RunStore(tmp_path).get(partial.run_id) == partial
    assert not list((tmp_path / "runs").glob("pending-*"))


def test_a_metric_error_saves_a_partial_run_then_raises(tmp_path):
    def metric(example, prediction):
        return None if example.question == "q1" else True

    service, ledger, store = make_service(tmp_path, echo_lm(), metric=metric)
    service.evaluator.num_threads = 1
    with pytest.raises(MetricError, match="returned None"):
        service.evaluate(dspy.Predict("question -> answer"), "train", label="agent")
    (partial,) = store.all()
    assert partial.label == "agent:partial" and [r.example_id for r in partial.records] == [0]
    assert partial.budget_spent == 1 == ledger.spent


def test_an_interrupt_raised_inside_the_metric_saves_what_was_paid_as_a_partial_run(tmp_path):
    """Regression: a KeyboardInterrupt raised in a worker thread (inside the metric) discarded the records that had
    completed and been charged; a resume paid for them again."""

    interrupted: list[bool] = []

    def metric(example, prediction):
        if example.question == "q2" and not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return True

    lm = echo_lm()
    service, ledger, store = make_service(tmp_path, lm, metric=metric)
    service.evaluator.num_threads = 1
    with pytest.raises(KeyboardInterrupt):
        service.evaluate(dspy.Predict("question -> answer"), "train", label="agent")
    (partial,) = store.all()
    assert partial.label == "agent:partial" and [r.example_id for r in partial.records] == [0, 1]
    assert partial.budget_spent == 2 == ledger.spent

    calls = len(lm.calls)
    again = service.evaluate(dspy.Predict("question -> answer"), "train", label="agent")
    assert again.evaluated_count == 10 and len(lm.calls) - calls == 8  # the two paid records are reused
    assert ledger.spent == 10


def test_a_records_error_kind_decides_whether_it_is_reused_and_survives_a_round_trip():
    """The kind is stored when the record is made, never read back out of the error text."""

    def record(error, kind):
        return ExampleResult(0, {}, {}, {}, 0.0, False, error=error, error_kind=kind)

    assert record(None, None).reusable
    assert record("ValueError: boom", PROGRAM_ERROR).reusable
    assert record("ValueError: judge failed", METRIC_ERROR).reusable
    assert not record("LMRateLimitError: slow down", LM_CALL_ERROR).reusable
    failed = record("LMAuthError: [m] bad key", LM_CALL_ERROR)
    assert (
        ExampleResult.from_dict(failed.to_dict()) == failed and not ExampleResult.from_dict(failed.to_dict()).reusable
    )


class Recorder:
    def __init__(self):
        self.events = []

    def on_event(self, event):
        self.events.append(event)


class CountingJournal(RunJournal):
    ledger_writes = 0

    def write_ledger(self, snapshot):
        self.ledger_writes += 1
        super().write_ledger(snapshot)


def test_runs_send_each_evaluation_event_once_and_the_ledger_is_written_once_per_evaluation(tmp_path):
    recorder, journal = Recorder(), CountingJournal(tmp_path)
    ledger, store = BudgetLedger(100), RunStore(tmp_path)
    service = Runs(
        evaluator=make_evaluator(echo_lm(), num_threads=4),
        store=store,
        ledger=ledger,
        splits={"train": examples(10)},
        observer=Observers([recorder, journal]),
    )
    program = dspy.Predict("question -> answer")
    run = service.evaluate(program, "train", label="agent", ids=[0, 1, 2, 3, 4, 5])
    kinds = [type(e).__name__ for e in recorder.events]
    assert kinds == ["EvaluationStarted"] + ["ExampleEvaluated"] * 6 + ["EvaluationFinished"]
    assert recorder.events[0] == EvaluationStarted("train", "agent", 6)
    assert recorder.events[-1].run == run and recorder.events[-1].budget["spent"] == 6
    assert journal.ledger_writes == 1  # not once per example
    assert json.loads((tmp_path / "ledger.json").read_text())["spent"] == 6

    service.evaluate(program, "train", label="agent", ids=[0, 1])  # all reused: no example events
    assert [type(e).__name__ for e in recorder.events[8:]] == ["EvaluationStarted", "EvaluationFinished"]
    assert journal.ledger_writes == 2


def test_a_pending_log_left_by_a_killed_process_becomes_a_recovered_run_and_is_charged_once(tmp_path):
    """The ledger on disk is written once per evaluation, so records of an evaluation that never finished
    are charged when they are recovered; a log whose records a saved run holds is only deleted."""
    store = RunStore(tmp_path)
    header = {"label": "agent", "split": "train", "instructions": {"predict": "x"}, "requested": 5, "charged": True}
    ok = ExampleResult(0, {"question": "q0"}, {"answer": "a0"}, {"answer": "a0"}, 1.0, True)
    no_answer = ExampleResult(
        1,
        {"question": "q1"},
        {"answer": "a1"},
        {},
        0.0,
        False,
        error="LMRateLimitError: slow",
        error_kind=LM_CALL_ERROR,
    )
    killed = store.open_pending(header)
    killed.append(ok)
    killed.append(no_answer)
    killed.close()
    saved_log = store.open_pending(header)
    saved_log.append(ok)
    saved_log.close()
    store.save(EvalRun("run-0001", "train", "agent", {"predict": "x"}, (ok,), 1, 1, 99))

    ledger = BudgetLedger(100)
    Runs(evaluator=make_evaluator(echo_lm()), store=RunStore(tmp_path), ledger=ledger, splits={"train": examples(10)})
    recovered = [run for run in RunStore(tmp_path).all() if run.label == "agent:recovered"]
    assert len(recovered) == 1 and recovered[0].records == (ok, no_answer)
    assert recovered[0].budget_spent == 1 == ledger.spent  # the LM-call failure is not charged
    assert not list((tmp_path / "runs").glob("pending-*"))


class RaisesAfterItsStep(dspy.Module):
    """A program whose own check of the LM's answer raises on every example, whatever its instructions."""

    def __init__(self):
        super().__init__()
        self.predict = dspy.Predict("question -> answer")

    def forward(self, question):
        self.predict(question=question)
        raise ValueError("not a known queue")


def test_a_program_error_stops_only_after_three_different_instructions_for_its_step(tmp_path):
    """Regression: one candidate evaluated three times (on more ids each time) counted as three tries and raised
    ProgramError after a single change; an example whose LM call failed (uncharged, it says nothing about the
    program) ended the check for good."""
    from rlmoptimizer.errors import ProgramError

    def reply(messages):
        if field(messages, "question") == "q9":
            raise dspy.LMUnexpectedError("connection reset")  # an outage (dspy does not retry this one)
        return {"answer": "billing"}

    service, _, store = make_service(
        tmp_path, FunctionLM(reply), splits={"train": examples(12), "val": examples(4)}, retry_backoff_s=0
    )
    program = RaisesAfterItsStep()
    baseline = service.evaluate(program, "train", label="baseline", ids=range(10), charged=False)
    assert [r.error_kind for r in baseline.records].count(LM_CALL_ERROR) == 1  # an outage on the baseline too
    service.check_baseline(baseline)

    def candidate(text):
        changed = program.deepcopy()
        apply_instructions(changed, {"predict": text})
        return changed

    same = candidate("Answer with one known queue.")
    for ids in ([0, 1, 2], [0, 1, 2, 3, 4, 5], [6, 7, 8, 9]):  # example 9's LM call fails: an uncharged record
        service.evaluate(same, "train", label="agent", ids=ids)
    assert any(r.error_kind == LM_CALL_ERROR for run in store.all() for r in run.records)
    service.evaluate(candidate("Name the queue."), "train", label="agent", ids=[0, 1, 2])
    with pytest.raises(ProgramError, match="3 evaluated candidates with other instructions") as stopped:
        service.evaluate(candidate("Say which queue."), "train", label="agent", ids=[0, 1, 2])
    assert "ValueError: not a known queue" in str(stopped.value)


def test_a_program_that_raises_before_any_step_runs_is_stopped_after_three_different_instructions(tmp_path):
    """Regression: with no step run on the baseline, no changed instructions counted as a try, and a program that
    could never reach its LM spent the whole budget."""
    from rlmoptimizer.errors import ProgramError

    class RaisesFirst(RaisesAfterItsStep):
        def forward(self, question):
            raise KeyError("context")

    service, _, _ = make_service(tmp_path, echo_lm())
    program = RaisesFirst()
    service.check_baseline(service.evaluate(program, "train", label="baseline", charged=False))
    with pytest.raises(ProgramError, match="KeyError"):
        for text in ("Answer.", "Answer well.", "Answer briefly.", "Answer at once."):
            changed = program.deepcopy()
            apply_instructions(changed, {"predict": text})
            service.evaluate(changed, "train", label="agent", ids=[0, 1, 2])
    assert text == "Answer briefly."  # the third
