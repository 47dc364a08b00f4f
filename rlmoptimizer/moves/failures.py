"""What a failure analysis is made of, and everything about it that needs no LM: the groups code can see (the step at
fault, the kind of failure, the expected and produced label of a short output), the failures as the sub-LM is shown
them, the check of the sub-LM's merge, and the analysis as a value (:class:`FailureAnalysis`) with its printable
summary.

Pure: no LM call, no budget, no file. The move that asks the sub-LM is :mod:`rlmoptimizer.moves.analysis`.

May import: pydantic, ``rlmoptimizer.records``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher
from typing import Any

import pydantic

from rlmoptimizer.records import LM_CALL_ERROR, METRIC_ERROR, PROGRAM_ERROR, ExampleResult

SHORT_OUTPUT = 40
"""An expected or produced value this short (characters) is a label: its pair is a code-visible key."""
MAX_FAILURE_CHARS = 1200
"""The most characters of one failure shown to the sub-LM (each value is clipped first, then the whole)."""
MAX_VALUE_CHARS = 300
MAX_CONTRAST = 5
"""The most passing examples of the same kind a group lists (and two per prompt are shown to the sub-LM)."""
UNGROUPED = "not grouped by the merge"
COPIED_WORDS = 8
"""A named cause whose longest run of words taken verbatim from its failure's inputs is at least this long and makes
up two thirds of it is a copy of the example, not a cause (:func:`copies_inputs`)."""


# -- what the sub-LM answers (typed outputs of the analysis' signatures) ------------------------------------------
class FailureCause(pydantic.BaseModel):
    """The cause the sub-LM names for one failure."""

    failure_id: int
    cause: str


class CauseGroup(pydantic.BaseModel):
    """One group of the sub-LM's merge: failures that share a cause."""

    name: str
    cause: str
    failure_ids: list[int]


