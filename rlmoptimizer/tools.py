"""The functions the optimizer agent calls from its REPL, bound to one compile() session.

A tool's name, type hints and docstring are its interface: dspy.RLM builds the agent's tool list from
exactly those. Tools return JSON-friendly values. A bad argument raises an exception whose message says
what to do next (the agent sees it as the error of its code cell); nothing a tool refuses changes state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import dspy

from rlmoptimizer.budget import BudgetLedger
from rlmoptimizer.errors import (
    AgentToolError,
    ConfigurationError,
    EvaluationLMError,
    MetricError,
    StructureChangedError,
)
from rlmoptimizer.evaluation import RunService, select_ids
from rlmoptimizer.fingerprint import apply_instructions, check_structure, get_instructions
from rlmoptimizer.records import EvalRun


def agent_error(problem: str, fix: str) -> AgentToolError:
    """The one place that formats errors shown to the agent: what went wrong, then what to do."""
    return AgentToolError(f"{problem} -> {fix}")


class OptimizationSession:
    """Per-compile state the tools act on: the working program, its runs, the ledger, prompt versions.

    Invariant: ``self.program`` always has the structural fingerprint ``self.fingerprint``; only
    instructions ever change, and every change is recorded in ``self.prompt_versions``.
    """

    def __init__(
        self,
        *,
        program: dspy.Module,
        fingerprint: dict,
        runs: RunService,
        ledger: BudgetLedger,
        on_prompt_version: Callable[[dict[str, Any]], None] | None = None,
        on_run_start: Callable[[str, str, int], None] | None = None,
        on_run_end: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.program = program
        self.fingerprint = fingerprint
        self.runs = runs
        self.ledger = ledger
        self.step_names = [name for name, _ in program.named_predictors()]
        self.prompt_versions: list[dict[str, Any]] = []
        self._on_prompt_version = on_prompt_version
        self.fatal: Exception | None = None
        self._on_run_start = on_run_start
        self._on_run_end = on_run_end
        self._lock = threading.Lock()

    # -- helpers used by the optimizer ------------------------------------------------------------
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
            self._check_step(step)
            clean[step] = self._check_text(step, text)
        # A dry run on the working program itself (no copy: a program may hold things that cannot be copied),
        # its signatures restored afterwards.
        with self._lock:
            signatures = {name: predictor.signature for name, predictor in self.program.named_predictors()}
            try:
                apply_instructions(self.program, clean)
                check_structure(self.fingerprint, self.program)
            except (StructureChangedError, ConfigurationError) as exc:
                raise agent_error(f"{what} refused: {exc}", "only change the instructions text of existing steps") from None
            finally:
                for name, predictor in self.program.named_predictors():
                    predictor.signature = signatures[name]
        return clean

    def _check_step(self, step: Any) -> None:
        if not isinstance(step, str) or step not in self.step_names:
            raise agent_error(f"unknown step name {step!r}", f"use one of {self.step_names}")

    @staticmethod
    def _check_text(step: str, text: Any) -> str:
        if not isinstance(text, str):
            raise agent_error(
                f"instructions for step {step!r} must be a string, got {type(text).__name__}",
                "pass the full instructions text as a str",
            )
        if not text.strip():
            raise agent_error(f"instructions for step {step!r} are empty", "pass non-empty instructions text")
        return text

    def set_instructions(self, mapping: dict[str, str], source: str) -> None:
        """Apply instructions to the working program, check the structure, record the version."""
        with self._lock:
            before = get_instructions(self.program)
            signatures = {name: predictor.signature for name, predictor in self.program.named_predictors()}
            apply_instructions(self.program, mapping)
            try:
                check_structure(self.fingerprint, self.program)
            except StructureChangedError:
                for name, predictor in self.program.named_predictors():  # restore the very signatures
                    predictor.signature = signatures[name]
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
                if self._on_prompt_version is not None:
                    self._on_prompt_version(version)

    def restore_versions(self, versions: list[dict[str, Any]]) -> None:
        """Re-apply prompt versions read back from a run directory (a resume), without recording them again."""
        with self._lock:
            for version in versions:
                apply_instructions(self.program, {version["step"]: version["text"]})
                self.prompt_versions.append(dict(version))
            check_structure(self.fingerprint, self.program)

    def evaluate(self, split: str, ids: list[int] | None, label: str, charged: bool = True) -> EvalRun:
        """Evaluate the working program. A systemic failure (the evaluation LM is unusable, the metric is
        broken) is also kept in ``self.fatal`` so the optimizer stops after the agent's current turn."""
        with self._lock:
            if self._on_run_start is not None:
                self._on_run_start(split, label, len(self.runs.splits[split]) if ids is None else len(ids))
            try:
                run = self.runs.evaluate(self.program, split, label=label, charged=charged, ids=ids)
            except (EvaluationLMError, MetricError) as exc:
                self.fatal = exc
                raise
            if self._on_run_end is not None:
                self._on_run_end(run.summary())
            return run

    # -- the tools ----------------------------------------------------------------------------------
    def tool_functions(self) -> list[Callable]:
        """The agent's tools, in the order the instructions describe them."""
        return [self.evaluate_program, self.run_data, self.update_prompt, self.optimization_status]

    def evaluate_program(
        self,
        split: str = "train",
        limit: int | None = None,
        sample: str | None = None,
        ids: Any = None,
        failed_from_run: str | None = None,
        seed: int = 0,
    ) -> dict:
        """Run the program with the current instructions on 'train' (selected examples, full records) or 'val' (whole split, aggregates only). Costs 1 budget unit per newly evaluated example."""
        if split not in self.runs.splits:
            raise agent_error(f"unknown split {split!r}", f"use one of {sorted(self.runs.splits)}")
        if split == "val":
            if any(v is not None for v in (limit, sample, ids, failed_from_run)):
                raise agent_error(
                    "validation always runs on the whole split and takes no selection",
                    "call evaluate_program(split='val') with no other arguments",
                )
            run = self.evaluate("val", None, label="agent")
            return run.agent_view()
        failed: list[int] | None = None
        if failed_from_run is not None:
            source = self._get_run(failed_from_run)
            if source.split != "train":
                raise agent_error(
                    f"run {failed_from_run!r} is a {source.split} run",
                    "failed_from_run takes a train run id (validation examples are not shown)",
                )
            failed = source.failed_ids
        try:
            selected = select_ids(
                len(self.runs.splits["train"]), limit=limit, sample=sample, seed=seed, ids=ids,
                failed_ids_from_run=failed,
            )
        except ValueError as exc:
            raise agent_error(str(exc), "fix the selection arguments and call evaluate_program again") from None
        run = self.evaluate("train", selected, label="agent")
        return run.agent_view()

    def run_data(self, run_id: str) -> dict:
        """Return an earlier run (baseline runs included) by id: full records for train runs, aggregates for validation runs. Free."""
        return self._get_run(run_id).agent_view()

    def update_prompt(self, step: str, text: str) -> dict:
        """Set the instructions of one step (a name from step_names). Free. Returns {'step', 'previous', 'version'}."""
        self._check_step(step)
        text = self._check_text(step, text)
        previous = self.instructions()[step]
        try:
            self.set_instructions({step: text}, source="update_prompt")
        except (StructureChangedError, ConfigurationError) as exc:
            raise agent_error(f"update refused: {exc}", "only change the instructions text of an existing step") from None
        return {"step": step, "previous": previous, "version": len(self.prompt_versions)}

    def optimization_status(self) -> dict:
        """Budget spent and left, current instructions per step, step names, and every run so far with its score. Free."""
        budget = self.ledger.snapshot()
        return {
            "budget_limit": budget["limit"],
            "budget_spent": budget["spent"],
            "budget_left": budget["left"],
            "budget_spent_by_kind": budget["spent_by_kind"],
            "step_names": list(self.step_names),
            "current_prompts": self.instructions(),
            "runs": [
                {k: run.summary()[k] for k in ("run_id", "split", "label", "score", "passed_count", "evaluated_count")}
                for run in self.runs.runs()
            ],
        }

    def _get_run(self, run_id: Any) -> EvalRun:
        try:
            return self.runs.get(str(run_id))
        except KeyError:
            known = [run.run_id for run in self.runs.runs()]
            raise agent_error(f"no run with id {run_id!r}", f"use one of {known}") from None
