"""The evaluator: threads, pinned LM, step traces, budget, systemic failures. Real DSPy modules over fake
LMs, no network."""

from __future__ import annotations

import signal
import sys
import threading
import types

import dspy
import pytest
from support.fakes import FunctionLM, last_user_text, system_text
from support.qa import Outer, Triage, TwoSteps, echo_lm, examples, field, make_evaluator, triage_lm, two_step_lm

from rlmoptimizer.budget import TRAIN_EXAMPLE, VAL_EXAMPLE, BudgetLedger
from rlmoptimizer.errors import EvaluationLMError, MetricError
from rlmoptimizer.evaluation.evaluator import EvaluationStopped, Evaluator, distinct_examples
from rlmoptimizer.metric import Metric
from rlmoptimizer.records import LM_CALL_ERROR, PROGRAM_ERROR


def test_records_carry_ids_inputs_expected_predictions_and_scores_sorted_by_id():
    data = examples(12)
    data[5] = dspy.Example(question="q5", answer="wrong").with_inputs("question")
    seen: list[int] = []
    evaluator = make_evaluator(echo_lm(), num_threads=4)
    items = [(i, data[i]) for i in (11, 3, 5, 0, 7, 1, 2, 4, 6, 8, 9, 10)]
    records = evaluator.evaluate(
        dspy.ChainOfThought("question -> answer"), items, on_record=lambda r: seen.append(r.example_id)
    )

    assert [r.example_id for r in records] == list(range(12))
    assert sorted(seen) == list(range(12))
    r3 = records[3]
    assert r3.inputs == {"question": "q3"}
    assert r3.expected == {"answer": "a3"}
    assert r3.predicted == {"reasoning": "because", "answer": "a3"}
    assert (r3.score, r3.passed, r3.error, r3.feedback) == (1.0, True, None, None)
    assert (records[5].score, records[5].passed) == (0.0, False)
    assert [s.step_name for s in r3.steps] == ["predict"]
    assert r3.steps[0].inputs == {"question": "q3"}
    assert r3.steps[0].outputs == {"reasoning": "because", "answer": "a3"}


def test_the_program_runs_with_the_evaluation_lm_never_the_callers():
    def forbidden(messages):
        raise AssertionError("the caller's LM must not be used by the program")

    caller_lm, eval_lm = FunctionLM(forbidden), echo_lm()
    evaluator = make_evaluator(eval_lm, num_threads=4)
    with dspy.context(lm=caller_lm):
        records = evaluator.evaluate(dspy.ChainOfThought("question -> answer"), list(enumerate(examples(8))))
    assert caller_lm.calls == []
    assert len(eval_lm.calls) == 8
    assert all(r.passed and r.error is None for r in records)


def test_the_metric_sees_the_evaluation_lm_too():
    eval_lm, caller_lm = echo_lm(), echo_lm()
    seen = []

    def judge(example, prediction):
        seen.append(dspy.settings.lm)
        return 1.0

    with dspy.context(lm=caller_lm):
        make_evaluator(eval_lm, metric=judge, num_threads=2).evaluate(
            dspy.Predict("question -> answer"), list(enumerate(examples(4)))
        )
    assert len(seen) == 4 and all(lm is eval_lm for lm in seen)


def test_the_program_is_shared_across_threads_not_copied_per_example():
    seen: set[int] = set()
    lock = threading.Lock()

    class Recorder(dspy.Module):
        def __init__(self):
            super().__init__()
            self.generate = dspy.Predict("question -> answer")

        def forward(self, question):
            with lock:
                seen.add(id(self.generate))
            return self.generate(question=question)

    program = Recorder()
    make_evaluator(echo_lm(), num_threads=4).evaluate(program, list(enumerate(examples(10))))
    assert seen == {id(program.generate)}


# -- step names ------------------------------------------------------------------------------------


def test_steps_of_nested_modules_use_named_predictors_names_in_call_order():
    program = Outer()
    names = [name for name, _ in program.named_predictors()]
    assert names == ["inner.draft", "inner.generate.predict", "polish"]

    (record,) = make_evaluator(two_step_lm()).evaluate(program, [(0, examples(1)[0])])
    assert [s.step_name for s in record.steps] == names
    assert record.steps[0].outputs == {"draft": "D:q0"}
    assert record.steps[1].inputs == {"question": "q0", "draft": "D:q0"}
    assert record.steps[2].inputs == {"draft_answer": "a0"}
    assert record.passed