# -- the value -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FailureGroup:
    """Failures that share a cause (or, for a code group, a code-visible key).

    Invariants: ``count == len(example_ids)``; ``example_ids`` are failing train ids of the analysis, sorted, each in
    one group of its kind (cause groups, code groups); ``contrast_ids`` are passing train ids of the same kind (the
    same expected label), disjoint from ``example_ids``; ``step`` is the step most of its failures point at (None
    when none ran), ``kind`` the most common kind (``wrong output``, ``partial score``, ``program error (Type)``,
    ``metric error``); ``labels`` counts its ``field: expected -> produced`` pairs of short outputs; ``step_ran`` is
    how many of its examples left ``step`` a call a proposal can reflect on (one that returned, or whose own output
    did not parse): 0 when each raised before it or took another branch."""

    name: str
    cause: str
    example_ids: tuple[int, ...]
    step: str | None
    kind: str
    labels: tuple[tuple[str, int], ...] = ()
    contrast_ids: tuple[int, ...] = ()
    analysis_id: str = ""
    step_ran: int | None = None  # (None: read from an analysis kept before it was recorded)

    @property
    def count(self) -> int:
        return len(self.example_ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cause": self.cause,
            "count": self.count,
            "example_ids": list(self.example_ids),
            "step": self.step,
            "kind": self.kind,
            "labels": {label: n for label, n in self.labels},
            "contrast_ids": list(self.contrast_ids),
            "analysis": self.analysis_id,
            "step_ran": self.step_ran,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FailureGroup:
        return cls(
            name=str(data["name"]),
            cause=str(data.get("cause", "")),
            example_ids=tuple(int(i) for i in data["example_ids"]),
            step=data.get("step"),
            kind=str(data.get("kind", "")),
            labels=tuple((str(k), int(v)) for k, v in dict(data.get("labels") or {}).items()),
            contrast_ids=tuple(int(i) for i in data.get("contrast_ids") or ()),
            analysis_id=str(data.get("analysis", "")),
            step_ran=None if data.get("step_ran") is None else int(data["step_ran"]),
        )


@dataclass(frozen=True)
class FailureAnalysis:
    """Every failure of one train run (or of the current instructions' train records), grouped by cause.

    Invariants: ``code_groups`` (by what code sees, largest first) hold every id of ``failed_ids`` exactly once;
    ``analysed_ids`` are the failures the sub-LM was asked about: ``failed_ids``, or a sample spread over the code
    groups when there are more than it is asked about, or none (``use_lm=False``); ``causes`` has an entry for each
    analysed failure the sub-LM named a cause for. ``grouped_by`` is ``"sub-LM"`` when ``groups`` are the sub-LM's
    (largest first, every analysed id exactly once: the merged groups, and the code groups of what the merge did not
    place), else ``"code"``: ``groups`` are then the code groups (no sub-LM was asked, or its answers were unusable:
    ``note`` says which). No validation example is in it: it is made from train records only.
    """

    analysis_id: str
    source: str
    run_id: str | None
    instructions_digest: str
    step: str | None
    evaluated_count: int
    failed_ids: tuple[int, ...]
    analysed_ids: tuple[int, ...]
    causes: Mapping[int, str]
    groups: tuple[FailureGroup, ...]
    code_groups: tuple[FailureGroup, ...]
    grouped_by: str
    sub_lm_prompts: int = 0
    """The sub-LM prompts the analysis is made of (answered now, or replayed from the run directory)."""
    budget_spent: int = 0
    """Units this call charged: 0 when it was replayed or reused."""
    reused: bool = False
    """True when this call returned an analysis made before, for nothing."""
    note: str | None = None
    key: str = field(default="", repr=False)

    def largest(self) -> FailureGroup | None:
        """The group with the most failures (the first on a tie), None when nothing failed."""
        return self.groups[0] if self.groups else None

    def group(self, which: int | str) -> FailureGroup:
        """A group by its index in :attr:`groups` or its name (exact, else ignoring case; a name of
        :attr:`code_groups` too); :class:`KeyError` else."""
        if isinstance(which, int) and not isinstance(which, bool):
            if -len(self.groups) <= which < len(self.groups):
                return self.groups[which]
            raise KeyError(which)
        for exact in (True, False):
            for group in (*self.groups, *self.code_groups):
                if group.name == which if exact else group.name.casefold() == str(which).strip().casefold():
                    return group
        raise KeyError(which)

    def summary(self) -> str:
        """A printable table: one line per cause group, then one per code group."""
        how = (
            f"grouped by the sub-LM ({self.sub_lm_prompts} prompt(s), {self.budget_spent} unit(s) now"
            + (", reused" if self.reused else "")
            + ")"
            if self.grouped_by == "sub-LM"
            else "grouped by code"
        )
        head = (
            f"{self.analysis_id} of {self.source}" + (f", step {self.step}" if self.step else "") + ": "
            f"{len(self.failed_ids)} failure(s) of {self.evaluated_count} evaluated, {how}"
        )
        lines = [head]
        if len(self.analysed_ids) < len(self.failed_ids):
            lines.append(f"(the sub-LM was asked about {len(self.analysed_ids)} of them; the code groups count all)")
        if self.groups:
            lines.append("groups by cause (index. name (count): cause [step, kind] ids; labels; passing of the kind):")
            lines += [f"  {i}. {_group_line(g)}" for i, g in enumerate(self.groups)]
        if self.code_groups and self.grouped_by == "sub-LM":
            lines.append("groups by what code sees:")
            lines += [f"  - {g.name} ({g.count}): ids {_ids(g.example_ids)}" for g in self.code_groups]
        if self.note:
            lines.append(f"note: {self.note}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (what the agent's tool returns), with ``summary``."""
        group_of = {i: g.name for g in self.groups for i in g.example_ids}
        return {
            "analysis_id": self.analysis_id,
            "from": self.source,
            "run_id": self.run_id,
            "step": self.step,
            "evaluated_count": self.evaluated_count,
            "failed_ids": list(self.failed_ids),
            "analysed_ids": list(self.analysed_ids),
            "grouped_by": self.grouped_by,
            "groups": [g.to_dict() for g in self.groups],
            "code_groups": [g.to_dict() for g in self.code_groups],
            "causes": [
                {"example_id": i, "cause": self.causes[i], "group": group_of.get(i)} for i in sorted(self.causes)
            ],
            "sub_lm_prompts": self.sub_lm_prompts,
            "budget_spent": self.budget_spent,
            "reused": self.reused,
            "note": self.note,
            "summary": self.summary(),
        }

    def to_record(self) -> dict[str, Any]:
        """What the run directory keeps (:meth:`to_dict` with the digests, without the summary)."""
        data = self.to_dict()
        del data["summary"]
        return {**data, "instructions_digest": self.instructions_digest, "key": self.key}

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> FailureAnalysis:
        return cls(
            analysis_id=str(data["analysis_id"]),
            source=str(data["from"]),
            run_id=data.get("run_id"),
            instructions_digest=str(data["instructions_digest"]),
            step=data.get("step"),
            evaluated_count=int(data["evaluated_count"]),
            failed_ids=tuple(int(i) for i in data["failed_ids"]),
            analysed_ids=tuple(int(i) for i in data["analysed_ids"]),
            causes={int(c["example_id"]): str(c["cause"]) for c in data.get("causes") or ()},
            groups=tuple(FailureGroup.from_dict(g) for g in data["groups"]),
            code_groups=tuple(FailureGroup.from_dict(g) for g in data["code_groups"]),
            grouped_by=str(data["grouped_by"]),
            sub_lm_prompts=int(data.get("sub_lm_prompts", 0)),
            note=data.get("note"),
            key=str(data.get("key", "")),
        )

    def reuse(self) -> FailureAnalysis:
        """This analysis returned again, for nothing."""
        return replace(self, budget_spent=0, reused=True)


def _ids(ids: Sequence[int], most: int = 12) -> str:
    shown = ", ".join(str(i) for i in ids[:most])
    return shown + (f" (+{len(ids) - most})" if len(ids) > most else "")


def _group_line(group: FailureGroup) -> str:
    line = f"{group.name} ({group.count}): {clip(group.cause, 200)} [{group.step or 'no step ran'}, {group.kind}]"
    line += f" ids {_ids(group.example_ids)}"
    if group.labels:
        line += "; " + ", ".join(f"{label} x{n}" for label, n in group.labels[:3])
    if group.contrast_ids:
        line += f"; passing of the kind: {_ids(group.contrast_ids)}"
    return line


def clip(text: str, most: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= most else text[: most - 3] + "..."


# -- what code sees -------------------------------------------------------------------------------------------
def step_order(records: Iterable[ExampleResult], step_names: Sequence[str]) -> list[str]:
    """The order the program calls its steps in: as the longest trace shows it, then the steps it never showed."""
    longest: list[str] = []
    for record in records:
        calls = list(dict.fromkeys(s.step_name for s in record.steps))
        if len(calls) > len(longest):
            longest = calls
    return [*longest, *(s for s in step_names if s not in longest)]


def failure_step(record: ExampleResult, order: Sequence[str]) -> str | None:
    """The step a failure points at: where the program raised (the step whose call raised, as the evaluation saw
    it; for a record kept before that was recorded, the first step of ``order`` that did not run), else the step
    that produced the final output (the last one called)."""
    calls = [s.step_name for s in record.steps]
    if record.error_kind == PROGRAM_ERROR:
        if record.failed_call is not None:
            return record.failed_call.step_name
        missing = [s for s in order if s not in set(calls)]
        if missing:
            return missing[0]
    return calls[-1] if calls else None


def unparsed_at(record: ExampleResult) -> str | None:
    """The step whose own output did not parse on this example (the program raised ``AdapterParseError`` in that
    step's call), or None."""
    call = record.failed_call
    return call.step_name if call is not None and (record.error or "").startswith("AdapterParseError") else None


def reflects_on(record: ExampleResult, step: str) -> bool:
    """Whether ``record`` leaves ``step`` a call to reflect on: one that returned, or one whose own output did not
    parse."""
    return any(call.step_name == step for call in record.steps) or unparsed_at(record) == step


def failure_kind(record: ExampleResult) -> str:
    if record.error_kind == PROGRAM_ERROR:
        name = (record.error or "").split(":", 1)[0].strip()
        return f"program error ({name})" if name.isidentifier() else "program error"
    if record.error_kind == METRIC_ERROR:
        return "metric error"
    return "partial score" if record.score > 0 else "wrong output"


def _short(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float, str)) and len(str(value)) <= SHORT_OUTPUT:
        return str(value).strip()
    return None


def label_pairs(record: ExampleResult) -> str | None:
    """``field: 'expected' -> 'produced'`` for each expected field whose value and output are short and differ; None
    for a record whose program or metric raised (its kind says what went wrong)."""
    if record.error:
        return None
    pairs = []
    for name in sorted(record.expected):
        expected = _short(record.expected[name])
        produced = _short(record.predicted[name]) if name in record.predicted else "(missing)"
        if expected is not None and produced is not None and expected.casefold() != produced.casefold():
            pairs.append(f"{name}: {expected!r} -> {produced!r}")
    return "; ".join(pairs) or None


def expected_labels(record: ExampleResult) -> tuple[tuple[str, str], ...] | None:
    """The example's short expected values, the kind a passing example shares with a failure; None when none is."""
    labels = tuple((n, v) for n in sorted(record.expected) if (v := _short(record.expected[n])) is not None)
    return labels or None


@dataclass(frozen=True)
class Failure:
    """One failing record and what code sees of it."""

    record: ExampleResult
    step: str | None
    kind: str
    labels: str | None

    @property
    def example_id(self) -> int:
        return self.record.example_id

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.step or "", self.kind, self.labels or "")

    @property
    def code_name(self) -> str:
        return f"{self.step or 'no step ran'}: {self.kind}" + (f", {self.labels}" if self.labels else "")


def failures_of(records: Iterable[ExampleResult], order: Sequence[str], step: str | None) -> list[Failure]:
    """The failures among ``records`` (an LM call that failed without an answer says nothing about instructions and
    is left out), in id order; with ``step``, those where it ran or that point at it (it raised)."""
    found = []
    for record in sorted(records, key=lambda r: r.example_id):
        if record.passed or record.error_kind == LM_CALL_ERROR:
            continue
        failure = Failure(record, failure_step(record, order), failure_kind(record), label_pairs(record))
        if step is None or failure.step == step or any(s.step_name == step for s in record.steps):
            found.append(failure)
    return found


def make_group(
    name: str, cause: str, members: Sequence[Failure], passing: Sequence[ExampleResult], analysis_id: str
) -> FailureGroup:
    """A group of ``members`` with its code-visible facts, and the passing records of the same kind as contrast."""
    steps = Counter(f.step for f in members)
    kinds = Counter(f.kind for f in members)
    labels = Counter(f.labels for f in members if f.labels)
    kinds_of = {expected_labels(f.record) for f in members} - {None}
    contrast = [r.example_id for r in passing if expected_labels(r) in kinds_of][:MAX_CONTRAST]
    step = steps.most_common(1)[0][0] if steps else None
    return FailureGroup(
        name=name,
        cause=cause,
        example_ids=tuple(sorted(f.example_id for f in members)),
        step=step,
        kind=kinds.most_common(1)[0][0] if kinds else "",
        labels=tuple(labels.most_common()),
        contrast_ids=tuple(contrast),
        analysis_id=analysis_id,
        step_ran=sum(1 for f in members if reflects_on(f.record, step)),
    )


def largest_first(groups: Iterable[FailureGroup]) -> tuple[FailureGroup, ...]:
    return tuple(sorted(groups, key=lambda g: (-g.count, g.example_ids[0] if g.example_ids else 0)))


def code_groups(
    failures: Sequence[Failure], passing: Sequence[ExampleResult], analysis_id: str, causes: Mapping[int, str]
) -> tuple[FailureGroup, ...]:
    """The failures grouped by what code sees (step, kind, label pair); each group's cause is the code's description,
    with the causes the sub-LM named for its failures when there are any."""
    by_key: dict[tuple[str, str, str], list[Failure]] = {}
    for failure in failures:
        by_key.setdefault(failure.key, []).append(failure)
    groups = []
    for members in by_key.values():
        named = Counter(causes[f.example_id] for f in members if f.example_id in causes)
        cause = members[0].code_name
        if named:
            top, n = named.most_common(1)[0]
            cause += f"; named cause{'s' if len(named) > 1 else ''}: {top}" + (
                f" (and {len(named) - 1} other)" if len(named) > 1 else ""
            )
        groups.append(make_group(members[0].code_name, cause, members, passing, analysis_id))
    return largest_first(groups)


def spread_sample(failures: Sequence[Failure], most: int) -> list[Failure]:
    """At most ``most`` failures, taken in turn from each code group (largest first), so every kind is asked about."""
    if len(failures) <= most:
        return list(failures)
    by_key: dict[tuple[str, str, str], list[Failure]] = {}
    for failure in failures:
        by_key.setdefault(failure.key, []).append(failure)
    queues = sorted(by_key.values(), key=len, reverse=True)
    taken: list[Failure] = []
    while len(taken) < most:
        for queue in queues:
            if queue and len(taken) < most:
                taken.append(queue.pop(0))
    return sorted(taken, key=lambda f: f.example_id)


# -- what the sub-LM is shown -----------------------------------------------------------------------------------
def _value(value: Any) -> str:
    return clip(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str), MAX_VALUE_CHARS)


