"""The cost before the run: what a ``compile()`` with these settings will cost, said before any paid call.

``optimizer.estimate(student, trainset=..., valset=..., metric=...)`` returns a
:class:`~rlmoptimizer.report.costs.CostEstimate`: per role (eval, sub, root) the LM calls, tokens in and out,
dollars where litellm knows the price, and the time at a given latency; whether ``max_cost_usd`` will stop the run
early; the total if the task is solved early and at every limit. It is computed from the budget and the pilot mode
(what the default loop does with them, :mod:`~rlmoptimizer.estimate.plan`), the program's prompts rendered by dspy's
adapter on the data's examples (:mod:`~rlmoptimizer.estimate.sizes`, counted by :mod:`~rlmoptimizer.estimate.tokens`)
and the settings (:mod:`~rlmoptimizer.estimate.model`). No LM is called, unless ``sample=N`` asks to run the program
on N train examples to measure its calls.

Every ``compile()`` makes one before its first paid call (:func:`estimate_at_start`): ``verbose=True`` shows it,
the run directory keeps it (``estimate.json``), and the returned program carries it (``optimized.cost_estimate``)
with what the run spent beside it (``optimized.cost_check``).

Rooms:
    plan.py     the work of a compile: program runs, proposals, agent turns (expected, solved early, at most)
    sizes.py    the tokens of one call of each kind, from the prompts dspy's adapters render
    tokens.py   counting tokens as an LM bills them (its own count, litellm's tokenizer, characters / 4)
    model.py    the work times the sizes, priced and timed: the CostEstimate
    _dspy.py    every dspy name this room uses beyond ``import dspy``, checked at import

May import: dspy (its names beyond the top level only through ``_dspy``), litellm, the agent (the policy's plan and
the agent's first request), and every room below it.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping
from typing import Any

from rlmoptimizer.errors import ConfigurationError
from rlmoptimizer.estimate.model import SECONDS_PER_CALL, estimate_cost, with_cap
from rlmoptimizer.inputs import finite_number, resolve_eval_lm
from rlmoptimizer.metric import Metric
from rlmoptimizer.report.costs import CostCheck, CostEstimate, RoleCost
from rlmoptimizer.student import check_examples, check_program

logger = logging.getLogger(__name__)

__all__ = ["CostCheck", "CostEstimate", "CostEstimation", "RoleCost", "estimate_at_start", "estimate_cost"]


def _check_count(name: str, value: Any, most: int | None = None) -> int | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < 0
        or (most is not None and value > most)
    ):
        bound = f"from 0 to {most}" if most is not None else ">= 0"
        raise ConfigurationError(f"{name} must be an int {bound}, got {value!r}")
    return int(value)


def _check_latency(value: Any) -> float | dict[str, float]:
    def ok(v: Any) -> bool:
        return finite_number(v) and v >= 0

    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"eval", "sub", "root"})
        if unknown or not all(ok(v) for v in value.values()):
            raise ConfigurationError(
                f"seconds_per_call must be seconds >= 0, or a dict of them for 'eval', 'sub' and 'root'; got {value!r}"
            )
        return {str(k): float(v) for k, v in value.items()}
    if not ok(value):
        raise ConfigurationError(f"seconds_per_call must be seconds >= 0 (one LM call's latency), got {value!r}")
    return float(value)


def _check_adapter(adapter: Any) -> None:
    """``adapter``: None (dspy's own choice) or an adapter object, as ``dspy.configure(adapter=...)`` takes one."""
    if adapter is None:
        return
    used = ("format", "format_assistant_message_content")  # what the estimate calls (dspy.Adapter's methods)
    if isinstance(adapter, type) or not all(callable(getattr(adapter, name, None)) for name in used):
        made = " (a class: pass an instance, e.g. dspy.JSONAdapter())" if isinstance(adapter, type) else ""
        raise ConfigurationError(
            f"adapter must be a dspy adapter, e.g. dspy.JSONAdapter() or dspy.ChatAdapter(), or None for the one "
            f"dspy runs the program with; got {adapter!r:.60}{made}"
        )


class CostEstimation:
    """What :class:`~rlmoptimizer.RLMDocstringOptimizer` offers before a compile: :meth:`estimate`."""

    def estimate(
        self,
        student: Any,
        *,
        trainset: list,
        valset: list | None = None,
        metric: Any = None,
        sample: int = 0,
        root_turns: int | None = None,
        proposal_tokens: int | None = None,
        seconds_per_call: float | Mapping[str, float] = SECONDS_PER_CALL,
        adapter: Any = None,
    ) -> CostEstimate:
        """What ``compile(student, trainset=..., valset=...)`` with these settings will cost, before any paid call.

        Per role (``eval``: the program's calls, not an LLM-judge metric's; ``sub``: proposals and GEPA's reflections;
        ``root``: the agent's turns) the LM calls, tokens in and out, dollars at litellm's price (unknown for a model
        it has no price for) and the time at ``seconds_per_call``; whether ``max_cost_usd`` will stop the run early;
        the total if the first round of proposals solves the task, and at every limit. ``str()`` of it is a table of 80
        columns, ``to_dict()`` plain JSON. The docs' "Costs" page says how it is computed and how close it came.

        Args:
            student: The program ``compile()`` would optimize (read, never run unless ``sample`` > 0).
            trainset: The train examples, as for ``compile()``.
            valset: The validation examples, as for ``compile()``.
            metric: The metric, here or in the constructor; only ``sample`` runs it (for its feedback).
            sample: Run the unchanged program on this many train examples (paid, unless dspy's cache has them) and
                measure its calls: how many a run makes and how long its inputs and outputs are. 0 (the default)
                calls no LM.
            root_turns: Agent turns to assume (the default: 5 with ``rlm_autopilot="assist"``, 10 with
                ``"off"``, none with ``"loop"``).
            proposal_tokens: The length of a proposed instruction, in tokens (the default: 50, about what the offline
                demo and the benchmark's 1.5B model wrote; larger models write longer ones).
            seconds_per_call: One LM call's latency, in seconds, or ``{"eval": ..., "sub": ..., "root": ...}``.
            adapter: The adapter the program's requests are rendered with (the default: ``dspy.settings.adapter``,
                else ``dspy.ChatAdapter()``, as dspy runs it).

        Raises:
            ConfigurationError: A bad argument, before any LM call.
        """
        check_program(student)
        trainset = check_examples(trainset, "trainset")
        valset = check_examples(valset, "valset", allow_empty=True) if valset is not None else []
        sample = _check_count("sample", sample, len(trainset)) or 0
        root_turns = _check_count("root_turns", root_turns)
        proposal_tokens = _check_count("proposal_tokens", proposal_tokens)
        latency = _check_latency(seconds_per_call)
        _check_adapter(adapter)
        metric = metric if metric is not None else getattr(self, "metric", None)
        if sample and metric is None:
            raise ConfigurationError("sample= runs the metric too: pass metric= here or to RLMDocstringOptimizer(...)")
        scorer = Metric(metric) if metric is not None else None
        eval_lm = resolve_eval_lm(getattr(self, "eval_lm", None), student)
        # auto= / max_full_evals= sized on this program and data, as compile() sizes them
        sized = getattr(self, "_sized", None)
        config = sized(len(student.named_predictors()), len(trainset), len(valset)) if sized else self
        try:
            return estimate_cost(
                config,
                student,
                trainset,
                valset,
                eval_lm=eval_lm,
                metric=scorer,
                sample=sample,
                root_turns=root_turns,
                proposal_tokens=proposal_tokens,
                seconds_per_call=latency,
                adapter=adapter,
            )
        finally:
            if scorer is not None:  # what the sample's calls changed in the metric does not make it another one
                scorer.used()


def estimate_at_start(run: Any) -> CostEstimate | None:
    """The estimate of a compile (``run``: the optimizer's compile state), before its first paid call: the one its run
    directory kept when an earlier compile made it (a resume, a finished run read back), else a new one, written
    there. ``verbose`` shows it. Never fails the compile: an estimate that cannot be made is a warning."""
    try:
        stored = run.journal.read_estimate()
        if stored is not None:  # (judged against this compile's cap: a resume may raise it)
            estimate = with_cap(CostEstimate.from_dict(stored), run.config.max_cost_usd)
        else:
            estimate = estimate_cost(run.config, run.student, run.trainset, run.valset, eval_lm=run.eval_lm)
            if not run.read_back:
                run.journal.write_estimate(estimate.to_dict())
    except Exception as exc:  # noqa: BLE001 - the estimate is advice: the compile goes on without it
        logger.warning("Could not estimate what this compile will cost (%s: %s).", type(exc).__name__, exc)
        return None
    if not run.read_back:  # a finished run read back pays nothing: no estimate to show
        run.display.message(str(estimate))
    return estimate