def test_a_predictor_called_twice_gives_two_traces_in_order():
    class Twice(dspy.Module):
        def __init__(self):
            super().__init__()
            self.step = dspy.Predict("question -> answer")

        def forward(self, question):
            first = self.step(question=question)
            return self.step(question=first.answer + "!")

    lm = FunctionLM(lambda m: {"answer": field(m, "question") + "?"})
    (record,) = make_evaluator(lm, metric=lambda e, p: 1.0).evaluate(Twice(), [(4, examples(5)[4])])
    assert [(s.step_name, s.inputs["question"], s.outputs["answer"]) for s in record.steps] == [
        ("step", "q4", "q4?"),
        ("step", "q4?!", "q4?!?"),
    ]


def test_a_bare_predictor_is_the_step_named_self():
    (record,) = make_evaluator(echo_lm()).evaluate(dspy.Predict("question -> answer"), [(0, examples(1)[0])])
    assert [s.step_name for s in record.steps] == ["self"] == [n for n, _ in dspy.Predict("q -> a").named_predictors()]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def react_lm() -> FunctionLM:
    def reply(messages):
        system = system_text(messages)
        if "next_tool_name" in system:
            if "observation_0" not in last_user_text(messages):
                return {"next_thought": "add them", "next_tool_name": "add", "next_tool_args": {"a": 2, "b": 3}}
            return {"next_thought": "done", "next_tool_name": "finish", "next_tool_args": {}}
        return {"reasoning": "the tool said 5", "answer": "5"}

    return FunctionLM(reply)


def test_react_trace_entries_all_map_to_named_predictors():
    class Agent(dspy.Module):
        def __init__(self):
            super().__init__()
            self.agent = dspy.ReAct("question -> answer", tools=[add])

        def forward(self, question):
            return self.agent(question=question)

    program = Agent()
    names = [name for name, _ in program.named_predictors()]
    assert names == ["agent.react", "agent.extract.predict"]
    example = dspy.Example(question="2+3?", answer="5").with_inputs("question")

    (record,) = make_evaluator(react_lm()).evaluate(program, [(0, example)])
    assert record.error is None and record.passed
    assert [s.step_name for s in record.steps] == ["agent.react", "agent.react", "agent.extract.predict"]
    assert "5" in record.steps[1].inputs["trajectory"]  # the tool's observation reached the second step
    assert record.predicted["trajectory"]["observation_0"] == 5


# -- per-example failures are data ---------------------------------------------------------------


def test_partial_credit_stays_partial_and_the_threshold_decides_passed():
    half = lambda e, p: 0.5  # noqa: E731
    items = list(enumerate(examples(3)))
    strict = make_evaluator(echo_lm(), metric=half).evaluate(dspy.Predict("question -> answer"), items)
    lenient = make_evaluator(echo_lm(), metric=half, pass_threshold=0.5).evaluate(
        dspy.Predict("question -> answer"), items
    )
    assert [(r.score, r.passed) for r in strict] == [(0.5, False)] * 3
    assert [(r.score, r.passed) for r in lenient] == [(0.5, True)] * 3


def test_metric_feedback_reaches_the_record():
    def judged(gold, pred, trace, pred_name, pred_trace):
        ok = gold.answer == pred.answer
        return dspy.Prediction(score=float(ok), feedback="right" if ok else f"expected {gold.answer}")

    data = examples(2)
    data[1] = dspy.Example(question="q1", answer="zzz").with_inputs("question")
    records = make_evaluator(echo_lm(), metric=judged).evaluate(dspy.Predict("question -> answer"), enumerate(data))
    assert [(r.score, r.feedback) for r in records] == [(1.0, "right"), (0.0, "expected zzz")]


def test_a_program_exception_is_an_error_record_with_score_zero_and_is_charged():
    class Fragile(dspy.Module):
        def __init__(self):
            super().__init__()
            self.generate = dspy.Predict("question -> answer")

        def forward(self, question):
            out = self.generate(question=question)
            if question == "q2":
                raise ValueError("cannot handle q2")
            return out

    ledger = BudgetLedger(10)
    with ledger.reserve(4, TRAIN_EXAMPLE) as reservation:
        records = make_evaluator(echo_lm(), metric=lambda e, p: 1.0).evaluate(
            Fragile(), list(enumerate(examples(4))), reservation
        )
    bad = records[2]
    assert (bad.score, bad.passed, bad.feedback, bad.predicted) == (0.0, False, None, {})
    assert bad.error == "ValueError: cannot handle q2"
    assert [s.step_name for s in bad.steps] == ["generate"]  # the partial trace is kept
    assert [r.passed for r in records] == [True, True, False, True]
    assert ledger.spent == 4


