"""Nothing paid for is lost: runs stopped by a fault resume without paying twice; a run directory of
another compile is refused; systemic faults stop the run with an error that says where the state is."""

from __future__ import annotations

import _thread
import json
import signal
import threading
import time

import dspy
import pytest
from support.fakes import FunctionLM, scripted_agent
from support.optimizing import TURNS, compile_in, dies_after, killed_in_validation_script
from support.processes import kill_group, start_script, wait_for_file
from support.tickets import POLICY_PROMPT, make_splits, metric, task_lm_reply

from rlmoptimizer import (
    EvaluationLMError,
    OptimizationInterrupted,
    RunDirectoryMismatchError,
)
from rlmoptimizer.storage.run_store import RunStore

pytestmark = pytest.mark.slow  # every test here runs compile() with a real sandbox


def files(directory, sub):
    return sorted(p.name for p in (directory / sub).glob("*.json"))


def test_a_run_stopped_by_a_dead_root_lm_resumes_without_paying_twice(tmp_path):
    first_task = FunctionLM(task_lm_reply)
    with pytest.raises(OptimizationInterrupted) as stopped:
        compile_in(tmp_path, dies_after(2, dspy.LMAuthError("invalid api key")), first_task)
    assert str(tmp_path) in str(stopped.value) and "resume" in str(stopped.value)
    assert isinstance(stopped.value.__cause__, dspy.LMAuthError)

    # on disk: both baselines, the agent's re-run of the 2 failures, its prompt version, 2 turns, the ledger
    assert files(tmp_path, "runs") == ["run-0001.json", "run-0002.json", "run-0003.json"]
    assert files(tmp_path, "turns") == ["turn-0001.json", "turn-0002.json"]
    assert json.loads((tmp_path / "prompts" / "v-0001.json").read_text())["text"] == POLICY_PROMPT
    assert json.loads((tmp_path / "ledger.json").read_text())["spent"] == 2
    assert not list(tmp_path.rglob("*.tmp"))

    second_task = FunctionLM(task_lm_reply)
    root = scripted_agent(TURNS)
    result = compile_in(tmp_path, root, second_task)

    # the agent got its trajectory back and went on with turn 3
    assert "=== Step 2 ===" in str(root.calls[0]) and "resumed" in str(root.calls[0])
    assert [t["code"] for t in result.agent_trajectory[:2]] == [t["code"] for t in TURNS[:2]]
    assert len(result.agent_trajectory) == 4
    # no baseline again, nothing evaluated twice: only the validation check of turn 3 ran (2 LM calls each)
    assert len(second_task.calls) == 2 * len(make_splits()[1])
    assert result.budget["spent"] == 2 + len(make_splits()[1])
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT
    assert len(files(tmp_path, "prompts")) == 1


def test_a_finished_run_directory_returns_its_result_without_new_calls(tmp_path):
    first = compile_in(tmp_path, TURNS, FunctionLM(task_lm_reply))
    root, task = scripted_agent(TURNS), FunctionLM(task_lm_reply)
    again = compile_in(tmp_path, root, task)
    assert root.calls == [] and task.calls == []
    assert again.optimized_dspy_program == first.optimized_dspy_program
    assert again.budget == first.budget


def test_a_run_directory_of_another_compile_is_refused(tmp_path):
    compile_in(tmp_path, TURNS, FunctionLM(task_lm_reply))
    trainset, valset = make_splits()
    with pytest.raises(RunDirectoryMismatchError, match="trainset"):
        compile_in(tmp_path, TURNS, FunctionLM(task_lm_reply), trainset=trainset[:-1])

    def other_metric(example, prediction, trace=None):
        return 1.0

    with pytest.raises(RunDirectoryMismatchError, match="metric"):
        compile_in(tmp_path, TURNS, FunctionLM(task_lm_reply), metric=other_metric)


def test_an_unusable_evaluation_lm_stops_the_run_and_charges_nothing_for_it(tmp_path):
    calls = {"n": 0}
    lock = threading.Lock()

    def task_reply(messages):
        with lock:  # the evaluation threads call at once: an unlocked += loses counts under load
            calls["n"] += 1
            revoked = calls["n"] > 2 * 20  # both baselines (20 examples, 2 calls each) work, then the key is revoked
        if revoked:
            return dspy.LMAuthError("key revoked")
        return task_lm_reply(messages)

    with pytest.raises(EvaluationLMError, match="unusable") as stopped:
        compile_in(tmp_path, TURNS, FunctionLM(task_reply), num_threads=8)
    assert "key revoked" in str(stopped.value) and str(tmp_path) in str(stopped.value)
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert ledger["spent"] == 0
    partial = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*.json")]
    assert any(run["label"].endswith(":partial") for run in partial)
    # it stopped within one batch: at most num_threads examples past the three failures were attempted
    assert calls["n"] - 40 <= 3 + 8

    resumed = compile_in(tmp_path, TURNS, FunctionLM(task_lm_reply))
    said = [(turn["code"][:60], turn["output"][:300]) for turn in resumed.agent_trajectory]
    assert resumed.optimized_dspy_program["route"] == POLICY_PROMPT, (resumed.selection["reason"], said, calls)


