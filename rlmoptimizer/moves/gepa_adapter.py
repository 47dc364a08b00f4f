"""What gepa's engine sees of a compile: the :class:`Adapter` over its stored, charged evaluations, the exact
:class:`Slice` of the budget a run may spend, and the :class:`Reflection` LM (the sub-LM, charged and kept for a
resume). :mod:`rlmoptimizer.moves.gepa` runs the engine over them.

May import: gepa, dspy, ``rlmoptimizer.evaluation``, ``.budget``, ``.errors``, ``.records``, ``.storage`` and
``rlmoptimizer.moves``' own modules.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

from rlmoptimizer.budget import SUB_LM_CALL, TRAIN_EXAMPLE, VAL_EXAMPLE, BudgetLedger, Reservation, example_kind
from rlmoptimizer.errors import BudgetExhaustedError
from rlmoptimizer.evaluation.lm_failures import classify_lm_failure, failure_summary
from rlmoptimizer.moves._dspy import InstructionProposer
from rlmoptimizer.moves.context import EvaluateFn, RunAccess
from rlmoptimizer.moves.proposal import ask_proposer, nth_sample, reflective_example, reply_of
from rlmoptimizer.records import ExampleResult
from rlmoptimizer.storage.answers import AnswerStore


class Stop(BaseException):  # noqa: N818 - a stop of gepa's loop, not an error of its own
    """Ends gepa's loop mid-iteration. A BaseException, so that gepa's ``except Exception`` around reflection and
    around each iteration does not take it for a failed proposal and go on."""

    def __init__(self, why: str, error: BaseException | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.error = error


class Slice:
    """The units one run may spend, taken from the ledger one whole evaluation or reflection at a time."""

    def __init__(
        self, ledger: BudgetLedger, units: int, taken: int = 0, on_change: Callable[[int, int], None] | None = None
    ) -> None:
        """``taken``: units an earlier process already paid for this run (a run replayed on resume);
        ``on_change(taken, reserved)`` is told what is paid or reserved of the slice, and how much of that is
        reserved for work under way, after every change, before the work."""
        self.ledger = ledger
        self.units = units
        self.left = max(0, units - taken)
        self.before = taken
        self.spent = 0
        self.reserved = 0  # reserved for work under way: a process killed then never paid it
        self.by_kind = {TRAIN_EXAMPLE: 0, VAL_EXAMPLE: 0, SUB_LM_CALL: 0}
        self._lock = threading.Lock()
        self._on_change = on_change or (lambda taken, reserved: None)

    @property
    def evaluations(self) -> int:
        """Units spent on program runs (train and validation examples), reflections aside."""
        return self.by_kind[TRAIN_EXAMPLE] + self.by_kind[VAL_EXAMPLE]

    def covers(self, n: int, kind: str) -> bool:
        """Whether ``n`` units of ``kind`` can be reserved now (the spending cap aside)."""
        sliced = self.ledger.counts_toward_limit(kind)
        with self._lock:
            return (not sliced or n <= self.left) and n <= self.ledger.left_for(kind)

    def reserve(self, n: int, kind: str, what: str) -> Reservation:
        sliced = self.ledger.counts_toward_limit(kind)  # (with max_metric_calls, reflections are not metric calls)
        with self._lock:
            if sliced and n > self.left:
                raise Stop(f"its budget of {self.units} unit(s) ran out: {what} needs {n}, {self.left} left")
            try:
                reservation = self.ledger.reserve_exactly(n, kind)
            except BudgetExhaustedError as exc:
                raise Stop(f"{what} could not be paid: {exc}") from None
            if sliced:
                self.left -= n
                self.reserved += n
                self._on_change(self.units - self.left, self.reserved)
        return reservation

    def settle(self, reservation: Reservation) -> None:
        reservation.release()
        sliced = self.ledger.counts_toward_limit(reservation.kind)
        with self._lock:
            if sliced:
                self.left += reservation.granted - reservation.spent
                self.reserved -= reservation.granted
                self.spent += reservation.spent
                self._on_change(self.units - self.left, self.reserved)
            self.by_kind[reservation.kind] += reservation.spent


class Adapter:
    """gepa's view of this compile's program: a candidate is a ``{step: text}`` map over the run's steps (the
    other steps keep the text they had when the run started); a data instance is ``(split, example id)``.

    A child of a reflective proposal is scored on its parent's minibatch in two waves: first the examples its
    parent did not score perfectly on, then the others, only while the child can still beat its parent there
    (gepa keeps a child only when its minibatch sum is strictly higher). The examples a child could not win on
    are not run; gepa is told the best score they could have had, so the sum it compares is an upper bound, and
    the child is rejected as it would have been."""

    def __init__(
        self,
        runs: RunAccess,
        evaluate: EvaluateFn,
        is_known: Callable[[dict[str, str]], bool],
        base: dict[str, str],
        budget: Slice,
        score_bound: Callable[[], float | None],
        propose: Callable[[str, str, list[dict[str, Any]]], str],
        format_failures: bool = False,
    ) -> None:
        """``is_known(instructions)``: whether a candidate already has those instructions; ``score_bound()``: the
        highest score one example can have, or None when that is not known (then every child runs whole);
        ``propose(step, text, dataset)``: new instructions for ``step`` (:meth:`Reflection.propose`);
        ``format_failures``: a step's own output that did not parse is reflected on (``dspy.GEPA``'s
        ``add_format_failure_as_feedback``); else that call is left out, and the step's other calls on the example,
        if any, are reflected on with the error named (``dspy.GEPA`` leaves such an example out)."""
        self._propose = propose
        self._format_failures = format_failures
        self._runs = runs
        self._evaluate = evaluate
        self._is_known = is_known
        self._base = base
        self._budget = budget
        self._score_bound = score_bound
        self.unevaluated: list[dict[str, str]] = []  # proposals the budget stopped before their evaluation
        self._children: dict[tuple, list[dict[str, str]]] = {}  # minibatch -> parents of the children to score
        # children scored on their minibatch, kept by gepa or not: (parent, child, minibatch ids)
        self.children: list[tuple[dict[str, str], dict[str, str], list[int]]] = []
        self.cut_short = 0  # children stopped once they could not beat their parent
        self.not_run = 0  # the examples those children were not run on

    def instructions(self, candidate: dict[str, str]) -> dict[str, str]:
        return {**self._base, **candidate}

    def expect_child(self, batch: Sequence[tuple[str, int]], parent: dict[str, str]) -> None:
        """gepa announced (``on_evaluation_start``) that the next evaluation on ``batch`` scores a child of
        ``parent``."""
        self._children.setdefault(tuple(batch), []).append(dict(parent))

    def new_iteration(self) -> None:
        """An announcement is for its own iteration only."""
        self._children.clear()

    def evaluate(self, batch: list[tuple[str, int]], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        """``candidate`` on ``batch``. An example drawn twice in one minibatch (gepa's sampler pads the last one of
        an epoch) runs once: it counts twice in gepa's sums, as it would have scored the same."""
        if not batch:
            return evaluation_batch([], capture_traces, 0)
        split = batch[0][0]
        ids = [i for _, i in batch]
        instructions = self.instructions(candidate)
        parents = self._children.get(tuple(batch))
        parent = self.instructions(parents.pop(0)) if parents else None
        child = parent is not None and parent != instructions
        bound = self._score_bound() if child else None
        scored = None
        if parent is not None and bound is not None:
            before = self._runs.stored(parent, split, ids)
            unique = list(dict.fromkeys(ids))
            cost = len(unique) - len(self._runs.stored(instructions, split, unique))
            kind = example_kind(split)
            # with its parent's scores at hand, and its whole minibatch paid for if it has to run whole (else the
            # run stops before paying anything, as it would have)
            if len(before) == len(unique) and self._budget.covers(cost, kind):
                scored = self._evaluate_child(split, ids, instructions, before, bound, capture_traces)
        if scored is None:
            records, charged = self._run(split, ids, instructions)
            scored = evaluation_batch([records[i] for i in ids], capture_traces, charged)
        if child:  # scored on its minibatch (a child whose evaluation stopped is not one gepa could keep or reject)
            self.children.append((parent, instructions, sorted(set(ids))))
        return scored

    def _evaluate_child(
        self,
        split: str,
        ids: list[int],
        instructions: dict[str, str],
        parent: dict[int, ExampleResult],
        bound: float,
        capture_traces: bool,
    ) -> Any:
        to_beat = sum(parent[i].score for i in ids)
        unique = list(dict.fromkeys(ids))
        below = sorted((i for i in unique if parent[i].score < bound), key=lambda i: parent[i].score)
        perfect = [i for i in unique if parent[i].score >= bound]
        records, charged = self._run(split, below, instructions) if below else ({}, 0)
        best_possible = sum(records[i].score if i in records else bound for i in ids)
        if perfect and best_possible <= to_beat:  # it cannot win: the parent's perfect examples are not run
            self.cut_short += 1
            self.not_run += len(perfect) - len(self._runs.stored(instructions, split, perfect))
            scores = [records[i].score if i in records else bound for i in ids]
            outputs = [records[i].predicted if i in records else None for i in ids]
            from gepa.core.adapter import EvaluationBatch

            return EvaluationBatch(outputs=outputs, scores=scores, trajectories=None, num_metric_calls=charged)
        if perfect:
            more, paid = self._run(split, perfect, instructions)
            records.update(more)
            charged += paid
        return evaluation_batch([records[i] for i in ids], capture_traces, charged)

    def _run(self, split: str, ids: list[int], instructions: dict[str, str]) -> tuple[dict[int, ExampleResult], int]:
        """``instructions`` on each of ``ids`` of ``split`` once: every record by id, and the units paid (stored
        ones are free)."""
        ids = list(dict.fromkeys(ids))
        stored = self._runs.stored(instructions, split, ids)
        if len(stored) == len(ids):  # every record is stored: free, and no new run to list
            return stored, 0
        cost = len(ids) - len(stored)
        kind = example_kind(split)
        what = f"an evaluation on {len(ids)} {split} example(s)"
        try:
            reservation = self._budget.reserve(cost, kind, what)
        except Stop:
            if not self._is_known(instructions):
                self.unevaluated.append(dict(instructions))
            raise
        try:
            run = self._evaluate(instructions, split, ids, label="gepa", reservation=reservation)
        except Exception as exc:  # a systemic failure (the evaluation LM, the metric): stop with it
            raise Stop(f"an evaluation failed: {type(exc).__name__}", error=exc) from exc
        finally:
            self._budget.settle(reservation)
        by_id = {record.example_id: record for record in run.records}
        if any(i not in by_id for i in ids):
            raise Stop(f"an evaluation stopped early ({run.note or 'not every example ran'})")
        return by_id, reservation.spent

    def propose_new_texts(
        self, candidate: dict[str, str], reflective_dataset: dict[str, list[dict[str, Any]]], components: list[str]
    ) -> dict[str, str]:
        """gepa's reflection step, as ``dspy.GEPA`` takes it: dspy's ``InstructionProposer`` per step. A step
        whose proposal is empty or unchanged gets none (gepa then scores no child for it)."""
        texts = {}
        for step in components:
            if reflective_dataset.get(step):
                text = self._propose(step, candidate[step], reflective_dataset[step])
                if text.strip() and text.strip() != candidate[step].strip():
                    texts[step] = text
        return texts

    def make_reflective_dataset(
        self, candidate: dict[str, str], eval_batch: Any, components_to_update: list[str]
    ) -> dict:
        # an example drawn twice in one minibatch is shown once
        records = list({record.example_id: record for record in eval_batch.trajectories or []}.values())
        dataset = {}
        for step in components_to_update:
            entries = [reflective_example(step, record, self._format_failures) for record in records]
            entries = [entry for entry in entries if entry is not None]
            if entries:
                dataset[step] = entries
        return dataset


