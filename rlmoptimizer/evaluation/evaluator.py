"""The threaded :class:`Evaluator`: a program run on examples, each scored by the metric, as records.

Per-example failures are data: an example whose program or metric raised becomes a record with the
error text, its kind (:data:`~rlmoptimizer.records.ERROR_KINDS`, decided once, here) and score 0. An
evaluation stops early for two systemic reasons, and for an interrupt; it then raises
:class:`EvaluationStopped`, which holds the records that did complete and the reason:

* :class:`EvaluationLMError`: the evaluation LM failed with an error retrying cannot fix (bad key, no
  billing, unknown model, unreachable host) on ``max_consecutive_lm_failures`` consecutive examples, or gave no
  answer even after the retries (a 5xx, a timeout) on ``max_unanswered_in_a_row`` distinct examples in a row (or on
  every example the compile has, when it has fewer),
  counted over every evaluation of the compile (an LM that is down fails each 3-example minibatch the same way; an
  example that fails on its own, drawn again and again, counts once);
* :class:`MetricError`: the metric returned something that is not a score (a bug in the metric);
* ``KeyboardInterrupt`` (or any other exception in the calling thread) while the examples ran, or raised by a
  worker outside what the program and metric may raise (an interrupt raised inside a metric, a failing
  ``on_record``).

Budget: one unit per example that produced an answer, charged as it completes, including examples whose
program raised on a bad LM reply and examples whose metric raised. An example that got no answer because
the LM call itself failed (authentication, transport, rate limit after DSPy's own retries, ...) is not
charged, and neither is an example that never started.

May import: dspy, ``rlmoptimizer.budget``, ``.errors``, ``.fingerprint``, ``.metric``, ``.records`` and
``.lm_failures``.
"""

from __future__ import annotations

import contextvars
import logging
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import dspy

from rlmoptimizer.budget import Reservation
from rlmoptimizer.errors import EvaluationLMError, MetricError
from rlmoptimizer.evaluation.lm_failures import SYSTEMIC, TRANSIENT, classify_lm_failure, format_error
from rlmoptimizer.evaluation.steps import StepNames
from rlmoptimizer.fingerprint import canonical_json
from rlmoptimizer.metric import Metric
from rlmoptimizer.records import LM_CALL_ERROR, METRIC_ERROR, PROGRAM_ERROR, ExampleResult, StepTrace, jsonable

logger = logging.getLogger(__name__)


def _raise_if_out_of_memory(exc: BaseException) -> None:
    """Raise the ``MemoryError`` ``exc`` is or was raised from (an LM client wraps it): the machine, not the example,
    so the evaluation stops (resumable) and keeps no record of it."""
    current: BaseException | None = exc
    for _ in range(16):
        if current is None:
            return
        if isinstance(current, MemoryError):
            raise current from None
        current = current.__cause__


def _wait_for_running(batch: _Batch, interrupted: bool) -> KeyboardInterrupt | None:
    """Stop ``batch`` from starting examples and wait for those running (counted by the workers: one whose submission a
    Ctrl-C cut off too), so their paid records are kept; a Ctrl-C stops the wait (returned), leaving them to finish
    unkept. ``interrupted``: the evaluation stops for a Ctrl-C already (then the wait is announced)."""
    with batch.lock:
        batch.stop.set()  # (under the lock: no example starts after it)
        running = batch.running
    if not running:
        return None
    if interrupted:
        logger.warning(
            "Evaluation interrupted: waiting for the %d example(s) already running so their records are kept "
            "(Ctrl-C again stops without them).",
            running,
        )
    try:
        with batch.idle:
            while batch.running:
                batch.idle.wait(0.5)
    except KeyboardInterrupt as again:
        logger.warning(
            "Stopped without waiting: %d example(s) still running are left to finish in the background; their "
            "records are not kept (their LM calls may still be paid), and Python exits once they return.",
            batch.running,
        )
        return again
    return None


class EvaluationStopped(Exception):  # noqa: N818 - a stop, not an error of its own: ``reason`` is the error
    """An evaluation stopped before every example ran.

    ``reason`` is why (an :class:`EvaluationLMError`, a :class:`MetricError`, a ``KeyboardInterrupt``, ...);
    ``records`` are the records that did complete, sorted by id, so that nothing paid for is lost.
    """

    def __init__(self, reason: BaseException, records: list[ExampleResult]) -> None:
        super().__init__(f"evaluation stopped after {len(records)} record(s): {type(reason).__name__}: {reason}")
        self.reason = reason
        self.records = records


