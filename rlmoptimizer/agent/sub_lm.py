"""The agent's budgeted sub-LM tools: ``llm_query`` and ``llm_query_batched`` in its REPL.

Each prompt is paid from the compile's budget (one unit) and from dspy.RLM's own per-run ceiling
(``max_llm_calls``), both reserved before the prompt is sent, or neither; a prompt that got no answer (the LM
failed) is released, one that got an answer is kept, also when that answer is not text. A sub LM that cannot be
used at all (a bad key) raises once every prompt of a batch has its answer or its error.

May import: ``rlmoptimizer.agent._dspy``, the budget, the events, the usage meter, the LM failure classes and the
run directory's answer store.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dspy

from rlmoptimizer.agent._dspy import format_error_for_lm
from rlmoptimizer.budget import SUB_LM_CALL, BudgetLedger, Reservation
from rlmoptimizer.errors import BudgetExhaustedError
from rlmoptimizer.evaluation.lm_failures import SYSTEMIC, classify_lm_failure
from rlmoptimizer.events import Observer, SubLMAnswered
from rlmoptimizer.storage.answers import AnswerStore
from rlmoptimizer.usage import SUB, UsageMeter


class _CallCeiling:
    """``max_llm_calls``: the most sub-LM prompts one run of the agent may send (as dspy.RLM's own ceiling)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._count = 0
        self._lock = threading.Lock()

    def reserve(self, n: int) -> None:
        with self._lock:
            if self._count + n > self._limit:
                raise RuntimeError(
                    f"LLM call limit exceeded: {self._count} + {n} > {self._limit} (max_llm_calls). "
                    "Use Python code for aggregation instead of making more LLM calls."
                )
            self._count += n

    def release(self, n: int) -> None:
        """Give back ``n`` reserved calls that got no answer (as the ledger gives back their units)."""
        with self._lock:
            self._count = max(0, self._count - n)


class _ChargedBudget:
    """The per-run call ceiling plus our ledger: a reservation is taken from both or from neither."""

    def __init__(self, ceiling: _CallCeiling, ledger: BudgetLedger) -> None:
        self._rlm_budget = ceiling
        self._ledger = ledger

    def take(self, n: int) -> Reservation:
        """Reserve ``n`` sub-LM calls; spend each one that produced an answer, release the rest."""
        try:
            reservation = self._ledger.reserve_exactly(n, SUB_LM_CALL)
        except BudgetExhaustedError as exc:
            raise RuntimeError(_budget_message(exc)) from None
        try:
            self._rlm_budget.reserve(n)
        except Exception:
            reservation.release()
            raise
        return reservation

    def unanswered(self, n: int) -> None:
        """``n`` of the calls taken got no answer: they count against neither the ledger nor the ceiling."""
        if n > 0:
            self._rlm_budget.release(n)


def _budget_message(exc: BaseException) -> str:
    return (
        f"{exc}. Sub-LM calls cost 1 unit each and the optimization budget cannot cover this call (none of its "
        "prompts was sent; fewer prompts may fit: optimization_status() says what is left). Analyse with Python "
        "code instead, update prompts, and SUBMIT when ready."
    )


def sub_lm_tools(
    sub_lm: dspy.BaseLM | None,
    *,
    max_llm_calls: int,
    ledger: BudgetLedger,
    usage: UsageMeter | None,
    observer: Observer,
    as_sub: Callable[[Any], Any],
    on_failure: Callable[[BaseException], None] = lambda exc: None,
    on_answer: Callable[[], None] = lambda: None,
    max_workers: int = 8,
    answers: AnswerStore | None = None,
    scope: Callable[[], str] = str,
) -> dict[str, Callable]:
    """The REPL's ``llm_query`` and ``llm_query_batched`` for one run of the agent: each prompt costs one unit of
    ``ledger`` and one of ``max_llm_calls``, taken before it is sent and kept only when it was answered (an
    answer that is not text is paid too); ``observer`` hears of every answered call before the turn ends;
    ``on_failure`` of every prompt the LM failed to answer (the compile stops when it cannot be used), and
    ``on_answer()`` after prompts it answered (the sub LM is there: see ``agent.stop.sub_lm_move_ended``). A
    ``sub_lm`` of None is dspy's configured LM. ``answers`` (the run directory's) keeps every text answer as it
    arrives: the same prompt asked again in the same order in the same ``scope()`` (the agent's turn) after a
    resume (the cell of a turn an interrupt cut short, run again) is answered from it, free."""
    charged = _ChargedBudget(_CallCeiling(max_llm_calls), ledger)
    answers = answers if answers is not None else AnswerStore()

    def query(prompt: str) -> str:
        lm = sub_lm if sub_lm is not None else dspy.settings.lm
        if lm is None:
            raise dspy.LMNotConfiguredError("No sub-LM configured for llm_query.")
        response = as_sub(lm)(prompt)  # (its unit of work is counted with its charge: SubLMAnswered)
        text = response.text if isinstance(response, dspy.lm15.Response) else None
        if text is None and isinstance(response, list) and response:
            first = response[0]
            text = first.get("text") if isinstance(first, dict) else first
        if not isinstance(text, str):
            raise TypeError(f"Sub-LM returned no text (got {type(response).__name__}).")
        return text

    def priced(prompts: list[str]) -> None:
        """Refuse prompts the spending cap cannot pay, priced by their own size before they are sent."""
        lm = sub_lm if sub_lm is not None else dspy.settings.lm
        if usage is None or lm is None:
            return
        model = getattr(lm, "model", None) or type(lm).__name__
        why = usage.prompts_refused(SUB, str(model), prompts, (getattr(lm, "kwargs", None) or {}).get("max_tokens"))
        if why is not None:
            raise RuntimeError(
                f"the spending cap: {why}. Send fewer or shorter prompts, or analyse with Python code; nothing was "
                "sent or charged"
            )

    def llm_query(prompt: str) -> str:
        """Query the sub-LM with a prompt string (costs 1 budget unit)."""
        if not prompt:
            raise ValueError("prompt cannot be empty")
        key, _ = answers.key_for(f"{scope()}\n{prompt}")
        kept = answers.get(key)
        if kept is not None:  # answered before an interrupt: paid already
            return kept
        priced([prompt])
        answered = taken = False
        try:
            with charged.take(1) as reservation:
                taken = True
                try:
                    text = query(prompt)
                    answered = True
                    answers.put(key, text)
                except Exception as exc:
                    answered = classify_lm_failure(exc) is None  # it answered, but not with text: paid
                    if not answered:
                        on_failure(exc)
                    raise
                finally:
                    if answered:
                        reservation.spend(1)
        finally:
            if answered:  # on disk before the turn ends
                observer.on_event(SubLMAnswered(1, ledger.snapshot()))
                on_answer()
            elif taken:  # (a refused take counted nothing)
                charged.unanswered(1)
        return text

    def llm_query_batched(prompts: list[str]) -> list[str]:
        """Query the sub-LM with several prompts concurrently (1 budget unit per prompt)."""
        if not prompts:
            return []
        if any(not p for p in prompts):
            raise ValueError("prompts cannot contain empty strings")
        keys = [answers.key_for(f"{scope()}\n{prompt}")[0] for prompt in prompts]
        results: dict[int, str] = {i: text for i, key in enumerate(keys) if (text := answers.get(key)) is not None}
        todo = [i for i in range(len(prompts)) if i not in results]  # the others were answered before an interrupt
        if not todo:
            return [results[i] for i in range(len(prompts))]
        priced([prompts[i] for i in todo])
        unusable: BaseException | None = None  # the sub LM cannot be used (a bad key): raised once all are paid
        paid: set[int] = set()
        lock = threading.Lock()

        def charge(index: int, text: str | None) -> None:
            """One prompt answered: paid and kept as it arrives (in its worker), whatever the main thread does."""
            with lock:
                if index in paid:
                    return
                paid.add(index)
                try:
                    reservation.spend(1)
                except BudgetExhaustedError:  # the batch was given up (a second Ctrl-C): charged on its own
                    with contextlib.suppress(BudgetExhaustedError), ledger.reserve_exactly(1, SUB_LM_CALL) as late:
                        late.spend(1)
            if text is not None:
                answers.put(keys[index], text)

        def answer(index: int) -> str:
            """One prompt, paid and kept in its worker as it is answered: a prompt that started is charged
            whatever the main thread does meanwhile (a Ctrl-C while the others are still being submitted too)."""
            try:
                text = query(prompts[index])
            except Exception as exc:
                if classify_lm_failure(exc) is None:  # answered, not with text: paid
                    charge(index, None)
                raise
            charge(index, text)
            return text

        taken = False
        try:
            with charged.take(len(todo)) as reservation, ThreadPoolExecutor(max_workers=max_workers) as pool:
                taken = True
                futures = {pool.submit(contextvars.copy_context().run, answer, i): i for i in todo}
                try:
                    for future, index in futures.items():  # every prompt gets its answer or its error
                        try:
                            results[index] = future.result()
                        except Exception as exc:
                            failure = classify_lm_failure(exc)
                            if failure is not None:
                                on_failure(exc)
                            if failure is not None and failure[0] == SYSTEMIC and unusable is None:
                                unusable = exc
                            results[index] = f"[ERROR] {format_error_for_lm(exc)}"
                except BaseException:  # an interrupt: what is answered by now is paid and kept by its worker
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
        finally:
            if paid:  # on disk before the turn ends (every callback ran: the pool was shut down)
                observer.on_event(SubLMAnswered(len(paid), ledger.snapshot()))
                on_answer()
            if taken:
                charged.unanswered(len(todo) - len(paid))
        if unusable is not None:
            raise unusable
        return [results[i] for i in range(len(prompts))]

    return {"llm_query": llm_query, "llm_query_batched": llm_query_batched}
