"""The flow of one ``compile()``, and the state it keeps (:class:`Compile`).

Check the inputs and fail fast (before any LM call) with a message that says what to fix (done by the optimizer,
before a :class:`Compile` exists); copy the student (as leniently as dspy's Module.deepcopy, refused if it cannot be
copied apart) and take its structural fingerprint; open the run directory (resume what it holds, or read a finished
run back); start the sandbox in the background while the baseline runs on train and validation; run the agent with
the tools until it SUBMITs (or the default loop in Python); check the submission on validation, and return the best
of it and every candidate checked there (never worse than the student), with the result.

A :class:`Compile` is local to one ``compile()``, so one optimizer can compile twice. It wires the rooms and runs
the flow: the choice in :mod:`rlmoptimizer.selection`, the agent in :mod:`rlmoptimizer.agent`, evaluations in
:mod:`rlmoptimizer.evaluation`, the run directory in :mod:`rlmoptimizer.storage`; what happens is sent as events
(:mod:`rlmoptimizer.events`) to the journal and the display. ``config`` is the
:class:`~rlmoptimizer.optimizer.RLMDocstringOptimizer` whose settings the compile runs with.

May import: every room but ``optimizer``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import dspy

from rlmoptimizer.agent.agent import OptimizerAgent
from rlmoptimizer.agent.pilot import run_loop
from rlmoptimizer.agent.prompts import agent_signature, budget_note, render_setup_code, render_task_brief
from rlmoptimizer.agent.root_lm import for_attempt
from rlmoptimizer.agent.services import CompileServices, TurnSettings
from rlmoptimizer.agent.state import long_run_aids, no_check_left
from rlmoptimizer.agent.stop import StopRequest
from rlmoptimizer.agent.tools import AgentTools
from rlmoptimizer.agent.working_program import WorkingProgram
from rlmoptimizer.budget import (
    BudgetLedger,
    baseline_on_demand,
    budget_for,
    budget_for_metric_calls,
    example_kind,
    thin_budget_warning,
)
from rlmoptimizer.display import Display
from rlmoptimizer.errors import (
    AgentToolError,
    ConfigurationError,
    MetricError,
    OptimizationInterrupted,
    RLMOptimizerError,
    RunDirectoryMismatchError,
    exception_chain,
)
from rlmoptimizer.estimate import estimate_at_start
from rlmoptimizer.evaluation.evaluator import Evaluator, distinct_examples
from rlmoptimizer.evaluation.runs import Runs
from rlmoptimizer.events import CompileFinished, CompileStarted, Observers, UserCallbacks
from rlmoptimizer.fingerprint import (
    apply_instructions,
    check_structure,
    copy_program,
    demos_step,
    get_instructions,
    structural_fingerprint,
)
from rlmoptimizer.inputs import step_lms
from rlmoptimizer.metric import Metric
from rlmoptimizer.records import AgentOutcome, CompileResult, EvalRun, Selection, steps_never_run
from rlmoptimizer.report import MlflowTracker, present_result, tracked
from rlmoptimizer.sandbox import Sandbox
from rlmoptimizer.selection import (
    best_checked,
    first_sample_complete,
    never_worse,
    small_split_note,
    tiny_split_warning,
    with_spending_cap,
)
from rlmoptimizer.storage.directory import make_run_directory
from rlmoptimizer.storage.files import WriteFailed
from rlmoptimizer.storage.journal import RunJournal
from rlmoptimizer.storage.lock import RunDirectoryLock
from rlmoptimizer.storage.notes import NotesStore
from rlmoptimizer.storage.resume import (
    compile_manifest,
    metric_failed_message,
    missing_from_finished_run,
    open_run_directory,
    where_message,
)
from rlmoptimizer.storage.run_store import RunStore
from rlmoptimizer.usage import EVAL, ROOT, UsageMeter, UsageObserver

logger = logging.getLogger(__name__)


def _first_foreign(exc: BaseException) -> BaseException | None:
    """What ``exc`` (one of ours) was raised from that is not one of ours (the metric's own KeyError, an LM's
    error), or None: the error re-raised with where the paid work is shows that cause once, not each of our copies
    of the same message along the way."""
    return next((e for e in exception_chain(exc) if not type(e).__module__.startswith("rlmoptimizer.")), None)


class Compile:
    """The state of one compile(); see the module docstring for the flow."""

    def __init__(
        self,
        config: Any,
        student: dspy.Module,
        trainset: list[dspy.Example],
        valset: list[dspy.Example],
        metric: Metric,
        eval_lm: dspy.BaseLM | None,
    ) -> None:
        self.config = config
        self.trainset = trainset
        self.valset = valset
        self.metric = metric
        self.eval_lm = eval_lm
        self.step_lms = step_lms(student, eval_lm, "eval_lm" if config.eval_lm is not None else "dspy.settings.lm")
        # attempt=N sends the agent's requests with dspy's rollout_id=N: they miss the cache entries of every
        # other attempt (an identical compile() otherwise replays the whole agent from dspy's cache).
        self.root_lm = for_attempt(config.root_lm, config.attempt) if config.root_lm is not None else None
        self.sub_lm = for_attempt(config.sub_lm or config.root_lm, config.attempt)
        self.display = Display(config.verbose, config.console)
        self.tracker = MlflowTracker() if config.use_mlflow else None

        self.student = student
        # Every copy is made the same way; a program that cannot be copied apart is refused here, before any
        # LM call, not after the agent has run.
        self.program = copy_program(student)
        self.fingerprint = structural_fingerprint(self.program)
        check_structure(self.fingerprint, student)  # the copy is faithful: same fields, demos and modules
        self.initial_instructions = get_instructions(self.program)
        self.budget_limit = (budget_for_metric_calls if config.max_metric_calls else budget_for)(
            config.max_metric_calls or config.max_iterations, len(self.trainset), len(self.valset)
        )

        # One live compile per directory: take it before reading anything from it, give it up when run() ends
        # (or here, if the directory is refused). Reading back a finished run takes it without writing.
        self.lock: RunDirectoryLock | None = None
        if config.run_storage_dir is not None:
            directory = make_run_directory(Path(config.run_storage_dir))
            self.lock = RunDirectoryLock(directory, read_only=(directory / "result.json").exists())
        try:  # anything that stops the setup (a refusal, Ctrl-C while litellm loads) gives the directory up
            self._open_directory(config)
            self.cost_estimate = estimate_at_start(self)  # before any paid call: verbose shows it, the result checks it
            if not self.read_back:  # (a finished run read back pays nothing: nothing to warn of)
                tiny = tiny_split_warning(len(valset), len(trainset))  # said once: the warning, else the note
                self.display.message("" if tiny else small_split_note(len(valset), len(trainset)) or "")
                thin = config.max_metric_calls and thin_budget_warning(
                    config.max_metric_calls, len(trainset), len(valset)
                )
                for warning in (tiny, thin):
                    if warning:
                        logger.warning(warning)
        except BaseException:
            self.release()
            raise

    def _open_directory(self, config: Any) -> None:
        try:
            self.store = RunStore(config.run_storage_dir, pass_threshold=config.pass_threshold)
            self.directory = Path(self.store.directory)
            self.journal = RunJournal(self.directory)
        except (FileExistsError, NotADirectoryError) as exc:  # e.g. runs/ replaced by a file, or a symlink to nowhere
            raise ConfigurationError(
                f"the run directory {str(config.run_storage_dir)!r} cannot be opened: "
                f"{exc.filename or config.run_storage_dir} is not what a "
                f"compile left there ({exc.strerror or exc}). Put back the folder a compile made, or pass a new "
                "run_storage_dir"
            ) from exc
        except OSError as exc:  # no write access, a full disk, no temporary directory
            where = exc.filename or config.run_storage_dir or "a temporary run directory"
            raise ConfigurationError(
                f"{where} cannot be written ({exc.strerror or exc}): give this user write access or free space there, "
                "or pass another run_storage_dir"
            ) from exc
        manifest = compile_manifest(
            self.program,
            self.fingerprint,
            self.trainset,
            self.valset,
            self.eval_lm,
            self.metric.identity,
            self.budget_limit,
            config,
            adapter=dspy.settings.adapter,
            default_adapter=dspy.ChatAdapter(),
        )
        self.resume = open_run_directory(
            self.journal,
            manifest,
            allow_eval_lm_change=config.allow_eval_lm_change,
            allow_program_change=config.allow_program_change,
            hints={"metric": self.metric.mismatch_hint},
        )
        self.read_back = self.resume.finished  # a finished compile: read back, nothing runs
        self.usage = UsageMeter(max_cost_usd=config.max_cost_usd)
        self.usage.restore(self.journal.read_usage() if self.resume.resumed else None, finished=self.read_back)
        if self.read_back and self.usage.max_cost_usd != config.max_cost_usd:
            logger.warning(
                "%s holds a finished run, made with max_cost_usd=%s: it is returned as it ended, and a different "
                "max_cost_usd (%s) does not reopen it. To spend more, compile with a new run_storage_dir.",
                self.directory,
                self.usage.max_cost_usd,
                config.max_cost_usd,
            )
        gate = self.usage.gate() if config.max_cost_usd is not None else None  # the spending cap on reservations
        stored = self.resume.ledger_for(self.budget_limit, config.max_metric_calls, self.store.all())
        self.ledger = (
            BudgetLedger.from_snapshot(stored, gate=gate)
            if stored
            else BudgetLedger(self.budget_limit, gate=gate, sub_lm_limit=config.max_metric_calls)
        )
        self.observer = Observers(
            [
                self.journal,
                self.display,
                UsageObserver(self.usage, self.journal.write_usage, self.journal.write_usage_soon),
                *([self.tracker] if self.tracker else []),
                UserCallbacks(config.event_callbacks),
            ]
        )
        evaluator = Evaluator(
            metric=self.metric,
            lm=self.eval_lm,
            num_threads=config.num_threads,
            pass_threshold=config.pass_threshold,
            booked=lambda fn: self.usage.in_role(EVAL, fn),
            spent_all=lambda: self.usage.spent_all,
            distinct_examples=distinct_examples([self.trainset, self.valset or []]),
        )
        splits = {"train": self.trainset}
        if self.valset:
            splits["val"] = self.valset
        self.runs = Runs(
            evaluator=evaluator, store=self.store, ledger=self.ledger, splits=splits, observer=self.observer
        )
        self.journal.write_ledger_if_changed(self.ledger.snapshot())
        self.stop = StopRequest()
        self.working = WorkingProgram(
            program=self.program,
            fingerprint=self.fingerprint,
            runs=self.runs,
            stop=self.stop,
            observer=self.observer,
            demos_allowed=config.max_demos > 0,
        )
        self.notes = NotesStore(self.directory)
        self.services = CompileServices(
            runs=self.runs,
            ledger=self.ledger,
            working=self.working,
            notes=self.notes,
            usage=self.usage,
            observer=self.observer,
            sub_lm=self.sub_lm,
            attempt=config.attempt,
            max_demos=config.max_demos,
            format_failures=config.add_format_failure_as_feedback,
        )
        self.tools = AgentTools(self.services)

    def release(self) -> None:
        """Give the run directory up for the next compile()."""
        if self.lock is not None:
            self.lock.release()

    # -- the flow -----------------------------------------------------------------------------------
    def run(self) -> dspy.Module:
        try:
            if not self.read_back:
                self.journal.write_stop(None)  # a stop an earlier process wrote is not this one's
            return self._run_with_sandbox()
        except BaseException as exc:  # the report says why the run stopped, also long after the notebook is gone
            if not self.read_back:
                self.journal.write_stop(exc)
            raise
        finally:
            self.release()

    def _run_with_sandbox(self) -> dspy.Module:
        # Reading back a finished run: no agent, so no sandbox (and nothing written).
        # Nor in the "loop" mode: the default loop runs in Python, with no agent turn.
        no_agent = self.read_back or self.config.rlm_autopilot == "loop"
        sandbox = None if no_agent else Sandbox(timeout_s=self.config.sandbox_timeout_s)
        if sandbox is not None:
            sandbox.start_in_background()
        try:
            with tracked(self.tracker, self.config, self):  # MLflow, when asked for (not for a run read back)
                return self._run(sandbox)
        except KeyboardInterrupt as exc:
            raise OptimizationInterrupted(self._where("interrupted")) from exc
        except WriteFailed as exc:  # nothing kept is lost: the run resumes once the directory can be written
            raise OptimizationInterrupted(
                self._where(
                    f"stopped: it {exc}. Free space on that disk (or give the run directory back its write permission)"
                )
            ) from exc.error
        except MetricError as exc:  # resuming with the fixed metric is refused (another metric): say what works
            raise MetricError(
                f"{exc}\n{metric_failed_message(self.directory, self.store.is_temporary, self.metric.identity)}"
            ) from _first_foreign(exc)
        except RunDirectoryMismatchError:  # nothing was paid: resuming the same directory would fail the same way
            raise
        except RLMOptimizerError as exc:  # e.g. the evaluation LM is unusable: say where the paid work is
            raise type(exc)(f"{exc}\n{self._where('stopped')}") from _first_foreign(exc)
        except Exception as exc:
            raise OptimizationInterrupted(self._where(f"stopped by {type(exc).__name__}: {exc}")) from exc
        finally:
            if sandbox is not None:
                sandbox.shutdown()
            try:
                if sandbox is not None:
                    self.journal.write_usage(self.usage.snapshot())  # an interrupted run says what it spent
                self.store.flush()
                self.journal.flush()  # (its sync thread ends with the compile, however it ended)
            except WriteFailed as exc:  # the run already stops (or ends) with what it kept: say what could not be
                logger.warning("The run directory could not be written at the end of the run: %s", exc)
            self.metric.used()

    def _where(self, what: str) -> str:
        return where_message(what, self.directory, self.store.is_temporary)

    def _run(self, sandbox: Sandbox | None) -> dspy.Module:
        self.observer.on_event(CompileStarted(str(self.directory), self.ledger.snapshot(), self.resume.resumed))
        if self.resume.prompt_versions:
            self.working.restore_versions(list(self.resume.prompt_versions))
        # With max_metric_calls and a validation set, the train baseline is paid from the budget when read
        # (budget.baseline_on_demand): the agent's REPL reads it on first use, GEPA pays only what it draws.
        on_demand = baseline_on_demand(self.config.max_metric_calls, len(self.valset))
        baseline_train = (
            self.runs.complete_run("train", self.initial_instructions, "baseline")
            if on_demand
            else self._baseline("train")
        )
        if not self.read_back:  # a broken metric stops the run before anything is spent on it
            self.runs.check_baseline(baseline_train)
        baseline_val = self._baseline("val") if self.valset else None
        if not self.read_back:
            self.runs.check_baseline(baseline_val, scale=baseline_train is None)

        outcome = self._run_agent(sandbox, baseline_train, baseline_val)
        submission = {**self.working.instructions(), **outcome.submitted}
        selection = self._choose(submission, outcome.submitted_by)
        return self._build_result(selection, outcome)

    def _baseline(self, split: str) -> EvalRun:
        stored = self.runs.complete_run(split, self.initial_instructions, "baseline")
        if stored is not None:
            return stored
        if self.read_back:
            raise missing_from_finished_run(self.directory, f"the unchanged program's run on {split}")
        size = len(self.runs.splits[split])
        damaged = self.store.unreadable and any(not r.label.startswith("baseline") for r in self.store.all())
        if damaged and self.config.max_metric_calls is not None:  # it ran before (later runs exist): paid again
            if self.ledger.left_for(example_kind(split)) >= size:  # from the budget, so the limit still holds
                return self.runs.evaluate(copy_program(self.student), split, label="baseline")
            logger.warning(
                "The unchanged program's %s run is evaluated again (%d example(s)): its run file could not be read "
                "(%s), and the budget has too little left to pay for it, so the program runs up to %d more times "
                "than max_metric_calls=%d.",
                split,
                size,
                ", ".join(self.store.unreadable),
                size,
                self.config.max_metric_calls,
            )
        return self.runs.evaluate(copy_program(self.student), split, label="baseline", charged=False)

    def _run_agent(
        self, sandbox: Sandbox | None, baseline_train: EvalRun | None, baseline_val: EvalRun | None
    ) -> AgentOutcome:
        final = self.resume.final_turn
        if final is not None:  # the earlier compile got as far as the agent's submission
            return AgentOutcome.resumed(final, self.resume.turns)
        split = "val" if self.valset else "train"
        decided = no_check_left(self.services, split) if self.config.max_metric_calls else None
        if self.config.rlm_autopilot == "loop":
            return run_loop(self.tools.pilot, self.services, prior_turns=self.resume.turns, decided=decided)
        if sandbox is None:
            raise RuntimeError("a run that is not finished needs its sandbox")

        agent = OptimizerAgent(
            agent_signature(
                self.budget_limit,
                budget_note(
                    len(self.trainset), len(self.valset), self.config.max_iterations, self.config.max_metric_calls
                ),
                self.config.rlm_autopilot,
            ),
            TurnSettings.of(self.config),
            services=self.services,
            aids=long_run_aids(
                self.services,
                self.root_lm,
                self.config.root_context_window,
                self.config.rlm_max_output_chars,
                self.tools.pilot,
                decided,
            ),
            tools=self.tools.tool_functions(),
            interpreter_factory=sandbox.as_factory(),
            setup_code=render_setup_code(
                baseline_train.run_id if baseline_train else "",
                baseline_val.run_id if baseline_val else "",
                self.working.step_names,
            ),
            prior_turns=self.resume.turns,
            pending_reply=self.resume.pending_reply,
        )
        brief = render_task_brief(
            {name: str(p.signature.signature) for name, p in self.program.named_predictors()},
            len(self.trainset),
            len(self.valset),
            self.ledger.left,
            resumed=bool(self.resume.turns),
            pass_threshold=self.config.pass_threshold,
        )
        prediction = self.usage.in_role(ROOT, agent)(task_brief=brief)  # the agent asks self.root_lm, its aids'
        try:
            submitted = self.working.validate_prompt_map(prediction.optimized_dspy_program)
        except AgentToolError as exc:
            logger.warning("The agent's final output was not a valid submission (%s); keeping its prompt edits.", exc)
            submitted = {}
        return AgentOutcome(
            submitted=submitted,
            trajectory=tuple(agent.turns),
            final_reasoning=getattr(prediction, "final_reasoning", ""),
            submitted_by=getattr(prediction, "submitted_by", None) or AgentOutcome.submitted_by,
        )

    def _choose(self, submission: dict[str, str], submitted_by: str) -> Selection:
        """Evaluate the submission on the selection split unless a complete run of it exists, then apply the
        never-worse policy (:func:`rlmoptimizer.selection.never_worse`) to first samples (a lucky rollout never wins)."""
        split = "val" if self.valset else "train"
        size = len(self.valset) if self.valset else len(self.trainset)
        complete = first_sample_complete(self.runs.all(), split, size)
        train_runs = [r for r in self.runs.all() if r.split == "train"]
        runs = {
            "initial": self.initial_instructions,
            "train_runs": train_runs,
            "submitted_by": submitted_by,
            "own_demos": self.tools.moves.demo_sources,  # on train (no valset), a demo's own answer is no evidence
        }
        submitted_run = next((r for r in reversed(complete) if r.instructions == submission), None)
        cap_set = self.usage.max_cost_usd is not None
        cap = self.usage.cap_reason
        charged = self.ledger.left >= size - len(self.runs.stored(submission, split, range(size)))  # stored: free
        unpaid = "max_metric_calls left too few calls" if self.config.max_metric_calls and not charged else ""
        if submitted_run is None and self.read_back and self.resume.submission_checked:
            raise missing_from_finished_run(self.directory, f"the submission's run on {split}")  # never pay again
        stopped = cap or unpaid or ("spending stopped when this run finished" if self.read_back else "")
        if submitted_run is None and stopped:  # no more spending: never return an unchecked submission
            cut = [
                r for r in self.runs.all() if (r.split, r.label, r.instructions) == (split, "submission", submission)
            ]
            why = {"why": stopped, "spending_cap": bool(cap), "partial": cut[-1] if cut else None}
            return best_checked(split=split, complete=complete, **why, **runs)
        if submitted_run is None:
            self.working.set_instructions(submission, source="submission")
            submitted_run = self.working.evaluate(split, None, label="submission", charged=charged)
            if submitted_run.evaluated_count < size:  # cut short (the spending cap): checked on part of the split
                cap = self.usage.cap_reason
                return best_checked(
                    split=split,
                    complete=complete,
                    partial=submitted_run,
                    why=cap or submitted_run.note or "the check stopped early",
                    spending_cap=self.usage.cap_reached if cap_set else None,
                    **runs,
                )
            complete.append(submitted_run)
        selection = never_worse(
            split=split, complete=complete, submitted_run=submitted_run, submission=submission, **runs
        )
        return with_spending_cap(selection, self.usage.cap_reached if cap_set else None, cap)

    def _build_result(self, selection: Selection, outcome: AgentOutcome) -> dspy.Module:
        program = copy_program(self.student)
        apply_instructions(program, selection.instructions, whole=True)
        check_structure(self.fingerprint, program)
        runs = self.runs.all()
        result = CompileResult(
            optimized_dspy_program=dict(selection.instructions),
            latest_run_id=runs[-1].run_id if runs else None,
            trial_logs=tuple({**r.summary(), "instructions": dict(r.instructions)} for r in runs),
            agent_trajectory=outcome.trajectory,
            agent_final_reasoning=outcome.final_reasoning,
            selection=selection,
            budget=self.ledger.snapshot(),
            run_storage_dir=str(self.directory),
            step_lms={step: dict(info) for step, info in self.step_lms.items()},
            usage=self.usage.snapshot(),
            demo_sources=self.tools.moves.demo_train_ids(selection.instructions),
        )
        self.store.flush()
        never, examples, always_raised = steps_never_run(runs, self.working.step_names)
        if never and examples and not self.read_back:
            logger.warning(
                "Step(s) %s ran on none of the %d train example(s) evaluated (%s): no proposal could learn from their "
                "inputs and outputs, so they keep the instructions they came with unless you wrote others.",
                never,
                examples,
                "the program raised on every one of them before reaching them"
                if always_raised
                else "a branch the train set never takes? Add train examples that reach them",
            )
        replaced = [
            step
            for step, text in self.initial_instructions.items()
            if demos_step(step) and text != "[]" and selection.instructions.get(step, "[]") != text
        ]
        if replaced and not self.read_back:  # the program's own demos (the user's, another optimizer's) are gone
            logger.warning(
                "The returned program's demos of %s replace those the program came with (the chosen candidate's "
                "won); result.demo_sources says where the new ones came from. Pass max_demos=0 to keep yours.",
                ", ".join(repr(demos_step(step)) for step in replaced),
            )
        if not self.read_back:  # a finished run returned again writes nothing: its seed is the one it ran with
            self.journal.write_result({**result.result_file(), "seed": self.config.attempt})
        self.display.message(
            f"Done: {selection.reason}. Runs are in {self.directory}. LM usage: {self.usage.summary()}.", style="bold"
        )
        self.observer.on_event(CompileFinished(selection.to_dict(), self.ledger.snapshot()))
        self.journal.flush()  # the result on disk before it is returned (and the journal's sync thread gone)
        return present_result(program, result.attributes(), self, best_outputs=self.config.track_best_outputs)
