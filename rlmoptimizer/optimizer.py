"""``RLMDocstringOptimizer``: the DSPy teleprompter whose optimizer is an LLM agent in a sandboxed REPL.

The flow of one ``compile()``: check the inputs and fail fast (before any LM call) with a message that says what
to fix; copy the student (as leniently as dspy's Module.deepcopy, refused if it cannot be copied apart) and take
its structural fingerprint; start the sandbox in the background while the baseline runs on train and validation;
run the agent with the tools until it SUBMITs (or the default loop in Python); check the submission on validation,
and return the best of it and every candidate checked there (never worse than the student), with the result.

Per-compile state lives in a :class:`_Compile` local to ``compile()``, so one optimizer can compile twice. This
module only wires the rooms and runs the flow: checks in :mod:`rlmoptimizer.inputs`, the choice in
:mod:`rlmoptimizer.selection`, the agent in :mod:`rlmoptimizer.agent`, evaluations in
:mod:`rlmoptimizer.evaluation`, the run directory in :mod:`rlmoptimizer.storage`; what happens is sent as events
(:mod:`rlmoptimizer.events`) to the journal and the display.

May import: every room.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import dspy
from dspy.teleprompt.teleprompt import Teleprompter
from rich.console import Console

from rlmoptimizer.agent.agent import OptimizerAgent
from rlmoptimizer.agent.pilot import run_loop
from rlmoptimizer.agent.prompts import agent_signature, budget_note, render_setup_code, render_task_brief
from rlmoptimizer.agent.root_lm import for_attempt
from rlmoptimizer.agent.services import CompileServices, TurnSettings
from rlmoptimizer.agent.state import long_run_aids, no_check_left
from rlmoptimizer.agent.stop import StopRequest
from rlmoptimizer.agent.tools import AgentTools
from rlmoptimizer.agent.window import check_root_window
from rlmoptimizer.agent.working_program import WorkingProgram
from rlmoptimizer.budget import BudgetLedger, baseline_on_demand, budget_for, budget_for_metric_calls, gepa_metric_calls
from rlmoptimizer.display import Display
from rlmoptimizer.errors import (
    AgentToolError,
    MetricError,
    OptimizationInterrupted,
    RLMOptimizerError,
    RunDirectoryMismatchError,
)
from rlmoptimizer.estimate import CostEstimation, estimate_at_start
from rlmoptimizer.evaluation.evaluator import Evaluator
from rlmoptimizer.evaluation.runs import Runs
from rlmoptimizer.events import CompileFinished, CompileStarted, Observers, UserCallbacks
from rlmoptimizer.fingerprint import (
    apply_instructions,
    check_structure,
    copy_program,
    get_instructions,
    structural_fingerprint,
)
from rlmoptimizer.inputs import check_compile_args, check_settings, make_run_directory, resolve_eval_lm, step_lms
from rlmoptimizer.metric import Metric
from rlmoptimizer.records import AgentOutcome, CompileResult, EvalRun, Selection
from rlmoptimizer.report import MlflowTracker, check_use_mlflow, present_result, tracked
from rlmoptimizer.sandbox import Sandbox
from rlmoptimizer.sandbox.limits import instructions as sandbox_rules
from rlmoptimizer.selection import best_checked, first_sample_complete, never_worse, small_split_note, with_spending_cap
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
from rlmoptimizer.student import check_examples, check_program
from rlmoptimizer.usage import EVAL, ROOT, UsageMeter, UsageObserver

logger = logging.getLogger(__name__)


class RLMDocstringOptimizer(CostEstimation, Teleprompter):
    """Optimize the instructions of every predictor of a DSPy program with an RLM agent.

    The agent is an RLM (a ``dspy.Module``) working in a sandboxed Python REPL (Deno + Pyodide) that holds the evaluation
    data of the program: it analyses the failures with code, asks the sub-LM about them, proposes and compares
    instructions (with GEPA's moves) and demos, and submits a ``{step name: instructions}`` map (``"step:demos"``
    keys for demos). Fields and the program's structure stay as they are.

    ``compile(student, *, trainset, valset=None, metric=None, metric_id=None)`` returns a copy of ``student``
    with the best candidate checked on validation (on train without a valset) applied, never one that scores
    worse than ``student`` there, and with the result attributes attached (``optimized_dspy_program``,
    ``selection``, ``trial_logs``, ``agent_trajectory``, ``detailed_results``, ``budget``, ``usage``, ...).

    The budget is ``max_iterations * len(trainset) + len(valset)`` units: one evaluated example costs 1,
    one sub-LM prompt (the agent's ``llm_query``) costs 1; baseline runs and the agent's own turns are free.
    With ``max_metric_calls`` instead, every run of the program counts (baselines and the final check too),
    as ``dspy.GEPA`` counts them: the budget is what the validation baseline leaves of it, and the train baseline
    is paid from it when first read.

    Example:
        ```python
        optimizer = RLMDocstringOptimizer(
            max_iterations=5,
            root_lm=dspy.LM("openai/gpt-4o"),
            sub_lm=dspy.LM("openai/gpt-4o-mini"),
            eval_lm=dspy.LM("openai/gpt-4o-mini"),
            run_storage_dir="runs/route-v1",
        )
        optimized = optimizer.compile(program, trainset=trainset, valset=valset, metric=metric)
        optimized.optimized_dspy_program  # {step name: instructions}
        ```

    Args:
        metric: ``metric(example, pred, trace=None)``, or GEPA's form with 5 arguments, returning a bool, any
            finite number, or ``dspy.Prediction(score=..., feedback=...)``. The one argument that may come first
            without its name, as in ``dspy.GEPA(metric, ...)``; here or to ``compile()``, which wins.
        max_iterations: Budget multiplier: the agent may spend ``max_iterations * len(trainset) +
            len(valset)`` units, the baselines free. 5 when no budget is given (one of the four at most).
        max_metric_calls: Instead of ``max_iterations``, the budget in metric calls as ``dspy.GEPA`` counts
            them: every run of the program on one example, the baselines and the submission's validation check
            included. Refused when it does not cover the baseline on validation (on train without a valset).
        auto: ``"light"``, ``"medium"`` or ``"heavy"``: ``max_metric_calls`` sized in ``compile()`` as
            ``dspy.GEPA`` sizes it, from the number of steps and the validation set's size (the train set's without one).
        max_full_evals: ``max_metric_calls`` of that many evaluations of the train and validation sets together, as
            ``dspy.GEPA`` counts it.
        root_lm: The optimizer agent's LM; it writes one code cell per turn, so give it a model that writes
            working Python over several turns. Required, except with ``rlm_autopilot="loop"``, which never calls it
            (``sub_lm`` is then required).
        sub_lm: The LM behind ``llm_query`` / ``llm_query_batched`` in the REPL, the instruction proposals and
            GEPA's reflections. Defaults to ``root_lm``.
        eval_lm: The LM the program runs with during optimization, pinned for the whole run (an LLM-judge
            metric using ``dspy.settings.lm`` gets it too). Defaults to ``dspy.settings.lm``; a predictor with
            its own LM (``set_lm``) keeps it.
        metric_id: A name that identifies the metric in a run directory, overriding how it is recognised on
            resume. Here or to ``compile()``.
        pass_threshold: An example passes when its score is at least this, on the metric's own scale (e.g. 5
            for a 0-5 judge); scores are never rescaled.
        max_demos: The demos ``propose_demos`` gives a step by default, each the step's own inputs and outputs on a
            train example the program got right (the default loop proposes them once, after GEPA); 0 switches
            demos off, so only instructions change. Demos the program already has are kept unless a winner replaces them.
        num_threads: Threads for evaluating examples; None takes ``dspy.settings.num_threads``.
        rlm_max_iterations: Agent turns before the agent must answer.
        rlm_max_llm_calls: Cap on sub-LM calls in one run, on top of the budget (0: none).
        rlm_max_output_chars: REPL output shown to the agent per turn, in characters (at least 100).
        root_stateful_session: With a ``root_lm`` on the OpenAI Responses API, each turn continues the
            previous response (``previous_response_id``) and sends only the new part; other LMs run statelessly.
        rlm_multiturn_history: Show the agent its REPL history as alternating assistant (its code) and user
            (the output) messages instead of one message.
        sandbox_timeout_s: Seconds of sandbox time one code cell may use (time spent in tools does not count);
            more than 0 and at most 86400 (one day).
        root_context_window: The root LM's input window in tokens (at least 4000). None takes it from
            litellm's model information, or 32,000 for a model litellm does not know.
        rlm_autopilot: Who runs the default loop (GEPA first, its best adopted and checked, targeted rounds,
            SUBMIT; the agent takes its next phase with the ``next_phase()`` tool). ``"assist"`` (the default):
            after a turn without progress (nothing spent or evaluated, no candidate, no note, no prompt change)
            the loop's next phase runs, marked ``[pilot]``. ``"off"``: every turn is the agent's; the
            loop's next action is only shown. ``"loop"``: the loop runs to its end in Python, with no agent turn, no root-LM call
            and no sandbox (for a weak or costly root LM, and the baseline the agent is measured against). True
            and False mean ``"assist"`` and ``"off"``.
        max_cost_usd: A spending cap in dollars on the run's LM calls, priced by litellm; None for no cap.
        attempt: ``attempt=N`` (N > 0) sends the agent's and the sub-LM's requests with dspy's
            ``rollout_id=N``, so a run identical to an earlier one asks afresh past dspy's cache; 0 replays it.
        verbose: Show a panel for each agent turn and one live progress display per evaluation; False prints
            nothing.
        run_storage_dir: Where runs, prompt versions, agent turns, the ledger and the result are written as
            they happen; ``compile()`` again with the same directory resumes (or returns a finished run). A
            temporary directory when None.
        allow_eval_lm_change: Resume a ``run_storage_dir`` whose stored scores came from another evaluation
            LM (other model or sampling settings), reusing those scores as if the new LM had produced them.
        allow_program_change: Resume a ``run_storage_dir`` written before the program's own code (its
            ``forward`` or another method) changed, reusing the old code's records as the new code's.
        console: The ``rich.console.Console`` that ``verbose`` output goes to; a new one writing to standard
            error when None.
        use_mlflow: Log the run to MLflow (needs ``pip install "rlmoptimizer[mlflow]"``).
        callbacks: Objects with an ``on_event(event)`` method, or functions of the event, that see every event of
            the compile as it happens (the typed events of :mod:`rlmoptimizer.events`: compile started and finished,
            evaluations, examples, agent turns, prompt changes, candidates with their lineage, GEPA iterations,
            the budget on each). They observe only; one that raises is reported once and detached. A
            ``dspy.utils.BaseCallback`` here gets dspy's own ``on_compile_start`` / ``on_compile_end``, as with any
            dspy teleprompter.
        **dspy_gepa_arguments: ``dspy.GEPA``'s other arguments, each taken with its meaning here (``reflection_lm``
            is ``sub_lm``, ``log_dir`` is ``run_storage_dir``, ``seed`` is ``attempt``, ``perfect_score`` is
            ``pass_threshold``, ``track_stats`` and ``track_best_outputs``) or refused in one line saying what to write
            instead; any other name is refused naming the arguments it is close to.

    Raises:
        ConfigurationError: A bad argument here or in ``compile()``, before any LM call, saying what to fix.
    """

    def __init__(
        self,
        metric: Any = None,
        *,
        # budget (one at most)
        max_iterations: int | None = None,
        max_metric_calls: int | None = None,
        auto: str | None = None,
        max_full_evals: int | None = None,
        # models
        root_lm: dspy.BaseLM | None = None,
        sub_lm: dspy.BaseLM | None = None,
        eval_lm: dspy.BaseLM | None = None,
        # scoring
        metric_id: str | None = None,
        pass_threshold: float = 1.0,
        max_demos: int = 4,
        num_threads: int | None = 8,
        # the agent
        rlm_max_iterations: int = 200,
        rlm_max_llm_calls: int = 200,
        rlm_max_output_chars: int = 10_000,
        root_stateful_session: bool = True,
        rlm_multiturn_history: bool = False,
        sandbox_timeout_s: float = 120.0,
        root_context_window: int | None = None,
        rlm_autopilot: bool | str = "assist",
        max_cost_usd: float | None = None,
        attempt: int = 0,
        # output and storage
        verbose: bool = False,
        run_storage_dir: str | Path | None = None,
        allow_eval_lm_change: bool = False,
        allow_program_change: bool = False,
        console: Console | None = None,
        use_mlflow: bool = False,
        callbacks: list[Any] | None = None,
        # dspy.GEPA's other names, translated or refused (inputs.from_dspy_gepa)
        **dspy_gepa_arguments: Any,
    ) -> None:
        given = {k: v for k, v in locals().items() if k not in ("self", "__class__", "dspy_gepa_arguments")}
        super().__init__()
        vars(self).update(check_settings(given, dspy_gepa_arguments))  # every argument checked, in inputs.py
        self.use_mlflow = check_use_mlflow(use_mlflow)
        check_root_window(self._sized(1, 1, 0), sandbox_rules(self.sandbox_timeout_s))  # too small for any request

    def compile(
        self,
        student: dspy.Module,
        *,
        trainset: list,
        teacher: Any = None,
        valset: list | None = None,
        metric: Any = None,
        metric_id: str | None = None,
        **kwargs: Any,
    ) -> dspy.Module:
        """Return a copy of ``student`` with optimized instructions and the result attributes attached."""
        metric = metric if metric is not None else self.metric
        check_compile_args(teacher, kwargs, metric)
        metric = Metric(metric, metric_id=metric_id if metric_id is not None else self.metric_id)
        check_program(student)
        trainset = check_examples(trainset, "trainset", program=student)
        valset = check_examples(valset, "valset", allow_empty=True, program=student) if valset is not None else []
        eval_lm = resolve_eval_lm(self.eval_lm, student)
        config = self._sized(len(student.named_predictors()), len(trainset), len(valset))
        check_root_window(config, sandbox_rules(self.sandbox_timeout_s), student, len(trainset), len(valset))
        return _Compile(config, student, trainset, valset, metric, eval_lm).run()

    def _sized(self, steps: int, train_size: int, val_size: int) -> RLMDocstringOptimizer:
        """This optimizer, or with ``auto`` / ``max_full_evals`` a copy of it with the ``max_metric_calls`` they stand
        for on this program and data (sized per compile, as ``dspy.GEPA`` does; this one is never changed)."""
        calls = gepa_metric_calls(self.auto, self.max_full_evals, steps, train_size, val_size)
        if calls is None:
            return self
        sized = copy.copy(self)
        sized.max_metric_calls = calls
        return sized


class _Compile:
    """The state of one compile(); see the module docstring for the flow."""

    def __init__(
        self,
        config: RLMDocstringOptimizer,
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
            self.display.message(small_split_note(len(valset), len(trainset)) or "")
        except BaseException:
            self.release()
            raise

    def _open_directory(self, config: RLMDocstringOptimizer) -> None:
        self.store = RunStore(config.run_storage_dir, pass_threshold=config.pass_threshold)
        self.directory = Path(self.store.directory)
        self.journal = RunJournal(self.directory)
        manifest = compile_manifest(
            self.program,
            self.fingerprint,
            self.trainset,
            self.valset,
            self.eval_lm,
            self.metric.identity,
            self.budget_limit,
            config,
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
        self.usage.restore(self.journal.read_usage() if self.resume.resumed else None)
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
                UsageObserver(self.usage, self.journal.write_usage),
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
        )
        self.tools = AgentTools(self.services)

    def release(self) -> None:
        """Give the run directory up for the next compile()."""
        if self.lock is not None:
            self.lock.release()

    # -- the flow -----------------------------------------------------------------------------------
    def run(self) -> dspy.Module:
        try:
            return self._run_with_sandbox()
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
        except MetricError as exc:  # resuming with the fixed metric is refused (another metric): say what works
            raise MetricError(
                f"{exc}\n{metric_failed_message(self.directory, self.store.is_temporary, self.metric.identity)}"
            ) from exc
        except RunDirectoryMismatchError:  # nothing was paid: resuming the same directory would fail the same way
            raise
        except RLMOptimizerError as exc:  # e.g. the evaluation LM is unusable: say where the paid work is
            raise type(exc)(f"{exc}\n{self._where('stopped')}") from exc
        except Exception as exc:
            raise OptimizationInterrupted(self._where(f"stopped by {type(exc).__name__}: {exc}")) from exc
        finally:
            if sandbox is not None:
                sandbox.shutdown()
                self.journal.write_usage(self.usage.snapshot())  # an interrupted run says what it spent
            self.store.flush()
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
        runs = {"initial": self.initial_instructions, "train_runs": train_runs, "submitted_by": submitted_by}
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
        if not self.read_back:  # a finished run returned again writes nothing: its seed is the one it ran with
            self.journal.write_result({**result.result_file(), "seed": self.config.attempt})
        self.display.message(
            f"Done: {selection.reason}. Runs are in {self.directory}. LM usage: {self.usage.summary()}.", style="bold"
        )
        self.observer.on_event(CompileFinished(selection.to_dict(), self.ledger.snapshot()))
        return present_result(result.attach_to(program), self, best_outputs=self.config.track_best_outputs)
