"""The program shapes and metric kinds DSPy users bring, each through a full compile() with the real sandbox
where the agent is involved: programs holding what cannot be deep-copied (dspy.Parallel, locks, clients, an
LM holding a lock), Refine and BestOfN, per-predictor LMs (and BetterTogether, which needs them), metrics on
any scale, metric identity on resume (a partial resumed in a new process, two lambdas refused), dspy's cache."""

from __future__ import annotations

import copy
import functools
import json
import threading
from pathlib import Path

import dspy
import pytest
from support.fakes import FunctionLM, ScriptedLM, last_user_text, scripted_agent
from support.metrics import Judge, weighted
from support.optimizing import FIX_AND_SUBMIT, compile_tickets, optimizer, proposer
from support.processes import run_script
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import ConfigurationError, RLMDocstringOptimizer, RunDirectoryMismatchError
from rlmoptimizer.evaluation.evaluator import Evaluator
from rlmoptimizer.evaluation.steps import StepNames
from rlmoptimizer.fingerprint import copy_program
from rlmoptimizer.metric import Metric, metric_identity
from rlmoptimizer.student import check_program

LOOK_AT_STEPS = {
    "reasoning": "which steps were traced",
    "code": "print('STEPS', sorted({s['step_name'] for e in baseline_train['examples'] for s in e['steps']}),\n"
    "      'PER_EXAMPLE', sorted({len(e['steps']) for e in baseline_train['examples']}),\n"
    "      'SCORE', baseline_train['score'], 'PASSED', baseline_train['passed_count'])",
}


def route_prompts(lm) -> list[str]:
    return [last_user_text(m) for m in lm.calls if last_user_text(m).startswith("[[ ## summary ## ]]")]


def ticket_prompts(lm) -> list[str]:
    return [last_user_text(m) for m in lm.calls if last_user_text(m).startswith("[[ ## ticket ## ]]")]


# -- programs holding what cannot be deep-copied ---------------------------------------------------------
class Client:
    """A provider client: holds a lock and a session, as HTTP clients do; cannot be deep-copied."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = 0


class LockedLM(FunctionLM):
    """An LM holding a lock, like a client-backed LM: ``copy.deepcopy`` fails on it."""

    __deepcopy__ = None  # back to the default deep copy, which cannot pickle the lock

    def __init__(self, fn, **kwargs):
        super().__init__(fn, **kwargs)
        self.client_lock = threading.Lock()


class ParallelRoute(dspy.Module):
    """Written the way DSPy's GEPA test writes its program: a dspy.Parallel held as an attribute."""

    def __init__(self):
        super().__init__()
        self.summarize = dspy.ChainOfThought("ticket -> summary")
        self.route = dspy.Predict("summary -> queue")
        self.parallel = dspy.Parallel(num_threads=2)
        self.lock = threading.Lock()
        self.client = Client()

    def forward(self, ticket):
        with self.lock:
            self.client.requests += 1
        summary = self.summarize(ticket=ticket).summary
        [prediction] = self.parallel([(self.route, {"summary": summary})])
        return prediction


def test_the_uncopyable_program_really_defeats_copy_deepcopy():
    program = ParallelRoute()
    program.route.set_lm(LockedLM(task_lm_reply))
    with pytest.raises(TypeError):
        copy.deepcopy(program)
    with pytest.raises(TypeError):
        copy.deepcopy(program.route)


def test_copy_program_copies_what_it_can_and_shares_the_rest_like_dspy():
    program = ParallelRoute()
    locked = LockedLM(task_lm_reply)
    program.route.set_lm(locked)
    program.extra = [dspy.Predict("a -> b"), threading.Lock()]  # a list dspy's own deepcopy would share whole

    copied = copy_program(program)

    originals = {id(p) for _, p in program.named_predictors()}
    assert [n for n, _ in copied.named_predictors()] == [n for n, _ in program.named_predictors()]
    assert not any(id(p) in originals for _, p in copied.named_predictors())
    assert copied.lock is program.lock and copied.parallel is not None
    assert copied.extra[1] is program.extra[1]
    assert copied.route.lm.client_lock is locked.client_lock  # shallow copy of the LM, as dspy makes it
    copied.route.signature = copied.route.signature.with_instructions("changed")
    copied.extra[0].signature = copied.extra[0].signature.with_instructions("changed too")
    assert program.route.signature.instructions != "changed"
    assert program.extra[0].signature.instructions != "changed too"


