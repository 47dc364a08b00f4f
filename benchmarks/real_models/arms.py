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
* policy (not an optimizer): the unchanged program with the task's ``POLICY_INSTRUCTION``, the instruction that
  states the whole policy, on every predictor; with the unchanged program it measures what the best instruction
  is worth (the ceiling), at no metric call.
* rlmoptimizer: ``max_metric_calls=B``, counted as GEPA counts it: its baseline on validation, the train
  baseline when something reads it, and the final validation check of its submission are in B; the agent's units
  are what the validation baseline leaves. Sub-LM prompts (the agent's questions, GEPA's reflections) are not
  metric calls, as in GEPA; they have an allowance of B prompts of their own. ``root_context_window`` is the optimizer server's ``--n-ctx`` when that model is local (litellm
  knows no window for it).

Seeds: GEPA and MIPROv2 get ``seed=seed``; rlmoptimizer gets ``attempt=seed`` (its agent's and sub-LM's requests
carry dspy's ``rollout_id``, so no seed replays another's cached calls). The local server samples the optimizer
LM at temperature 0.7 from its own random state, which advances with every call, so the seeds' optimizer-LM
replies are distinct samples. Each arm writes its optimizer's files to ``ctx.work_dir``, emptied before it starts
(GEPA and rlmoptimizer resume from what they find there; an arm that was stopped starts over).
"""

from __future__ import annotations

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


def instructions_of(program: dspy.Module) -> dict[str, str]:
    return {name: predictor.signature.instructions for name, predictor in program.named_predictors()}


def run_unchanged(ctx: ArmContext) -> tuple[dspy.Module, dict]:
    return ctx.program, {}


def run_policy(ctx: ArmContext) -> tuple[dspy.Module, dict]:
    if not ctx.policy_instruction:
        raise Unavailable("the task defines no POLICY_INSTRUCTION")
    for _, predictor in ctx.program.named_predictors():
        predictor.signature = predictor.signature.with_instructions(ctx.policy_instruction)
    return ctx.program, {}


def run_gepa(ctx: ArmContext) -> tuple[dspy.Module, dict]:
    optimizer = dspy.GEPA(
        metric=ctx.metric,
        max_metric_calls=ctx.budget,
        reflection_lm=ctx.optimizer_lm,
        num_threads=ctx.num_threads,
        seed=ctx.seed,
        log_dir=str(ctx.work_dir),
    )
    optimized = optimizer.compile(ctx.program, trainset=ctx.train, valset=ctx.val)
    return optimized, {
        "settings": {
            "max_metric_calls": ctx.budget,
            "reflection_minibatch_size": 3,
            "use_merge": True,
            "num_threads": ctx.num_threads,
            "seed": ctx.seed,
        }
    }


# Metric calls MIPROv2's BootstrapFewShot step makes per candidate set; measured on the default task
# (up to 3 successes needed at a 25-40% base rate). Only used to size num_trials; the table reports measured calls.
MIPRO_BOOTSTRAP_CALLS_PER_SET = 8


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
    budget: int, *, num_candidates: int, valset_size: int, minibatch_size: int, full_eval_steps: int
) -> tuple[int, int]:
    """(num_trials, predicted metric calls): the most trials whose predicted metric calls fit ``budget``."""
    bootstrap = (num_candidates - 2) * MIPRO_BOOTSTRAP_CALLS_PER_SET
    trials = 1
    while bootstrap + mipro_eval_calls(trials + 1, valset_size, minibatch_size, full_eval_steps) <= budget:
        trials += 1
    return trials, bootstrap + mipro_eval_calls(trials, valset_size, minibatch_size, full_eval_steps)


def run_mipro(ctx: ArmContext) -> tuple[dspy.Module, dict]:
    num_candidates = ctx.options["mipro_candidates"]
    minibatch_size = min(ctx.options["mipro_minibatch_size"], len(ctx.val))
    full_eval_steps = ctx.options["mipro_full_eval_steps"]
    num_trials, predicted = mipro_trials_for_budget(
        ctx.budget,
        num_candidates=num_candidates,
        valset_size=len(ctx.val),
        minibatch_size=minibatch_size,
        full_eval_steps=full_eval_steps,
    )
    optimizer = dspy.MIPROv2(
        metric=ctx.metric,
        prompt_model=ctx.optimizer_lm,
        task_model=ctx.task_lm,
        max_bootstrapped_demos=0,
        max_labeled_demos=0,
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
        "max_bootstrapped_demos": 0,
        "max_labeled_demos": 0,
        "num_threads": ctx.num_threads,
        "seed": ctx.seed,
    }
    return optimized, {"settings": settings}


def run_rlmoptimizer(ctx: ArmContext) -> tuple[dspy.Module, dict]:
    try:
        from rlmoptimizer import RLMDocstringOptimizer
    except Exception as e:  # any import failure makes the arm unavailable, not the benchmark
        raise Unavailable(f"{type(e).__name__}: {e}") from e
    window = ctx.options.get("root_context_window")
    settings = {
        "max_metric_calls": ctx.budget,
        "budget_units": ctx.budget - len(ctx.val),
        "rlm_max_iterations": ctx.options["rlm_max_turns"],
        "rlm_max_llm_calls": ctx.options["rlm_max_llm_calls"],
        "root_context_window": window,
        "num_threads": ctx.num_threads,
        "attempt": ctx.seed,
    }
    optimizer = RLMDocstringOptimizer(
        max_metric_calls=ctx.budget,
        root_lm=ctx.optimizer_lm,
        sub_lm=ctx.optimizer_lm,
        eval_lm=ctx.task_lm,
        num_threads=ctx.num_threads,
        rlm_max_iterations=ctx.options["rlm_max_turns"],
        rlm_max_llm_calls=ctx.options["rlm_max_llm_calls"],
        root_context_window=window,
        attempt=ctx.seed,
        run_storage_dir=ctx.work_dir,
    )
    optimized = optimizer.compile(student=ctx.program, trainset=ctx.train, metric=ctx.metric, valset=ctx.val)
    details: dict[str, Any] = {"settings": settings}
    for name in ("optimized_dspy_program", "budget", "selection", "run_storage_dir", "agent_trajectory"):
        if hasattr(optimized, name):
            details[name] = getattr(optimized, name)
    return optimized, details


@dataclass(frozen=True)
class Arm:
    name: str
    run: Any
    metric_as_float: bool  # see CountingMetric
    seeded: bool = True  # runs once per seed; False: once (the unchanged program and the policy instruction)


ARMS: dict[str, Arm] = {
    "unchanged": Arm("unchanged", run_unchanged, metric_as_float=True, seeded=False),
    "policy": Arm("policy instruction", run_policy, metric_as_float=True, seeded=False),
    "rlmoptimizer": Arm("rlmoptimizer", run_rlmoptimizer, metric_as_float=False),
    "gepa": Arm("GEPA", run_gepa, metric_as_float=False),
    "mipro": Arm("MIPROv2", run_mipro, metric_as_float=True),
}