def test_an_unparseable_lm_reply_keeps_the_partial_trace_and_is_charged():
    def reply(messages):
        if "`draft`" in system_text(messages).split("Your output fields are:")[1].split("All interactions")[0]:
            return {"draft": "D"}
        return "I refuse to use your format."

    ledger = BudgetLedger(5)
    with ledger.reserve(1, TRAIN_EXAMPLE) as reservation:
        (record,) = make_evaluator(FunctionLM(reply)).evaluate(TwoSteps(), [(0, examples(1)[0])], reservation)
    assert record.error.startswith("AdapterParseError")
    assert (record.score, record.passed) == (0.0, False)
    assert [s.step_name for s in record.steps] == ["draft"]
    assert ledger.spent == 1
    assert record.error_kind == PROGRAM_ERROR and record.reusable


def test_an_exception_inside_the_metric_is_an_error_record_that_keeps_the_prediction():
    def picky(example, prediction):
        if example.question == "q1":
            raise KeyError("missing label")
        return 1.0

    ledger = BudgetLedger(10)
    with ledger.reserve(3, VAL_EXAMPLE) as reservation:
        records = make_evaluator(echo_lm(), metric=picky).evaluate(
            dspy.Predict("question -> answer"), list(enumerate(examples(3))), reservation
        )
    assert records[1].error == "KeyError: 'missing label'"
    assert (records[1].score, records[1].passed, records[1].predicted) == (0.0, False, {"answer": "a1"})
    assert [r.passed for r in records] == [True, False, True]
    assert ledger.spent_by_kind[VAL_EXAMPLE] == 3


@pytest.mark.parametrize(
    ("bad", "mentions"),
    [
        (None, "returned None (NoneType)"),
        (float("nan"), "not a finite number"),
        ("correct", "returned 'correct' (str)"),
    ],
)
def test_a_metric_returning_a_non_score_stops_the_evaluation_at_once(bad, mentions):
    calls: list[str] = []

    def metric(example, prediction):
        calls.append(example.question)
        return bad if example.question == "q3" else 1.0

    seen: list[int] = []
    ledger = BudgetLedger(100)
    evaluator = make_evaluator(echo_lm(), metric=metric, num_threads=1)
    with ledger.reserve(20, TRAIN_EXAMPLE) as reservation:
        with pytest.raises(EvaluationStopped) as info:
            evaluator.evaluate(
                dspy.Predict("question -> answer"),
                list(enumerate(examples(20))),
                reservation,
                on_record=lambda r: seen.append(r.example_id),
            )
    assert isinstance(info.value.reason, MetricError)
    message = str(info.value.reason)
    assert mentions in message and "metric 'test_a_metric_returning" in message
    assert "first seen on example 3" in message and "Fix the metric" in message
    assert calls == ["q0", "q1", "q2", "q3"]  # raised once, nothing evaluated after it
    assert [r.example_id for r in info.value.records] == seen == [0, 1, 2]
    assert ledger.spent == 3


# -- budget ----------------------------------------------------------------------------------------


def test_a_reservation_smaller_than_the_request_evaluates_only_what_was_granted():
    lm = echo_lm()
    ledger = BudgetLedger(5)
    with ledger.reserve(12, TRAIN_EXAMPLE) as reservation:
        assert reservation.granted == 5
        records = make_evaluator(lm, num_threads=3).evaluate(
            dspy.Predict("question -> answer"), [(i, examples(12)[i]) for i in range(11, -1, -1)], reservation
        )
    assert [r.example_id for r in records] == [7, 8, 9, 10, 11]  # the first five in the given order
    assert len(lm.calls) == 5
    assert (ledger.spent, ledger.left) == (5, 0)


def test_retries_inside_the_lm_are_not_charged_twice():
    lock = threading.Lock()
    failed: set[str] = set()

    def flaky(messages):
        question = field(messages, "question")
        with lock:
            if question not in failed:
                failed.add(question)
                return dspy.LMRateLimitError("slow down", retry_after=0)
        return {"answer": question.replace("q", "a")}

    lm = FunctionLM(flaky)
    ledger = BudgetLedger(10)
    with ledger.reserve(4, TRAIN_EXAMPLE) as reservation:
        records = make_evaluator(lm, num_threads=2).evaluate(
            dspy.Predict("question -> answer"), list(enumerate(examples(4))), reservation
        )
    assert len(lm.calls) == 8
    assert all(r.passed for r in records)
    assert ledger.spent == 4


# -- systemic LM failures -----------------------------------------------------------------------


