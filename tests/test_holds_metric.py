"""A broken metric and a run directory that cannot be one, as a careless user meets them.

Regressions: a metric returning None got its clear MetricError only once the sandbox had finished starting (a
minute on a loaded machine), and its advice ("run compile() again with the same run_storage_dir to resume") failed
with RunDirectoryMismatchError once the metric was fixed; ``run_storage_dir`` naming a file gave a raw
FileExistsError."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import types
from types import SimpleNamespace

import dspy
import pytest
from support.optimizing import POLICY_PROMPT, TURNS, compile_tickets, proposer
from support.tickets import RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import ConfigurationError, EvaluationLMError, MetricError, ProgramError
from rlmoptimizer.errors import SandboxError
from rlmoptimizer.sandbox import session as session_module
from rlmoptimizer.testing import FunctionLM


def scores_none_at_first(example, prediction, trace=None):
    """The ticket metric with the bug a careless user writes: no score on one code path."""
    if example.queue == "security":
        return None
    return metric(example, prediction, trace)


def test_a_broken_metric_stops_the_compile_without_waiting_for_the_sandbox_start(monkeypatch, tmp_path):
    """Regression: compile() waited for the sandbox to finish starting before it raised the MetricError of the
    baseline. The start still running is cut short: its process is killed, not waited for."""
    started: list[subprocess.Popen] = []

    def slow_start(self, command, workdir, memory_limit_mb, start_timeout_s, deno_dir=None):
        # a start that takes far longer than the baseline: it ends early only if its process is killed
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        started.append(child)
        self.interp = types.SimpleNamespace(deno_process=child)
        child.wait()
        self.interp = None
        raise SandboxError("the start was cut short")

    monkeypatch.setattr(session_module.Session, "start", slow_start)
    with pytest.raises(MetricError, match="returned None"):
        compile_tickets(TURNS, metric=scores_none_at_first, run_storage_dir=tmp_path / "run")
    assert len(started) == 1
    assert started[0].returncode == -signal.SIGKILL  # killed by the compile's end, not finished on its own


@pytest.mark.slow
def test_the_advice_of_a_metric_error_works_once_the_metric_is_fixed(tmp_path):
    """Regression: the MetricError said "run compile() again with the same run_storage_dir to resume", which then
    failed with RunDirectoryMismatchError ("a different metric") once the metric was fixed."""
    directory = tmp_path / "run"
    with pytest.raises(MetricError) as raised:
        compile_tickets(TURNS, metric=scores_none_at_first, run_storage_dir=directory)
    advice = str(raised.value)
    assert "to resume where it stopped" not in advice
    assert "run compile() with a new run_storage_dir" in advice
    stored_id = advice.split("pass metric_id=")[1].split(" ")[0].strip("'")
    # either way the advice gives works with the fixed metric
    fresh = compile_tickets(TURNS, metric=metric, run_storage_dir=tmp_path / "new")
    resumed = compile_tickets(TURNS, metric=metric, run_storage_dir=directory, metric_id=stored_id)
    assert resumed.optimized_dspy_program == fresh.optimized_dspy_program


def test_a_run_storage_dir_that_is_a_file_is_a_configuration_error(tmp_path):
    """Regression: ``run_storage_dir`` naming an existing file gave a raw FileExistsError."""
    path = tmp_path / "results.json"
    path.write_text("{}")
    with pytest.raises(ConfigurationError, match="is a file, not a directory"):
        compile_tickets(TURNS, run_storage_dir=path)
    with pytest.raises(ConfigurationError, match="cannot be created"):
        compile_tickets(TURNS, run_storage_dir=path / "inside")
    assert path.read_text() == "{}"


def test_run_storage_dirs_that_cannot_be_used_are_configuration_errors_that_say_why(tmp_path):
    """Regression: a symlink to nowhere was "cannot be created (FileExistsError)", a path past the system's limit a
    raw OSError, and a run directory whose runs/ folder had become a file a raw FileExistsError."""
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    with pytest.raises(ConfigurationError, match="is a symlink to .*which does not exist"):
        compile_tickets([], rlm_autopilot="loop", run_storage_dir=tmp_path / "dangling")
    too_long = tmp_path.joinpath(*["c" * 250] * 20)
    with pytest.raises(ConfigurationError, match="cannot be used"):
        compile_tickets([], rlm_autopilot="loop", run_storage_dir=too_long)
    directory, loop = tmp_path / "run", {"rlm_autopilot": "loop", "max_metric_calls": 40, "sub_lm": proposer()}
    compile_tickets([], run_storage_dir=directory, **loop)
    shutil.rmtree(directory / "runs")
    (directory / "runs").write_text("not a folder")
    with pytest.raises(ConfigurationError, match="is not what a compile left there"):
        compile_tickets([], run_storage_dir=directory, **loop)


def test_a_metric_that_raises_the_same_error_on_every_example_stops_the_compile_at_its_baseline(tmp_path):
    """Regression: a metric with a typo (an attribute the examples do not have) raised on every example; each one
    became a record scoring 0, and the loop spent the budget and sub-LM prompts on "failures" no instructions could
    fix, then returned the unchanged program without a word about the error."""

    def typo(example, prediction, trace=None):
        return float(example.label == prediction.queue)  # the ticket examples have `queue`, not `label`

    eval_lm, sub_lm = FunctionLM(task_lm_reply), FunctionLM(lambda messages: "{}", name="sub")
    with pytest.raises(MetricError) as raised:
        compile_tickets(
            [], metric=typo, eval_lm=eval_lm, sub_lm=sub_lm, rlm_autopilot="loop", run_storage_dir=tmp_path / "run"
        )
    message = str(raised.value)
    train_size = len(make_splits()[0])  # the first baseline
    assert f"the metric raised on every one of the {train_size} train example(s)" in message
    assert "AttributeError" in message and "label" in message  # the error itself, as the metric raised it
    assert "run compile() with a new run_storage_dir" in message  # what to do once it is fixed
    assert len(eval_lm.calls) == 2 * train_size  # that baseline only (two steps an example); nothing after it
    assert sub_lm.calls == []
    # the traceback shows the message once (the metric's error is in it): none of our copies of it along the way
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_a_metric_that_raises_on_every_example_is_warned_of_and_stops_the_compile(caplog):
    """Regression: a metric reading a table the user left empty raised on every example, one message an example,
    without a word: the loop spent its budget on scores of 0 and returned the unchanged program. Now a warning says
    so at the baseline, and the compile stops once other instructions have not changed it."""

    def table(example, prediction, trace=None):
        return {}[example.ticket[:12]]  # KeyError naming each example's own ticket

    with caplog.at_level("WARNING", logger="rlmoptimizer"), pytest.raises(MetricError) as raised:
        compile_tickets(
            [],
            metric=table,
            sub_lm=proposer(*(f"Route by the policy, rule {i}." for i in range(12))),  # a new text each time
            rlm_autopilot="loop",
            max_metric_calls=60,
        )
    warned = [r.getMessage() for r in caplog.records if "The metric raised on every one" in r.getMessage()]
    assert len(warned) == 1 and "no change can show a gain" in warned[0] and "KeyError" in warned[0]
    assert "evaluated candidates with other instructions" in str(raised.value)


def test_the_metric_called_again_on_the_expected_answer_is_charged_to_the_budget():
    """Regression: to tell a metric bug from wrong answers, the metric was called once more, on the expected answer,
    outside the budget: max_metric_calls was exceeded by one (an LM-judge metric pays for that call)."""
    calls = []

    def strict(example, prediction, trace=None):
        calls.append(1)
        if prediction.queue != example.queue:
            raise KeyError("no rubric for a wrong queue")  # the same error on every wrong answer
        return 1.0

    wrong = FunctionLM(lambda messages: {**task_lm_reply(messages), "queue": "nowhere"}, name="wrong")
    result = compile_tickets([], metric=strict, eval_lm=wrong, rlm_autopilot="loop", max_metric_calls=40)
    _, val = make_splits()
    assert len(calls) == result.budget["spent"] + len(val) <= 40  # the probe is counted, and within the budget


def test_a_metric_error_without_a_cause_of_the_metrics_own_is_raised_once():
    """Regression: a metric returning None gave a 48-line traceback that repeated the same message three times."""
    with pytest.raises(MetricError, match="returned None") as raised:
        compile_tickets([], metric=lambda example, prediction, trace=None: None, rlm_autopilot="loop")
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_a_metric_that_raises_only_on_some_examples_does_not_stop_the_compile_and_is_named_in_a_warning(caplog):
    """Regression: a metric raising on a quarter of the examples scored them 0 without a word (dspy.Evaluate logs
    each such error)."""

    def partly(example, prediction, trace=None):
        if example.queue == "security":
            raise KeyError("no rubric for security yet")
        return metric(example, prediction)

    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        result = compile_tickets([], metric=partly, rlm_autopilot="loop", max_metric_calls=60)
    assert result.selection["baseline_score"] is not None
    train, val = make_splits()
    raised = sum(1 for example in val if example.queue == "security")
    assert 0 < raised < len(val)
    warned = [r.getMessage() for r in caplog.records if "The metric raised on" in r.getMessage()]
    assert len(warned) == 1  # the validation baseline's (the train one is paid when read, under max_metric_calls)
    assert f"raised on {raised} of the {len(val)} val example(s)" in warned[0]
    assert "no rubric for security yet" in warned[0] and "scores 0" in warned[0]


def test_a_metric_that_never_raises_is_not_warned_about(caplog):
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets([], rlm_autopilot="loop", max_metric_calls=60)
    assert not [r for r in caplog.records if "The metric raised on" in r.getMessage()]


def test_a_program_that_raises_the_same_error_whatever_its_instructions_stops_after_three_tries_a_step(
    caplog, tmp_path
):
    """The error may be the program's code (no instructions fix it) or what the LM answers (they may): the run goes
    on with a warning, and once three evaluations with other instructions for the step that ran raised it again on
    every example, ProgramError stops it (regression: a loop-mode run spent 174 of 188 units on a program that
    could never run). What was paid is kept in the run directory."""

    class Broken(RouteTicket):
        def forward(self, ticket):
            self.summarize(ticket=ticket)
            raise RuntimeError("forgot to return the prediction")

    eval_lm = FunctionLM(task_lm_reply)
    with caplog.at_level("WARNING", logger="rlmoptimizer"), pytest.raises(ProgramError) as stopped:
        compile_tickets(
            [],
            student=Broken(),
            rlm_autopilot="loop",
            max_metric_calls=80,
            eval_lm=eval_lm,
            sub_lm=proposer("Route the ticket to its queue.", "Summarize the ticket.", "Say what the ticket asks."),
            run_storage_dir=tmp_path,
        )
    warned = [r.getMessage() for r in caplog.records if "The program raised on every one of" in r.getMessage()]
    assert len(warned) == 1 and "RuntimeError: forgot to return the prediction" in warned[0]
    message = str(stopped.value)
    assert (
        "at least 3 different ones for each step that ran" in message
        and "RuntimeError: forgot to return the prediction" in message
    )
    assert "error in the program's code" in message and "catch it there" in message
    assert str(tmp_path) in message  # where the paid work is
    runs = [json.loads(f.read_text()) for f in sorted((tmp_path / "runs").glob("run-*.json"))]
    tried = [r for r in runs if r["instructions"]["summarize.predict"] != runs[0]["instructions"]["summarize.predict"]]
    assert len(tried) == 3  # the step that ran, three times; then it stopped
    train, val = make_splits()
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert ledger["spent"] < 80 // 2  # minibatches, not the budget
    assert len(eval_lm.calls) == len(val) + ledger["spent"]  # one LM call an example (the first step), then none


def test_an_error_that_the_third_proposal_for_its_step_makes_go_away_does_not_stop_the_run(tmp_path):
    """One error on every baseline example that depends on what the LM answers (the program's own check of its
    label): two proposals for the step that decides it leave it, the third fixes it, so the run goes on and returns
    the fix (regression: the first evaluation with other instructions that raised it again stopped the run)."""

    class Strict(RouteTicket):
        def forward(self, ticket):
            prediction = super().forward(ticket=ticket)
            if "policy" not in self.route.signature.instructions.lower():  # the answers the instructions lead to
                raise ValueError("not a known queue")
            return prediction

    sub_lm = proposer("Route the ticket.", "Route each ticket.", "Queue it.", "Queue it well.", POLICY_PROMPT)
    result = compile_tickets(
        [], student=Strict(), rlm_autopilot="loop", max_metric_calls=80, sub_lm=sub_lm, run_storage_dir=tmp_path
    )
    runs = [json.loads(f.read_text()) for f in sorted((tmp_path / "runs").glob("run-*.json"))]
    routes = [r["instructions"]["route"] for r in runs if r["split"] == "train"]
    assert routes.index(POLICY_PROMPT) > routes.index("Queue it well.") > routes.index("Route each ticket.")
    assert result.selection["baseline_score"] == 0.0 and result.selection["chosen_score"] > 0.5


def test_a_program_that_raises_on_every_example_with_messages_that_differ_is_named_in_a_warning(caplog):
    """Regression: the warning needed one and the same message on every example; an error that names its input (a
    KeyError of a lookup, most errors do) raised on all of them and the run went on without a word."""

    class Lookup(RouteTicket):
        def forward(self, ticket):
            self.summarize(ticket=ticket)
            return {"queue": {}[ticket[:20]]}

    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets([], student=Lookup(), rlm_autopilot="loop", max_metric_calls=40)
    warned = [r.getMessage() for r in caplog.records if "The program raised on every one of" in r.getMessage()]
    assert len(warned) == 1 and "(KeyError on " in warned[0] and "the first: KeyError: " in warned[0]
    assert "Ctrl-C keeps what was paid" in warned[0]


def test_a_metric_that_fails_on_every_answer_the_lm_gives_but_not_on_the_expected_one_does_not_stop_the_run():
    """The same error on every example, but caused by what the program answers (here: a label the metric cannot
    look up): other instructions may fix it, so it is data for the optimizer, not a stop."""
    ranks = {queue: i for i, queue in enumerate(["billing", "bug", "how-to", "security"])}

    def strict(example, prediction, trace=None):
        return float(ranks[prediction.queue] == ranks[example.queue])  # KeyError on any label it does not know

    eval_lm = FunctionLM(lambda messages: {"summary": "s", "reasoning": "r", "queue": "Billing Team"})
    result = compile_tickets([], metric=strict, eval_lm=eval_lm, rlm_autopilot="loop", max_metric_calls=40)
    assert result.selection["baseline_score"] == 0.0  # every example failed with KeyError: 'Billing Team'


def test_outputs_that_never_parse_are_left_to_the_optimizer():
    """Every example failing to parse is what other instructions may fix: not a program error."""
    result = compile_tickets(
        [], eval_lm=FunctionLM(lambda messages: "no fields at all"), rlm_autopilot="loop", max_metric_calls=60
    )
    assert result.selection["baseline_score"] == 0.0


def test_a_pass_threshold_above_a_0_1_metrics_scale_is_warned_about(caplog):
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets([], rlm_autopilot="loop", max_metric_calls=40, pass_threshold=2)
    warned = [r.getMessage() for r in caplog.records if "pass_threshold=2" in r.getMessage()]
    assert len(warned) == 1 and "leave pass_threshold at 1" in warned[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets([], rlm_autopilot="loop", max_metric_calls=40)
    assert not [r for r in caplog.records if "pass_threshold" in r.getMessage()]


def test_a_metric_whose_best_score_is_below_the_pass_threshold_is_warned_about(caplog):
    """Regression: a metric scoring 0 for right and -1 for wrong, with pass_threshold left at 1, had every example
    fail without a word: the loop reflected on right answers and could make no demos."""

    def penalty(example, prediction, trace=None):
        return metric(example, prediction) - 1.0

    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets([], metric=penalty, rlm_autopilot="loop", max_metric_calls=40)
    warned = [r.getMessage() for r in caplog.records if "all at most 0" in r.getMessage()]
    assert len(warned) == 1 and "from -1.0 to 0.0" in warned[0] and "pass pass_threshold=" in warned[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets([], metric=penalty, rlm_autopilot="loop", max_metric_calls=40, pass_threshold=0)
    assert not [r for r in caplog.records if "all at most 0" in r.getMessage()]


class NoChoices(dspy.BaseLM):
    """A provider that answers every request with an empty ``choices`` list (dspy makes an empty prediction)."""

    def __init__(self):
        super().__init__(model="no-choices")

    def forward(self, prompt=None, messages=None, **kwargs):
        return SimpleNamespace(choices=[], usage={"prompt_tokens": 1, "completion_tokens": 0}, model="no-choices")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_evaluation_lm_that_answers_with_no_choices_is_warned_about(caplog):
    """Regression: every example got an empty prediction, was charged and scored 0, and nothing said why."""
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets(
            [], student=dspy.Predict("ticket -> queue"), eval_lm=NoChoices(), rlm_autopilot="loop", max_metric_calls=40
        )
    warned = [r.getMessage() for r in caplog.records if "no output field at all" in r.getMessage()]
    assert warned and "answered with no choices" in warned[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets([], rlm_autopilot="loop", max_metric_calls=40)  # an LM that answers: not a word of it
    assert not [r for r in caplog.records if "no output field at all" in r.getMessage()]


def five_or_two(example, prediction, trace=None):  # a 0-5 judge: a wrong answer still scores 2
    return 5.0 if metric(example, prediction) else 2.0


def test_a_metric_above_1_with_the_default_pass_threshold_is_refused_when_every_example_passes(tmp_path):
    """Regression: with a 0-5 judge and pass_threshold left at 1, every example passed, GEPA drew only passing
    minibatches, and compile() returned the unchanged program with no word of why."""
    with pytest.raises(ConfigurationError) as refused:
        compile_tickets(
            [], metric=five_or_two, rlm_autopilot="loop", max_metric_calls=40, run_storage_dir=tmp_path / "run"
        )
    message = str(refused.value)
    assert "scores up to 5" in message and "pass_threshold=1" in message and "pass_threshold=5" in message
    assert "every example passes" in message and str(tmp_path / "run") in message
    # the baseline it paid for is kept: the same directory with the threshold on the metric's scale goes on
    result = compile_tickets(
        [],
        metric=five_or_two,
        rlm_autopilot="loop",
        max_metric_calls=40,
        run_storage_dir=tmp_path / "run",
        pass_threshold=5,
    )
    assert result.selection["baseline_score"] < 5.0
    baselines = [log for log in result.trial_logs if log["label"] == "baseline"]
    assert [log["run_id"] for log in baselines] == ["run-0001"]  # the one it paid for, not run again


def test_a_metric_above_1_is_warned_about_when_some_examples_still_fail_and_a_1_to_5_judge_is_not(caplog):
    def zero_or_five(example, prediction, trace=None):
        return 5.0 if metric(example, prediction) else 0.0

    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets([], metric=zero_or_five, rlm_autopilot="loop", max_metric_calls=40)
    warned = [r.getMessage() for r in caplog.records if "scores up to 5" in r.getMessage()]
    assert len(warned) == 1 and "pass_threshold=5" in warned[0]

    def weak_one_to_five(example, prediction, trace=None):  # a weak start under a 1-5 judge scores 1 everywhere
        return 1.0

    caplog.clear()
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets([], metric=weak_one_to_five, rlm_autopilot="loop", max_metric_calls=40, pass_threshold=5)
    assert not [r for r in caplog.records if "pass_threshold" in r.getMessage()]


def test_an_example_that_raised_counts_as_failing_so_a_judge_above_1_is_only_warned_about(caplog):
    _, val = make_splits()

    def judge(example, prediction, trace=None):
        if example.ticket == val[0].ticket:
            raise ValueError("the judge could not read this one")
        return five_or_two(example, prediction)

    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets([], metric=judge, rlm_autopilot="loop", max_metric_calls=40)
    warned = [r.getMessage() for r in caplog.records if "scores up to 5" in r.getMessage()]
    assert len(warned) == 1 and f"{len(val) - 1} of {len(val)} pass" in warned[0]


def test_an_evaluation_lm_whose_outputs_never_parse_is_named_not_taken_for_passing_minibatches(caplog):
    """Regression: with every output unparsable, no warning came, GEPA's stop said the minibatches drawn already
    pass, and the run returned the unchanged program (scoring 0) with no word of the format."""
    garbage = FunctionLM(lambda messages: "I think it is billing.", name="garbage")
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        result = compile_tickets([], eval_lm=garbage, rlm_autopilot="loop", max_metric_calls=40, num_threads=1)
    warned = [r.getMessage() for r in caplog.records if "gave an output that parses" in r.getMessage()]
    assert len(warned) == 1 and "AdapterParseError" in warned[0] and "JSONAdapter" in warned[0]
    said = " ".join(turn["output"] for turn in result.agent_trajectory)
    assert "already pass" not in said or "did not parse" in said
    assert result.selection["chosen_label"] == "baseline"


def test_a_small_compile_whose_evaluation_lm_is_down_stops_with_an_outage(tmp_path):
    """Regression: with fewer examples than the outage streak (8), an evaluation LM answering 503 on every call was
    never told apart from a hard task: the compile ran its whole budget of failures and returned the unchanged
    program. Every example the compile has, unanswered, is an outage."""

    def unavailable(messages):
        error = dspy.LMServerError("503 Service Unavailable", model="fake", status=503)
        error.retry_after = 0.01  # as a server's Retry-After header says
        return error

    down = FunctionLM(unavailable)
    down.num_retries = 0
    train, val = make_splits()
    with pytest.raises(EvaluationLMError) as raised:
        compile_tickets(
            [], trainset=train[:3], valset=val[:3], eval_lm=down, rlm_autopilot="loop", run_storage_dir=tmp_path
        )
    assert "no answer on 6 different examples in a row" in str(raised.value)  # both baselines, all there is
    assert "503 Service Unavailable" in str(raised.value) and str(tmp_path) in str(raised.value)


def test_an_error_on_every_train_example_that_validation_does_not_raise_never_stops_the_run(caplog, tmp_path):
    """The train baseline raises one error on every example, the validation baseline on none (the error depends on
    the examples, not on the code alone): tries with other instructions that raise it again on train are no evidence
    against the program, so the run goes on to the end (regression: the check was set from the train baseline and
    never cleared by the validation one)."""
    train, _ = make_splits()
    train_tickets = {example.ticket for example in train}

    class TrainOnly(RouteTicket):
        def forward(self, ticket):
            prediction = super().forward(ticket=ticket)
            if ticket in train_tickets:
                raise ValueError("a ticket of the first batch")
            return prediction

    sub_lm = proposer("Route the ticket.", "Route each ticket.", "Queue it.", "Queue it well.")
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets(
            [],
            student=TrainOnly(),
            rlm_autopilot="loop",
            max_iterations=None,
            max_metric_calls=None,
            sub_lm=sub_lm,
            run_storage_dir=tmp_path,
        )
    assert [r for r in caplog.records if "always with ValueError: a ticket of the first batch" in r.getMessage()]
    runs = [json.loads(f.read_text()) for f in sorted((tmp_path / "runs").glob("run-*.json"))]
    first = runs[0]["instructions"]
    tried = [r for r in runs if r["split"] == "train" and len(r["records"]) >= 3 and r["instructions"] != first]
    assert all(record["error"] for run in tried for record in run["records"])
    assert len(tried) >= 6  # more tries than would have stopped it