def render_failure(failure: Failure, step: str | None) -> str:
    """One failure as the sub-LM reads it: inputs, expected, produced, score, feedback, error, the steps' calls
    (only ``step``'s last call when one is given) and the call that raised the error, with its inputs."""
    record = failure.record
    lines = [
        f"[failure {record.example_id}]",
        f"inputs: {_value(record.inputs)}",
        f"expected: {_value(record.expected)}",
        f"produced: {_value(record.predicted)}",
        f"score: {record.score:g}",
    ]
    if record.feedback:
        lines.append(f"metric feedback: {clip(record.feedback, MAX_VALUE_CHARS)}")
    if record.error:
        lines.append(f"error: {clip(record.error, MAX_VALUE_CHARS)}")
    calls = [s for s in record.steps if step is None or s.step_name == step]
    if step is not None:
        calls = calls[-1:]
    for call in calls:
        lines.append(f"step {call.step_name}: inputs {_value(call.inputs)} -> outputs {_value(call.outputs)}")
        if call.feedback and call.feedback != record.feedback:  # the metric's own words for this step (pred_name)
            lines.append(f"metric feedback for {call.step_name}: {clip(call.feedback, MAX_VALUE_CHARS)}")
    failed = record.failed_call
    if failed is not None and (step is None or failed.step_name == step):  # the call the error came from
        lines.append(f"step {failed.step_name} raised the error: inputs {_value(failed.inputs)}")
    return clip_block("\n".join(lines), MAX_FAILURE_CHARS)


