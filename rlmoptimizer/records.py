"""Frozen records of what an evaluation produced. Pure data: no I/O, no LM calls.

Every record round-trips through JSON: ``Record.from_dict(json.loads(json.dumps(r.to_dict()))) == r``.
Values coming from a program (inputs, outputs) are made JSON-safe when the record is built
(:func:`jsonable`), so what is stored is exactly what is read back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

SPLITS: tuple[str, ...] = ("train", "val")

# What raised when an example failed; stored on its record when the record is made.
PROGRAM_ERROR = "program"
"""The program raised (a reply that did not parse, a request the LM refused, a bug): charged."""
METRIC_ERROR = "metric"
"""The metric raised on this example: charged."""
LM_CALL_ERROR = "lm_call"
"""The LM call itself failed without an answer (rate limit, timeout, bad key, ...): not charged, tried again
by a later evaluation instead of being reused."""
ERROR_KINDS: tuple[str, ...] = (PROGRAM_ERROR, METRIC_ERROR, LM_CALL_ERROR)


def jsonable(value: Any) -> Any:
    """Convert ``value`` to plain JSON types (dict/list/str/int/float/bool/None).

    Pydantic models are dumped, tuples and sets become lists, non-finite floats and unknown objects
    become strings. The conversion is idempotent: ``jsonable(jsonable(x)) == jsonable(x)``.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [jsonable(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        try:
            return jsonable(model_dump(mode="json"))
        except Exception:
            pass
    to_dict = getattr(value, "toDict", None)
    if callable(to_dict):
        try:
            return jsonable(to_dict())
        except Exception:
            pass
    return str(value)


def _same_values(mine: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """Whether two input dicts hold the same values, each of the same type (``3.0`` is not ``3``, ``1`` not ``True``,
    though ``==`` says they are): then one can stand for the other on disk."""
    return mine.keys() == theirs.keys() and all(
        value is theirs[key] or (type(value) is type(theirs[key]) and value == theirs[key])
        for key, value in mine.items()
    )


@dataclass(frozen=True)
class StepTrace:
    """One call of one predictor while running one example.

    ``step_name`` is exactly the name ``program.named_predictors()`` gives that predictor: the key that
    ``update_prompt`` and the final submission use. A predictor called twice gives two traces, in call order.
    """

    step_name: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    feedback: str | None = None  # the metric's feedback for this step (GEPA's ``pred_name`` form), on train

    def to_dict(self, example_inputs: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trace as JSON; given its example's ``example_inputs``, inputs equal to them are written as a mark
        (``"inputs_of_example": true``) instead of a second copy (a first step's inputs are often the example's)."""
        if example_inputs is not None and _same_values(self.inputs, example_inputs):
            data: dict[str, Any] = {"step_name": self.step_name, "inputs_of_example": True, "outputs": self.outputs}
        else:
            data = {"step_name": self.step_name, "inputs": self.inputs, "outputs": self.outputs}
        return data if self.feedback is None else {**data, "feedback": self.feedback}

    @classmethod
    def from_dict(cls, data: dict[str, Any], example_inputs: dict[str, Any] | None = None) -> StepTrace:
        feedback = data.get("feedback")
        marked = data.get("inputs_of_example") is True and example_inputs is not None
        return cls(
            step_name=data["step_name"],
            inputs=dict(example_inputs if marked else data["inputs"]),
            outputs=dict(data["outputs"]),
            feedback=feedback if isinstance(feedback, str) else None,
        )


@dataclass(frozen=True)
class ExampleResult:
    """The outcome of running the program and the metric on one example.

    Invariants: ``score`` is a finite number on the metric's own scale; ``passed == (score >= pass_threshold)``
    of the run that made it; when ``error`` is set (the program or the metric raised) ``score == 0.0``,
    ``passed is False`` and ``error_kind`` (one of :data:`ERROR_KINDS`) says what failed; ``error_kind is None``
    when ``error`` is. ``failed_call`` is the step call that raised the program's error (an output that did not
    parse, a request the LM refused), with the inputs it was called with and no outputs (``steps`` holds the calls
    that returned); None when the program did not raise or raised outside every step.
    ``example_id`` is the example's position in its split, stable across runs.
    """

    example_id: int
    inputs: dict[str, Any]
    expected: dict[str, Any]
    predicted: dict[str, Any]
    score: float
    passed: bool
    feedback: str | None = None
    error: str | None = None
    steps: tuple[StepTrace, ...] = ()
    error_kind: str | None = None
    failed_call: StepTrace | None = None

    @property
    def reusable(self) -> bool:
        """Whether this record may stand for a new evaluation of the same instructions: every record except
        those whose LM call itself failed (those deserve another try, and were not charged)."""
        return self.error_kind != LM_CALL_ERROR

    def to_dict(self, compact: bool = False) -> dict[str, Any]:
        """The record as JSON; ``compact`` (how the run directory stores it) writes a step's inputs equal to the
        example's as a mark, not a second copy."""
        own = self.inputs if compact else None
        data = {
            "example_id": self.example_id,
            "inputs": self.inputs,
            "expected": self.expected,
            "predicted": self.predicted,
            "score": self.score,
            "passed": self.passed,
            "feedback": self.feedback,
            "error": self.error,
            "error_kind": self.error_kind,
            "steps": [s.to_dict(own) for s in self.steps],
        }
        return data if self.failed_call is None else {**data, "failed_call": self.failed_call.to_dict(own)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExampleResult:
        own = dict(data["inputs"])
        return cls(
            example_id=int(data["example_id"]),
            inputs=own,
            expected=dict(data["expected"]),
            predicted=dict(data["predicted"]),
            score=float(data["score"]),
            passed=bool(data["passed"]),
            feedback=data.get("feedback"),
            error=data.get("error"),
            steps=tuple(StepTrace.from_dict(s, own) for s in data.get("steps", ())),
            error_kind=data.get("error_kind"),
            failed_call=StepTrace.from_dict(data["failed_call"], own) if data.get("failed_call") else None,
        )


@dataclass(frozen=True)
class EvalRun:
    """One evaluation: a set of instructions run on examples of one split.

    Invariants: ``evaluated_count == len(records)``; ``passed_count == sum(r.passed for r in records)``;
    ``score`` is the mean score of the records whose LM answered (a record whose LM call itself failed, after its
    retries, was not charged and says nothing of the instructions: it counts in ``evaluated_count``, not in the
    score; 0.0 when no record was answered); ``records`` are sorted by
    ``example_id``; ``budget_spent`` counts only the units this run charged (baseline runs and records
    reused from an earlier identical evaluation charge nothing). ``note`` says why fewer examples were
    evaluated than requested, if they were. ``rollout`` is the sample index: 0 is the evaluation LM as
    configured; ``k > 0`` is the k-th extra independent sample of the same examples (see
    ``Evaluator.lm_for``), so records of different rollouts are never mistaken for one another.
    """

    run_id: str
    split: str
    label: str
    instructions: dict[str, str]
    records: tuple[ExampleResult, ...]
    requested_count: int
    budget_spent: int
    budget_left: int
    note: str | None = None
    created_at: float = 0.0
    rollout: int = 0
    score: float = field(init=False)
    passed_count: int = field(init=False)
    evaluated_count: int = field(init=False)

    def __post_init__(self) -> None:
        records = tuple(sorted(self.records, key=lambda r: r.example_id))
        object.__setattr__(self, "records", records)
        object.__setattr__(self, "evaluated_count", len(records))
        object.__setattr__(self, "passed_count", sum(1 for r in records if r.passed))
        answered = [r.score for r in records if r.reusable]  # an LM call that failed says nothing of the instructions
        object.__setattr__(self, "score", sum(answered) / len(answered) if answered else 0.0)

    @property
    def failed_ids(self) -> list[int]:
        """Ids of the evaluated examples that did not pass, in order."""
        return [r.example_id for r in self.records if not r.passed]

    def summary(self) -> dict[str, Any]:
        """Aggregates only: what the agent may see of a validation run (``rollout`` only when it is not 0)."""
        summary = {
            "run_id": self.run_id,
            "split": self.split,
            "label": self.label,
            "score": self.score,
            "passed_count": self.passed_count,
            "evaluated_count": self.evaluated_count,
            "requested_count": self.requested_count,
            "budget_spent": self.budget_spent,
            "budget_left": self.budget_left,
            "note": self.note,
        }
        if self.rollout:
            summary["rollout"] = self.rollout
        return summary

    def agent_view(self) -> dict[str, Any]:
        """What the optimizer agent is shown: every record for train, aggregates only for validation."""
        view = self.summary()
        if self.split == "train":
            view["examples"] = [_agent_record(r) for r in self.records]
        return view

    def to_dict(self, compact: bool = False) -> dict[str, Any]:
        """The run as JSON (``compact``: its records as the run directory stores them, see
        :meth:`ExampleResult.to_dict`)."""
        return {
            **self.summary(),
            "rollout": self.rollout,
            "instructions": dict(self.instructions),
            "created_at": self.created_at,
            "records": [r.to_dict(compact) for r in self.records],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalRun:
        return cls(
            run_id=data["run_id"],
            split=data["split"],
            label=data.get("label", ""),
            instructions=dict(data["instructions"]),
            records=tuple(ExampleResult.from_dict(r) for r in data["records"]),
            requested_count=int(data["requested_count"]),
            budget_spent=int(data["budget_spent"]),
            budget_left=int(data["budget_left"]),
            note=data.get("note"),
            created_at=float(data.get("created_at", 0.0)),
            rollout=int(data.get("rollout", 0)),
        )


def _agent_record(record: ExampleResult) -> dict[str, Any]:
    """A record as the agent sees it: what is stored, without the bookkeeping of ``error_kind``."""
    data = record.to_dict()
    del data["error_kind"]
    return data


# -- the one rule that ranks candidates ------------------------------------------------------------------


def first_sample_complete(runs: Iterable[EvalRun], split: str, size: int) -> list[EvalRun]:
    """The runs of ``runs`` (in their order) that may rank a candidate on ``split`` of ``size`` examples: its
    first sample (rollout 0) of every example. An extra rollout (a lucky sample) or a run of part of the split
    never ranks a candidate: the selection, ``detailed_results``, ``candidate_programs`` and the agent's
    ``candidates()`` all rank by this rule."""
    return [r for r in runs if r.split == split and r.rollout == 0 and r.evaluated_count == size and size > 0]


def ranked(
    runs: Sequence[EvalRun], *, initial: dict[str, str], preferred: EvalRun | str | None = None
) -> list[EvalRun]:
    """``runs`` (runs of :func:`first_sample_complete`, in id order) best first: the highest score; on a tie the
    unchanged instructions (``initial``), then ``preferred`` (a run or its id: the submission), then the latest."""
    preferred_id = preferred.run_id if isinstance(preferred, EvalRun) else preferred
    order = {id(r): i for i, r in enumerate(runs)}
    return sorted(
        runs,
        reverse=True,
        key=lambda r: (
            r.score,
            r.instructions == initial,
            preferred_id is not None and r.run_id == preferred_id,
            order[id(r)],
        ),
    )


# -- what crosses rooms at the end of a compile() ------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which candidate compile() returns, and why (see :mod:`rlmoptimizer.selection`).

    Invariants: ``chosen_score >= score`` of every candidate clearly better than the unchanged program
    (:func:`rlmoptimizer.selection.clear_gain`); ``instructions`` are the chosen run's;
    ``candidates`` are the complete runs on ``split``, in id order, as ``{"run_id", "label", "score",
    "instructions"}``.
    """

    split: str
    instructions: dict[str, str]
    chosen_run_id: str
    chosen_label: str
    chosen_score: float
    submission_run_id: str | None  # None: the spending cap kept the submission from being checked
    submission_score: float | None
    baseline_score: float | None
    reason: str
    candidates: tuple[dict[str, Any], ...]
    spending_cap_reached: bool | None = None  # None: no max_cost_usd
    # what was returned, as a value a program can test (``reason`` says why in words): "submission" (the agent's
    # submission), "unchanged" (the unchanged program: the submission scored no better), "other candidate" (another
    # checked candidate scored better than the submission), "best checked" (the submission could not be checked:
    # the budget or the spending cap; the best checked candidate)
    basis: str = ""

    def to_dict(self) -> dict[str, Any]:
        """What ``result.json`` and ``program.selection`` hold (everything but ``instructions``)."""
        return {
            "split": self.split,
            "chosen_run_id": self.chosen_run_id,
            "chosen_label": self.chosen_label,
            "chosen_score": self.chosen_score,
            "submission_run_id": self.submission_run_id,
            "submission_score": self.submission_score,
            "baseline_score": self.baseline_score,
            "reason": self.reason,
            "basis": self.basis,
            "candidates": [dict(c) for c in self.candidates],
            **({} if self.spending_cap_reached is None else {"spending_cap_reached": self.spending_cap_reached}),
        }


def turn_record(
    iteration: int,
    reasoning: str,
    code: str,
    output: str,
    *,
    final: bool,
    pilot: Sequence[str] | None = None,
    outputs: dict[str, Any] | None = None,
    submitted_by: str | None = None,
) -> dict[str, Any]:
    """One turn of the trajectory as it is stored (``turns/``) and shown (``agent_trajectory``): ``iteration``
    (from 1), the turn's ``reasoning``, ``code`` and ``output``; ``final`` for the turn that ended the run, with the
    ``outputs`` submitted and who made them (``submitted_by``) when that was not the agent's SUBMIT; ``pilot``: the
    default loop's actions the pilot took in it (the key is left out when None)."""
    turn: dict[str, Any] = {
        "iteration": iteration,
        "reasoning": reasoning,
        "code": code,
        "output": output,
        "final": final,
    }
    if pilot is not None:
        turn["pilot"] = list(pilot)
    if outputs is not None:
        turn["outputs"] = outputs
    if submitted_by:
        turn["submitted_by"] = submitted_by
    turn["created_at"] = time.time()
    return turn


@dataclass(frozen=True)
class AgentOutcome:
    """What the agent left: its checked submission (``{}`` when it submitted nothing usable), its turns
    in order (earlier turns first on a resume), its final reasoning, and what made the submission, as the
    selection's reason names it (``submitted_by``: the agent's SUBMIT, the default loop, or the current
    instructions of an agent that stopped without one)."""

    submitted: dict[str, str]
    trajectory: tuple[dict[str, Any], ...] = ()
    final_reasoning: str = ""
    submitted_by: str = "the agent's submission"

    @classmethod
    def resumed(cls, final: dict[str, Any], turns: tuple[dict[str, Any], ...]) -> AgentOutcome:
        """The outcome an earlier compile recorded in its final turn (``final``, the last of ``turns``)."""
        return cls(
            submitted=final.get("outputs", {}).get("optimized_dspy_program", {}),
            trajectory=turns,
            final_reasoning=final.get("reasoning", ""),
            submitted_by=final.get("submitted_by") or cls.submitted_by,
        )


@dataclass(frozen=True)
class CompileResult:
    """The result attributes compile() attaches to the returned program (one attribute per field).

    On the program they are plain dicts and lists (``optimized.selection["reason"]``), as ``result.json``
    holds them. The program also gets ``detailed_results`` (every candidate and its scores, the Pareto front),
    ``score`` and ``candidate_programs`` (MIPROv2's names), and ``agent_trajectory`` renders as a table in a
    notebook (see :mod:`rlmoptimizer.report`).
    """

    optimized_dspy_program: dict[str, str]
    """The returned prompts, already applied to the program: ``{step name: instructions}`` for every step, and
    ``{"<step name>:demos": the step's demos as a JSON list}`` for each step that has demos (its own or chosen)."""
    latest_run_id: str | None
    """The id of the last evaluation run (``"run-0007"``), or None when nothing was evaluated."""
    trial_logs: tuple[dict[str, Any], ...]
    """Every evaluation run in order, baselines included: ``run_id``, ``split``, ``label`` (``baseline``,
    ``agent``, ``compare``, ``submission``, ...), ``score`` (the mean), ``passed_count``, ``evaluated_count``,
    ``requested_count``, ``budget_spent``, ``budget_left``, ``note`` and the ``instructions`` evaluated."""
    agent_trajectory: tuple[dict[str, Any], ...]
    """Every agent turn in order, earlier turns first on a resume: ``{"iteration", "reasoning", "code",
    "output", "final", "created_at"}``; ``pilot`` (the default loop's actions the pilot took in that turn) where it
    took any; on the final turn ``outputs`` (the submission) and ``submitted_by`` when the submission was not the
    agent's own SUBMIT (the default loop's, or one extracted when the turns ran out)."""
    agent_final_reasoning: str
    """The agent's reasoning when it submitted ("" when it gave none)."""
    selection: Selection
    """Which candidate was returned and why: ``split``, ``chosen_run_id``, ``chosen_label``, ``chosen_score``,
    ``submission_run_id``, ``submission_score``, ``baseline_score``, ``reason``, ``basis`` (``"submission"``,
    ``"unchanged"``, ``"other candidate"`` or ``"best checked"``), ``spending_cap_reached`` and the ``candidates``
    compared (a dict on the program; see :class:`Selection`)."""
    budget: dict[str, Any]
    """The budget in units: ``{"limit", "spent", "left", "spent_by_kind"}``, and with ``max_metric_calls``
    ``"sub_lm_limit"`` and ``"sub_lm_left"`` (the sub-LM prompts' own allowance)."""
    run_storage_dir: str
    """The run directory: everything the run paid for, ``result.json`` and ``run.png``
    (``python -m rlmoptimizer report`` reads it)."""
    step_lms: dict[str, dict[str, str]]
    """Which LM ran each step: ``{step: {"lm": name, "source": "eval_lm" | "dspy.settings.lm" | "predictor.lm" |
    "none"}}``."""
    usage: dict[str, Any] = field(default_factory=dict)
    """LM calls, tokens and dollars per role: ``{"root", "sub", "eval", "total"}``, each with ``calls``,
    ``input_tokens``, ``cached_input_tokens``, ``output_tokens`` and ``cost_usd`` (None when litellm has no
    price for a model, listed in ``unpriced_models``; ``priced_usd`` is then what the priced calls cost); the work
    each role paid for (``root_units``, ``sub_units``, ``eval_units``); with ``max_cost_usd``, the cap and
    ``cap_reached``."""
    demo_sources: dict[str, list[int | None]] = field(default_factory=dict)
    """Where the returned program's demos came from: ``{step: [train id of each demo, in order]}`` for every step
    with demos (None for a demo no train example holds, e.g. one the program already had)."""

    def attributes(self) -> dict[str, Any]:
        """The attributes compile() sets on the program it returns, by name (plain dicts and lists, as users read
        them); :func:`rlmoptimizer.report.finish.present_result` sets them."""
        return {
            "optimized_dspy_program": dict(self.optimized_dspy_program),
            "latest_run_id": self.latest_run_id,
            "trial_logs": [dict(log) for log in self.trial_logs],
            "agent_trajectory": list(self.agent_trajectory),
            "agent_final_reasoning": self.agent_final_reasoning,
            "selection": self.selection.to_dict(),
            "budget": dict(self.budget),
            "run_storage_dir": self.run_storage_dir,
            "step_lms": {step: dict(info) for step, info in self.step_lms.items()},
            "usage": dict(self.usage),
            "demo_sources": {step: list(ids) for step, ids in self.demo_sources.items()},
        }

    def result_file(self) -> dict[str, Any]:
        """What ``result.json`` holds."""
        return {
            "optimized_dspy_program": dict(self.optimized_dspy_program),
            "selection": self.selection.to_dict(),
            "budget": dict(self.budget),
            "step_lms": {step: dict(info) for step, info in self.step_lms.items()},
            "usage": dict(self.usage),
            "demo_sources": {step: list(ids) for step, ids in self.demo_sources.items()},
        }


def steps_never_run(runs: Iterable[EvalRun], step_names: Sequence[str]) -> tuple[list[str], int, bool]:
    """The steps of ``step_names`` that no train example of ``runs`` called (none returned nor raised in it), how
    many train examples the runs hold, and whether the program raised on every record of them (then the steps may
    come after the error): a step no move saw the inputs and outputs of."""
    seen: set[str] = set()
    examples: set[int] = set()
    always_raised = True
    for run in runs:
        if run.split != "train":
            continue
        for record in run.records:
            examples.add(record.example_id)
            seen.update(call.step_name for call in record.steps)
            if record.failed_call is not None:
                seen.add(record.failed_call.step_name)
            always_raised = always_raised and record.error_kind == PROGRAM_ERROR
    return [name for name in step_names if name not in seen], len(examples), always_raised