def test_an_unusable_lm_stops_within_one_batch_charges_nothing_and_keeps_records():
    lm = FunctionLM(lambda m: dspy.LMAuthError("invalid api key", model="fake", status=401))
    ledger = BudgetLedger(100)
    seen: list[int] = []
    evaluator = make_evaluator(lm, num_threads=4)
    with ledger.reserve(40, TRAIN_EXAMPLE) as reservation:
        with pytest.raises(EvaluationStopped) as info:
            evaluator.evaluate(
                dspy.ChainOfThought("question -> answer"),
                list(enumerate(examples(40))),
                reservation,
                on_record=lambda r: seen.append(r.example_id),
            )
    assert isinstance(info.value.reason, EvaluationLMError)
    message = str(info.value.reason)
    assert "appears unusable" in message and "LMAuthError" in message and "invalid api key" in message
    assert "0 of 40 example(s) were evaluated" in message
    assert 3 <= len(lm.calls) <= 3 + 3  # the failures that stopped it plus at most the other running threads
    assert ledger.spent == 0 and ledger.left == 100
    completed = info.value.records
    assert len(completed) == len(lm.calls) and sorted(seen) == [r.example_id for r in completed]
    assert all(r.error.startswith("LMAuthError") and r.score == 0.0 for r in completed)
    assert all(r.error_kind == LM_CALL_ERROR and not r.reusable for r in completed)


def test_an_lm_that_never_answers_stops_after_examples_in_a_row_over_small_evaluations():
    """Regression: an LM that is down (a 5xx on every call, retried) failed each 3-example minibatch the same way,
    nothing counted it across evaluations, and a compile ran for minutes and returned the unchanged program."""
    down = {"now": False}

    def reply(messages):
        if down["now"]:
            return dspy.LMServerError("503 Service Unavailable", model="fake", status=503)
        return {"answer": field(messages, "question").replace("q", "a")}

    lm = FunctionLM(reply)
    lm.num_retries = 0  # dspy's own retries back off for seconds
    evaluator = make_evaluator(lm, num_threads=1, retry_backoff_s=0.0, max_unanswered_in_a_row=5)
    program, pool = dspy.Predict("question -> answer"), list(enumerate(examples(12)))
    ledger = BudgetLedger(100)

    def minibatch(start):
        with ledger.reserve(3, TRAIN_EXAMPLE) as reservation:
            return evaluator.evaluate(program, pool[start : start + 3], reservation)

    down["now"] = True
    assert all(r.error_kind == LM_CALL_ERROR for r in minibatch(0))  # 3 in a row: not yet
    down["now"] = False
    assert all(r.error is None for r in minibatch(3))  # an answer starts the count again
    down["now"] = True
    minibatch(6)
    with pytest.raises(EvaluationStopped) as info:
        minibatch(9)  # 5 in a row over two evaluations
    message = str(info.value.reason)
    assert isinstance(info.value.reason, EvaluationLMError)
    assert "no answer on 5 different examples in a row" in message and "503 Service Unavailable" in message
    assert "run compile() again" in message and "same run_storage_dir" in message
    assert len(info.value.records) == 2 and ledger.spent == 3  # only the answered minibatch was charged


def test_a_metric_whose_judge_lm_gives_no_answer_is_retried_then_not_scored_0_nor_charged():
    """Regression: a metric asking its own LM (a judge) that was rate-limited scored the example 0 as a metric error,
    charged it and stored it for reuse: good candidates lost on validation to an outage and a resume never asked
    the judge again. The judge's outage is now the program's LM outage: tried again, then not charged, not reused,
    and counted toward the evaluation's stop."""
    outage = {"left": 2}  # the judge's first two calls fail: the retry is answered

    def judge_reply(messages):
        if outage["left"]:
            outage["left"] -= 1
            return dspy.LMServerError("503 Service Unavailable", model="judge", status=503)
        return {"correct": True}

    judge_lm = FunctionLM(judge_reply, name="judge")
    judge_lm.num_retries = 0
    judge = dspy.Predict("expected, got -> correct: bool")

    def judged(example, prediction, trace=None):
        with dspy.context(lm=judge_lm):
            return float(judge(expected=example.answer, got=prediction.answer).correct)

    evaluator = make_evaluator(echo_lm(), metric=judged, num_threads=1, retry_backoff_s=0.0, transient_retries=2)
    program, pool = dspy.Predict("question -> answer"), list(enumerate(examples(3)))
    records = evaluator.evaluate(program, pool[:1])
    assert records[0].error is None and records[0].score == 1.0  # retried until the judge answered

    outage["left"] = 10**6  # down for good: no score of 0, no charge, and the evaluation stops naming the judge
    evaluator = make_evaluator(
        echo_lm(), metric=judged, num_threads=1, retry_backoff_s=0.0, transient_retries=1, max_unanswered_in_a_row=3
    )
    ledger = BudgetLedger(100)
    with pytest.raises(EvaluationStopped) as info, ledger.reserve(3, TRAIN_EXAMPLE) as reservation:
        evaluator.evaluate(program, pool, reservation)
    kept = info.value.records
    assert [r.error_kind for r in kept] == [LM_CALL_ERROR] * 3 and not any(r.reusable for r in kept)
    assert all(r.error.startswith("the metric's LM call failed: LMServerError") for r in kept)
    assert kept[0].predicted == {"answer": "a0"} and ledger.spent == 0
    message = str(info.value.reason)
    assert isinstance(info.value.reason, EvaluationLMError) and message.startswith("the LM your metric calls")

    judge_lm.fn = lambda messages: dspy.LMAuthError("invalid api key", model="judge")  # unusable: stops at once
    evaluator = make_evaluator(echo_lm(), metric=judged, num_threads=1, retry_backoff_s=0.0)
    with pytest.raises(EvaluationStopped) as info:
        evaluator.evaluate(program, pool)
    message = str(info.value.reason)
    assert message.startswith("the LM your metric calls (a judge) appears unusable") and "eval_lm" not in message


