"""The metric wrapper: calling styles, accepted return values, and clear errors for everything else."""

from __future__ import annotations

import functools
from decimal import Decimal
from fractions import Fraction

import dspy
import pytest

from rlmoptimizer.errors import ConfigurationError, MetricError
from rlmoptimizer.metric import Metric

GOLD = dspy.Example(question="2+2?", answer="4").with_inputs("question")
PRED = dspy.Prediction(answer="4")


def test_a_non_callable_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match=r"metric must be a callable.*got str"):
        Metric("exact_match")


def test_dspy_style_two_and_three_argument_metrics():
    calls = []

    def two(example, prediction):
        calls.append(("two", example, prediction))
        return True

    def three(example, prediction, trace=None):
        calls.append(("three", trace))
        return 0.25

    assert Metric(two).score(GOLD, PRED) == (1.0, None)
    assert Metric(three).score(GOLD, PRED) == (0.25, None)
    assert calls == [("two", GOLD, PRED), ("three", None)]
    assert Metric(two).arity == 2 and Metric(three).arity == 3


def test_gepa_style_five_argument_metric_gets_none_for_the_predictor_arguments():
    received = []

    def gepa_metric(gold, pred, trace, pred_name, pred_trace):
        received.append((gold, pred, trace, pred_name, pred_trace))
        return dspy.Prediction(score=0.5, feedback="half right")

    metric = Metric(gepa_metric)
    assert metric.arity == 5
    assert metric.score(GOLD, PRED) == (0.5, "half right")
    assert received == [(GOLD, PRED, None, None, None)]
    assert (
        metric.describe()
        == "test_gepa_style_five_argument_metric_gets_none_for_the_predictor_arguments.<locals>.gepa_metric(gold, pred, trace, pred_name, pred_trace)"
    )


def test_callable_objects_methods_partials_and_varargs():
    class Judge:
        def __call__(self, example, prediction, trace=None):
            return 1

    class Holder:
        def check(self, example, prediction):
            return False

    def with_config(example, prediction, trace=None, *, strict):
        return strict

    assert Metric(Judge()).score(GOLD, PRED) == (1.0, None)
    assert Metric(Holder().check).score(GOLD, PRED) == (0.0, None)
    assert Metric(functools.partial(with_config, strict=True)).score(GOLD, PRED) == (1.0, None)
    assert Metric(lambda *args: float(len(args) == 2)).score(GOLD, PRED) == (1.0, None)
    assert Metric(Judge()).fn.__class__ is Judge


def test_defaulted_parameters_after_trace_keep_their_defaults_and_gepa_form_is_told_by_the_4th_and_5th():
    """Regression: ``metric(example, pred, trace=None, field=..., lowercase=...)`` was taken for GEPA's form and
    called with None for ``field`` and ``lowercase`` (and with a step's name for ``field`` on step feedback)."""
    seen = []

    def tuned(example, prediction, trace=None, field="answer", lowercase=True):
        seen.append((trace, field, lowercase))
        return float(getattr(prediction, field) == example[field])

    metric = Metric(tuned)
    assert metric.score(GOLD, PRED) == (1.0, None)
    assert seen == [(None, "answer", True)]
    assert not metric.gives_step_feedback
    assert metric.step_feedback(GOLD, PRED, [], "predict", []) is None
    assert seen == [(None, "answer", True)]  # not asked for a step's feedback
    assert metric.describe().endswith("tuned(example, prediction, trace)")

    def gepa_with_defaults(gold, pred, trace=None, pred_name=None, pred_trace=None):
        seen.append((pred_name, pred_trace))
        return dspy.Prediction(score=1.0, feedback=f"on {pred_name}")

    def gepa_renamed(gold, pred, trace, name, calls, extra=0):
        seen.append((name, calls, extra))
        return dspy.Prediction(score=1.0, feedback=f"on {name}")

    seen.clear()
    for fn in (gepa_with_defaults, gepa_renamed):
        metric = Metric(fn)
        assert metric.arity == 5 and metric.gives_step_feedback
        assert metric.score(GOLD, PRED) == (1.0, "on None")
        assert metric.step_feedback(GOLD, PRED, ["t"], "predict", ["s"]) == "on predict"
    assert seen == [(None, None), ("predict", ["s"]), (None, None, 0), ("predict", ["s"], 0)]


class GepaModuleMetric(dspy.Module):
    def forward(self, gold, pred, trace, pred_name, pred_trace):
        return dspy.Prediction(
            score=float(pred.answer == gold.answer), feedback=f"{pred_name}: {len(pred_trace or [])}"
        )


class DspyModuleMetric(dspy.Module):
    def forward(self, example, prediction, trace=None):
        return dspy.Prediction(score=0.5, feedback=f"trace {trace}")


class ModuleWithOwnCall(dspy.Module):
    def __call__(self, example, prediction):
        return 0.25

    def forward(self, gold, pred, trace, pred_name, pred_trace):
        raise AssertionError("not called: the class's own __call__ is")