class Steps(list):
    """A container type copy_program cannot take apart (a list subclass holding a lock)."""


class Unsplittable(dspy.Module):
    def __init__(self):
        super().__init__()
        self.steps = Steps([dspy.Predict("question -> answer"), threading.Lock()])

    def forward(self, question):
        return self.steps[0](question=question)


def test_a_program_that_cannot_be_copied_apart_is_refused_before_any_lm_call(tmp_path):
    root, task = scripted_agent([FIX_AND_SUBMIT]), FunctionLM(lambda m: {"answer": "x"})
    trainset = [dspy.Example(question="q", answer="x").with_inputs("question")]
    with pytest.raises(ConfigurationError, match=r"cannot be copied without sharing its step\(s\) \['steps\[0\]'\]"):
        compile_tickets(
            root,
            eval_lm=task,
            run_storage_dir=tmp_path / "run",
            student=Unsplittable(),
            trainset=trainset,
            valset=None,
            metric=lambda e, p: 1.0,
        )
    assert root.calls == [] and task.calls == []
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_program_holding_parallel_a_lock_a_client_and_a_locked_lm_is_optimized_to_the_end():
    student = ParallelRoute()
    route_lm = LockedLM(task_lm_reply, name="router")
    student.route.set_lm(route_lm)
    task = FunctionLM(task_lm_reply, name="task")

    result = compile_tickets([LOOK_AT_STEPS, FIX_AND_SUBMIT], student=student, eval_lm=task, num_threads=2)

    assert result.selection["chosen_label"] == "submission"
    assert result.route.signature.instructions == POLICY_PROMPT
    assert student.route.signature.instructions != POLICY_PROMPT  # the caller's program is untouched
    assert "STEPS ['route', 'summarize.predict'] PER_EXAMPLE [2]" in result.agent_trajectory[0]["output"]
    # the route step ran with its own (locked) LM, everything else with eval_lm, as dspy runs it
    assert route_prompts(route_lm) and not route_prompts(task)
    assert ticket_prompts(task) and not ticket_prompts(route_lm)
    assert result.step_lms == {
        "summarize.predict": {"lm": "task", "source": "eval_lm"},
        "route": {"lm": "router", "source": "predictor.lm"},
    }
    with dspy.context(lm=task):  # the returned program still runs
        assert result(ticket="My bank opened a chargeback dispute.").queue == "disputes"


# -- Refine and BestOfN -------------------------------------------------------------------------------------
class Careful(dspy.Module):
    """BestOfN around the summary (three attempts, every one a copy), Refine around the routing step."""

    def __init__(self):
        super().__init__()
        self.summarize = dspy.BestOfN(
            dspy.ChainOfThought("ticket -> summary"), N=3, reward_fn=lambda args, pred: 0.0, threshold=1.0
        )
        self.route = dspy.Refine(dspy.Predict("summary -> queue"), N=2, reward_fn=lambda args, pred: 1.0, threshold=1.0)

    def forward(self, ticket):
        return self.route(summary=self.summarize(ticket=ticket).summary)


def test_refine_and_bestofn_calls_are_traced_under_their_step_names():
    program = Careful()
    assert [n for n, _ in program.named_predictors()] == ["summarize.module.predict", "route.module"]
    task = FunctionLM(task_lm_reply)
    evaluator = Evaluator(metric=Metric(metric), lm=task, num_threads=2)
    trainset, _ = make_splits()
    records = evaluator.evaluate(program, list(enumerate(trainset[:4])))
    assert all(r.error is None for r in records)
    for record in records:
        assert [s.step_name for s in record.steps] == ["summarize.module.predict", "route.module"]
        assert record.steps[1].inputs["summary"] == record.inputs["ticket"]
    assert len(ticket_prompts(task)) == 3 * 4  # BestOfN ran three copies per example


