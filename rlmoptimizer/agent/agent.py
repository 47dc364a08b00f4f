"""The optimizer agent: a ``dspy.Module`` that owns its turn loop in the sandbox, on the optimization budget.

It is not a ``dspy.RLM`` subclass: it keeps dspy's REPL types and the RLM field names (so histories render as
dspy renders them) but none of RLM's loop, predictors or sub-agents.

- The turn's signature is ours (:func:`~rlmoptimizer.agent.prompts.action_signature`): the instructions, how a
  turn works and each tool once. The code of a reply is read by :func:`~rlmoptimizer.agent.cells.cell_of`.
- ``llm_query`` / ``llm_query_batched`` (:func:`~rlmoptimizer.agent.sub_lm.sub_lm_tools`) charge one budget
  unit per prompt to the :class:`~rlmoptimizer.budget.BudgetLedger` (reserve first, so nothing is overspent).
- The pilot (:class:`~rlmoptimizer.agent.pilot.Pilot`) runs the default policy: the agent takes its next phase with
  the ``next_phase()`` tool; with ``pilot_mode="assist"`` the loop takes one itself after a turn that made no
  progress (nothing spent or evaluated, no candidate, no note, no prompt change: measured from the services, never
  from the cell's text). A submission the pilot makes ends the run after that turn.
- A root-LM reply that does not parse is retried, then shown to the agent as an error turn; it does not end the
  run. One that holds a ```python block is not retried: the block runs, with a note to the agent. A reply cut off at the root LM's output limit is named to the agent first in the turn's output.
- Each turn is sent to the observer as :class:`~rlmoptimizer.events.AgentTurn` as soon as it exists, kept in
  :attr:`OptimizerAgent.turns`; a run can resume from them.
- After each turn the loop checks its :class:`~rlmoptimizer.agent.stop.StopRequest`: a tool that met a
  systemic failure asked it to stop, and the loop raises that failure.
- Setup code (loading the evaluation data) runs once per sandbox process and is replayed by the sandbox after a
  restart.
- A :class:`~rlmoptimizer.agent.bounded_context.BoundedContext` fits each request to the root LM's window (a refusal
  compacts harder); a :class:`~rlmoptimizer.usage.UsageMeter` books sub-LM calls to the ``sub`` role.
- ``acall`` / ``aforward`` run the same budgeted loop in a worker thread.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import contextvars
import functools
import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dspy
from dspy import AdapterParseError, ChatAdapter, CodeInterpreter, Prediction

from rlmoptimizer.agent._dspy import (
    CodeExecutionError,
    FinalOutput,
    REPLHistory,
    REPLVariable,
    format_error_for_lm,
    resolve_interpreter_factory,
)
from rlmoptimizer.agent.bounded_context import is_context_refusal, turn_inputs, window_too_small
from rlmoptimizer.agent.cells import cell_of, fenced_action, import_note
from rlmoptimizer.agent.pilot import LOOP_SUBMISSION
from rlmoptimizer.agent.prompts import CUT_OFF_NOTE, action_signature, extract_signature, tool_docs_code
from rlmoptimizer.agent.root_lm import TurnSender, calls_since, cut_off_since, history_mark
from rlmoptimizer.agent.services import CompileServices, TurnAids, TurnSettings
from rlmoptimizer.agent.stop import (
    StopRequest,
    current_instructions_submitted,
    stop_if_the_sub_lm_is_unusable,
    sub_lm_move_ended,
)
from rlmoptimizer.agent.sub_lm import sub_lm_tools
from rlmoptimizer.agent.texts import kept_output, valid_text, without_media
from rlmoptimizer.budget import BudgetLedger
from rlmoptimizer.events import NO_OBSERVER, AgentReplied, AgentTurn
from rlmoptimizer.records import turn_record
from rlmoptimizer.storage.answers import AnswerStore

logger = logging.getLogger(__name__)

PILOT = "[pilot]"
"""Opens what the pilot adds to a turn's output (the host writes it; the root LM cannot copy it into a turn)."""
UNPARSED_TURNS = 3
"""After this many turns in a row whose root-LM reply never parsed (each retried), the root LM is not asked again: the
run ends with the current instructions (with ``"assist"``, the default loop took a phase after each of them)."""
FIELDS_MISSED = (
    "[note] Your reply had no [[ ## code ## ]] field, so its ```python block ran as the code. Reply with the fields "
    "as specified."
)
NO_PROGRESS = "this turn spent nothing, evaluated nothing new, made no candidate, added no note and changed no prompt"


