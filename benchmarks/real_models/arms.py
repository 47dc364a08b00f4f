"""The optimizers compared, each given the same program, data, task LM, optimizer LM and metric-call budget.

Every arm is a function ``(ctx) -> (program, details)``; ``details`` is JSON-friendly and goes to
results.json. An arm that cannot run (an import fails) raises ``Unavailable``; the harness records the row
as "not available" and runs the others.

How each budget setting maps to B metric calls (one metric call = the program run on one example and scored):

* GEPA: ``max_metric_calls=B`` (GEPA stops at the first iteration that would go past it).
* MIPROv2, instructions only: ``max_bootstrapped_demos=0, max_labeled_demos=0, auto=None``. It still runs
  BootstrapFewShot on the trainset to find examples to show its proposer (``num_candidates - 2`` rounds until
  up to 3 successes each; measured, not predicted exactly), then evaluates the default program on the whole
  valset, ``num_trials`` minibatches and a full valset evaluation after every ``minibatch_full_eval_steps``
  trials and at the end. :func:`mipro_trials_for_budget` picks the most trials that fit B.
* MIPROv2 with demos (``mipro-demos``): the same, with MIPROv2's default ``max_bootstrapped_demos=4,
  max_labeled_demos=4``. Its BootstrapFewShot step then bootstraps ``num_candidates - 2`` demo sets of up to 4
  successes each, sized at :data:`MIPRO_DEMO_BOOTSTRAP_CALLS_PER_SET` runs a set; the search also picks a demo set.
* the ceilings (not optimizers, no optimizer call, no metric call; only the test scoring):
  ``ceiling-instruction`` is the unchanged program with the task's best known instruction (``BEST_INSTRUCTION``,
  else ``POLICY_INSTRUCTION``, the instruction that states the whole policy) on every predictor: what the best
  instruction is worth; ``policy`` is its earlier name. ``ceiling-demos`` is the unchanged program, bare
  instruction, with the task's hand-picked train demos (``ceiling_demos(train)``) on every predictor: what a few
  demos covering the policy's rules are worth without any instruction.
* rlmoptimizer: ``max_metric_calls=B``, counted as GEPA counts it: its baseline on validation, the train
  baseline when something reads it, and the final validation check of its submission are in B; the agent's units
  are what the validation baseline leaves. Sub-LM prompts (the agent's questions, GEPA's reflections) are not
  metric calls, as in GEPA; they have an allowance of B prompts of their own. ``root_context_window`` is the
  optimizer server's ``--n-ctx`` when that model is local (litellm knows no window for it).
* rlmoptimizer ``"loop"`` (``rlmoptimizer-loop``): the same with ``rlm_autopilot="loop"``: the default policy
  runs to SUBMIT in Python, with no root-LM turn and no sandbox. A library without that mode makes the arm
  "not available" ("this rlmoptimizer has no rlm_autopilot='loop'"), not the benchmark fail.

Whatever an arm's settings, the table's "metric calls" are counted, not predicted: the program runs the arm
paid for (``metering.ProgramRuns``), an output that does not parse included.

The estimate beside them: each rlmoptimizer arm records what ``optimizer.estimate(...)`` predicted before its
compile (``details.cost_estimate``, made with no LM call, the program's requests rendered with the adapter its
``forward`` uses) and that estimate against what the compile recorded (``details.cost_check``); the GEPA arm records
the estimate of ``rlm_autopilot="loop"`` at the same budget (GEPA's engine run by rlmoptimizer, with the same LMs:
``details.cost_estimate``, labelled by ``estimate_of``), as a reference. ``run.py`` tables each beside the harness's
own count of what the arm spent.

Seeds: GEPA and MIPROv2 get ``seed=seed``; rlmoptimizer gets ``attempt=seed`` (its agent's and sub-LM's requests
carry dspy's ``rollout_id``, so no seed replays another's cached calls). The local server samples the optimizer
LM at temperature 0.7 from its own random state, which advances with every call, so the seeds' optimizer-LM
replies are distinct samples. Each arm writes its optimizer's files to ``ctx.work_dir``, emptied before it starts
(GEPA and rlmoptimizer resume from what they find there; an arm that was stopped starts over).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy
from metering import CountingMetric


class Unavailable(RuntimeError):
    """The optimizer cannot be run here (e.g. its package does not import)."""


@dataclass
class ArmContext:
    """What one arm gets: a fresh program, the data, the LMs, its own counting metric and settings."""

    program: dspy.Module
    train: list
    val: list
    task_lm: dspy.LM
    optimizer_lm: dspy.LM
    metric: CountingMetric
    budget: int
    num_threads: int
    seed: int
    work_dir: Path
    options: dict[str, Any] = field(default_factory=dict)
    policy_instruction: str | None = None
    task: Any = None  # the task module (for what an arm takes from it: ceiling_demos)


def instructions_of(program: dspy.Module) -> dict[str, str]:
    return {name: predictor.signature.instructions for name, predictor in program.named_predictors()}


def demo_dict(demo: Any) -> dict[str, Any]:
    """A demo as JSON-friendly fields (a ``dspy.Example``'s, or a dict's); values that are not JSON become str."""
    items = demo.toDict() if hasattr(demo, "toDict") else dict(demo)
    return {
        str(k): v if isinstance(v, str | int | float | bool | type(None)) else str(v)
        for k, v in items.items()
        if k != "dspy_uuid"
    }


def demos_of(program: dspy.Module) -> dict[str, list[dict[str, Any]]]:
    """{predictor: [demo fields, ...]} for the predictors that carry demos (empty when none does)."""
    return {
        name: [demo_dict(d) for d in predictor.demos]
        for name, predictor in program.named_predictors()
        if getattr(predictor, "demos", None)
    }


def best_instruction(ctx: ArmContext) -> str | None:
    """The task's best known instruction: ``BEST_INSTRUCTION``, else ``POLICY_INSTRUCTION``."""
    return getattr(ctx.task, "BEST_INSTRUCTION", None) or ctx.policy_instruction


