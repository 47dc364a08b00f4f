"""Every check of what the user passed, at the edge, once.

The optimizer's constructor and ``compile()`` call these before any LM call; a bad value raises
:class:`~rlmoptimizer.errors.ConfigurationError` saying what was given and what to do. Inner rooms trust the
typed values they receive.

May import: dspy, ``rlmoptimizer.errors``.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import math
import numbers
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import dspy

from rlmoptimizer.errors import ConfigurationError

logger = logging.getLogger(__name__)


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


AUTO = ("light", "medium", "heavy")
"""The values of ``auto=``, as ``dspy.GEPA`` takes them (:func:`rlmoptimizer.budget.auto_metric_calls` sizes each)."""


def check_budget(
    max_iterations: Any, max_metric_calls: Any, auto: Any = None, max_full_evals: Any = None
) -> dict[str, Any]:
    """``{"max_iterations", "max_metric_calls", "auto", "max_full_evals"}`` with at most one of them given, as
    ``dspy.GEPA`` takes exactly one of its three; ``max_iterations=5`` when none is."""
    given = {
        name: value
        for name, value in (
            ("auto", auto),
            ("max_full_evals", max_full_evals),
            ("max_metric_calls", max_metric_calls),
            ("max_iterations", max_iterations),
        )
        if value is not None
    }
    if len(given) > 1:
        raise ConfigurationError(
            "pass one budget (dspy.GEPA takes exactly one of auto, max_full_evals, max_metric_calls): either auto "
            "(sized as dspy.GEPA sizes it), max_full_evals or max_metric_calls (every run of the program counted, "
            "baselines included, as dspy.GEPA counts them), or max_iterations (max_iterations x len(trainset) + "
            "len(valset) units, the baselines free); you set " + ", ".join(f"{k}={v!r}" for k, v in given.items())
        )
    budget = dict.fromkeys(("max_iterations", "max_metric_calls", "auto", "max_full_evals"))
    if auto is not None:
        if auto not in AUTO:
            raise ConfigurationError(
                f"auto must be 'light', 'medium' or 'heavy' (as dspy.GEPA takes it), got {auto!r}; or pass "
                "max_metric_calls=N for a budget of your own"
            )
        budget["auto"] = auto
    elif max_full_evals is not None:
        budget["max_full_evals"] = check_positive_int("max_full_evals", max_full_evals)
    elif max_metric_calls is not None:
        budget["max_metric_calls"] = check_positive_int("max_metric_calls", max_metric_calls)
    else:
        budget["max_iterations"] = check_positive_int("max_iterations", 5 if max_iterations is None else max_iterations)
    return budget


def check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:  # numpy's ints too
        raise ConfigurationError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


MAX_DEMOS = 16
"""The most demos one step may be given (each one lengthens every prompt of that step)."""


def check_max_demos(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value <= MAX_DEMOS:
        raise ConfigurationError(
            f"max_demos must be an int from 0 to {MAX_DEMOS} (the demos a step may be given; 0 switches demos off), "
            f"got {value!r}"
        )
    return int(value)


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


def check_directory(name: str, value: Any) -> Path | None:
    """``value`` as an absolute Path (a str or ``os.PathLike``; ``~`` expanded, a relative path taken from the working
    directory now, so the same optimizer keeps the same directory after a ``%cd``), None as None, else
    :class:`ConfigurationError`."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or (isinstance(value, str) and not value.strip()):
        raise ConfigurationError(
            f"{name} must be a directory path (a str or pathlib.Path), got {type(value).__name__} {value!r}; "
            "pass None for a temporary directory"
        )
    return Path(value).expanduser().absolute()


def check_console(value: Any) -> Any:
    """A ``rich.console.Console`` or None, else :class:`ConfigurationError`."""
    from rich.console import Console

    if value is not None and not isinstance(value, Console):
        raise ConfigurationError(
            f"console must be a rich.console.Console (e.g. Console(stderr=True)) or None, got "
            f"{type(value).__name__} {value!r}"
        )
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


_REQUIRED = {
    "root_lm": (
        "the optimizer agent's LM; dspy.GEPA has none, its reflection_lm is sub_lm here",
        "; or pass rlm_autopilot='loop' to run the default loop (GEPA first) with no agent",
    ),
    "sub_lm": (
        "with rlm_autopilot='loop' and no root_lm, the LM of GEPA's reflections and the proposals",
        " (or reflection_lm=..., dspy.GEPA's name for it)",
    ),
}