_PLAIN_TYPES = frozenset({str, int, bool, type(None)})


def distinct_examples(splits: Sequence[Sequence[Any]]) -> int:
    """How many different examples ``splits`` hold, as the outage rule tells them apart (an example's id in its
    split and its inputs): a validation set that repeats the train set adds nothing."""
    return len(
        {(i, canonical_json(_json_dict(_inputs_and_labels(ex)[0]))) for split in splits for i, ex in enumerate(split)}
    )


def _json_dict(data: dict[str, Any]) -> dict[str, Any]:
    """``jsonable(data)``, with a fast path for the common flat dict of plain values."""
    for key, value in data.items():
        kind = type(value)
        if type(key) is not str or (kind not in _PLAIN_TYPES and not (kind is float and math.isfinite(value))):
            return jsonable(data)
    return dict(data)


def _fields(value: Any) -> dict[str, Any]:
    """A prediction's fields as a JSON-safe dict."""
    items = getattr(value, "items", None)
    if callable(items):
        try:
            return _json_dict(dict(items()))
        except Exception:
            pass
    converted = jsonable(value)  # also handles toDict() and pydantic models
    return converted if isinstance(converted, dict) else {"output": converted}


def _inputs_and_labels(example: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(inputs, labels)`` of an example as plain dicts; what ``inputs()`` / ``labels()`` give, without
    building two intermediate Examples per call."""
    store, keys = getattr(example, "_store", None), getattr(example, "_input_keys", None)
    if isinstance(store, dict) and keys:
        inputs = {k: v for k, v in store.items() if k in keys and not k.startswith("dspy_")}
        labels = {k: v for k, v in store.items() if k not in keys and not k.startswith("dspy_")}
        return inputs, labels
    return dict(example.inputs().items()), dict(example.labels().items())


class _RaisingSteps(dspy.utils.BaseCallback):
    """Which step's call raised, and with what inputs, while the program runs on one example (the trace keeps only
    calls that returned). A dspy callback beside the program's own: it watches the calls of the steps (the
    predictors; a module around one that keeps its signature is not a step)."""

    def __init__(self, names: StepNames) -> None:
        self._names = names
        self._open: dict[str, tuple[str, dict[str, Any]]] = {}
        self._raised: list[tuple[StepTrace, BaseException, int]] = []  # (call, its error, step calls ended by then)
        self._ended = 0

    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        name = self._names.name(instance) if isinstance(instance, dspy.Predict) else None
        if name is not None:
            given = inputs.get("kwargs") or {}  # (a predictor takes its inputs by keyword)
            fields = getattr(getattr(instance, "signature", None), "input_fields", None) or {}
            self._open[call_id] = (name, {str(k): v for k, v in given.items() if k in fields})

    def on_module_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        opened = self._open.pop(call_id, None)
        if opened is None:
            return
        self._ended += 1
        if exception is not None:
            call = StepTrace(step_name=opened[0], inputs=_json_dict(opened[1]), outputs={})
            self._raised.append((call, exception, self._ended))

    def call_of(self, error: BaseException) -> StepTrace | None:
        """The step call that raised ``error``, or an error it was raised from: its ``__cause__`` (``raise ... from``),
        or the error it was raised while handling when no step call ended after that one (a step's error the
        program caught and went on from, a fallback, is not the one); None when it raised outside every step."""
        seen: set[int] = set()
        link: BaseException | None = error
        last_only = False  # reached through an implicit context: only the last step call that ended
        while link is not None and id(link) not in seen:
            seen.add(id(link))
            for call, raised, ended in self._raised:  # in the order the calls ended: the innermost step first
                if raised is link and (not last_only or ended == self._ended):
                    return call
            if link.__cause__ is not None:
                link = link.__cause__
            elif link.__context__ is not None and not link.__suppress_context__:
                link, last_only = link.__context__, True
            else:
                link = None
        return None


EVAL_LM = "the evaluation LM"
METRIC_LM = "the LM your metric calls (a judge)"


class _Batch:
    """Mutable state of one ``Evaluator.evaluate`` call, shared by its worker threads."""

    def __init__(self, total: int, reservation: Reservation | None) -> None:
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.total = total
        self.reservation = reservation
        self.records: list[ExampleResult] = []
        self.consecutive_lm_failures = 0
        self.systemic_failures = 0
        self.last_lm_error: BaseException | None = None
        self.last_lm_whose = EVAL_LM  # whose LM failed last: the program's or the metric's own
        self.fatal: BaseException | None = None
        self.crash: BaseException | None = None
        self.finished = 0  # examples finished or skipped
        self.running = 0  # examples started and not finished (started only while ``stop`` is not set)
        self.idle = threading.Condition(self.lock)  # notified when ``running`` falls to 0
        self.wake = threading.Event()  # set when all are finished or the evaluation must stop
        self.on_record: Callable[[ExampleResult], None] | None = None
        self.step_feedback = False  # ask the metric for each step's own feedback (train)
        self.abandoned = False  # the evaluation ended without waiting for the examples still running


def _abandon(batch: _Batch) -> list[ExampleResult]:
    """The records ``batch`` kept, sorted by id; the examples still running are left out (neither kept nor charged
    when they finish)."""
    with batch.lock:
        batch.abandoned = True
        return sorted(batch.records, key=lambda r: r.example_id)


def _rollout_copy(lm: dspy.BaseLM, rollout: int) -> dspy.BaseLM:
    start = (getattr(lm, "kwargs", None) or {}).get("rollout_id") or 0
    return lm.copy(rollout_id=start + rollout)


class Evaluator:
    """Runs a program on examples in threads, with its LM pinned, and scores each with the metric.

    Each example runs in a copy of the caller's context inside ``dspy.context(lm=self.lm, trace=[])``: an LM
    the caller set (the optimizer agent's, for one) never reaches the program. The metric runs in the same
    pinned context, so an LLM-judge metric that relies on ``dspy.settings.lm`` also gets the evaluation LM.
    A predictor with its own LM (``set_lm``) keeps it, as in dspy; ``lm=None`` (every predictor has its own LM)
    pins no LM at all. The program object is shared by the threads, not copied. The settings are trusted: the optimizer's
    constructor checked them (:mod:`rlmoptimizer.inputs`).
    """

    def __init__(
        self,
        *,
        metric: Metric,
        lm: dspy.BaseLM | None,
        num_threads: int = 8,
        pass_threshold: float = 1.0,
        max_consecutive_lm_failures: int = 3,
        max_unanswered_in_a_row: int = 8,
        distinct_examples: int | None = None,
        transient_retries: int = 2,
        retry_backoff_s: float = 1.0,
        booked: Callable[[Callable], Callable] | None = None,
        spent_all: Callable[[], bool] = lambda: False,
    ) -> None:
        """``booked(fn)``: ``fn`` with the LM calls it makes booked to whom they are for (the compile's usage
        meter books the program's and the metric's calls to the evaluation role); None books nothing.
        ``spent_all()``: whether ``max_cost_usd`` is spent (a charged example not started yet is then skipped: a
        reservation is priced at the average example, and one example may cost far more).
        ``distinct_examples``: how many different examples the compile can evaluate (train plus validation), when
        known: an outage is then told after ``min(max_unanswered_in_a_row, distinct_examples)`` of them, so a
        compile with fewer examples than the streak is still stopped when every one of them got no answer."""
        self.metric = metric
        self._booked = booked
        self._spent_all = spent_all
        self.lm = lm
        self.num_threads = num_threads
        self.pass_threshold = float(pass_threshold)
        self.max_consecutive_lm_failures = max_consecutive_lm_failures
        self.transient_retries = transient_retries
        self.retry_backoff_s = float(retry_backoff_s)
        self._scale_noted = False
        # examples in a row, over every evaluation, that got no answer even after their retries (a 5xx, a timeout):
        # an LM that is down fails every minibatch of GEPA's the same way, and no single one is long enough to tell
        self.max_unanswered_in_a_row = max(
            1, min(max_unanswered_in_a_row, distinct_examples or max_unanswered_in_a_row)
        )
        self._unanswered_in_a_row: set[tuple[int, str]] = set()  # the distinct examples of the current streak
        self._unanswered_lock = threading.Lock()  # evaluations may run at once, each under its own batch lock
        self._rollout_lms: dict[int, dspy.BaseLM] = {}
        self._rollout_lock = threading.Lock()

    def lm_for(self, rollout: int) -> dspy.BaseLM | None:
        """The LM pinned for rollout ``rollout`` of an example (``None`` when no LM is pinned).

        Rollout 0 is the evaluation LM as configured. Rollout ``k > 0`` is a copy with ``rollout_id`` set to
        the LM's own ``rollout_id`` (0 when unset) plus ``k``, as dspy's ``BestOfN`` does: dspy's cache keys on
        it, so every rollout is a real LM call, at the LM's own temperature (at temperature 0 the answers
        differ only as much as the provider's sampling does). Copies are made once per rollout and kept.
        """
        if isinstance(rollout, bool) or not isinstance(rollout, int) or rollout < 0:
            raise ValueError(f"rollout must be an int >= 0, got {rollout!r}")
        if rollout == 0 or self.lm is None:
            return self.lm
        with self._rollout_lock:
            lm = self._rollout_lms.get(rollout)
            if lm is None:
                lm = self._rollout_lms[rollout] = _rollout_copy(self.lm, rollout)
            return lm

    def evaluate(
        self,
        program: Any,
        items: Sequence[tuple[int, dspy.Example]],
        reservation: Reservation | None = None,
        on_record: Callable[[ExampleResult], None] | None = None,
        rollout: int = 0,
        step_feedback: bool = False,
    ) -> list[ExampleResult]:
        """Evaluate ``items`` (``(example_id, example)`` pairs); at most ``reservation.remaining`` of them
        when a reservation is given, spending one unit per charged example. Records sorted by id. With
        ``step_feedback``, a metric in GEPA's form is asked for each step's own feedback too (the step's last call
        in the example: :meth:`Metric.step_feedback`), kept on the record's step.
        ``on_record(record)`` is called under a lock, from the worker threads, as each record completes, before
        it is charged; if it raises, the evaluation stops and the error propagates. ``rollout`` picks the LM
        (:meth:`lm_for`); for ``k > 0`` a step with its own LM (``set_lm``, which the pinned LM does not reach)
        runs a rollout copy of it, swapped in for this evaluation only (the caller holds the program)."""
        items = list(items)
        if reservation is not None:
            items = items[: reservation.remaining]
        if not items:
            return []
        lm = self.lm_for(rollout)
        own = [(p, p.lm) for _, p in program.named_predictors() if rollout and getattr(p, "lm", None) is not None]
        for predictor, original in own:
            predictor.lm = _rollout_copy(original, rollout)
        try:
            run = self._evaluate if self._booked is None else self._booked(self._evaluate)
            return run(program, items, reservation, on_record, lm, step_feedback)
        finally:
            for predictor, original in own:
                predictor.lm = original

    def _evaluate(
        self,
        program: Any,
        items: list,
        reservation: Reservation | None,
        on_record: Callable[[ExampleResult], None] | None,
        lm: dspy.BaseLM | None,
        step_feedback: bool = False,
    ) -> list[ExampleResult]:
        names = StepNames(program)
        batch = _Batch(len(items), reservation)
        batch.on_record = on_record
        batch.step_feedback = step_feedback and self.metric.gives_step_feedback
        pool = ThreadPoolExecutor(max_workers=min(self.num_threads, len(items)), thread_name_prefix="rlmoptimizer-eval")
        futures = []
        try:
            for example_id, example in items:
                context = contextvars.copy_context()
                futures.append(pool.submit(context.run, self._task, lm, program, names, example_id, example, batch))
            # One wake-up when everything is done or something must stop, not one per example: the main
            # thread then competes for the GIL with the workers as little as possible.
            batch.wake.wait()
        except BaseException as exc:  # e.g. Ctrl-C: start nothing new, keep what the running examples produce
            batch.stop.set()
            for future in futures:
                future.cancel()
            pool.shutdown(wait=False, cancel_futures=True)
            _wait_for_running(batch, interrupted=True)
            raise EvaluationStopped(exc, _abandon(batch)) from exc
        else:
            stopping = batch.stop.is_set()
            if stopping:
                for future in futures:
                    future.cancel()
            # When everything finished, the idle workers may exit in the background; when stopping, wait
            # for the examples still running so that their records are kept.
            pool.shutdown(wait=False, cancel_futures=True)
            interrupt = _wait_for_running(batch, interrupted=False) if stopping else None
            if interrupt is not None:
                raise EvaluationStopped(interrupt, _abandon(batch)) from interrupt
        records = sorted(batch.records, key=lambda r: r.example_id)
        if batch.crash is not None:  # an interrupt raised in a worker (or a bug outside program and metric)
            raise EvaluationStopped(batch.crash, records) from batch.crash
        if batch.fatal is not None:
            fatal = batch.fatal
            if isinstance(fatal, EvaluationLMError) and batch.systemic_failures:
                answered = len(records) - batch.systemic_failures
                fatal = EvaluationLMError(
                    f"{batch.last_lm_whose} appears unusable: "
                    f"{self.max_consecutive_lm_failures} consecutive examples failed with "
                    f"{format_error(batch.last_lm_error)}. {answered} of {batch.total} example(s) were evaluated "
                    "before the evaluation stopped; examples that failed this way were not charged. Check the LM's "
                    "model name, API key, billing and network access ("
                    + (
                        "the LM your metric sets for its own calls)."
                        if batch.last_lm_whose == METRIC_LM
                        else "eval_lm=... or dspy.configure(lm=...))."
                    )
                )
                fatal.__cause__ = batch.last_lm_error
            raise EvaluationStopped(fatal, records)
        return records

    # -- one example, in a worker thread ---------------------------------------------------------
    def _task(
        self, lm: dspy.BaseLM | None, program: Any, names: StepNames, example_id: int, example: Any, batch: _Batch
    ) -> None:
        with batch.lock:
            started = not batch.stop.is_set()
            batch.running += started
        try:
            if started:
                self._run_one(lm, program, names, example_id, example, batch)
        except BaseException as exc:  # a bug outside the program and metric (or an interrupt): stop everything
            with batch.lock:
                if batch.crash is None:
                    batch.crash = exc
            batch.stop.set()
        finally:
            with batch.lock:
                batch.finished += 1
                batch.running -= started
                if not batch.running:
                    batch.idle.notify_all()
                if batch.finished == batch.total or batch.stop.is_set():
                    batch.wake.set()

    def _run_one(
        self, lm: dspy.BaseLM | None, program: Any, names: StepNames, example_id: int, example: Any, batch: _Batch
    ) -> None:
        if batch.stop.is_set() or (batch.reservation is not None and self._spent_all()):
            return
        inputs, labels = _inputs_and_labels(example)
        for attempt in range(self.transient_retries + 1):
            trace: list = []
            watch = _RaisingSteps(names)
            with dspy.context(lm=lm, trace=trace, callbacks=[*(dspy.settings.get("callbacks") or []), watch]):
                try:
                    prediction = program(**inputs)
                    break
                except Exception as exc:
                    _raise_if_out_of_memory(exc)
                    failure = classify_lm_failure(exc)
                    if self._waited_to_retry(batch, failure, attempt):  # (the example is charged once)
                        continue
                    record = ExampleResult(
                        example_id=example_id,
                        inputs=_json_dict(inputs),
                        expected=_json_dict(labels),
                        predicted={},
                        score=0.0,
                        passed=False,
                        error=format_error(failure[1] if failure else exc),
                        error_kind=LM_CALL_ERROR if failure else PROGRAM_ERROR,
                        steps=self._steps(trace, names),
                        failed_call=watch.call_of(exc),
                    )
                    self._finish(batch, record, failure)
                    return
        with dspy.context(lm=lm, trace=trace):
            steps = self._steps(trace, names)
            for attempt in range(self.transient_retries + 1):
                try:
                    score, feedback = self.metric.score(example, prediction)
                    error = error_kind = None
                    break
                except MetricError as exc:
                    with batch.lock:
                        if batch.fatal is None:
                            fatal = MetricError(f"{exc} (first seen on example {example_id})")
                            fatal.__cause__ = exc
                            batch.fatal = fatal
                        batch.stop.set()
                    return
                except Exception as exc:
                    _raise_if_out_of_memory(exc)
                    failure = classify_lm_failure(exc)
                    if failure is None:  # the metric's own error: the example scores 0 (charged)
                        score, feedback, error, error_kind = 0.0, None, format_error(exc), METRIC_ERROR
                        break
                    # an LM the metric calls (a judge) gave no answer: tried again as the program's LM is; failing
                    # still, the example is an LM failure (not charged, asked again later), not a score of 0
                    if self._waited_to_retry(batch, failure, attempt):
                        continue
                    record = ExampleResult(
                        example_id=example_id,
                        inputs=_json_dict(inputs),
                        expected=_json_dict(labels),
                        predicted=_fields(prediction),
                        score=0.0,
                        passed=False,
                        error=f"the metric's LM call failed: {format_error(failure[1])}",
                        error_kind=LM_CALL_ERROR,
                        steps=steps,
                    )
                    self._finish(batch, record, failure, whose=METRIC_LM)
                    return
            if error is None and batch.step_feedback:
                steps = self._with_step_feedback(steps, list(trace), names, example, prediction)
        if error is None and not 0.0 <= score <= 1.0 and not self._scale_noted:
            self._scale_noted = True
            logger.info(
                "The metric %s returned %r, outside [0, 1]: scores are used as returned (a run's score is their "
                "mean) and an example passes when its score is at least pass_threshold=%r; set pass_threshold= "
                "to the score that means correct on this scale.",
                self.metric.name,
                score,
                self.pass_threshold,
            )
        record = ExampleResult(
            example_id=example_id,
            inputs=_json_dict(inputs),
            expected=_json_dict(labels),
            predicted=_fields(prediction),
            score=score,
            passed=error is None and score >= self.pass_threshold,
            feedback=feedback,
            error=error,
            error_kind=error_kind,
            steps=steps,
        )
        self._finish(batch, record, None)

    @staticmethod
    def _steps(trace: list, names: StepNames) -> tuple[StepTrace, ...]:
        steps = []
        for predictor, step_inputs, outputs in list(trace):
            name = names.name(predictor)
            if name is None:  # a predictor outside named_predictors() (e.g. a compiled sub-module): not a step
                continue
            steps.append(StepTrace(step_name=name, inputs=_json_dict(dict(step_inputs)), outputs=_fields(outputs)))
        return tuple(steps)

    def _with_step_feedback(
        self, steps: tuple[StepTrace, ...], trace: list, names: StepNames, example: Any, prediction: Any
    ) -> tuple[StepTrace, ...]:
        """``steps`` with the metric's own feedback for each step on its last call (as ``dspy.GEPA`` reflects on
        one call of a step: ``pred_trace`` is that call, ``trace`` the whole example's)."""
        last = {name: entry for entry in trace if (name := names.name(entry[0])) is not None}
        index = {step.step_name: i for i, step in enumerate(steps)}  # the last call of each step
        out = list(steps)
        for name, entry in last.items():
            text = self.metric.step_feedback(example, prediction, trace, name, [entry])
            if text is not None and name in index:
                out[index[name]] = replace(out[index[name]], feedback=text)
        return tuple(out)

    def _waited_to_retry(self, batch: _Batch, failure: tuple[str, BaseException] | None, attempt: int) -> bool:
        """Whether a call that failed so (a rate limit, a timeout, a server error) is tried again, after a back-off."""
        if failure is None or failure[0] != TRANSIENT or attempt >= self.transient_retries or batch.stop.is_set():
            return False
        delay = getattr(failure[1], "retry_after", None) or self.retry_backoff_s * 2**attempt
        batch.stop.wait(min(float(delay), 60.0))
        return True

    def _finish(
        self, batch: _Batch, record: ExampleResult, failure: tuple[str, BaseException] | None, whose: str = EVAL_LM
    ) -> None:
        """Keep and charge ``record``; a failed LM call (``failure``, of ``whose`` LM) is kept uncharged and counted
        toward the evaluation's stop."""
        with batch.lock:
            if batch.abandoned:  # the evaluation ended without it (a second Ctrl-C): neither kept nor charged
                return
            if batch.on_record is not None:  # logged before it is charged: a kill in between never loses a paid unit
                batch.on_record(record)
            batch.records.append(record)  # (a record the log refused is neither kept nor charged)
            with self._unanswered_lock:
                if failure is not None and failure[0] == TRANSIENT:
                    self._unanswered_in_a_row.add((record.example_id, canonical_json(record.inputs)))
                else:
                    self._unanswered_in_a_row.clear()
                unanswered = len(self._unanswered_in_a_row)
            if failure is None:
                if batch.reservation is not None:
                    batch.reservation.spend(1)
                batch.consecutive_lm_failures = 0
            elif failure[0] == SYSTEMIC:
                batch.systemic_failures += 1
                batch.consecutive_lm_failures += 1
                batch.last_lm_error = failure[1]
                batch.last_lm_whose = whose
                if batch.consecutive_lm_failures >= self.max_consecutive_lm_failures and batch.fatal is None:
                    batch.fatal = EvaluationLMError("the evaluation LM appears unusable")
                    batch.stop.set()
            else:
                batch.consecutive_lm_failures = 0
                if unanswered >= self.max_unanswered_in_a_row and batch.fatal is None:
                    batch.fatal = EvaluationLMError(
                        f"{whose} gave no answer on {unanswered} different examples in a row, each "
                        f"tried {self.transient_retries + 1} times here, each time after the LM's own retries (dspy.LM's "
                        f"num_retries) (the last error: {format_error(failure[1])}); they were "
                        "not charged. It may be down, overloaded or rate-limiting hard: check it, then run compile() "
                        "again (with the same run_storage_dir it resumes where it stopped)."
                    )
                    batch.fatal.__cause__ = failure[1]
                    batch.stop.set()
