"""The checks of what the user passes, at the edge: programs, examples, LMs, settings."""

from __future__ import annotations

from decimal import Decimal

import dspy
import pytest
from support.qa import echo_lm, examples

from rlmoptimizer import RLMDocstringOptimizer
from rlmoptimizer.errors import ConfigurationError
from rlmoptimizer.inputs import check_pass_threshold, check_positive_int, resolve_eval_lm
from rlmoptimizer.student import check_examples, check_program


def test_check_program_rejects_non_modules_and_modules_without_predictors():
    check_program(dspy.Predict("question -> answer"))
    with pytest.raises(ConfigurationError, match="must be a dspy.Module"):
        check_program(lambda question: question)

    class NoSteps(dspy.Module):
        def forward(self, question):
            return dspy.Prediction(answer=question)

    with pytest.raises(ConfigurationError, match="no predictors"):
        check_program(NoSteps())

    class AsyncOnly(dspy.Module):  # regression: it ran, raised AttributeError on every example, and was paid for
        def __init__(self):
            super().__init__()
            self.answer = dspy.Predict("question -> answer")

        async def aforward(self, question):
            return await self.answer.acall(question=question)

    with pytest.raises(ConfigurationError, match="has no forward method, only aforward: .* Define forward"):
        check_program(AsyncOnly())


def test_a_program_whose_predictors_sit_in_a_part_marked_compiled_is_told_so():
    """Regression: a program wrapping what BootstrapFewShot returned (marked ``_compiled``) was told to store its
    predictors as attributes, which it did: dspy's named_predictors() skips a compiled part."""

    class Outer(dspy.Module):
        def __init__(self, inner, in_list=False):
            super().__init__()
            if in_list:
                self.stages = [inner]
            else:
                self.inner = inner
            self.answer = None

        def forward(self, question):
            return self.inner(question=question)

    for in_list, where in ((False, "self.inner"), (True, "self.stages[0]")):
        inner = dspy.ChainOfThought("question -> answer")
        inner._compiled = True
        with pytest.raises(ConfigurationError, match=rf"inside {where.replace('[', '.').replace(']', '.')}, marked"):
            check_program(Outer(inner, in_list))
        inner._compiled = False
        check_program(Outer(inner, in_list))  # the fix the message gives


def test_check_examples_names_the_bad_index_and_shows_the_fix():
    good = examples(3)
    assert check_examples(tuple(good), "trainset") == good
    with pytest.raises(ConfigurationError, match="trainset is empty"):
        check_examples([], "trainset")
    assert check_examples([], "valset", allow_empty=True) == []
    with pytest.raises(ConfigurationError, match="list of dspy.Example"):
        check_examples("q0,q1", "trainset")
    with pytest.raises(ConfigurationError, match=r"trainset\[1\] is a dict.*with_inputs\(\"question\"\)"):
        check_examples([good[0], {"question": "q"}], "trainset")
    with pytest.raises(
        ConfigurationError, match=r"trainset\[1\] is a dspy.Prediction .*dspy.Example\(\*\*prediction\)"
    ):
        check_examples([good[0], dspy.Prediction(question="q", answer="a")], "trainset")  # (was an AttributeError)
    with pytest.raises(ConfigurationError, match=r"valset\[2\] has no input fields marked.*with_inputs"):
        check_examples([good[0], good[1], dspy.Example(question="q", answer="a")], "valset")
    with pytest.raises(ConfigurationError, match=r"trainset\[0\] marks \['query'\] as inputs"):
        check_examples([dspy.Example(question="q", answer="a").with_inputs("query")], "trainset")


def test_resolve_eval_lm_prefers_the_argument_then_settings_and_explains_when_neither():
    mine, configured = echo_lm(), echo_lm()
    with dspy.context(lm=configured):
        assert resolve_eval_lm(mine) is mine
        assert resolve_eval_lm(None) is configured
    with pytest.raises(ConfigurationError, match=r"eval_lm=.*dspy.configure\(lm="):
        resolve_eval_lm(None)
    with pytest.raises(ConfigurationError, match="must be a dspy.LM"):
        resolve_eval_lm("openai/gpt-4o-mini")


