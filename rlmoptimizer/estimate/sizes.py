"""What one LM call of each kind costs in tokens, from the prompts dspy's adapters render, before any call.

* a run of the program (:func:`program_sizes`): each predictor's request as the adapter formats it (its instructions,
  fields and demos, with an example's inputs) and its reply (the example's labels for output fields it has, else a
  placeholder of :data:`REASONING_TOKENS` for ChainOfThought's ``reasoning`` and :data:`FIELD_TOKENS` for any other
  field; a field one step writes and a later one reads is that placeholder too). With ``traces`` (from a paid
  sample) the real inputs and outputs of each call are rendered instead, and the calls per run are those made;
* a proposal (:func:`proposal_size`): dspy's ``InstructionProposer`` request, as GEPA's reflection and
  ``propose_instructions`` send it (JSONAdapter), with a minibatch of the step's calls and their feedback, and a
  new instruction of :data:`PROPOSAL_TOKENS` as the reply;
* an analysis prompt (:func:`analysis_size`): ``analyze_failures``' prompts as it sends them (JSONAdapter): its cause
  prompts, each with up to 8 failures rendered as the sub-LM reads them (the runs above, scored as failures) and two
  passing examples for contrast, and its merge of the causes, each cause :data:`CAUSE_TOKENS` long;
* an agent turn (:func:`root_turn_sizes`): the fixed part of the agent's first request, measured as
  :mod:`rlmoptimizer.agent.window` builds it, plus the history of the turns before (:data:`ROOT_REPLY_TOKENS` and
  :data:`ROOT_OUTPUT_TOKENS` a turn).

May import what :mod:`rlmoptimizer.estimate` may.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dspy

from rlmoptimizer.estimate.tokens import TokenCounter, placeholder
from rlmoptimizer.records import ExampleResult, StepTrace

REASONING_TOKENS = 30
"""ChainOfThought's ``reasoning``, assumed: the benchmark's task LM wrote 46 tokens a call, its JSON reply with a
one-word answer included (about 30 of reasoning)."""
FIELD_TOKENS = 40
"""Any other field with no value to measure (an output without a label: as long as its step's longest input up to
this; an input no example and no earlier step gives)."""
PROPOSAL_TOKENS = 50
"""A proposed instruction (a reflection's reply without its JSON), assumed: the replies were 41 to 69 tokens in the
offline demo and the benchmark (a 1.5B model), 54 on average in the benchmark's loop run; larger models write longer
ones (pass ``proposal_tokens=``)."""
ROOT_REPLY_TOKENS = 150
"""An agent turn's reply (a few sentences of reasoning and a code cell that calls a tool or two), assumed."""
ROOT_OUTPUT_TOKENS = 150
"""What a turn's code prints (a move's summary, a few failures), shown in the next requests, assumed."""
MAX_MEASURED = 20
"""Examples rendered per split (evenly spread): a large data set is measured on a sample of it."""
MINIBATCH = 3
"""Examples in one reflection (gepa's minibatch)."""
CAUSE_TOKENS = 25
"""A cause the sub-LM names for one failure, assumed (the benchmark's 1.5B sub-LM wrote 20 to 30 tokens)."""


@dataclass(frozen=True)
class CallSize:
    """Tokens of one LM call, averaged."""

    input_tokens: float = 0.0
    output_tokens: float = 0.0


@dataclass(frozen=True)
class ProgramSizes:
    """One run of the program: per step its call (``steps``), how many times a run calls it (``calls``: once each,
    unless a sample measured otherwise) and the LM it runs on (``lms``); its instructions; and what a proposal for each
    step is shown (``reflective``: the step's inputs, outputs and feedback on examples)."""

    steps: dict[str, CallSize]
    calls: dict[str, float]
    lms: dict[str, Any]
    instructions: dict[str, str]
    reflective: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    records: tuple[ExampleResult, ...] = ()  # each run rendered as a train record that failed (for an analysis)

    @property
    def calls_per_run(self) -> float:
        return sum(self.calls.values())


def spread(examples: Sequence[Any], n: int = MAX_MEASURED) -> list[Any]:
    """Up to ``n`` of ``examples``, evenly spread (all of them when there are fewer)."""
    if len(examples) <= n:
        return list(examples)
    return [examples[round(i * (len(examples) - 1) / (n - 1))] for i in range(n)]


def _fields(example: Any) -> dict[str, Any]:
    try:
        return dict(example.toDict())
    except Exception:  # noqa: BLE001 - an example that is not a dspy.Example: no fields to read
        return {}


def _render(adapter: Any, signature: Any, demos: Any, inputs: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        return adapter.format(signature, demos=list(demos or []), inputs=inputs)
    except Exception:  # noqa: BLE001 - a field type the adapter cannot take a placeholder for: the raw text
        text = "\n".join([str(signature.instructions), *(f"{k}: {v}" for k, v in inputs.items())])
        return [{"role": "user", "content": text}]


def _reply(adapter: Any, signature: Any, outputs: dict[str, Any]) -> str:
    try:
        return adapter.format_assistant_message_content(signature, outputs)
    except Exception:  # noqa: BLE001 - as above
        return "\n".join(f"{k}: {v}" for k, v in outputs.items())


def _feedback(labels: Mapping[str, Any]) -> str:
    """The feedback a proposal shows for an example whose metric wrote none (as the reflective dataset builds it)."""
    return f"Score: 0 (did not pass).\nExpected (the example's labels): {json.dumps(dict(labels), default=str)}"


def program_sizes(
    program: dspy.Module,
    examples: Sequence[Any],
    eval_lm: Any,
    adapter: Any,
    *,
    reasoning_tokens: float = REASONING_TOKENS,
    traces: Sequence[Sequence[tuple[str, dict, dict]]] | None = None,
    feedback: Sequence[str | None] = (),
) -> ProgramSizes:
    """Token sizes of one run of ``program`` (see the module docstring); ``traces``: per example run, its calls as
    ``(step, inputs, outputs)``; ``feedback``: the metric's feedback on those runs."""
    predictors = dict(program.named_predictors())
    lms = {name: getattr(p, "lm", None) or eval_lm for name, p in predictors.items()}
    counters: dict[int, TokenCounter] = {}

    def counter(step: str) -> TokenCounter:
        lm = lms[step]
        if id(lm) not in counters:
            counters[id(lm)] = TokenCounter(lm)
        return counters[id(lm)]

    totals: dict[str, list[float]] = {name: [0.0, 0.0, 0] for name in predictors}
    reflective: dict[str, list[dict[str, Any]]] = {name: [] for name in predictors}
    if traces:
        runs = [list(t) for t in traces]
        notes = list(feedback) + [None] * len(runs)
    else:
        runs = [_assumed_calls(predictors, _fields(ex), reasoning_tokens) for ex in examples]
        notes = [None] * len(runs)
    labels_of = [_labels(ex) for ex in examples] + [{}] * len(runs)
    records = []
    for run, note, labels in zip(runs, notes, labels_of, strict=False):
        calls = tuple(
            StepTrace(step, dict(inputs), dict(outputs)) for step, inputs, outputs in run if step in predictors
        )
        if calls:
            first, last = calls[0].inputs, calls[-1].outputs
            records.append(ExampleResult(len(records), first, dict(labels), last, 0.0, False, note, steps=calls))
        for step, inputs, outputs in run:
            if step not in predictors:
                continue
            signature = predictors[step].signature
            count = counter(step)
            totals[step][0] += count.messages(_render(adapter, signature, predictors[step].demos, inputs))
            totals[step][1] += count.text(_reply(adapter, signature, outputs))
            totals[step][2] += 1
            reflective[step].append(
                {"Inputs": dict(inputs), "Generated Outputs": dict(outputs), "Feedback": note or _feedback(labels)}
            )
    steps = {
        name: CallSize(total[0] / total[2], total[1] / total[2]) if total[2] else CallSize()
        for name, total in totals.items()
    }
    calls = {name: (total[2] / max(1, len(runs)) if traces else 1.0) for name, total in totals.items()}
    return ProgramSizes(
        steps=steps,
        calls=calls,
        lms=lms,
        instructions={name: p.signature.instructions for name, p in predictors.items()},
        reflective=reflective,
        records=tuple(records),
    )


def _labels(example: Any) -> dict[str, Any]:
    fields = _fields(example)
    try:
        inputs = set(example.inputs().keys())
    except Exception:  # noqa: BLE001
        inputs = set()
    return {k: v for k, v in fields.items() if k not in inputs}


def _assumed_calls(
    predictors: Mapping[str, Any], fields: Mapping[str, Any], reasoning_tokens: float
) -> list[tuple[str, dict, dict]]:
    """Each predictor once, in order, on ``fields`` (an example's): inputs from the example, else from what an
    earlier step wrote, else a placeholder; outputs from the example's labels, else placeholders."""
    produced: dict[str, Any] = {}
    calls = []
    for name, predictor in predictors.items():
        signature = predictor.signature
        inputs = {
            key: fields[key] if key in fields else produced.get(key, placeholder(FIELD_TOKENS))
            for key in signature.input_fields
        }
        longest = max((len(str(v).split()) for v in inputs.values()), default=FIELD_TOKENS)
        outputs = {}
        for key in signature.output_fields:
            if key in fields:
                outputs[key] = fields[key]
            elif key == "reasoning":
                outputs[key] = placeholder(reasoning_tokens)
            else:  # a field with no label to measure: as long as the step's longest input, up to FIELD_TOKENS
                outputs[key] = placeholder(min(FIELD_TOKENS, longest))
        produced.update(outputs)
        calls.append((name, inputs, outputs))
    return calls


def proposal_size(sizes: ProgramSizes, sub_lm: Any, proposal_tokens: float = PROPOSAL_TOKENS) -> CallSize:
    """One proposal, averaged over the steps (GEPA proposes for them in turn)."""
    from rlmoptimizer.estimate._dspy import InstructionProposer, JSONAdapter

    signature = InstructionProposer().propose.signature
    adapter = JSONAdapter()
    count = TokenCounter(sub_lm)
    reply = count.text(_reply(adapter, signature, {"new_instruction": placeholder(proposal_tokens)}))
    sizes_in = []
    for step, dataset in sizes.reflective.items():
        if not dataset:
            continue
        batch = dataset[:MINIBATCH]
        inputs = {"current_instruction": sizes.instructions[step], "examples_with_feedback": batch}
        sizes_in.append(count.messages(_render(adapter, signature, [], inputs)))
    return CallSize(sum(sizes_in) / len(sizes_in) if sizes_in else 0.0, float(reply))


def analysis_size(sizes: ProgramSizes, sub_lm: Any, failures: int) -> CallSize:
    """One prompt of an analysis of ``failures`` train failures, averaged over its cause prompts and its merge."""
    from rlmoptimizer.estimate._dspy import JSONAdapter
    from rlmoptimizer.moves.analysis import FAILURES_PER_PROMPT, MAX_ANALYSED, GroupFailureCauses, NameFailureCauses
    from rlmoptimizer.moves.failures import CauseGroup, FailureCause, failures_of, render_failure, render_passing

    records = list(sizes.records)
    analysed = min(failures, MAX_ANALYSED)
    if not records or analysed <= 0:
        return CallSize()
    adapter, count = JSONAdapter(), TokenCounter(sub_lm)
    order = list(sizes.instructions)
    shown = "\n".join(f"{name}: {text}" for name, text in sizes.instructions.items())
    rendered = [render_failure(f, None) for f in failures_of(records, order, None)]
    passing = "\n\n".join(render_passing(r) for r in records[:2])
    prompts: list[tuple[float, float]] = []
    for start in range(0, analysed, FAILURES_PER_PROMPT):
        batch = range(start, min(analysed, start + FAILURES_PER_PROMPT))
        inputs = {
            "program_instructions": shown,
            "failures": "\n\n".join(rendered[i % len(rendered)] for i in batch),
            "passing": passing,
        }
        causes = [FailureCause(failure_id=i, cause=placeholder(CAUSE_TOKENS)) for i in batch]
        reply = _reply(adapter, NameFailureCauses, {"causes": causes})
        prompts.append((count.messages(_render(adapter, NameFailureCauses, [], inputs)), count.text(reply)))
    if analysed >= 2:  # the merge: a line per cause in, a few groups out
        lines = "\n".join(f"{i}: {placeholder(CAUSE_TOKENS)}" for i in range(analysed))
        ids = list(range(analysed))
        groups = [
            CauseGroup(name=placeholder(4), cause=placeholder(CAUSE_TOKENS), failure_ids=ids[k::4]) for k in range(4)
        ]
        reply = _reply(adapter, GroupFailureCauses, {"groups": [g for g in groups if g.failure_ids]})
        prompts.append((count.messages(_render(adapter, GroupFailureCauses, [], {"causes": lines})), count.text(reply)))
    return CallSize(sum(p[0] for p in prompts) / len(prompts), sum(p[1] for p in prompts) / len(prompts))


def root_turn_sizes(
    fixed_messages: list[dict[str, Any]], root_lm: Any, turns: int, window: int | None = None
) -> tuple[CallSize, int]:
    """``(average turn, fixed part)``: the agent's ``turns`` requests, each the fixed part of its first request plus
    the replies and outputs of the turns before it, never more than the root LM's ``window`` (the bounded context
    keeps each request within it)."""
    count = TokenCounter(root_lm)
    fixed = count.messages(fixed_messages)
    if turns <= 0:
        return CallSize(), fixed
    per_turn = ROOT_REPLY_TOKENS + ROOT_OUTPUT_TOKENS
    requests = [fixed + k * per_turn for k in range(turns)]
    if window:
        requests = [min(r, window) for r in requests]
    return CallSize(sum(requests) / turns, float(ROOT_REPLY_TOKENS)), fixed