def render_passing(record: ExampleResult) -> str:
    return clip_block(
        f"[passed {record.example_id}]\ninputs: {_value(record.inputs)}\nexpected and produced: {_value(record.expected)}",
        MAX_FAILURE_CHARS // 2,
    )


def clip_block(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 4] + " ..."


def contrast_for(batch: Sequence[Failure], passing: Sequence[ExampleResult], most: int = 2) -> list[ExampleResult]:
    """Up to ``most`` passing records of the kind of the batch's failures (the same short expected values)."""
    kinds = {expected_labels(f.record) for f in batch} - {None}
    return [r for r in passing if expected_labels(r) in kinds][:most]


# -- the check of what the sub-LM answered ----------------------------------------------------------------------
def checked_causes(
    answer: Any, asked: Sequence[Failure], shared: frozenset[str] = frozenset()
) -> tuple[dict[int, str], list[int]]:
    """The causes of an answer for the failures ``asked`` only (unknown ids dropped, the first cause of an id kept,
    empty causes dropped), and the ids whose cause was dropped as a copy of the failure's own inputs
    (:func:`copies_inputs`, the input fields in ``shared`` left out): such a failure is left to the code groups."""
    by_id = {f.example_id: f for f in asked}
    causes: dict[int, str] = {}
    copied: list[int] = []
    for item in answer or ():
        cause = clip(getattr(item, "cause", "") or "", 300)
        failure_id = getattr(item, "failure_id", None)
        if failure_id not in by_id or failure_id in causes or failure_id in copied or not cause:
            continue
        if copies_inputs(cause, by_id[failure_id].record.inputs, shared):
            copied.append(failure_id)
        else:
            causes[failure_id] = cause
    return causes, copied


