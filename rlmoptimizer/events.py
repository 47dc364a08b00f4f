"""What happens during a compile(), as typed events sent to one observer protocol.

Events are observational: an observer sees a frozen record of what already happened and cannot change it. Each
event is a snapshot nobody else holds: its run, record, turn, lineage, version and budget are deep copies taken when
it is made (:class:`_Snapshot`), so an observer that mutates them changes nothing of the compile (its result, its
runs, its trajectory, its candidates on disk); each user callback after the first gets a copy of its own.
Observers are called synchronously on the sender's thread (:class:`ExampleEvaluated` comes from the
evaluation's worker threads, one at a time, under the evaluation's lock). The library's own observers (the run
journal, the display, the usage meter, the MLflow tracker) are ordinary observers; an exception one of them
raises propagates to the sender, so a journal that cannot write stops the work instead of losing it. The user's
callbacks (``RLMDocstringOptimizer(callbacks=[...])``) see every event after the journal wrote it, through
:class:`UserCallbacks`: one that raises is reported once and detached, and the compile goes on.

One room sends each event:

=====================  ================================================================================
event                  sent by
=====================  ================================================================================
CompileStarted         ``optimizer`` when a compile() starts (or resumes), before the baselines
CompileFinished        ``optimizer`` when a compile() has its result
EvaluationStarted      ``evaluation.runs.Runs`` before it evaluates a program on a split
ExampleEvaluated       ``evaluation.runs.Runs``, for each newly evaluated example, before it is charged
EvaluationFinished     ``evaluation.runs.Runs`` once the run is saved (also a run cut short)
PromptUpdated          ``agent.working_program.WorkingProgram`` for each new prompt version
AgentReplied           ``agent.agent.OptimizerAgent`` when the root LM answered a turn, before its code runs
AgentTurn              ``agent.agent.OptimizerAgent`` for each turn, as soon as it exists
SubLMAnswered          ``agent.sub_lm`` after each ``llm_query`` / ``llm_query_batched`` it charged, and
                       ``moves.proposal.ask_proposer`` as each sub-LM call of a move (a proposal, a GEPA
                       reflection) is charged
CandidateAdded         ``agent.tools`` for each candidate a move named (``proposal-N``, ``gepa-N``, ``demos-N``)
GepaIteration          ``agent.tools`` at the end of each iteration of a ``run_gepa`` run
=====================  ================================================================================

The budget (the ledger's snapshot: ``limit``, ``spent``, ``left``, ``spent_by_kind``) rides on every event that
changes it: :class:`EvaluationFinished`, :class:`AgentTurn`, :class:`SubLMAnswered`, :class:`GepaIteration`.

May import: ``rlmoptimizer.records`` and the standard library.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, Protocol

from rlmoptimizer.records import EvalRun, ExampleResult

logger = logging.getLogger(__name__)


def _snapshot(value: Any) -> Any:
    """A deep copy of ``value`` (``value`` itself if it cannot be copied)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - an uncopyable value: the event still goes out
        return value


class _Snapshot:
    """Base of every event: each field is a deep copy of what the sender passed, taken as the event is made."""

    def __post_init__(self) -> None:
        for field in fields(self):  # type: ignore[arg-type]
            object.__setattr__(self, field.name, _snapshot(getattr(self, field.name)))


@dataclass(frozen=True)
class EvaluationStarted(_Snapshot):
    """A program is about to be evaluated on ``total`` examples of ``split``."""

    split: str
    label: str
    total: int


@dataclass(frozen=True)
class ExampleEvaluated(_Snapshot):
    """One example of the current evaluation has its record (not sent for records reused from the cache)."""

    record: ExampleResult


@dataclass(frozen=True)
class EvaluationFinished(_Snapshot):
    """A run is saved. ``complete`` is False for a run cut short (``:partial``, ``:recovered``);
    ``budget`` is the ledger's snapshot once the run is charged."""

    run: EvalRun
    budget: dict[str, Any]
    complete: bool = True