def test_a_metric_that_raises_on_some_examples_leaves_failing_records():
    def flaky_metric(example, prediction, trace=None):
        if "chargeback" in example.ticket:
            raise RuntimeError("metric bug on chargebacks")
        return metric(example, prediction)

    result = compile_in(None, TURNS, FunctionLM(task_lm_reply), metric=flaky_metric)
    baseline = result.trial_logs[0]
    assert baseline["label"] == "baseline"
    run = RunStore(result.run_storage_dir).get(baseline["run_id"])
    errors = [r for r in run.records if r.error]
    assert errors and all("metric bug on chargebacks" in r.error and r.score == 0 for r in errors)


def test_rate_limits_are_retried_and_charged_once(tmp_path):
    attempts: dict[str, int] = {}

    def task_reply(messages):
        key = str(messages[-1].get("content", ""))
        attempts[key] = attempts.get(key, 0) + 1
        if attempts[key] == 1:
            return dspy.LMRateLimitError("slow down", retry_after=0.01)
        return task_lm_reply(messages)

    result = compile_in(tmp_path, TURNS, FunctionLM(task_reply))
    runs = RunStore(tmp_path).all()
    assert all(r.error is None for run in runs for r in run.records)
    assert any(count == 2 for count in attempts.values())
    agent_runs = [run for run in runs if run.label == "agent"]
    assert sum(run.budget_spent for run in agent_runs) == sum(run.evaluated_count for run in agent_runs)
    assert result.budget["spent_by_kind"]["train_example"] == 2


def test_ctrl_c_in_the_middle_of_an_evaluation_keeps_what_was_paid_for_and_resumes(tmp_path):
    import _thread

    calls = {"n": 0}
    lock = threading.Lock()

    def task_reply(messages):
        with lock:
            calls["n"] += 1
            n = calls["n"]
        if n == 40 + 2 * 2 + 5:  # baselines (40 calls), the agent's re-run (4 calls), then into validation
            _thread.interrupt_main()
        if n >= 40 + 2 * 2 + 5:  # the examples still running take a while: the Ctrl-C is seen before they all end,
            time.sleep(0.3)  # however loaded the machine
        return task_lm_reply(messages)

    with pytest.raises(OptimizationInterrupted, match="interrupted") as stopped:
        compile_in(tmp_path, TURNS, FunctionLM(task_reply))
    assert str(tmp_path) in str(stopped.value)
    assert not list(tmp_path.rglob("*.tmp"))
    runs = [json.loads(p.read_text()) for p in sorted((tmp_path / "runs").glob("*.json"))]
    partial = [run for run in runs if run["label"].endswith(":partial")]
    assert len(partial) == 1 and partial[0]["split"] == "val" and 0 < partial[0]["evaluated_count"] < 8
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert ledger["spent"] == 2 + partial[0]["budget_spent"]

    task = FunctionLM(task_lm_reply)
    result = compile_in(tmp_path, TURNS, task)
    already = partial[0]["evaluated_count"]
    assert len(task.calls) == 2 * (8 - already)
    assert result.budget["spent"] == 2 + 8
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT


def test_a_process_killed_mid_evaluation_loses_nothing_it_paid_for(tmp_path):
    """SIGKILL (OOM killer, power cut) during the agent's validation run: the records already paid for are
    recovered from the in-flight log on resume, and the ledger does not charge them twice."""
    directory, marker = tmp_path / "run", tmp_path / "in-validation"
    process = start_script(tmp_path, "killed", killed_in_validation_script(str(directory), str(marker), after=4))
    try:
        wait_for_file(marker, process)  # 4 validation records written, the 5th example under way
    finally:
        assert kill_group(process) == -signal.SIGKILL

    task = FunctionLM(task_lm_reply)
    result = compile_in(directory, TURNS, task)
    recovered = [run for run in RunStore(directory).all() if run.label == "agent:recovered"]
    assert len(recovered) == 1 and recovered[0].split == "val" and recovered[0].evaluated_count == 4
    assert len(task.calls) == 2 * (8 - 4)
    assert result.budget["spent"] == 2 + 8
    assert not list((directory / "runs").glob("pending-*"))


