"""Every check of what the user passed, at the edge, once.

The optimizer's constructor and ``compile()`` call these before any LM call; a bad value raises
:class:`~rlmoptimizer.errors.ConfigurationError` saying what was given and what to do. Inner rooms trust the
typed values they receive.

May import: dspy, ``rlmoptimizer.errors``.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dspy

from rlmoptimizer.errors import ConfigurationError

logger = logging.getLogger(__name__)

_EXAMPLE_FIX = 'dspy.Example(question=..., answer=...).with_inputs("question")'


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


def resolve_eval_lm(eval_lm: Any, program: Any = None) -> dspy.BaseLM | None:
    """The LM the program runs with: ``eval_lm`` if given, else ``dspy.settings.lm``.

    ``None`` only when neither is set and every predictor of ``program`` has its own LM (``set_lm``), which is
    how ``dspy.Evaluate`` runs such a program; otherwise :class:`ConfigurationError` saying what to set.
    """
    lm = eval_lm if eval_lm is not None else dspy.settings.lm
    if lm is None:
        without = (
            [name for name, p in program.named_predictors() if getattr(p, "lm", None) is None] if program else None
        )
        if without == []:
            return None
        steps = f" (step(s) {without} have no LM of their own)" if without else ""
        raise ConfigurationError(
            f"no LM to run the program with{steps}: pass eval_lm=dspy.LM('provider/model'), call "
            "dspy.configure(lm=dspy.LM('provider/model')) before compile(), or give every predictor its own LM "
            "with predictor.set_lm(...)"
        )
    if not isinstance(lm, dspy.BaseLM):
        source = "eval_lm" if eval_lm is not None else "dspy.settings.lm"
        raise ConfigurationError(
            f"{source} must be a dspy.LM (or another dspy.BaseLM), got {type(lm).__name__} {lm!r:.80}; "
            "wrap a model name like this: eval_lm=dspy.LM('openai/gpt-4o-mini')"
        )
    return lm


def lm_name(lm: Any) -> str:
    """A short, stable name for an LM: its model string, or its class name."""
    model = getattr(lm, "model", None)
    return model if isinstance(model, str) and model else type(lm).__name__


def step_lms(program: Any, eval_lm: Any, eval_lm_source: str) -> dict[str, dict[str, str]]:
    """Which LM runs each step, as dspy decides it: a predictor's own LM (``set_lm``) wins over the LM of
    the context (``eval_lm`` or ``dspy.settings.lm``, pinned during evaluation). ``{step: {"lm", "source"}}``.
    When some steps have their own LM and others run on ``eval_lm``, a warning says which run on which."""
    if eval_lm is None:
        eval_lm_source = "none"
    result = {}
    for name, predictor in program.named_predictors():
        own = getattr(predictor, "lm", None)
        if own is not None:
            result[name] = {"lm": lm_name(own), "source": "predictor.lm"}
        else:
            result[name] = {"lm": lm_name(eval_lm) if eval_lm is not None else "", "source": eval_lm_source}
    own = [name for name, info in result.items() if info["source"] == "predictor.lm"]
    if own and eval_lm is not None:
        logger.warning(
            "Step(s) %s run with their own LM (set with set_lm), as dspy runs them; %s (%s) runs the other steps "
            "and an LLM-judge metric.",
            own,
            eval_lm_source,
            lm_name(eval_lm),
        )
    return result


def check_budget(max_iterations: Any, max_metric_calls: Any) -> tuple[int | None, int | None]:
    """``(max_iterations, max_metric_calls)``, exactly one of them set: ``max_iterations`` (5 when neither is
    given) or ``max_metric_calls``."""
    if max_iterations is not None and max_metric_calls is not None:
        raise ConfigurationError(
            f"pass either max_iterations (a budget of max_iterations x len(trainset) + len(valset) units, the "
            f"baselines free) or max_metric_calls (every run of the program counted, baselines included, as "
            f"dspy.GEPA counts them), not both: got max_iterations={max_iterations!r}, "
            f"max_metric_calls={max_metric_calls!r}"
        )
    if max_metric_calls is not None:
        return None, check_positive_int("max_metric_calls", max_metric_calls)
    return check_positive_int("max_iterations", 5 if max_iterations is None else max_iterations), None


def check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def make_run_directory(path: Path) -> Path:
    """``run_storage_dir`` as a directory, created if missing; :class:`ConfigurationError` if it is a file or
    cannot be created."""
    if path.exists() and not path.is_dir():
        raise ConfigurationError(
            f"run_storage_dir {str(path)!r} is a file, not a directory: pass the path of a directory (created if "
            "missing), e.g. a new one next to it"
        )
    try:
        if not path.is_dir():  # nothing is written to a directory that exists (a finished run read back)
            path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"run_storage_dir {str(path)!r} cannot be created ({type(exc).__name__}: {exc}): pass a directory you "
            "can write to"
        ) from exc
    return path


def check_callbacks(callbacks: Any) -> tuple[tuple[Any, ...], list[Any]]:
    """``(ours, dspy's)``: the callbacks that see our events (an object with an ``on_event(event)`` method, or a
    function of the event) and dspy's own callbacks (``dspy.utils.BaseCallback``, whose ``on_compile_start`` /
    ``on_compile_end`` dspy calls around every teleprompter's compile; one with ``on_event`` too is in both).
    Anything else is a :class:`ConfigurationError` saying which one, and so is what can never see an event: a
    class instead of an instance, an ``async`` callback (events are sent synchronously: its coroutine would never be
    awaited), an object whose ``on_event`` raises when read."""
    if callbacks is None:
        return (), []
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, (list, tuple)):
        raise ConfigurationError(f"callbacks must be a list, got {type(callbacks).__name__}: pass callbacks=[...]")
    ours, theirs = [], []
    for index, callback in enumerate(callbacks):
        if isinstance(callback, type):
            raise ConfigurationError(
                f"callbacks[{index}] is the class {callback.__name__}, not an instance of it: pass "
                f"callbacks=[{callback.__name__}()]"
            )
        try:
            on_event = getattr(callback, "on_event", None)
        except Exception as exc:  # noqa: BLE001 - a property that raises: say so now, not at the first event
            raise ConfigurationError(
                f"callbacks[{index}] ({type(callback).__name__}): reading its on_event raised "
                f"{type(exc).__name__}: {exc}; make on_event a plain method taking the event"
            ) from exc
        function = on_event if callable(on_event) else callback if callable(callback) else None
        if function is not None and _is_async(function):
            raise ConfigurationError(
                f"callbacks[{index}] ({getattr(function, '__qualname__', type(callback).__name__)}) is async: events "
                "are sent synchronously and its coroutine would never be awaited; make it a plain def (it may hand "
                "the event to your own event loop or queue)"
            )
        if isinstance(callback, dspy.utils.BaseCallback):
            theirs.append(callback)
            if callable(on_event):
                ours.append(callback)
        elif function is not None:
            ours.append(callback)
        else:
            raise ConfigurationError(
                f"callbacks[{index}] is a {type(callback).__name__}: a callback is an object with an on_event(event) "
                "method or a function taking the event (the events are in rlmoptimizer.events), or a "
                "dspy.utils.BaseCallback"
            )
    return tuple(ours), theirs


def _is_async(function: Any) -> bool:
    """Whether calling ``function`` (a function, a method, a partial, an object with ``__call__``) makes a coroutine."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(type(function).__call__)