def test_examples_that_fail_on_their_own_drawn_again_and_again_are_no_outage():
    """Regression: two examples the LM failed on (a 5xx on those inputs only), drawn into minibatch after minibatch
    (unanswered, they are never stored, so every draw runs them again), counted as 8 "in a row" and stopped the
    compile with "the evaluation LM ... may be down"; the same compile resumed finished normally."""

    def reply(messages):
        question = field(messages, "question")
        if question in ("q3", "q7"):
            return dspy.LMServerError("500 Internal Server Error", model="fake", status=500)
        return {"answer": question.replace("q", "a")}

    lm = FunctionLM(reply)
    lm.num_retries = 0
    evaluator = make_evaluator(lm, num_threads=1, retry_backoff_s=0.0, max_unanswered_in_a_row=5)
    program, pool = dspy.Predict("question -> answer"), list(enumerate(examples(12)))
    for _ in range(10):  # the two poisoned examples alone, as a minibatch whose other records are stored
        records = evaluator.evaluate(program, [pool[3], pool[7]])
        assert [r.error_kind for r in records] == [LM_CALL_ERROR, LM_CALL_ERROR]
    assert all(r.error is None for r in evaluator.evaluate(program, pool[:3]))


def test_a_compile_with_fewer_examples_than_the_streak_is_stopped_when_none_of_them_gets_an_answer():
    """Regression: the outage rule counted 8 different examples, so a compile with 6 examples whose LM was down
    was never stopped: every minibatch failed unanswered and the compile returned the unchanged program."""
    lm = FunctionLM(lambda messages: dspy.LMServerError("503 Service Unavailable", model="fake", status=503))
    lm.num_retries = 0
    train, val = examples(4), examples(2)
    assert distinct_examples([train, val]) == 4 + 2 - 2  # val's two are train's first two (same id, same inputs)
    assert distinct_examples([train, train]) == 4
    evaluator = make_evaluator(lm, num_threads=1, retry_backoff_s=0.0, distinct_examples=distinct_examples([train]))
    program, pool = dspy.Predict("question -> answer"), list(enumerate(train))
    assert all(r.error_kind == LM_CALL_ERROR for r in evaluator.evaluate(program, pool[:3]))  # 3 of 4: not yet
    with pytest.raises(EvaluationStopped) as info:
        evaluator.evaluate(program, pool[1:])  # the fourth, and every example there is, got no answer
    assert "no answer on 4 different examples in a row" in str(info.value.reason)


def test_charged_examples_not_started_once_max_cost_usd_is_spent_are_skipped_and_not_charged():
    """A reservation is priced at the average example; an example may cost far more (instructions of megabytes):
    once the cap is spent, the examples of a charged evaluation that have not started are not run."""
    ran = []

    def reply(messages):
        ran.append(1)
        return {"answer": field(messages, "question").replace("q", "a")}

    evaluator = make_evaluator(FunctionLM(reply), num_threads=1, spent_all=lambda: len(ran) >= 2)
    ledger = BudgetLedger(100)
    with ledger.reserve(6, TRAIN_EXAMPLE) as reservation:
        records = evaluator.evaluate(dspy.Predict("question -> answer"), list(enumerate(examples(6))), reservation)
    assert [r.example_id for r in records] == [0, 1] and ledger.spent == 2 and ledger.left == 98
    assert len(evaluator.evaluate(dspy.Predict("question -> answer"), list(enumerate(examples(3))))) == 3  # free


