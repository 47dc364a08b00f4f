"""What happens during a compile(), as typed events sent to one observer protocol.

Events are observational: an observer sees a frozen record of what already happened and cannot change it.
Observers are called synchronously on the sender's thread (:class:`ExampleEvaluated` comes from the
evaluation's worker threads, one at a time, under the evaluation's lock); an exception an observer raises
propagates to the sender, so a journal that cannot write stops the work instead of losing it.

One room sends each event:

=====================  ================================================================================
event                  sent by
=====================  ================================================================================
EvaluationStarted      ``evaluation.runs.Runs`` before it evaluates a program on a split
ExampleEvaluated       ``evaluation.runs.Runs``, for each newly evaluated example, before it is charged
EvaluationFinished     ``evaluation.runs.Runs`` once the run is saved (also a run cut short)
PromptUpdated          ``agent.working_program.WorkingProgram`` for each new prompt version
AgentTurn              ``agent.agent.OptimizerAgent`` for each turn, as soon as it exists
SubLMAnswered          ``agent.agent.OptimizerAgent`` after each ``llm_query`` / ``llm_query_batched`` it charged
=====================  ================================================================================

May import: ``rlmoptimizer.records`` and the standard library.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from rlmoptimizer.records import EvalRun, ExampleResult


@dataclass(frozen=True)
class EvaluationStarted:
    """A program is about to be evaluated on ``total`` examples of ``split``."""

    split: str
    label: str
    total: int


@dataclass(frozen=True)
class ExampleEvaluated:
    """One example of the current evaluation has its record (not sent for records reused from the cache)."""

    record: ExampleResult


@dataclass(frozen=True)
class EvaluationFinished:
    """A run is saved. ``complete`` is False for a run cut short (``:partial``, ``:recovered``);
    ``budget`` is the ledger's snapshot once the run is charged."""

    run: EvalRun
    budget: dict[str, Any]
    complete: bool = True


@dataclass(frozen=True)
class PromptUpdated:
    """The working program's instructions changed: ``version`` is the new prompt version
    (``{"version", "step", "text", "previous", "source"}``)."""

    version: dict[str, Any]


@dataclass(frozen=True)
class AgentTurn:
    """The agent finished a turn: ``turn`` is ``{"iteration", "reasoning", "code", "output", "final",
    "created_at"}`` (plus ``"outputs"`` on the final turn); ``budget`` is the ledger's snapshot after it."""

    turn: dict[str, Any]
    budget: dict[str, Any]


@dataclass(frozen=True)
class SubLMAnswered:
    """Sub-LM prompts of the agent (``llm_query`` / ``llm_query_batched``) were answered and charged in the
    middle of a turn: ``budget`` is the ledger's snapshot after them, so a process killed before the turn ends
    still has them on disk."""

    prompts: int
    budget: dict[str, Any]


Event = EvaluationStarted | ExampleEvaluated | EvaluationFinished | PromptUpdated | AgentTurn | SubLMAnswered


class Observer(Protocol):
    """Anything that wants to see the events of a compile()."""

    def on_event(self, event: Event) -> None: ...


class Observers:
    """Several observers seen as one, called in order."""

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        self._observers = tuple(observers)

    def on_event(self, event: Event) -> None:
        for observer in self._observers:
            observer.on_event(event)


NO_OBSERVER = Observers()
"""The observer of a room used on its own (tests, benchmarks): sees nothing."""