def test_a_call_is_matched_by_its_signature_when_the_predictor_was_rebuilt():
    class Rebuilds(dspy.Module):
        def __init__(self):
            super().__init__()
            self.answer = dspy.Predict("question -> answer")
            self.check = dspy.Predict("question, answer -> verdict")

        def forward(self, question):
            fresh = dspy.Predict(self.answer.signature)  # a new object, no tag: matched by what it is
            answer = fresh(question=question).answer
            return self.check(question=question, answer=answer)

    program = Rebuilds()
    names = StepNames(program)
    assert names.name(dspy.Predict(program.answer.signature)) == "answer"
    assert names.name(dspy.Predict("question -> answer")) == "answer"  # same fields and default instructions
    other = dspy.Predict(program.answer.signature.with_instructions("Something else."))
    assert names.name(other) is None
    records = Evaluator(
        metric=Metric(lambda e, p: 1.0), lm=FunctionLM(lambda m: {"answer": "a", "verdict": "ok"}), num_threads=1
    ).evaluate(program, [(0, dspy.Example(question="q").with_inputs("question"))])
    assert [s.step_name for s in records[0].steps] == ["answer", "check"]


def test_two_steps_with_the_same_signature_are_told_apart_in_copies():
    class Twice(dspy.Module):
        def __init__(self):
            super().__init__()
            self.first = dspy.Predict("question -> answer")
            self.second = dspy.Predict("question -> answer")

        def forward(self, question):
            return self.second(question=self.first(question=question).answer)

    program = dspy.BestOfN(Twice(), N=2, reward_fn=lambda a, p: 0.0, threshold=1.0)
    records = Evaluator(
        metric=Metric(lambda e, p: 1.0), lm=FunctionLM(lambda m: {"answer": "a"}), num_threads=1
    ).evaluate(program, [(0, dspy.Example(question="q").with_inputs("question"))])
    assert [s.step_name for s in records[0].steps] == ["module.first", "module.second"]


@pytest.mark.slow
def test_refine_and_bestofn_programs_give_the_agent_traces():
    submit = {"reasoning": "submit", "code": f"SUBMIT(optimized_dspy_program={{'route.module': {POLICY_PROMPT!r}}})"}
    result = compile_tickets([LOOK_AT_STEPS, submit], student=Careful(), num_threads=2)
    assert "STEPS ['route.module', 'summarize.module.predict'] PER_EXAMPLE [2]" in result.agent_trajectory[0]["output"]
    assert result.route.module.signature.instructions == POLICY_PROMPT
    assert result.selection["chosen_label"] == "submission"


# -- the offline LMs are full dspy LMs ------------------------------------------------------------------------
def test_function_lm_copies_share_the_function_and_the_call_log():
    lm = FunctionLM(lambda m: {"answer": "x"}, name="f")
    rollout = lm.copy(rollout_id=1, temperature=1.0)
    assert rollout.kwargs["rollout_id"] == 1 and rollout.kwargs["temperature"] == 1.0
    assert "rollout_id" not in lm.kwargs and lm.kwargs["temperature"] == 0.0
    assert rollout("hi") == ["[[ ## answer ## ]]\nx"]
    deep = copy.deepcopy(lm)
    assert deep is not lm and deep("hi") == ["[[ ## answer ## ]]\nx"]
    assert len(lm.calls) == 2  # one log for the LM and its copies
    lm.launch()
    lm.kill()


def test_a_saved_program_with_a_function_lm_pinned_says_how_to_load_it(tmp_path):
    """Regression: loading it failed with "FunctionLM.__init__() got an unexpected keyword argument 'model'"."""
    predict = dspy.Predict("question -> answer")
    predict.lm = FunctionLM(lambda m: {"answer": "x"}, name="pinned")
    predict.save(tmp_path / "p.json")
    with pytest.raises(TypeError, match=r"FunctionLM 'pinned' answers with a Python function.*predictor\.lm = None"):
        dspy.Predict("question -> answer").load(tmp_path / "p.json", allow_unsafe_lm_state=True)


