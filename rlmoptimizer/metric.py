"""The user's metric, called the way it was written and held to one contract: a finite number per example.

Two calling styles are accepted, told apart by the function's signature:

* DSPy style, ``metric(example, prediction)`` or ``metric(example, prediction, trace=None)``;
* GEPA style, ``metric(gold, pred, trace, pred_name, pred_trace)``: scored with ``None`` for the last three, then
  (on train) asked once more per step that ran, with that step's name and call, for the step's own feedback
  (:meth:`Metric.step_feedback`), as ``dspy.GEPA`` asks it while reflecting.

A metric may return a bool (True is 1.0), any finite int or float (on any scale: 0-1, 0-5, negative
rewards, as dspy.Evaluate, MIPROv2 and GEPA accept them; scores are used as returned, never rescaled), or
anything with a ``score`` and an optional ``feedback`` (``dspy.Prediction(score=0.5, feedback="...")``, a
dict, an object). Anything else (None, NaN, infinity, text) is a bug in the metric: :meth:`Metric.score` raises :class:`MetricError`, which the
evaluation lets propagate the first time it happens. An exception raised *inside* the metric is not
converted: it propagates as is and the evaluation records it on that one example.
"""

from __future__ import annotations

import decimal
import functools
import hashlib
import inspect
import json
import math
import numbers
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

from rlmoptimizer.errors import ConfigurationError, MetricError

_ACCEPTED = (
    "a bool, a finite number, or dspy.Prediction(score=<finite number>, feedback=<str>) "
    "(a dict or object with `score` and optional `feedback` also works)"
)
_STYLES = (
    "(example, prediction), (example, prediction, trace=None) or GEPA's (gold, pred, trace, pred_name, pred_trace)"
)


def _metric_name(fn: Callable) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__qualname__