def check_lm(name: str, lm: Any, required: bool) -> Any:
    if lm is None:
        if required:
            what, instead = _REQUIRED.get(name, ("an LM", ""))
            raise ConfigurationError(
                f"{name} is required ({what}): pass a dspy.LM, e.g. RLMDocstringOptimizer({name}="
                f"dspy.LM('openai/gpt-4o'), ...){instead}"
            )
        return None
    if not isinstance(lm, dspy.BaseLM):
        raise ConfigurationError(f"{name} must be a dspy.LM (or dspy.BaseLM), got {type(lm).__name__}")
    return lm


def check_metric(metric: Any) -> Any:
    if metric is not None and not callable(metric):
        raise ConfigurationError(f"metric must be callable, got {type(metric).__name__}")
    if metric is not None and _is_async(metric):
        raise ConfigurationError(
            f"metric {getattr(metric, '__name__', type(metric).__name__)!r} is async (calling it makes a coroutine, "
            "not a score): the metric is called from the evaluation's threads and must return its score. Make it a "
            "plain def (run an async judge inside it with asyncio.run(...))."
        )
    return metric


def finite_number(value: Any) -> bool:
    """Whether ``value`` is a finite real number: an int or a float, numpy's numbers and a Decimal too; not a bool."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Decimal)):
        return False
    return value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)


def check_pass_threshold(value: Any) -> float:
    """``value`` as a float if it is a finite number, else :class:`ConfigurationError`."""
    if not finite_number(value):
        raise ConfigurationError(
            f"pass_threshold must be a finite number (the score at which an example counts as passed, on your "
            f"metric's scale, e.g. 1.0 for a 0-1 metric or 5 for a 0-5 one), got {value!r}"
        )
    return float(value)


MAX_SANDBOX_TIMEOUT_S = 86_400.0
"""The longest a code cell may be given (one day): a limit the watchdog can still count down."""


def check_timeout(name: str, value: Any) -> float:
    if not finite_number(value) or not 0 < value <= MAX_SANDBOX_TIMEOUT_S:
        raise ConfigurationError(
            f"{name} must be a number of seconds greater than 0 and at most {MAX_SANDBOX_TIMEOUT_S:g} "
            f"(one day), got {value!r}"
        )
    return float(value)


COMPILE_ARGUMENTS_ELSEWHERE = {
    "requires_permission_to_run": "drop it (nothing asks before running; optimizer.estimate(...) prices a run first)",
    "max_bootstrapped_demos": "RLMDocstringOptimizer(max_demos=N)",
    "max_labeled_demos": "RLMDocstringOptimizer(max_demos=N)",
    "num_trials": "RLMDocstringOptimizer(max_metric_calls=N) or auto= sets how much to search",
    "minibatch": "drop it (comparisons here run on the examples they need)",
    "minibatch_size": "drop it (GEPA's runs here take minibatches of 3; the agent's run_gepa(minibatch_size=N) another)",
    "seed": "RLMDocstringOptimizer(seed=N)",
    "provide_traceback": "drop it (a program's errors are in every record that failed)",
}
"""dspy.MIPROv2's ``compile()`` arguments and where their meaning lives here."""


def check_compile_args(teacher: Any, kwargs: dict[str, Any], metric: Any) -> None:
    """The arguments of ``compile()`` beyond the program and the data."""
    if kwargs:
        moved = {
            name: COMPILE_ARGUMENTS_ELSEWHERE[name] for name in sorted(kwargs) if name in COMPILE_ARGUMENTS_ELSEWHERE
        }
        said = "".join(f"; {name}: {what}" for name, what in moved.items())
        raise ConfigurationError(
            f"unexpected compile() arguments: {sorted(kwargs)}{said}. compile() takes the program, trainset=, "
            "valset=, metric= and metric_id=; the rest goes to RLMDocstringOptimizer(...)"
        )
    if teacher is not None:
        raise ConfigurationError("RLMDocstringOptimizer does not use a teacher program; drop teacher=")
    if metric is None:
        raise ConfigurationError("no metric: pass metric= to compile() or to RLMDocstringOptimizer(...)")


