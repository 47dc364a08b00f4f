"""The user's metric, called the way it was written and held to one contract: a finite number per example.

Two calling styles are accepted, told apart by the function's signature:

* DSPy style, ``metric(example, prediction)`` or ``metric(example, prediction, trace=None)``;
* GEPA style, ``metric(gold, pred, trace, pred_name, pred_trace)``: called with ``None`` for the last three.

A metric may return a bool (True is 1.0), any finite int or float (on any scale: 0-1, 0-5, negative
rewards, as dspy.Evaluate, MIPROv2 and GEPA accept them; scores are used as returned, never rescaled), or
anything with a ``score`` and an optional ``feedback`` (``dspy.Prediction(score=0.5, feedback="...")``, a
dict, an object). Anything else (None, NaN, infinity, text) is a bug in the metric: :meth:`Metric.score` raises :class:`MetricError`, which the
evaluation lets propagate the first time it happens. An exception raised *inside* the metric is not
converted: it propagates as is and the evaluation records it on that one example.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from typing import Any

from rlmoptimizer.errors import ConfigurationError, MetricError

_ACCEPTED = (
    "a bool, a finite number, or dspy.Prediction(score=<finite number>, feedback=<str>) "
    "(a dict or object with `score` and optional `feedback` also works)"
)
_STYLES = "(example, prediction), (example, prediction, trace=None) or GEPA's (gold, pred, trace, pred_name, pred_trace)"


def _metric_name(fn: Callable) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__qualname__


def _arity(fn: Callable, name: str) -> int:
    """How many positional arguments to pass: 2, 3 or 5."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return 2  # builtins without a signature: call the way dspy.Evaluate does
    positional = [
        p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is p.empty]
    var_positional = any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())
    required_keywords = [
        p.name for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY and p.default is p.empty
    ]
    if required_keywords:
        raise ConfigurationError(
            f"metric {name!r} has required keyword-only parameter(s) {required_keywords} that the optimizer cannot "
            f"fill; a metric must accept {_STYLES}. Give them defaults or remove them."
        )
    if len(required) > 5 or len(required) == 4:
        raise ConfigurationError(
            f"metric {name!r} requires {len(required)} positional arguments {[p.name for p in required]}; "
            f"a metric must accept {_STYLES}."
        )
    if len(positional) >= 5:
        return 5
    if len(positional) >= 3:
        return 3
    if len(positional) == 2 or var_positional:
        return 2
    raise ConfigurationError(
        f"metric {name!r} takes {len(positional)} positional argument(s); a metric must accept {_STYLES}, "
        "for example `def metric(example, prediction, trace=None): return float(prediction.answer == example.answer)`."
    )


class Metric:
    """A user metric with its calling convention worked out once; ``fn`` is the original callable."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise ConfigurationError(
                f"metric must be a callable taking {_STYLES}, got {type(fn).__name__} {fn!r:.80}. "
                "For example: `def metric(example, prediction, trace=None): "
                "return float(prediction.answer == example.answer)`."
            )
        self.fn = fn
        self.name = _metric_name(fn)
        self.arity = _arity(fn, self.name)

    def __repr__(self) -> str:
        return f"Metric({self.describe()})"

    def describe(self) -> str:
        """Short description for logs, e.g. ``exact_match(example, prediction, trace)``."""
        args = {2: "example, prediction", 3: "example, prediction, trace", 5: "gold, pred, trace, pred_name, pred_trace"}
        return f"{self.name}({args[self.arity]})"

    def score(self, example: Any, prediction: Any) -> tuple[float, str | None]:
        """``(score, feedback)`` for one example. Exceptions raised by the metric propagate unchanged;
        a returned value that is not a score raises :class:`MetricError`."""
        if self.arity == 2:
            value = self.fn(example, prediction)
        elif self.arity == 3:
            value = self.fn(example, prediction, None)
        else:
            value = self.fn(example, prediction, None, None, None)
        return self.coerce(value)

    def coerce(self, value: Any) -> tuple[float, str | None]:
        """Turn a metric's return value into ``(score, feedback)`` or raise :class:`MetricError`."""
        feedback = None
        container = value
        if not _is_number(value):
            found, inner = _get(value, "score")
            if not found:
                raise self._error(value, "is not a score")
            value = inner
            _, feedback = _get(container, "feedback")
            if feedback is not None and not isinstance(feedback, str):
                feedback = str(feedback)
            if not _is_number(value):
                raise self._error(value, "is not a number", where="its `score`")
        score = _to_float(value)
        if not math.isfinite(score):
            raise self._error(value, "is not a finite number", where="its `score`" if container is not value else "")
        return score, feedback

    def _error(self, value: Any, problem: str, where: str = "") -> MetricError:
        subject = f"returned a value whose `score` {value!r:.100}" if where else f"returned {value!r:.100}"
        return MetricError(
            f"metric {self.name!r} {subject} ({type(value).__name__}), which {problem}. A metric must return {_ACCEPTED} "
            "for every example. Fix the metric so that every code path returns a score, e.g. "
            "`return float(prediction.answer == example.answer)`; raise an exception instead of returning None "
            "if an example cannot be scored."
        )


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, numbers.Real):
        return True
    # numpy scalars (np.bool_ is not a numbers.Real)
    return type(value).__module__ == "numpy" and callable(getattr(value, "item", None)) and getattr(value, "shape", None) == ()


def _to_float(value: Any) -> float:
    if type(value).__module__ == "numpy":
        value = value.item()
    return float(value)


def _get(obj: Any, key: str) -> tuple[bool, Any]:
    """``(found, value)`` of ``obj[key]`` for mappings and ``obj.key`` for other objects."""
    if obj is None or isinstance(obj, (str, bytes, numbers.Number)):
        return False, None
    if isinstance(obj, dict):
        return (key in obj), obj.get(key)
    try:
        store = getattr(obj, "_store", None)  # dspy.Example / dspy.Prediction keep fields here
        if isinstance(store, dict):
            return (key in store), store.get(key)
        value = getattr(obj, key)
    except Exception:
        return False, None
    return True, value
