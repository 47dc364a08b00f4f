"""The runs of one compile(): a program evaluated on a split becomes one stored :class:`EvalRun`.

"Run" means one thing in this package: an :class:`EvalRun`, one evaluation of one set of instructions on
examples of one split, saved as ``runs/<run_id>.json``. :class:`Runs` makes them: it reuses identical
earlier records (free), reserves the budget for the rest, evaluates them, saves the run, and sends the
evaluation's events (the only room that does). Records completed by an evaluation that stops early are
saved as a ``:partial`` run; records of an evaluation a killed process never finished come back as a
``:recovered`` run (and are charged then).

May import: ``rlmoptimizer.evaluation.evaluator``, ``rlmoptimizer.storage``, ``.budget``, ``.errors``,
``.events``, ``.fingerprint``, ``.records``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import dspy

from rlmoptimizer.budget import TRAIN_EXAMPLE, BudgetLedger, Reservation, example_kind
from rlmoptimizer.errors import ConfigurationError, EvaluationLMError, MetricError, ProgramError
from rlmoptimizer.evaluation.evaluator import EvaluationStopped, Evaluator
from rlmoptimizer.evaluation.lm_failures import format_error
from rlmoptimizer.events import (
    NO_OBSERVER,
    EvaluationFinished,
    EvaluationStarted,
    ExampleEvaluated,
    Observer,
)
from rlmoptimizer.fingerprint import get_instructions, instructions_digest
from rlmoptimizer.records import LM_CALL_ERROR, METRIC_ERROR, PROGRAM_ERROR, EvalRun, ExampleResult
from rlmoptimizer.storage.run_store import PendingLog, RunStore

logger = logging.getLogger(__name__)

# Runs with other instructions for each step that ran, each raising the baseline's one error on every example,
# before ProgramError stops the run: one try would stop a run that a later proposal fixes (an error that depends on
# what the LM answers), while every try costs a minibatch of an error that may be the code's.
CODE_ERROR_TRIES = 3


class _RecordSink:
    """Where each record of one evaluation goes as it completes: the pending log, then the observer."""

    def __init__(self, pending: PendingLog, observer: Observer) -> None:
        self._pending = pending
        self._observer = observer

    def __call__(self, record: ExampleResult) -> None:
        self._pending.append(record)
        self._observer.on_event(ExampleEvaluated(record))


class Runs:
    """Evaluates a program on a split as one stored :class:`EvalRun`, reusing identical earlier records.

    The cache key is ``(split, example_id, digest of the instructions, rollout)``; it is built from the store
    at construction (so a resumed run directory reuses its records) and updated on every save.
    """

    def __init__(
        self,
        *,
        evaluator: Evaluator,
        store: RunStore,
        ledger: BudgetLedger,
        splits: dict[str, list[dspy.Example]],
        observer: Observer = NO_OBSERVER,
    ) -> None:
        self.evaluator = evaluator
        self.store = store
        self.ledger = ledger
        self.splits = dict(splits)
        self.observer = observer
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, int, str, int], ExampleResult] = {}
        self._held: dict[tuple[str, str, int], set[int]] = {}  # (split, digest, rollout) -> ids in _cache
        # (the unchanged program's instructions, the error, the steps that ran) when it raised that one error on
        # every example of its first baseline, or when the metric raised on every one (the error None then: any
        # metric error); set before anything else is evaluated, read only after
        self._code_error: tuple[dict[str, str], str | None, frozenset[str]] | None = None
        for run in store.all():
            self._index(run)
        # units charged for records of evaluations a killed process never finished, by the evaluation's label: a
        # GEPA run replayed on resume counts its own as paid (they are reused free in its replay)
        self.recovered_now: dict[str, int] = {}
        self._recover_pending()

    def check_baseline(self, run: EvalRun | None, *, scale: bool = True) -> None:
        """What the unchanged program's first baseline says of the metric and the program, before anything is
        spent on them. :class:`MetricError` when the metric raised one and the same error on every example and
        raises it again when given the example's expected answer as the prediction: it does not depend on what
        the LM answered (a typo), so no instructions can fix it. A warning when the program raised one and the
        same error on at least 3 examples (it may be its code). With ``scale``: a warning when ``pass_threshold``
        is above 1 while the metric scores like a 0-1 metric, or at most 1 while it scores above 1, and
        :class:`ConfigurationError` when, so, every example passes (nothing would be optimized)."""
        records = run.records if run is not None else ()
        threshold = self.evaluator.pass_threshold
        scores = [r.score for r in records if r.error is None]
        if scale and threshold <= 1 and scores and max(scores) > 1:
            self._check_threshold_below_scale(run.split, records, threshold)
        if scale and threshold > 1 and scores and max(scores) == 1 and 0 <= min(scores) < 1:
            logger.warning(
                "pass_threshold=%r, but the metric's scores on the unchanged program lie between 0 and 1, and an "
                "example scoring 1 fails: if the metric's scale is 0-1, leave pass_threshold at 1 (every example "
                "fails otherwise, and the loop reflects on examples the program gets right).",
                threshold,
            )
        if scale and scores and max(scores) <= 0 < threshold and len(set(scores)) > 1:
            logger.warning(
                "pass_threshold=%r, but the metric's scores on the unchanged program are all at most 0 (from %r to "
                "%r): if its best score is 0 or below (e.g. 0 right, -1 wrong), pass pass_threshold=<that score>. Every "
                "example fails otherwise: the loop reflects on examples the program gets right, and no demos can be "
                "made (they come from passing examples).",
                threshold,
                min(scores),
                max(scores),
            )
        empty = [r for r in records if not r.predicted and (r.error is None or r.error_kind == METRIC_ERROR)]
        if len(records) >= 3 and len(empty) == len(records):  # (the program returned: the metric met no field)
            logger.warning(
                "Every one of the %d %s example(s) of the unchanged program returned a prediction with no output "
                "field at all, so each scored as an empty answer (or the metric raised on it): the evaluation LM "
                "most likely answered with no choices (a provider error, a content filter, a proxy that drops the "
                "body). Check the LM with one call (eval_lm('hello')) before spending more: instructions cannot fix "
                "this.",
                len(records),
                run.split,
            )
        unparsed = sum(1 for r in records if (r.error or "").startswith("AdapterParseError"))
        if len(records) >= 3 and unparsed == len(records):
            logger.warning(
                "None of the %d %s example(s) of the unchanged program gave an output that parses (AdapterParseError "
                "on each): the evaluation LM does not answer in the format the program's adapter asks for, so every "
                "example scores 0 whatever it answered. Instructions can only ask for the format; check the "
                "evaluation LM (a chat model, max_tokens room for the whole answer) or set an adapter it follows "
                "(dspy.configure(adapter=dspy.JSONAdapter())).",
                len(records),
                run.split,
            )
            return
        self._warn_metric_raised_on_some(run.split if run is not None else "", records)
        records = [r for r in records if r.error_kind != LM_CALL_ERROR]  # (an outage says nothing of the program)
        if records and all(r.error_kind == METRIC_ERROR for r in records):
            self._metric_raised_on_all(run, records)
            return
        errors = {(r.error_kind, r.error) for r in records}
        if len(errors) > 1 and len(records) >= 3 and {kind for kind, _ in errors} == {PROGRAM_ERROR}:
            self._warn_program_raised_on_all(run.split, records)
            return
        if len(errors) != 1 or None in next(iter(errors)):
            return
        [(kind, error)] = errors
        where = f"every one of the {len(records)} {run.split} example(s) of the unchanged program, always with {error}"
        if kind == PROGRAM_ERROR and len(records) >= 3 and not error.startswith("AdapterParseError"):
            self._code_error = (dict(run.instructions), error, _steps_that_ran(records))  # other instructions will tell
            logger.warning(
                "The program raised on %s. If that is an error in its code, no instructions can fix it: stop the run "
                "(Ctrl-C keeps what was paid), fix it, and compile again with a new run_storage_dir (the records of "
                "this one hold the error).",
                where,
            )

    def _metric_raised_on_all(self, run: EvalRun, records: Sequence[ExampleResult]) -> None:
        """The metric raised on every example of the unchanged program's first baseline: every score is 0, so no
        change can show. :class:`MetricError` when it was one error, raised again on the expected answer given as
        the prediction (it does not depend on the answer: a typo); else a warning, and the run stops like one
        whose code raises everywhere (:meth:`_check_code_error`) when other instructions do not change that (a
        metric that raises on answers of a wrong form, which instructions can fix, is given those tries)."""
        errors = {r.error for r in records}
        first = records[0]
        if len(errors) == 1 and self._metric_raises_on_the_answer(
            self.splits[run.split][first.example_id], first.error
        ):
            raise MetricError(
                f"the metric raised on every one of the {len(records)} {run.split} example(s) of the unchanged "
                f"program, always with {first.error}, and again when given the expected answer as the prediction: it "
                "does not depend on what the program answers. A metric returns a low score for a wrong answer; fix "
                "the error (call the metric on one example and the program's prediction for it to see where it fails)."
            )
        self._code_error = (dict(run.instructions), None, _steps_that_ran(records))
        logger.warning(
            "The metric raised on every one of the %d %s example(s) of the unchanged program (the first, example %d: "
            "%s), so every example scores 0 and no change can show a gain. If the metric does not fit the program's "
            "outputs (a field name, a table left to fill), stop the run (Ctrl-C keeps what was paid), fix it and "
            "compile again with a new run_storage_dir. The run stops by itself with MetricError once %d other "
            "instructions for each step have not changed it, or returns the unchanged program if the budget ends first.",
            len(records),
            run.split,
            first.example_id,
            (first.error or "")[:200],
            CODE_ERROR_TRIES,
        )

    def _check_code_error(self, label: str, new: Sequence[ExampleResult]) -> None:
        """:class:`ProgramError` when the program raised one error on every baseline example and raises it again on
        every example of every run since, and :data:`CODE_ERROR_TRIES` different instructions or more for each step
        that ran on the baseline (each evaluated on at least 3 examples; a step that never ran cannot be the cause)
        have done so: the error has not depended on the instructions, so the rest of the budget would likely be
        spent on it for nothing. One candidate evaluated again counts once. One error everywhere may still depend
        on what the LM answers (the program's own parse or check of a label), which is why one try is not enough
        and the message says what to do in that case. Any run with an example that does not raise it (a baseline
        of another split included) ends the check for good; an example whose LM call failed (not charged) says
        nothing either way and is left out. Computed from the stored runs, so a resumed run counts the tries of
        the one it resumes."""
        if self._code_error is None or not new:
            return
        baseline_instructions, error, ran = self._code_error
        tried: dict[str, set[str]] = {step: set() for step in ran}
        candidates: set[tuple[tuple[str, str], ...]] = set()
        for run in self.store.all():
            records = [record for record in run.records if record.error_kind != LM_CALL_ERROR]
            if any(
                record.error != error if error is not None else record.error_kind != METRIC_ERROR for record in records
            ):
                return  # instructions (or examples) changed what happens: they can matter
            changed = {
                step: text
                for step, text in run.instructions.items()
                if (step in ran or not ran) and baseline_instructions.get(step) != text  # (none ran: any step)
            }
            if not changed or len(records) < 3:
                continue
            candidates.add(tuple(sorted(changed.items())))
            for step, text in changed.items():
                tried.setdefault(step, set()).add(text)
        if len(candidates) < CODE_ERROR_TRIES or any(len(tried[step]) < CODE_ERROR_TRIES for step in ran):
            return
        if error is None:
            raise MetricError(
                f"The metric raised on every example of the unchanged program, and again on every example of "
                f"{len(candidates)} evaluated candidates with other instructions, at least {CODE_ERROR_TRIES} different "
                f"ones for each step that ran (the last, {label}, on {len(new)} new example(s); its first error: "
                f"{(new[0].error or '')[:300]}). Instructions have not changed it, so the rest of the budget would be "
                "spent on it for nothing. Call the metric on one example and the program's prediction for it to see "
                "where it fails, fix it, and compile again with a new run_storage_dir."
            )
        raise ProgramError(
            f"The program raised the same error on every example of the unchanged program, and again on every "
            f"example of {len(candidates)} evaluated candidates with other instructions, at least {CODE_ERROR_TRIES} "
            f"different ones for each step that ran (the last, {label}, on {len(new)} new example(s)): "
            f"{error[:300]}. Instructions have not changed it, so the rest of the budget would be spent on it for "
            "nothing. If it is an error in the program's code, fix it (run the program on one example to see where "
            "it fails); if it depends on what the LM answers (the program parses or checks the answer), catch it "
            "there and return a prediction the metric scores as failing, so that the optimizer can learn from it. "
            "Then compile again with a new run_storage_dir (the records of this one hold the error)."
        )

    @staticmethod
    def _warn_metric_raised_on_some(split: str, records: Sequence[ExampleResult]) -> None:
        """The metric raised on some examples of the unchanged program, not all: each scores 0 (as dspy.Evaluate
        scores them), which a user should know, since the scores then measure the metric's errors too."""
        raised = [r for r in records if r.error_kind == METRIC_ERROR]
        if not raised or len(raised) == len(records):
            return
        logger.warning(
            "The metric raised on %d of the %d %s example(s) of the unchanged program (the first, example %d: %s); "
            "each such example scores 0 and fails, for every candidate the metric raises on. If the metric should "
            "score these, fix it (call it on one of them to see where it fails) and compile again with a new "
            "run_storage_dir.",
            len(raised),
            len(records),
            split,
            raised[0].example_id,
            (raised[0].error or "")[:200],
        )

    @staticmethod
    def _warn_program_raised_on_all(split: str, records: Sequence[ExampleResult]) -> None:
        """Every example raised in the program, with messages that differ (they name the input, as most errors do):
        the same warning as for one message, with the kinds of error counted."""
        kinds = Counter((r.error or "").split(":", 1)[0].strip() or "an error" for r in records)
        if kinds.keys() == {"AdapterParseError"}:
            return
        counted = ", ".join(f"{kind} on {n}" for kind, n in kinds.most_common(3))
        more = f" and {len(kinds) - 3} other kind(s)" if len(kinds) > 3 else ""
        logger.warning(
            "The program raised on every one of the %d %s example(s) of the unchanged program (%s%s; the first: %s). "
            "If that is an error in its code, no instructions can fix it: stop the run (Ctrl-C keeps what was paid), "
            "fix it, and compile again with a new run_storage_dir (the records of this one hold the errors).",
            len(records),
            split,
            counted,
            more,
            (records[0].error or "")[:200],
        )

    @staticmethod
    def _check_threshold_below_scale(split: str, records: Sequence[ExampleResult], threshold: float) -> None:
        scores = [r.score for r in records if r.error is None]  # (an example that raised fails: it scores 0)
        top, passing = max(scores), sum(1 for r in records if r.passed)
        said = (
            f"the metric scores up to {top:g} on the unchanged program's {split} examples, but pass_threshold="
            f"{threshold:g}: {passing} of {len(records)} pass (an example passes at a score of at least "
            "pass_threshold, and the optimizer works on the examples that fail). If the metric's scale goes above 1, "
            "pass pass_threshold=<the score of a right answer on that scale> (e.g. pass_threshold=5 for a 0-5 judge; "
            f"the unchanged program's best here, {top:g}, may be a wrong answer's score)"
        )
        if passing == len(records) and min(scores) < top:
            raise ConfigurationError(
                f"{said}. As it is, every example passes and nothing would be optimized. The baseline is kept: "
                "compile again with the same run_storage_dir and the new pass_threshold."
            )
        logger.warning("%s.", said)

    def _metric_raises_on_the_answer(self, example: Any, error: str) -> bool:
        """Whether the metric raises ``error`` again when the prediction is the example's own expected answer. The
        call is charged one unit, like a program run scored (a metric may call an LM); with none left, False."""
        labels = dict(example.labels().items()) if hasattr(example, "labels") else {}
        with self.ledger.reserve(1, TRAIN_EXAMPLE) as reservation:
            if not reservation.remaining:
                return False
            reservation.spend(1)
            try:
                with dspy.context(lm=self.evaluator.lm, trace=[]):
                    self.evaluator.metric.score(example, dspy.Prediction(**labels))
            except Exception as exc:
                return format_error(exc) == error
        return False

    def _recover_pending(self) -> None:
        """Turn the records of evaluations that a killed process never finished into saved runs, and charge
        them: the ledger on disk is written once per evaluation, so it does not count them yet. A log whose
        records a saved run already holds (the process died after saving, before deleting the log) is
        only deleted."""
        saved = self.store.all()
        for path, header, records in self.store.pending():
            rollout = int(header.get("rollout", 0))
            settled = (
                any(
                    run.split == header["split"]
                    and run.instructions == header["instructions"]
                    and run.rollout == rollout
                    and all(record in run.records for record in records)
                    for run in saved
                )
                if records
                else True
            )
            if not settled:
                charged = sum(1 for r in records if r.reusable) if header.get("charged") else 0
                kind = example_kind(header["split"])
                with self.ledger.reserve(charged, kind) as reservation:
                    reservation.spend(reservation.granted)
                label = header.get("label", "agent")
                self.recovered_now[label] = self.recovered_now.get(label, 0) + reservation.granted
                self._save(
                    f"{label}:recovered",
                    header["split"],
                    header["instructions"],
                    records,
                    int(header.get("requested", len(records))),
                    reservation.granted,
                    ["recovered from an evaluation the process did not finish"],
                    rollout=rollout,
                )
            path.unlink(missing_ok=True)

    def _index(self, run: EvalRun) -> None:
        digest = instructions_digest(run.instructions)
        with self._lock:
            for record in run.records:
                if record.reusable:
                    self._cache[(run.split, record.example_id, digest, run.rollout)] = record
                    self._held.setdefault((run.split, digest, run.rollout), set()).add(record.example_id)

    def stored(
        self, instructions: dict[str, str], split: str, ids: Sequence[int], rollout: int = 0
    ) -> dict[int, ExampleResult]:
        """The stored records that an evaluation of ``instructions`` on ``ids`` would reuse (free), by id."""
        digest = instructions_digest(instructions)
        with self._lock:
            found = {i: self._cache.get((split, i, digest, rollout)) for i in ids}
        return {i: record for i, record in found.items() if record is not None}

    def stored_count(self, instructions: dict[str, str], split: str, rollout: int = 0) -> int:
        """How many examples of ``split`` have a stored record of ``instructions`` (what an evaluation of the whole
        split would reuse), without looking each one up: a GEPA run asks it for every candidate, every iteration."""
        with self._lock:
            return len(self._held.get((split, instructions_digest(instructions), rollout), ()))

    def get(self, run_id: str) -> EvalRun:
        return self.store.get(run_id)

    def all(self) -> list[EvalRun]:
        """Every run so far, in id order."""
        return self.store.all()

    def complete_run(self, split: str, instructions: dict[str, str], label: str | None = None) -> EvalRun | None:
        """The latest run of ``instructions`` over the whole of ``split`` (with ``label``, when given), or None."""
        size = len(self.splits[split])
        for run in reversed(self.all()):
            if (
                run.split == split
                and run.instructions == instructions
                and run.evaluated_count == size
                and label in (None, run.label)
            ):
                return run
        return None

    def cheapest_check(self, split: str) -> int:
        """The fewest examples an evaluation must pay to score a candidate not yet scored on the whole ``split`` at
        its first sample: the whole split for new instructions, less for instructions with stored records of
        ``split`` (an evaluation that was cut short)."""
        size = len(self.splits[split])
        with self._lock:
            held = [
                len(ids) for (held_split, _, rollout), ids in self._held.items() if held_split == split and not rollout
            ]
        return size - max((count for count in held if count < size), default=0)

    def evaluate(
        self,
        program: Any,
        split: str,
        *,
        label: str,
        charged: bool = True,
        ids: list[int] | None = None,
        rollout: int = 0,
        reservation: Reservation | None = None,
    ) -> EvalRun:
        """Evaluate ``program`` on ``ids`` of ``split`` (all when None), save the run and return it.

        ``rollout`` picks the sample (:meth:`Evaluator.lm_for`); records are reused only from the same
        rollout. A charged evaluation reserves its own units, or spends from ``reservation`` when one is
        given (a caller that set aside the units of several evaluations at once).

        ``split`` and ``ids`` are trusted: the caller (the agent's tools, the optimizer) checked them."""
        examples = self.splits[split]
        ids = list(range(len(examples))) if ids is None else list(ids)
        self.observer.on_event(EvaluationStarted(split, label, len(ids)))
        instructions = get_instructions(program)
        digest = instructions_digest(instructions)
        with self._lock:
            cached = {i: self._cache.get((split, i, digest, rollout)) for i in ids}
        reused = [record for record in cached.values() if record is not None]
        todo = [i for i in ids if cached[i] is None]
        kind = example_kind(split)
        notes: list[str] = []
        spent = 0
        pending = (
            self.store.open_pending(
                {
                    "label": label,
                    "split": split,
                    "instructions": instructions,
                    "requested": len(ids),
                    "charged": charged,
                    "rollout": rollout,
                }
            )
            if todo
            else None
        )
        on_record = _RecordSink(pending, self.observer) if pending is not None else None
        items = [(i, examples[i]) for i in todo]
        try:
            if charged and todo:
                own = self.ledger.reserve(len(todo), kind) if reservation is None else None
                source = own if own is not None else reservation
                granted, before = min(source.remaining, len(todo)), source.spent
                try:
                    new = self.evaluator.evaluate(
                        program, items, source, on_record=on_record, rollout=rollout, step_feedback=split == "train"
                    )
                finally:
                    spent = source.spent - before
                    if own is not None:
                        own.release()
                if len(new) < granted:  # examples skipped once max_cost_usd was spent
                    notes.append(
                        f"{granted - len(new)} of {granted} granted examples were not run: max_cost_usd was spent"
                    )
                if granted < len(todo):
                    notes.append(
                        f"budget allowed {granted} of {len(todo)} requested examples; {self.ledger.left} units left"
                        + (f"; {self.ledger.stop_reason}" if self.ledger.stop_reason else "")
                    )
            else:
                new = (
                    self.evaluator.evaluate(
                        program, items, on_record=on_record, rollout=rollout, step_feedback=split == "train"
                    )
                    if todo
                    else []
                )
        except EvaluationStopped as stopped:  # EvaluationLMError, MetricError, Ctrl-C: keep what was paid for
            reason, completed = stopped.reason, stopped.records
            if completed or isinstance(reason, (EvaluationLMError, MetricError)):
                first_line = str(reason).splitlines()[0] if str(reason) else type(reason).__name__
                notes.append(
                    f"stopped early after {len(completed)} of {len(todo)} new examples: "
                    f"{type(reason).__name__}: {first_line}"
                )
                self._save(
                    f"{label}:partial",
                    split,
                    instructions,
                    reused + completed,
                    len(ids),
                    spent,
                    notes,
                    settles=pending,
                    complete=False,
                    rollout=rollout,
                )
            elif pending is not None:
                pending.discard()
            raise reason from reason.__cause__
        except Exception:  # the compile goes on (an agent's tool call failed): the log is not a resume's to charge
            if pending is not None:
                pending.discard()
            raise
        except BaseException:  # a Ctrl-C landing as the examples completed, say: it ends the process, and the paid
            if pending is not None:  # records stay pending, for a resume to take and charge as after a kill
                pending.close()
            raise
        if reused:
            notes.append(f"{len(reused)} record(s) reused from earlier runs with identical instructions (not charged)")
        uncharged = [r for r in new if not r.reusable]
        if uncharged and charged:
            notes.append(f"{len(uncharged)} example(s) failed in the LM call itself and were not charged")
        saved = self._save(
            label, split, instructions, reused + new, len(ids), spent, notes, settles=pending, rollout=rollout
        )
        self._check_code_error(label, new)  # (after the run is kept: it was paid for)
        return saved

    def _save(
        self,
        label: str,
        split: str,
        instructions: dict[str, str],
        records: list[ExampleResult],
        requested: int,
        spent: int,
        notes: list[str],
        settles: PendingLog | None = None,
        complete: bool = True,
        rollout: int = 0,
    ) -> EvalRun:
        run = EvalRun(
            run_id=self.store.next_run_id(),
            split=split,
            label=label,
            instructions=dict(instructions),
            records=tuple(records),
            requested_count=requested,
            budget_spent=spent,
            budget_left=self.ledger.left,
            note="; ".join(notes) if notes else None,
            created_at=time.time(),
            rollout=rollout,
        )
        self.store.save(run, settles=settles)
        self._index(run)
        self.observer.on_event(EvaluationFinished(run, self.ledger.snapshot(), complete=complete))
        return run


def _steps_that_ran(records: Sequence[ExampleResult]) -> frozenset[str]:
    """The steps that ran on ``records``, the one that raised included: only their instructions can change them."""
    ran = {call.step_name for record in records for call in record.steps}
    ran |= {record.failed_call.step_name for record in records if record.failed_call is not None}
    return frozenset(ran)
