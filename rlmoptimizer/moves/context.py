"""What every move works over: the runs, an evaluate function, the ledger and the current instructions; the
checks and refusals the moves share.

May import: dspy, ``rlmoptimizer.evaluation``, ``.budget``, ``.errors``, ``.events``, ``.fingerprint``, ``.records``,
``.student``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import dspy

from rlmoptimizer.budget import BudgetLedger
from rlmoptimizer.errors import agent_error as refuse  # the one format of a refusal
from rlmoptimizer.events import SubLMAnswered
from rlmoptimizer.fingerprint import canonical_json, demos_step, instructions_digest, parse_demos, text_limit
from rlmoptimizer.records import EvalRun, ExampleResult
from rlmoptimizer.student import example_inputs

MAX_ROLLOUTS = 10
"""The most samples per example one call may ask for."""
MAX_PROPOSALS = 8
"""The most candidate instructions one ``propose_instructions`` call may ask for."""
MAX_REFLECTION_EXAMPLES = 5
"""How many failures a proposal reflects on when no ids are given: a different sample each call, as GEPA takes a
new minibatch of 3 each iteration (on the real-model benchmark a 1.5B proposer wrote policy rules from GEPA's 3
examples and only generic text from 10)."""


class RunAccess(Protocol):
    splits: dict[str, list]

    def get(self, run_id: str) -> EvalRun: ...

    def all(self) -> list[EvalRun]: ...

    def stored(
        self, instructions: dict[str, str], split: str, ids: Sequence[int], rollout: int = 0
    ) -> dict[int, ExampleResult]: ...


EvaluateFn = Callable[..., EvalRun]
"""``evaluate(instructions, split, ids, *, rollout, label, reservation) -> EvalRun``."""


@dataclass(frozen=True)
class Source:
    """Train records a move reads (a proposal reflects on, an analysis groups): ``label`` says where they come from
    (``run run-0003``, or the current instructions' train records), ``run_id`` is that run (None for the current
    instructions' records), ``instructions`` what the records were made with. Train only, always."""

    label: str
    records: dict[int, ExampleResult]
    run_id: str | None
    instructions: dict[str, str]


def example_fields(example: Any) -> dict[str, Any]:
    """An example's fields (a ``dspy.Example``'s items), or none for anything else."""
    return dict(example.items()) if callable(getattr(example, "items", None)) else {}


@dataclass
class DemoIndex:
    """Train ids by what a demo may show of them: an example's inputs (per set of input names, by their values),
    and a step call's inputs and outputs (by their content, without dspy's ``augmented`` mark)."""

    inputs: dict[frozenset[str], dict[str, set[int]]] = field(default_factory=dict)
    calls: dict[str, set[int]] = field(default_factory=dict)

    def add_example(self, inputs: dict[str, Any], example_id: int) -> None:
        self.inputs.setdefault(frozenset(inputs), {}).setdefault(canonical_json(inputs), set()).add(example_id)

    def add_call(self, fields: dict[str, Any], example_id: int) -> None:
        self.calls.setdefault(_call_key(fields), set()).add(example_id)

    def train_ids(self, demo: dict[str, Any]) -> set[int]:
        """The train examples ``demo`` shows answered: the one whose inputs it holds (with an answer of its own,
        the reasoning a teacher wrote, dspy's ``augmented`` mark: ``dspy.BootstrapFewShot``'s demos of a first
        step), or the one a step call of which it is (a later step's inputs can be alike across examples: only the
        whole call says which example it was)."""
        found = set(self.calls.get(_call_key(demo), ()))
        for names, by_value in self.inputs.items():
            if names and names <= demo.keys():
                found |= by_value.get(canonical_json({k: demo[k] for k in names}), set())
        return found


def _call_key(fields: dict[str, Any]) -> str:
    return canonical_json({k: v for k, v in fields.items() if not (k == "augmented" and v is True)})


def whole_validation(tool: str, how: str, *selection: Any) -> None:
    """Validation always runs on the whole split: a selection on it (any of ``selection`` given) is refused;
    ``how`` says the call without one. The one statement of the rule, for every tool that takes a split."""
    if any(v is not None for v in selection):
        raise refuse(f"{tool}: validation always runs on the whole split and takes no selection", how)


SPENT_FIX = "the budget is spent: SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"
"""What every move refused for lack of budget says to do when nothing of the budget is left."""


def exhausted(ledger: BudgetLedger) -> bool:
    """Whether nothing more can be paid: every unit spent or reserved, or the spending cap reached."""
    return ledger.left == 0 or bool(ledger.stop_reason)


def budget_spent(tool: str, ledger: BudgetLedger) -> Exception:
    """The refusal of ``tool`` when :func:`exhausted`: say why nothing can be paid, and to SUBMIT."""
    why = ledger.stop_reason or f"no budget unit is left (limit {ledger.limit}, spent {ledger.spent})"
    return refuse(f"{tool}: {why}", SPENT_FIX)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


class MoveContext:
    """The state the moves share: the runs, an evaluate function, the ledger, the current instructions."""

    def __init__(
        self,
        *,
        runs: RunAccess,
        evaluate: EvaluateFn,
        ledger: BudgetLedger,
        step_names: Sequence[str],
        current: Callable[[], dict[str, str]],
        check_map: Callable[[Any], dict[str, str]] | None = None,
        proposal_lm: dspy.BaseLM | Callable[[], dspy.BaseLM | None] | None = None,
        pass_threshold: float = 1.0,
        initial: dict[str, str] | None = None,
    ) -> None:
        self.runs = runs
        self._evaluate = evaluate
        self.ledger = ledger
        self.step_names = list(step_names)
        self._current = current
        self._check_map = check_map
        self._proposal_lm = proposal_lm
        self._initial = dict(initial or {})  # the unchanged program's texts: how long a step's may grow
        # Every proposal of this compile() by id ('proposal-1', ...): a candidate the other moves accept by name.
        self.proposals: dict[str, dict[str, str]] = {}
        self._naming = threading.Lock()  # one id per candidate when moves run in parallel threads
        self.proposal_calls = 0  # proposal LM calls made, each with its own rollout id
        self.kept_proposals: Any = None  # the proposal LM's answers in the run directory, opened on first use
        # How each named candidate came to be: {'parents': [ids], 'move': ..., ...}, for the agent and the report.
        self.lineage: dict[str, dict[str, Any]] = {}
        self.silent_sub_lm: BaseException | None = None  # a move that returned although its sub LM never answered
        self.gepa_candidates = 0  # 'gepa-N' ids given so far
        self.gepa_runs = 0
        self.replaying_gepa: set[str] = set()  # GEPA runs the turn a resume replays had started (run again, free)
        self.gepa_hooks: Any = None  # what GEPA runs need of the compile (moves.gepa.GepaHooks); None: nothing
        self.perfect_score = pass_threshold  # an example passes at this score: gepa skips a minibatch all passed
        self._demo_index: tuple[int, DemoIndex] = (-1, DemoIndex())  # (runs indexed, train ids by what they showed)

    def _answered(self) -> None:
        """A sub-LM call of a move was answered and charged: :class:`~rlmoptimizer.events.SubLMAnswered` to the
        runs' observer, whose journal puts the ledger on disk now (not only when the turn ends)."""
        observer = getattr(self.runs, "observer", None)
        if observer is not None:
            observer.on_event(SubLMAnswered(1, self.ledger.snapshot()))

    def _lm(self) -> dspy.BaseLM:
        lm = (
            self._proposal_lm()
            if callable(self._proposal_lm) and not isinstance(self._proposal_lm, dspy.BaseLM)
            else self._proposal_lm
        )
        lm = lm or dspy.settings.lm
        if lm is None:
            raise refuse("no LM to write proposals with", "pass sub_lm=dspy.LM(...) to the optimizer")
        return lm

    def too_long(self, step: str, text: str) -> str | None:
        """Why the sub-LM's ``text`` for ``step`` is refused for its length (:func:`text_limit`), or None: each call
        of the step would send it, and every evaluation would pay for it."""
        most = text_limit(self._initial.get(step))
        if len(text) <= most:
            return None
        return f"an instruction of {len(text):,} characters, more than the {most:,} a step may have"

    # -- helpers --------------------------------------------------------------------------------------
    def _check_step(self, step: Any, tool: str) -> None:
        if not isinstance(step, str) or step not in self.step_names:
            raise refuse(f"{tool}: unknown step name {step!r}", f"use one of {self.step_names}")

    def get_run(self, run_id: Any) -> EvalRun:
        """The run ``run_id``, or a refusal naming the runs there are."""
        try:
            return self.runs.get(str(run_id))
        except KeyError:
            known = [run.run_id for run in self.runs.all()]
            raise refuse(f"no run with id {run_id!r}", f"use one of {known}") from None

    def _train_run(self, run_id: Any, tool: str) -> EvalRun:
        run = self.get_run(run_id)
        if run.split != "train":
            raise refuse(
                f"{tool}: run {run.run_id} is a {run.split} run",
                "pass a train run id (validation examples are not shown)",
            )
        return run

    def _source(self, run_id: Any, tool: str) -> Source:
        """Where a move's train records come from: the given train run; by default every first-rollout train
        record of the current instructions (the latest per example), else the latest train run."""
        if run_id is not None:
            run = self._train_run(run_id, tool)
            return Source(
                f"run {run.run_id}", {r.example_id: r for r in run.records}, run.run_id, dict(run.instructions)
            )
        train = [run for run in self.runs.all() if run.split == "train" and run.records]
        if not train:
            raise refuse(f"{tool}: no train run yet", "call evaluate_program() first")
        current = self._current()
        digest = instructions_digest(current)
        if any(run.rollout == 0 and instructions_digest(run.instructions) == digest for run in train):
            return Source("the current instructions' train records", self._records_of(digest), None, dict(current))
        last = train[-1]
        return Source(
            f"run {last.run_id}", {r.example_id: r for r in last.records}, last.run_id, dict(last.instructions)
        )

    def _records_of(self, digest: str) -> dict[int, ExampleResult]:
        """Every first-rollout train record of the instructions of ``digest`` (the latest per example), in id order;
        records of an LM call that failed without an answer are left out."""
        mine = [
            run
            for run in self.runs.all()
            if run.split == "train" and run.rollout == 0 and instructions_digest(run.instructions) == digest
        ]
        merged = {r.example_id: r for run in mine for r in run.records if r.reusable}
        return dict(sorted(merged.items()))

    def name_of(self, instructions: dict[str, str]) -> str:
        """The first candidate id whose instructions are ``instructions``, else 'current' when they are the current
        ones, else 'unnamed'."""
        full = {**self._current(), **instructions}
        for name, mapping in list(self.proposals.items()):  # (a snapshot: another thread may add one)
            if {**self._current(), **mapping} == full:
                return name
        return "current" if full == self._current() else "unnamed"

    def instructions_of(self, candidate: Any) -> dict[str, str]:
        """The full {step: text} map a candidate names ('current', a run id, a proposal id or a {step: text}
        dict merged over the current instructions); :class:`AgentToolError` for anything else."""
        return self._resolve(candidate, None)[1]

    def _resolve(self, candidate: Any, index: int | None) -> tuple[str, dict[str, str]]:
        what = "the candidate" if index is None else f"candidate {index}"
        current = self._current()
        if isinstance(candidate, str):
            if candidate == "current":
                return "current", current
            if candidate.startswith("run-"):
                run = self.get_run(candidate)
                return candidate, dict(run.instructions)
            if candidate in self.proposals:
                return candidate, {**current, **self.proposals[candidate]}
            if candidate.startswith(("proposal-", "gepa-", "demos-")):
                known = list(self.proposals) or "none yet (call propose_instructions, propose_demos or run_gepa first)"
                raise refuse(
                    f"{what}: no candidate with id {candidate!r}",
                    f"use an id propose_instructions, propose_demos or run_gepa returned: {known}",
                )
        if isinstance(candidate, dict):
            if not candidate:
                raise refuse(f"{what} is an empty dict", "give at least one {step: text} entry, or 'current'")
            checked = self._check_map(candidate) if self._check_map is not None else dict(candidate)
            return "map", {**current, **checked}
        raise refuse(
            f"{what} is {type(candidate).__name__} {candidate!r:.80}",
            "each candidate is 'current', a run id like 'run-0003', a candidate id like 'proposal-1' or 'gepa-2', or a "
            "{step: text} dict",
        )

    def _example_ids(self, split: str, ids: list[int] | None, tool: str) -> list[int]:
        """The examples of ``split`` a move runs on: ``ids`` (parsed and range-checked by the tool that took them,
        :func:`rlmoptimizer.agent.tools.select_ids`), all when None. Validation always runs whole."""
        if split not in self.runs.splits:
            raise refuse(f"{tool}: unknown split {split!r}", f"use one of {sorted(self.runs.splits)}")
        size = len(self.runs.splits[split])
        if split == "val":
            whole_validation(tool, f"call {tool}(..., split='val') without ids, limit or sample", ids)
            return list(range(size))
        selected = list(range(size)) if ids is None else list(dict.fromkeys(ids))  # parsed by the tools, once
        if not selected:
            raise refuse(f"{tool}: the selection is empty", "select at least one example (ids=..., limit=N)")
        return selected

    @staticmethod
    def _check_rollouts(rollouts: Any, split: str) -> int:
        if isinstance(rollouts, bool) or not isinstance(rollouts, int) or not 1 <= rollouts <= MAX_ROLLOUTS:
            raise refuse(
                f"rollouts must be an int from 1 to {MAX_ROLLOUTS}, got {rollouts!r}", "pass rollouts=3 for example"
            )
        if split == "val" and rollouts != 1:
            raise refuse(
                "validation takes one sample per example (it is the checkpoint the final program is chosen by)",
                "use rollouts on split='train'; call validation with rollouts=1",
            )
        return rollouts

    def _in_validation(self) -> frozenset[int]:
        """The train ids whose inputs are a validation example's inputs (the splits are fixed: worked out once): never
        a demo, nor evidence a confirmation counts. Inputs, not every field: a copy that differs in a label or in
        metadata still shows the program a validation example."""
        found = getattr(self, "_train_in_val", None)
        if found is None:
            val = {canonical_json(example_inputs(example)) for example in self.runs.splits.get("val", ())}
            train = self.runs.splits["train"]
            found = frozenset(i for i, ex in enumerate(train) if canonical_json(example_inputs(ex)) in val)
            self._train_in_val = found
        return found

    def demo_sources(self, instructions: dict[str, str]) -> set[int]:
        """The train ids whose inputs (or a step call's) a demo in ``instructions`` shows: an example a candidate
        sees as a demo is no evidence for it. Read from the data, so demos kept from an earlier process or written
        by hand count too."""
        demos = [d for ds in self._demos_by_step(instructions).values() for d in ds]
        if not demos:
            return set()
        index = self._demos_index()
        return {i for demo in demos for i in index.train_ids(demo)}

    def demo_train_ids(self, instructions: dict[str, str]) -> dict[str, list[int | None]]:
        """Per step with demos in ``instructions``, the train example each demo was taken from, in the demos' order
        (the lowest id when several match; None for a demo no train example or call holds)."""
        by_step = self._demos_by_step(instructions)
        index = self._demos_index() if by_step else DemoIndex()
        return {step: [min(index.train_ids(d), default=None) for d in demos] for step, demos in by_step.items()}

    @staticmethod
    def _demos_by_step(instructions: dict[str, str]) -> dict[str, list[dict]]:
        """Each step's demos in ``instructions`` (parsed once), for the steps that have some."""
        parsed = {demos_step(key): parse_demos(key, text) for key, text in instructions.items() if demos_step(key)}
        return {step: demos for step, demos in parsed.items() if demos}

    def _demos_index(self) -> DemoIndex:
        """The train examples' inputs and every train call (:class:`DemoIndex`), rebuilt when runs were added."""
        runs = self.runs.all()
        if self._demo_index[0] != len(runs):
            index = DemoIndex()
            for i, example in enumerate(self.runs.splits.get("train", [])):
                index.add_example(example_inputs(example), i)
            for run in runs:
                for record in run.records if run.split == "train" else ():
                    for call in record.steps:
                        index.add_call({**call.inputs, **call.outputs}, record.example_id)
            self._demo_index = (len(runs), index)
        return self._demo_index[1]