def check_context_window(value: Any) -> int | None:
    """``root_context_window``: None (litellm's figure for the root LM, or a default) or tokens >= 4000."""
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 < value < 4_000:
        raise ConfigurationError(
            f"root_context_window={value!r} is too small for the optimizer agent: no window under 4,000 tokens holds "
            "its fixed prompt (its instructions and tools, the task brief and the optimizer state). Pass the root "
            "LM's input window in tokens, or None to take it from litellm's model information"
        )
    return check_positive_int("root_context_window (the root LM's input window, in tokens)", value, minimum=4_000)


def check_max_cost(value: Any) -> float | None:
    """``max_cost_usd``: None (no cap) or a finite number of dollars > 0."""
    if value is None:
        return None
    if not finite_number(value) or value <= 0:
        raise ConfigurationError(f"max_cost_usd must be a number of dollars > 0 (or None for no cap), got {value!r}")
    return float(value)


# -- the constructor ---------------------------------------------------------------------------------------------


def check_settings(given: dict[str, Any], dspy_gepa: dict[str, Any]) -> dict[str, Any]:
    """The constructor's arguments, checked, as the optimizer's attributes ``{name: value}``.

    ``given`` are its named arguments (``{name: value}``, every one); ``dspy_gepa`` the other keyword arguments:
    ``dspy.GEPA``'s names, taken with their meaning here or refused saying what to write instead
    (:func:`from_dspy_gepa`), and any other name, refused naming the arguments it is close to."""
    given = {**given, **from_dspy_gepa(given, dspy_gepa)}
    mode = check_pilot_mode(given["rlm_autopilot"])
    event_callbacks, callbacks = check_callbacks(given["callbacks"])
    num_threads = dspy.settings.num_threads if given["num_threads"] is None else given["num_threads"]
    return {
        **check_budget(given["max_iterations"], given["max_metric_calls"], given["auto"], given["max_full_evals"]),
        "rlm_autopilot": mode,
        "root_lm": check_lm("root_lm", given["root_lm"], required=mode != "loop"),
        "sub_lm": check_lm("sub_lm", given["sub_lm"], required=mode == "loop" and given["root_lm"] is None),
        "eval_lm": check_lm("eval_lm", given["eval_lm"], required=False),
        "metric": check_metric(given["metric"]),
        "metric_id": given["metric_id"],
        "pass_threshold": check_pass_threshold(given["pass_threshold"]),
        "max_demos": check_max_demos(given["max_demos"]),
        "num_threads": check_positive_int("num_threads", num_threads),
        "rlm_max_iterations": check_positive_int("rlm_max_iterations", given["rlm_max_iterations"]),
        "rlm_max_llm_calls": check_positive_int("rlm_max_llm_calls", given["rlm_max_llm_calls"], minimum=0),
        "rlm_max_output_chars": check_positive_int("rlm_max_output_chars", given["rlm_max_output_chars"], minimum=100),
        "root_stateful_session": check_flag("root_stateful_session", given["root_stateful_session"]),
        "rlm_multiturn_history": check_flag("rlm_multiturn_history", given["rlm_multiturn_history"]),
        "sandbox_timeout_s": check_timeout("sandbox_timeout_s", given["sandbox_timeout_s"]),
        "root_context_window": check_context_window(given["root_context_window"]),
        "max_cost_usd": check_max_cost(given["max_cost_usd"]),
        "attempt": check_positive_int("attempt", given["attempt"], minimum=0),
        "track_best_outputs": given.get("track_best_outputs", False),  # checked with dspy.GEPA's names
        "add_format_failure_as_feedback": given.get("add_format_failure_as_feedback", False),  # (the same)
        "verbose": check_flag("verbose", given["verbose"]),
        "run_storage_dir": check_directory("run_storage_dir", given["run_storage_dir"]),
        "allow_eval_lm_change": check_flag("allow_eval_lm_change", given["allow_eval_lm_change"]),
        "allow_program_change": check_flag("allow_program_change", given["allow_program_change"]),
        "console": check_console(given["console"]),
        "use_mlflow": given["use_mlflow"],
        # ``callbacks`` is also the attribute dspy reads around every teleprompter's compile (its BaseCallback's
        # on_compile_start / on_compile_end): it holds those; ours see the events of rlmoptimizer.events.
        "event_callbacks": event_callbacks,
        "callbacks": callbacks,
    }


