"""The pilot: runs the default policy's actions through the agent's own tools, one phase at a time.

:class:`Pilot` keeps the loop's memory (folded from the moves' typed outcomes, which the tools report through
:meth:`Pilot.record`), builds the :class:`~rlmoptimizer.agent.policy.LoopState` from it and the budget, and runs
what :func:`~rlmoptimizer.agent.policy.next_action` returns through the same tools the agent calls.
:meth:`Pilot.take_phase` takes the next action and the actions after it that ask for no decision: the rest of its
phase (GEPA's: the run, its best adopted and checked, the last draw; the targeted rounds: propose, compare, adopt,
check, ...), and the submission once the policy has nothing left to pay for. The agent takes a phase with its
``next_phase()`` tool; with ``rlm_autopilot="assist"`` the agent loop takes one after turns without progress
(:meth:`Pilot.progress` unchanged); with ``"loop"``, :func:`run_loop` takes phases until the policy submits, with
no root-LM turn and no sandbox. A submission is a fact the agent loop reads (:attr:`Pilot.submitted`): the run
ends with the current instructions after the turn that made it.

May import: ``rlmoptimizer.agent.policy``, ``rlmoptimizer.errors``, ``.events`` and ``.records``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

from rlmoptimizer.agent.policy import (
    DEMOS,
    END,
    GEPA,
    TARGETED,
    Action,
    Adopt,
    Analyze,
    Analyzed,
    BudgetView,
    CheckValidation,
    Compare,
    CompareValidation,
    Confirm,
    EvaluateTrain,
    GepaFinished,
    LastDraw,
    LoopMemory,
    LoopState,
    Outcome,
    Propose,
    Proposed,
    ProposeDemos,
    RunGepa,
    Submit,
    fold,
    next_action,
)
from rlmoptimizer.errors import AgentToolError
from rlmoptimizer.events import AgentTurn
from rlmoptimizer.records import AgentOutcome, turn_record

NEXT_PHASE_LINE = "print(next_phase()['summary'])"
"""The line the state block suggests: one call that takes the default loop's next phase."""
MAX_ACTIONS = 100
"""A bound on the actions of one phase (a phase takes a handful; the bound only stops a policy that loops)."""
LOOP_REASONING = "rlm_autopilot='loop': the default loop's next phase (no root-LM turn)"
LOOP_SUBMISSION = "the default loop's submission"
"""What the selection's reason calls a submission the policy made (``"loop"``, or ``"assist"`` when the pilot ended
the run)."""

_PHASES = {
    GEPA: "with the rest of GEPA's phase (its best adopted and checked on validation)",
    TARGETED: "with the targeted rounds after it (propose, compare, adopt, check on validation), up to SUBMIT",
    END: "which ends the run",
}


def describe(action: Action) -> str:
    """The loop's next ``action``, what one ``next_phase()`` adds to it, and the line that takes it."""
    return (
        f"Default loop: its next action is {action.call}; next_phase() takes it, {_PHASES[action.phase]}. "
        f"Take it, or make your own move.\nNext line: {NEXT_PHASE_LINE}"
    )


