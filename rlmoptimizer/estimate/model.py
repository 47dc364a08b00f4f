"""The cost model: the work of the plan (:mod:`rlmoptimizer.estimate.plan`) times the size of each call
(:mod:`rlmoptimizer.estimate.sizes`), priced by litellm and timed at a latency, as a
:class:`~rlmoptimizer.report.costs.CostEstimate`.

May import what :mod:`rlmoptimizer.estimate` may.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import dspy

from rlmoptimizer.agent.bounded_context import context_window_of
from rlmoptimizer.agent.window import first_request_messages
from rlmoptimizer.estimate.plan import Plan, Work, plan
from rlmoptimizer.estimate.sizes import (
    FIELD_TOKENS,
    PROPOSAL_TOKENS,
    REASONING_TOKENS,
    ROOT_OUTPUT_TOKENS,
    ROOT_REPLY_TOKENS,
    CallSize,
    ProgramSizes,
    analysis_size,
    program_sizes,
    proposal_size,
    root_turn_sizes,
    spread,
)
from rlmoptimizer.estimate.tokens import TokenCounter, model_name
from rlmoptimizer.fingerprint import copy_program
from rlmoptimizer.report.costs import CostEstimate, RoleCost
from rlmoptimizer.sandbox.limits import instructions as sandbox_rules
from rlmoptimizer.usage import EVAL, ROOT, SUB, dollars, price_of_call, unpriced_models

logger = logging.getLogger(__name__)

SECONDS_PER_CALL = 1.0
"""The latency the time column assumes for one LM call of every role, unless ``seconds_per_call`` says otherwise."""


def _price(model: str, calls: float, size: CallSize) -> Decimal | None:
    """Dollars for ``calls`` calls of ``size`` on ``model`` (litellm prices each call; tiers apply per call)."""
    if calls <= 0:
        return Decimal(0)
    one = price_of_call(model, round(size.input_tokens), round(size.output_tokens))
    return None if one is None else one * Decimal(repr(float(calls)))


def _row(role: str, model: str, calls: float, size: CallSize, seconds: float, usd: Decimal | None) -> RoleCost:
    return RoleCost(
        role=role,
        model=model,
        calls=round(calls),
        input_tokens=round(calls * size.input_tokens),
        output_tokens=round(calls * size.output_tokens),
        cost_usd=None if usd is None else float(usd),
        seconds=round(seconds, 1),
    )


def _latency(seconds_per_call: float | Mapping[str, float]) -> dict[str, float]:
    if isinstance(seconds_per_call, Mapping):
        return {role: float(seconds_per_call.get(role, SECONDS_PER_CALL)) for role in (EVAL, SUB, ROOT)}
    return dict.fromkeys((EVAL, SUB, ROOT), float(seconds_per_call))


class _Roles:
    """Prices and times one :class:`~rlmoptimizer.estimate.plan.Work` with the sizes of one compile's calls."""

    def __init__(
        self,
        sizes: ProgramSizes,
        growth: dict[str, float],
        proposal: CallSize,
        root_turn: CallSize,
        models: dict[str, str],
        latency: dict[str, float],
        analysis: CallSize | None = None,
    ) -> None:
        self.sizes, self.growth, self.proposal, self.root_turn = sizes, growth, proposal, root_turn
        self.models, self.latency, self.analysis = models, latency, analysis or CallSize()

    def eval_row(self, work: Work) -> RoleCost:
        sizes = self.sizes
        changed = max(0.0, work.program_runs - work.baseline_runs)  # runs of candidates, their instructions longer
        calls, tokens_in, tokens_out, usd = 0.0, 0.0, 0.0, Decimal(0)
        for step, size in sizes.steps.items():
            share = sizes.calls[step]  # calls of the step a run
            step_calls = work.program_runs * share
            step_in = step_calls * size.input_tokens + changed * share * self.growth[step]
            step_out = step_calls * size.output_tokens
            calls, tokens_in, tokens_out = calls + step_calls, tokens_in + step_in, tokens_out + step_out
            per_call = CallSize(step_in / step_calls, size.output_tokens) if step_calls else CallSize()
            price = _price(model_name(sizes.lms[step]), step_calls, per_call)
            usd = None if usd is None or price is None else usd + price
        size = CallSize(tokens_in / calls, tokens_out / calls) if calls else CallSize()
        seconds = work.waves * sizes.calls_per_run * self.latency[EVAL]
        return _row(EVAL, self.models[EVAL], calls, size, seconds, usd)

    def sub_row(self, work: Work) -> RoleCost:
        """The proposals and the analyses' prompts (each of its own size)."""
        calls = work.proposals + work.analysis_prompts
        proposals, analyses = (work.proposals, self.proposal), (work.analysis_prompts, self.analysis)
        usd = [_price(self.models[SUB], n, size) for n, size in (proposals, analyses) if n]
        total = None if None in usd else sum(usd, Decimal(0))
        tokens = [
            sum(n * getattr(size, side) for n, size in (proposals, analyses))
            for side in ("input_tokens", "output_tokens")
        ]
        size = CallSize(tokens[0] / calls, tokens[1] / calls) if calls else CallSize()
        return _row(SUB, self.models[SUB], calls, size, calls * self.latency[SUB], total)

    def root_row(self, work: Work, turn: CallSize | None = None) -> RoleCost:
        turn = turn or self.root_turn
        usd = _price(self.models[ROOT], work.root_turns, turn)
        return _row(ROOT, self.models[ROOT], work.root_turns, turn, work.root_turns * self.latency[ROOT], usd)

    def rows(self, work: Work, turn: CallSize | None = None) -> tuple[RoleCost, ...]:
        return (self.eval_row(work), self.sub_row(work), self.root_row(work, turn))