def run_unchanged(ctx: ArmContext) -> tuple[dspy.Module, dict]:
    return ctx.program, {}


def run_ceiling_instruction(ctx: ArmContext) -> tuple[dspy.Module, dict]:
    instruction = best_instruction(ctx)
    if not instruction:
        raise Unavailable("the task defines no BEST_INSTRUCTION nor POLICY_INSTRUCTION")
    for _, predictor in ctx.program.named_predictors():
        predictor.signature = predictor.signature.with_instructions(instruction)
    source = "BEST_INSTRUCTION" if getattr(ctx.task, "BEST_INSTRUCTION", None) else "POLICY_INSTRUCTION"
    return ctx.program, {"instruction_from": source}


run_policy = run_ceiling_instruction  # the arm's earlier name


def run_ceiling_demos(ctx: ArmContext) -> tuple[dspy.Module, dict]:
    """The bare instruction with the task's hand-picked demos, all drawn from the train split given."""
    pick = getattr(ctx.task, "ceiling_demos", None)
    if not callable(pick):
        raise Unavailable("the task defines no ceiling_demos(train)")
    try:
        demos = list(pick(ctx.train))
    except LookupError as e:  # a hand-picked example outside the train split given (--limit-train)
        raise Unavailable(f"ceiling_demos: {e}") from e
    if not demos:
        raise Unavailable("the task's ceiling_demos(train) returned no demo")
    # Validation and test examples never become demos: each demo's inputs must be those of a train example given.
    keys = list(ctx.train[0].inputs().keys()) if ctx.train else []
    train_inputs = {json_key({k: ex.get(k) for k in keys}) for ex in ctx.train}
    outside = [d for d in demos if json_key({k: d.get(k) for k in keys}) not in train_inputs]
    if outside:
        raise Unavailable(f"ceiling_demos: {len(outside)} demo(s) not in the train split given")
    for _, predictor in ctx.program.named_predictors():
        predictor.demos = list(demos)
    return ctx.program, {"demos": [demo_dict(d) for d in demos]}


def json_key(fields: dict[str, Any]) -> str:
    return json.dumps(fields, sort_keys=True, default=str)


def program_adapter(ctx: ArmContext) -> Any:
    """The adapter the task's program runs its predictors with (``adapter_name`` among the task's ``ADAPTERS``), or
    None (dspy's configured one)."""
    adapters = getattr(ctx.task, "ADAPTERS", None) or {}
    name = getattr(ctx.program, "adapter_name", None)
    return adapters[name]() if name in adapters else None