def test_settings_are_checked_with_what_was_given():
    with pytest.raises(ConfigurationError, match="num_threads must be an int >= 1, got 0"):
        check_positive_int("num_threads", 0)
    with pytest.raises(ConfigurationError, match=r"pass_threshold must be a finite number .* got inf"):
        check_pass_threshold(float("inf"))
    assert check_pass_threshold(1) == 1.0 and check_pass_threshold(5) == 5.0  # any scale: a 0-5 metric


def test_numbers_from_numpy_or_a_decimal_are_taken_by_every_numeric_setting():
    """Regression: pass_threshold, sandbox_timeout_s and max_demos refused numpy's numbers and a Decimal (values read
    from a config or a DataFrame), which max_cost_usd, max_iterations and num_threads took."""
    import numpy as np

    lm = echo_lm()
    optimizer = RLMDocstringOptimizer(
        root_lm=lm,
        pass_threshold=np.float32(0.5),
        sandbox_timeout_s=Decimal("30"),
        max_demos=np.int64(3),
        max_iterations=np.int32(2),
    )
    assert (optimizer.pass_threshold, optimizer.sandbox_timeout_s, optimizer.max_demos) == (0.5, 30.0, 3)
    assert type(optimizer.max_demos) is int and type(optimizer.sandbox_timeout_s) is float
    for bad in (np.float64("nan"), Decimal("Infinity"), True):
        with pytest.raises(ConfigurationError, match="pass_threshold must be a finite number"):
            RLMDocstringOptimizer(root_lm=lm, pass_threshold=bad)
    with pytest.raises(ConfigurationError, match="max_demos must be an int from 0 to 16"):
        RLMDocstringOptimizer(root_lm=lm, max_demos=np.float64(3))


def test_inputs_that_the_programs_forward_cannot_take_are_refused_naming_both():
    """Regression: valset marked ``.with_inputs("text")`` for ``forward(self, ticket)`` raised TypeError on every
    example, and the run spent its budget on them and returned a 0.0 program with a warning."""
    from support.tickets import RouteTicket

    good = dspy.Example(ticket="refund please", queue="billing").with_inputs("ticket")
    assert check_examples([good], "valset", program=RouteTicket()) == [good]
    wrong = dspy.Example(text="refund please", queue="billing").with_inputs("text")
    with pytest.raises(ConfigurationError) as refused:
        check_examples([good, wrong], "valset", program=RouteTicket())
    message = str(refused.value)
    assert "valset[1] cannot be passed to RouteTicket.forward(ticket)" in message
    assert "['text'] is not among its parameters" in message and "it requires ['ticket']" in message
    assert ".with_inputs('ticket')" in message

    class Flexible(dspy.Module):  # takes anything: dspy's own Predict does too
        def __init__(self):
            super().__init__()
            self.predict = dspy.Predict("text -> queue")

        def forward(self, **inputs):
            return self.predict(**inputs)

    assert check_examples([wrong], "valset", program=Flexible()) == [wrong]  # its one predictor takes `text`


@pytest.mark.parametrize(
    "program",
    [dspy.Predict("text, lang -> label"), dspy.ChainOfThought("text, lang -> label")],
    ids=["Predict", "ChainOfThought"],
)
def test_a_module_that_takes_any_keyword_is_checked_against_its_signatures_inputs(program):
    """Regression: a bare dspy.Predict whose examples lacked one of its inputs ran the whole optimization with
    dspy's "Missing: ['lang']" warning on every call, the LM never seeing that field."""
    no_lang = dspy.Example(text="bonjour", label="greeting").with_inputs("text")
    with pytest.raises(ConfigurationError, match=r"trainset\[0\] cannot be passed to .*it requires \['lang'\]"):
        check_examples([no_lang], "trainset", program=program)
    both = dspy.Example(text="bonjour", lang="fr", extra=1, label="greeting").with_inputs("text", "lang", "extra")
    assert check_examples([both], "trainset", program=program) == [both]  # an extra input is dspy's to ignore