def _total(rows: Sequence[RoleCost], name: str) -> RoleCost:
    total = RoleCost(role=name)
    for row in rows:
        total = total.plus(row, name)
    return total


def _cap_verdict(
    cap: float | None, expected: RoleCost, at_most: RoleCost, rows: Sequence[RoleCost], baselines: float = 0.0
) -> str:
    """Whether ``max_cost_usd`` stops the run early, in a sentence; ``baselines``: the dollars of the unchanged
    program's baseline runs (they run whole whatever the cap: every result is measured against them)."""
    if cap is None:
        return "max_cost_usd: not set (no spending cap)."
    given = f"max_cost_usd={dollars(cap)}"
    if baselines > cap:
        return (
            f"{given} is below what the unchanged program's baselines are expected to cost ({dollars(baselines)}): "
            "they run whole (every result is measured against them), then the cap stops the run."
        )
    if expected.cost_usd is None:
        unpriced = ", ".join(unpriced_models(rows))
        return (
            f"{given}: litellm has no price for {unpriced}, and the cap counts priced calls only: it can only stop "
            "the run on what the priced LMs spend."
        )
    if expected.cost_usd > cap:
        return (
            f"{given} is below the expected {dollars(expected.cost_usd)}: it will stop the run early, after about "
            f"{cap / expected.cost_usd:.0%} of the expected spending (what is left is not evaluated; the best "
            "candidate already checked is returned)."
        )
    if at_most.cost_usd is not None and at_most.cost_usd <= cap:
        return (
            f"{given} is above the most this run can spend at the sizes assumed ({dollars(at_most.cost_usd)}): it "
            "should not stop the run, unless replies run longer than assumed (a ChainOfThought's reasoning; "
            "estimate(..., sample=3) measures them), a step runs several times an example, or the metric's own LM "
            "calls, which this estimate leaves out, cost the difference."
        )
    return (
        f"{given} is above the expected {dollars(expected.cost_usd)}: it should not stop the run; it would if the "
        f"run went past the estimate (at most {dollars(at_most.cost_usd or 0)})."
    )


def _baselines_usd(rows: Sequence[RoleCost], baseline_runs: float, program_runs: float) -> float:
    """The dollars of the unchanged program's baseline runs: their share of the program's runs."""
    eval_usd = sum(r.cost_usd for r in rows if r.role == EVAL and r.cost_usd is not None)
    return eval_usd * baseline_runs / max(program_runs, 1)


def with_cap(estimate: CostEstimate, cap: float | None) -> CostEstimate:
    """``estimate`` judged against the spending cap ``cap`` (a resumed compile's may differ from the first one's)."""
    if cap == estimate.max_cost_usd:
        return estimate
    baselines = _baselines_usd(estimate.roles, estimate.baseline_runs, estimate.program_runs)
    verdict = _cap_verdict(cap, estimate.total, estimate.at_most, estimate.roles, baselines)
    return dataclasses.replace(estimate, cap=verdict, max_cost_usd=cap)


