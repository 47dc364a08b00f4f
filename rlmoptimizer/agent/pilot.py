"""The pilot: runs the default policy's actions through the agent's own tools, one phase at a time.

:class:`Pilot` keeps the loop's memory (folded from the moves' typed outcomes, which the tools report through
:meth:`Pilot.record`), builds the :class:`~rlmoptimizer.agent.policy.LoopState` from it and from the budget, and
runs what :func:`~rlmoptimizer.agent.policy.next_action` returns through the same tools the agent calls. One
:meth:`Pilot.step` takes the policy's next action and the actions after it that ask for no decision: the rest
of the same phase (GEPA's: the run, the adoption of its best with its validation check, the last draw; the
targeted rounds: propose, compare, adopt, check, ...), and the submission once the policy has nothing left to pay
for. The agent takes a step with its ``next_step()`` tool; with ``rlm_autopilot="assist"`` the agent loop takes
one after a turn that made no progress (:meth:`Pilot.progress` unchanged); with ``"loop"``, :func:`run_loop`
takes steps until the policy submits, with no root-LM turn and no sandbox.

A submission the pilot makes is a fact the agent loop reads (:attr:`Pilot.submitted`), not a line of code: the run
ends with the current instructions after the cell (or step) that made it.

May import: ``rlmoptimizer.agent.policy``, ``.stop``, ``rlmoptimizer.errors``, ``.events`` and ``.records``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rlmoptimizer.agent.policy import (
    END,
    GEPA,
    Action,
    Adopt,
    BudgetView,
    CheckValidation,
    Compare,
    EvaluateTrain,
    GepaFinished,
    LastDraw,
    LoopMemory,
    LoopState,
    Outcome,
    Propose,
    RunGepa,
    Submit,
    fold,
    next_action,
)
from rlmoptimizer.errors import AgentToolError
from rlmoptimizer.events import AgentTurn, Observer
from rlmoptimizer.records import AgentOutcome

__all__ = ["MAX_ACTIONS_PER_STEP", "NEXT_STEP_LINE", "Pilot", "describe", "run_loop"]

NEXT_STEP_LINE = "print(next_step()['summary'])"
"""The line the state block suggests: one call that takes the policy's next step."""
MAX_ACTIONS_PER_STEP = 100
"""A bound on the actions of one step (a phase takes a handful; the bound only stops a policy that loops)."""
_TEXT = 300  # characters of a proposal's text shown in a step's summary

_PHASES = {
    GEPA: "with the rest of GEPA's phase (its best adopted and checked on validation; what GEPA leaves too little "
    "for a targeted round buys one last proposal, checked there)",
    "targeted": "with the targeted rounds after it (propose for a step, compare with the current instructions, "
    "adopt the winner, check it on validation), up to SUBMIT",
    END: "which ends the run with the current instructions",
}


def describe(action: Action) -> str:
    """The policy's next ``action``, what one ``next_step()`` adds to it, and the line that takes it."""
    return (
        f"Default loop: its next action is {action.call}; next_step() takes it {_PHASES[action.phase]}. "
        f"Take it, or make your own move.\nNext line: {NEXT_STEP_LINE}"
    )


class Toolbox(Protocol):
    """The tools the pilot runs the policy's actions through (:class:`~rlmoptimizer.agent.tools.AgentTools`)."""

    def run_gepa(self, budget: int | None = None) -> dict: ...

    def adopt_candidate(self, candidate: Any) -> dict: ...

    def evaluate_program(self, split: str = "train", ids: Any = None) -> dict: ...

    def propose_instructions(self, step: str) -> dict: ...

    def compare(self, candidates: Any, ids: Any = None) -> dict: ...