def test_an_input_that_may_be_none_or_has_a_default_may_be_left_out_and_a_custom_forward_is_not_guessed():
    class Optional_(dspy.Signature):
        text: str = dspy.InputField()
        lang: str | None = dspy.InputField()
        tone: str = dspy.InputField(default="neutral")
        history: dspy.History = dspy.InputField()
        label: str = dspy.OutputField()

    only_text = dspy.Example(text="bonjour", label="greeting").with_inputs("text")
    assert check_examples([only_text], "trainset", program=dspy.Predict(Optional_)) == [only_text]

    class TwoSteps(dspy.Module):  # takes anything and feeds two predictors: nothing to check it against
        def __init__(self):
            super().__init__()
            self.a, self.b = dspy.Predict("text, lang -> x"), dspy.Predict("x -> label")

        def forward(self, **inputs):
            return self.b(x=self.a(**inputs).x)

    assert check_examples([only_text], "trainset", program=TwoSteps()) == [only_text]

    class Retrieve(dspy.Module):  # fills `context` itself: its examples hold only the question
        def __init__(self):
            super().__init__()
            self.signature = dspy.Signature("context, text -> label")
            self.answer = dspy.ChainOfThought(self.signature)

        def forward(self, text, **kwargs):
            return self.answer(context="retrieved", text=text, **kwargs)

    class Passing(Retrieve):
        def forward(self, **kwargs):
            return self.answer(context="retrieved", **kwargs)

    assert check_examples([only_text], "trainset", program=Retrieve()) == [only_text]
    assert check_examples([only_text], "trainset", program=Passing()) == [only_text]


