"""The working program the agent's tools edit: its instructions, checked, and every prompt version.

May import: ``rlmoptimizer.evaluation``, ``.events``, ``.errors``, ``.fingerprint``, ``.records`` and the
agent wing's own ``stop``.
"""

from __future__ import annotations

import threading
from typing import Any

import dspy

from rlmoptimizer.agent.stop import StopRequest
from rlmoptimizer.budget import Reservation
from rlmoptimizer.errors import (
    ConfigurationError,
    EvaluationLMError,
    MetricError,
    ProgramError,
    StructureChangedError,
    agent_error,
)
from rlmoptimizer.evaluation.runs import Runs
from rlmoptimizer.events import NO_OBSERVER, Observer, PromptUpdated
from rlmoptimizer.fingerprint import (
    MAX_DEMOS_CHARS,
    MAX_INSTRUCTION_CHARS,
    apply_instructions,
    canonical_json,
    check_structure,
    copy_program,
    demos_step,
    get_instructions,
    instructions_for_now,
    parse_demos,
    restore_signatures,
    save_signatures,
    text_limit,
)
from rlmoptimizer.records import EvalRun


class WorkingProgram:
    """The program the agent's tools edit, and every prompt version it went through.

    Invariant: ``self.program`` always has the structural fingerprint ``self.fingerprint``; only
    instructions ever change, and every change is recorded in ``self.prompt_versions`` and sent to the
    observer as :class:`~rlmoptimizer.events.PromptUpdated`.
    """

    def __init__(
        self,
        *,
        program: dspy.Module,
        fingerprint: dict,
        runs: Runs,
        stop: StopRequest,
        observer: Observer = NO_OBSERVER,
        demos_allowed: bool = True,
    ) -> None:
        self.program = program
        self.demos_allowed = demos_allowed  # False with max_demos=0: a step's demos stay as they are
        self.fingerprint = fingerprint
        self.runs = runs
        self.stop = stop
        self.observer = observer
        self.step_names = [name for name, _ in program.named_predictors()]
        self.initial = get_instructions(program)  # the unchanged program's (before any version is restored)
        self.prompt_versions: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def instructions(self) -> dict[str, str]:
        return get_instructions(self.program)

    def validate_prompt_map(self, mapping: Any, what: str = "optimized_dspy_program") -> dict[str, str]:
        """Check a {step: instructions} map; raise :class:`AgentToolError` saying what to fix."""
        if not isinstance(mapping, dict):
            raise agent_error(
                f"{what} must be a dict {{step name: instructions}}, got {type(mapping).__name__}",
                f"pass a dict whose keys are among {self.step_names}",
            )
        clean: dict[str, str] = {}
        for step, text in mapping.items():
            self.check_step(demos_step(step) or step if isinstance(step, str) else step)
            clean[step] = self.check_text(step, text)
        # A dry run on the working program itself, its signatures restored afterwards.
        with self._lock:
            try:
                with instructions_for_now(self.program, clean):
                    check_structure(self.fingerprint, self.program)
            except (StructureChangedError, ConfigurationError) as exc:
                raise agent_error(
                    f"{what} refused: {exc}", "only change the instructions text of existing steps"
                ) from None
        return clean

    def check_step(self, step: Any) -> None:
        if not isinstance(step, str) or step not in self.step_names:
            raise agent_error(f"unknown step name {step!r}", f"use one of {self.step_names}")

    def check_text(self, step: str, text: Any) -> str:
        """The agent's text for ``step`` (a demos key takes a list of dicts, or its JSON text), checked; demos other
        than the unchanged program's own must each have a field of the step, and none other than the current ones
        may be given when demos are switched off."""
        if demos_step(step) is not None:  # a step's demos: the JSON text of a list of field dicts
            try:
                demos = parse_demos(step, canonical_json(text) if isinstance(text, list) else text)
            except ConfigurationError as exc:
                raise agent_error(str(exc), "pass a list of dicts of the step's fields, or '[]' for no demos") from None
            if not self.demos_allowed and canonical_json(demos) != self.instructions().get(step, "[]"):
                raise agent_error(
                    f"{step!r}: demos are switched off for this compile (max_demos=0): each step keeps the demos "
                    "it has",
                    "change the instructions instead, and leave the ':demos' entries out",
                )
            fields = set(dict(self.program.named_predictors())[demos_step(step)].signature.fields)
            strangers = [i for i, demo in enumerate(demos) if not fields & set(demo)]
            if strangers and canonical_json(demos) != self.initial.get(step):  # (the program's own are the user's)
                raise agent_error(
                    f"{step!r}: demo {strangers[0]} has none of the step's fields {sorted(fields)} (its keys: "
                    f"{sorted(demos[strangers[0]])[:8]})",
                    "give each demo the step's fields, e.g. a train example's inputs and expected outputs",
                )
            return self._within_limit(step, canonical_json(demos), MAX_DEMOS_CHARS)
        if not isinstance(text, str):
            raise agent_error(
                f"instructions for step {step!r} must be a string, got {type(text).__name__}",
                "pass the full instructions text as a str",
            )
        if not text.strip():
            raise agent_error(f"instructions for step {step!r} are empty", "pass non-empty instructions text")
        return self._within_limit(step, text, MAX_INSTRUCTION_CHARS)

    def _within_limit(self, step: str, text: str, limit: int) -> str:
        """``text``, unless it is longer than ``limit`` (or twice the unchanged program's own) and is not what the
        step already holds (a candidate a move made, adopted: the moves refuse a longer text from the sub-LM)."""
        limit = text_limit(self.initial.get(step), limit)
        if len(text) > limit and text != self.instructions().get(step):
            raise agent_error(
                f"the text for {step!r} has {len(text):,} characters, more than the {limit:,} a step may have (each "
                "call of the step would send it, and every evaluation pays for it)",
                "give fewer demos"
                if demos_step(step)
                else "give shorter instructions: the rules the failures call for, not the data",
            )
        return text

    def set_instructions(self, mapping: dict[str, str], source: str) -> None:
        """Apply instructions to the working program, check the structure, record the version."""
        with self._lock:
            before = get_instructions(self.program)
            signatures = save_signatures(self.program)
            apply_instructions(self.program, mapping)
            try:
                check_structure(self.fingerprint, self.program)
            except StructureChangedError:
                restore_signatures(self.program, signatures)  # kept only when the structure is unchanged
                raise
            for step, text in mapping.items():
                if before.get(step) == text:
                    continue
                version = {
                    "version": len(self.prompt_versions) + 1,
                    "step": step,
                    "text": text,
                    "previous": before.get(step),
                    "source": source,
                }
                self.prompt_versions.append(version)
                self.observer.on_event(PromptUpdated(version))

    def restore_versions(self, versions: list[dict[str, Any]]) -> None:
        """Re-apply prompt versions read back from a run directory (a resume), without recording them again."""
        with self._lock:
            for version in versions:
                apply_instructions(self.program, {version["step"]: version["text"]})
                self.prompt_versions.append(dict(version))
            check_structure(self.fingerprint, self.program)

    def evaluate(
        self,
        split: str,
        ids: list[int] | None,
        label: str,
        charged: bool = True,
        *,
        instructions: dict[str, str] | None = None,
        rollout: int = 0,
        reservation: Reservation | None = None,
    ) -> EvalRun:
        """Evaluate a fresh copy of the working program, with ``instructions`` applied to it when given (the current
        prompts do not change). Each evaluation has its own copy, as ``dspy.GEPA`` builds one per candidate: what a
        program's ``forward`` keeps on itself (a cache of answers, a counter) never carries from one candidate's
        evaluation into another's; what cannot be copied is shared, as dspy's ``Module.deepcopy()`` shares it. A
        systemic failure (the evaluation LM is unusable, the metric is broken) propagates and also requests a stop,
        so the agent loop ends after its current turn."""
        with self._lock:
            program = copy_program(self.program)
            if instructions is not None:  # a candidate's map is a whole program's (the current one's, changes merged)
                apply_instructions(program, instructions, whole=True)
            try:
                return self.runs.evaluate(
                    program, split, label=label, charged=charged, ids=ids, rollout=rollout, reservation=reservation
                )
            except (EvaluationLMError, MetricError, ProgramError, MemoryError) as exc:  # (out of memory: the machine)
                self.stop.request(exc)
                raise

    def validate_submission(self, outputs: dict[str, Any]) -> dict[str, Any]:
        """The agent's SUBMIT outputs with ``optimized_dspy_program`` checked (:meth:`validate_prompt_map`)."""
        return {**outputs, "optimized_dspy_program": self.validate_prompt_map(outputs["optimized_dspy_program"])}