def test_an_unusable_sub_lm_stops_the_run_naming_it_and_a_resume_with_a_working_one_goes_on(tmp_path):
    """Regression: a sub LM with a bad key stopped GEPA with a log line, every later move failed the same way, and
    compile() returned the unchanged program as a normal result."""
    from support.optimizing import proposer

    bad_key = FunctionLM(lambda messages: dspy.LMAuthError("Incorrect API key provided", model="gpt-4o"))
    loop = {"rlm_autopilot": "loop", "max_metric_calls": 120}
    with pytest.raises(OptimizationInterrupted, match="the sub LM is unusable: LMAuthError") as stopped:
        compile_in(tmp_path, None, FunctionLM(task_lm_reply), sub_lm=bad_key, **loop)
    assert "sub_lm=" in str(stopped.value) and str(tmp_path) in str(stopped.value)
    assert bad_key.calls
    # the report says why, long after the notebook that showed the error is gone
    from rlmoptimizer.report.rundir import read_run_directory

    left = read_run_directory(tmp_path)
    assert left.status == "interrupted" and left.stopped["error"] == "OptimizationInterrupted"
    assert "the sub LM is unusable: LMAuthError" in left.stopped["message"]

    resumed = compile_in(tmp_path, None, FunctionLM(task_lm_reply), sub_lm=proposer(POLICY_PROMPT), **loop)
    assert resumed.route.signature.instructions == POLICY_PROMPT
    assert not (tmp_path / "stopped.json").exists()  # its stop is not the resumed compile's


def test_a_sub_lm_that_is_down_stops_the_run_resumable_instead_of_ending_it_unchanged(tmp_path):
    """Regression: a sub LM answering 500 after its retries stopped GEPA, the loop tried GEPA once more and then
    ended early, returning the unchanged program as a finished run: compiling again read it back, and the sub LM's
    recovery changed nothing. A bad key stopped the run resumably; an outage did not."""
    from support.optimizing import proposer

    down = FunctionLM(lambda messages: dspy.LMServerError("500 Internal Server Error", model="gpt-4o", status=500))
    loop = {"rlm_autopilot": "loop", "max_metric_calls": 120}
    with pytest.raises(OptimizationInterrupted, match="the sub LM gave no answer in 2 moves in a row") as stopped:
        compile_in(tmp_path, None, FunctionLM(task_lm_reply), sub_lm=down, **loop)
    assert "LMServerError" in str(stopped.value) and "same run_storage_dir" in str(stopped.value)
    assert not (tmp_path / "result.json").exists()  # not finished: a resume goes on

    resumed = compile_in(tmp_path, None, FunctionLM(task_lm_reply), sub_lm=proposer(POLICY_PROMPT), **loop)
    assert resumed.route.signature.instructions == POLICY_PROMPT


def test_a_custom_sub_lm_down_with_litellms_own_error_stops_the_run_resumable(tmp_path):
    """Regression: a custom LM whose client raised litellm's RateLimitError (it reaches us inside dspy's
    LMUnexpectedError) ended the run early with the unchanged program, as finished: compiling again once the
    provider answered read that back."""
    import litellm
    from support.optimizing import proposer

    def down(messages):
        raise litellm.RateLimitError("Rate limit reached", llm_provider="openai", model="gpt-4o-mini")

    loop = {"rlm_autopilot": "loop", "max_metric_calls": 120}
    with pytest.raises(OptimizationInterrupted, match="the sub LM gave no answer in 2 moves in a row") as stopped:
        compile_in(tmp_path, None, FunctionLM(task_lm_reply), sub_lm=FunctionLM(down), **loop)
    assert "may be down, overloaded or rate-limiting" in str(stopped.value)
    assert not (tmp_path / "result.json").exists()

    resumed = compile_in(tmp_path, None, FunctionLM(task_lm_reply), sub_lm=proposer(POLICY_PROMPT), **loop)
    assert resumed.route.signature.instructions == POLICY_PROMPT


class _BuggyLM(dspy.BaseLM):
    """A custom LM of the usual kind (its own forward), whose code raises: dspy does not wrap its error."""

    def __init__(self):
        super().__init__(model="my-own-lm")

    def forward(self, prompt=None, messages=None, **kwargs):
        return None.upper()  # an AttributeError in the user's own LM code