def check_flag(name: str, value: Any) -> bool:
    """``value`` when it is True or False, else :class:`ConfigurationError`: a string such as ``"false"`` is
    truthy and would switch the setting on."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


PILOT_MODES = ("off", "assist", "loop")


def check_pilot_mode(value: Any) -> str:
    """``rlm_autopilot`` as one of :data:`PILOT_MODES` (True means ``"assist"``, False ``"off"``), else
    :class:`ConfigurationError`."""
    if value is True or value is False:
        return "assist" if value else "off"
    if isinstance(value, str) and value in PILOT_MODES:
        return value
    raise ConfigurationError(
        f"rlm_autopilot must be 'off' (the agent decides every turn), 'assist' (the default: the default loop's next "
        f"step runs after a turn that made no progress) or 'loop' (the default loop runs to the end with no agent "
        f"turn), or True/False for 'assist'/'off'; got {type(value).__name__} {value!r}"
    )


def check_lm(name: str, lm: Any, required: bool) -> Any:
    if lm is None:
        if required:
            raise ConfigurationError(
                f"{name} is required: pass a dspy.LM, e.g. RLMDocstringOptimizer({name}=dspy.LM('openai/gpt-4o'), ...)"
            )
        return None
    if not isinstance(lm, dspy.BaseLM):
        raise ConfigurationError(f"{name} must be a dspy.LM (or dspy.BaseLM), got {type(lm).__name__}")
    return lm


def check_metric(metric: Any) -> Any:
    if metric is not None and not callable(metric):
        raise ConfigurationError(f"metric must be callable, got {type(metric).__name__}")
    return metric


def check_pass_threshold(value: Any) -> float:
    """``value`` as a float if it is a finite number, else :class:`ConfigurationError`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigurationError(
            f"pass_threshold must be a finite number (the score at which an example counts as passed, on your "
            f"metric's scale, e.g. 1.0 for a 0-1 metric or 5 for a 0-5 one), got {value!r}"
        )
    return float(value)


MAX_SANDBOX_TIMEOUT_S = 86_400.0
"""The longest a code cell may be given (one day): a limit the watchdog can still count down."""


def check_timeout(name: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= MAX_SANDBOX_TIMEOUT_S
    ):
        raise ConfigurationError(
            f"{name} must be a number of seconds greater than 0 and at most {MAX_SANDBOX_TIMEOUT_S:g} "
            f"(one day), got {value!r}"
        )
    return float(value)


def check_compile_args(teacher: Any, kwargs: dict[str, Any], metric: Any) -> None:
    """The arguments of ``compile()`` beyond the program and the data."""
    if kwargs:
        raise ConfigurationError(f"unexpected compile() arguments: {sorted(kwargs)}")
    if teacher is not None:
        raise ConfigurationError("RLMDocstringOptimizer does not use a teacher program; drop teacher=")
    if metric is None:
        raise ConfigurationError("no metric: pass metric= to compile() or to RLMDocstringOptimizer(...)")


def check_context_window(value: Any) -> int | None:
    """``root_context_window``: None (litellm's figure for the root LM, or a default) or tokens >= 4000."""
    if value is None:
        return None
    return check_positive_int("root_context_window (the root LM's input window, in tokens)", value, minimum=4_000)


def check_max_cost(value: Any) -> float | None:
    """``max_cost_usd``: None (no cap) or a finite number of dollars > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"max_cost_usd must be a number of dollars > 0 (or None for no cap), got {value!r}")
    return float(value)