DSPY_GEPA_ALIASES = {
    "reflection_lm": ("sub_lm", None),
    "log_dir": ("run_storage_dir", None),
    "seed": ("attempt", 0),
    "perfect_score": ("pass_threshold", 1.0),
}
"""``dspy.GEPA``'s name -> (ours, our default): the same setting under another name. ``reflection_lm`` reflects in
GEPA's runs, as ``sub_lm`` does here (with the proposals and ``llm_query``); ``log_dir`` keeps the run and resumes it,
as ``run_storage_dir``; ``seed`` is GEPA's seed, as ``attempt`` is the seed of every GEPA run (and the rollout id of
the agent's requests, so another seed is another attempt); ``perfect_score`` is the score at which gepa counts an
example as solved, as ``pass_threshold`` is (it is gepa's ``perfect_score`` in every GEPA run)."""

DSPY_GEPA_FLAGS = ("track_stats", "track_best_outputs", "warn_on_score_mismatch", "add_format_failure_as_feedback")
"""``dspy.GEPA``'s switches taken as True or False. ``track_stats`` changes nothing (``detailed_results`` is always
attached); ``track_best_outputs`` fills ``detailed_results.best_outputs_valset``; ``warn_on_score_mismatch`` changes
nothing (the metric is called once per example, so its scores cannot disagree); ``add_format_failure_as_feedback``
lets GEPA's reflections read a step's own output that did not parse, with the parse error as its feedback."""
DSPY_GEPA_KEPT = ("track_best_outputs", "add_format_failure_as_feedback")
"""The switches of :data:`DSPY_GEPA_FLAGS` that change what a run does or shows, kept as settings."""

DSPY_GEPA_DEFAULTS = {
    "reflection_minibatch_size": (
        (3,),
        "GEPA's runs here reflect on minibatches of 3 (dspy.GEPA's default), and the agent chooses another size per "
        "run with run_gepa(minibatch_size=N)",
    ),
    "candidate_selection_strategy": (("pareto",), "GEPA's runs here take their parents from the Pareto front only"),
    "skip_perfect_score": ((True,), "GEPA's runs here always skip a minibatch that passes everywhere"),
    "instruction_proposer": (
        (None,),
        "sub_lm writes every proposal through dspy's own InstructionProposer; the agent steers its proposals with "
        "propose_instructions(guidance=...)",
    ),
    "code_proposer": ((None,), "only instructions change here, never a dspy.Flex module's code"),
    "component_selector": (
        ("round_robin",),
        "GEPA's runs here go round-robin over the steps, and the agent limits a run to some with run_gepa(steps=[...])",
    ),
    "use_merge": ((True,), "GEPA's runs here merge, and the agent turns it off per run with run_gepa(use_merge=False)"),
    "max_merge_invocations": ((5,), "GEPA's runs here merge at most 5 times each (dspy.GEPA's default)"),
    "failure_score": ((0, 0.0), "an example whose program or metric raised scores 0 here (dspy.Evaluate's default)"),
    "use_wandb": ((False,), "nothing is logged to Weights & Biases: use_mlflow=True logs to MLflow"),
    "wandb_api_key": ((None,), "nothing is logged to Weights & Biases: use_mlflow=True logs to MLflow"),
    "wandb_init_kwargs": ((None, {}), "nothing is logged to Weights & Biases: use_mlflow=True logs to MLflow"),
    "gepa_kwargs": ((None, {}), "GEPA's runs here set gepa's options themselves, as dspy.GEPA's defaults"),
}
"""``dspy.GEPA``'s settings that GEPA's runs here keep at ``dspy.GEPA``'s default: ``name -> (the values taken, why
another one is refused)``. The agent's ``run_gepa(...)`` takes some of them per run."""

RENAMED = {
    "max_iters": "rlm_max_iterations=N for the agent's turns, as dspy.RLM's max_iters, or auto= / max_metric_calls= "
    "for the budget",
    "max_llm_calls": "rlm_max_llm_calls=N (dspy.RLM's max_llm_calls)",
    "max_output_chars": "rlm_max_output_chars=N (dspy.RLM's max_output_chars)",
    # dspy.MIPROv2's
    "prompt_model": "sub_lm=... (it writes the proposals, as MIPROv2's prompt_model does)",
    "task_model": "eval_lm=... (it runs the program, as MIPROv2's task_model does)",
    "max_bootstrapped_demos": "max_demos=N (demos per step, from the program's own successful train traces; 0: none)",
    "max_labeled_demos": "max_demos=N (demos per step, from the program's own successful train traces; 0: none)",
    "num_candidates": "max_metric_calls=N or auto= for how much to search (candidates are proposed as it goes)",
    "init_temperature": "nothing: the proposal LM's settings are the sub_lm's own (dspy.LM(..., temperature=...))",
    "max_errors": "nothing: an example on which the program raises scores 0 here and the run goes on",
    # dspy.BootstrapFewShot's
    "max_rounds": "nothing: demos here come from one run of the program on each train example, those it got right; "
    "max_demos=N sets how many a step gets",
    "teacher_settings": "nothing: demos here come from the program's own runs with eval_lm, as there is no teacher; "
    "eval_lm=... sets that LM",
}
"""Names from dspy's other modules a user may bring along, and what to write here."""