def estimate_cost(
    config: Any,
    program: dspy.Module,
    trainset: Sequence[Any],
    valset: Sequence[Any],
    *,
    eval_lm: Any,
    metric: Any = None,
    sample: int = 0,
    root_turns: int | None = None,
    proposal_tokens: float | None = None,
    reasoning_tokens: float | None = None,
    seconds_per_call: float | Mapping[str, float] = SECONDS_PER_CALL,
    adapter: Any = None,
) -> CostEstimate:
    """The :class:`CostEstimate` of ``config.compile(program, trainset=..., valset=...)``. No LM is called unless
    ``sample`` > 0: then the program runs on the first ``sample`` train examples (and ``metric`` scores them) to
    measure its calls, paid unless dspy's cache has them."""
    from rlmoptimizer.estimate._dspy import ChatAdapter

    adapter = adapter or dspy.settings.adapter or ChatAdapter()
    proposal_tokens = PROPOSAL_TOKENS if proposal_tokens is None else proposal_tokens
    reasoning_tokens = REASONING_TOKENS if reasoning_tokens is None else reasoning_tokens
    work = plan(
        train_size=len(trainset),
        val_size=len(valset),
        max_iterations=config.max_iterations,
        max_metric_calls=config.max_metric_calls,
        mode=config.rlm_autopilot,
        num_threads=config.num_threads,
        rlm_max_iterations=config.rlm_max_iterations,
        root_turns=root_turns,
        steps=len(program.named_predictors()),
    )
    measured = run_sample(program, list(trainset[:sample]), eval_lm, metric) if sample else None
    with dspy.context(callbacks=[]):  # rendering prompts calls nothing: dspy's callbacks are not told of it
        return _estimate(
            config,
            program,
            (trainset, valset),
            work,
            eval_lm,
            adapter,
            measured,
            (proposal_tokens, reasoning_tokens),
            seconds_per_call,
        )


def _estimate(
    config: Any,
    program: dspy.Module,
    data: tuple[Sequence[Any], Sequence[Any]],
    work: Plan,
    eval_lm: Any,
    adapter: Any,
    measured: tuple[list, list, list, int] | None,
    lengths: tuple[float, float],
    seconds_per_call: float | Mapping[str, float],
) -> CostEstimate:
    """:func:`estimate_cost` once the plan is made and the sample (``measured``: its examples, traces and feedback)
    is run: the sizes, prices and times."""
    trainset, valset = data
    proposal_tokens, reasoning_tokens = lengths
    sub_lm = config.sub_lm or config.root_lm
    assumptions: list[str] = []
    if measured is not None:
        examples, traces, feedback, failed = measured
        sizes = program_sizes(program, examples, eval_lm, adapter, traces=traces, feedback=feedback)
        assumptions.append(
            f"the program's calls measured on {len(traces)} train example(s) run with the unchanged instructions"
            + (f" ({failed} failed and were left out)" if failed else "")
        )
    else:
        examples = spread(list(trainset)) + spread(list(valset))
        sizes = program_sizes(program, examples, eval_lm, adapter, reasoning_tokens=reasoning_tokens)
        assumptions.append(
            f"each step called once a run; its reply: the example's labels, {reasoning_tokens:g} tokens of reasoning, "
            f"any other field as long as the step's longest input, up to {FIELD_TOKENS} (sample= measures them)"
        )
    models = {
        EVAL: ", ".join(sorted({model_name(lm) for lm in sizes.lms.values()})) or model_name(eval_lm),
        SUB: model_name(sub_lm),
        ROOT: model_name(config.root_lm) if config.root_lm is not None else "",
    }
    counters = {step: TokenCounter(lm) for step, lm in sizes.lms.items()}
    # A candidate changes one step (GEPA proposes for one component at a time): each step's calls in a candidate's
    # run are longer by a proposal less its own instructions, one time in as many as there are steps.
    growth = {
        step: (proposal_tokens - counters[step].text(text)) / max(1, len(sizes.instructions))
        for step, text in sizes.instructions.items()
    }
    proposal = proposal_size(sizes, sub_lm, proposal_tokens)
    analysis = analysis_size(sizes, sub_lm, work.expected.analysed)
    root_turn, window, fixed = CallSize(), 0, 0
    if config.root_lm is not None and config.rlm_autopilot != "loop":
        window, _ = context_window_of(config.root_lm, config.root_context_window)
        messages = first_request_messages(
            config,
            sandbox_rules(config.sandbox_timeout_s),
            {name: (str(p.signature.signature), p.signature.instructions) for name, p in program.named_predictors()},
            len(trainset),
            len(valset),
            work.units,
        )
        root_turn, fixed = root_turn_sizes(messages, config.root_lm, work.expected.root_turns, window)
    roles = _Roles(sizes, growth, proposal, root_turn, models, _latency(seconds_per_call), analysis)
    rows = roles.rows(work.expected)
    most = _total(roles.rows(work.at_most, CallSize(float(window), float(ROOT_REPLY_TOKENS))), "at most")
    expected = _total(rows, "total")
    hows = {c.how for c in counters.values()} | {TokenCounter(sub_lm).how}
    if config.root_lm is not None and config.rlm_autopilot != "loop":
        hows.add(TokenCounter(config.root_lm).how)
    assumptions += _assumptions(work, config, hows, proposal_tokens, fixed, window)
    return CostEstimate(
        roles=rows,
        solved_early=roles.rows(work.solved_early),
        at_most=most,
        setting=work.setting,
        program_runs=round(work.expected.program_runs),
        baseline_runs=work.expected.baseline_runs,
        proposals=round(work.expected.proposals),
        root_turns=work.expected.root_turns,
        cap=_cap_verdict(
            config.max_cost_usd,
            expected,
            most,
            rows,
            _baselines_usd(rows, work.expected.baseline_runs, work.expected.program_runs),
        ),
        max_cost_usd=config.max_cost_usd,
        seconds_per_call=_latency(seconds_per_call),
        sampled=len(traces) if measured is not None else 0,
        assumptions=tuple(assumptions),
    )