def shared_inputs(records: Sequence[ExampleResult]) -> frozenset[str]:
    """The input fields whose value is the same in every one of ``records`` (two or more): a policy or a context
    every example carries. Quoting one of its rules names a cause, it does not copy the example."""
    if len(records) < 2 or not all(isinstance(r.inputs, dict) for r in records):
        return frozenset()
    first = records[0].inputs
    return frozenset(k for k, v in first.items() if all(k in r.inputs and r.inputs[k] == v for r in records[1:]))


def copies_inputs(cause: str, inputs: Any, shared: frozenset[str] = frozenset()) -> bool:
    """Whether a named cause restates its example instead of naming a rule: a run of at least :data:`COPIED_WORDS`
    words taken verbatim from the example's own inputs (the fields in ``shared``, which every example carries, left
    out) makes up two thirds of it or more. A rule that quotes a few words of the example ("tickets that say
    'charged twice' go to billing") is kept."""
    said = _words(cause)
    if len(said) < COPIED_WORDS:
        return False
    own = {k: v for k, v in inputs.items() if k not in shared} if isinstance(inputs, dict) else inputs
    source = _words("\n".join(_texts(own)))
    run = SequenceMatcher(None, said, source, autojunk=False).find_longest_match(0, len(said), 0, len(source)).size
    return run >= COPIED_WORDS and 3 * run >= 2 * len(said)