@dataclass(frozen=True)
class PromptUpdated(_Snapshot):
    """The working program's instructions changed: ``version`` is the new prompt version
    (``{"version", "step", "text", "previous", "source"}``)."""

    version: dict[str, Any]


@dataclass(frozen=True)
class AgentTurn(_Snapshot):
    """The agent finished a turn: ``turn`` is ``{"iteration", "reasoning", "code", "output", "final",
    "created_at"}`` (plus ``"outputs"`` on the final turn); ``budget`` is the ledger's snapshot after it."""

    turn: dict[str, Any]
    budget: dict[str, Any]


@dataclass(frozen=True)
class AgentReplied(_Snapshot):
    """The root LM answered a turn and its code is about to run: ``reply`` is ``{"iteration", "reasoning",
    "code"}``. Kept until the turn ends, so a turn cut off while its code ran is resumed with the same reply, not
    paid for again."""

    reply: dict[str, Any]


@dataclass(frozen=True)
class SubLMAnswered(_Snapshot):
    """Sub-LM prompts were answered and charged (the agent's ``llm_query`` / ``llm_query_batched``, a proposal, a GEPA
    reflection, an analysis): ``budget`` is the ledger's snapshot after them, so a process killed before the turn
    ends still has them on disk."""

    prompts: int
    budget: dict[str, Any]


@dataclass(frozen=True)
class CompileStarted(_Snapshot):
    """A compile() started: its run directory, the budget (the ledger's snapshot) and whether it resumes an
    earlier one."""

    run_directory: str
    budget: dict[str, Any]
    resumed: bool


@dataclass(frozen=True)
class CompileFinished(_Snapshot):
    """A compile() has its result: ``selection`` says what was returned and why (as ``result.selection``),
    ``budget`` what was spent."""

    selection: dict[str, Any]
    budget: dict[str, Any]


@dataclass(frozen=True)
class CandidateAdded(_Snapshot):
    """A move named a candidate: ``candidate_id`` (``proposal-N``, ``gepa-N``, ``demos-N``), its ``instructions``
    (the steps it sets) and its ``lineage`` (``parents``, ``move``, and for GEPA's the ``run`` and the train ids
    ``reflected_on``)."""

    candidate_id: str
    instructions: dict[str, str]
    lineage: dict[str, Any]


@dataclass(frozen=True)
class GepaIteration(_Snapshot):
    """An iteration of a ``run_gepa`` run ended: the run (``"gepa run 1"``), gepa's iteration number, whether its
    proposal was accepted, the units the run has spent, and the ledger's snapshot."""

    run: str
    iteration: int
    accepted: bool
    spent: int
    budget: dict[str, Any]


Event = (
    EvaluationStarted
    | ExampleEvaluated
    | EvaluationFinished
    | PromptUpdated
    | AgentReplied
    | AgentTurn
    | SubLMAnswered
    | CompileStarted
    | CompileFinished
    | CandidateAdded
    | GepaIteration
)


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


class UserCallbacks:
    """The user's callbacks as one observer. A callback is an object with ``on_event(event)`` or a function of the
    event. One that raises is reported once (a warning naming it, the event and the error) and detached: it sees
    no later event, and the compile goes on as if it had never been there."""

    def __init__(self, callbacks: Iterable[Any] = ()) -> None:
        self._callbacks = list(callbacks)
        self._lock = threading.Lock()

    def on_event(self, event: Event) -> None:
        with self._lock:
            callbacks = list(self._callbacks)
        # Each callback its own event: one that mutates it changes nothing another sees.
        events = [event, *(_snapshot(event) for _ in callbacks[1:])]
        for callback, seen in zip(callbacks, events, strict=False):
            try:
                (callback.on_event if hasattr(callback, "on_event") else callback)(seen)
            except Exception as exc:  # noqa: BLE001 - a user's callback must not stop the run
                with self._lock:
                    if callback not in self._callbacks:
                        continue
                    self._callbacks.remove(callback)
                logger.warning(
                    "The callback %r raised %s: %s on %s; it is detached and sees no later event.",
                    callback,
                    type(exc).__name__,
                    exc,
                    type(event).__name__,
                )
