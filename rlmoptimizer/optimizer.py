"""``RLMDocstringOptimizer``: the DSPy teleprompter whose optimizer is an LLM agent in a sandboxed REPL.

The constructor checks every setting (:mod:`rlmoptimizer.inputs`) and ``compile()`` checks what it is given (the
student, its examples, the metric) before any LM call, with a message that says what to fix; then it runs one
:class:`~rlmoptimizer.flow.Compile` (the flow: baselines, the agent or the default loop, the never-worse choice,
the result), local to that call, so one optimizer can compile twice.

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

from rlmoptimizer.agent.window import check_root_window
from rlmoptimizer.budget import baseline_on_demand, gepa_metric_calls
from rlmoptimizer.errors import OptimizationInterrupted
from rlmoptimizer.estimate import CostEstimation
from rlmoptimizer.flow import Compile
from rlmoptimizer.inputs import check_compile_args, check_settings, resolve_eval_lm
from rlmoptimizer.metric import Metric
from rlmoptimizer.report import check_use_mlflow
from rlmoptimizer.sandbox.limits import instructions as sandbox_rules
from rlmoptimizer.storage.files import WriteFailed
from rlmoptimizer.student import check_examples, check_program, check_repl_data, warn_repeated_examples

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
        optimized.optimized_dspy_program  # {step name: instructions}, and "<step>:demos" where a step has demos
        ```

    Args:
        metric: ``metric(example, pred, trace=None)``, or GEPA's form with 5 arguments, returning a bool, any
            finite number, or ``dspy.Prediction(score=..., feedback=...)``. The one argument that may come first
            without its name, as in ``dspy.GEPA(metric, ...)``; here or to ``compile()``, which wins (with a warning when
            both are given).
        max_iterations: Budget multiplier: the agent may spend ``max_iterations * len(trainset) +
            len(valset)`` units, the baselines free. 5 when no budget is given (one of the four at most).
        max_metric_calls: Instead of ``max_iterations``, the budget in metric calls as ``dspy.GEPA`` counts
            them: every run of the program on one example, the baselines and the submission's validation check
            included. Refused below twice the validation set (the train set without one): the unchanged program's
            check and one candidate's.
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
            train example the program got right (the default loop proposes them once, after GEPA), from 0 to 16; 0
            switches demos off, so only instructions change. Demos the program already has are kept unless a
            winner replaces them.
        num_threads: Threads for evaluating examples; None takes ``dspy.settings.num_threads`` as it is when the
            optimizer is made.
        rlm_max_iterations: Agent turns before the agent must answer.
        rlm_max_llm_calls: Cap on the agent's own ``llm_query`` / ``llm_query_batched`` prompts in one run, on top
            of the budget (proposals, GEPA's reflections and analyses are not counted here); 0 allows none.
        rlm_max_output_chars: REPL output shown to the agent per turn, in characters (at least 100).
        root_stateful_session: With a ``root_lm`` on the OpenAI Responses API, each turn continues the
            previous response (``previous_response_id``) and sends only the new part; other LMs run statelessly.
        rlm_multiturn_history: Show the agent its REPL history as alternating assistant (its code) and user
            (the output) messages instead of one message.
        sandbox_timeout_s: Seconds of sandbox time one code cell may use (time spent in tools does not count);
            more than 0 and at most 86400 (one day).
        root_context_window: The root LM's input window in tokens; one too small for the agent's fixed prompt
            (about 4,600 tokens for the smallest program) is refused, naming the smallest that works. None takes it
            from litellm's model information, or 32,000 for a model litellm does not know.
        rlm_autopilot: Who runs the default loop (GEPA first, its best adopted and checked, targeted rounds,
            SUBMIT; the agent takes its next phase with the ``next_phase()`` tool). ``"assist"`` (the default):
            after a turn without progress (nothing spent or evaluated, no candidate, no note, no prompt change)
            the loop's next phase runs, marked ``[pilot]``; a turn whose cell failed first gets one more turn to fix
            it. ``"off"``: every turn is the agent's; the
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
            error when None. In a notebook rich shows a console's output in the cell whatever its ``file``: to
            send it to a file there, make it with ``Console(file=..., force_jupyter=False)``.
        use_mlflow: Log the run to MLflow (needs ``pip install "rlmoptimizer[mlflow]"``).
        callbacks: Objects with an ``on_event(event)`` method, or functions of the event, that see every event of
            the compile as it happens (the typed events of :mod:`rlmoptimizer.events`: compile started and finished,
            evaluations, examples, agent turns, prompt changes, candidates with their lineage, GEPA iterations,
            the budget on each). They observe only; one that raises is reported once and detached. A
            ``dspy.utils.BaseCallback`` here gets dspy's own ``on_compile_start`` / ``on_compile_end``, as with any
            dspy teleprompter.
        **dspy_gepa_arguments: ``dspy.GEPA``'s other arguments, each taken with its meaning here (``reflection_lm``
            is ``sub_lm``, ``log_dir`` is ``run_storage_dir``, ``seed`` is ``attempt``, ``perfect_score`` is
            ``pass_threshold``, ``track_stats``, ``track_best_outputs`` and ``add_format_failure_as_feedback``) or
            refused in one line saying what to write instead; any other name is refused naming the arguments it is
            close to.

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
        num_threads: int | None = None,
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
        """Optimize ``student`` and return a copy of it with the chosen instructions (and demos) applied.

        ``student`` itself is never changed. What it scores on validation (on train without a valset) is measured
        first, and the returned program never scores below it. With ``run_storage_dir`` set, everything paid for is
        kept there, and calling ``compile()`` again with the same arguments resumes a stopped run (or reads back a
        finished one at no cost).

        Args:
            student: The ``dspy.Module`` to optimize: its predictors' instructions (and demos) may change, nothing else.
            trainset: ``dspy.Example`` objects with their inputs marked (``.with_inputs(...)``): what the optimizer
                analyses and searches on.
            valset: Examples that choose what is returned; never shown to the optimizer LMs. Optional: without
                one, the train scores choose.
            metric: ``metric(example, prediction, trace=None)`` returning a number, a bool or a
                ``dspy.Prediction(score=..., feedback=...)``; overrides the constructor's.
            metric_id: A name that identifies the metric in the run directory on resume (overrides the constructor's).
            teacher: Not used: refused when given (dspy's teleprompters take one).
            **kwargs: None taken: MIPROv2's ``compile()`` arguments are refused naming where their meaning lives here.

        Returns:
            A copy of ``student`` with the optimized instructions and demos, and the result attributes
            (``detailed_results``, ``selection``, ``agent_trajectory``, ``usage``, ...; see the docs' API page).

        Raises:
            ConfigurationError: A bad program, examples, metric or setting, before anything is paid.
            MetricError: The metric returns no score.
            RunDirectoryMismatchError: ``run_storage_dir`` holds a run of another program, data, metric or LM.
            RunDirectoryInUseError: Another compile() is using ``run_storage_dir``.
            OptimizationInterrupted: The run stopped early (Ctrl-C, an LM that keeps failing, a full disk); the
                message says how to resume, and nothing paid for is lost.
        """
        if metric is not None and self.metric is not None and metric is not self.metric:
            logger.warning(
                "A metric was given to RLMDocstringOptimizer(...) and another to compile(): compile()'s (%s) is used.",
                getattr(metric, "__name__", type(metric).__name__),
            )
        metric = metric if metric is not None else self.metric
        check_compile_args(teacher, kwargs, metric)
        metric = Metric(metric, metric_id=metric_id if metric_id is not None else self.metric_id)
        check_program(student)
        trainset = check_examples(trainset, "trainset", program=student)
        valset = check_examples(valset, "valset", allow_empty=True, program=student) if valset is not None else []
        warn_repeated_examples(trainset, valset, student)
        eval_lm = resolve_eval_lm(self.eval_lm, student)
        config = self._sized(len(student.named_predictors()), len(trainset), len(valset))
        if config.rlm_autopilot != "loop":  # (the loop runs in Python: no sandbox holds the data)
            on_demand = baseline_on_demand(config.max_metric_calls, len(valset))  # then no more than it pays for
            check_repl_data(trainset, most=config.max_metric_calls - len(valset) if on_demand else None)
        check_root_window(config, sandbox_rules(self.sandbox_timeout_s), student, len(trainset), len(valset))
        try:
            return Compile(config, student, trainset, valset, metric, eval_lm).run()
        except WriteFailed as exc:  # before the run started (its directory, its manifest): nothing was paid yet
            raise OptimizationInterrupted(
                f"compile() stopped before the run started: it {exc}. Free space on that disk, or pass another "
                "run_storage_dir"
            ) from exc.error

    def _sized(self, steps: int, train_size: int, val_size: int) -> RLMDocstringOptimizer:
        """This optimizer, or with ``auto`` / ``max_full_evals`` a copy of it with the ``max_metric_calls`` they stand
        for on this program and data (sized per compile, as ``dspy.GEPA`` does; this one is never changed)."""
        calls = gepa_metric_calls(self.auto, self.max_full_evals, steps, train_size, val_size)
        if calls is None:
            return self
        sized = copy.copy(self)
        sized.max_metric_calls = calls
        return sized
