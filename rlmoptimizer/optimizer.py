"""``RLMDocstringOptimizer``: the DSPy teleprompter whose optimizer is an LLM agent in a sandboxed REPL.

The flow of one ``compile()``:

1. check the inputs and fail fast (before any LM call) with a message that says what to fix;
2. deep-copy the student and take its structural fingerprint;
3. start the sandbox in the background while the baseline runs (its cold start is hidden);
4. evaluate the unchanged program on train and validation (free);
5. run the agent (a ``dspy.RLM``) with the tools until it SUBMITs or runs out of turns;
6. check the submission, evaluate it on validation if needed, and return the best of it and every
   candidate checked on validation (never worse than the student); attach the result attributes.

Per-compile state lives in a :class:`_CompileRun` local to ``compile()``; nothing of a run is kept on
the optimizer, so one optimizer can compile twice.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import dspy
from dspy.teleprompt.teleprompt import Teleprompter
from rich.console import Console

from rlmoptimizer.agent import OptimizerAgent
from rlmoptimizer.budget import BudgetLedger, budget_for
from rlmoptimizer.context import BoundedContext, ContextBudget, render_state_block
from rlmoptimizer.display import Display
from rlmoptimizer.errors import ConfigurationError, OptimizationInterrupted, RLMOptimizerError
from rlmoptimizer.evaluation import Evaluator, RunService, check_examples, check_program, resolve_eval_lm
from rlmoptimizer.fingerprint import (
    apply_instructions,
    check_structure,
    fingerprint_digest,
    get_instructions,
    sha256_json,
    structural_fingerprint,
)
from rlmoptimizer.journal import RunJournal
from rlmoptimizer.metric import Metric
from rlmoptimizer.notes import NotesStore
from rlmoptimizer.prompts import render_instructions, render_task_brief
from rlmoptimizer.records import EvalRun
from rlmoptimizer.run_store import RunStore
from rlmoptimizer.sandbox import Sandbox
from rlmoptimizer.tools import AgentToolError, OptimizationSession
from rlmoptimizer.usage import EVAL, ROOT, UsageMeter

logger = logging.getLogger(__name__)

SETUP_CODE = """\
baseline_train = run_data({train_run!r})
baseline_val = run_data({val_run!r}) if {val_run!r} else None
step_names = {step_names!r}
current_prompts = optimization_status()["current_prompts"]
"""


def _read_json(path: Path) -> Any:
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_lm(name: str, lm: Any, required: bool) -> Any:
    if lm is None:
        if required:
            raise ConfigurationError(
                f"{name} is required: pass a dspy.LM, e.g. RLMDocstringOptimizer({name}=dspy.LM('openai/gpt-4o'), ...)"
            )
        return None
    if not isinstance(lm, dspy.BaseLM):
        raise ConfigurationError(f"{name} must be a dspy.LM (or dspy.BaseLM), got {type(lm).__name__}")
    return lm


class RLMDocstringOptimizer(Teleprompter):
    """Optimize the instructions of every predictor of a DSPy program with an RLM agent.

    The budget is ``max_iterations * len(trainset) + len(valset)`` units: one evaluated example costs 1,
    one sub-LM prompt (the agent's ``llm_query``) costs 1; baseline runs and the agent's own turns are free.
    """

    def __init__(
        self,
        *,
        # budget
        max_iterations: int = 5,
        # models
        root_lm: dspy.BaseLM | None = None,
        sub_lm: dspy.BaseLM | None = None,
        eval_lm: dspy.BaseLM | None = None,
        # scoring
        metric: Any = None,
        pass_threshold: float = 1.0,
        num_threads: int = 8,
        # the agent
        rlm_max_iterations: int = 200,
        rlm_max_llm_calls: int = 200,
        rlm_max_output_chars: int = 10_000,
        root_stateful_session: bool = True,
        rlm_multiturn_history: bool = False,
        sandbox_timeout_s: float = 120.0,
        root_context_window: int | None = None,
        # spending
        max_cost_usd: float | None = None,
        # output and storage
        verbose: bool = False,
        run_storage_dir: str | Path | None = None,
        console: Console | None = None,
    ) -> None:
        super().__init__()
        self.max_iterations = _check_positive_int("max_iterations", max_iterations)
        self.root_lm = _check_lm("root_lm", root_lm, required=True)
        self.sub_lm = _check_lm("sub_lm", sub_lm, required=False)
        self.eval_lm = _check_lm("eval_lm", eval_lm, required=False)
        if metric is not None and not callable(metric):
            raise ConfigurationError(f"metric must be callable, got {type(metric).__name__}")
        self.metric = metric
        if isinstance(pass_threshold, bool) or not isinstance(pass_threshold, (int, float)) or not 0 <= pass_threshold <= 1:
            raise ConfigurationError(f"pass_threshold must be a number in [0, 1], got {pass_threshold!r}")
        self.pass_threshold = float(pass_threshold)
        self.num_threads = _check_positive_int("num_threads", num_threads)
        self.rlm_max_iterations = _check_positive_int("rlm_max_iterations", rlm_max_iterations)
        self.rlm_max_llm_calls = _check_positive_int("rlm_max_llm_calls", rlm_max_llm_calls, minimum=0)
        self.rlm_max_output_chars = _check_positive_int("rlm_max_output_chars", rlm_max_output_chars, minimum=100)
        self.root_stateful_session = bool(root_stateful_session)
        self.rlm_multiturn_history = bool(rlm_multiturn_history)
        if isinstance(sandbox_timeout_s, bool) or not isinstance(sandbox_timeout_s, (int, float)) or sandbox_timeout_s <= 0:
            raise ConfigurationError(f"sandbox_timeout_s must be a number > 0, got {sandbox_timeout_s!r}")
        self.sandbox_timeout_s = float(sandbox_timeout_s)
        self.root_context_window = (
            None if root_context_window is None
            else _check_positive_int("root_context_window (the root LM's input window, in tokens)",
                                     root_context_window, minimum=4_000)
        )
        if max_cost_usd is not None and (
            isinstance(max_cost_usd, bool) or not isinstance(max_cost_usd, (int, float)) or not max_cost_usd > 0
        ):
            raise ConfigurationError(
                f"max_cost_usd must be a number of dollars > 0 (or None for no cap), got {max_cost_usd!r}"
            )
        self.max_cost_usd = float(max_cost_usd) if max_cost_usd is not None else None
        self.verbose = bool(verbose)
        self.run_storage_dir = Path(run_storage_dir) if run_storage_dir is not None else None
        self.console = console

    def compile(self, student: dspy.Module, *, trainset: list, teacher: Any = None, valset: list | None = None,
                metric: Any = None, **kwargs: Any) -> dspy.Module:
        """Return a copy of ``student`` with optimized instructions and the result attributes attached."""
        if kwargs:
            raise ConfigurationError(f"unexpected compile() arguments: {sorted(kwargs)}")
        if teacher is not None:
            raise ConfigurationError("RLMDocstringOptimizer does not use a teacher program; drop teacher=")
        metric = metric if metric is not None else self.metric
        if metric is None:
            raise ConfigurationError("no metric: pass metric= to compile() or to RLMDocstringOptimizer(...)")
        return _CompileRun(self, student, trainset, valset, Metric(metric)).run()


class _CompileRun:
    """The state of one compile(); see the module docstring for the flow."""

    def __init__(self, config: RLMDocstringOptimizer, student, trainset, valset, metric: Metric) -> None:
        self.config = config
        check_program(student)
        self.trainset = check_examples(trainset, "trainset")
        self.valset = check_examples(valset, "valset", allow_empty=True) if valset is not None else []
        self.metric = metric
        self.eval_lm = resolve_eval_lm(config.eval_lm)
        self.root_lm = config.root_lm
        self.sub_lm = config.sub_lm or config.root_lm
        self.display = Display(config.verbose, config.console)

        self.student = student
        self.program = student.deepcopy()
        self.fingerprint = structural_fingerprint(self.program)
        self.initial_instructions = get_instructions(self.program)
        self.budget_limit = budget_for(config.max_iterations, len(self.trainset), len(self.valset))

        self.store = RunStore(config.run_storage_dir)
        self.directory = Path(self.store.directory)
        self.journal = RunJournal(self.directory)
        self.resumed = self.journal.open_manifest(self._manifest())
        stored_ledger = self.journal.read_ledger() if self.resumed else None
        on_change = lambda ledger: self.journal.write_ledger(ledger.snapshot())  # noqa: E731
        self.ledger = (
            BudgetLedger.from_snapshot(stored_ledger, on_change=on_change)
            if stored_ledger
            else BudgetLedger(self.budget_limit, on_change=on_change)
        )
        self.journal.write_ledger(self.ledger.snapshot())
        # What every LM call of the run costs, per role (rlmoptimizer.usage), on disk as usage.json.
        self._usage_written = 0.0
        self._usage_lock = threading.Lock()
        self.usage = UsageMeter(max_cost_usd=config.max_cost_usd, on_change=lambda meter: self._write_usage(due=True))
        if self.resumed:
            self.usage.restore(_read_json(self.directory / "usage.json"))
        if config.max_cost_usd is not None:
            self.ledger.gate = self.usage.gate()
        self.notes = NotesStore(self.directory)

        def on_result(record) -> None:
            self.usage.add_units(EVAL, 1)
            self.display.example_done(record.passed)

        evaluator = Evaluator(
            metric=metric, lm=self.eval_lm, num_threads=config.num_threads, pass_threshold=config.pass_threshold,
            on_result=on_result,
        )
        evaluator.evaluate = self.usage.in_role(EVAL, evaluator.evaluate)  # the program's and the metric's calls
        splits = {"train": self.trainset}
        if self.valset:
            splits["val"] = self.valset
        self.runs = RunService(evaluator=evaluator, store=self.store, ledger=self.ledger, splits=splits)
        self.session = OptimizationSession(
            program=self.program, fingerprint=self.fingerprint, runs=self.runs, ledger=self.ledger,
            on_prompt_version=self.journal.write_prompt_version,
            on_run_start=self.display.evaluation_started, on_run_end=self._run_finished,
        )

    def _run_finished(self, summary: dict[str, Any]) -> None:
        self._write_usage()
        self.display.run_finished(summary)

    def _write_usage(self, due: bool = False) -> None:
        """usage.json: after each evaluation and agent turn, and at most every few seconds in between."""
        with self._usage_lock:
            now = time.monotonic()
            if due and now - self._usage_written < 5.0:
                return
            self._usage_written = now
            self.journal.write_usage(self.usage.snapshot())

    def _state_block(self) -> str:
        """What the agent must not lose to the compaction of old turns: runs, instructions, budget, notes."""
        spending = ""
        if self.usage.max_cost_usd is not None:
            spending = (f"Spending: ${self.usage.spent_usd:.4f} of max_cost_usd ${self.usage.max_cost_usd:.4f}"
                        + (f" -- {self.usage.cap_message()}" if self.usage.cap_reached else "") + ".")
        return render_state_block(
            runs=[r.summary() for r in self.runs.runs()], instructions=self.session.instructions(),
            budget=self.ledger.snapshot(), notes=self.notes.render(max_chars=3_000), spending=spending,
        )

    def _notes_tools(self) -> list:
        notes = self.notes

        def add_note(text: str) -> str:
            """Keep a short conclusion (what you found, tried, what worked) in your notes: they are shown to you on every turn, also after old turns are compacted or the run resumes. Free."""
            return notes.add(text)

        def read_notes() -> list[str]:
            """All your notes, oldest first. Free."""
            return [f"[{n['id']}] {n['text']}" for n in notes.all()]

        return [add_note, read_notes]

    def _manifest(self) -> dict[str, Any]:
        return {
            "program": fingerprint_digest(self.fingerprint),
            "trainset": sha256_json([dict(ex) for ex in self.trainset]),
            "valset": sha256_json([dict(ex) for ex in self.valset]),
            "metric": f"{getattr(self.metric.fn, '__module__', '')}.{getattr(self.metric.fn, '__qualname__', repr(self.metric.fn))}",
            "budget_limit": self.budget_limit,
            "pass_threshold": self.config.pass_threshold,
            "created_at": time.time(),
        }

    # -- the flow -----------------------------------------------------------------------------------
    def run(self) -> dspy.Module:
        sandbox = Sandbox(timeout_s=self.config.sandbox_timeout_s)
        sandbox.start_in_background()
        try:
            return self._run(sandbox)
        except KeyboardInterrupt as exc:
            raise OptimizationInterrupted(self._where("interrupted")) from exc
        except RLMOptimizerError as exc:  # e.g. the evaluation LM is unusable: say where the paid work is
            raise type(exc)(f"{exc}\n{self._where('stopped')}") from exc
        except Exception as exc:
            raise OptimizationInterrupted(self._where(f"stopped by {type(exc).__name__}: {exc}")) from exc
        finally:
            sandbox.shutdown()
            self._write_usage()

    def _where(self, what: str) -> str:
        if self.store.is_temporary:
            return (
                f"Optimization {what}. Everything paid for so far is in {self.directory} (a temporary directory; "
                "pass run_storage_dir= to make runs resumable)."
            )
        return (
            f"Optimization {what}. Everything paid for so far is in {self.directory}; run compile() again with "
            "the same run_storage_dir to resume where it stopped."
        )

    def _run(self, sandbox: Sandbox) -> dspy.Module:
        if self.resumed:
            self.session.restore_versions(self.journal.prompt_versions())
        baseline_train = self._baseline("train")
        baseline_val = self._baseline("val") if self.valset else None

        agent_result = self._run_agent(sandbox, baseline_train, baseline_val)
        submission = dict(self.session.instructions())
        if agent_result is not None:
            submission.update(agent_result["submitted"])
        chosen, selection = self._choose(submission)
        return self._build_result(chosen, selection, agent_result or {})

    def _baseline(self, split: str) -> EvalRun:
        for run in self.runs.runs():
            if run.split == split and run.label == "baseline" and run.instructions == self.initial_instructions:
                return run
        size = len(self.trainset) if split == "train" else len(self.valset)
        self.display.evaluation_started(split, "baseline", size)
        run = self.runs.evaluate(self.student.deepcopy(), split, label="baseline", charged=False)
        self.display.run_finished(run.summary())
        return run

    def _run_agent(self, sandbox: Sandbox, baseline_train: EvalRun, baseline_val: EvalRun | None) -> dict | None:
        prior_turns = self.journal.turns() if self.resumed else []
        if prior_turns and prior_turns[-1].get("final"):
            stored = prior_turns[-1]
            return {"submitted": stored.get("outputs", {}).get("optimized_dspy_program", {}),
                    "trajectory": prior_turns, "final_reasoning": stored.get("reasoning", "")}

        signature = dspy.Signature(
            "task_brief: str -> optimized_dspy_program: dict[str, str]",
            render_instructions(
                self.budget_limit,
                f"enough to evaluate the {len(self.trainset)} train examples {self.config.max_iterations} time(s)"
                + (f" plus the {len(self.valset)} validation examples once" if self.valset else ""),
            ),
        )
        trajectory: list[dict[str, Any]] = list(prior_turns)

        def on_turn(turn: dict[str, Any]) -> None:
            turn = {**turn, "created_at": time.time()}
            trajectory.append(turn)
            self.journal.write_turn(turn)
            self._write_usage()
            self.display.turn(turn)
            if self.session.fatal is not None:  # e.g. the evaluation LM is unusable: stop, keep what was paid for
                raise self.session.fatal

        agent = OptimizerAgent(
            signature,
            ledger=self.ledger,
            setup_code=SETUP_CODE.format(
                train_run=baseline_train.run_id, val_run=baseline_val.run_id if baseline_val else "",
                step_names=self.session.step_names,
            ),
            on_turn=on_turn,
            prior_turns=prior_turns,
            validate_submission=lambda outputs: {
                **outputs, "optimized_dspy_program": self.session.validate_prompt_map(outputs["optimized_dspy_program"])
            },
            max_iters=self.config.rlm_max_iterations,
            max_llm_calls=self.config.rlm_max_llm_calls,
            max_output_chars=self.config.rlm_max_output_chars,
            stateful_session=self.config.root_stateful_session,  # a resumed run starts a fresh chain
            multiturn_history=self.config.rlm_multiturn_history,
            context=BoundedContext(ContextBudget.for_lm(self.root_lm, self.config.root_context_window),
                                   max_output_chars=self.config.rlm_max_output_chars),
            state_block=self._state_block,
            usage=self.usage,
            spending_stopped=lambda: self.usage.cap_message() if self.usage.cap_reached else None,
            tools=self.session.tool_functions() + self._notes_tools(),
            sub_lm=self.sub_lm,
            interpreter_factory=sandbox.as_factory(),
        )
        brief = render_task_brief(
            {name: str(p.signature.signature) for name, p in self.program.named_predictors()},
            len(self.trainset), len(self.valset), self.ledger.left, resumed=bool(prior_turns),
        )
        with dspy.context(lm=self.root_lm):
            prediction = self.usage.in_role(ROOT, agent)(task_brief=brief)
        try:
            submitted = self.session.validate_prompt_map(prediction.optimized_dspy_program)
        except AgentToolError as exc:
            logger.warning("The agent's final output was not a valid submission (%s); keeping its prompt edits.", exc)
            submitted = {}
        return {"submitted": submitted, "trajectory": trajectory,
                "final_reasoning": getattr(prediction, "final_reasoning", "")}

    # -- never worse ------------------------------------------------------------------------------------
    def _choose(self, submission: dict[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
        """The submission if it scores better than the unchanged program and at least as well as every other
        candidate checked on the selection split (validation, or train without a valset), else the best of those
        candidates; the unchanged instructions win every tie."""
        split = "val" if self.valset else "train"
        size = len(self.valset) if self.valset else len(self.trainset)
        complete = [r for r in self.runs.runs() if r.split == split and r.evaluated_count == size]
        submitted_run = next((r for r in reversed(complete) if r.instructions == submission), None)
        if submitted_run is None and self.usage.cap_reached:
            return self._choose_unchecked(submission, split, complete)
        if submitted_run is None:
            charged = self.ledger.left >= size
            self.session.set_instructions(submission, source="submission")
            submitted_run = self.session.evaluate(split, None, label="submission", charged=charged)
            complete.append(submitted_run)
        # Highest score wins; on a tie the unchanged instructions win (a change is returned only when the
        # selection split shows it is better), then the submission, then the latest other candidate.
        initial = self.initial_instructions
        order = {id(r): i for i, r in enumerate(complete)}
        chosen_run = max(complete, key=lambda r: (r.score, r.instructions == initial, r is submitted_run, order[id(r)]))
        others = [r for r in complete if r.instructions != submission]
        best = max(others, key=lambda r: r.score, default=None)
        if chosen_run is submitted_run and submission == initial:
            reason = f"the agent submitted the unchanged instructions, which score {submitted_run.score:.4f} on {split}"
        elif chosen_run is submitted_run:
            reason = f"the agent's submission scored {submitted_run.score:.4f} on {split}" + (
                f", more than the unchanged program and at least as well as every other candidate (best: "
                f"{best.run_id} ({best.label}) at {best.score:.4f})" if best is not None else ""
            )
        elif chosen_run.instructions == initial and chosen_run.score == submitted_run.score:
            reason = (
                f"the agent's submission scored {submitted_run.score:.4f} on {split}, the same as the unchanged "
                f"program ({chosen_run.run_id}); a change is returned only when it scores better, so the unchanged "
                "instructions are returned"
            )
        else:
            reason = (
                f"the agent's submission scored {submitted_run.score:.4f} on {split}, below {chosen_run.run_id} "
                f"({chosen_run.label}) at {chosen_run.score:.4f}; returning that candidate instead"
            )
        candidates = [
            {"run_id": r.run_id, "label": r.label, "score": r.score, "instructions": r.instructions} for r in complete
        ]
        selection = {
            "split": split,
            "chosen_run_id": chosen_run.run_id,
            "chosen_label": chosen_run.label,
            "chosen_score": chosen_run.score,
            "submission_run_id": submitted_run.run_id,
            "submission_score": submitted_run.score,
            "baseline_score": next((r.score for r in complete if r.label == "baseline"), None),
            "reason": reason,
            "candidates": candidates,
        }
        if self.usage.max_cost_usd is not None:
            selection["spending_cap_reached"] = self.usage.cap_reached
            if self.usage.cap_reached:
                selection["reason"] += f" ({self.usage.cap_message().split(',')[0]})"
        return dict(chosen_run.instructions), selection

    def _choose_unchecked(self, submission: dict[str, str], split: str, complete: list[EvalRun]):
        """The spending cap stopped the run before the submission could be checked on the selection split: the
        best candidate that was checked is returned (the unchanged program at worst), never an unchecked one."""
        initial = self.initial_instructions
        order = {id(r): i for i, r in enumerate(complete)}
        chosen_run = max(complete, key=lambda r: (r.score, r.instructions == initial, order[id(r)]))
        reason = (
            f"{self.usage.cap_message().split(',')[0]} before the agent's submission could be checked on {split}; "
            f"returning the best checked candidate, {chosen_run.run_id} ({chosen_run.label}) at {chosen_run.score:.4f}"
        )
        selection = {
            "split": split, "chosen_run_id": chosen_run.run_id, "chosen_label": chosen_run.label,
            "chosen_score": chosen_run.score, "submission_run_id": None, "submission_score": None,
            "baseline_score": next((r.score for r in complete if r.label == "baseline"), None),
            "reason": reason, "spending_cap_reached": True,
            "candidates": [{"run_id": r.run_id, "label": r.label, "score": r.score, "instructions": r.instructions}
                           for r in complete],
        }
        return dict(chosen_run.instructions), selection

    def _build_result(self, instructions: dict[str, str], selection: dict, agent_result: dict) -> dspy.Module:
        program = self.student.deepcopy()
        apply_instructions(program, instructions)
        check_structure(self.fingerprint, program)
        runs = self.runs.runs()
        program.optimized_dspy_program = dict(instructions)
        program.latest_run_id = runs[-1].run_id if runs else None
        program.trial_logs = [
            {**r.summary(), "instructions": dict(r.instructions)} for r in runs
        ]
        program.agent_trajectory = list(agent_result.get("trajectory", []))
        program.agent_final_reasoning = agent_result.get("final_reasoning", "")
        program.selection = selection
        program.budget = self.ledger.snapshot()
        program.usage = self.usage.snapshot()
        program.run_storage_dir = str(self.directory)
        self.journal.write_result({
            "optimized_dspy_program": program.optimized_dspy_program,
            "selection": selection,
            "budget": program.budget,
            "usage": program.usage,
        })
        self._write_usage()
        self.display.message(f"Done: {selection['reason']}. Runs are in {self.directory}. "
                             f"LM usage: {self.usage.summary()}.", style="bold")
        return program