def _texts(value: Any) -> list[str]:
    """The text of every value in ``value`` (nested dicts and lists included), keys left out."""
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _texts(v)]
    return [value if isinstance(value, str) else str(value)]


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.casefold())


def checked_merge(answer: Any, ids: Sequence[int]) -> tuple[list[tuple[str, str, list[int]]], list[int], list[str]]:
    """The sub-LM's groups checked against ``ids``: each id kept in the first group that names it, unknown ids and
    empty groups dropped, a repeated name made unique. Returns (groups as (name, cause, ids), the ids no group
    placed, what was dropped)."""
    wanted, placed = set(ids), set()
    groups: list[tuple[str, str, list[int]]] = []
    dropped: list[str] = []
    names: Counter[str] = Counter()
    for item in answer or ():
        members = []
        for i in getattr(item, "failure_ids", None) or ():
            if i not in wanted:
                dropped.append(f"unknown id {i}")
            elif i in placed:
                dropped.append(f"id {i} placed twice")
            else:
                members.append(i)
                placed.add(i)
        name = clip(getattr(item, "name", "") or "", 80) or f"group {len(groups) + 1}"
        if not members:
            continue
        names[name.casefold()] += 1
        if names[name.casefold()] > 1:
            name = f"{name} ({names[name.casefold()]})"
        groups.append((name, clip(getattr(item, "cause", "") or "", 300) or name, members))  # (blank: its name)
    return groups, [i for i in ids if i not in placed], dropped