def _root_adapter(*, last_attempt: bool):
    """The adapter for one root-LM attempt. Unless the user configured one, dspy's ChatAdapter, whose fallback
    to JSONAdapter after a reply that does not parse is kept for the last attempt only: the fallback's prompt
    differs from the first ~150 tokens on, so every prompt-prefix cache (a local server's, a provider's
    prompt caching) misses and the whole history is paid for again, while a plain retry reuses it."""
    return dspy.settings.adapter or ChatAdapter(use_json_adapter_fallback=last_attempt)


def _append(history: REPLHistory, *, more: str | None = None, **fields: str) -> REPLHistory:
    """``history`` with one more turn, its texts made valid Unicode and freed of media markers first
    (:mod:`~rlmoptimizer.agent.texts`). An output is kept to :func:`~rlmoptimizer.agent.texts.kept_output`'s bound
    (the root LM is shown less of it still). ``more``: a line added after an output that is already kept (what the
    pilot ran, the submission), kept to the bound on its own, so the output before it is not cut twice."""
    if "output" in fields:
        fields["output"] = kept_output(fields["output"], history.max_output_chars)
        if more is not None:
            fields["output"] = f"{fields['output']}\n{kept_output(more, history.max_output_chars)}"
    return history.append(**{name: valid_text(without_media(text)) for name, text in fields.items()})