@pytest.mark.parametrize("kind", ["a dspy.LM", "a dspy.BaseLM of its own"])
def test_a_custom_sub_lm_whose_own_code_raises_stops_the_run_resumable(tmp_path, kind):
    """Regression: a custom sub LM whose own code raised on every call (a bug in the user's LM class) ended the run
    early with the unchanged program, as finished, after paying for evaluations: compiling again once it was fixed
    read that result back instead of going on. A BaseLM's own error reaches us unwrapped (dspy.LM wraps its in
    LMUnexpectedError), and was charged as a reply besides."""
    from support.optimizing import proposer

    buggy = FunctionLM(lambda messages: None.upper()) if kind == "a dspy.LM" else _BuggyLM()
    loop = {"rlm_autopilot": "loop", "max_metric_calls": 120}
    with pytest.raises(OptimizationInterrupted, match="the sub LM gave no answer in 2 moves in a row") as stopped:
        compile_in(tmp_path, None, FunctionLM(task_lm_reply), sub_lm=buggy, **loop)
    assert "its own code raised" in str(stopped.value) and "AttributeError" in str(stopped.value)
    assert not (tmp_path / "result.json").exists()
    assert json.loads((tmp_path / "ledger.json").read_text())["spent_by_kind"].get("sub_lm_call", 0) == 0

    resumed = compile_in(tmp_path, None, FunctionLM(task_lm_reply), sub_lm=proposer(POLICY_PROMPT), **loop)
    assert resumed.route.signature.instructions == POLICY_PROMPT


@pytest.mark.parametrize("first", ["propose_instructions('route')", "analyze_failures()"])
def test_a_sub_lm_that_is_down_for_proposals_or_an_analysis_stops_the_run_too(tmp_path, first):
    """Regression: only two failed GEPA runs stopped the run; a proposal that got no answer was refused without its
    cause, and an analysis that got none returned the code groups, so each reset the count."""
    down = FunctionLM(lambda messages: dspy.LMServerError("503 Service Unavailable", model="gpt-4o", status=503))
    attempt = "try:\n    {}\nexcept Exception as e:\n    print('REFUSED', e)"
    turns = [
        {"reasoning": "first", "code": attempt.format(first)},
        {"reasoning": "again", "code": attempt.format("propose_instructions('route')")},
        {"reasoning": "never reached", "code": "print('a third turn')"},
    ]
    with pytest.raises(OptimizationInterrupted, match="the sub LM gave no answer in 2 moves in a row"):
        compile_in(tmp_path, scripted_agent(turns), FunctionLM(task_lm_reply), sub_lm=down)
    taken = sorted((tmp_path / "turns").glob("turn-*.json"))
    first_output = json.loads(taken[0].read_text())["output"]
    assert len(taken) == 2  # (an analysis without answers is still the code's groups; a proposal is refused)
    assert ("REFUSED" in first_output) == first.startswith("propose")


def test_a_sub_lm_that_answers_between_two_failed_moves_is_not_taken_for_down(tmp_path):
    """Only moves in a row with no answer between them stop the run: an answer to the agent's own llm_query shows the
    sub LM is there (its proposals fail for their own reasons)."""
    from support.optimizing import SUBMIT_CURRENT

    def reply(messages):  # the proposals' prompts get no answer; plain prompts do
        if "new_instruction" in str(messages):
            return dspy.LMServerError("503 Service Unavailable", model="gpt-4o", status=503)
        return "an answer"

    attempt = "try:\n    propose_instructions('route')\nexcept Exception as e:\n    print('REFUSED', type(e).__name__)"
    turns = [
        {"reasoning": "propose", "code": attempt},
        {"reasoning": "ask", "code": "print(llm_query('are you there?'))"},
        {"reasoning": "propose again", "code": attempt},
        SUBMIT_CURRENT,
    ]
    result = compile_in(tmp_path, scripted_agent(turns), FunctionLM(task_lm_reply), sub_lm=FunctionLM(reply))
    outputs = [turn["output"] for turn in result.agent_trajectory]
    assert "REFUSED" in outputs[0] and "an answer" in outputs[1] and "REFUSED" in outputs[2]
    assert result.agent_trajectory[-1]["final"] and len(result.agent_trajectory) == 4  # not stopped