def from_dspy_gepa(given: dict[str, Any], dspy_gepa: dict[str, Any]) -> dict[str, Any]:
    """Our arguments for ``dspy.GEPA``'s names in ``dspy_gepa`` (``{our name: value}``, ``track_best_outputs``
    included): an alias of one of ours (:data:`DSPY_GEPA_ALIASES`, refused when ours is given another value too),
    a switch (:data:`DSPY_GEPA_FLAGS`), a setting kept at dspy.GEPA's default (:data:`DSPY_GEPA_DEFAULTS`, refused at
    any other value). Any other name is a :class:`ConfigurationError` naming the arguments it is close to."""
    known = [*given, *DSPY_GEPA_ALIASES, *DSPY_GEPA_FLAGS, *DSPY_GEPA_DEFAULTS]
    unknown = [name for name in dspy_gepa if name not in known]
    if unknown:
        raise ConfigurationError(
            f"RLMDocstringOptimizer got {'an unexpected argument' if len(unknown) == 1 else 'unexpected arguments'} "
            + ", ".join(f"{name} ({_instead(name, known)})" for name in unknown)
            + "; help(RLMDocstringOptimizer) lists every argument"
        )
    ours: dict[str, Any] = {}
    for name, value in dspy_gepa.items():
        if name in DSPY_GEPA_ALIASES:
            mine, default = DSPY_GEPA_ALIASES[name]
            _check_alias(name, value)
            if value is None and default is None:  # dspy.GEPA's own default (reflection_lm=None): not given
                continue
            if not (given[mine] is None or given[mine] == default or given[mine] is value or given[mine] == value):
                raise ConfigurationError(
                    f"pass {name} or {mine}, not both: {name} is dspy.GEPA's name for {mine} here; you set "
                    f"{name}={_shown(value)}, {mine}={_shown(given[mine])}"
                )
            ours[mine] = value
        elif name in DSPY_GEPA_FLAGS:
            check_flag(name, value)
            if name in DSPY_GEPA_KEPT:
                ours[name] = value
        else:
            accepted, why = DSPY_GEPA_DEFAULTS[name]
            if not any(value is taken or (_kind(value) is _kind(taken) and value == taken) for taken in accepted):
                kept = " or ".join(repr(taken) for taken in accepted)
                raise ConfigurationError(f"{name}={value!r:.60}: {why}; drop {name} (or pass {kept})")
    return ours


def _kind(value: Any) -> type:
    """What a value is, for comparing it with a default: any real number (numpy's too) is a number, a bool is not."""
    return float if isinstance(value, numbers.Real) and not isinstance(value, bool) else type(value)


def _check_alias(name: str, value: Any) -> None:
    """A value of one of dspy.GEPA's names for ours, checked under the name the user wrote."""
    if name == "seed" and value is None:
        raise ConfigurationError(
            "seed=None: runs here are reproducible, pass a number (seed=N runs GEPA with seed N, as attempt=N does)"
        )
    if name == "seed":
        check_positive_int("seed", value, minimum=0)
    elif name == "reflection_lm":
        check_lm("reflection_lm", value, required=False)
    elif name == "perfect_score" and not finite_number(value):
        raise ConfigurationError(f"perfect_score must be a finite number (pass_threshold here), got {value!r}")


def _instead(name: str, known: list[str]) -> str:
    """What to write instead of an argument the constructor does not take, or the names it is close to."""
    if name in RENAMED:
        return f"write {RENAMED[name]}"
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    return f"did you mean {' or '.join(close)}?" if close else "no argument is close to it"


def _shown(value: Any) -> str:
    """A value in a message: an LM by its model name, anything else by its repr, cut short."""
    return f"dspy.LM({lm_name(value)!r})" if isinstance(value, dspy.BaseLM) else f"{value!r:.60}"
