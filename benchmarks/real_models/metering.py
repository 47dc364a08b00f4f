"""What the benchmark counts: LM calls and tokens by role, program runs, and metric calls.

LM usage is counted where dspy 3.4.1 records it: every completed (non-cached) call ends in
``BaseLM.update_history(entry)`` with ``entry["usage"]`` (``prompt_tokens``, ``completion_tokens``), on both
the litellm and the lm15 paths. ``MeteredLM`` overrides that one method. Copies made with ``lm.copy(...)``
(MIPROv2's proposer makes some) share the meter, because ``copy`` keeps every attribute but the history,
callbacks and kwargs; so nothing an optimizer does through a copy of an LM goes uncounted. Failed calls
are not counted. History must stay enabled (``dspy.settings.disable_history`` False), which is the default.

Program runs are counted where every optimizer runs the program: ``dspy.Module.__call__``, which dspy 3.4.1 wraps
with its callbacks (``dspy.Evaluate``, GEPA's ``bootstrap_trace_data``, MIPROv2's ``BootstrapFewShot`` and
rlmoptimizer's evaluator all call ``program(**inputs)``). ``ProgramRuns`` is a global dspy callback that counts
each outermost call of an instance of the task's program class (deep copies included), whether or not its output
parsed. A run whose output does not parse never reaches the metric (``dspy.Evaluate`` scores it 0 and GEPA
gives it its failure score without calling the metric), so a count of metric-function calls misses it; the
benchmark's "metric calls" are these program runs, what every optimizer's budget pays for.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback
from dspy.utils.exceptions import AdapterParseError


@dataclass(frozen=True)
class Usage:
    """A snapshot of one role's LM usage; differences of snapshots give a phase's usage."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            self.calls - other.calls, self.input_tokens - other.input_tokens, self.output_tokens - other.output_tokens
        )

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class Meter:
    """Thread-safe running totals of LM calls and tokens for one role ("task" or "optimizer")."""

    def __init__(self, role: str) -> None:
        self.role = role
        self._lock = threading.Lock()
        self._calls = self._input = self._output = 0

    def record(self, usage: dict[str, Any] | None) -> None:
        usage = usage or {}
        with self._lock:
            self._calls += 1
            self._input += int(usage.get("prompt_tokens") or 0)
            self._output += int(usage.get("completion_tokens") or 0)

    def snapshot(self) -> Usage:
        with self._lock:
            return Usage(self._calls, self._input, self._output)


class MeteredLM(dspy.LM):
    """A ``dspy.LM`` that adds every completed call's usage to ``meter`` (shared with its copies)."""

    def __init__(self, model: str, *, meter: Meter, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.meter = meter

    def update_history(self, entry: dict[str, Any]) -> None:
        self.meter.record(entry.get("usage"))
        super().update_history(entry)


class CountingMetric:
    """Wraps a task metric, counting its calls, and hands each optimizer the return type it can use.

    ``scored`` counts calls that score one program run on one example (``pred_name is None``): this is the
    "metric calls" of the table, the unit of every optimizer's budget. ``feedback`` counts GEPA's extra calls
    that ask for per-predictor feedback on a run already scored (``pred_name`` set); they run no program.

    With ``as_float`` the wrapper returns ``float(score)``: for MIPROv2, whose BootstrapFewShot step tests the
    metric's truth value (a ``dspy.Prediction`` is truthy whatever its score), and for the test evaluation.
    Otherwise the task's return value passes through (GEPA and rlmoptimizer read ``score`` and ``feedback``).
    The signature has GEPA's five parameters, which rlmoptimizer also recognizes.
    """

    def __init__(self, fn: Any, *, as_float: bool) -> None:
        self.fn = fn
        self.as_float = as_float
        self._lock = threading.Lock()
        self.scored = 0
        self.feedback = 0

    def __call__(self, gold, pred, trace=None, pred_name=None, pred_trace=None):
        with self._lock:
            if pred_name is None:
                self.scored += 1
            else:
                self.feedback += 1
        value = self.fn(gold, pred, trace, pred_name, pred_trace)
        return to_float(value) if self.as_float else value


def to_float(value: Any) -> float:
    """The score of a metric's return value: a number, or the ``score`` of a Prediction or dict."""
    if isinstance(value, dict):
        return float(value["score"])
    if isinstance(value, dspy.Prediction):
        return float(value.score)
    return float(value)


@dataclass(frozen=True)
class RunCount:
    """A snapshot of the program runs counted so far; differences of snapshots give a phase's runs.

    ``runs``: every run started (the honest count of what was paid); ``unparsed``: runs whose output did not
    parse (raised ``AdapterParseError``, or were turned into GEPA's ``FailedPrediction``); ``errors``: runs that
    raised anything else (an LM error, a bug)."""

    runs: int = 0
    unparsed: int = 0
    errors: int = 0

    def __sub__(self, other: RunCount) -> RunCount:
        return RunCount(self.runs - other.runs, self.unparsed - other.unparsed, self.errors - other.errors)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def _is_failed_parse(outputs: Any) -> bool:
    """GEPA's ``bootstrap_trace_data`` patches ``forward`` to return ``(FailedPrediction, trace)`` on a parse
    failure instead of raising; the run then ends without an exception."""
    first = outputs[0] if isinstance(outputs, tuple) and outputs else outputs
    return type(first).__name__ == "FailedPrediction"


class ProgramRuns(BaseCallback):
    """Counts runs of the task's program: each outermost ``__call__``/``acall`` of an instance of
    ``program_type`` in a thread (a program of that class run inside another is part of that run).

    Install it once as a global dspy callback (``dspy.configure(callbacks=[runs])``) so that every thread
    sees it, whichever optimizer started the thread; take :meth:`snapshot` before and after a phase. Nesting is
    tracked per thread: outermost ``acall``s interleaved as coroutines in one thread would count as one run (no
    optimizer here runs the program that way; they all use threads)."""

    def __init__(self, program_type: type) -> None:
        self.program_type = program_type
        self._lock = threading.Lock()
        self._local = threading.local()
        self._outer: set[str] = set()
        self._inner: set[str] = set()
        self._runs = self._unparsed = self._errors = 0

    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        if not isinstance(instance, self.program_type):
            return
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        with self._lock:
            if depth == 0:
                self._runs += 1
                self._outer.add(call_id)
            else:
                self._inner.add(call_id)

    def on_module_end(self, call_id: str, outputs: Any | None, exception: Exception | None = None) -> None:
        with self._lock:
            outer = call_id in self._outer
            if not outer and call_id not in self._inner:
                return
            (self._outer if outer else self._inner).discard(call_id)
            if outer:
                if isinstance(exception, AdapterParseError) or (exception is None and _is_failed_parse(outputs)):
                    self._unparsed += 1
                elif exception is not None:
                    self._errors += 1
        self._local.depth = max(getattr(self._local, "depth", 1) - 1, 0)

    def snapshot(self) -> RunCount:
        with self._lock:
            return RunCount(self._runs, self._unparsed, self._errors)
