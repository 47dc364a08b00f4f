"""The failure analysis of a whole train run (:meth:`AnalysisMoves.analyze_failures`): every failure grouped by what
code sees of it (the step at fault, the kind of failure, the expected and produced label of a short output) and by
what the sub-LM names: one short cause per failure in batched prompts, then one prompt that merges the causes into
groups, checked in code (every failure in exactly one group, unknown ids dropped; the code groups when the merge is
unusable, or groups nothing while code finds failures alike). A proposal can then be written for one group
(:meth:`AnalysisMoves.failure_group`).

Budget: one unit per sub-LM prompt that answered, as a proposal or ``llm_query_batched`` is charged: at most
:data:`MAX_PROMPTS` per analysis (:data:`FAILURES_PER_PROMPT` failures a prompt, :data:`MAX_ANALYSED` at most, and the
merge), all reserved before the first is sent, or the analysis is refused and nothing is spent. Every answer is
kept in the run directory (``analysis_answers.jsonl``) and every analysis too (``analyses.json``): asked again
about the same records, in this process or after a resume, it is returned for nothing.

Train only: the records are a train run's or the current instructions' train records, never a validation one.

May import: dspy, pydantic, ``rlmoptimizer.evaluation``, ``.budget``, ``.errors``, ``.fingerprint``, ``.records``,
``.storage`` and ``rlmoptimizer.moves``' ``context`` and ``failures``.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import dspy
import pydantic

from rlmoptimizer.budget import SUB_LM_CALL, Reservation
from rlmoptimizer.errors import BudgetExhaustedError
from rlmoptimizer.evaluation.lm_failures import classify_lm_failure, failure_summary
from rlmoptimizer.fingerprint import instructions_digest
from rlmoptimizer.moves.context import MoveContext, Source, refuse
from rlmoptimizer.moves.failures import (
    CauseGroup,
    Failure,
    FailureAnalysis,
    FailureCause,
    FailureGroup,
    checked_causes,
    checked_merge,
    clip,
    code_groups,
    contrast_for,
    failures_of,
    largest_first,
    make_group,
    render_failure,
    render_passing,
    shared_inputs,
    spread_sample,
    step_order,
)
from rlmoptimizer.records import ExampleResult
from rlmoptimizer.storage.analyses import read_analyses, write_analyses
from rlmoptimizer.storage.answers import AnswerStore
from rlmoptimizer.storage.layout import ANALYSIS_ANSWERS

FAILURES_PER_PROMPT = 8
"""Failures one prompt asks the causes of."""
MAX_ANALYSED = 48
"""The most failures the sub-LM is asked about (more: a sample spread over the code groups; code counts all)."""
MAX_PROMPTS = MAX_ANALYSED // FAILURES_PER_PROMPT + 1
"""The most sub-LM prompts (units) one analysis costs: its cause prompts and the merge."""
MAX_CAUSES_IN_GUIDANCE = 12


class NameFailureCauses(dspy.Signature):
    """Each failure below is one example a program got wrong: its inputs, the expected output, what the program
    produced, the metric's score and feedback, and what the program's steps did. For every failure, name its cause in
    one short sentence: the rule, distinction or fact the program's instructions miss, said so that it would hold for
    other examples of the same kind (e.g. "refund requests for a damaged item go to returns, not billing"), not a
    restatement of the wrong output. Give exactly one entry per failure id."""

    program_instructions: str = dspy.InputField(desc="the program's current instructions, per step")
    failures: str = dspy.InputField(desc="the failures, each headed by its id")
    passing: str = dspy.InputField(desc="examples of the same kind the program got right, for contrast")
    causes: list[FailureCause] = dspy.OutputField(desc="one entry per failure id: its id and its cause")


class GroupFailureCauses(dspy.Signature):
    """Below is the cause named for each failure of one program, one line per failure: its id, then its cause. Merge
    the failures into a few groups (at most 8) of failures that share a cause: the same missed rule or distinction.
    Give each group a short name (a few words), its shared cause in one sentence, and the ids of its failures. Every
    failure id goes in exactly one group; a failure whose cause no other shares is a group of its own."""

    causes: str = dspy.InputField(desc="one line per failure: its id, a colon, its cause")
    groups: list[CauseGroup] = dspy.OutputField(desc="the groups, largest first")


def prompts_for(failures: int) -> int:
    """The sub-LM prompts an analysis of ``failures`` failures costs at most: one per :data:`FAILURES_PER_PROMPT` of
    the (at most :data:`MAX_ANALYSED`) failures asked about, and one merge when there are two or more."""
    analysed = min(failures, MAX_ANALYSED)
    return -(-analysed // FAILURES_PER_PROMPT) + (1 if analysed >= 2 else 0)


def _digest(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class _Book:
    """The analyses of a compile by id, and the latest asked for, kept in the run directory."""

    def __init__(self, directory: str | Path | None) -> None:
        self.directory = directory
        self.by_id: dict[str, FailureAnalysis] = {}
        records, latest = read_analyses(directory)
        for record in records:
            try:
                analysis = FailureAnalysis.from_record(record)
            except (KeyError, TypeError, ValueError, AttributeError):
                continue  # a damaged entry: not reused
            self.by_id[analysis.analysis_id] = analysis
        self.latest = latest if latest in self.by_id else next(reversed(self.by_id), None)

    def find(self, key: str) -> FailureAnalysis | None:
        return next((a for a in self.by_id.values() if a.key == key), None)

    def next_id(self) -> str:
        return f"analysis-{len(self.by_id) + 1}"

    def keep(self, analysis: FailureAnalysis) -> None:
        self.by_id[analysis.analysis_id] = analysis
        self.latest = analysis.analysis_id
        write_analyses(self.directory, [a.to_record() for a in self.by_id.values()], self.latest)


@dataclass
class _Asked:
    """What the sub-LM said about the analysed failures."""

    causes: dict[int, str] = field(default_factory=dict)
    merge: list[CauseGroup] | None = None
    prompts: int = 0
    spent: int = 0
    unanswered: list[str] = field(default_factory=list)  # no answer (not charged): the analysis is not kept for reuse
    no_answer: BaseException | None = None  # the LM error of a prompt that got no answer
    unusable: list[str] = field(default_factory=list)  # answered with nothing usable (charged)
    copied: list[int] = field(default_factory=list)  # failures whose named cause copied their inputs (dropped)


class AnalysisMoves(MoveContext):
    _book: _Book | None = None
    _analysis_answers: AnswerStore | None = None

    def _directory(self) -> Any:
        return getattr(getattr(self.runs, "store", None), "directory", None)

    def _analyses(self) -> _Book:
        with self._naming:
            if self._book is None:
                self._book = _Book(self._directory())
            return self._book

    @property
    def latest_analysis(self) -> FailureAnalysis | None:
        """The analysis made or asked for last (also in an earlier process of this compile), None before the first."""
        book = self._analyses()
        return book.by_id.get(book.latest) if book.latest else None

    # -- analyse ---------------------------------------------------------------------------------------
    def analyze_failures(self, run_id: Any = None, step: Any = None, use_lm: Any = True) -> FailureAnalysis:
        """Every failure of a train run (default: the current instructions' train records) grouped by what code sees
        and, with ``use_lm``, by the causes the sub-LM names, merged into groups with counts and ids; ``step``: only
        the failures where that step ran or raised, shown with that step's call. At most :data:`MAX_PROMPTS` units,
        reserved in full before the first prompt or refused; asked again about the same records, it is reused for
        nothing (also after a resume: the analyses are kept in the run directory)."""
        tool = "analyze_failures"
        if step is not None:
            self._check_step(step, tool)
        if not isinstance(use_lm, bool):
            raise refuse(f"use_lm must be True or False, got {use_lm!r}", "pass use_lm=False for the grouping by code")
        source = self._source(run_id, tool)
        records = list(source.records.values())
        order = step_order(records, self.step_names)
        failures = failures_of(records, order, step)
        passing = [r for r in records if r.passed]
        digest = instructions_digest(source.instructions)
        key = _digest([source.label, digest, step, use_lm, [r.to_dict() for r in records]])
        book = self._analyses()
        with self._naming:
            done = book.find(key)
            if done is not None:
                book.keep(done)  # the latest again
                return done.reuse()
        analysed = spread_sample(failures, MAX_ANALYSED) if use_lm else []
        asked = self._ask(analysed, passing, step, source) if analysed else _Asked()
        # not one prompt answered: the analysis is the code's, and the compile counts the sub LM's silence
        self.silent_sub_lm = asked.no_answer if not asked.spent and not asked.causes else None
        with self._naming:
            analysis = self._assemble(book.next_id(), source, step, records, failures, analysed, passing, asked)
            analysis = replace(analysis, key=key if not asked.unanswered else "")  # one asked in part: not reused
            book.keep(analysis)
        return analysis

    def _ask(self, analysed: list[Failure], passing: list[ExampleResult], step: str | None, source: Source) -> _Asked:
        lm = self._lm()
        kept = self._kept_analysis_answers()
        shown = "\n".join(
            f"{name}: {clip(text, 1500)}" for name, text in source.instructions.items() if step is None or name == step
        )
        batches = [analysed[i : i + FAILURES_PER_PROMPT] for i in range(0, len(analysed), FAILURES_PER_PROMPT)]
        prompts = [
            {
                "program_instructions": shown,
                "failures": "\n\n".join(render_failure(f, step) for f in batch),
                "passing": "\n\n".join(render_passing(r) for r in contrast_for(batch, passing)) or "(none)",
            }
            for batch in batches
        ]
        merge = len(analysed) >= 2
        unpaid = sum(1 for p in prompts if _replayed(kept.get(_answer_key("causes", p)), FailureCause) is None)
        unpaid += int(merge)  # the merge's prompt is known once the causes are: reserved, released if replayed
        asked = _Asked(prompts=len(prompts))
        with self._reserve(unpaid, len(prompts), merge) as reservation:
            answers = self._run(NameFailureCauses, "causes", prompts, lm, kept, reservation, asked)
            shared = shared_inputs([f.record for f in analysed])
            for batch, answer in zip(batches, answers, strict=True):
                causes, copied = checked_causes(answer, batch, shared)
                asked.causes.update(causes)
                asked.copied.extend(copied)
            if merge and len(asked.causes) >= 2:
                lines = "\n".join(f"{i}: {cause}" for i, cause in sorted(asked.causes.items()))
                asked.prompts += 1
                [asked.merge] = self._run(
                    GroupFailureCauses, "groups", [{"causes": lines}], lm, kept, reservation, asked
                )
            asked.spent = reservation.spent
        return asked

    def _reserve(self, unpaid: int, batches: int, merge: bool) -> Reservation:
        try:
            return self.ledger.reserve_exactly(unpaid, SUB_LM_CALL)
        except BudgetExhaustedError:
            why = self.ledger.stop_reason or f"{self.ledger.left_for(SUB_LM_CALL)} are left"
            raise refuse(
                f"analyze_failures: this needs {unpaid} sub-LM prompt(s) ({batches} of up to {FAILURES_PER_PROMPT} "
                f"failures{', and one to merge their causes' if merge else ''}) but {why}",
                "pass use_lm=False for the grouping by code (free), or step=... for fewer failures",
            ) from None

    def _run(
        self,
        signature: type[dspy.Signature],
        output: str,
        prompts: list[dict[str, str]],
        lm: Any,
        kept: AnswerStore,
        reservation: Reservation,
        asked: _Asked,
    ) -> list[list[Any] | None]:
        """Each prompt answered (or replayed from the run directory), in order: its typed items, None when it gave
        nothing usable; every answer is kept, what went wrong is noted on ``asked``."""
        item = FailureCause if output == "causes" else CauseGroup

        def one(inputs: dict[str, str]) -> list[Any] | None:
            key = _answer_key(output, inputs)
            replayed = _replayed(kept.get(key), item)
            if replayed is not None:
                answer, why = replayed
                if why is not None:
                    asked.unusable.append(why)
                return answer
            try:
                answer = list(self._ask_once(signature, output, inputs, lm, reservation) or ())
            except Exception as exc:
                if classify_lm_failure(exc) is not None:  # no answer: not charged, not kept, tried again next time
                    asked.unanswered.append(failure_summary(exc))
                    asked.no_answer = exc
                    return None
                why = _unusable(exc)
                asked.unusable.append(why)
                kept.put(key, json.dumps({"unusable": why}))
                return None
            kept.put(key, json.dumps({"answer": [entry.model_dump() for entry in answer]}))
            return answer

        if len(prompts) == 1:
            return [one(prompts[0])]
        with ThreadPoolExecutor(max_workers=min(4, len(prompts)), thread_name_prefix="rlmoptimizer-analysis") as pool:
            futures = [pool.submit(contextvars.copy_context().run, one, inputs) for inputs in prompts]
            return [f.result() for f in futures]

    def _ask_once(
        self, signature: type[dspy.Signature], output: str, inputs: dict[str, str], lm: Any, reservation: Reservation
    ) -> Any:
        """One prompt of ``signature`` to ``lm`` with dspy's JSON adapter (one LM call, as dspy's proposer makes):
        1 unit of ``reservation`` when it answered, also with a reply that does not parse; on disk at once."""
        try:
            with dspy.context(lm=lm, adapter=dspy.JSONAdapter(), trace=[]):
                answer = getattr(dspy.Predict(signature)(**inputs), output)
        except Exception as exc:
            if classify_lm_failure(exc) is None:  # the LM answered: a call
                reservation.spend(1)
                self._answered()
            raise
        reservation.spend(1)
        self._answered()
        return answer

    def _kept_analysis_answers(self) -> AnswerStore:
        with self._naming:
            if self._analysis_answers is None:
                self._analysis_answers = AnswerStore(self._directory(), name=ANALYSIS_ANSWERS)
            return self._analysis_answers

    def _assemble(
        self,
        analysis_id: str,
        source: Source,
        step: str | None,
        records: list[ExampleResult],
        failures: list[Failure],
        analysed: list[Failure],
        passing: list[ExampleResult],
        asked: _Asked,
    ) -> FailureAnalysis:
        notes = [] if failures else [f"nothing failed in {source.label}"]
        lm_failed = sum(1 for r in records if not r.reusable)
        if lm_failed:
            notes.append(f"{lm_failed} record(s) whose LM call failed without an answer are left out")
        if step is not None:
            elsewhere = sum(1 for r in records if not r.passed and r.reusable) - len(failures)
            if elsewhere:
                notes.append(f"{elsewhere} failure(s) where step {step!r} neither ran nor raised are left out")
        if len(analysed) < len(failures) and analysed:
            notes.append(
                f"the sub-LM was asked about {len(analysed)} of {len(failures)} failures (at most {MAX_ANALYSED}, "
                "taken in turn from each code group); the code groups count all"
            )
        if asked.unanswered:
            notes.append(
                f"{len(asked.unanswered)} prompt(s) got no answer ({asked.unanswered[0]}): not charged; asking again "
                "asks them again"
            )
        if asked.unusable:
            notes.append(f"{len(asked.unusable)} answer(s) gave nothing usable (e.g. {asked.unusable[0]})")
        if asked.copied:
            notes.append(
                f"the cause named for failure(s) {sorted(asked.copied)} copied the example's inputs instead of naming "
                "a rule: they are grouped by code"
            )
        groups, why = _cause_groups(analysis_id, analysed, asked, passing)
        if why:
            notes.append(why)
        code = code_groups(failures, passing, analysis_id, asked.causes)
        if groups and max(g.count for g in groups) < 2 <= max((g.count for g in code), default=0):
            groups = None  # a merge that grouped nothing shows no shared cause; failures alike to code do
            notes.append(
                "the sub-LM's merge left every failure in a group of its own: the groups are the code groups (the "
                "step, the kind and the expected -> produced label they share), with the causes named for them"
            )
        return FailureAnalysis(
            analysis_id=analysis_id,
            source=source.label,
            run_id=source.run_id,
            instructions_digest=instructions_digest(source.instructions),
            step=step,
            evaluated_count=len(records),
            failed_ids=tuple(f.example_id for f in failures),
            analysed_ids=tuple(f.example_id for f in analysed),
            causes=dict(sorted(asked.causes.items())),
            groups=groups if groups is not None else code,
            code_groups=code,
            grouped_by="sub-LM" if groups is not None else "code",
            sub_lm_prompts=asked.prompts,
            budget_spent=asked.spent,
            note="; ".join(notes) or None,
        )

    # -- a group, for a proposal ----------------------------------------------------------------------------
    def failure_group(self, group: Any, tool: str) -> tuple[FailureAnalysis, FailureGroup]:
        """The analysis and group ``group`` names: a :class:`FailureGroup`, a group as ``analyze_failures`` returned
        it (a dict), or the name or index of a group of the latest analysis."""
        book = self._analyses()
        if isinstance(group, FailureGroup):
            analysis_id, which = group.analysis_id, group.name
        elif isinstance(group, dict):
            analysis_id, which = group.get("analysis"), group.get("name")
        elif isinstance(group, (str, int)) and not isinstance(group, bool):
            analysis_id, which = book.latest, group
        else:
            raise refuse(
                f"{tool}: group is {type(group).__name__} {group!r:.80}",
                "pass a group of analyze_failures(): its index (0 is the largest), its name, or the dict",
            )
        analysis = book.by_id.get(analysis_id) if isinstance(analysis_id, str) else None
        if analysis is None:
            known = list(book.by_id) or "none yet"
            raise refuse(
                f"{tool}: no failure analysis {analysis_id!r}" if analysis_id else f"{tool}: no failure analysis yet",
                f"call analyze_failures() first, then pass one of its groups (analyses: {known})",
            )
        try:
            return analysis, analysis.group(which if isinstance(which, (str, int)) else "")
        except KeyError:
            names = [g.name for g in analysis.groups]
            raise refuse(
                f"{tool}: {analysis.analysis_id} has no group {which!r}",
                f"pass an index from 0 to {len(names) - 1} or a name: {names}" if names else "it found no failures",
            ) from None

    def group_records(self, analysis: FailureAnalysis, run_id: Any, tool: str) -> tuple[str, dict[int, ExampleResult]]:
        """The records an analysis was made from (or those of ``run_id`` when given): where a proposal for one of its
        groups takes its examples."""
        if run_id is not None:
            found = self._source(run_id, tool)
            return found.label, found.records
        if analysis.run_id is not None:
            run = self.get_run(analysis.run_id)
            return f"run {run.run_id}", {r.example_id: r for r in run.records}
        return analysis.source, self._records_of(analysis.instructions_digest)


def group_guidance(analysis: FailureAnalysis, group: FailureGroup) -> str:
    """What a proposal for ``group`` is asked to fix: the group, its shared cause, its labels, each failure's cause."""
    where = f"; the step mostly at fault: {group.step}" if group.step else ""
    lines = [
        f'Fix this group of failures: "{group.name}" ({group.count} of the {len(analysis.failed_ids)} failures '
        f"of the current instructions{where}; kind: {group.kind}).",
        f"Their shared cause: {group.cause}",
    ]
    if group.labels:
        lines.append("Expected -> produced: " + ", ".join(f"{label} (x{n})" for label, n in group.labels[:5]))
    named = [(i, analysis.causes[i]) for i in group.example_ids if i in analysis.causes]
    if named:
        lines.append("The cause named for each failure of the group:")
        lines += [f"- example {i}: {cause}" for i, cause in named[:MAX_CAUSES_IN_GUIDANCE]]
    lines.append("State the rule these failures reveal; keep what the instructions already get right.")
    return "\n".join(lines)