def test_scripted_lm_copies_continue_one_script():
    lm = ScriptedLM([{"answer": "1"}, {"answer": "2"}, {"answer": "3"}])
    assert lm.copy(rollout_id=7)("a") == ["[[ ## answer ## ]]\n1"]
    assert copy.deepcopy(lm)("b") == ["[[ ## answer ## ]]\n2"]
    assert lm("c") == ["[[ ## answer ## ]]\n3"]
    assert lm.remaining == 0


def test_refine_and_bestofn_run_offline_with_the_testing_lms():
    lm = FunctionLM(lambda messages: {"answer": "4", "reasoning": "r"})
    with dspy.context(lm=lm, trace=[]):  # as dspy.configure leaves it (Refine/BestOfN extend the trace)
        best = dspy.BestOfN(
            dspy.ChainOfThought("question -> answer"),
            N=3,
            reward_fn=lambda args, pred: float(pred.answer == "5"),
            threshold=1.0,
        )
        assert best(question="2+2?").answer == "4"
        refine = dspy.Refine(
            dspy.Predict("question -> answer"),
            N=2,
            reward_fn=lambda args, pred: float(pred.answer == "4"),
            threshold=1.0,
        )
        assert refine(question="2+2?").answer == "4"
    assert len(lm.calls) == 3 + 1


# -- per-predictor LMs ----------------------------------------------------------------------------------------
def test_without_any_lm_compile_names_the_steps_that_have_none():
    student = RouteTicket()
    student.route.set_lm(FunctionLM(task_lm_reply))
    trainset, _ = make_splits()
    root = scripted_agent([FIX_AND_SUBMIT])
    with pytest.raises(ConfigurationError, match=r"\['summarize.predict'\] have no LM of their own.*set_lm"):
        compile_tickets(root, eval_lm=None, student=student, trainset=trainset, valset=None)
    assert root.calls == []


@pytest.mark.slow
def test_every_predictor_with_its_own_lm_needs_no_eval_lm():
    student = RouteTicket()
    summarizer, router = FunctionLM(task_lm_reply, name="summarizer"), FunctionLM(task_lm_reply, name="router")
    student.summarize.set_lm(summarizer)
    student.route.set_lm(router)

    result = compile_tickets([FIX_AND_SUBMIT], eval_lm=None, student=student, num_threads=2)

    assert result.route.signature.instructions == POLICY_PROMPT
    assert result.step_lms == {
        "summarize.predict": {"lm": "summarizer", "source": "predictor.lm"},
        "route": {"lm": "router", "source": "predictor.lm"},
    }
    assert len(ticket_prompts(summarizer)) >= 20 and not route_prompts(summarizer)
    assert len(route_prompts(router)) >= 20 and not ticket_prompts(router)
    stored = json.loads((Path(result.run_storage_dir) / "result.json").read_text())
    assert stored["step_lms"] == result.step_lms


@pytest.mark.slow
def test_better_together_runs_the_optimizer_on_a_program_with_per_predictor_lms():
    trainset, valset = make_splits()
    student = RouteTicket()
    lm = FunctionLM(task_lm_reply, name="student-lm")
    student.set_lm(lm)  # BetterTogether requires every predictor to have its LM
    inner = optimizer([FIX_AND_SUBMIT], eval_lm=None, max_iterations=1, metric=metric, num_threads=2)
    together = dspy.BetterTogether(metric=metric, p=inner)
    result = together.compile(student, trainset=trainset, valset=valset, strategy="p")
    assert result.route.signature.instructions == POLICY_PROMPT
    assert route_prompts(lm)


# -- metrics outside [0, 1] -------------------------------------------------------------------------------------
def five_point(example, prediction, trace=None):
    return 5.0 if metric(example, prediction) else 1.0


