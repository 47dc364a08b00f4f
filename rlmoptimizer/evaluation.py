"""Running a program on examples: input checks, the threaded :class:`Evaluator`, id selection and the
:class:`RunService` that caches, charges and stores whole runs.

Per-example failures are data: an example whose program or metric raised becomes a record with the
error text and score 0. Only two things propagate out of an evaluation, each carrying the records that
did complete as ``.completed``:

* :class:`EvaluationLMError`: the evaluation LM failed with an error retrying cannot fix (bad key, no
  billing, unknown model, unreachable host) on ``max_consecutive_lm_failures`` consecutive examples;
* :class:`MetricError`: the metric returned something that is not a score (a bug in the metric).

Budget: one unit per example that produced an answer, charged as it completes, including examples whose
program raised on a bad LM reply and examples whose metric raised. An example that got no answer because
the LM call itself failed (authentication, transport, rate limit after DSPy's own retries, ...) is not
charged, and neither is an example that never started.
"""

from __future__ import annotations

import contextvars
import logging
import math
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dspy
from dspy.utils import exceptions as dspy_errors

from rlmoptimizer.budget import TRAIN_EXAMPLE, VAL_EXAMPLE, BudgetLedger, Reservation
from rlmoptimizer.errors import ConfigurationError, EvaluationLMError, MetricError
from rlmoptimizer.fingerprint import get_instructions, instructions_digest
from rlmoptimizer.metric import Metric
from rlmoptimizer.records import EvalRun, ExampleResult, StepTrace, jsonable
from rlmoptimizer.run_store import RunStore

logger = logging.getLogger(__name__)

_EXAMPLE_FIX = 'dspy.Example(question=..., answer=...).with_inputs("question")'

# -- input checks --------------------------------------------------------------------------------


def check_program(program: Any) -> None:
    """Raise :class:`ConfigurationError` unless ``program`` is a ``dspy.Module`` with at least one predictor."""
    if not isinstance(program, dspy.Module):
        raise ConfigurationError(
            f"the program must be a dspy.Module (e.g. dspy.ChainOfThought('question -> answer') or your own "
            f"dspy.Module subclass), got {type(program).__name__}"
        )
    if not program.named_predictors():
        raise ConfigurationError(
            f"the program {type(program).__name__} has no predictors, so it has no instructions to optimize. "
            "Store its dspy.Predict / dspy.ChainOfThought modules as attributes in __init__ "
            "(self.generate = dspy.ChainOfThought(...)) so that program.named_predictors() finds them."
        )


def check_examples(examples: Any, split: str, allow_empty: bool = False) -> list[dspy.Example]:
    """Return ``examples`` as a list after checking each is a ``dspy.Example`` with its inputs marked."""
    if isinstance(examples, (str, bytes, dict)) or not isinstance(examples, Sequence):
        raise ConfigurationError(
            f"{split} must be a list of dspy.Example, got {type(examples).__name__}. Build each with {_EXAMPLE_FIX}."
        )
    examples = list(examples)
    if not examples and not allow_empty:
        raise ConfigurationError(f"{split} is empty; pass at least one example built with {_EXAMPLE_FIX}")
    for index, example in enumerate(examples):
        if not isinstance(example, dspy.Example):
            raise ConfigurationError(
                f"{split}[{index}] is a {type(example).__name__}, not a dspy.Example. Build each example with {_EXAMPLE_FIX}."
            )
        input_keys = example._input_keys
        if not input_keys:
            raise ConfigurationError(
                f"{split}[{index}] has no input fields marked; call .with_inputs(...) naming the fields the program "
                f"receives, e.g. {_EXAMPLE_FIX}. Its fields are {sorted(example.keys())}."
            )
        missing = sorted(k for k in input_keys if k not in example)
        if missing:
            raise ConfigurationError(
                f"{split}[{index}] marks {missing} as inputs but has no such field(s); its fields are "
                f"{sorted(example.keys())}. Fix the .with_inputs(...) call, e.g. {_EXAMPLE_FIX}."
            )
    return examples