def _cause_groups(
    analysis_id: str, analysed: Sequence[Failure], asked: _Asked, passing: list[ExampleResult]
) -> tuple[tuple[FailureGroup, ...] | None, str | None]:
    """The sub-LM's groups of the analysed failures, checked, and a note; (None, why) when they are unusable (the
    code groups stand instead), (None, None) when the sub-LM was not asked."""
    if not analysed:
        return None, None
    by_id = {f.example_id: f for f in analysed}
    named = [i for i in by_id if i in asked.causes]
    if len(named) == 1:  # one cause: its own group, nothing to merge
        merged, unplaced, dropped = [(clip(asked.causes[named[0]], 60), asked.causes[named[0]], named)], [], []
    elif not named:
        return None, "no cause was named: the groups are the code groups"
    elif asked.merge is None:
        return None, "the merge gave nothing usable: the groups are the code groups"
    else:
        merged, unplaced, dropped = checked_merge(asked.merge, named)
        placed = sum(len(ids) for _, _, ids in merged)
        if not merged or placed * 2 < len(named):
            return None, f"the merge placed {placed} of {len(named)} failures: the groups are the code groups"
    groups = [make_group(name, cause, [by_id[i] for i in ids], passing, analysis_id) for name, cause, ids in merged]
    rest = [by_id[i] for i in [*unplaced, *(i for i in by_id if i not in asked.causes)]]
    groups += code_groups(rest, passing, analysis_id, asked.causes)
    notes = []
    if dropped:
        notes.append(f"the merge's {', '.join(dropped[:3])}{' ...' if len(dropped) > 3 else ''} were dropped")
    if rest:
        notes.append(f"{len(rest)} failure(s) no merged group holds are grouped by code")
    return largest_first(groups), "; ".join(notes) or None


def _replayed(stored: str | None, item: type[pydantic.BaseModel]) -> tuple[list[Any] | None, str | None] | None:
    """A kept answer as (its items, None) or (None, why it was unusable); None when there is none (or it is
    damaged: then the prompt is asked again)."""
    if stored is None:
        return None
    try:
        data = json.loads(stored)
        if "unusable" in data:
            return None, str(data["unusable"])
        return [item.model_validate(entry) for entry in data["answer"]], None
    except (ValueError, TypeError, KeyError, pydantic.ValidationError):
        return None


def _answer_key(output: str, inputs: dict[str, str]) -> str:
    return f"{output}:{_digest(inputs)}"


def _unusable(error: BaseException) -> str:
    reply = getattr(error, "lm_response", None)
    text = " ".join(str(reply if reply is not None else error).split())
    return f"{type(error).__name__}: {text[:160]}" + (" ..." if len(text) > 160 else "")
