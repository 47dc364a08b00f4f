"""GEPA's own engine as a move: :meth:`GepaMoves.run_gepa` runs the gepa package's optimization loop (Pareto
candidate selection, reflective mutation through dspy's ``InstructionProposer`` as ``dspy.GEPA`` runs it, merge)
over this compile's evaluations, through a :class:`gepa.core.adapter.GEPAAdapter` (:mod:`rlmoptimizer.moves.gepa_adapter`).

What the adapter guarantees, beyond what ``dspy.GEPA`` does:

* every program run is one of our evaluations: stored as a run labelled ``gepa``, reused free when the same
  instructions meet the same example again (a parent's minibatch, the seed's validation), charged 1 unit per
  new example, and told to gepa as its metric calls (``EvaluationBatch.num_metric_calls``);
* every reflection is a proposal charged 1 unit, as one of ``propose_instructions`` is, and its answer is
  kept in the run directory: a resumed compile replays the same run without paying for it again;
* the slice is exact: each evaluation and each reflection reserves all it needs before it starts. When the slice,
  the ledger or the spending cap cannot cover it, gepa's loop is stopped right there (gepa's own stopper looks at
  the budget only between iterations and overshoots by up to one). Everything paid stays stored, and the
  candidates found so far come back;
* a reflection LM that fails (no answer: a bad key, a 5xx after retries) stops the run with that error, instead
  of being taken as "no proposal" (gepa catches exceptions around reflection);
* a child of a reflective proposal runs first where its parent failed on the minibatch, and stops there when it
  can no longer beat its parent (gepa keeps only a strictly higher sum): the metric calls it could not win with
  go to more proposals;
* validation stays in the host: with a validation split, gepa tracks its Pareto front on per-example validation
  scores (as ``dspy.GEPA`` uses ``valset``); the agent sees aggregates only.

May import: gepa, dspy, ``rlmoptimizer.errors``, ``.fingerprint``, ``.storage`` and ``rlmoptimizer.moves``'
own modules.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlmoptimizer.budget import SUB_LM_CALL
from rlmoptimizer.errors import AgentToolError
from rlmoptimizer.fingerprint import instructions_digest
from rlmoptimizer.moves.analysis import AnalysisMoves, group_guidance
from rlmoptimizer.moves.context import budget_spent, exhausted, refuse
from rlmoptimizer.moves.gepa_adapter import Adapter, Reflection, Slice, Stop
from rlmoptimizer.storage.answers import AnswerStore

logger = logging.getLogger(__name__)

MINIBATCH_SIZE = 3  # examples per reflection, gepa's and dspy.GEPA's default
MAX_MERGE_INVOCATIONS = 5  # merges per run, dspy.GEPA's default
MAX_PROPOSALS_PER_ITERATION = 8
REPEATS_LIMIT = 3
"""Iterations in a row whose reflections only repeated instructions already tried (and evaluated nothing new) that
stop a run: each is a paid sub-LM prompt."""


@dataclass(frozen=True)
class GepaSpec:
    """One ``run_gepa`` call: at most ``budget`` units from ``start`` ('current' or a candidate id) on ``steps`` (all
    when None); ``seed`` orders the minibatches of ``minibatch_size``; ``use_merge``; ``proposals_per_iteration``;
    ``group``: a group of a failure analysis whose causes every reflection is told (None: none)."""

    budget: Any
    steps: Any = None
    start: Any = "current"
    seed: Any = 0
    minibatch_size: Any = MINIBATCH_SIZE
    use_merge: Any = True
    proposals_per_iteration: Any = 1
    group: Any = None


@dataclass
class GepaHooks:
    """What GEPA runs need of the compile around them, set once: the reflections kept for a resume (``answers``),
    how a reflection's LM calls are booked (``book``), who is told when one was charged (``answered``), what each
    run has paid as kept on disk (``progress``) and how to keep it (``keep_progress``), and who is told the end of
    each of gepa's iterations (``iteration_ended(run, iteration, accepted, spent)``); ``format_failures``: whether
    reflections read a step's own output that did not parse (``dspy.GEPA``'s ``add_format_failure_as_feedback``)."""

    answers: AnswerStore = field(default_factory=AnswerStore)
    book: Callable[[Callable], Callable] = lambda fn: fn
    answered: Callable[[], None] | None = None  # None: the moves' own journaling (SubLMAnswered to the observer)
    progress: dict[str, dict[str, Any]] = field(default_factory=dict)
    keep_progress: Callable[[dict[str, dict[str, Any]]], None] = lambda kept: None
    iteration_ended: Callable[[str, int, bool, int], None] = lambda run, iteration, accepted, spent: None
    format_failures: bool = False  # reflections read a step's output that did not parse (dspy.GEPA's name for it)


class _Watch:
    """A gepa callback that keeps the engine's state, so what was found can be read after a stop; and a stopper
    for a loop that no longer does anything: stored records and skipped minibatches cost nothing, so without it
    gepa would go round forever once every minibatch it draws already passes."""

    def __init__(
        self,
        activity: Callable[[], tuple[int, int, int]],
        idle_limit: int,
        ended: Callable[[int, bool], None] | None = None,
        too_little: Callable[[Any], str | None] | None = None,
        child: Callable[[Sequence[Any], dict[str, str]], None] | None = None,
        iteration_started: Callable[[], None] | None = None,
    ) -> None:
        """``too_little(state)``: why what is left cannot pay an iteration that could be kept from gepa's ``state``
        (None before the first iteration), or None;
        ``child(batch, parent)``: told that a child of ``parent`` is about to be scored on ``batch``;
        ``iteration_started()``: told when gepa starts an iteration."""
        self.state: Any = None
        self._child = child or (lambda batch, parent: None)
        self._iteration_started = iteration_started or (lambda: None)
        self._too_little = too_little or (lambda state: None)
        self.short: str | None = None
        self._ended = ended or (lambda iteration, accepted: None)
        self.merges = 0
        # (units spent, distinct instructions proposed, reflections answered or replayed) so far: an iteration that
        # spent nothing and proposed nothing new did nothing, whether it reflected (and repeated itself) or not
        self._activity = activity
        self.idle_limit = idle_limit
        self._last: tuple[int, int, int] | None = None
        self.idle = 0
        self.repeating = False  # the idle iterations reflected: the reflection LM proposed only what was tried

    def on_iteration_start(self, event: Any) -> None:
        self.state = event["state"]
        self._iteration_started()
        now = self._activity()
        idle = self._last is not None and now[:2] == self._last[:2]
        self.idle = self.idle + 1 if idle else 0
        reflected = self._last is not None and now[2] != self._last[2]
        self.repeating = idle and (reflected or (self.repeating and self.idle > 1))
        self._last = now

    def on_evaluation_start(self, event: Any) -> None:
        parents = list(event.get("parent_ids") or [])
        # A reflective child (one parent, no index yet). A merge names two parents; it is scored in full.
        if event.get("candidate_idx") is None and len(parents) == 1 and self.state is not None:
            self._child(list(event.get("inputs") or []), self.state.program_candidates[parents[0]])

    def __call__(self, state: Any) -> bool:  # gepa's StopperProtocol, asked before each iteration
        self.short = self._too_little(state)
        limit = min(self.idle_limit, REPEATS_LIMIT) if self.repeating else self.idle_limit  # repeats are paid
        return self.idle >= limit or self.short is not None

    def on_merge_accepted(self, event: Any) -> None:
        self.merges += 1

    def on_iteration_end(self, event: Any) -> None:
        self._ended(int(event["iteration"]), bool(event.get("proposal_accepted")))


class _Log:
    """gepa's log lines, kept (the last few) instead of printed into the agent's REPL."""

    lines: tuple[str, ...] = ()

    def log(self, message: str) -> None:
        self.lines = (*self.lines[-49:], str(message))


class GepaMoves(AnalysisMoves):
    """``run_gepa`` and the lineage of the candidates it and the other moves made."""

    def is_known(self, instructions: dict[str, str]) -> bool:
        return any({**self._current(), **m} == instructions for m in list(self.proposals.values()))

    def _score_bound(self) -> float | None:
        """The highest score one example can have: 1.0, a metric's usual scale, unless the pass threshold or a score
        some example had says the metric's scale is another (then None: not known)."""
        if self.perfect_score > 1.0:
            return None
        if any(record.score > 1.0 for run in self.runs.all() for record in run.records):
            return None
        return 1.0

    def _register(self, instructions: dict[str, str], lineage: dict[str, Any]) -> str:
        """An id for ``instructions`` (a new ``gepa-N`` unless a candidate with the same text has one)."""
        digest = instructions_digest(instructions)
        with self._naming:
            for known, mapping in self.proposals.items():
                if known.startswith("gepa-") and instructions_digest(mapping) == digest:
                    return known
            self.gepa_candidates += 1
            candidate_id = f"gepa-{self.gepa_candidates}"
            self.proposals[candidate_id] = dict(instructions)
            self.lineage[candidate_id] = lineage
        return candidate_id

    def unfinished_gepa_budget(self) -> int | None:
        """The budget of the next GEPA run when an earlier process of this compile was killed in the middle of it (or
        in the turn that ran it, which a resume replays):
        asked for with that budget, it is replayed (its paid work free) and goes on with what is left of it; asked
        for with another, it would start anew and drop what the killed run found."""
        name = f"gepa run {self.gepa_runs + 1}"
        earlier = (self.gepa_hooks.progress if self.gepa_hooks is not None else {}).get(name)
        replayed = earlier and (not earlier["finished"] or name in self.replaying_gepa)
        return int(earlier["budget"]) if replayed else None

    def run_gepa(self, spec: GepaSpec) -> dict[str, Any]:
        """Run gepa's engine as ``spec`` says, wired to the compile by :attr:`gepa_hooks`. A run killed in the middle
        is replayed on resume under the same name and takes only what is left of its budget (its replayed
        evaluations and reflections are free: stored)."""
        import gepa
        from gepa.core.result import GEPAResult
        from gepa.strategies.proposal_sampling import PxNSampling

        hooks, steps, use_merge = self.gepa_hooks or GepaHooks(), spec.steps, spec.use_merge
        replayed = _replayed(hooks.progress, self.gepa_runs + 1, spec.budget)
        if exhausted(self.ledger) and not replayed:
            raise budget_spent("run_gepa", self.ledger)
        if self.ledger.left_for(SUB_LM_CALL) == 0 and not replayed:  # (a replayed run's reflections are kept)
            raise refuse(
                "run_gepa: no sub-LM prompt is left for GEPA's reflections, so it would pay minibatches for nothing",
                "compare or adopt the candidates you have, propose_demos() (it needs no sub LM), or SUBMIT",
            )
        budget = _int_arg("budget", spec.budget, 1)
        seed = _int_arg("seed", spec.seed, 0)
        minibatch_size = _int_arg("minibatch_size", spec.minibatch_size, 1)
        proposals_per_iteration = _int_arg(
            "proposals_per_iteration", spec.proposals_per_iteration, 1, MAX_PROPOSALS_PER_ITERATION
        )
        if not isinstance(use_merge, bool):
            raise refuse(
                f"use_merge must be True or False, got {type(use_merge).__name__} {use_merge!r}",
                "pass use_merge=True (gepa's merge of two lineages) or False",
            )
        if steps is None:
            steps = list(self.step_names)
        elif isinstance(steps, str):
            steps = [steps]
        if not isinstance(steps, (list, tuple)) or not steps:
            raise refuse(
                f"steps must be a list of step names, got {type(steps).__name__} {steps!r:.80}",
                f"pass steps=None (all) or a list from {self.step_names}",
            )
        for step in steps:
            self._check_step(step, "run_gepa")
        steps = list(dict.fromkeys(steps))
        guidance, made_for = None, None
        if spec.group is not None:  # every reflection is told the group's causes (dspy's proposer's additional text)
            analysis, chosen = self.failure_group(spec.group, "run_gepa")
            guidance = group_guidance(analysis, chosen)
            made_for = {"analysis": analysis.analysis_id, "group": chosen.name, "example_ids": list(chosen.example_ids)}
        source, base = self._resolve(spec.start, None)
        source = self.name_of(base) if source in ("current", "map") else source
        run_name = f"gepa run {self.gepa_runs + 1}"
        kept, keep = hooks.progress, hooks.keep_progress
        # The same call replayed after a kill (same budget) goes on with what is left of it (a run that finished in the
        # turn being replayed is replayed whole, free); another call is new.
        earlier = kept.get(run_name)
        # What the killed run had reserved for work under way was paid only for the records that completed: this
        # process charged those when it recovered them (reused free in the replay), the rest was never paid.
        replay = bool(earlier) and earlier["budget"] == budget
        taken = 0
        if replay:
            reserved = earlier.get("reserved", 0)
            recovered = getattr(self.runs, "recovered_now", {}).get("gepa", 0)
            taken = earlier["taken"] - reserved + min(reserved, recovered)
        started_at = earlier["started_at"] if taken and "started_at" in earlier else time.time()
        if budget - taken > self.ledger.left and replay:
            # a replay, with less left than the killed run had (a damaged run file paid again, say): it goes on
            # with what is left, rather than dropping what the killed run paid for
            logger.warning(
                "%s is replayed with %s unit(s) left of the %s its budget still had: it stops when they are spent",
                run_name,
                self.ledger.left,
                budget - taken,
            )
        elif budget - taken > self.ledger.left:
            raise refuse(
                f"run_gepa: budget={budget} but only {self.ledger.left} unit(s) are left",
                f"pass budget={self.ledger.left} or less",
            )

        train_ids = list(range(len(self.runs.splits["train"])))
        val_ids = list(range(len(self.runs.splits.get("val", ()))))
        uses_val = bool(val_ids)
        trainset = [("train", i) for i in train_ids]
        valset = [("val", i) for i in val_ids] if uses_val else trainset

        # what was taken of the slice when each of the killed run's stop checks was made: its replay makes each
        # check as the killed run made it (the slice's own 'left' already counts all the killed run took)
        # and the units it had spent on evaluations there, so that its replayed iterations (free) are not idle
        earlier_checks = [int(u) for u in (earlier or {}).get("checks", ())] if taken else []
        earlier_evaluations = [int(u) for u in (earlier or {}).get("evaluations", ())] if taken else []
        # the killed run's checks are known (its progress lists them, each kept with the next unit it paid): with
        # none listed, all it took came before its first check, which its replay then makes as it would have
        checks_known = bool(taken) and isinstance((earlier or {}).get("checks"), list)
        if len(earlier_evaluations) != len(earlier_checks):
            earlier_checks, earlier_evaluations, checks_known = [], [], False
        checks: list[int] = []
        evaluations: list[int] = []
        start = instructions_digest(base)  # a resume knows whether its best was adopted since

        def record(units: int, reserved: int = 0, finished: bool = False, best_new: str | None = None) -> None:
            kept[run_name] = {
                "budget": budget,
                "taken": units,
                **({"reserved": reserved} if reserved else {}),
                "finished": finished,
                "checks": list(checks),
                "evaluations": list(evaluations),
                "start": start,
                "started_at": started_at,  # a resume knows whether it ran in the turn it replays
                **({"best_new": best_new} if finished else {}),
            }
            keep(kept)

        slice_ = Slice(self.ledger, budget, taken=taken, on_change=record)
        reflection = Reflection(
            self._lm(),
            slice_,
            hooks.answers,
            hooks.book,
            hooks.answered or self._answered,
            guidance=guidance,
            too_long=self.too_long,
        )
        adapter = Adapter(
            self.runs,
            self._evaluate,
            self.is_known,
            base,
            slice_,
            self._score_bound,
            propose=reflection.propose,
            format_failures=hooks.format_failures,
        )
        # Idle: as many iterations in a row without a new payment or reflection as one pass over the train set
        # takes in minibatches (every minibatch drawn already passes), and at least 3.
        idle_limit = max(3, -(-len(train_ids) // max(1, minibatch_size)))
        # A child is kept only once scored on the whole validation set, after its parent's minibatch, its reflection
        # (a unit where sub-LM prompts draw on the budget) and its own minibatch, for each of the iteration's
        # proposals (each on a minibatch of its own): with less than that left, the iteration would pay for a child
        # that can never be kept. Those units stay for the agent. The parent is gepa's choice and its minibatch is
        # not drawn yet, so the parent's part is what the candidate with the fewest stored train records could cost
        # (none when every candidate's are stored: the start's after a complete train baseline). A run replayed on
        # resume waits until it pays or asks something new (until then it replays stored work, free).
        batch = min(minibatch_size, len(train_ids))
        reflection_cost = 1 if self.ledger.counts_toward_limit(SUB_LM_CALL) else 0

        def keep_cost(state: Any) -> int:
            parents = state.program_candidates if state is not None else [{}]  # {}: the start
            unstored = max(len(train_ids) - self.runs.stored_count(adapter.instructions(c), "train") for c in parents)
            return proposals_per_iteration * (min(batch, unstored) + reflection_cost + batch) + len(valset)

        def too_little(state: Any) -> str | None:
            index = len(checks)
            if index < len(earlier_checks):  # replayed: the check the killed run made here
                checks.append(earlier_checks[index])
                evaluations.append(earlier_evaluations[index])
                left, caught_up = budget - earlier_checks[index], True
            else:
                checks.append(slice_.units - slice_.left)
                evaluations.append((earlier_evaluations[-1] if earlier_evaluations else 0) + slice_.evaluations)
                left = slice_.left
                # (a run whose checks were not kept, written by an older version or damaged: no check until the
                # replay pays or asks something new, since all it took may have come after this one)
                caught_up = not taken or checks_known or slice_.spent or reflection.calls
            if caught_up and left < (cost := keep_cost(state)):
                return (
                    f"the {left} unit(s) left cannot pay a child that could be kept (its parent's minibatch, "
                    + ("its reflection, " if reflection_cost else "")
                    + f"its own and the {len(valset)} {'validation' if uses_val else 'train'} examples it is scored "
                    f"on: {cost}); "
                    "they stay for your own moves"
                )
            return None

        watch = _Watch(
            lambda: (
                # (a reflection paid from the units is no evaluation; a replayed one counts as the killed run paid it)
                evaluations[-1] if evaluations else slice_.evaluations,
                len(reflection.texts),
                reflection.calls + reflection.replayed,
            ),
            idle_limit,
            ended=lambda i, accepted: hooks.iteration_ended(run_name, i, accepted, slice_.spent),
            too_little=too_little,
            child=adapter.expect_child,
            iteration_started=adapter.new_iteration,
        )
        log = _Log()
        self.gepa_runs += 1
        stopped: Stop | None = None
        result = None
        try:
            result = gepa.optimize(
                seed_candidate={step: base[step] for step in steps},
                trainset=trainset,
                valset=valset,
                adapter=adapter,
                reflection_lm=None,  # the adapter reflects (propose_new_texts), as dspy.GEPA's does
                candidate_selection_strategy="pareto",
                reflection_minibatch_size=min(minibatch_size, len(train_ids)),
                perfect_score=self.perfect_score,
                skip_perfect_score=True,
                module_selector="round_robin",
                use_merge=use_merge,
                max_merge_invocations=MAX_MERGE_INVOCATIONS,
                # No max_metric_calls: gepa counts a validation example as a call even when our record of it is
                # stored and free; the slice stops the loop exactly, the watch when it idles.
                stop_callbacks=[watch],
                logger=log,
                callbacks=[watch],
                seed=seed,
                raise_on_exception=True,
                track_best_outputs=False,
                display_progress_bar=False,
                sampling_strategy=PxNSampling(1, proposals_per_iteration) if proposals_per_iteration > 1 else None,
            )
        except Stop as stop:
            stopped = stop
        if result is None and watch.state is not None:
            result = GEPAResult.from_state(watch.state, seed=seed)
        outcome = self._gepa_outcome(
            result, watch, adapter, reflection, slice_, stopped, source, steps, uses_val, run_name, made_for
        )
        # finished once its outcome is taken (its candidates named): a run cut off before is replayed, free; so is
        # one an error stopped (an evaluation LM or a sub LM that failed, the machine out of memory), once resumed
        finished = stopped is None or stopped.error is None
        record(
            slice_.units - slice_.left, finished=finished, best_new=outcome["best"] if outcome["best_is_new"] else None
        )
        return outcome

    def _gepa_outcome(
        self,
        result: Any,
        watch: _Watch,
        adapter: Adapter,
        reflection: Reflection,
        slice_: Slice,
        stopped: Stop | None,
        source: str,
        steps: list[str],
        uses_val: bool,
        run_name: str,
        made_for: dict[str, Any] | None = None,
    ) -> dict:
        trace = list(getattr(watch.state, "full_program_trace", []) or [])
        reflected_on: dict[int, list[int]] = {}
        for entry in trace:
            for index in entry.get("new_program_indices", []) or []:
                reflected_on[index] = sorted(int(i) for i in entry.get("subsample_ids", []) or [])
        ids: dict[int, str] = {0: source}
        rows = []
        if result is not None:
            for index in range(1, len(result.candidates)):
                parents = [p for p in result.parents[index] if p is not None]
                move = "gepa merge" if len(parents) > 1 else "gepa reflective proposal"
                lineage = {
                    "parents": [ids.get(p, f"gepa candidate {p}") for p in parents],
                    "move": move,
                    "run": run_name,
                    "steps": steps,
                    "parent_digests": [
                        instructions_digest(adapter.instructions(result.candidates[p])) for p in parents
                    ],
                }
                if move != "gepa merge":
                    lineage["reflected_on"] = reflected_on.get(index, [])
                    if made_for:
                        lineage["made_for"] = made_for
                ids[index] = self._register(adapter.instructions(result.candidates[index]), lineage)
            for index in range(len(result.candidates)):
                rows.append(
                    {
                        "id": ids[index],
                        "parents": [ids.get(p, "") for p in result.parents[index] if p is not None],
                        "score": round(float(result.val_aggregate_scores[index]), 4),
                    }
                )
        if result is not None:  # children gepa did not keep: their lineage too, so that none looks like a seed
            kept = {instructions_digest(adapter.instructions(c)): ids[i] for i, c in enumerate(result.candidates)}
            for parent, child, minibatch in adapter.children:
                if instructions_digest(child) in kept:
                    continue
                lineage = {
                    "parents": [kept[d] for d in [instructions_digest(parent)] if d in kept],
                    "move": "gepa reflective proposal (not kept: it did not beat its parent on the minibatch)",
                    "run": run_name,
                    "steps": steps,
                    "parent_digests": [instructions_digest(parent)],
                    "reflected_on": minibatch,
                    **({"made_for": made_for} if made_for else {}),
                }
                self._register(child, lineage)
        unevaluated = []
        for instructions in adapter.unevaluated:
            lineage = {
                "parents": [],
                "move": "gepa reflective proposal (not evaluated: the budget ran out)",
                "run": run_name,
                "steps": steps,
            }
            unevaluated.append(self._register(instructions, lineage))
        best = ids[result.best_idx] if result is not None else None
        front = sorted(
            {
                ids[i]
                for members in (result.per_val_instance_best_candidates.values() if result else [])
                for i in members
                if i in ids
            }
        )
        new = [ids[i] for i in sorted(ids) if i]
        split = "validation" if uses_val else "train"
        if stopped is not None:
            why = stopped.why
        elif watch.short is not None:
            why = watch.short
        elif watch.repeating and watch.idle >= min(watch.idle_limit, REPEATS_LIMIT):
            why = (
                f"{watch.idle} iterations in a row proposed only instructions already tried and evaluated nothing new: "
                "the reflection LM repeats itself"
            )
        elif watch.idle >= watch.idle_limit:
            why = (
                f"{watch.idle} iterations in a row had nothing to do (the minibatches drawn already pass, or their "
                "failures left no step output to reflect on, e.g. outputs that did not parse): nothing more to learn "
                "from train failures"
            )
        else:
            why = "gepa ended on its own"
        best_score = rows[[r["id"] for r in rows].index(best)]["score"] if best is not None else None
        scores = ([f"{split} score {best_score:.3f}"] if best_score is not None else []) + (
            [f"its seed, the instructions it started from, scored {rows[0]['score']:.3f}"] if rows else []
        )
        summary = (
            f"{run_name}: best {best}"
            + (f" ({', '.join(scores)})" if scores else "")
            + f"; {len(new)} new candidate(s)"
            + f"; spent {slice_.spent} of {slice_.units} unit(s)"
            + (f" (and {slice_.before} before the compile was resumed)" if slice_.before else "")
            + f"; stopped: {why}"
        )
        unusable = reflection.unusable_note()
        if unusable:
            summary += f"; {unusable}"
            logger.warning("%s: %s", run_name, unusable)
        outcome = {
            "best": best,
            "best_is_new": best is not None and best != source,
            "candidate_ids": new + unevaluated,
            "candidates": rows,
            "pareto_front": front,
            "scored_on": split,
            "best_score": best_score,
            "spent": slice_.spent,
            "spent_before_resume": slice_.before,
            "spent_by_kind": {k: v for k, v in slice_.by_kind.items() if v},
            "budget_left": self.ledger.left,
            "reflections": reflection.calls,
            "reflections_replayed": reflection.replayed,
            "reflections_unusable": reflection.unusable,
            "merges": watch.merges,
            "children_cut_short": adapter.cut_short,
            "examples_not_run": adapter.not_run,
            "stopped": why,
            "not_evaluated": unevaluated,
            "summary": summary,
        }
        if stopped is not None and stopped.error is not None and not isinstance(stopped.error, AgentToolError):
            error = stopped.error
            if "reflection" in stopped.why:
                logger.warning("run_gepa stopped: %s", stopped.why)
                raise refuse(
                    f"{summary}",
                    "check sub_lm (its key, model name or provider); the candidates found "
                    f"so far are kept: {new or 'none'}",
                ) from error
            raise error
        return outcome


def _replayed(kept: dict[str, dict[str, Any]], number: int, budget: Any) -> bool:
    """Whether GEPA run ``number`` ran in an earlier process with this ``budget``, killed before it finished or in
    the turn a resume replays (its paid work is replayed free)."""
    earlier = kept.get(f"gepa run {number}")
    return bool(earlier) and earlier["budget"] == budget


def _int_arg(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
        raise refuse(
            f"run_gepa: {name} must be an int {bound}, got {type(value).__name__} {value!r:.40}",
            f"pass {name}= an int {bound}",
        )
    return value