def _json_object(value: Any) -> Any:
    """A SUBMIT value given as the text of a dict, as that dict (small models write it so): JSON, also with raw
    newlines inside its strings, or a Python literal (``str(prompts)``); else the value as is."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        for parse in (lambda text: json.loads(text, strict=False), ast.literal_eval):
            try:
                parsed = parse(value)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(parsed, dict):
                return parsed
    return value


class OptimizerAgent(dspy.Module):
    """The optimizer agent: its turn loop in a REPL, budgeted sub-LM calls, tolerant turns, per-turn events, the
    pilot, a stop request and resume.

    Built for one compile(): :attr:`turns` holds the trajectory (earlier turns first, on a resume)."""

    def __init__(
        self,
        signature,
        settings: TurnSettings | None = None,
        *,
        services: CompileServices | None = None,
        aids: TurnAids | None = None,
        tools: Sequence[Callable] = (),
        interpreter_factory: Callable[[], CodeInterpreter] | None = None,
        setup_code: str = "",
        prior_turns: Sequence[dict[str, Any]] = (),
        pending_reply: dict[str, Any] | None = None,
    ) -> None:
        """``services``: the compile the agent works for (its ledger pays the sub-LM calls, its observer hears of
        every turn, its stop request ends the loop, its working program checks the submission); None for an agent
        that only measures its requests (no sub-LM budget). ``aids``: what a long run adds to each turn.
        ``pending_reply``: the root LM's reply of a turn an earlier process was cut off in (it runs again, unpaid)."""
        super().__init__()
        settings = settings or TurnSettings()
        aids = aids or TurnAids()
        self.signature = dspy.ensure_signature(signature)
        self.max_iters = settings.max_iters
        self.max_llm_calls = settings.max_llm_calls
        self.max_output_chars = settings.max_output_chars
        self.sub_lm = services.sub_lm if services is not None else None
        self._factory = interpreter_factory
        self._tools = list(tools)
        self.generate_action = dspy.Predict(
            action_signature(
                self.signature.instructions,
                self._tools,
                getattr(self._factory, "execution_instructions", "") if self._factory is not None else "",
            )
        )
        self.extract = dspy.Predict(extract_signature(self.signature))
        if aids.root_lm is not None:  # the LM the context was fitted to answers every turn
            self.generate_action.lm = self.extract.lm = aids.root_lm
        # What the root LM is sent per turn (rlmoptimizer.agent.root_lm); None keeps dspy's rendering unchanged.
        self._turn_sender = (
            TurnSender(
                stateful=settings.stateful_session, multiturn=settings.multiturn_history, max_iters=self.max_iters
            )
            if settings.stateful_session or settings.multiturn_history
            else None
        )
        self._ledger = services.ledger if services is not None else BudgetLedger(0)
        self._setup_code = setup_code
        self._observer = services.observer if services is not None else NO_OBSERVER
        self._stop = services.stop if services is not None else StopRequest()
        self._prior_turns = [dict(t) for t in prior_turns]
        self._pending_reply = dict(pending_reply) if pending_reply else None
        self.turns: list[dict[str, Any]] = [dict(t) for t in prior_turns]
        self._parse_retries = settings.parse_retries
        self._validate_submission = services.working.validate_submission if services is not None else None
        self._current = services.working.instructions if services is not None else dict
        self._keeps_current_prompts = services is not None
        self._prompts_shown: dict | None = None  # the instructions the REPL's current_prompts was last set to
        self._context = aids.context
        self._state_block = aids.state_block
        self._pilot = aids.pilot
        self._assist = settings.pilot_mode == "assist" and aids.pilot is not None
        self._usage = services.usage if services is not None else None
        self._run_end = aids.run_end
        self._context_refusal_retries = settings.context_refusal_retries
        self._as_sub = services.as_sub if services is not None else (lambda fn: fn)
        self._answers = AnswerStore(services.directory if services is not None else None)  # llm_query's, kept
        self._pilot_ran: list[str] = []  # the pilot's actions in the current turn
        self._failed = False  # the current turn's cell failed: an error, a refused SUBMIT, a reply that did not parse
        self._failed_before = False  # so did the turn before it, which made no progress either
        self._replayed = False  # the current turn runs the reply of a turn an earlier process was cut off in
        self._json_replies = False  # a reply parsed only with the JSON fallback: every attempt offers it from then on

    async def aforward(self, **input_args: Any) -> Prediction:
        """The same budgeted loop as :meth:`forward`, in a worker thread (the sandbox and the tools block)."""
        return await asyncio.to_thread(contextvars.copy_context().run, lambda: self.forward(**input_args))

    # -- the loop ---------------------------------------------------------------------------------------
    def forward(self, *, interpreter_factory: Callable[[], CodeInterpreter] | None = None, **input_args) -> Prediction:
        expected = set(self.signature.input_fields)
        if set(input_args) != expected:
            raise ValueError(f"the agent takes the inputs {sorted(expected)}, got {sorted(input_args)}")
        factory = interpreter_factory or resolve_interpreter_factory(self._factory)
        output_field_names = list(self.signature.output_fields.keys())
        variables = self.variables(**input_args)

        with (
            self._interpreter(factory) as repl,
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlmoptimizer-setup") as pool,
        ):
            # The REPL's setup waits for the sandbox's start; the first root-LM call does not need it, so the two
            # overlap and the start is hidden behind the LM (the sandbox serializes calls from any thread).
            setup = pool.submit(contextvars.copy_context().run, self._prepare_repl, repl, input_args)
            regular_args = None

            history = REPLHistory(max_output_chars=self.max_output_chars)
            for turn in self._prior_turns:
                history = _append(
                    history, reasoning=turn.get("reasoning", ""), code=turn["code"], output=turn["output"]
                )

            unparsed = 0  # turns in a row whose reply never parsed
            for iteration in range(len(history), self.max_iters):
                if self._run_end is not None and self._run_end.ends_run():
                    setup.result()
                    return self._ended(self._run_end.outcome(history, output_field_names), iteration)
                self._pilot_ran, self._failed, self._replayed = [], False, False
                progress = self._pilot.progress() if self._pilot is not None else None
                if unparsed >= UNPARSED_TURNS:
                    setup.result()
                    return self._ended(self._unusable_root(history, output_field_names), iteration)
                action = self._reply(variables, history, iteration)
                if regular_args is None:
                    regular_args = setup.result()
                if isinstance(action, REPLHistory):  # a reply that never parsed, recorded as an error turn
                    result = action
                    unparsed += 1
                    self._failed = True
                else:
                    unparsed = 0
                    result = self._run_action(repl, action, history, regular_args, output_field_names)
                if isinstance(result, REPLHistory):
                    result = self._after_turn(history, result, progress, output_field_names)
                if isinstance(result, Prediction):
                    outputs = {name: result[name] for name in output_field_names}
                    by = getattr(result, "submitted_by", None)
                    self._report(result.trajectory[-1], iteration, final=True, outputs=outputs, submitted_by=by)
                    self._stop.raise_if_requested()
                    return result
                self._report(result.entries[-1].model_dump(), iteration, final=False)
                self._stop.raise_if_requested()
                history = result

            setup.result()
            spent_all = self._run_end.spent_all() if self._run_end is not None else None
            if spent_all is not None:  # the extraction is a root-LM call too: not made past the cap
                ended = current_instructions_submitted(
                    history, output_field_names, f"{spent_all}; the agent ran out of turns"
                )
                return self._ended(ended, len(history))
            return self._ended(self._extract_fallback(variables, history, output_field_names), len(history))

    def _unusable_root(self, history: REPLHistory, output_field_names: list[str]) -> Prediction:
        why = (
            f"the root LM's replies did not parse in {UNPARSED_TURNS} turns in a row (root_lm does not follow the "
            "turn's format: reasoning, then code; a model that writes code reliably, or rlm_autopilot='loop', "
            "avoids this)"
        )
        logger.warning("%s; the run ends with the current instructions.", why)
        return current_instructions_submitted(history, output_field_names, why)

    def _ended(self, prediction: Prediction, iteration: int) -> Prediction:
        """``prediction`` (a run ended without a SUBMIT), recorded as the trajectory's final turn: no code, the
        outputs as submitted, so that the result and its reason read back the same (a resume takes them)."""
        outputs = {name: prediction[name] for name in self.signature.output_fields}
        shown = outputs if any(outputs.values()) else "the current instructions (the edits and adopted candidates)"
        entry = {"reasoning": prediction.final_reasoning, "code": "", "output": f"FINAL: {shown}"}
        self._report(entry, iteration, final=True, outputs=outputs, submitted_by=prediction.submitted_by)
        return prediction

    def variables(self, **input_args: Any) -> list[REPLVariable]:
        """The inputs as the root LM is told about them (name, type, length, a preview)."""
        return [
            REPLVariable.from_value(name, value, field_info=self.signature.input_fields.get(name))
            for name, value in input_args.items()
        ]

    @contextlib.contextmanager
    def _interpreter(self, factory: Callable[[], CodeInterpreter]):
        """One interpreter for this run, with the tools (``llm_query``, ``llm_query_batched`` and ours) and the
        output fields ``SUBMIT`` takes; shut down at the end."""
        repl = factory()
        try:
            llm_tools = sub_lm_tools(
                self.sub_lm,
                max_llm_calls=self.max_llm_calls,
                ledger=self._ledger,
                usage=self._usage,
                observer=self._observer,
                as_sub=self._as_sub,
                on_failure=functools.partial(stop_if_the_sub_lm_is_unusable, self._stop),
                on_answer=functools.partial(sub_lm_move_ended, self._stop, None, True),  # it answers: not down
                answers=self._answers,
                scope=lambda: f"turn {len(self.turns) + 1}",  # a turn run again after an interrupt gets its answers
            )
            repl.tools.update({**llm_tools, **{tool.__name__: tool for tool in self._tools}})
            if hasattr(repl, "output_fields"):
                repl.output_fields = [{"name": name} for name in self.signature.output_fields]
            yield repl
        finally:
            repl.shutdown()

    def _prepare_repl(self, repl, input_args) -> dict[str, Any]:
        """Start the REPL, run our data-loading setup code, then mark it for replay after a restart. (dspy's sandbox
        sub-agent facade is not installed: ``llm_query`` and the moves are the agent's sub-LM.)"""
        start = getattr(repl, "start", None)
        if callable(start):
            start()
        regular_args = dict(input_args)
        # help(compare) in the REPL prints what the tool list shortens; one execute with the data's setup
        setup = (tool_docs_code(self._tools) if self._tools else "") + self._setup_code
        if setup:
            repl.execute(setup)
        mark = getattr(repl, "mark_setup_complete", None)
        if callable(mark):
            mark()
        return regular_args

    def _reply(self, variables, history, iteration):
        """The turn's action: the reply an earlier process got for this turn and was cut off while running (not
        asked for again), else the root LM's (:meth:`_next_action`), kept before its code runs."""
        pending, self._pending_reply = self._pending_reply, None
        if pending is not None and pending["iteration"] == iteration + 1:
            logger.info("Turn %d: running the root LM's reply again (its turn was cut off).", iteration + 1)
            self._replayed = True  # what its code paid before the cut is free now: not a turn without progress
            return Prediction(reasoning=pending["reasoning"], code=pending["code"])
        action = self._next_action(variables, history, iteration)
        if not isinstance(action, REPLHistory):
            reply = {"iteration": iteration + 1, "reasoning": str(action.reasoning), "code": str(action.code)}
            self._observer.on_event(AgentReplied(reply))
        return action

    def _next_action(self, variables, history, iteration):
        """The root LM's next action; a reply that does not parse is retried, then recorded as an error turn
        (returned as the new REPLHistory)."""
        variables_info = [without_media(variable.format()) for variable in variables]
        signature = self.generate_action.signature
        last_error: AdapterParseError | None = None
        root_lm = self.generate_action.lm or dspy.settings.lm
        sender = self._turn_sender if self._turn_sender is not None and self._turn_sender.takes_turn(root_lm) else None
        refusals = refused_size = 0
        attempt = 0
        spent_all = self._run_end.spent_all if self._run_end is not None else lambda: None
        while attempt < 1 + self._parse_retries and not (attempt and spent_all() is not None):  # (a retry is a call)
            shown, step = self._turn_inputs(signature, variables_info, history, iteration)
            try:
                if sender is not None:
                    action = sender.act(
                        root_lm,
                        signature,
                        variables_info=variables_info,
                        history=shown,
                        iteration=step,
                        options=self.generate_action.config,
                        fresh=bool(attempt),
                    )
                else:
                    mark = history_mark(root_lm)
                    last = attempt == self._parse_retries or self._json_replies
                    with dspy.context(adapter=_root_adapter(last_attempt=last), trace=[]):
                        action = self.generate_action(
                            signature=signature,
                            variables_info=variables_info,
                            repl_history=shown,
                            iteration=step,
                            **({"config": {"cache": False}} if attempt else {}),
                        )
                    action._cut_off = cut_off_since(root_lm, mark)
                    # parsed only by the JSON fallback (the chat call, then the fallback's): the model answers that
                    # way, so later turns offer it at once (two calls a turn, not one more per retry)
                    self._json_replies = self._json_replies or (
                        attempt > 0 and attempt == self._parse_retries and calls_since(root_lm, mark) > 1
                    )
                break
            except AdapterParseError as exc:
                salvaged = fenced_action(exc.lm_response)
                if salvaged is not None:  # no fields, but a ```python block or a code field: run it, no paid retry
                    action = Prediction(reasoning=salvaged[0] or "(none given)", code=salvaged[1])
                    action._cut_off = sender.last_cut_off if sender is not None else cut_off_since(root_lm, mark)
                    action._note = FIELDS_MISSED
                    break
                last_error = exc
                attempt += 1
                logger.warning("Root LM reply did not parse (attempt %d): %s", attempt, exc)
            except Exception as exc:
                if self._context is None or not is_context_refusal(exc) or refusals >= self._context_refusal_retries:
                    raise
                size, fixed = self._context.last_request
                if refused_size and size > 0.95 * refused_size:  # compacting did not shorten it: its fixed part
                    raise window_too_small(size, fixed) from exc
                refused_size, refusals = size, refusals + 1
                self._context.refused()
        else:
            raw = (last_error.lm_response or "")[:2000] if last_error else ""
            cut = sender.last_cut_off if sender is not None else cut_off_since(root_lm, mark)
            return _append(
                history,
                reasoning="(the reply could not be parsed)",
                code=raw,
                output=(f"{CUT_OFF_NOTE}\n" if cut else "")
                + f"[Error] Your last reply could not be parsed after {attempt} attempt(s): "
                f"{format_error_for_lm(last_error)}. Reply with the output fields exactly as specified "
                "(reasoning, then code in a ```python block).",
            )
        return action

    def _turn_inputs(self, signature, variables_info, history: REPLHistory, iteration: int) -> tuple[REPLHistory, str]:
        step = f"{iteration + 1}/{self.max_iters}"
        return turn_inputs(self._context, self._state_block, signature, variables_info, history, step)

    def _run_action(self, repl, action, history, input_args, output_field_names):
        """Execute the action's code; the new history, or the final Prediction on a valid SUBMIT."""
        cut = CUT_OFF_NOTE if getattr(action, "_cut_off", False) else ""
        cut = "\n".join(filter(None, [cut, getattr(action, "_note", "")]))  # notes on the reply itself, first
        try:
            code, note = cell_of(action.code)
        except SyntaxError as exc:
            self._failed = True
            error = "\n".join(
                filter(None, [cut, f"[Error] {format_error_for_lm(exc)}"])
            )  # the note first: never clipped
            return self._after_cell(action, action.code, error, history, output_field_names)
        result = self._execute(repl, code, input_args)
        if cut and not isinstance(result, FinalOutput):  # first: a long output is clipped at its end
            result = [cut, *(result if isinstance(result, list) else [result])]
        return self._after_cell(action, code, result, history, output_field_names, note)

    def _after_turn(
        self, history: REPLHistory, result: REPLHistory, progress: Any, output_field_names: list[str]
    ) -> REPLHistory | Prediction:
        """The turn's history once the pilot had its say: with ``assist``, a turn that made no progress is followed
        by the loop's next phase, unless its cell failed and the turn before it did not (the agent gets one turn to
        fix its own error); a submission the pilot made (there, or in the agent's own ``next_phase()`` call) ends the
        run with the current instructions."""
        pilot = self._pilot
        if pilot is None:
            return result
        idle = pilot.progress() == progress and not self._replayed
        first_failure, self._failed_before = self._failed and not self._failed_before, self._failed and idle
        if self._assist and pilot.submitted is None and not self._stop.requested and idle and not first_failure:
            last = result.entries[-1]
            try:
                report = pilot.take_phase()
                taken = report["summary"]
            except Exception as exc:  # a systemic failure is raised after the turn; the rest is shown
                report = {"ran": []}
                taken = f"[Error] {type(exc).__name__}: {exc}"
            self._pilot_ran = list(report["ran"])
            result = _append(
                history,
                reasoning=last.reasoning,
                code=last.code,
                output=last.output,
                more=f"{PILOT} {NO_PROGRESS}, so the default loop's next phase ran:\n{taken}",
            )
        if pilot.submitted is None:
            return result
        last = result.entries[-1]
        outputs, error = self._submission({name: self._current() for name in output_field_names}, output_field_names)
        if error is not None:  # (the working program's own instructions always pass; kept for a custom check)
            return _append(history, reasoning=last.reasoning, code=last.code, output=last.output, more=error)
        final = _append(history, reasoning=last.reasoning, code=last.code, output=last.output, more=f"FINAL: {outputs}")
        return Prediction(
            **outputs,
            trajectory=[entry.model_dump() for entry in final],
            final_reasoning=f"The default loop submitted: {pilot.submitted}.",
            submitted_by=LOOP_SUBMISSION,
        )

    def _execute(self, repl: CodeInterpreter, code: str, input_args: dict[str, Any]) -> Any:
        variables = dict(input_args)
        current = self._current() if self._keeps_current_prompts else None
        if current is not None and current != self._prompts_shown:  # a tool changed them: the REPL's name follows
            variables["current_prompts"] = self._prompts_shown = current  # (else the agent's own edits of it stay)
        try:
            return repl.execute(code, variables=variables)
        except (CodeExecutionError, SyntaxError) as exc:
            self._failed = True
            error = self._error_text(exc)
            return error + import_note(code, error, {*getattr(repl, "tools", {}), *(t.__name__ for t in self._tools)})

    @staticmethod
    def _error_text(exc: BaseException) -> str:
        """A cell's error as the agent reads it."""
        text = format_error_for_lm(exc)
        if text.rstrip().endswith("MemoryError:"):  # Python's own says nothing: say what fills the memory
            text = text.rstrip() + (
                " the REPL's memory is full: objects you keep in variables hold it (del the large ones you no "
                "longer need) and process the data in pieces."
            )
        return f"[Error] {text}"

    def _extract_fallback(self, variables, history, output_field_names) -> Prediction:
        """Out of turns without a SUBMIT: the root LM is asked to extract the outputs from the history. When that
        reply is unusable (a small model's often is), the run does not fail: the outputs are left empty, so the
        current instructions (the agent's ``update_prompt`` edits) are what was submitted."""
        shown = history
        if self._context is not None:  # the extraction sees the bounded view too (the turns are on disk)
            shown = self._context.view(history, fixed_chars=sum(len(v.format()) for v in variables) + 4_000)
        try:
            logger.warning("The agent reached its turn limit; extracting its final output from its history.")
            with dspy.context(adapter=_root_adapter(last_attempt=True), trace=[]):
                extracted = self.extract(
                    variables_info=[without_media(v.format()) for v in variables], repl_history=shown
                )
            return Prediction(
                trajectory=[entry.model_dump() for entry in history],
                final_reasoning="Extract forced final output",
                submitted_by="the output extracted from the agent's turns (it ran out of turns)",
                **{name: getattr(extracted, name) for name in output_field_names},
            )
        except Exception as exc:
            logger.warning(
                "The agent ran out of turns and its final output could not be extracted (%s: %s); "
                "submitting the current instructions.",
                type(exc).__name__,
                f"{str(exc)[:500]} ..." if len(str(exc)) > 500 else exc,  # a parse error holds the whole reply
            )
            return current_instructions_submitted(
                history, output_field_names, f"Out of turns; the extraction failed ({type(exc).__name__})"
            )

    def _after_cell(
        self, action, code: str, result: Any, history: REPLHistory, output_field_names: list[str], note: str = ""
    ) -> Prediction | REPLHistory:
        """The history with this cell's output (and ``note``, what :func:`~rlmoptimizer.agent.cells.cell_of` says of
        the reply), or the final Prediction on a SUBMIT that passes the checks."""
        if isinstance(result, FinalOutput):
            parsed, error = self._submission(result.output, output_field_names)
            if error is not None:
                self._failed = True
                return _append(history, reasoning=action.reasoning, code=code, output=error)
            final = _append(history, reasoning=action.reasoning, code=code, output=f"FINAL: {parsed}")
            return Prediction(
                **parsed, trajectory=[entry.model_dump() for entry in final], final_reasoning=action.reasoning
            )
        if isinstance(result, list):
            output = "\n".join(map(str, result))
        else:
            output = str(result) if result else ""
        output = "\n".join(part for part in (output or "(no output - did you forget to print?)", note) if part)
        return _append(history, reasoning=action.reasoning, code=code, output=output)

    def _submission(self, raw: Any, output_field_names: list[str]) -> tuple[dict[str, Any] | None, str | None]:
        """A SUBMIT's outputs, checked: every output field present, then ours (a refused submission is an error
        the agent sees and fixes)."""
        if not isinstance(raw, dict):
            return None, f"[Error] SUBMIT got {type(raw).__name__}, expected the fields {output_field_names}"
        missing = sorted(set(output_field_names) - set(raw))
        if missing:
            return None, f"[Error] Missing output fields: {missing}. Use SUBMIT({', '.join(output_field_names)}=...)"
        parsed = {name: _json_object(raw[name]) for name in output_field_names}
        if self._validate_submission is not None:
            try:
                parsed = self._validate_submission(parsed)
            except ValueError as exc:
                return None, f"[Error] Submission refused: {exc}"
        return parsed, None

    def _report(
        self,
        entry: dict[str, Any],
        iteration: int,
        *,
        final: bool,
        outputs: dict[str, Any] | None = None,
        submitted_by: str | None = None,
    ) -> None:
        turn = turn_record(
            iteration + 1,
            entry.get("reasoning", ""),
            entry.get("code", ""),
            entry.get("output", ""),
            final=final,
            pilot=self._pilot_ran or None,  # the default loop's actions the pilot took in this turn
            outputs=outputs,
            submitted_by=submitted_by,  # made by the default loop, or without a SUBMIT
        )
        self.turns.append(turn)
        self._observer.on_event(AgentTurn(turn, self._ledger.snapshot()))