class Reflection:
    """gepa's reflection, as ``dspy.GEPA`` makes it: dspy's ``InstructionProposer`` on the sub-LM (a structured
    ``new_instruction`` field), 1 unit per proposal that answered, as a proposal of ``propose_instructions`` is;
    its text kept for a resume. Each asking of what was already asked is another sample (its own rollout id).
    ``guidance`` (the causes of a group of a failure analysis) reaches every proposal as the proposer's additional
    instructions.

    A reflection the LM answered with nothing usable (an empty ``new_instruction``, a reply that does not parse)
    proposes nothing and the run goes on; ``unusable`` counts them and ``unusable_sample`` shows one. Only an LM
    that does not answer stops the run."""

    def __init__(
        self,
        lm: Any,
        budget: Slice,
        answers: AnswerStore,
        book: Callable[[Callable], Callable],
        answered: Callable[[], None],
        guidance: str | None = None,
        too_long: Callable[[str, str], str | None] | None = None,
    ) -> None:
        self._lm = lm
        self._too_long = too_long  # a text longer than a step may have proposes nothing (it was a call: charged)
        self._guidance = guidance
        self._budget = budget
        self._answers = answers
        self._book = book
        self._answered = answered  # puts the charge on disk before the answer is kept (never counted short)
        self.calls = 0
        self.replayed = 0
        self.texts: set[str] = set()  # every distinct instruction proposed (a repeat proposes nothing new)
        self.unusable = 0  # answered (or replayed) with no instructions in the reply
        self.unusable_sample: str | None = None  # what one such reply said

    def propose(self, step: str, text: str, dataset: list[dict[str, Any]]) -> str:
        """New instructions for ``step`` (now ``text``) from gepa's reflective ``dataset``; "" when the LM answered
        with nothing usable (charged: it was a call). An LM that does not answer stops the run."""
        asked = [step, text, dataset, *([self._guidance] if self._guidance else [])]
        key, seen = self._answers.key_for(json.dumps(asked, sort_keys=True, default=repr))
        stored = self._answers.get(key)
        if stored is not None:
            self.replayed += 1
            if not stored.strip():
                self._nothing("an empty instruction (stored)")
            self.texts.add(stored)
            return stored
        reservation = self._budget.reserve(1, SUB_LM_CALL, "a reflection")
        lm = nth_sample(self._lm, seen)

        def ask() -> str:
            proposer = InstructionProposer(additional_instructions=self._guidance)
            asked = ask_proposer(proposer, lm, step, text, dataset, reservation, self._answered, self._too_long)
            return str(asked or "")

        failed: BaseException | None = None
        new = ""
        try:
            new = self._book(ask)()
        except Exception as exc:
            if classify_lm_failure(exc) is None:  # it answered (charged), with no instruction in it: no proposal
                self._nothing(reply_of(exc))
            else:  # no answer (a bad key, a 5xx after retries): no reflection can be had
                failed = exc
        else:
            if not new.strip():
                self._nothing("an empty instruction")
        finally:
            self._budget.settle(reservation)
        if failed is not None:
            raise Stop(f"the reflection LM (sub_lm) failed: {failure_summary(failed)}", error=failed) from failed
        self.calls += 1  # its charge is on disk already (ask_proposer), before the answer is kept
        self._answers.put(key, new)
        self.texts.add(new)
        return new

    def _nothing(self, sample: str) -> None:
        self.unusable += 1
        if self.unusable_sample is None:
            self.unusable_sample = sample

    def unusable_note(self) -> str | None:
        """How many reflections gave nothing usable, with a sample reply; None when all did."""
        if not self.unusable:
            return None
        return (
            f"{self.unusable} of {self.calls + self.replayed} reflection(s) gave no usable instructions "
            f"(e.g. {self.unusable_sample}): sub_lm must answer dspy's InstructionProposer with its new_instruction "
            "field filled"
        )


def evaluation_batch(records: Sequence[ExampleResult], capture_traces: bool, charged: int) -> Any:
    from gepa.core.adapter import EvaluationBatch

    return EvaluationBatch(
        outputs=[record.predicted for record in records],
        scores=[float(record.score) for record in records],
        trajectories=list(records) if capture_traces else None,
        num_metric_calls=charged,
    )