def resolve_eval_lm(eval_lm: Any) -> dspy.BaseLM:
    """``eval_lm`` if given, else ``dspy.settings.lm``; :class:`ConfigurationError` if neither is an LM."""
    lm = eval_lm if eval_lm is not None else dspy.settings.lm
    if lm is None:
        raise ConfigurationError(
            "no LM to run the program with: pass eval_lm=dspy.LM('provider/model') or call "
            "dspy.configure(lm=dspy.LM('provider/model')) before compile()"
        )
    if not isinstance(lm, dspy.BaseLM):
        source = "eval_lm" if eval_lm is not None else "dspy.settings.lm"
        raise ConfigurationError(
            f"{source} must be a dspy.LM (or another dspy.BaseLM), got {type(lm).__name__} {lm!r:.80}; "
            "wrap a model name like this: eval_lm=dspy.LM('openai/gpt-4o-mini')"
        )
    return lm


# -- classifying LM failures ---------------------------------------------------------------------

# Errors that retrying cannot fix and that would fail every example the same way.
_SYSTEMIC_LM_ERRORS: tuple[type[BaseException], ...] = (
    dspy_errors.LMAuthError,
    dspy_errors.LMBillingError,
    dspy_errors.LMConfigurationError,  # includes LMNotConfiguredError
    dspy_errors.LMUnsupportedModelError,
    dspy_errors.LMUnsupportedFeatureError,
    dspy_errors.LMTransportError,  # already retried num_retries times by dspy.LM
)
# LiteLLM's own names for the same failures, in case one reaches us unwrapped (e.g. from a custom LM).
_SYSTEMIC_LITELLM_NAMES = ("AuthenticationError", "PermissionDeniedError", "NotFoundError", "APIConnectionError", "BudgetExceededError")
# LM errors that are about this example's request (it was sent and rejected): the example is charged.
_REQUEST_LM_ERRORS: tuple[type[BaseException], ...] = (
    dspy_errors.LMInvalidRequestError,  # includes ContextWindowExceededError
    dspy_errors.LMCollectionLimitError,
)


def _chain(exc: BaseException, limit: int = 16) -> list[BaseException]:
    seen: list[BaseException] = []
    queue = [exc]
    while queue and len(seen) < limit:
        current = queue.pop(0)
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        queue += [current.__cause__, current.__context__]
    return seen