def test_a_module_metric_is_called_by_its_forward_and_a_bare_varargs_wrapper_with_two_arguments():
    """Regression: a ``dspy.Module`` metric in GEPA's form (``forward(self, gold, pred, trace, pred_name,
    pred_trace)``, which dspy.GEPA accepts) was called with two arguments, as its ``__call__(*args, **kwargs)`` reads,
    and raised TypeError on every example."""
    gepa = Metric(GepaModuleMetric())
    assert gepa.describe() == "GepaModuleMetric(gold, pred, trace, pred_name, pred_trace)"
    assert gepa.score(GOLD, PRED) == (1.0, "None: 0")
    assert gepa.step_feedback(GOLD, PRED, [], "predict", ["call"]) == "predict: 1"
    assert Metric(DspyModuleMetric()).score(GOLD, PRED) == (0.5, "trace None")
    assert Metric(ModuleWithOwnCall()).score(GOLD, PRED) == (0.25, None)

    calls = []

    def wrapper(*args, **kwargs):
        calls.append((args, kwargs))
        return 1.0

    assert Metric(wrapper).score(GOLD, PRED) == (1.0, None)
    assert calls == [((GOLD, PRED), {})]


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda example: 1.0, r"takes 1 positional argument"),
        (lambda a, b, c, d: 1.0, r"requires 4 positional arguments"),
        (lambda a, b, *, strict: 1.0, r"required keyword-only parameter\(s\) \['strict'\]"),
    ],
)
def test_metrics_that_cannot_be_called_either_way_are_rejected_up_front(fn, message):
    with pytest.raises(ConfigurationError, match=message):
        Metric(fn)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, (1.0, None)),
        (False, (0.0, None)),
        (1, (1.0, None)),
        (0, (0.0, None)),
        (0.75, (0.75, None)),
        (dspy.Prediction(score=0.5, feedback="close"), (0.5, "close")),
        (dspy.Prediction(score=True), (1.0, None)),
        ({"score": 0.2, "feedback": "wrong unit"}, (0.2, "wrong unit")),
        ({"score": 1}, (1.0, None)),
    ],
)
def test_accepted_return_values(value, expected):
    assert Metric(lambda e, p: value).score(GOLD, PRED) == expected


def test_an_object_with_score_and_feedback_attributes_is_accepted():
    class Verdict:
        score = 0.4
        feedback = 3  # not text: shown as text

    assert Metric(lambda e, p: Verdict()).score(GOLD, PRED) == (0.4, "3")


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        (None, ["returned None (NoneType)", "not a score"]),
        (float("nan"), ["returned nan (float)", "not a finite number"]),
        (float("inf"), ["returned inf (float)", "not a finite number"]),
        (Decimal("sNaN"), ["returned Decimal('sNaN') (Decimal)", "not a finite number"]),
        ("yes", ["returned 'yes' (str)", "not a score"]),
        ([1.0], ["returned [1.0] (list)"]),
        (dspy.Prediction(score="high"), ["whose `score` 'high' (str)", "not a number"]),
        ({"feedback": "no score key"}, ["not a score"]),
    ],
)
def test_non_scores_raise_a_metric_error_that_says_what_is_accepted(value, fragments):
    def my_metric(example, prediction):
        return value

    with pytest.raises(MetricError) as info:
        Metric(my_metric).score(GOLD, PRED)
    message = str(info.value)
    assert "my_metric" in message
    for fragment in fragments:
        assert fragment in message
    if not isinstance(value, (int, float)) or value != value or value in (float("inf"),):
        assert "a bool, a finite number, or dspy.Prediction(score=" in message


@pytest.mark.parametrize("value", [4.5, 0, 5, -3, -0.25, 17, Decimal("0.75"), Fraction(1, 4)])
def test_any_finite_score_is_kept_as_returned(value):
    # 0-5 judges and GEPA rewards below zero are scored as dspy.Evaluate and GEPA score them: unchanged
    assert Metric(lambda e, p: value).score(GOLD, PRED) == (float(value), None)
    assert Metric(lambda e, p: dspy.Prediction(score=value, feedback="f")).score(GOLD, PRED) == (float(value), "f")


def test_an_exception_inside_the_metric_propagates_unchanged():
    def broken(example, prediction):
        raise ZeroDivisionError("division by zero")

    with pytest.raises(ZeroDivisionError):
        Metric(broken).score(GOLD, PRED)


def test_describe_names_the_function_and_its_style():
    def exact(example, prediction, trace=None):
        return True

    assert (
        Metric(exact).describe()
        == "test_describe_names_the_function_and_its_style.<locals>.exact(example, prediction, trace)"
    )
    assert "Metric(" in repr(Metric(exact))