def test_negative_and_large_scores_are_kept_and_passed_by_the_threshold():
    def reward(gold, pred, trace=None, pred_name=None, pred_trace=None):  # GEPA style, a reward below zero
        return dspy.Prediction(score=2.0 if metric(gold, pred) else -1.0, feedback="ok")

    trainset, _ = make_splits()
    records = Evaluator(
        metric=Metric(reward), lm=FunctionLM(task_lm_reply), num_threads=2, pass_threshold=2.0
    ).evaluate(RouteTicket(), list(enumerate(trainset)))
    assert {r.score for r in records} == {2.0, -1.0}
    assert all(r.passed == (r.score == 2.0) for r in records)


@pytest.mark.slow
def test_a_zero_to_five_metric_is_optimized_on_its_own_scale():
    trainset, _ = make_splits()
    root = scripted_agent([LOOK_AT_STEPS, FIX_AND_SUBMIT])
    result = compile_tickets(root, pass_threshold=5, metric=five_point)

    baseline = [log for log in result.trial_logs if log["label"] == "baseline" and log["split"] == "train"][0]
    passed = baseline["passed_count"]
    assert 0 < passed < len(trainset)
    assert baseline["score"] == pytest.approx((5.0 * passed + 1.0 * (len(trainset) - passed)) / len(trainset))
    assert f"SCORE {baseline['score']!r} PASSED {passed}" in result.agent_trajectory[0]["output"].replace("\n", " ")
    assert result.selection["chosen_score"] == 5.0 > result.selection["baseline_score"] > 1.0
    assert "passes when its score is at least 5" in str(root.calls[0])


# -- metric identity on resume -------------------------------------------------------------------------------
IDENTITY = """
import functools
from dspy.evaluate import SemanticF1
from support.metrics import Judge, weighted
from rlmoptimizer.metric import metric_identity
print(metric_identity(functools.partial(weighted, weight=2.0)))
print(metric_identity(Judge(strict=True)))
print(metric_identity(SemanticF1(threshold=0.5)))
print(metric_identity(weighted))
"""


def test_metric_identity_is_the_same_in_a_new_process_and_differs_with_what_the_metric_computes(tmp_path):
    from dspy.evaluate import SemanticF1

    out = run_script(tmp_path, "identity", IDENTITY, PYTHONHASHSEED="123").splitlines()
    here = [
        metric_identity(functools.partial(weighted, weight=2.0)),
        metric_identity(Judge(strict=True)),
        metric_identity(SemanticF1(threshold=0.5)),
        metric_identity(weighted),
    ]
    assert out == here
    assert here[0].startswith("functools.partial(support.metrics.weighted)#")
    assert metric_identity(functools.partial(weighted, weight=3.0)) != here[0]
    assert metric_identity(Judge(strict=False)) != here[1]
    assert metric_identity(SemanticF1(threshold=0.7)) != here[2]
    first, second = (lambda e, p: 1.0), (lambda e, p: 0.0)  # noqa: E731
    assert metric_identity(first) != metric_identity(second)
    assert Metric(first, metric_id="exact-v1").identity == "exact-v1"
    with pytest.raises(ConfigurationError, match="metric_id"):
        Metric(first, metric_id="")


PARTIAL_RUN = """
import functools
from support.metrics import weighted
from support.optimizing import FIX_AND_SUBMIT, compile_tickets
compile_tickets([FIX_AND_SUBMIT], run_storage_dir={directory!r}, metric=functools.partial(weighted, weight=1.0))
"""


@pytest.mark.slow
def test_a_partial_metric_is_recognised_when_resumed_in_a_new_process(tmp_path):
    directory = tmp_path / "run"
    run_script(tmp_path, "first", PARTIAL_RUN.format(directory=str(directory)))
    assert (directory / "result.json").exists()

    root, task = scripted_agent([FIX_AND_SUBMIT]), FunctionLM(task_lm_reply)

    def again(metric_fn):
        return compile_tickets(root, eval_lm=task, run_storage_dir=directory, metric=metric_fn)

    result = again(functools.partial(weighted, weight=1.0))
    assert result.route.signature.instructions == POLICY_PROMPT
    assert root.calls == [] and task.calls == []  # the finished run was recognised: nothing asked again

    with pytest.raises(RunDirectoryMismatchError, match="metric") as info:
        again(functools.partial(weighted, weight=2.0))
    assert "metric_id='functools.partial(support.metrics.weighted)#" in str(info.value)
    assert root.calls == [] and task.calls == []