def _assumptions(work: Plan, config: Any, hows: set[str], proposal_tokens: float, fixed: int, window: int) -> list[str]:
    lines = [
        "the budget spent to its end (the default loop spends it unless every train example passes first)",
        f"{round(work.expected.proposals)} proposals: one GEPA iteration costs 4 program runs, one accepted child "
        "is scored on the whole selection split",
        *(
            [
                f"one analysis after GEPA of {work.expected.analysed} train failures (half of train, at most 48): "
                f"{work.expected.analysis_prompts:g} sub-LM prompts of up to 8 failures each and the merge"
            ]
            if work.expected.analysis_prompts
            else []
        ),
        f"proposed instructions of {proposal_tokens:g} tokens (they replace the step's in the candidates' runs)",
        "tokens: " + "; ".join(sorted(hows)),
        "dollars at litellm's list price, no prompt-cache discount",
    ]
    if config.rlm_autopilot != "loop" and config.root_lm is not None:
        lines.append(
            f"{work.expected.root_turns} agent turns (root_turns=), each its first request's {fixed:,} tokens plus "
            f"{ROOT_REPLY_TOKENS + ROOT_OUTPUT_TOKENS} a turn before it ({ROOT_REPLY_TOKENS} of reply, "
            f"{ROOT_OUTPUT_TOKENS} printed), within its {window:,}-token window"
        )
    return lines


def run_sample(
    program: dspy.Module, examples: Sequence[Any], eval_lm: Any, metric: Any
) -> tuple[list[Any], list[list[tuple[str, dict, dict]]], list[str | None], int]:
    """Run a copy of ``program`` on ``examples`` with ``eval_lm`` (paid, unless dspy's cache has the answers),
    recording each predictor call from dspy's trace, and score each with ``metric`` (a
    :class:`~rlmoptimizer.metric.Metric`) for its feedback. ``(examples run, their calls, their feedback, how many
    failed)``;
    an example whose program or metric raised is left out, a failure of the LM itself is raised."""
    from rlmoptimizer.evaluation.lm_failures import classify_lm_failure

    copy = copy_program(program)
    names = {id(predictor): name for name, predictor in copy.named_predictors()}
    kept, traces, feedback, failed = [], [], [], 0
    for example in examples:
        with dspy.context(lm=eval_lm, trace=[]):
            try:
                prediction = copy(**example.inputs())
                calls = [
                    (names.get(id(predictor), ""), dict(inputs), dict(outputs.items()))
                    for predictor, inputs, outputs in dspy.settings.trace
                ]
                note = metric.score(example, prediction)[1] if metric is not None else None
            except Exception as exc:
                if classify_lm_failure(exc) is not None:
                    raise
                failed += 1
                continue
        kept.append(example)
        traces.append(calls)
        feedback.append(note)
    return kept, traces, feedback, failed
