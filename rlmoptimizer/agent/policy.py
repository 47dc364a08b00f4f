"""The default policy: the optimization loop as code, a pure function from the loop's state to its next action.

The loop, in the order it plays out::

    run GEPA (the gepa package's engine) with most of the budget -> adopt its best and check it on validation ->
    (what GEPA leaves too little for a targeted round, or for a comparison worth making: one last proposal, for
    the analysis' largest group when there is one, adopted and checked on validation) ->
    analyse every train failure of the current instructions (grouped by cause; the train examples they were not
    evaluated on first, when a round still pays after them) -> propose for the largest group ->
    compare against the current instructions on the group's examples and a sample of others -> adopt a clear
    winner and check it on validation -> demos from the program's own successes, compared the same way (once) ->
    the next group, then round robin over the steps -> ... -> a lead over the unchanged program on validation that
    is not clear: confirmed on fresh train examples -> submit when nothing can be paid
    (an adoption changes what fails: the analysis is made again for the new instructions)

:class:`LoopState` holds everything the choice depends on: what the moves reported (:class:`LoopMemory`, folded
from the typed outcomes below by :func:`fold`) and what the budget and the train runs say now
(:class:`BudgetView`). :func:`next_action` returns a typed action (:class:`RunGepa`, :class:`Adopt`, ...); the
pilot (``pilot.py``) runs it through the same tools the agent calls, and the tools report each outcome. Nothing
here reads text, calls an LM or touches the sandbox: every branch is tested by value.

Budget rules the policy keeps:

- The units one check of the submission needs (the whole validation split, or train without one) are never
  spent on moves, so what gets adopted can still be checked.
- GEPA gets everything unless what is left after it pays one targeted round (:data:`TARGETED_SHARE`).
- A comparison takes at most a third of what the moves may spend (:data:`PROPOSALS_PER_BUDGET`), down to
  :data:`MIN_CHECK` examples, so a small budget still buys several proposals, as GEPA's minibatches do.
- A proposal learns from failures: when the current instructions fail no train example evaluated with them, the
  unseen train examples are evaluated first, and the loop submits once they pass every one.

May import: nothing of the package (it is pure).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

PROPOSALS_PER_BUDGET = 3
"""A comparison takes at most this share of what the moves may spend (down to :data:`MIN_CHECK` examples)."""
MIN_CHECK = 3
"""The fewest examples a comparison is cut to (GEPA's default minibatch)."""
MIN_USEFUL_BUDGET = 3
"""Below this many units to spend (beyond one validation check), a proposal and its comparison cannot both be
paid: only the last draw is left, or submitting."""
MIN_ROUND = 3 * MIN_CHECK
"""Below this many units to spend (beyond one validation check) after GEPA, a comparison on train would take so few
examples that a clear gain (3 net wins) could hardly show: the first proposal after GEPA (for the analysis' largest
group, when there is one) is checked on validation at once instead (the last draw)."""
TARGETED_SHARE = 5
"""After GEPA, the targeted rounds get a fifth of what is left, when that pays a whole round (a proposal, a
comparison on :data:`MIN_CHECK` examples against the current instructions, and a validation check)."""

DEMOS = "(demos)"
"""What a :class:`Proposed` outcome of ``propose_demos`` names as its step (demos are proposed for every step)."""

GEPA, TARGETED, END = "gepa", "targeted", "end"
"""The phases of the loop. The pilot's ``next_phase()`` runs one phase: the actions after the first one that belong
to the same phase (or end the run) ask for no decision of the agent's."""


# -- the actions --------------------------------------------------------------------------------------------
class _Action:
    """An action: its ``phase`` and its ``call``, the tool calls that take it, written as the agent would."""

    phase: str = TARGETED
    template: str = ""

    @property
    def call(self) -> str:
        def text(value):
            if isinstance(value, tuple):
                return ",".join(map(str, value)) if all(isinstance(v, int) for v in value) else repr(list(value))[1:-1]
            return repr(value) if isinstance(value, str) else value

        return self.template.format(**{name: text(value) for name, value in vars(self).items()})


@dataclass(frozen=True)
class RunGepa(_Action):
    """Run GEPA on every step with ``budget`` units."""

    budget: int
    phase = GEPA
    template = "run_gepa(budget={budget})"


@dataclass(frozen=True)
class Adopt(_Action):
    """Make ``candidate`` the current instructions; then check them on validation when ``check``."""

    candidate: str
    check: bool

    @property
    def phase(self) -> str:
        return GEPA if self.candidate.startswith("gepa-") else TARGETED

    @property
    def template(self) -> str:
        return "adopt_candidate({candidate})" + ("; evaluate_program(split='val')" if self.check else "")


@dataclass(frozen=True)
class CheckValidation(_Action):
    """Evaluate the current instructions on validation (they changed since the last check)."""

    template = "evaluate_program(split='val')"


@dataclass(frozen=True)
class Analyze(_Action):
    """Group every train failure of the current instructions by cause (the sub-LM names one per failure)."""

    template = "analyze_failures()"


@dataclass(frozen=True)
class Propose(_Action):
    """Ask the sub LM for new instructions for ``step``, from what the current instructions fail; with ``group``
    (``(analysis id, group name)``), from that group of an analysis: its causes and a few of its failures."""

    step: str
    group: tuple[str, str] | None = None

    @property
    def call(self) -> str:
        if self.group is None:
            return f"propose_instructions({self.step!r})"
        return (
            f"propose_instructions({self.step!r}, group={{'analysis': {self.group[0]!r}, 'name': {self.group[1]!r}}})"
        )


@dataclass(frozen=True)
class ProposeDemos(_Action):
    """A candidate with demos for every step from the train examples the current instructions pass."""

    template = "propose_demos()"


@dataclass(frozen=True)
class Compare(_Action):
    """Compare the current instructions with ``candidates`` on the train examples ``ids``."""

    candidates: tuple[str, ...]
    ids: tuple[int, ...]
    template = "compare(['current', {candidates}], ids='{ids}')"


@dataclass(frozen=True)
class CompareValidation(_Action):
    """Compare ``candidate``, ahead of the current instructions on train but not clearly, with them on validation:
    adopted only when its gain there is clear."""

    candidate: str
    template = "compare(['current', {candidate}], split='val')"


@dataclass(frozen=True)
class EvaluateTrain(_Action):
    """Evaluate the current instructions on the train examples ``ids`` (to find failures to learn from)."""

    ids: tuple[int, ...]
    template = "evaluate_program(ids='{ids}')"


@dataclass(frozen=True)
class LastDraw(_Action):
    """What GEPA leaves pays one validation check but no comparison worth making: one proposal for ``step`` (for
    ``group`` of an analysis, when given), adopted and checked on validation at once (the selection returns the
    better of the two checked programs, on a clear gain)."""

    step: str
    group: tuple[str, str] | None = None

    @property
    def phase(self) -> str:
        return GEPA if self.group is None else TARGETED

    @property
    def call(self) -> str:
        group = "" if self.group is None else f", group={{'analysis': {self.group[0]!r}, 'name': {self.group[1]!r}}}"
        return (
            f"p = propose_instructions({self.step!r}{group}); adopt_candidate(p['candidate_ids'][0]); "
            "evaluate_program(split='val')"
        )


@dataclass(frozen=True)
class Confirm(_Action):
    """Before the run ends: the current instructions lead the unchanged program on validation, but not clearly;
    evaluate both on fresh train examples with what is left, which the final selection counts beside validation."""

    phase = END
    template = "confirm_gain()"


@dataclass(frozen=True)
class Submit(_Action):
    """End the run with the current instructions; ``why`` nothing else is worth paying for."""

    why: str
    phase = END
    template = "SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"


Action = (
    RunGepa
    | Adopt
    | CheckValidation
    | Analyze
    | Propose
    | ProposeDemos
    | Compare
    | CompareValidation
    | EvaluateTrain
    | LastDraw
    | Confirm
    | Submit
)


# -- what the moves report ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class GepaFinished:
    """A GEPA run ended; ``best_new`` is its best candidate when that is not where it started."""

    best_new: str | None


@dataclass(frozen=True)
class Proposed:
    """A proposal for ``step``: ``candidate_ids`` to compare on ``check_ids``, of which ``failure_ids`` failed; no
    candidate when it only repeated instructions already tried, or the sub LM gave no usable instructions."""

    step: str
    candidate_ids: tuple[str, ...]
    check_ids: tuple[int, ...]
    failure_ids: tuple[int, ...] = ()
    group: tuple[str, str] | None = None  # (analysis id, group name) it was written for


@dataclass(frozen=True)
class Analyzed:
    """An analysis of the current instructions' train failures: its ``groups`` as ``(analysis id, name, step)``,
    largest first (none when it found or could pay for none)."""

    groups: tuple[tuple[str, str, str | None], ...] = ()


@dataclass(frozen=True)
class Compared:
    """A comparison of ``sources`` (``"current"``, candidate ids, ...) on ``split``; ``best`` is the index of the
    candidate clearly better than the first (0: none); ``ahead``, when none is, the index of the best one that won
    more examples than it lost (0: none)."""

    sources: tuple[str, ...]
    best: int
    split: str
    ahead: int = 0


@dataclass(frozen=True)
class Adopted:
    """``candidate`` (an id, or None for a dict of instructions) was adopted; ``changed``: the instructions changed."""

    candidate: str | None
    changed: bool


@dataclass(frozen=True)
class PromptEdited:
    """The agent changed instructions itself (``update_prompt``)."""


@dataclass(frozen=True)
class Validated:
    """The current instructions were evaluated on the whole validation split."""


Outcome = GepaFinished | Analyzed | Proposed | Compared | Adopted | PromptEdited | Validated


# -- the state ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pending:
    """A proposal not compared yet: its candidates and the order to check them in (failures and others in turn)."""

    step: str
    candidate_ids: tuple[str, ...]
    check_ids: tuple[int, ...]


@dataclass(frozen=True)
class LoopMemory:
    """What the moves reported so far, as the policy needs it."""

    steps: tuple[str, ...]
    proposed: Mapping[str, int] = field(default_factory=dict)
    pending: Pending | None = None
    winner: str | None = None  # a candidate that beat the current instructions (or GEPA's best), not yet adopted
    winner_on_val: bool = False  # the winner is scored on all of validation already (its check is free)
    trial: str | None = None  # a candidate ahead of the current instructions on train, not clearly: check it further
    trials: tuple[str, ...] = ()  # the candidates checked further already (once each)
    unchecked: bool = False  # the current instructions changed since the last validation run
    gepa_ran: bool = False
    proposals_at_gepa_end: int = 0  # proposals made when the last GEPA run ended
    demos_tried: bool = False  # a demos candidate was proposed
    repeats: int = 0  # proposals in a row that gave nothing new to compare (instructions already tried, no answer)
    analyzed: bool = False  # the current instructions' failures were analysed (or could not be)
    groups: tuple[tuple[str, str, str | None], ...] = ()  # that analysis's groups not proposed for yet

    @classmethod
    def start(cls, steps: Sequence[str]) -> LoopMemory:
        return cls(steps=tuple(steps), proposed=dict.fromkeys(steps, 0))

    @property
    def proposals(self) -> int:
        return sum(n for step, n in self.proposed.items() if step != DEMOS)


@dataclass(frozen=True)
class BudgetView:
    """What the budget and the train runs say now. ``reserve``: the units one check of the submission needs;
    ``proposal_units``: what one proposal costs of ``left`` (0 when sub-LM prompts have an allowance of their own);
    ``unevaluated``: train ids the current instructions were not evaluated on; ``failing``: how many evaluated
    ones fail."""

    left: int
    val_size: int = 0
    reserve: int = 0
    proposals_left: int = 0
    proposal_units: int = 1
    unevaluated: tuple[int, ...] = ()
    failing: int = 1
    demos: bool = False  # demos may be proposed (the compile's max_demos > 0) and train has passing examples
    train_size: int = 0
    analysis_prompts: int = 0  # the sub-LM prompts an analysis of the failing train examples costs at most (0: none)
    confirmable: int = 0  # the current instructions lead the unchanged program on validation without a clear gain:
    # the fresh train examples the budget pays to confirm it (0: nothing to confirm, or nothing paid)
    unfinished_gepa: int | None = None  # the budget of a GEPA run an earlier process was killed in (replayed with it)


@dataclass(frozen=True)
class LoopState:
    memory: LoopMemory
    budget: BudgetView


def fold(memory: LoopMemory, outcome: Outcome) -> LoopMemory:
    """``memory`` after ``outcome``."""
    if isinstance(outcome, GepaFinished):
        return replace(
            memory,
            gepa_ran=True,
            proposals_at_gepa_end=memory.proposals,
            pending=None,
            winner=outcome.best_new,
            winner_on_val=True,  # GEPA scored its best on validation
        )
    if isinstance(outcome, Analyzed):
        return replace(memory, analyzed=True, groups=tuple(outcome.groups))
    if isinstance(outcome, Proposed):
        failures = [i for i in outcome.check_ids if i in set(outcome.failure_ids)]
        others = [i for i in outcome.check_ids if i not in set(outcome.failure_ids)]
        order = [i for pair in zip(failures, others, strict=False) for i in pair]
        order += failures[len(others) :] + others[len(failures) :]
        proposed = {**memory.proposed, outcome.step: memory.proposed.get(outcome.step, 0) + 1}
        pending = Pending(outcome.step, tuple(outcome.candidate_ids), tuple(order)) if outcome.candidate_ids else None
        groups = (
            memory.groups[1:]
            if outcome.group is not None and memory.groups[:1] and memory.groups[0][:2] == outcome.group
            else memory.groups
        )
        # a winner not adopted yet (GEPA's best, a compared proposal) stays the next action: it beat the current ones
        return replace(
            memory,
            proposed=proposed,
            pending=pending,
            groups=groups,
            # (demos that give nothing new say nothing of what the sub LM writes)
            repeats=memory.repeats if outcome.step == DEMOS else 0 if outcome.candidate_ids else memory.repeats + 1,
            demos_tried=memory.demos_tried or outcome.step == DEMOS,
        )
    if isinstance(outcome, Compared):

        def named(index: int) -> str | None:  # a candidate other than the first, named so adopt_candidate takes it
            source = outcome.sources[index] if 0 < index < len(outcome.sources) else None
            return source if source and source.startswith(("proposal-", "run-", "demos-")) else None

        if outcome.split == "val":  # a comparison on validation checks the current instructions when it has them
            unchecked = memory.unchecked and "current" not in outcome.sources
            if memory.trial is None or memory.trial not in outcome.sources:
                return replace(memory, unchecked=unchecked)
            winner = memory.trial if named(outcome.best) == memory.trial else memory.winner
            return replace(
                memory,
                unchecked=unchecked,
                trial=None,
                winner=winner,
                winner_on_val=winner == memory.trial or memory.winner_on_val,
                trials=(*memory.trials, memory.trial),
            )
        trials = memory.trials + ((memory.trial,) if memory.trial in outcome.sources else ())
        trial = named(outcome.ahead) if outcome.best == 0 else None
        trial = None if trial in trials else trial
        return replace(
            memory, pending=None, winner=named(outcome.best), winner_on_val=False, trial=trial, trials=trials
        )
    if isinstance(outcome, Adopted):
        winner = None if outcome.changed or memory.winner == outcome.candidate else memory.winner
        pending = memory.pending
        if pending is not None and outcome.candidate in pending.candidate_ids:
            pending = None
        changed = {"analyzed": False, "groups": ()} if outcome.changed else {}  # other instructions fail otherwise
        return replace(memory, winner=winner, pending=pending, unchecked=memory.unchecked or outcome.changed, **changed)
    if isinstance(outcome, PromptEdited):
        return replace(memory, winner=None, unchecked=True, analyzed=False, groups=())
    if isinstance(outcome, Validated):
        return replace(memory, unchecked=False)
    raise TypeError(f"not an outcome of a move: {outcome!r}")


# -- the policy --------------------------------------------------------------------------------------------
def gepa_budget(budget: BudgetView) -> int:
    """What GEPA gets of what is left: all of it, unless a fifth pays a whole targeted round."""
    tail = budget.left // TARGETED_SHARE
    return budget.left - tail if tail >= budget.reserve + 1 + 2 * MIN_CHECK else budget.left


def next_action(state: LoopState) -> Action:
    """The loop's next action in ``state``."""
    memory, budget = state.memory, state.budget
    if not budget.val_size and 0 < budget.train_size < 3:  # train decides, and no change can win 3 more than it loses
        return Submit(f"the {budget.train_size} train example(s) that decide what is returned cannot show a change")
    on_val = memory.winner is not None and memory.winner_on_val
    if budget.left <= 0 and not on_val:  # (a winner scored on validation is adopted and checked for free)
        return Submit("the budget is spent")
    if memory.winner is not None:
        return Adopt(memory.winner, check=bool(budget.val_size) and (on_val or budget.left >= budget.val_size))
    if memory.unchecked and budget.val_size and budget.left >= budget.val_size:
        return CheckValidation()
    if memory.trial is not None and budget.val_size and budget.left >= budget.val_size:
        return CompareValidation(memory.trial)
    if memory.trial is not None and not budget.val_size and budget.left >= 2 * budget.train_size:
        return Compare((memory.trial,), tuple(range(budget.train_size)))  # train is the selection split: all of it
    if not memory.gepa_ran and (budget.proposals_left > 0 or budget.unfinished_gepa):  # (it reflects: sub-LM prompts)
        return RunGepa(budget.unfinished_gepa or gepa_budget(budget))
    free = budget.left - budget.reserve  # what moves may spend
    pending = memory.pending
    if pending is not None and free > 0:
        per_candidate = free // max(1, len(pending.candidate_ids))
        check = pending.check_ids[: min(per_candidate, max(MIN_CHECK, per_candidate // PROPOSALS_PER_BUDGET))]
        if check:
            return Compare(pending.candidate_ids, check)
    if free < MIN_USEFUL_BUDGET:
        draw = _confirm(state) or _last_draw(state)
        if isinstance(draw, LastDraw) and draw.group is None and _analysis_pays_before(state):
            return Analyze()  # the draw is then written for the largest group of every failure
        return draw or Submit("what is left pays no proposal with its comparison")
    if not budget.failing:  # nothing to reflect on: find failures first, or stop when train has none
        if not budget.unevaluated:
            return Submit("the current instructions pass every train example")
        if budget.proposals_left <= 0 and not budget.demos:  # a failure found now could pay for nothing
            return _confirm(state) or Submit("no sub-LM prompt is left for a proposal")
        confirm = _confirm(state)
        if confirm is not None and free < 2 * MIN_USEFUL_BUDGET:  # a failure found now could pay no proposal with
            return confirm  # its comparison after it: what is left confirms the lead instead
        return EvaluateTrain(budget.unevaluated[:free])
    analysis_units = budget.analysis_prompts * budget.proposal_units
    if (  # every failure, not those of a few minibatches: the train examples not seen yet first, when a round still pays
        not memory.analyzed
        and budget.analysis_prompts > 0
        and budget.unevaluated
        and free - len(budget.unevaluated) - analysis_units >= MIN_USEFUL_BUDGET + MIN_CHECK
    ):
        return EvaluateTrain(budget.unevaluated)
    if (
        not memory.analyzed
        and budget.analysis_prompts > 0
        and budget.proposals_left > budget.analysis_prompts  # the analysis and one proposal from it
        and free - analysis_units >= MIN_USEFUL_BUDGET
    ):
        return Analyze()
    if free < MIN_ROUND:  # a comparison on so few train examples could hardly show a clear gain: validation can
        draw = _last_draw(state)
        if draw is not None:
            return draw
    tried = memory.proposals > memory.proposals_at_gepa_end  # a targeted proposal was made (the first, a group's)
    if (
        budget.demos
        and not memory.demos_tried
        and free >= MIN_USEFUL_BUDGET + MIN_CHECK
        and (tried or not memory.groups)
    ):
        return ProposeDemos()  # free to propose; its comparison is paid like any other
    if budget.proposals_left <= 0:
        return _confirm(state) or Submit("no sub-LM prompt is left for a proposal")
    if memory.repeats > len(memory.steps):  # every step had its turn and the sub-LM wrote nothing new
        return _confirm(state) or Submit(
            f"the last {memory.repeats} proposals gave nothing new to compare (instructions already tried, or no "
            "usable answer from the sub LM)"
        )
    if memory.groups:
        analysis, name, step = memory.groups[0]
        return Propose(step if step in memory.steps else _next_step(memory), (analysis, name))
    return Propose(_next_step(memory))


def _confirm(state: LoopState) -> Confirm | None:
    """A confirmation of the current instructions' lead over the unchanged program with what is left, when
    validation alone shows it without a clear gain (the selection would return the unchanged program) and the
    budget pays at least :data:`MIN_CHECK` fresh train examples: before the run ends, and before a last draw."""
    memory, budget = state.memory, state.budget
    if memory.unchecked or memory.winner is not None or budget.confirmable < MIN_CHECK:
        return None
    return Confirm()


def _last_draw(state: LoopState) -> LastDraw | None:
    """One proposal, adopted and checked on validation at once, when what is left after GEPA cannot pay a
    comparison on train besides the submission's check but pays that check: those units have no other use. Once,
    after GEPA, when there are failures to learn from."""
    memory, budget = state.memory, state.budget
    if (
        not memory.gepa_ran
        or not budget.val_size
        or not budget.failing
        or memory.proposals != memory.proposals_at_gepa_end
        or budget.left < budget.val_size + budget.proposal_units
        or budget.proposals_left <= 0
    ):
        return None
    if memory.groups:
        analysis, name, step = memory.groups[0]
        return LastDraw(step if step in memory.steps else _next_step(memory), (analysis, name))
    return LastDraw(_next_step(memory))


def _analysis_pays_before(state: LoopState) -> bool:
    """Whether an analysis can come before the last draw and leave it paid: its prompts (free of the budget when
    sub-LM prompts have an allowance of their own) besides the draw's proposal and validation check."""
    memory, budget = state.memory, state.budget
    return (
        not memory.analyzed
        and budget.analysis_prompts > 0
        and budget.proposals_left > budget.analysis_prompts
        and budget.left - budget.analysis_prompts * budget.proposal_units >= budget.val_size + budget.proposal_units
    )


def _next_step(memory: LoopMemory) -> str:
    """Round robin over the steps, as GEPA selects components: the step proposed for least often; on a tie the
    later step (the last one writes the program's output, which the metric judges)."""
    return min(reversed(memory.steps), key=lambda s: memory.proposed.get(s, 0))