def rlm_settings(ctx: ArmContext, extra: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``RLMDocstringOptimizer`` an rlmoptimizer arm runs with (and the GEPA arm's reference
    estimate is made with)."""
    return {
        "max_metric_calls": ctx.budget,
        "root_lm": ctx.optimizer_lm,
        "sub_lm": ctx.optimizer_lm,
        "eval_lm": ctx.task_lm,
        "num_threads": ctx.num_threads,
        "rlm_max_iterations": ctx.options["rlm_max_turns"],
        "rlm_max_llm_calls": ctx.options["rlm_max_llm_calls"],
        "root_context_window": ctx.options.get("root_context_window"),
        "attempt": ctx.seed,
        **extra,
    }


def estimate_of(optimizer: Any, ctx: ArmContext) -> Any:
    """``optimizer.estimate(...)`` for the arm's program and data (no LM call), or None on a library without it or
    where it fails (the arm runs anyway)."""
    if not hasattr(optimizer, "estimate"):
        return None
    try:
        return optimizer.estimate(ctx.program, trainset=ctx.train, valset=ctx.val, adapter=program_adapter(ctx))
    except Exception as e:  # an estimate that fails is not worth the arm
        return {"not recorded": f"{type(e).__name__}: {e}"}


def run_gepa(ctx: ArmContext) -> tuple[dspy.Module, dict]:
    optimizer = dspy.GEPA(
        metric=ctx.metric,
        max_metric_calls=ctx.budget,
        reflection_lm=ctx.optimizer_lm,
        num_threads=ctx.num_threads,
        seed=ctx.seed,
        log_dir=str(ctx.work_dir),
        track_stats=True,  # returns its search's record (no LM call, no metric call): see gepa_search
    )
    reference = None
    try:
        from rlmoptimizer import RLMDocstringOptimizer

        loop = RLMDocstringOptimizer(**rlm_settings(ctx, {"rlm_autopilot": "loop", "root_lm": None}))
        reference = estimate_of(loop, ctx)
    except Exception as e:  # no rlmoptimizer here, or one without the loop: no reference, GEPA runs anyway
        reference = {"not recorded": f"{type(e).__name__}: {e}"}
    optimized = optimizer.compile(ctx.program, trainset=ctx.train, valset=ctx.val)
    return optimized, {
        "cost_estimate": reference.to_dict() if hasattr(reference, "to_dict") else reference,
        "estimate_of": f"rlmoptimizer rlm_autopilot='loop' at max_metric_calls={ctx.budget} (GEPA's engine)",
        "settings": {
            "max_metric_calls": ctx.budget,
            "reflection_minibatch_size": 3,
            "use_merge": True,
            "num_threads": ctx.num_threads,
            "seed": ctx.seed,
            "track_stats": True,
        },
        "gepa_search": gepa_search(optimized),
    }


def gepa_search(optimized: dspy.Module) -> dict[str, Any] | None:
    """What dspy.GEPA's search did, from its ``detailed_results``: the candidates it accepted (the first is the
    unchanged program), each one's parents and validation score, the best one, and GEPA's own count of metric
    calls (beside the harness's count of program runs). The children it proposed are its reflections: the
    optimizer-LM calls of the arm (one per proposal, merges excepted)."""
    results = getattr(optimized, "detailed_results", None)
    if results is None:
        return None
    scores = list(results.val_aggregate_scores)
    return {
        "accepted_children": len(results.candidates) - 1,
        "parents": [list(p) for p in results.parents],
        "val_scores": scores,
        "best_idx": results.best_idx,
        "best_val_score": scores[results.best_idx] if scores else None,
        "total_metric_calls": results.total_metric_calls,
        "num_full_val_evals": results.num_full_val_evals,
        "discovery_eval_counts": list(results.discovery_eval_counts),
    }


# Metric calls MIPROv2's BootstrapFewShot step makes per candidate set; measured on the default task
# (up to 3 successes needed at a 25-40% base rate). Only used to size num_trials; the table reports measured calls.
MIPRO_BOOTSTRAP_CALLS_PER_SET = 8
# The same with demos on (max_bootstrapped_demos=4): up to 4 successes a set (the shuffled sets draw 1-4) at a
# 30-40% base rate; an estimate, not a measurement (the arm's file reports the predicted and the counted calls).
MIPRO_DEMO_BOOTSTRAP_CALLS_PER_SET = 12


def mipro_eval_calls(num_trials: int, valset_size: int, minibatch_size: int, full_eval_steps: int) -> int:
    """Metric calls of MIPROv2's search step (dspy 3.4.1 ``_optimize_prompt_parameters``, minibatch=True).

    Mirrors its loop: the default program on the whole valset, then ``num_trials`` minibatches; after a
    trial whose number (counted over optuna trials, which include the default and each full evaluation)
    is a multiple of ``full_eval_steps + 1``, or is the last, one more full-valset evaluation.
    """
    adjusted = num_trials + num_trials // full_eval_steps + 1 + (1 if num_trials % full_eval_steps else 0)
    calls = valset_size
    number = 1  # the default program is added to the study as trial 0
    for _ in range(num_trials):
        number += 1
        trial_num = number
        calls += minibatch_size
        if trial_num % (full_eval_steps + 1) == 0 or trial_num == adjusted - 1:
            calls += valset_size
            number += 1
    return calls


def mipro_trials_for_budget(
    budget: int,
    *,
    num_candidates: int,
    valset_size: int,
    minibatch_size: int,
    full_eval_steps: int,
    bootstrap_calls_per_set: int = MIPRO_BOOTSTRAP_CALLS_PER_SET,
) -> tuple[int, int]:
    """(num_trials, predicted metric calls): the most trials whose predicted metric calls fit ``budget``."""
    bootstrap = (num_candidates - 2) * bootstrap_calls_per_set
    trials = 1
    while bootstrap + mipro_eval_calls(trials + 1, valset_size, minibatch_size, full_eval_steps) <= budget:
        trials += 1
    return trials, bootstrap + mipro_eval_calls(trials, valset_size, minibatch_size, full_eval_steps)


def run_mipro(ctx: ArmContext, *, max_demos: int = 0) -> tuple[dspy.Module, dict]:
    """MIPROv2, instructions only (``max_demos=0``) or with ``max_bootstrapped_demos = max_labeled_demos =
    max_demos``."""
    num_candidates = ctx.options["mipro_candidates"]
    minibatch_size = min(ctx.options["mipro_minibatch_size"], len(ctx.val))
    full_eval_steps = ctx.options["mipro_full_eval_steps"]
    num_trials, predicted = mipro_trials_for_budget(
        ctx.budget,
        num_candidates=num_candidates,
        valset_size=len(ctx.val),
        minibatch_size=minibatch_size,
        full_eval_steps=full_eval_steps,
        bootstrap_calls_per_set=MIPRO_DEMO_BOOTSTRAP_CALLS_PER_SET if max_demos else MIPRO_BOOTSTRAP_CALLS_PER_SET,
    )
    optimizer = dspy.MIPROv2(
        metric=ctx.metric,
        prompt_model=ctx.optimizer_lm,
        task_model=ctx.task_lm,
        max_bootstrapped_demos=max_demos,
        max_labeled_demos=max_demos,
        auto=None,
        num_candidates=num_candidates,
        num_threads=ctx.num_threads,
        seed=ctx.seed,
        verbose=False,
        log_dir=str(ctx.work_dir),
    )
    optimized = optimizer.compile(
        ctx.program,
        trainset=ctx.train,
        valset=ctx.val,
        num_trials=num_trials,
        minibatch=True,
        minibatch_size=minibatch_size,
        minibatch_full_eval_steps=full_eval_steps,
    )
    settings = {
        "num_candidates": num_candidates,
        "num_trials": num_trials,
        "minibatch_size": minibatch_size,
        "minibatch_full_eval_steps": full_eval_steps,
        "predicted_metric_calls": predicted,
        "max_bootstrapped_demos": max_demos,
        "max_labeled_demos": max_demos,
        "num_threads": ctx.num_threads,
        "seed": ctx.seed,
    }
    return optimized, {"settings": settings}


def run_mipro_demos(ctx: ArmContext) -> tuple[dspy.Module, dict]:
    """MIPROv2 with its default demos: ``max_bootstrapped_demos=4, max_labeled_demos=4``."""
    return run_mipro(ctx, max_demos=4)


NO_LOOP = "this rlmoptimizer has no rlm_autopilot='loop'"


def run_rlmoptimizer(ctx: ArmContext, *, autopilot: Any = None) -> tuple[dspy.Module, dict]:
    """RLMDocstringOptimizer; ``autopilot`` (e.g. ``"loop"``) is passed as ``rlm_autopilot`` when given, else the
    library's default is used."""
    try:
        from rlmoptimizer import RLMDocstringOptimizer
    except Exception as e:  # any import failure makes the arm unavailable, not the benchmark
        raise Unavailable(f"{type(e).__name__}: {e}") from e
    extra: dict[str, Any] = {}
    if autopilot is not None:
        if "rlm_autopilot" not in inspect.signature(RLMDocstringOptimizer.__init__).parameters:
            raise Unavailable(f"{NO_LOOP} (it takes no rlm_autopilot at all)")
        extra["rlm_autopilot"] = autopilot
    arguments = rlm_settings(ctx, extra)
    settings = {
        **{k: v for k, v in arguments.items() if not k.endswith("_lm")},
        "budget_units": ctx.budget - len(ctx.val),
    }
    try:
        optimizer = RLMDocstringOptimizer(**arguments, run_storage_dir=ctx.work_dir)
    except (TypeError, ValueError) as e:  # the library refuses the value (rlm_autopilot must be True or False)
        if extra and "autopilot" in str(e):
            raise Unavailable(f"{NO_LOOP} ({type(e).__name__}: {e})") from e
        raise
    estimate = estimate_of(optimizer, ctx)  # before any paid call, as a user would ask it
    optimized = optimizer.compile(student=ctx.program, trainset=ctx.train, metric=ctx.metric, valset=ctx.val)
    details: dict[str, Any] = {"settings": settings}
    if hasattr(estimate, "against"):
        details["cost_estimate"] = estimate.to_dict()
        details["cost_check"] = estimate.against(getattr(optimized, "usage", {}) or {}).to_dict()
    elif estimate is not None:
        details["cost_estimate"] = estimate
    for name in ("optimized_dspy_program", "budget", "selection", "run_storage_dir", "agent_trajectory"):
        if hasattr(optimized, name):
            details[name] = getattr(optimized, name)
    # What the run did, candidate by candidate (its lineage: what each was made from and for, where the library
    # records it), for the per-seed report; the whole run stays in run_storage_dir.
    results = getattr(optimized, "detailed_results", None)
    if results is not None:
        try:
            details["detailed_results"] = results.to_dict() if hasattr(results, "to_dict") else dict(results)
        except Exception as e:  # a report that does not serialize is not worth the arm
            details["detailed_results"] = f"not recorded: {type(e).__name__}: {e}"
    return optimized, details


def run_rlmoptimizer_loop(ctx: ArmContext) -> tuple[dspy.Module, dict]:
    """RLMDocstringOptimizer with ``rlm_autopilot="loop"``: the default policy without an agent."""
    return run_rlmoptimizer(ctx, autopilot="loop")


@dataclass(frozen=True)
class Arm:
    name: str
    run: Any
    metric_as_float: bool  # see CountingMetric
    seeded: bool = True  # runs once per seed; False: once (the unchanged program and the ceilings)


ARMS: dict[str, Arm] = {
    "unchanged": Arm("unchanged", run_unchanged, metric_as_float=True, seeded=False),
    "ceiling-instruction": Arm("ceiling: best instruction", run_ceiling_instruction, True, seeded=False),
    "ceiling-demos": Arm("ceiling: bare instruction + 4 demos", run_ceiling_demos, True, seeded=False),
    "policy": Arm("policy instruction", run_policy, metric_as_float=True, seeded=False),
    "gepa": Arm("GEPA", run_gepa, metric_as_float=False),
    "mipro": Arm("MIPROv2", run_mipro, metric_as_float=True),
    "mipro-demos": Arm("MIPROv2 with demos", run_mipro_demos, metric_as_float=True),
    "rlmoptimizer": Arm("rlmoptimizer", run_rlmoptimizer, metric_as_float=False),
    "rlmoptimizer-loop": Arm("rlmoptimizer loop", run_rlmoptimizer_loop, metric_as_float=False),
}
