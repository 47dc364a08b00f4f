"""Records: JSON-safe values, exact JSON round trips, aggregates and the views the agent gets."""

from __future__ import annotations

import json
import math

import dspy
import pydantic

from rlmoptimizer.records import EvalRun, ExampleResult, StepTrace, jsonable, steps_never_run


class Citation(pydantic.BaseModel):
    source: str
    page: int


def test_jsonable_makes_program_values_json_safe_and_is_idempotent():
    value = {
        "model": Citation(source="book", page=3),
        "tuple": (1, 2.5, None),
        "set": {3, 1, 2},
        "nan": float("nan"),
        "inf": float("-inf"),
        "example": dspy.Example(question="q", answer="a"),
        "prediction": dspy.Prediction(answer="a", score=1),
        7: object,
    }
    converted = jsonable(value)
    assert converted["model"] == {"source": "book", "page": 3}
    assert converted["tuple"] == [1, 2.5, None]
    assert converted["set"] == [1, 2, 3]
    assert converted["nan"] == "nan" and converted["inf"] == "-inf"
    assert converted["example"] == {"question": "q", "answer": "a"}
    assert converted["prediction"] == {"answer": "a", "score": 1}
    assert converted["7"] == "<class 'object'>"
    assert json.loads(json.dumps(converted)) == converted
    assert jsonable(converted) == converted


def _record(example_id: int, score: float, passed: bool, **kwargs) -> ExampleResult:
    return ExampleResult(
        example_id=example_id,
        inputs={"question": f"q{example_id}"},
        expected={"answer": f"a{example_id}"},
        predicted={"answer": "x"},
        score=score,
        passed=passed,
        **kwargs,
    )


def test_records_round_trip_through_json():
    step = StepTrace("generate.predict", {"question": "q"}, {"reasoning": "r", "answer": ["a", 1]})
    record = _record(4, 0.5, False, feedback="half", steps=(step, step))
    assert StepTrace.from_dict(json.loads(json.dumps(step.to_dict()))) == step
    assert ExampleResult.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    errored = _record(5, 0.0, False, error="ValueError: boom")
    assert ExampleResult.from_dict(json.loads(json.dumps(errored.to_dict()))) == errored
    assert "failed_call" not in errored.to_dict()  # records stored before it existed read back the same
    call = StepTrace("route", {"question": "q6"}, {})
    raised = _record(6, 0.0, False, error="AdapterParseError: no fields", error_kind="program", failed_call=call)
    assert ExampleResult.from_dict(json.loads(json.dumps(raised.to_dict()))) == raised


def _run(split: str = "train", records=None) -> EvalRun:
    return EvalRun(
        run_id="run-0003",
        split=split,
        label="agent",
        instructions={"generate.predict": "Answer."},
        records=tuple(
            records if records is not None else [_record(9, 1.0, True), _record(2, 0.5, False), _record(5, 0.0, False)]
        ),
        requested_count=4,
        budget_spent=3,
        budget_left=17,
        note="budget allowed 3 of 4 requested examples; 17 units left",
        created_at=12.5,
    )


def test_a_run_sorts_its_records_and_computes_its_aggregates():
    run = _run()
    assert [r.example_id for r in run.records] == [2, 5, 9]
    assert (run.evaluated_count, run.passed_count) == (3, 1)
    assert math.isclose(run.score, 0.5)
    assert run.failed_ids == [2, 5]
    empty = _run(records=[])
    assert (empty.score, empty.evaluated_count, empty.passed_count) == (0.0, 0, 0)


def test_a_run_round_trips_through_json():
    run = _run()
    assert EvalRun.from_dict(json.loads(json.dumps(run.to_dict()))) == run


def test_the_agent_sees_train_examples_but_only_validation_aggregates():
    train = _run("train").agent_view()
    assert [e["example_id"] for e in train["examples"]] == [2, 5, 9]
    assert train["score"] == 0.5 and train["budget_left"] == 17 and train["note"].startswith("budget allowed")
    val = _run("val").agent_view()
    assert "examples" not in val
    assert "q2" not in json.dumps(val)
    assert set(val) == {
        "run_id",
        "split",
        "label",
        "score",
        "passed_count",
        "evaluated_count",
        "requested_count",
        "budget_spent",
        "budget_left",
        "note",
    }


def test_steps_never_run_reads_train_calls_returned_or_raised_and_says_when_every_example_raised():
    route = StepTrace("route", {"question": "q"}, {"team": "tech"})
    ok = _record(0, 1.0, True, steps=(route,))
    raised = _record(1, 0.0, False, error="X: y", error_kind="program", failed_call=StepTrace("tech", {}, {}))
    train = _run(records=[ok, raised])
    val = _run(split="val", records=[_record(2, 1.0, True, steps=(StepTrace("billing", {}, {}),))])
    assert steps_never_run([train, val], ["route", "billing", "tech"]) == (["billing"], 2, False)
    before = _record(3, 0.0, False, error="X: y", error_kind="program")  # raised before any step
    assert steps_never_run([_run(records=[before])], ["route"]) == (["route"], 1, True)
