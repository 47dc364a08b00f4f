"""Frozen records of what an evaluation produced. Pure data: no I/O, no LM calls.

Every record round-trips through JSON: ``Record.from_dict(json.loads(json.dumps(r.to_dict()))) == r``.
Values coming from a program (inputs, outputs) are made JSON-safe when the record is built
(:func:`jsonable`), so what is stored is exactly what is read back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

Split = Literal["train", "val"]
SPLITS: tuple[str, ...] = ("train", "val")


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


@dataclass(frozen=True)
class StepTrace:
    """One call of one predictor while running one example.

    ``step_name`` is exactly the name ``program.named_predictors()`` gives that predictor: the key that
    ``update_prompt`` and the final submission use. A predictor called twice gives two traces, in call order.
    """

    step_name: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"step_name": self.step_name, "inputs": self.inputs, "outputs": self.outputs}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepTrace:
        return cls(step_name=data["step_name"], inputs=dict(data["inputs"]), outputs=dict(data["outputs"]))


@dataclass(frozen=True)
class ExampleResult:
    """The outcome of running the program and the metric on one example.

    Invariants: ``score`` is a finite number on the metric's own scale; ``passed == (score >= pass_threshold)`` of the run that made it;
    when ``error`` is set (the program or the metric raised) ``score == 0.0`` and ``passed is False``.
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "example_id": self.example_id,
            "inputs": self.inputs,
            "expected": self.expected,
            "predicted": self.predicted,
            "score": self.score,
            "passed": self.passed,
            "feedback": self.feedback,
            "error": self.error,
            "steps": [s.to_dict() for s in self.steps],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExampleResult:
        return cls(
            example_id=int(data["example_id"]),
            inputs=dict(data["inputs"]),
            expected=dict(data["expected"]),
            predicted=dict(data["predicted"]),
            score=float(data["score"]),
            passed=bool(data["passed"]),
            feedback=data.get("feedback"),
            error=data.get("error"),
            steps=tuple(StepTrace.from_dict(s) for s in data.get("steps", ())),
        )


@dataclass(frozen=True)
class EvalRun:
    """One evaluation: a set of instructions run on examples of one split.

    Invariants: ``evaluated_count == len(records)``; ``passed_count == sum(r.passed for r in records)``;
    ``score`` is the mean record score (0.0 when nothing was evaluated); ``records`` are sorted by
    ``example_id``; ``budget_spent`` counts only the units this run charged (baseline runs and records
    reused from an earlier identical evaluation charge nothing). ``note`` says why fewer examples were
    evaluated than requested, if they were.
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
    score: float = field(init=False)
    passed_count: int = field(init=False)
    evaluated_count: int = field(init=False)

    def __post_init__(self) -> None:
        records = tuple(sorted(self.records, key=lambda r: r.example_id))
        object.__setattr__(self, "records", records)
        object.__setattr__(self, "evaluated_count", len(records))
        object.__setattr__(self, "passed_count", sum(1 for r in records if r.passed))
        score = sum(r.score for r in records) / len(records) if records else 0.0
        object.__setattr__(self, "score", score)

    @property
    def failed_ids(self) -> list[int]:
        """Ids of the evaluated examples that did not pass, in order."""
        return [r.example_id for r in self.records if not r.passed]

    def summary(self) -> dict[str, Any]:
        """Aggregates only: what the agent may see of a validation run."""
        return {
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

    def agent_view(self) -> dict[str, Any]:
        """What the optimizer agent is shown: every record for train, aggregates only for validation."""
        view = self.summary()
        if self.split == "train":
            view["examples"] = [r.to_dict() for r in self.records]
        return view

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "instructions": dict(self.instructions),
            "created_at": self.created_at,
            "records": [r.to_dict() for r in self.records],
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
        )