class Pilot:
    """The loop's memory and the runner of its policy, for one compile. ``budget`` says what the budget and the
    train runs say now; ``progress`` changes whenever something is spent or evaluated, a candidate made, a note
    added or a prompt changed. ``tools`` (attached once built) are the agent's tools the actions run through."""

    def __init__(
        self,
        steps: Sequence[str],
        budget: Callable[[], BudgetView],
        progress: Callable[[], Any],
        *,
        gepa_ran: bool = False,
        gepa_best: str | None = None,
    ) -> None:
        self._lock = threading.Lock()
        # a resumed compile whose GEPA run finished: the loop goes on after it (adopting its best, when the run
        # stopped before it did)
        start = LoopMemory.start(steps)
        self._memory = fold(start, GepaFinished(gepa_best)) if gepa_ran else start
        self._budget = budget
        self.progress = progress
        self.tools: Any = None
        self.submitted: str | None = None  # why the policy submitted, once it has
        self.refused: str | None = None  # the last phase's refused action and why (a failing sub LM, the budget)

    def record(self, outcome: Outcome) -> None:
        """A move's outcome, from the tool that made it."""
        with self._lock:
            self._memory = fold(self._memory, outcome)

    def memory(self) -> LoopMemory:
        with self._lock:
            return self._memory

    def state(self) -> LoopState:
        return LoopState(self.memory(), self._budget())

    def describe(self) -> str:
        """What the state block closes with (:func:`describe`)."""
        return describe(next_action(self.state()))

    def take_phase(self) -> dict:
        """Take the next action and those after it that ask for no decision (the rest of its phase, and SUBMIT once
        nothing is left to pay for); stop at a refused action. ``{'ran': [calls], 'summary', 'submitted'}``."""
        ran: list[str] = []
        lines: list[str] = []
        first: Action | None = None
        before: tuple | None = None
        self.refused = None
        while self.submitted is None and len(ran) < MAX_ACTIONS:
            state = self.state()
            action = next_action(state)
            if first is not None and action.phase not in (first.phase, END):
                break  # a new phase: the agent's decision (next_phase() again takes it)
            now = (action, state, self.progress())
            if before == now:
                lines.append(f"{action.call}: the same action again changes nothing; stopped")
                break
            before, first = now, first or action
            ran.append(action.call)
            try:
                lines.append(f"{action.call} -> {self._take(action)}")
            except AgentToolError as exc:
                lines.append(f"{action.call} -> refused: {exc}")
                why = getattr(exc, "problem", None) or str(exc)  # (what to do next is the agent's)
                self.refused = f"{action.call} was refused: {why if len(why) <= 300 else why[:300] + ' ...'}"
                break
        summary = "\n".join(lines) or "nothing to do"
        if self.submitted is not None:
            summary += f"\nThe run ends with the current instructions ({self.submitted})."
        return {"ran": ran, "summary": summary, "submitted": self.submitted is not None}

    def _take(self, action: Action) -> str:
        tools = self.tools
        if isinstance(action, RunGepa):
            return str(tools.run_gepa(budget=action.budget)["summary"])
        if isinstance(action, Adopt):
            return self._adopt(action.candidate, action.check)
        if isinstance(action, CheckValidation):
            return _validation(tools.evaluate_program(split="val"))
        if isinstance(action, Analyze):
            try:
                return str(tools.analyze_failures()["summary"])
            except AgentToolError as exc:  # no analysis (its budget, an unusable answer): the loop goes on without
                self.record(Analyzed())
                return f"no analysis ({exc}); proposals learn from the failures themselves"
        if isinstance(action, Propose):
            group = None if action.group is None else {"analysis": action.group[0], "name": action.group[1]}
            with self._refused_proposal(action):
                return _proposal(tools.propose_instructions(action.step, **({"group": group} if group else {})))
        if isinstance(action, ProposeDemos):
            try:
                return str(tools.propose_demos()["summary"])
            except AgentToolError as exc:  # no demos to give (no passing example where a step ran): go on without
                self.record(Proposed(DEMOS, (), ()))
                return f"no demos ({exc}); the loop goes on without"
        if isinstance(action, Compare):
            return str(tools.compare(["current", *action.candidates], ids=list(action.ids))["summary"])
        if isinstance(action, CompareValidation):
            return str(tools.compare(["current", action.candidate], split="val")["summary"])
        if isinstance(action, EvaluateTrain):
            run = tools.evaluate_program(ids=list(action.ids))
            return f"train score {float(run.get('score') or 0):.4f} on {run.get('evaluated_count')} example(s)"
        if isinstance(action, LastDraw):
            group = {} if action.group is None else {"group": {"analysis": action.group[0], "name": action.group[1]}}
            with self._refused_proposal(action):
                proposal = tools.propose_instructions(action.step, **group)
            return f"{_proposal(proposal)}; {self._adopt(proposal['candidate_ids'][0], True)}"
        if isinstance(action, Confirm):
            return str(tools.confirm_gain()["summary"])
        if isinstance(action, Submit):
            self.submitted = action.why
            return f"SUBMIT: {action.why}"
        raise TypeError(f"not an action of the policy: {action!r}")

    @contextlib.contextmanager
    def _refused_proposal(self, action: Propose | LastDraw):
        """A proposal the tool refused (the sub LM gave no usable instructions) is a proposal that gave nothing to
        compare: without it the policy would ask for the same one again, paying a prompt each time."""
        try:
            yield
        except AgentToolError:
            self.record(Proposed(action.step, (), (), group=action.group))
            raise

    def _adopt(self, candidate: str, check: bool) -> str:
        adopted = self.tools.adopt_candidate(candidate)
        text = f"adopted {candidate} (changed: {', '.join(adopted['changed_steps']) or 'nothing'})"
        return f"{text}; {_validation(self.tools.evaluate_program(split='val'))}" if check else text