def test_repeated_examples_and_a_valset_that_repeats_train_are_warned_about_once_each(caplog):
    from support.optimizing import compile_tickets
    from support.tickets import make_splits

    train, val = make_splits()
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets([], trainset=train, valset=[*val, val[0], val[1]], rlm_autopilot="loop", max_metric_calls=60)
    warned = [r.getMessage() for r in caplog.records if "repeated example" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("valset holds 2 repeated example(s)")
    assert "wins twice" in warned[0] and "Remove the copies from valset" in warned[0]
    assert not [r for r in caplog.records if "also in the trainset" in r.getMessage()]

    caplog.clear()
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets([], trainset=train, valset=[*val, train[3]], rlm_autopilot="loop", max_metric_calls=60)
    shared = [r.getMessage() for r in caplog.records if "also in the trainset" in r.getMessage()]
    assert len(shared) == 1 and shared[0].startswith("1 valset example(s) are also in the trainset")
    assert not [r for r in caplog.records if "repeated example" in r.getMessage()]


def test_examples_that_differ_in_one_field_are_not_repeats_and_objects_are_left_out():
    from rlmoptimizer.student import warn_repeated_examples

    a = dspy.Example(question="q", answer="a").with_inputs("question")
    assert warn_repeated_examples([a, dspy.Example(question="q", answer="b").with_inputs("question")], []) == []
    opaque = dspy.Example(question=object(), answer="a").with_inputs("question")
    assert warn_repeated_examples([opaque, opaque], [opaque]) == []  # no stable form: not compared


@pytest.mark.parametrize(
    ("val_size", "warned"), [(0, "trainset"), (2, "no change can show"), (9, "only a large gain"), (10, None)]
)
def test_a_selection_split_too_small_to_show_most_gains_is_warned_about(val_size, warned):
    from rlmoptimizer.selection import tiny_split_warning

    said = tiny_split_warning(val_size, 8)
    if warned is None:
        assert said is None
    else:
        assert warned in said and "Give a valset of 30 or more" in said


def test_a_train_set_of_two_without_a_valset_is_told_that_nothing_can_confirm_a_change():
    """With no valset the train set is the selection split: there are no fresh train examples to confirm on."""
    from rlmoptimizer.selection import tiny_split_warning

    said = tiny_split_warning(0, 2)
    assert "trainset (no valset was given)" in said and "the unchanged program is returned" in said
    assert "fresh train examples" not in said


def test_a_relative_run_storage_dir_is_the_one_of_the_working_directory_when_the_optimizer_was_made(
    tmp_path, monkeypatch
):
    """Regression: after a %cd the same optimizer started a new directory and paid everything again, and its
    interrupt message named a relative path."""
    from rlmoptimizer import RLMDocstringOptimizer

    monkeypatch.chdir(tmp_path)
    optimizer = RLMDocstringOptimizer(root_lm=dspy.utils.DummyLM([]), run_storage_dir="runs/a")
    monkeypatch.chdir(tmp_path.parent)
    assert optimizer.run_storage_dir == tmp_path / "runs" / "a"
    monkeypatch.setenv("HOME", str(tmp_path))
    home = RLMDocstringOptimizer(root_lm=dspy.utils.DummyLM([]), run_storage_dir="~/runs/b")
    assert home.run_storage_dir == tmp_path / "runs" / "b"


def test_a_trainset_too_large_for_the_sandbox_is_refused_before_any_lm_call(monkeypatch):
    """Regression: a train set of long non-ASCII documents was paid for in both baselines, then the sandbox died
    loading it, and every resume died the same way."""
    from support.fakes import FunctionLM

    from rlmoptimizer import RLMDocstringOptimizer
    from rlmoptimizer import student as student_module

    monkeypatch.setattr(student_module, "REPL_DATA_LIMIT", 40_000)
    trainset = [dspy.Example(question="中" * 1_000, answer="a").with_inputs("question") for _ in range(4)]
    lm = FunctionLM(lambda messages: {"answer": "a"})
    optimizer = RLMDocstringOptimizer(root_lm=lm, eval_lm=lm, max_iterations=1)
    with pytest.raises(ConfigurationError, match="too large for the optimizer agent's sandbox.*rlm_autopilot='loop'"):
        optimizer.compile(dspy.Predict("question -> answer"), trainset=trainset, metric=lambda e, p, t=None: 1.0)
    assert lm.calls == []  # (6,000 characters an example escaped, twice: 48,000 > 40,000)
    check_repl_data_ok = student_module.check_repl_data  # the same data in ASCII fits
    check_repl_data_ok([dspy.Example(question="z" * 1_000, answer="a").with_inputs("question") for _ in range(4)])
    # with max_metric_calls and a valset the REPL gets no more train records than the budget evaluates
    check_repl_data_ok(trainset, most=3)
    with pytest.raises(ConfigurationError):
        check_repl_data_ok(trainset, most=4)


def test_an_expected_answer_marked_as_an_input_is_refused_naming_the_fix():
    """Regression: ``.with_inputs("question", "answer")`` was accepted: dspy dropped the answer before the LM call,
    every record had no expected output, and the analysis and proposals were blind to what was right."""
    marked = [dspy.Example(question="q", answer="a").with_inputs("question", "answer")]
    with pytest.raises(ConfigurationError, match=r"marks \['answer'\] as input.*\.with_inputs\('question'\)"):
        check_examples(marked, "trainset", program=dspy.ChainOfThought("question -> answer"))

    class Verify(dspy.Module):  # a forward that names it takes it as its own input: not a label
        def __init__(self):
            super().__init__()
            self.check = dspy.Predict("question, draft -> answer")

        def forward(self, question, answer):
            return self.check(question=question, draft=answer)

    assert check_examples(marked, "trainset", program=Verify()) == marked


def test_text_no_lm_request_can_carry_is_refused_before_any_call():
    """Regression: a lone surrogate in an input made dspy refuse every call; the run went on and paid for them."""
    bad = [dspy.Example(question="fine", answer="a").with_inputs("question")]
    bad.append(dspy.Example(question=["ok", "broken \ud800 text"], answer="a").with_inputs("question"))
    with pytest.raises(ConfigurationError, match=r"trainset\[1\]\.question holds text that cannot be encoded"):
        check_examples(bad, "trainset", program=dspy.Predict("question -> answer"))
    assert len(check_examples(bad[:1], "trainset", program=dspy.Predict("question -> answer"))) == 1


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("max_errors", 10, "an example on which the program raises scores 0 here and the run goes on"),
        ("max_rounds", 1, "demos here come from one run of the program on each train example"),
        ("teacher_settings", {}, "the program's own runs with eval_lm, as there is no teacher"),
    ],
)
def test_miprov2_and_bootstrap_names_are_answered_with_their_meaning_here_not_a_close_spelling(name, value, said):
    """Regression: max_errors and max_rounds were answered "did you mean max_demos or max_iterations?", settings of
    another meaning, and teacher_settings "no argument is close to it"."""
    with pytest.raises(ConfigurationError) as refused:
        RLMDocstringOptimizer(rlm_autopilot="loop", sub_lm=echo_lm(), **{name: value})
    assert f"unexpected argument {name} (write nothing: " in str(refused.value) and said in str(refused.value)
    assert "did you mean" not in str(refused.value) and "no argument is close" not in str(refused.value)
