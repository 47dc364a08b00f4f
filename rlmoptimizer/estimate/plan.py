"""The work a compile() does with a budget, counted before it runs: program runs, sub-LM proposals, agent turns.

What the default loop does with a budget (``rlmoptimizer/agent/policy.py``): the baselines (free with
``max_iterations``; with ``max_metric_calls`` the validation one is paid outside the agent's units and the train one
is paid from them when first read), then GEPA with all the units or four fifths of them (``gepa_budget``), its
best adopted and checked on validation (free: GEPA scored it there), then an analysis of the train failures (sub-LM
prompts of their own size) and targeted rounds or a last draw with what is left, until the budget is spent. So the expected case spends every unit: a unit is one run of the program on one
example, or (with ``max_iterations``) one sub-LM prompt. (What GEPA leaves that pays nothing the loop does, less than
its minibatch and the selection split, stays unspent: 0 to 3 of 60 units on the real-model benchmark.) How the units
split between evaluations and proposals follows the cost of one GEPA iteration, :data:`RUNS_PER_ITERATION` runs per
minibatch example, measured.

Two other cases bound it: the task solved by the first round of proposals, one per step (the solving child, its
validation, the rest of train seen to pass; the loop then stops: "if solved early"), and every limit reached ("at
most").

May import what :mod:`rlmoptimizer.estimate` may.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlmoptimizer.budget import baseline_on_demand, budget_for, budget_for_metric_calls
from rlmoptimizer.moves.analysis import MAX_ANALYSED, prompts_for
from rlmoptimizer.moves.gepa import MINIBATCH_SIZE

RUNS_PER_ITERATION = 4 / 3
"""Program runs per minibatch example of one GEPA iteration (its child on the minibatch, cut short where it can no
longer beat its parent, and the parent's first runs on examples not evaluated with it yet): 4 for gepa's
3-example minibatch. Measured on the real-model benchmark (``benchmarks/README.md``, issue 35): ``run_gepa(budget=60)``
made 10 reflections with 40 units besides its accepted child's 20 validation runs."""

ACCEPTED_CHILDREN = 1
"""Children the expected run accepts and scores on the whole selection split (one on every benchmark seed that found
anything, and in the offline demo)."""

FAILING_SHARE = 0.5
"""The share of train examples the instructions fail when the loop analyses their failures after GEPA, assumed (the
benchmark's started at 70% failing; GEPA's best fails fewer)."""

ROOT_TURNS = {"loop": 0, "assist": 5, "off": 10}
"""Agent turns assumed when ``root_turns`` is not given. ``"assist"``: the default loop as the agent's instructions lay
it out (look at the failures, run GEPA, adopt and check its best, look at what it still fails, submit), the offline
demo's 5 turns; the benchmark's 1.5B root took 1 to 3. ``"off"``: about one turn per action of the loop."""


@dataclass(frozen=True)
class Work:
    """What one case of a compile does: ``program_runs`` (``baseline_runs`` of them before the optimizer starts),
    ``proposals`` (sub-LM prompts), ``root_turns``, and ``waves``: evaluations one after the other, each the size of
    a batch the threads run at once (for the time)."""

    program_runs: float
    baseline_runs: int
    proposals: float
    root_turns: int
    waves: float
    analysis_prompts: float = 0.0  # sub-LM prompts of the failure analyses, beside the proposals
    analysed: int = 0  # the failures one analysis asks the causes of


@dataclass(frozen=True)
class Plan:
    """The expected work, the work if the first round of proposals solves the task, and the work at every limit, of one
    compile's settings; ``units`` is the budget in units, ``setting`` says how it was set."""

    expected: Work
    solved_early: Work
    at_most: Work
    units: int
    setting: str


def _waves(runs: float, batch: int, threads: int) -> float:
    """Evaluation rounds for ``runs`` runs in batches of ``batch`` with ``threads`` at once."""
    if runs <= 0:
        return 0.0
    return (runs / max(1, batch)) * math.ceil(max(1, batch) / max(1, threads))


def plan(
    *,
    train_size: int,
    val_size: int,
    max_iterations: int | None,
    max_metric_calls: int | None,
    mode: str,
    num_threads: int,
    rlm_max_iterations: int,
    root_turns: int | None = None,
    steps: int = 1,
) -> Plan:
    """The :class:`Plan` of a compile with these settings (the module docstring says how)."""
    t, v = train_size, val_size
    s = v or t  # the selection split: where candidates are checked
    if max_metric_calls:
        units = budget_for_metric_calls(max_metric_calls, t, v)
        setting = f"max_metric_calls={max_metric_calls}: {units} units after the {v or t}-example baseline"
        baselines = v or t
    else:
        units = budget_for(max_iterations or 5, t, v)
        setting = f"max_iterations={max_iterations or 5}: {units} units, the baselines free"
        baselines = t + v
    setting = f"rlm_autopilot={mode!r}; {setting} ({t} train, {v} validation examples)"
    sub_units = 0 if max_metric_calls else 1  # what a sub-LM prompt costs of the units
    minibatch = min(MINIBATCH_SIZE, t)
    per_iteration = RUNS_PER_ITERATION * minibatch
    on_demand = baseline_on_demand(max_metric_calls, v)
    wave = _waves(s, s, num_threads)  # one evaluation of the selection split
    iteration_waves = (2 if on_demand else 1) * _waves(minibatch, minibatch, num_threads)
    turns = ROOT_TURNS.get(mode, 5) if root_turns is None else root_turns
    turns = 0 if mode == "loop" else min(turns, rlm_max_iterations)
    if max_metric_calls:
        baseline_waves = _waves(baselines, baselines, num_threads)
    else:
        baseline_waves = _waves(t, t, num_threads) + _waves(v, v, num_threads)

    # Expected: every unit spent. What GEPA leaves (gepa_budget keeps a fifth of a large budget for them) goes to
    # targeted rounds or a last draw, which cost about what GEPA's iterations do; one accepted child is scored on the
    # selection split. After GEPA, one analysis of the train failures (FAILING_SHARE of train), when the budget
    # pays more than that child and a round.
    accepted = ACCEPTED_CHILDREN if units >= s + per_iteration + sub_units else 0
    analysed = min(round(t * FAILING_SHARE), MAX_ANALYSED) if units >= 2 * (s + per_iteration + sub_units) else 0
    analysis = prompts_for(analysed) if analysed else 0
    spendable = units - analysis * sub_units
    proposals = max(0.0, (spendable - accepted * s) / (per_iteration + sub_units)) if units >= per_iteration else 0.0
    if units >= sub_units + minibatch and proposals < 1:
        proposals = 1.0
    evaluations = spendable - proposals * sub_units
    expected = Work(
        program_runs=baselines + evaluations,
        baseline_runs=baselines,
        proposals=proposals,
        root_turns=turns,
        waves=baseline_waves + proposals * iteration_waves + accepted * wave,
        analysis_prompts=float(analysis),
        analysed=analysed,
    )

    # Solved early: GEPA proposes for the steps in turn, and the proposal for the step that matters (the last one
    # of a round, at worst) solves it: a round of iterations, the solving child checked on the selection split, the
    # rest of train run with it (the loop sees every train example pass and submits); never more than the budget.
    early_proposals = max(1, steps)
    early_units = early_proposals * (sub_units + per_iteration) + (s + (t - minibatch) if v else t - minibatch)
    early_units = min(units, early_units)
    early_proposals = min(early_proposals, early_units / (sub_units + per_iteration))
    solved_early = Work(
        program_runs=baselines + early_units - early_proposals * sub_units,
        baseline_runs=baselines,
        proposals=early_proposals,
        root_turns=turns,  # the agent's turns are assumed, whatever the budget does
        waves=baseline_waves + iteration_waves + wave + _waves(t - minibatch, minibatch, num_threads),
    )

    # At most: every unit an evaluation, the submission's check unpaid (max_iterations evaluates it when the budget
    # is spent), every sub-LM prompt of its allowance, every agent turn (and the extraction at the turn limit).
    most_runs = baselines + units + (0 if max_metric_calls else s)
    at_most = Work(
        program_runs=most_runs,
        baseline_runs=baselines,
        proposals=float(max_metric_calls or units),
        root_turns=0 if mode == "loop" else rlm_max_iterations + 1,
        waves=baseline_waves + units / max(1, minibatch) * iteration_waves + wave,
    )
    return Plan(expected=expected, solved_early=solved_early, at_most=at_most, units=units, setting=setting)