@pytest.mark.slow
def test_two_different_lambdas_are_refused_and_metric_id_overrides(tmp_path):
    trainset, valset = make_splits()
    root, task = scripted_agent([FIX_AND_SUBMIT]), FunctionLM(task_lm_reply)

    def run(metric_fn, **kwargs):
        opt = optimizer(root, eval_lm=task, run_storage_dir=tmp_path / "run")
        return opt.compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric_fn, **kwargs)

    run(lambda e, p: metric(e, p))
    calls = len(task.calls), len(root.calls)
    lenient = lambda e, p: 1.0  # noqa: E731
    with pytest.raises(RunDirectoryMismatchError) as info:
        run(lenient)
    message = str(info.value)
    stored = json.loads((tmp_path / "run" / "manifest.json").read_text())["metric"]
    assert f"recorded as {stored!r}" in message and f"pass metric_id={stored!r}" in message
    assert (len(task.calls), len(root.calls)) == calls  # refused before any LM call

    result = run(lenient, metric_id=stored)  # the user says it is the same metric: the stored result comes back
    assert result.route.signature.instructions == POLICY_PROMPT
    assert (len(task.calls), len(root.calls)) == calls


# -- dspy's cache and a fresh attempt ----------------------------------------------------------------------------
@pytest.mark.slow
def test_an_identical_compile_replays_from_dspys_cache_and_attempt_asks_again(tmp_path):
    from support.responses_server import ResponsesServer

    turns = [{"reasoning": "look", "code": "print(baseline_train['score'])"}, FIX_AND_SUBMIT]
    with ResponsesServer(turns) as server:

        def run(**kwargs):
            return compile_tickets(server.lm(cache=True), root_stateful_session=False, **kwargs)

        first = run()
        asked = len(server.requests)
        assert asked >= 2
        second = run()
        assert len(server.requests) == asked  # every agent turn came from dspy's cache
        assert second.optimized_dspy_program == first.optimized_dspy_program
        third = run(attempt=1)
        assert len(server.requests) == 2 * asked  # a fresh attempt: every turn asked again
        assert third.optimized_dspy_program == first.optimized_dspy_program
        run(attempt=1)
        assert len(server.requests) == 2 * asked  # and attempt 1 itself is reproducible


def test_attempt_must_be_a_whole_number():
    with pytest.raises(ConfigurationError, match="attempt must be an int >= 0"):
        RLMDocstringOptimizer(root_lm=scripted_agent([FIX_AND_SUBMIT]), attempt=-1)


def test_a_step_no_train_example_reaches_is_named_when_the_compile_ends(tmp_path, caplog):
    """A branch the train set never takes leaves its step nothing to learn from: the user is told which."""
    from support.qa import Triage, field

    def reply(messages):
        question = field(messages, "question")
        wanted = messages[0]["content"].split("Your output fields are:")[1].split("All interactions")[0]
        if "`team`" in wanted:  # train tickets ('q..') are billing's, validation tickets ('v..') tech's
            return {"team": "billing" if question.startswith("q") else "tech"}
        step = "billing_reply" if "`billing_reply`" in wanted else "tech_reply"
        return {step: question.split()[0].replace("q", "a").replace("v", "a")}

    train = [dspy.Example(question=f"q{i}", answer=f"a{i}").with_inputs("question") for i in range(6)]
    val = [dspy.Example(question=f"v{i}", answer=f"a{i}").with_inputs("question") for i in range(6)]
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        RLMDocstringOptimizer(
            lambda example, prediction, trace=None: float(example.answer == prediction.answer),
            max_metric_calls=30,
            rlm_autopilot="loop",
            sub_lm=FunctionLM(lambda m: json.dumps({"new_instruction": "Answer."})),
            eval_lm=FunctionLM(reply),
            num_threads=1,
            run_storage_dir=str(tmp_path / "run"),
        ).compile(Triage(), trainset=train, valset=val)
    warned = [r.getMessage() for r in caplog.records if "ran on none of the" in r.getMessage()]
    assert len(warned) == 1 and "Step(s) ['tech'] ran on none of the 6 train example(s)" in warned[0]