def test_successes_before_a_systemic_failure_are_kept_and_charged():
    def reply(messages):
        number = int(field(messages, "question")[1:])
        if number >= 5:
            return dspy.LMBillingError("insufficient quota", model="fake")
        return {"answer": f"a{number}"}

    ledger = BudgetLedger(100)
    with ledger.reserve(20, TRAIN_EXAMPLE) as reservation:
        with pytest.raises(EvaluationStopped, match="EvaluationLMError: .*5 of 20 example") as info:
            make_evaluator(FunctionLM(reply), num_threads=1).evaluate(
                dspy.Predict("question -> answer"), list(enumerate(examples(20))), reservation
            )
    completed = info.value.records
    assert [r.example_id for r in completed] == list(range(8))
    assert [r.passed for r in completed] == [True] * 5 + [False] * 3
    assert ledger.spent == 5


def test_an_isolated_lm_error_among_successes_is_a_record_and_is_not_charged():
    def reply(messages):
        question = field(messages, "question")
        if question == "q3":
            return dspy.LMAuthError("key rotated", model="fake")
        return {"answer": question.replace("q", "a")}

    ledger = BudgetLedger(100)
    with ledger.reserve(8, TRAIN_EXAMPLE) as reservation:
        records = make_evaluator(FunctionLM(reply), num_threads=3).evaluate(
            dspy.Predict("question -> answer"), list(enumerate(examples(8))), reservation
        )
    assert [r.example_id for r in records] == list(range(8))
    assert records[3].error.startswith("LMAuthError") and not records[3].passed
    assert ledger.spent == 7


def test_failures_must_be_consecutive_in_completion_order():
    def reply(messages):
        number = int(field(messages, "question")[1:])
        if number % 3 != 2:  # fail, fail, succeed, fail, fail, succeed, ...
            return dspy.LMAuthError("flaky auth", model="fake")
        return {"answer": f"a{number}"}

    records = make_evaluator(FunctionLM(reply), num_threads=1).evaluate(
        dspy.Predict("question -> answer"), list(enumerate(examples(12)))
    )
    assert [r.passed for r in records] == [False, False, True] * 4


def test_connection_refused_is_systemic_after_the_lms_own_retries():
    lm = FunctionLM(lambda m: dspy.LMTransportError("Connection refused", model="fake", retry_after=0))
    lm.num_retries = 1
    with pytest.raises(EvaluationStopped, match="EvaluationLMError: .*LMTransportError: \\[fake\\] Connection refused"):
        make_evaluator(lm, num_threads=1).evaluate(dspy.Predict("question -> answer"), list(enumerate(examples(10))))
    assert len(lm.calls) == 3 * 2  # three examples, each tried twice by dspy.LM


def test_a_litellm_error_wrapped_by_dspy_is_classified_by_its_cause(monkeypatch):
    """A custom LM raising LiteLLM's own AuthenticationError reaches us as dspy's LMUnexpectedError whose
    cause is that error. (A stand-in litellm module keeps the test from importing the real one: 3 s.)"""
    fake_litellm = types.ModuleType("litellm")

    class AuthenticationError(Exception):
        pass

    fake_litellm.AuthenticationError = AuthenticationError
    monkeypatch.setitem(sys.modules, "litellm", fake_litellm)
    lm = FunctionLM(lambda m: AuthenticationError("bad key"))
    with pytest.raises(EvaluationStopped, match="EvaluationLMError: .*AuthenticationError: bad key"):
        make_evaluator(lm, num_threads=1).evaluate(dspy.Predict("question -> answer"), list(enumerate(examples(5))))
    assert len(lm.calls) == 3


def test_a_failing_on_record_callback_stops_the_evaluation_and_propagates():
    calls: list[int] = []

    def persist(record):
        calls.append(record.example_id)
        raise OSError("disk full")

    lm = echo_lm()
    evaluator = make_evaluator(lm, num_threads=1)
    with pytest.raises(EvaluationStopped) as stopped:
        evaluator.evaluate(dspy.Predict("question -> answer"), list(enumerate(examples(10))), on_record=persist)
    assert isinstance(stopped.value.reason, OSError) and "disk full" in str(stopped.value.reason)
    assert stopped.value.records == []  # the record its log refused is not kept (nor charged)
    assert calls == [0] and len(lm.calls) == 1


def test_an_interrupt_raised_inside_the_metric_keeps_the_records_completed_before_it():
    def metric(example, prediction):
        if example.question == "q3":
            raise KeyboardInterrupt
        return True

    evaluator = make_evaluator(echo_lm(), metric=metric, num_threads=1)
    with pytest.raises(EvaluationStopped) as stopped:
        evaluator.evaluate(dspy.Predict("question -> answer"), list(enumerate(examples(10))))
    assert isinstance(stopped.value.reason, KeyboardInterrupt)
    assert [r.example_id for r in stopped.value.records] == [0, 1, 2]