def _arity(fn: Callable, name: str) -> int:
    """How many positional arguments to pass: 2, 3 or 5.

    A ``dspy.Module`` is read by its ``forward`` (its ``__call__`` passes everything on to it). GEPA's form is five
    positional parameters whose 4th and 5th are required or named ``pred_name`` and ``pred_trace``; five or more
    with other defaulted extras (``field="answer"``) are the DSPy form, and keep their defaults."""
    try:
        signature = inspect.signature(_called(fn))
    except (TypeError, ValueError):
        return 2  # builtins without a signature: call the way dspy.Evaluate does
    positional = [p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
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
        step = positional[3:5]
        if all(p.default is p.empty for p in step) or [p.name for p in step] == ["pred_name", "pred_trace"]:
            return 5
    if len(positional) >= 3:
        return 3
    if len(positional) == 2 or var_positional:
        return 2
    raise ConfigurationError(
        f"metric {name!r} takes {len(positional)} positional argument(s); a metric must accept {_STYLES}, "
        "for example `def metric(example, prediction, trace=None): return float(prediction.answer == example.answer)`."
    )


def _called(fn: Callable) -> Callable:
    """What a call of ``fn`` runs: a ``dspy.Module``'s bound ``forward`` unless its class has its own ``__call__``
    (read past the module's warning about ``forward`` used directly), else ``fn`` itself."""
    import dspy

    if isinstance(fn, dspy.Module) and type(fn).__call__ is dspy.Module.__call__:
        forward = getattr(type(fn), "forward", None)
        if callable(forward):
            return object.__getattribute__(fn, "forward")
    return fn


# -- identity -------------------------------------------------------------------------------------
_MAX_DEPTH = 6


def _qualified(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__qualname__
    return f"{module}.{name}" if module else str(name)


def _code(code: types.CodeType, depth: int, seen: set[int]) -> dict[str, Any]:
    """What a code object does: its bytecode, constants and names (not its line numbers or file)."""
    return {
        "bytecode": hashlib.sha256(code.co_code).hexdigest(),
        "consts": [
            _code(c, depth + 1, seen) if isinstance(c, types.CodeType) else _describe(c, depth + 1, seen)
            for c in code.co_consts
        ],
        "names": list(code.co_names),
        "varnames": list(code.co_varnames),
    }


def _describe(value: Any, depth: int = 0, seen: set[int] | None = None) -> Any:
    """A JSON-friendly description of ``value`` that is the same in every process for the same metric: code,
    qualified names and plain state, never a memory address."""
    import dspy

    seen = set() if seen is None else seen
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, bytes):
        return {"bytes": hashlib.sha256(value).hexdigest()}
    if depth > _MAX_DEPTH or id(value) in seen:
        return {"ref": _qualified(type(value))}
    seen = seen | {id(value)}
    if isinstance(value, (list, tuple)):
        return [_describe(v, depth + 1, seen) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_describe(v, depth + 1, seen) for v in value), key=lambda d: json.dumps(d, sort_keys=True))
    if isinstance(value, dict):
        return {str(k): _describe(v, depth + 1, seen) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, functools.partial):
        return {
            "partial": _describe(value.func, depth + 1, seen),
            "args": _describe(value.args, depth + 1, seen),
            "keywords": _describe(value.keywords, depth + 1, seen),
        }
    if isinstance(value, types.FunctionType):
        cells = [c.cell_contents if _cell_filled(c) else None for c in (value.__closure__ or ())]
        return {
            "function": _qualified(value),
            "code": _code(value.__code__, depth + 1, seen),
            "defaults": _describe(value.__defaults__, depth + 1, seen),
            "kwdefaults": _describe(value.__kwdefaults__, depth + 1, seen),
            "closure": _describe(cells, depth + 1, seen),
        }
    if isinstance(value, types.MethodType):
        return {
            "method": _describe(value.__func__, depth + 1, seen),
            "self": _describe(value.__self__, depth + 1, seen),
        }
    if isinstance(value, (types.BuiltinFunctionType, types.ModuleType)):
        return {"builtin": _qualified(value)}
    if isinstance(value, type):
        if issubclass(value, dspy.Signature):
            return {"signature": value.signature, "instructions": value.instructions}
        return {"class": _qualified(value)}
    if isinstance(value, dspy.BaseLM):
        return {"lm": _qualified(type(value)), "model": _describe(getattr(value, "model", None), depth + 1, seen)}
    if isinstance(value, dspy.BaseModule):
        # a module-based metric (SemanticF1, an LLM judge): its class, its code, its predictors and plain settings
        # (a module's history and random ids are not part of what it computes)
        plain = {
            k: v
            for k, v in vars(value).items()
            if not k.startswith("_") and (v is None or isinstance(v, (bool, int, float, str)))
        }
        return {
            "module": _qualified(type(value)),
            "forward": _describe(getattr(type(value), "forward", None), depth + 1, seen),
            "predictors": {
                name: {
                    "signature": p.signature.signature,
                    "instructions": p.signature.instructions,
                    "demos": len(getattr(p, "demos", None) or []),
                }
                for name, p in value.named_predictors()
            },
            "settings": _describe(plain, depth + 1, seen),
        }
    cls = type(value)
    call = next((k.__dict__["__call__"] for k in cls.__mro__ if "__call__" in k.__dict__), None)
    state = getattr(value, "__dict__", None)
    slots = [s for k in cls.__mro__ for s in _slot_names(k) if s not in ("__dict__", "__weakref__")]
    if slots:  # a class with __slots__ keeps (part of) its state there
        state = {**(state or {}), **{s: getattr(value, s) for s in slots if hasattr(value, s)}}
    return {
        "object": _qualified(cls),
        "call": _describe(call, depth + 1, seen) if isinstance(call, types.FunctionType) else None,
        "state": _describe({k: v for k, v in state.items() if not k.startswith("__")}, depth + 1, seen)
        if isinstance(state, dict)
        else None,
    }