def _is_systemic(exc: BaseException) -> bool:
    if isinstance(exc, _SYSTEMIC_LM_ERRORS):
        return True
    litellm = sys.modules.get("litellm")
    if litellm is None:
        return False
    for name in _SYSTEMIC_LITELLM_NAMES:
        cls = getattr(litellm, name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
    return False


def classify_lm_failure(exc: BaseException) -> tuple[str, BaseException] | None:
    """``("systemic", e)`` when the LM is unusable, ``("lm", e)`` when the LM call failed without an
    answer (rate limit, timeout, server error after retries), ``None`` for any other error (charged)."""
    chain = _chain(exc)
    for e in chain:
        if _is_systemic(e):
            return "systemic", e
    for e in chain:
        if isinstance(e, dspy_errors.LMError) and not isinstance(e, _REQUEST_LM_ERRORS):
            return "lm", e
    return None


def _lm_failure_names() -> frozenset[str]:
    names = set(_SYSTEMIC_LITELLM_NAMES)
    stack: list[type] = [dspy_errors.LMError]
    while stack:
        cls = stack.pop()
        if not issubclass(cls, _REQUEST_LM_ERRORS) or issubclass(cls, _SYSTEMIC_LM_ERRORS):
            names.add(cls.__name__)
        stack += cls.__subclasses__()
    return frozenset(names)


def is_reusable(record: ExampleResult) -> bool:
    """Whether a stored record may stand for a new evaluation of the same instructions: every record
    except those where the LM call itself failed (those deserve another try)."""
    if record.error is None:
        return True
    return record.error.split(":", 1)[0] not in _lm_failure_names()


def _format_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# -- the evaluator ---------------------------------------------------------------------------------


_PLAIN_TYPES = frozenset({str, int, bool, type(None)})


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
        self.uncharged_lm_failures = 0
        self.last_lm_error: BaseException | None = None
        self.fatal: BaseException | None = None
        self.crash: BaseException | None = None
        self.finished = 0  # examples finished or skipped
        self.wake = threading.Event()  # set when all are finished or the evaluation must stop
        self.on_record: Callable[[ExampleResult], None] | None = None


class Evaluator:
    """Runs a program on examples in threads, with its LM pinned, and scores each with the metric.

    Each example runs in a copy of the caller's context inside ``dspy.context(lm=self.lm, trace=[])``: an LM
    the caller set (the optimizer agent's, for one) never reaches the program. The metric runs in the same
    pinned context, so an LLM-judge metric that relies on ``dspy.settings.lm`` also gets the evaluation LM.
    The program object is shared by the threads, not copied. ``on_result(record)`` is called under a lock,
    from the worker threads, as each record completes.
    """

    def __init__(
        self,
        *,
        metric: Metric,
        lm: dspy.BaseLM,
        num_threads: int = 8,
        pass_threshold: float = 1.0,
        max_consecutive_lm_failures: int = 3,
        transient_retries: int = 2,
        retry_backoff_s: float = 1.0,
        on_result: Callable[[ExampleResult], None] | None = None,
    ) -> None:
        if not isinstance(metric, Metric):
            raise ConfigurationError(f"metric must be an rlmoptimizer Metric (wrap it: Metric(fn)), got {type(metric).__name__}")
        if not isinstance(num_threads, int) or isinstance(num_threads, bool) or num_threads < 1:
            raise ConfigurationError(f"num_threads must be an int >= 1, got {num_threads!r}")
        if isinstance(pass_threshold, bool) or not isinstance(pass_threshold, (int, float)) or not 0.0 <= pass_threshold <= 1.0:
            raise ConfigurationError(f"pass_threshold must be a number in [0, 1], got {pass_threshold!r}")
        if not isinstance(max_consecutive_lm_failures, int) or max_consecutive_lm_failures < 1:
            raise ConfigurationError(f"max_consecutive_lm_failures must be an int >= 1, got {max_consecutive_lm_failures!r}")
        self.metric = metric
        self.lm = lm
        self.num_threads = num_threads
        self.pass_threshold = float(pass_threshold)
        self.max_consecutive_lm_failures = max_consecutive_lm_failures
        if not isinstance(transient_retries, int) or transient_retries < 0:
            raise ConfigurationError(f"transient_retries must be an int >= 0, got {transient_retries!r}")
        self.transient_retries = transient_retries
        self.retry_backoff_s = float(retry_backoff_s)
        self.on_result = on_result

    def evaluate(
        self,
        program: Any,
        items: Sequence[tuple[int, dspy.Example]],
        reservation: Reservation | None = None,
        on_record: Callable[[ExampleResult], None] | None = None,
    ) -> list[ExampleResult]:
        """Evaluate ``items`` (``(example_id, example)`` pairs); at most ``reservation.granted`` of them
        when a reservation is given, spending one unit per charged example. Records sorted by id.
        ``on_record`` is called like ``on_result``, for this call only."""
        items = list(items)
        if reservation is not None:
            items = items[: reservation.granted]
        if not items:
            return []
        names = {id(predictor): name for name, predictor in program.named_predictors()}
        batch = _Batch(len(items), reservation)
        batch.on_record = on_record
        pool = ThreadPoolExecutor(max_workers=min(self.num_threads, len(items)), thread_name_prefix="rlmoptimizer-eval")
        futures = []
        try:
            for example_id, example in items:
                context = contextvars.copy_context()
                futures.append(pool.submit(context.run, self._task, program, names, example_id, example, batch))
            # One wake-up when everything is done or something must stop, not one per example: the main
            # thread then competes for the GIL with the workers as little as possible.
            batch.wake.wait()
        except BaseException as exc:  # e.g. Ctrl-C: start nothing new, keep what the running examples produce
            batch.stop.set()
            logger.warning("Evaluation interrupted: waiting for the examples already running so their records are kept.")
            for future in futures:
                future.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            exc.completed = sorted(batch.records, key=lambda r: r.example_id)
            raise
        finally:
            stopping = batch.stop.is_set()
            if stopping:
                for future in futures:
                    future.cancel()
            # When everything finished, the idle workers may exit in the background; when stopping, wait
            # for the examples still running so that their records are kept.
            pool.shutdown(wait=stopping, cancel_futures=True)
        if batch.crash is not None:
            raise batch.crash
        records = sorted(batch.records, key=lambda r: r.example_id)
        if batch.fatal is not None:
            fatal = batch.fatal
            if isinstance(fatal, EvaluationLMError):
                answered = len(records) - batch.systemic_failures
                fatal = EvaluationLMError(
                    "the evaluation LM appears unusable: "
                    f"{self.max_consecutive_lm_failures} consecutive examples failed with "
                    f"{_format_error(batch.last_lm_error)}. {answered} of {batch.total} example(s) were evaluated "
                    "before the evaluation stopped; examples that failed this way were not charged. Check the LM's "
                    "model name, API key, billing and network access (eval_lm=... or dspy.configure(lm=...))."
                )
                fatal.__cause__ = batch.last_lm_error
            fatal.completed = records
            raise fatal
        return records

    # -- one example, in a worker thread ---------------------------------------------------------
    def _task(self, program: Any, names: dict[int, str], example_id: int, example: Any, batch: _Batch) -> None:
        try:
            self._run_one(program, names, example_id, example, batch)
        except BaseException as exc:  # a bug outside the program and metric (or an interrupt): stop everything
            with batch.lock:
                if batch.crash is None:
                    batch.crash = exc
            batch.stop.set()
        finally:
            with batch.lock:
                batch.finished += 1
                if batch.finished == batch.total or batch.stop.is_set():
                    batch.wake.set()

    def _run_one(self, program: Any, names: dict[int, str], example_id: int, example: Any, batch: _Batch) -> None:
        if batch.stop.is_set():
            return
        inputs, labels = _inputs_and_labels(example)
        for attempt in range(self.transient_retries + 1):
            trace: list = []
            with dspy.context(lm=self.lm, trace=trace):
                try:
                    prediction = program(**inputs)
                    break
                except Exception as exc:
                    failure = classify_lm_failure(exc)
                    transient = failure is not None and failure[0] == "lm"
                    if transient and attempt < self.transient_retries and not batch.stop.is_set():
                        # rate limit, timeout, server error: back off and try the example again (charged once)
                        delay = getattr(failure[1], "retry_after", None) or self.retry_backoff_s * 2**attempt
                        batch.stop.wait(min(float(delay), 60.0))
                        continue
                    record = ExampleResult(
                        example_id=example_id,
                        inputs=_json_dict(inputs),
                        expected=_json_dict(labels),
                        predicted={},
                        score=0.0,
                        passed=False,
                        error=_format_error(failure[1] if failure else exc),
                        steps=self._steps(trace, names),
                    )
                    self._finish(batch, record, failure)
                    return
        with dspy.context(lm=self.lm, trace=trace):
            steps = self._steps(trace, names)
            try:
                score, feedback = self.metric.score(example, prediction)
                error = None
            except MetricError as exc:
                with batch.lock:
                    if batch.fatal is None:
                        fatal = MetricError(f"{exc} (first seen on example {example_id})")
                        fatal.__cause__ = exc
                        batch.fatal = fatal
                    batch.stop.set()
                return
            except Exception as exc:
                score, feedback, error = 0.0, None, _format_error(exc)
        record = ExampleResult(
            example_id=example_id,
            inputs=_json_dict(inputs),
            expected=_json_dict(labels),
            predicted=_fields(prediction),
            score=score,
            passed=error is None and score >= self.pass_threshold,
            feedback=feedback,
            error=error,
            steps=steps,
        )
        self._finish(batch, record, None)

    @staticmethod
    def _steps(trace: list, names: dict[int, str]) -> tuple[StepTrace, ...]:
        steps = []
        for predictor, step_inputs, outputs in list(trace):
            name = names.get(id(predictor))
            if name is None:  # a predictor outside named_predictors() (e.g. a compiled sub-module): not a step
                continue
            steps.append(StepTrace(step_name=name, inputs=_json_dict(dict(step_inputs)), outputs=_fields(outputs)))
        return tuple(steps)

    def _finish(self, batch: _Batch, record: ExampleResult, failure: tuple[str, BaseException] | None) -> None:
        with batch.lock:
            batch.records.append(record)
            if batch.on_record is not None:  # logged before it is charged: a kill in between never loses a paid unit
                batch.on_record(record)
            if failure is None:
                if batch.reservation is not None:
                    batch.reservation.spend(1)
                batch.consecutive_lm_failures = 0
            elif failure[0] == "systemic":
                batch.systemic_failures += 1
                batch.consecutive_lm_failures += 1
                batch.last_lm_error = failure[1]
                if batch.consecutive_lm_failures >= self.max_consecutive_lm_failures and batch.fatal is None:
                    batch.fatal = EvaluationLMError("the evaluation LM appears unusable")
                    batch.stop.set()
            else:
                batch.uncharged_lm_failures += 1
                batch.consecutive_lm_failures = 0
            if self.on_result is not None:
                self.on_result(record)


# -- selecting ids -----------------------------------------------------------------------------------


def _parse_ids(ids: Any, split_size: int) -> list[int]:
    valid = f"valid ids are 0..{split_size - 1}" if split_size else "the split is empty"
    if isinstance(ids, str):
        parts = [p for p in re.split(r"[,\s]+", ids.strip()) if p]
        if not parts:
            raise ValueError(f"ids must be comma-separated example ids like '3,7,12', got an empty string; {valid}")
        try:
            parsed = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"ids must be comma-separated integers like '3,7,12', got {ids!r}; {valid}") from None
    elif isinstance(ids, int) and not isinstance(ids, bool):
        parsed = [ids]
    elif isinstance(ids, (list, tuple)):
        parsed = []
        for item in ids:
            if isinstance(item, bool) or not isinstance(item, (int, str)):
                raise ValueError(f"ids must be a list of integers like [3, 7, 12], got {ids!r}; {valid}")
            try:
                parsed.append(int(item))
            except ValueError:
                raise ValueError(f"ids must be a list of integers like [3, 7, 12], got {ids!r}; {valid}") from None
        if not parsed:
            raise ValueError(f"ids is empty; pass ids=None to select every example, or ids like '3,7,12'; {valid}")
    else:
        raise ValueError(f"ids must be a string like '3,7,12' or a list of integers, got {type(ids).__name__} {ids!r}")
    bad = [i for i in parsed if not 0 <= i < split_size]
    if bad:
        raise ValueError(f"ids must be example ids of the split, got out-of-range {bad}; {valid}")
    return list(dict.fromkeys(parsed))