class MemoRoute(RouteTicket):
    """Keeps every answer on itself and gives it back when the ticket comes again, as a program with a cache does."""

    def __init__(self):
        super().__init__()
        self.memo = {}

    def forward(self, ticket):
        if ticket not in self.memo:
            self.memo[ticket] = super().forward(ticket)
        return self.memo[ticket]


def test_what_a_program_keeps_on_itself_never_carries_from_one_candidates_evaluation_to_another():
    """Regression: every candidate was evaluated on one shared working program, so a program that caches its answers
    gave each candidate the first evaluation's answers: every proposal scored as the unchanged program and nothing
    was adopted (dspy.GEPA, which builds a program per candidate, found the fix)."""
    student = MemoRoute()
    result = compile_tickets([], rlm_autopilot="loop", sub_lm=proposer(), student=student)
    assert result.selection["chosen_label"] != "baseline"
    assert result.selection["chosen_score"] > result.selection["baseline_score"]
    assert student.memo == {}  # the caller's program never ran


def test_a_predictor_inside_a_part_marked_compiled_is_never_taken_for_a_step(caplog):
    """Regression: a sub-module an earlier optimizer left compiled (``_compiled=True``: dspy's named_predictors()
    skips it) holding a predictor that reads like a step (same fields, default instructions) had its calls recorded
    as that step's, so the step's demos and failure analysis were built from another predictor's calls."""

    class Rewrite(dspy.Module):
        def __init__(self):
            super().__init__()
            self.p = dspy.Predict("question -> answer")

        def forward(self, question):
            return self.p(question=question)

    class Outer(dspy.Module):
        def __init__(self):
            super().__init__()
            self.inner = Rewrite()
            self.inner._compiled = True
            self.post = dspy.Predict("question -> answer")

        def forward(self, question):
            return self.post(question=self.inner(question=question).answer)

    program = Outer()
    assert [name for name, _ in program.named_predictors()] == ["post"]
    with caplog.at_level("WARNING"):
        check_program(program)
    assert "self.inner of Outer is marked compiled" in caplog.text and "_compiled = False" in caplog.text
    names = StepNames(program)
    assert names.name(program.inner.p) is None and names.name(program.post) == "post"

    def reply(messages):
        question = last_user_text(messages).split("[[ ## question ## ]]", 1)[1].split("Respond", 1)[0].strip()
        return {"answer": question if question.startswith("mid-") else f"mid-{question}"}

    records = Evaluator(metric=Metric(lambda e, p: 1.0), lm=FunctionLM(reply), num_threads=1).evaluate(
        program, [(0, dspy.Example(question="q").with_inputs("question"))]
    )
    assert [(s.step_name, s.inputs) for s in records[0].steps] == [("post", {"question": "mid-q"})]


def test_a_step_named_as_a_steps_demos_are_is_refused_before_any_lm_call():
    """Regression: a predictor stored as ``route:demos`` beside ``route`` had its instructions read as the demos of
    ``route``, and compile() stopped with a message about demos JSON and advice to resume, which could not help."""

    class Program(dspy.Module):
        def __init__(self):
            super().__init__()
            self.route = dspy.Predict("q -> answer")
            setattr(self, "route:demos", dspy.Predict("q -> answer"))

        def forward(self, q):
            return self.route(q=q)

    lm = FunctionLM(lambda messages: {"answer": "a"})
    trainset = [dspy.Example(q="x", answer="a").with_inputs("q")]
    with pytest.raises(ConfigurationError, match=r"step\(s\) \['route:demos'\] end in ':demos'.*Rename"):
        RLMDocstringOptimizer(rlm_autopilot="loop", sub_lm=lm, eval_lm=lm).compile(
            Program(), trainset=trainset, metric=lambda e, p, trace=None: 1.0
        )
    assert lm.calls == []


