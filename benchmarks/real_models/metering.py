"""What the benchmark counts: LM calls and tokens by role, and metric calls.

LM usage is counted where dspy 3.4.1 records it: every completed (non-cached) call ends in
``BaseLM.update_history(entry)`` with ``entry["usage"]`` (``prompt_tokens``, ``completion_tokens``), on both
the litellm and the lm15 paths. ``MeteredLM`` overrides that one method. Copies made with ``lm.copy(...)``
(MIPROv2's proposer makes some) share the meter, because ``copy`` keeps every attribute but the history,
callbacks and kwargs; so nothing an optimizer does through a copy of an LM goes uncounted. Failed calls
are not counted. History must stay enabled (``dspy.settings.disable_history`` False), which is the default.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

import dspy


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