def test_a_ctrl_c_that_cuts_off_an_examples_submission_waits_for_that_example_and_keeps_its_record(monkeypatch):
    """Regression: ThreadPoolExecutor.submit queues the example before it starts a worker thread and waits for it;
    a Ctrl-C landing in that wait raised out of submit, so the example's future was never kept: it ran on in the
    background (its LM calls paid), the evaluation returned without waiting for it, and its record was lost and paid
    again on resume."""
    import concurrent.futures.thread as pool_module

    release = threading.Event()
    started = threading.Event()

    def reply(messages):
        started.set()
        release.wait(10)
        return {"answer": field(messages, "question").replace("q", "a")}

    original = pool_module.ThreadPoolExecutor._adjust_thread_count

    def start_then_ctrl_c(self):  # the first worker starts, then the Ctrl-C lands in submit, as a SIGINT does
        original(self)
        if self._thread_name_prefix.startswith("rlmoptimizer-eval"):
            started.wait(10)
            threading.Timer(0.3, release.set).start()  # the example finishes after the evaluation saw the Ctrl-C
            raise KeyboardInterrupt

    monkeypatch.setattr(pool_module.ThreadPoolExecutor, "_adjust_thread_count", start_then_ctrl_c)
    lm = FunctionLM(reply)
    ledger = BudgetLedger(100)
    with pytest.raises(EvaluationStopped) as stopped, ledger.reserve(4, TRAIN_EXAMPLE) as reservation:
        make_evaluator(lm, num_threads=2).evaluate(
            dspy.Predict("question -> answer"), list(enumerate(examples(4))), reservation
        )
    assert isinstance(stopped.value.reason, KeyboardInterrupt)
    assert len(lm.calls) == 1  # the example whose submission was cut off ran; no other started
    assert [r.example_id for r in stopped.value.records] == [0] and ledger.spent == 1  # kept and charged


@pytest.mark.parametrize("unparsed_in", ["tech", "billing"])
def test_a_record_keeps_the_step_call_that_raised_wherever_the_program_calls_it(unparsed_in):
    """The trace keeps only calls that returned, so which step raised cannot be read from it when the program
    branches (tech raised, billing never ran either) or calls a step twice (billing's second call raised)."""
    from rlmoptimizer.moves.failures import failure_step, step_order

    program = Triage()
    records = make_evaluator(triage_lm(unparsed_in)).evaluate(program, list(enumerate(examples(4))))
    failed = {r.example_id: r for r in records if r.error}
    assert set(failed) == ({3} if unparsed_in == "tech" else {1})
    (record,) = failed.values()
    assert record.error.startswith("AdapterParseError") and record.error_kind == PROGRAM_ERROR
    assert record.failed_call.step_name == unparsed_in
    # the inputs of the call that raised: billing's second, which was given its first reply
    assert record.failed_call.inputs == {"question": "q3" if unparsed_in == "tech" else "q1 a1"}
    order = step_order(records, [name for name, _ in program.named_predictors()])
    assert failure_step(record, order) == unparsed_in
    assert all(r.failed_call is None for r in records if not r.error)


def test_a_step_error_the_program_caught_is_not_where_it_raised():
    class Fallback(dspy.Module):
        def __init__(self):
            super().__init__()
            self.route = dspy.Predict("question -> team")
            self.tech = dspy.Predict("question -> tech_reply")

        def forward(self, question):
            try:
                self.route(question=question)
            except Exception:
                pass  # a retry wrapper's way: go on without the router
            reply = self.tech(question=question).tech_reply
            if reply == "a1":
                raise ValueError("the program's own check failed")
            return dspy.Prediction(answer=reply)

    def reply(messages):
        if "`team`" in system_text(messages).split("Your output fields are:")[1]:
            return "no format at all"
        return {"tech_reply": field(messages, "question").replace("q", "a")}

    records = make_evaluator(FunctionLM(reply)).evaluate(Fallback(), list(enumerate(examples(2))))
    assert records[1].error == "ValueError: the program's own check failed"
    assert records[1].failed_call is None  # raised outside every step: the router's caught error is not it
    assert records[0].passed and records[0].failed_call is None