def test_the_returned_program_carries_no_second_copy_of_the_student_and_its_candidates_no_results(tmp_path):
    """Regression: ``detailed_results`` held a deep copy of the student, so the returned program pickled with twice
    the student's state (and four times once its candidates were read), kept an LM the user had removed from every
    step (API key and all) and a lock that failed ``save(save_program=True)``; optimizing a returned program again
    nested every earlier run's results, and its candidates carried the previous run's attributes."""
    import cloudpickle
    import numpy as np
    from support.optimizing import loop_optimizer

    import rlmoptimizer

    student = RouteTicket()
    student.index = np.zeros(250_000)  # 2 MB of the program's own state (an embedding index)
    student.route.lm = FunctionLM(task_lm_reply)  # an LM pinned to a step, with its key
    student.route.lm.kwargs["api_key"] = "sk-SECRET-123"
    train, val = make_splits()
    optimized = loop_optimizer(tmp_path / "first").compile(student, trainset=train, valset=val)
    assert optimized.detailed_results.program is optimized
    candidate = optimized.detailed_results.candidates[-1]  # built now, and kept on the results
    assert candidate.index is not optimized.index and np.array_equal(candidate.index, optimized.index)
    assert not any(hasattr(candidate, name) for name in ("detailed_results", "selection", "agent_trajectory"))
    student.route.lm = None
    size = len(cloudpickle.dumps(student))
    optimized.route.lm = None  # to ship it: the LM comes from where it is loaded
    pickled = cloudpickle.dumps(optimized)
    assert len(pickled) < size + 200_000  # the state once, with the results beside it
    assert b"sk-SECRET-123" not in pickled  # an LM taken off every step is not saved
    alone = rlmoptimizer.without_results(optimized)  # what loads where rlmoptimizer is not installed
    assert b"rlmoptimizer.report" in pickled and b"rlmoptimizer.report" not in cloudpickle.dumps(alone)  # our classes
    assert alone.route.signature.instructions == optimized.route.signature.instructions
    assert not hasattr(alone, "detailed_results") and hasattr(optimized, "detailed_results")

    again = loop_optimizer(tmp_path / "second").compile(optimized, trainset=train, valset=val)
    assert again.detailed_results.program is again and again.run_storage_dir.endswith("second")
    for built in (*again.detailed_results.candidates, again.candidate_programs[0]["program"]):
        assert not hasattr(built, "detailed_results") and not hasattr(built, "run_storage_dir")
    assert len(cloudpickle.dumps(again)) < size + 200_000  # no earlier run's results nested inside


def test_a_copy_leaves_out_the_result_attributes_and_never_takes_them_off_the_original():
    """Regression (review): the copy was made from a shallow copy with the results taken off; a program whose
    ``__getstate__`` hands over its own ``__dict__`` shared it, so reading the candidates of a returned program took
    its results off the user's program."""
    from rlmoptimizer.fingerprint import RESULTS_MARK

    class SharesItsState(dspy.Module):
        def __init__(self):
            super().__init__()
            self.answer = dspy.Predict("q -> a")

        def __getstate__(self):
            return self.__dict__

        def __setstate__(self, state):
            self.__dict__ = state

        def forward(self, q):
            return self.answer(q=q)

    program = SharesItsState()
    program.selection = {"chosen_score": 1.0}
    program.__dict__[RESULTS_MARK] = frozenset({"selection"})
    copied = copy_program(program)
    assert not hasattr(copied, "selection") and RESULTS_MARK not in copied.__dict__
    assert program.selection == {"chosen_score": 1.0} and RESULTS_MARK in program.__dict__
    assert copied.answer is not program.answer