def select_ids(
    split_size: int,
    *,
    limit: int | None = None,
    sample: str | None = None,
    seed: int = 0,
    ids: Any = None,
    failed_ids_from_run: list[int] | None = None,
) -> list[int]:
    """The example ids to evaluate: all in order by default, narrowed by ``ids``, by the failed ids of an
    earlier run, shuffled reproducibly when ``sample='random'``, then cut to the first ``limit``."""
    if sample not in (None, "first", "random"):
        raise ValueError(f"sample must be 'random' (shuffled with seed) or None (in id order), got {sample!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be an integer >= 0 or None (no limit), got {limit!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    selected = list(range(split_size)) if ids is None else _parse_ids(ids, split_size)
    if failed_ids_from_run is not None:
        failed = set(_parse_ids(list(failed_ids_from_run), split_size)) if failed_ids_from_run else set()
        selected = [i for i in selected if i in failed]
    if sample == "random":
        random.Random(seed).shuffle(selected)
    if limit is not None:
        selected = selected[:limit]
    return selected


# -- the run service -------------------------------------------------------------------------------


class RunService:
    """Evaluates a program on a split as one stored :class:`EvalRun`, reusing identical earlier records.

    The cache key is ``(split, example_id, digest of the instructions)``; it is built from the store at
    construction (so a resumed run directory reuses its records) and updated on every save.
    """

    def __init__(
        self,
        *,
        evaluator: Evaluator,
        store: RunStore,
        ledger: BudgetLedger,
        splits: dict[str, list[dspy.Example]],
    ) -> None:
        self.evaluator = evaluator
        self.store = store
        self.ledger = ledger
        self.splits = dict(splits)
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, int, str], ExampleResult] = {}
        for run in store.all():
            self._index(run)
        self._recover_pending()

    def _recover_pending(self) -> None:
        """Turn the records of evaluations that a killed process never finished into saved runs."""
        for path, header, records in self.store.pending():
            if records:
                self._save(
                    f"{header.get('label', 'agent')}:recovered", header["split"], header["instructions"], records,
                    int(header.get("requested", len(records))),
                    sum(1 for r in records if is_reusable(r)) if header.get("charged") else 0,
                    ["recovered from an evaluation the process did not finish"],
                )
            path.unlink(missing_ok=True)

    def _index(self, run: EvalRun) -> None:
        digest = instructions_digest(run.instructions)
        with self._lock:
            for record in run.records:
                if is_reusable(record):
                    self._cache[(run.split, record.example_id, digest)] = record

    def get(self, run_id: str) -> EvalRun:
        return self.store.get(run_id)

    def runs(self) -> list[EvalRun]:
        return self.store.all()

    def evaluate(
        self,
        program: Any,
        split: str,
        *,
        label: str,
        charged: bool = True,
        ids: list[int] | None = None,
    ) -> EvalRun:
        """Evaluate ``program`` on ``ids`` of ``split`` (all when None), save the run and return it."""
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; the splits are {sorted(self.splits)}")
        examples = self.splits[split]
        ids = list(range(len(examples))) if ids is None else _parse_ids(list(ids), len(examples)) if ids else []
        instructions = get_instructions(program)
        digest = instructions_digest(instructions)
        with self._lock:
            cached = {i: self._cache.get((split, i, digest)) for i in ids}
        reused = [record for record in cached.values() if record is not None]
        todo = [i for i in ids if cached[i] is None]
        kind = TRAIN_EXAMPLE if split == "train" else VAL_EXAMPLE
        notes: list[str] = []
        spent = 0
        pending = self.store.open_pending(
            {"label": label, "split": split, "instructions": instructions, "requested": len(ids), "charged": charged}
        ) if todo else None
        on_record = pending.append if pending is not None else None
        try:
            if charged and todo:
                with self.ledger.reserve(len(todo), kind) as reservation:
                    batch = todo[: reservation.granted]
                    try:
                        new = self.evaluator.evaluate(
                            program, [(i, examples[i]) for i in batch], reservation, on_record=on_record
                        )
                    finally:
                        spent = reservation.spent
                if len(batch) < len(todo):
                    notes.append(
                        f"budget allowed {len(batch)} of {len(todo)} requested examples; {self.ledger.left} units left"
                        + (f"; {self.ledger.stop_reason}" if self.ledger.stop_reason else "")
                    )
            else:
                new = (
                    self.evaluator.evaluate(program, [(i, examples[i]) for i in todo], on_record=on_record)
                    if todo else []
                )
        except BaseException as exc:  # EvaluationLMError, MetricError, Ctrl-C, ...: keep what was paid for
            completed = list(getattr(exc, "completed", []))
            if completed or isinstance(exc, (EvaluationLMError, MetricError)):
                first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                notes.append(
                    f"stopped early after {len(completed)} of {len(todo)} new examples: "
                    f"{type(exc).__name__}: {first_line}"
                )
                self._save(f"{label}:partial", split, instructions, reused + completed, len(ids), spent, notes)
            if pending is not None:
                pending.discard()
            raise
        if reused:
            notes.append(f"{len(reused)} record(s) reused from earlier runs with identical instructions (not charged)")
        uncharged = [r for r in new if not is_reusable(r)]
        if uncharged and charged:
            notes.append(f"{len(uncharged)} example(s) failed in the LM call itself and were not charged")
        run = self._save(label, split, instructions, reused + new, len(ids), spent, notes)
        if pending is not None:
            pending.discard()
        return run

    def _save(
        self,
        label: str,
        split: str,
        instructions: dict[str, str],
        records: list[ExampleResult],
        requested: int,
        spent: int,
        notes: list[str],
    ) -> EvalRun:
        run = EvalRun(
            run_id=self.store.next_run_id(),
            split=split,
            label=label,
            instructions=dict(instructions),
            records=tuple(records),
            requested_count=requested,
            budget_spent=spent,
            budget_left=self.ledger.left,
            note="; ".join(notes) if notes else None,
            created_at=time.time(),
        )
        self.store.save(run)
        self._index(run)
        return run
