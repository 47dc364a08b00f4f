"""Public callbacks: ``RLMDocstringOptimizer(callbacks=[...])`` sees every event of a compile as it happens, typed
(``rlmoptimizer.events``), through the real sandbox; a callback only observes, and one that raises is reported
once and detached while the compile goes on to the same result."""

from __future__ import annotations

import logging

import pytest
from support.fakes import FunctionLM
from support.optimizing import compile_tickets, proposer
from support.tickets import POLICY_PROMPT

from rlmoptimizer import ConfigurationError, RLMDocstringOptimizer
from rlmoptimizer.events import (
    AgentTurn,
    CandidateAdded,
    CompileFinished,
    CompileStarted,
    EvaluationFinished,
    EvaluationStarted,
    ExampleEvaluated,
    GepaIteration,
    PromptUpdated,
)

pytestmark = pytest.mark.slow

TURNS = [
    {"reasoning": "gepa", "code": "r = run_gepa(budget=40); print(r['summary'])"},
    {"reasoning": "adopt", "code": "print(adopt_candidate(r['best'])); print(evaluate_program(split='val')['score'])"},
    {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"},
]


class Recorder:
    def __init__(self) -> None:
        self.events: list = []

    def on_event(self, event) -> None:
        self.events.append(event)


def run(callbacks, tmp_path, name="run"):
    return compile_tickets(
        TURNS, sub_lm=proposer(POLICY_PROMPT), max_iterations=5, callbacks=callbacks, run_storage_dir=tmp_path / name
    )


def test_callbacks_see_the_compile_as_it_happens_with_candidates_their_lineage_and_gepas_iterations(tmp_path):
    recorder, seen = Recorder(), []
    result = run([recorder, seen.append], tmp_path)
    events = recorder.events
    assert seen == events  # a function of the event sees what an object with on_event sees
    assert isinstance(events[0], CompileStarted) and isinstance(events[-1], CompileFinished)
    assert events[0].run_directory == result.run_storage_dir and events[0].resumed is False
    assert events[-1].selection == result.selection and events[-1].budget == result.budget

    started = [e for e in events if isinstance(e, EvaluationStarted)]
    finished = [e for e in events if isinstance(e, EvaluationFinished)]
    assert [(e.split, e.label) for e in started[:2]] == [("train", "baseline"), ("val", "baseline")]
    assert len(finished) == len(result.trial_logs) == len(started)
    assert sum(isinstance(e, ExampleEvaluated) for e in events) >= 12 + 8
    assert [e.turn["code"] for e in events if isinstance(e, AgentTurn)] == [t["code"] for t in TURNS]

    added = [e for e in events if isinstance(e, CandidateAdded)]
    not_kept = [e for e in added if e.lineage["move"].startswith("gepa reflective proposal (not kept")]
    assert all(e.lineage["parents"] == ["current"] for e in not_kept)  # a child GEPA did not keep is told of too
    added = [e for e in added if e not in not_kept]
    assert [e.candidate_id for e in added] == ["gepa-1"]
    assert added[0].instructions["route"] == POLICY_PROMPT
    assert added[0].lineage["parents"] == ["current"] and added[0].lineage["move"] == "gepa reflective proposal"
    iterations = [e for e in events if isinstance(e, GepaIteration)]
    assert iterations and all(e.run == "gepa run 1" for e in iterations)
    assert [e.iteration for e in iterations] == sorted(e.iteration for e in iterations)
    spent = [e.spent for e in iterations]
    assert spent == sorted(spent) and spent[-1] <= 40 and any(e.accepted for e in iterations)
    # the candidate is told of after the run that made it, and before the turn that ran it ends
    turn_of_gepa = next(i for i, e in enumerate(events) if isinstance(e, AgentTurn))
    assert events.index(iterations[-1]) < events.index(added[0]) < turn_of_gepa
    assert any(isinstance(e, PromptUpdated) and e.version["text"] == POLICY_PROMPT for e in events)


def test_a_callback_that_raises_is_reported_once_and_detached_and_the_compile_goes_on(tmp_path, caplog):
    calls = []

    def broken(event):
        calls.append(event)
        raise RuntimeError("my dashboard is down")

    after = Recorder()
    with caplog.at_level(logging.WARNING, logger="rlmoptimizer.events"):
        result = run([broken, after], tmp_path)
    assert len(calls) == 1 and isinstance(calls[0], CompileStarted)  # detached after its first failure
    warnings = [r.getMessage() for r in caplog.records if r.name == "rlmoptimizer.events"]
    assert len(warnings) == 1 and "my dashboard is down" in warnings[0] and "detached" in warnings[0]
    assert isinstance(after.events[0], CompileStarted) and isinstance(after.events[-1], CompileFinished)
    plain = run(None, tmp_path, name="plain")
    assert (
        result.optimized_dspy_program
        == plain.optimized_dspy_program
        == {**plain.optimized_dspy_program, "route": POLICY_PROMPT}
    )
    assert result.budget == plain.budget


@pytest.mark.parametrize(
    ("callbacks", "message"),
    [
        ("print", "callbacks must be a list, got str"),
        ([print, 42], r"callbacks\[1\] is a int: a callback is an object with an on_event\(event\) method"),
    ],
)
def test_callbacks_that_cannot_be_called_are_refused_before_any_lm_call(callbacks, message):
    root = FunctionLM(lambda messages: {})
    with pytest.raises(ConfigurationError, match=message):
        RLMDocstringOptimizer(root_lm=root, callbacks=callbacks)
    assert not root.calls


def test_a_dspy_callback_gets_dspys_compile_start_and_end_as_with_any_teleprompter(tmp_path):
    from dspy.utils import BaseCallback

    class Compiles(BaseCallback):
        def __init__(self) -> None:
            self.seen: list = []

        def on_compile_start(self, call_id, instance, inputs):
            self.seen.append(("start", type(instance).__name__, sorted(inputs)[:2]))

        def on_compile_end(self, call_id, outputs, exception=None):
            self.seen.append(("end", type(outputs).__name__, exception))

    compiles = Compiles()
    run([compiles], tmp_path)
    assert compiles.seen == [("start", "RLMDocstringOptimizer", ["kwargs", "metric"]), ("end", "RouteTicket", None)]


class Tamperer:
    """A display callback that edits what it is shown, as a careless one would."""

    def on_event(self, event) -> None:
        if isinstance(event, EvaluationFinished):
            for step in event.run.instructions:
                event.run.instructions[step] += " (seen)"
            object.__setattr__(event.run, "score", 1.0)
        elif isinstance(event, AgentTurn):
            event.turn["output"] = "tampered"
            event.turn["code"] = "print('tampered')"
        elif isinstance(event, CandidateAdded):
            event.instructions["route"] = "tampered"
            event.lineage["parents"].append("tampered")
        elif isinstance(event, PromptUpdated):
            event.version["text"] = "tampered"
        elif isinstance(event, ExampleEvaluated):
            event.record.predicted["queue"] = "tampered"
        budget = getattr(event, "budget", None)
        if isinstance(budget, dict):
            budget["spent"] = -1


def test_a_callback_that_mutates_its_events_cannot_change_the_result_the_runs_or_the_candidates(tmp_path):
    """Regression: events carried the very EvalRun the run store keeps, the dict kept in the agent's turns and a
    shallow copy of the lineage: a display callback that appended " (seen)" to a run's instructions made compile()
    return instructions never evaluated, labelled "submission", and trial_logs, agent_trajectory and candidates.json
    changed with it. Every event is a snapshot nobody else holds, and each callback gets its own."""
    after = Recorder()
    result = run([Tamperer(), after], tmp_path)
    plain = run(None, tmp_path, name="plain")
    assert result.optimized_dspy_program == plain.optimized_dspy_program
    assert result.selection == plain.selection and result.budget == plain.budget
    assert not any("(seen)" in text for log in result.trial_logs for text in log["instructions"].values())
    assert [(log["label"], log["score"]) for log in result.trial_logs] == [
        (log["label"], log["score"]) for log in plain.trial_logs
    ]
    assert [(t["code"], t["output"]) for t in result.agent_trajectory] == [
        (t["code"], t["output"]) for t in plain.agent_trajectory
    ]
    candidates = (tmp_path / "run" / "candidates.json").read_text()
    assert "tampered" not in candidates and candidates == (tmp_path / "plain" / "candidates.json").read_text()
    # the callback after the tamperer saw what happened, not the tamperer's edits
    seen = [e for e in after.events if isinstance(e, (EvaluationFinished, AgentTurn, CandidateAdded))]
    assert seen and not any("tampered" in repr(e) or "(seen)" in repr(e) for e in seen)
    assert all(e.budget["spent"] >= 0 for e in after.events if hasattr(e, "budget"))


class ClassCallback:
    def on_event(self, event) -> None:
        pass


class AsyncCallback:
    async def on_event(self, event) -> None:
        pass


async def async_function(event) -> None:
    pass


class RaisingOnAccess:
    @property
    def on_event(self):
        raise RuntimeError("not configured yet")


@pytest.mark.parametrize(
    ("callback", "message"),
    [
        (
            ClassCallback,
            r"callbacks\[0\] is the class ClassCallback, not an instance of it: pass callbacks=\[ClassCallback\(\)\]",
        ),
        (AsyncCallback(), r"callbacks\[0\] \(AsyncCallback.on_event\) is async: .* make it a plain def"),
        (async_function, r"callbacks\[0\] \(async_function\) is async: .*never be awaited"),
        (
            RaisingOnAccess(),
            r"callbacks\[0\] \(RaisingOnAccess\): reading its on_event raised RuntimeError: not configured",
        ),
    ],
    ids=["class", "async-method", "async-function", "raises-on-access"],
)
def test_a_callback_that_could_never_see_an_event_is_refused_with_the_fix(callback, message):
    """Regression: callbacks=[MyCallbackClass] (the class) was accepted and detached at the first event, an async
    callback was never awaited (a RuntimeWarning per event, nothing from us), and one whose on_event raised when read
    gave a raw RuntimeError from the constructor."""
    root = FunctionLM(lambda messages: {})
    with pytest.raises(ConfigurationError, match=message):
        RLMDocstringOptimizer(root_lm=root, callbacks=[callback])
    assert not root.calls
