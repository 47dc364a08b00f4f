"""What one compile() is made of, built once and handed whole to the agent's tools, the agent and its turn aids.

:class:`CompileServices` holds the stateful parts of a compile (its evaluation runs, the budget ledger, the
working program, the notes, the usage meter, the observer) and the two values that shape the agent's sub-LM work
(the sub LM and the attempt). :class:`TurnSettings` holds how the agent's turns are run, as the user set them, and
:class:`TurnAids` what a long run adds to each turn (the bounded context, the state block, the pilot of the default
loop, the stop after the spending cap).

May import: ``rlmoptimizer.agent.bounded_context``, ``.pilot``, ``.stop``, ``.working_program``, ``rlmoptimizer.budget``,
``.evaluation``, ``.events``, ``.storage`` and ``.usage``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlmoptimizer.agent.bounded_context import BoundedContext
from rlmoptimizer.agent.pilot import Pilot
from rlmoptimizer.agent.stop import RunEnd, StopRequest
from rlmoptimizer.agent.working_program import WorkingProgram
from rlmoptimizer.budget import BudgetLedger
from rlmoptimizer.evaluation.runs import Runs
from rlmoptimizer.events import NO_OBSERVER, Observer
from rlmoptimizer.storage.notes import NotesStore
from rlmoptimizer.usage import SUB, UsageMeter

__all__ = ["CompileServices", "TurnAids", "TurnSettings"]


@dataclass(frozen=True)
class CompileServices:
    """The stateful parts of one compile(). ``sub_lm``: the LM of ``llm_query`` and of the proposals (None: the
    configured LM); ``attempt``: the compile's attempt, ``run_gepa``'s default seed."""

    runs: Runs
    ledger: BudgetLedger
    working: WorkingProgram
    notes: NotesStore = field(default_factory=NotesStore)
    usage: UsageMeter | None = None
    observer: Observer = NO_OBSERVER
    sub_lm: Any = None
    attempt: int = 0
    max_demos: int = 4  # the demos propose_demos gives a step by default; 0: no demos
    format_failures: bool = False  # GEPA's reflections read a step's output that did not parse (dspy.GEPA's name)

    @property
    def stop(self) -> StopRequest:
        """The compile's stop request (the working program's: a tool that meets a systemic failure sets it)."""
        return self.working.stop

    @property
    def directory(self) -> Any:
        """The run directory the runs are kept in (None for runs kept elsewhere)."""
        return getattr(getattr(self.runs, "store", None), "directory", None)

    def as_sub(self, fn: Callable) -> Callable:
        """``fn`` with its LM calls booked to the sub-LM role of the usage meter."""
        return self.usage.in_role(SUB, fn) if self.usage is not None else fn


class _AgentConfig(Protocol):  # the optimizer's settings that shape a turn (RLMDocstringOptimizer has them)
    rlm_max_iterations: int
    rlm_max_llm_calls: int
    rlm_max_output_chars: int
    root_stateful_session: bool
    rlm_multiturn_history: bool
    rlm_autopilot: str


@dataclass(frozen=True)
class TurnSettings:
    """How the agent's turns run: ``max_iters`` turns at most, ``max_llm_calls`` sub-LM calls, ``max_output_chars``
    of a cell's output kept; what the root LM is sent (``stateful_session``, ``multiturn_history``); whether the pilot
    takes the default loop's next phase after a turn that made no progress (``pilot_mode="assist"``; ``"off"``
    leaves every turn to the agent); how often a reply that
    does not parse (``parse_retries``) and a request the root LM refuses as too long
    (``context_refusal_retries``) are retried."""

    max_iters: int = 20
    max_llm_calls: int = 50
    max_output_chars: int = 10_000
    stateful_session: bool = False
    multiturn_history: bool = False
    pilot_mode: str = "assist"
    parse_retries: int = 2
    context_refusal_retries: int = 4

    @classmethod
    def of(cls, config: _AgentConfig) -> TurnSettings:
        """The settings the user gave the optimizer."""
        return cls(
            max_iters=config.rlm_max_iterations,
            max_llm_calls=config.rlm_max_llm_calls,
            max_output_chars=config.rlm_max_output_chars,
            stateful_session=config.root_stateful_session,
            multiturn_history=config.rlm_multiturn_history,
            pilot_mode=config.rlm_autopilot,
        )


@dataclass(frozen=True)
class TurnAids:
    """What a long run adds to each turn: the ``root_lm`` every turn is asked of (the one the ``context`` is
    fitted to: one LM for both, never one for the window and another for the calls), the ``context`` fitted to
    its window, the ``state_block`` that closes every request, the ``pilot`` of the default loop (its
    :class:`~rlmoptimizer.agent.pilot.Pilot`) and the ``run_end`` (spending stopped, or the result is decided)."""

    root_lm: Any = None
    context: BoundedContext | None = None
    state_block: Callable[[], str] | None = None
    pilot: Pilot | None = None
    run_end: RunEnd | None = None