def _slot_names(cls: type) -> tuple[str, ...]:
    """The attribute names of ``cls``'s own ``__slots__`` (a private ``__name`` as Python stores it)."""
    slots = cls.__dict__.get("__slots__", ())
    names = (slots,) if isinstance(slots, str) else tuple(slots)
    owner = cls.__name__.lstrip("_")
    return tuple(f"_{owner}{n}" if n.startswith("__") and not n.endswith("__") and owner else n for n in names)


def _cell_filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


_SEEN: dict[Any, tuple[Callable[[], Any], list[tuple[str, str]]]] = {}
"""Per live metric object (by ``id``; a bound method by the ids of its object and its function; checked by a weak
reference to the object): each identity it had when a compile first saw it, with the one it had when the last
compile that called it under that identity ended, newest last (at most :data:`_MEMO_PAIRS`)."""
_SEEN_LOCK = threading.Lock()
_MEMO_PAIRS = 8


def _memo_key(fn: Callable[..., Any]) -> tuple[Any, Any]:
    """The memo's key for ``fn`` and the object its weak reference follows: a bound method is a new object on
    every attribute access, so it is keyed by the object it is bound to and its function."""
    if isinstance(fn, types.MethodType):
        return (id(fn.__self__), id(fn.__func__)), fn.__self__
    return id(fn), fn


def metric_identity(fn: Callable[..., Any]) -> str:
    """:func:`described_identity` of ``fn``, except for a metric object a compile of this process has called: while
    what it is now is what that compile left (state it changed itself as it ran: a counter, a cache), it keeps
    the identity it had before its first call, so a cell run again resumes its own run directory. A change
    made to it between compiles (``metric.threshold = 0.7``) makes it another metric, as in a new process; changed
    back, it is the first metric again."""
    now = described_identity(fn)
    key, target = _memo_key(fn)
    with _SEEN_LOCK:
        seen = _SEEN.get(key)
        if seen is not None and seen[0]() is target:
            pairs = seen[1]
            for first, last in reversed(pairs):
                if now in (first, last):
                    return first
            pairs.append((now, now))
            del pairs[:-_MEMO_PAIRS]
            return now
        try:
            ref = weakref.ref(target, lambda _ref, key=key: _SEEN.pop(key, None))
        except TypeError:  # no weak reference (a slotted class): held for the process's life, like a module's
            ref = functools.partial(_same, target)
        _SEEN[key] = (ref, [(now, now)])
    return now


def _same(value: Any) -> Any:
    return value


def metric_used(fn: Callable[..., Any], identity: str) -> None:
    """A compile that called ``fn`` as ``identity`` ended: what ``fn`` is now (the state its calls changed) still
    names it."""
    key, target = _memo_key(fn)
    with _SEEN_LOCK:
        seen = _SEEN.get(key)
        if seen is not None and seen[0]() is target:
            now = described_identity(fn)
            seen[1][:] = [(first, now if first == identity else last) for first, last in seen[1]]