class Pilot:
    """The loop's memory and the runner of its policy, for one compile.

    ``budget``: what the budget and the train runs say now; ``progress``: a value that changes whenever a turn
    spends, makes a candidate, adds a note or changes a prompt (the assist rule compares it across a turn)."""

    def __init__(
        self,
        steps: Sequence[str],
        budget: Callable[[], BudgetView],
        progress: Callable[[], Any],
        *,
        gepa_ran: bool = False,
    ) -> None:
        self._lock = threading.Lock()
        self._memory = LoopMemory.start(steps)
        if gepa_ran:  # a resumed compile whose GEPA run finished: the loop goes on after it
            self._memory = fold(self._memory, GepaFinished(None))
        self._budget = budget
        self._progress = progress
        self._tools: Toolbox | None = None
        self.submitted: str | None = None  # why the policy submitted, once it has
        self.actions_taken = 0

    def attach(self, tools: Toolbox) -> None:
        """The tools the actions run through (they report their outcomes back with :meth:`record`)."""
        self._tools = tools

    # -- the state ---------------------------------------------------------------------------------
    def record(self, outcome: Outcome) -> None:
        """A move's outcome, from the tool that made it."""
        with self._lock:
            self._memory = fold(self._memory, outcome)

    def state(self) -> LoopState:
        with self._lock:
            memory = self._memory
        return LoopState(memory, self._budget())

    def next_action(self) -> Action:
        return next_action(self.state())

    def progress(self) -> Any:
        """Changes whenever something is spent, a candidate made, a note added, a prompt changed or an action of
        the policy taken."""
        return (self._progress(), self.actions_taken)

    def describe(self) -> str:
        """What the state block closes with (:func:`describe`)."""
        return describe(self.next_action())

    # -- the step ----------------------------------------------------------------------------------
    def step(self) -> dict:
        """Take the policy's next action and those after it that ask for no decision (the rest of its phase, and
        SUBMIT once nothing is left to pay for). Stops at a refused or failed action. Returns ``{'ran': [the actions'
        calls], 'summary', 'submitted'}``."""
        if self._tools is None:
            raise RuntimeError("the pilot has no tools attached")
        ran: list[str] = []
        lines: list[str] = []
        first: Action | None = None
        before: tuple[Action, LoopState, Any] | None = None
        for _ in range(MAX_ACTIONS_PER_STEP):
            if self.submitted is not None:
                break
            state = self.state()
            action = next_action(state)
            if first is not None and action.phase not in (first.phase, END):
                break  # a new phase: the agent's decision (next_step() again takes it)
            if before is not None and before == (action, state, self.progress()):
                lines.append(f"{action.call}: the same action again changes nothing; stopped")
                break
            before = (action, state, self.progress())
            first = first or action
            ran.append(action.call)
            self.actions_taken += 1
            try:
                lines.append(f"{action.call} -> {self._take(action)}")
            except AgentToolError as exc:
                lines.append(f"{action.call} -> refused: {exc}")
                break
        summary = "\n".join(lines) if lines else "nothing to do"
        if self.submitted is not None:
            summary += f"\nThe run ends with the current instructions ({self.submitted})."
        return {"ran": ran, "summary": summary, "submitted": self.submitted is not None}

    def _take(self, action: Action) -> str:
        tools = self._tools
        assert tools is not None
        if isinstance(action, RunGepa):
            return str(tools.run_gepa(budget=action.budget)["summary"])
        if isinstance(action, Adopt):
            return self._adopt(action.candidate, action.check)
        if isinstance(action, CheckValidation):
            return _validation(tools.evaluate_program(split="val"))
        if isinstance(action, Propose):
            return _proposal(tools.propose_instructions(action.step))
        if isinstance(action, Compare):
            return str(tools.compare(["current", *action.candidates], ids=list(action.ids))["summary"])
        if isinstance(action, EvaluateTrain):
            run = tools.evaluate_program(ids=list(action.ids))
            return f"train score {float(run.get('score') or 0):.4f} on {run.get('evaluated_count')} example(s)"
        if isinstance(action, LastDraw):
            proposal = tools.propose_instructions(action.step)
            return f"{_proposal(proposal)}; {self._adopt(proposal['candidate_ids'][0], True)}"
        if isinstance(action, Submit):
            self.submitted = action.why
            return f"SUBMIT: {action.why}"
        raise TypeError(f"not an action of the policy: {action!r}")

    def _adopt(self, candidate: str, check: bool) -> str:
        tools = self._tools
        assert tools is not None
        adopted = tools.adopt_candidate(candidate)
        text = f"adopted {candidate} (changed: {', '.join(adopted['changed_steps']) or 'nothing'})"
        return f"{text}; {_validation(tools.evaluate_program(split='val'))}" if check else text


def _validation(run: dict) -> str:
    return f"validation score {float(run.get('score') or 0):.4f}"


def _proposal(proposal: dict) -> str:
    texts = [t if len(t) <= _TEXT else t[:_TEXT] + " ..." for t in proposal.get("texts", [])]
    return f"{', '.join(proposal.get('candidate_ids', []))}: {texts}"


LOOP_REASONING = "rlm_autopilot='loop': the default policy's next step (no root-LM turn)"


def run_loop(
    pilot: Pilot, services: Any, *, prior_turns: Sequence[dict] = (), ends_run: Callable[[], str | None] = lambda: None
) -> AgentOutcome:
    """``rlm_autopilot="loop"``: the pilot takes steps until the policy submits (or ``ends_run()`` says why the run
    ends, or a step changes nothing). Each step is one turn of the trajectory, sent to the observer of ``services``
    (the compile's :class:`~rlmoptimizer.agent.services.CompileServices`) as it ends; a systemic failure a tool
    met ends the loop (its stop request)."""
    observer: Observer = services.observer
    raise_if_stopped, current = services.stop.raise_if_requested, services.working.instructions
    turns = [dict(t) for t in prior_turns]
    while True:
        why = ends_run()
        if why is not None:
            pilot.submitted = pilot.submitted or why
        before = pilot.progress()
        if pilot.submitted is None:
            try:
                report = pilot.step()
            except Exception as exc:  # a move that failed: the loop stops here, a systemic failure is raised
                raise_if_stopped()
                report = {"ran": [], "summary": f"[Error] {type(exc).__name__}: {exc}", "submitted": False}
                pilot.submitted = f"the policy's step failed ({type(exc).__name__})"
            raise_if_stopped()
            if not report["submitted"] and pilot.submitted is None and pilot.progress() == before:
                pilot.submitted = "the policy's last step changed nothing"
        else:
            report = {
                "ran": [],
                "summary": f"The run ends with the current instructions ({pilot.submitted}).",
                "submitted": True,
            }
        final = pilot.submitted is not None
        turn: dict[str, Any] = {
            "iteration": len(turns) + 1,
            "reasoning": LOOP_REASONING,
            "code": "\n".join(report["ran"]) or NEXT_STEP_LINE,
            "output": report["summary"],
            "final": final,
            "pilot": list(report["ran"]),
        }
        if final:
            turn["outputs"] = {"optimized_dspy_program": current()}
        turn["created_at"] = time.time()
        turns.append(turn)
        observer.on_event(AgentTurn(turn, services.ledger.snapshot()))
        if final:
            return AgentOutcome(
                submitted=dict(current()),
                trajectory=tuple(turns),
                final_reasoning=f"The default policy submitted: {pilot.submitted}.",
            )