def _validation(run: dict) -> str:
    return f"validation score {float(run.get('score') or 0):.4f}"


def _proposal(proposal: dict) -> str:
    texts = [t if len(t) <= 300 else t[:300] + " ..." for t in proposal.get("texts", [])]
    return f"{', '.join(proposal.get('candidate_ids', []))}: {texts}"


def run_loop(
    pilot: Pilot, services: Any, *, prior_turns: Sequence[dict] = (), decided: Callable[[], str | None] | None = None
) -> AgentOutcome:
    """``rlm_autopilot="loop"``: the pilot takes phases until the policy submits (or the spending cap is reached,
    ``decided()`` says why no phase can change the result, or a phase changes nothing). Each phase is one turn of
    the trajectory, sent to the observer of the compile's ``services`` as it ends; a systemic failure a tool met is
    raised (the services' stop request)."""
    turns = [dict(t) for t in prior_turns]
    usage = services.usage
    submitted_by = LOOP_SUBMISSION
    while True:
        cap = usage.cap_message() if usage is not None and usage.cap_reached else None
        pilot.submitted = pilot.submitted or (decided and decided()) or cap
        report = {"ran": [], "summary": ""}
        if pilot.submitted is None:
            # (a phase a resume replays pays nothing and may change no prompt, yet takes the loop on; one that ended
            # in a refusal and changed nothing else is where the loop stops)
            before, remembered = pilot.progress(), pilot.memory()
            try:
                report = pilot.take_phase()
            except Exception as exc:  # a move that failed: the loop stops here; a systemic failure is raised
                services.stop.raise_if_requested()
                report["summary"] = f"[Error] {type(exc).__name__}: {exc}"
                pilot.submitted = f"the loop's phase failed ({type(exc).__name__})"
            services.stop.raise_if_requested()
            moved_on = pilot.refused is None and pilot.memory() != remembered
            if pilot.submitted is None and pilot.progress() == before and not moved_on:
                pilot.submitted = "the loop's last phase changed nothing" + (
                    f" ({pilot.refused})" if pilot.refused else ""
                )
                if pilot.refused:  # the result's reason says why the loop stopped early (a failing sub LM, ...)
                    submitted_by = f"{LOOP_SUBMISSION} (the loop stopped early: {pilot.refused})"
        final = pilot.submitted is not None
        if final and not report["summary"].endswith(f"({pilot.submitted})."):
            report["summary"] += f"\nThe run ends with the current instructions ({pilot.submitted})."
        turn = turn_record(
            len(turns) + 1,
            LOOP_REASONING,
            "\n".join(report["ran"]) or NEXT_PHASE_LINE,
            report["summary"].strip(),
            final=final,
            pilot=report["ran"],
            outputs={"optimized_dspy_program": services.working.instructions()} if final else None,
            submitted_by=submitted_by if final else None,
        )
        turns.append(turn)
        services.observer.on_event(AgentTurn(turn, services.ledger.snapshot()))
        if final:
            return AgentOutcome(
                submitted=dict(services.working.instructions()),
                trajectory=tuple(turns),
                final_reasoning=f"The default loop submitted: {pilot.submitted}.",
                submitted_by=submitted_by,
            )