class CachingJudge:
    """A metric object that changes as it runs (a call counter, a cache of its verdicts), as LLM judges do."""

    def __init__(self, threshold: float = 0.5):
        self.threshold = threshold
        self.calls = 0
        self.cache: dict[str, float] = {}

    def __call__(self, example, prediction, trace=None):
        self.calls += 1
        score = self.cache.setdefault(example.question, float(prediction.answer == example.answer))
        return score >= self.threshold


class Slotted:
    __slots__ = ("threshold",)

    def __init__(self, threshold: float):
        self.threshold = threshold

    def __call__(self, example, prediction, trace=None):
        return 1.0


def test_a_metric_object_keeps_its_identity_after_the_state_its_own_calls_changed():
    judge = CachingJudge()
    first = Metric(judge)
    first.score(GOLD, PRED)
    first.used()  # the compile that called it ended
    assert Metric(judge).identity == first.identity  # a cell run again resumes its run directory
    second = Metric(judge)  # a second compile
    second.score(GOLD, PRED)
    second.used()
    assert Metric(judge).identity == first.identity  # and again after a second compile called it
    assert Metric(CachingJudge()).identity == first.identity  # a fresh one, as a new process builds it
    judge.threshold = 0.9  # changed by the user between compiles: another metric
    changed = Metric(judge)
    assert changed.identity != first.identity
    changed.score(GOLD, PRED)
    changed.used()
    assert Metric(judge).identity == changed.identity  # which keeps its own identity from then on


def test_a_metric_under_metric_id_is_never_remembered():
    judge = CachingJudge()
    named = Metric(judge, metric_id="judge-v1")
    named.score(GOLD, PRED)
    named.used()
    assert Metric(judge).identity != Metric(CachingJudge()).identity  # its calls under metric_id changed it
    slotted = Slotted(0.5)
    slotted.threshold = 0.7  # its state is in its identity
    assert Metric(slotted).identity != Metric(Slotted(0.5)).identity
    assert Metric(slotted).identity == Metric(Slotted(0.7)).identity


class SlottedCounter:
    __slots__ = ("threshold", "calls", "__secret")

    def __init__(self, threshold: float, secret: str = "a"):
        self.threshold, self.calls, self.__secret = threshold, 0, secret

    def __call__(self, example, prediction, trace=None):
        self.calls += 1
        return 1.0


def test_a_slotted_metric_without_weak_references_is_remembered_and_its_private_slots_count():
    counter = SlottedCounter(0.5)
    first = Metric(counter)
    first.score(GOLD, PRED)
    first.used()
    assert Metric(counter).identity == first.identity == Metric(SlottedCounter(0.5)).identity
    assert Metric(SlottedCounter(0.5, secret="b")).identity != first.identity


class JudgeWithMethod(CachingJudge):
    def judge(self, example, prediction, trace=None):
        return self(example, prediction, trace)


def test_a_bound_method_metric_keeps_its_objects_identity_and_a_change_undone_is_the_first_metric_again():
    """Regressions: ``metric=judge.judge`` (a new bound-method object on every access) got a new identity after
    every compile that called it; and a metric changed, refused (before any call), then changed back stayed
    refused."""
    holder = JudgeWithMethod()
    first = Metric(holder.judge)
    first.score(GOLD, PRED)
    first.used()
    assert Metric(holder.judge).identity == first.identity  # another bound-method object, the same metric
    assert Metric(JudgeWithMethod().judge).identity == first.identity  # as a new process builds it

    judge = CachingJudge()
    ran = Metric(judge)
    ran.score(GOLD, PRED)
    ran.used()
    judge.threshold = 0.9
    refused = Metric(judge)  # another metric: the run directory refuses it, before any call
    assert refused.identity != ran.identity
    refused.used()
    judge.threshold = 0.5  # the change undone
    assert Metric(judge).identity == ran.identity


async def judged(example, prediction, trace=None):
    return 1.0


class AsyncJudge:
    async def __call__(self, example, prediction, trace=None):
        return 1.0


@pytest.mark.parametrize("fn", [judged, functools.partial(judged), AsyncJudge()], ids=["def", "partial", "object"])
def test_an_async_metric_is_refused_before_any_lm_call(fn):
    """Regression: an async metric was taken, and the baseline's paid runs ended in a MetricError about a coroutine."""
    from support.tickets import RouteTicket, make_splits

    from rlmoptimizer import RLMDocstringOptimizer
    from rlmoptimizer.testing import FunctionLM

    with pytest.raises(ConfigurationError, match="is async .* plain def"):
        Metric(fn)
    lm = FunctionLM(lambda messages: {"queue": "billing"})
    with pytest.raises(ConfigurationError, match="is async"):
        RLMDocstringOptimizer(fn, rlm_autopilot="loop", sub_lm=lm)
    train, val = make_splits()
    optimizer = RLMDocstringOptimizer(rlm_autopilot="loop", sub_lm=lm, eval_lm=lm, max_iterations=1)
    with pytest.raises(ConfigurationError, match="is async"):
        optimizer.compile(RouteTicket(), trainset=train, valset=val, metric=fn)
    assert lm.calls == []