def test_a_turn_cut_off_while_its_code_ran_resumes_with_the_same_reply_unpaid(tmp_path):
    """Regression: the root LM's reply of the turn under way was kept only with the turn, so a Ctrl-C (or a kill)
    while its code ran asked the root LM again on resume: a second charge for that turn (usually the largest
    request of all), and a real LM may well write other code the second time."""
    whole = scripted_agent(TURNS)
    reference = compile_in(tmp_path / "whole", whole, FunctionLM(task_lm_reply))
    baselines = 2 * sum(len(split) for split in make_splits())  # two steps an example
    calls = {"n": 0}

    def interrupted(messages):  # Ctrl-C at the first evaluation after the baselines: inside a turn's code
        calls["n"] += 1
        if calls["n"] == baselines + 1:
            _thread.interrupt_main()
        return task_lm_reply(messages)

    first = scripted_agent(TURNS)
    with pytest.raises(OptimizationInterrupted):
        compile_in(tmp_path / "cut", first, FunctionLM(interrupted), num_threads=1)
    pending = json.loads((tmp_path / "cut" / "pending_reply.json").read_text())
    turn = pending["iteration"]
    assert pending["code"] == TURNS[turn - 1]["code"] and len(first.calls) == turn
    assert len(list((tmp_path / "cut" / "turns").glob("*.json"))) == turn - 1

    second = scripted_agent(TURNS)
    result = compile_in(tmp_path / "cut", second, FunctionLM(task_lm_reply))
    assert len(first.calls) + len(second.calls) == len(whole.calls)  # that turn's reply was not asked for again
    assert [t["code"] for t in result.agent_trajectory] == [t["code"] for t in reference.agent_trajectory]
    assert result.optimized_dspy_program == reference.optimized_dspy_program
    assert not (tmp_path / "cut" / "pending_reply.json").exists()


def test_a_turn_replayed_after_a_cut_is_not_taken_for_a_turn_without_progress(tmp_path):
    """Regression: a Ctrl-C while the first turn read the train baseline (paid on first read) left that turn to
    replay with the baseline's records free; the pilot took the free turn for one without progress and ran GEPA's
    phase after it, which the uninterrupted run never did (57 units spent where it spent 25)."""

    def run(directory, task):
        return compile_in(directory, scripted_agent(TURNS), task, rlm_autopilot="assist", max_metric_calls=150)

    reference = run(tmp_path / "whole", FunctionLM(task_lm_reply))
    calls = {"n": 0}
    val_calls = 2 * len(make_splits()[1])  # the validation baseline first, then the first turn reads train's

    def interrupted(messages):
        calls["n"] += 1
        if calls["n"] == val_calls + 4:
            _thread.interrupt_main()
        return task_lm_reply(messages)

    with pytest.raises(OptimizationInterrupted):
        compile_in(tmp_path / "cut", scripted_agent(TURNS), FunctionLM(interrupted), rlm_autopilot="assist",
                   max_metric_calls=150, num_threads=1)  # fmt: skip
    resumed = run(tmp_path / "cut", FunctionLM(task_lm_reply))
    assert not any(turn.get("pilot") for turn in reference.agent_trajectory)
    assert not any(turn.get("pilot") for turn in resumed.agent_trajectory)
    assert resumed.budget["spent"] == reference.budget["spent"]
    assert resumed.optimized_dspy_program == reference.optimized_dspy_program


def test_a_turn_stopped_after_its_gepa_run_finished_replays_that_run_free_on_resume(tmp_path):
    """Regression: a Ctrl-C after ``run_gepa`` had finished (here: in a callback told of GEPA's candidate), in the
    turn that called it, left the run marked finished: the resumed turn's ``run_gepa(budget=40)`` was taken for a
    new run and refused (20 units left), so the agent lost the GEPA run it had paid for."""
    from support.lineage import REWORDED
    from support.lineage import TURNS as LINEAGE_TURNS
    from support.optimizing import compile_tickets, proposer

    def interrupt(event):
        if type(event).__name__ == "CandidateAdded" and event.candidate_id.startswith("gepa-"):
            raise KeyboardInterrupt

    def run(task, callbacks):
        return compile_tickets(
            LINEAGE_TURNS,
            sub_lm=proposer(REWORDED, POLICY_PROMPT),
            max_iterations=6,
            run_storage_dir=tmp_path,
            eval_lm=task,
            callbacks=callbacks,
        )

    first_task = FunctionLM(task_lm_reply)
    with pytest.raises(OptimizationInterrupted):
        run(first_task, [interrupt])
    second_task = FunctionLM(task_lm_reply)
    result = run(second_task, [])
    gepa_turn = result.agent_trajectory[2]
    assert "run_gepa(budget=40)" in gepa_turn["code"] and "best gepa-1" in gepa_turn["output"]
    assert "Error" not in gepa_turn["output"]
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT
    # the GEPA run was replayed from what it had stored, and it had checked gepa-1 on validation: the resumed
    # process evaluated nothing
    assert second_task.calls == [] and first_task.calls