def test_an_error_is_pinned_on_a_step_only_when_it_came_from_that_steps_call():
    """A wrapper module that keeps its step's signature is not the step; a fallback that ran another step after
    catching a step's error, then raised its own, is not that step's error; ``raise ... from`` is."""

    class Wrapper(dspy.Module):  # keeps the signature of its step, as dspy's ReAct does
        def __init__(self):
            super().__init__()
            self.step = dspy.Predict("question -> answer")
            self.signature, self.check = self.step.signature, False

        def forward(self, question):
            out = self.step(question=question)
            if self.check:
                int(out.answer)  # its own check raises, after its step returned
            return out

    class Programs(dspy.Module):
        def __init__(self, how):
            super().__init__()
            self.how, self.route, self.inner = how, dspy.Predict("question -> team"), Wrapper()

        def forward(self, question):
            if self.how == "wrapper":
                self.inner.check = True
                self.inner(question=question)
            try:
                self.route(question=question)
            except Exception as exc:
                if self.how == "from":
                    raise RuntimeError("routing failed") from exc
                if self.how == "suppressed":
                    raise RuntimeError("routing failed") from None
                answer = self.inner(question=question).answer  # the fallback: another step, which returns
                raise ValueError(f"fallback answer {answer!r} is not accepted")  # noqa: B904 - the implicit context is the point
            return dspy.Prediction(answer="never")

    def reply(messages):
        if "`team`" in system_text(messages).split("Your output fields are:")[1]:
            return "no format at all"
        return {"answer": "not a number"}

    def failed(how):
        (record,) = make_evaluator(FunctionLM(reply)).evaluate(Programs(how), [(0, examples(1)[0])])
        assert record.error_kind == PROGRAM_ERROR
        return record.failed_call.step_name if record.failed_call else None

    assert failed("wrapper") is None  # ValueError: invalid literal for int(): the wrapper's, after inner.step returned
    assert failed("fallback") is None  # the ValueError's context is route's error, but inner.step ran after it
    assert failed("from") == "route"
    assert failed("suppressed") is None


def test_a_second_ctrl_c_stops_waiting_for_the_examples_still_running(caplog):
    """The first Ctrl-C waits for the examples already running (their records are kept); a second one stops the
    wait: the evaluation ends with what finished while slow examples are still running."""
    release = threading.Event()  # the slow LM calls return only when the test lets them (after the evaluation ended)
    started = threading.Semaphore(0)

    def reply(messages):
        question = field(messages, "question")
        if question in ("q0", "q1"):
            started.release()
            release.wait(60)
        return {"answer": question.replace("q", "a")}

    def press_ctrl_c_twice():
        started.acquire()
        started.acquire()  # both slow examples are running
        for _ in range(2):
            threading.Event().wait(0.3)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    presser = threading.Thread(target=press_ctrl_c_twice, daemon=True)
    presser.start()
    logged: list[int] = []
    ledger = BudgetLedger(100)
    try:
        with pytest.raises(EvaluationStopped) as stopped, ledger.reserve(6, TRAIN_EXAMPLE) as reservation:
            make_evaluator(FunctionLM(reply), num_threads=3).evaluate(
                dspy.Predict("question -> answer"),
                list(enumerate(examples(6))),
                reservation,
                on_record=lambda r: logged.append(r.example_id),
            )
        assert not release.is_set()  # it returned while the two slow examples were still running
        assert isinstance(stopped.value.reason, KeyboardInterrupt)
        kept = {r.example_id for r in stopped.value.records}
        assert kept and not kept & {0, 1}  # what finished is kept; the abandoned examples are not
        said = caplog.text
        assert "waiting for the 2 example(s) already running" in said and "Ctrl-C again" in said
        assert "2 example(s) still running are left to finish in the background" in said
        spent = ledger.spent
        assert spent == len(kept)
        release.set()  # the abandoned examples finish now: neither logged nor charged
        for thread in [t for t in threading.enumerate() if t.name.startswith("rlmoptimizer-eval")]:
            thread.join(10)
        assert sorted(logged) == sorted(kept) and ledger.spent == spent
    finally:
        release.set()
        presser.join(5)


@pytest.mark.parametrize("where", ["metric", "program"])
def test_running_out_of_memory_stops_the_evaluation_and_is_no_record(where):
    """Regression: a MemoryError from the metric (or the program) was stored as a failing record of the example,
    reused on resume as if the instructions had failed it. It says nothing of the example: the evaluation stops,
    keeping the records that completed, and the example is evaluated again on resume."""

    def metric(example, prediction, trace=None):
        if where == "metric" and example.question == "q3":
            raise MemoryError("out of memory")
        return 1.0

    def reply(messages):
        if where == "program" and field(messages, "question") == "q3":
            raise MemoryError("out of memory")
        return {"answer": field(messages, "question").replace("q", "a")}

    evaluator = Evaluator(metric=Metric(metric), lm=FunctionLM(reply), num_threads=1)
    with pytest.raises(EvaluationStopped) as stopped:
        evaluator.evaluate(dspy.Predict("question -> answer"), list(enumerate(examples(6))))
    assert isinstance(stopped.value.reason, MemoryError)
    assert [r.example_id for r in stopped.value.records] == [0, 1, 2]