def described_identity(fn: Callable[..., Any]) -> str:
    """What makes two metrics "the same" for resuming a run directory, as ``"<qualified name>#<digest>"``.

    The digest covers what the metric computes, never where it lives in memory: for a function its qualified
    name, bytecode, constants, defaults and closure values (two different lambdas differ; the same function
    in a new process is equal); for ``functools.partial`` the function and its bound arguments; for a
    callable object (``SemanticF1()``, a class with ``__call__``) its class, the code of ``__call__`` /
    ``forward`` and its plain state (for a dspy module: its predictors' signatures and its plain settings).
    Module-level values the code reads are not part of it.
    """
    if isinstance(fn, functools.partial):
        label = f"functools.partial({_qualified(fn.func)})"
    elif isinstance(fn, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        label = _qualified(fn)
    else:
        label = f"{_qualified(type(fn))}()"
    try:
        description = _describe(fn)
        digest = hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()[:16]
    except Exception:  # an exotic callable: its name alone
        digest = "unknown"
    return f"{label}#{digest}"


class Metric:
    """A user metric with its calling convention worked out once; ``fn`` is the original callable.

    ``identity`` is what a run directory records to recognise the metric on resume: ``metric_id`` when given
    (the explicit override), else :func:`metric_identity` of ``fn``, computed once, before the first call.
    """

    def __init__(self, fn: Callable[..., Any], metric_id: str | None = None) -> None:
        if not callable(fn):
            raise ConfigurationError(
                f"metric must be a callable taking {_STYLES}, got {type(fn).__name__} {fn!r:.80}. "
                "For example: `def metric(example, prediction, trace=None): "
                "return float(prediction.answer == example.answer)`."
            )
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
            raise ConfigurationError(
                f"metric {_metric_name(fn)!r} is async (calling it makes a coroutine, not a score): the metric is "
                "called from the evaluation's threads and must return its score. Make it a plain def (run an async "
                "judge inside it with asyncio.run(...))."
            )
        self.fn = fn
        self.name = _metric_name(fn)
        self.arity = _arity(fn, self.name)
        if metric_id is not None and (not isinstance(metric_id, str) or not metric_id.strip()):
            raise ConfigurationError(f"metric_id must be a non-empty str naming the metric, got {metric_id!r}")
        self.metric_id = metric_id
        self.identity = metric_id if metric_id is not None else metric_identity(fn)

    def used(self) -> None:
        """The compile that called this metric ended (:func:`metric_used`)."""
        if self.metric_id is None:
            metric_used(self.fn, self.identity)

    def mismatch_hint(self, stored: Any) -> str:
        """Why a run directory's metric does not match, and how to resume anyway when it is the same metric."""
        return (
            f"Its metric was recorded as {stored!r}; this compile()'s metric is {self.identity!r}. A metric is "
            "recognised by its code, qualified name, bound arguments and plain state (see README), and a newer "
            "rlmoptimizer may recognise the same metric otherwise than the one that wrote the directory. If it is the "
            f"same metric, pass metric_id={stored!r} to RLMDocstringOptimizer(...) or compile() to resume; "
            "otherwise use a new run_storage_dir."
        )

    def __repr__(self) -> str:
        return f"Metric({self.describe()})"

    def describe(self) -> str:
        """Short description for logs, e.g. ``exact_match(example, prediction, trace)``."""
        args = {
            2: "example, prediction",
            3: "example, prediction, trace",
            5: "gold, pred, trace, pred_name, pred_trace",
        }
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

    @property
    def gives_step_feedback(self) -> bool:
        """GEPA's form (``pred_name``, ``pred_trace``): the metric can give one step's own feedback."""
        return self.arity == 5

    def step_feedback(self, example: Any, prediction: Any, trace: list, step: str, step_trace: list) -> str | None:
        """The feedback the metric gives for step ``step`` alone, as ``dspy.GEPA`` asks it while reflecting:
        ``metric(gold, pred, trace, pred_name=step, pred_trace=step_trace)``; the score it returns is not used (the
        example's score is the one without ``pred_name``). None for a metric of another form, one that gives no
        feedback text, or one that raises or returns no score here (the example keeps its own feedback)."""
        if not self.gives_step_feedback:
            return None
        try:
            _, feedback = self.coerce(self.fn(example, prediction, trace, step, step_trace))
        except Exception:  # the step's feedback is optional: the example's own score and feedback stand
            return None
        return feedback if isinstance(feedback, str) and feedback.strip() else None

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
        try:
            score = _to_float(value)
        except (ValueError, OverflowError, TypeError):  # Decimal('sNaN'), a huge Fraction
            score = math.nan
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
    if isinstance(value, numbers.Real | decimal.Decimal):  # (Decimal is a number, not a numbers.Real)
        return True
    # numpy scalars (np.bool_ is not a numbers.Real)
    return (
        type(value).__module__ == "numpy"
        and callable(getattr(value, "item", None))
        and getattr(value, "shape", None) == ()
    )


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
