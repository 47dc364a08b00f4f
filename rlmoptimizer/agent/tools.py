"""The functions the optimizer agent calls from its REPL, bound to one compile().

A tool's name, parameters and docstring are its interface: the agent's tool list
(:func:`rlmoptimizer.agent.prompts.format_tools`: each docstring's first paragraph) and ``help(tool)`` in the REPL
(the whole docstring) are built from exactly those, and nothing else describes them. Tools return JSON-friendly
values. A bad argument raises an exception whose message says what to do next (the agent sees it as the error of
its code cell); nothing a tool refuses changes state.
The selection of example ids is parsed here (``ids``), once per call; the inner rooms trust the ids they get.

May import: ``rlmoptimizer.moves``, ``.budget``, ``.errors``, ``.evaluation.lm_failures``, ``.events``, ``.fingerprint``,
``.records``, ``.storage``
and the agent wing's own ``ids``, ``pilot``, ``policy``, ``prompts``, ``services``, ``stop`` and ``working_program``.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

from rlmoptimizer.agent.ids import select_ids
from rlmoptimizer.agent.pilot import Pilot
from rlmoptimizer.agent.policy import (
    DEMOS,
    Adopted,
    Analyzed,
    BudgetView,
    Compared,
    GepaFinished,
    PromptEdited,
    Proposed,
    Validated,
)
from rlmoptimizer.agent.prompts import BASELINE_TRAIN
from rlmoptimizer.agent.services import CompileServices
from rlmoptimizer.agent.stop import sub_lm_move_ended
from rlmoptimizer.budget import SUB_LM_CALL, TRAIN_EXAMPLE, Reservation
from rlmoptimizer.errors import ConfigurationError, StructureChangedError, agent_error
from rlmoptimizer.events import CandidateAdded, GepaIteration
from rlmoptimizer.fingerprint import canonical_json, demos_step, instructions_digest
from rlmoptimizer.moves import Moves
from rlmoptimizer.moves.analysis import prompts_for
from rlmoptimizer.moves.context import whole_validation
from rlmoptimizer.moves.gepa import GepaHooks, GepaSpec
from rlmoptimizer.records import EvalRun
from rlmoptimizer.storage.answers import AnswerStore
from rlmoptimizer.storage.candidates import (
    gepa_runs_done,
    read_candidates,
    read_gepa_progress,
    replayed_gepa_runs,
    write_candidates,
    write_gepa_progress,
)
from rlmoptimizer.storage.layout import GEPA_REFLECTIONS

__all__ = ["AgentTools", "select_ids"]


def _watches_the_sub_lm(tool: Callable) -> Callable:
    """``tool`` (one that asks the sub LM) requesting the compile's stop when the sub LM cannot be used, or gave no
    answer in several such tool calls in a row (:func:`~rlmoptimizer.agent.stop.sub_lm_move_ended`)."""

    @functools.wraps(tool)
    def guarded(self: AgentTools, *args: Any, **kwargs: Any) -> Any:
        before = self.ledger.spent_by_kind.get(SUB_LM_CALL, 0)
        self.moves.silent_sub_lm = None
        try:
            result = tool(self, *args, **kwargs)
        except Exception as exc:
            answered = self.ledger.spent_by_kind.get(SUB_LM_CALL, 0) > before  # (an answered prompt is charged)
            sub_lm_move_ended(self.services.stop, exc, answered)
            raise
        silent, self.moves.silent_sub_lm = self.moves.silent_sub_lm, None  # (an analysis left to the code's groups)
        sub_lm_move_ended(self.services.stop, silent, silent is None)
        return result

    return guarded


class AgentTools:
    """The agent's tools: evaluate the working program, read runs, edit prompts, read the status."""

    def __init__(self, services: CompileServices) -> None:
        self.services = services
        working, runs, ledger = services.working, services.runs, services.ledger
        self.working = working
        self.seed = services.attempt  # run_gepa's default seed: the compile's attempt, so attempts sample differently
        self._as_sub = services.as_sub  # books the proposals' LM calls to the sub role
        self.runs = runs
        self.ledger = ledger
        self.notes = services.notes
        self.moves = Moves(
            runs=runs,
            evaluate=self._evaluate_instructions,
            ledger=ledger,
            step_names=working.step_names,
            current=working.instructions,
            check_map=lambda mapping: working.validate_prompt_map(mapping, what="a candidate"),
            proposal_lm=services.sub_lm,
            pass_threshold=getattr(runs.evaluator, "pass_threshold", 1.0),
            initial=working.initial,
        )
        self.moves.max_demos = services.max_demos
        store = getattr(runs, "store", None)
        self._directory = None if store is None else store.directory
        # What GEPA runs need of the compile: the reflections kept in the run directory (a resumed compile replays a
        # run_gepa without paying again), what each GEPA run paid or reserved (a run killed in the middle takes only
        # the rest of its slice on resume), the booking and the events; each answer is journaled by the moves.
        self._gepa_progress = read_gepa_progress(self._directory)
        self.moves.gepa_hooks = GepaHooks(
            answers=AnswerStore(self._directory, name=GEPA_REFLECTIONS),
            book=self._as_sub,
            progress=self._gepa_progress,
            keep_progress=lambda kept: write_gepa_progress(self._directory, kept),
            iteration_ended=self._gepa_iteration_ended,
            format_failures=services.format_failures,
        )
        # the named candidates of an earlier process of this compile (a resume): their ids keep working
        named, lineage = read_candidates(self._directory)
        self.moves.proposals.update(named)
        self.moves.lineage.update(lineage)
        self._announced = set(named)  # the candidates CandidateAdded told of (an earlier process told of these)
        self.moves.gepa_candidates = max(
            [int(n.split("-", 1)[1]) for n in named if n.startswith("gepa-") and n.split("-", 1)[1].isdigit()],
            default=0,
        )
        # the GEPA runs an earlier process is done with; the runs at the end it did not finish, or started in the turn
        # a resume replays, are replayed under their own names (their paid work free)
        replaying = replayed_gepa_runs(self._directory, self._gepa_progress)
        self.moves.replaying_gepa = replaying
        self.moves.gepa_runs = gepa_runs_done(
            self._gepa_progress,
            {entry.get("run") for entry in lineage.values() if entry.get("move", "").startswith("gepa")},
            replaying,
        )
        # the default policy's runner: the moves below report their outcomes to it
        self._tried: set[str] = set()  # every prompt map proposed or current so far (canonical JSON)
        self._evaluations = (0, 0)  # runs seen, distinct evaluations among them (what _progress counts)
        self.pilot = Pilot(
            working.step_names,
            self._budget_view,
            self._progress,
            gepa_ran=self.moves.gepa_runs > 0,
            gepa_best=self._gepa_best_not_adopted(working.instructions(), replaying),
        )
        self.pilot.tools = self

    def _gepa_best_not_adopted(self, current: dict[str, str], replaying: set[str]) -> str | None:
        """On a resume: the best candidate of the last GEPA run an earlier process finished (not one the replayed turn
        runs again), when nothing was adopted since (the current instructions are still the ones it started from),
        so the loop adopts it as one run does."""
        finished = [e for name, e in self._gepa_progress.items() if e.get("finished") and name not in replaying]
        last = finished[-1] if finished else {}
        best = last.get("best_new")
        return best if best in self.moves.proposals and last.get("start") == instructions_digest(current) else None

    def _evaluate_instructions(
        self,
        instructions: dict[str, str],
        split: str,
        ids: list[int],
        *,
        rollout: int = 0,
        label: str = "agent",
        reservation: Reservation | None = None,
    ) -> EvalRun:
        return self.working.evaluate(
            split, ids, label, instructions=instructions, rollout=rollout, reservation=reservation
        )

    def _budget_view(self) -> BudgetView:
        """What the default policy needs to know of the budget and the train runs now."""
        val_size, train_size = len(self.runs.splits.get("val", ())), len(self.runs.splits["train"])
        unevaluated, failing, passing = self._train_status()
        return BudgetView(
            left=self.ledger.left,
            val_size=val_size,
            reserve=val_size or train_size,  # the units one check of the submission needs
            proposals_left=self.ledger.left_for(SUB_LM_CALL),
            proposal_units=1 if self.ledger.counts_toward_limit(SUB_LM_CALL) else 0,
            unevaluated=tuple(unevaluated),
            failing=failing,
            demos=bool(self.moves.max_demos) and passing > 0,
            train_size=train_size,
            analysis_prompts=prompts_for(failing),
            confirmable=self.moves.confirmable(self.working.initial),
            unfinished_gepa=self.moves.unfinished_gepa_budget(),
        )

    def _progress(self) -> tuple[int, ...]:
        """Units spent (every kind), distinct evaluations (one of stored records is free, but it checked something;
        the same evaluation made again, by the same move, checks nothing new), candidates named, notes and prompt
        versions: a turn that changes none of them made no progress."""
        spent = sum(self.ledger.snapshot()["spent_by_kind"].values())
        runs = self.runs.all()
        if len(runs) != self._evaluations[0]:  # (runs seen, distinct evaluations among them)
            kinds = {
                (
                    r.label,
                    r.split,
                    r.rollout,
                    instructions_digest(r.instructions),
                    tuple(x.example_id for x in r.records),
                )
                for r in runs
            }
            self._evaluations = (len(runs), len(kinds))
        counts = (self._evaluations[1], len(self.moves.proposals), len(self.notes.all()))
        return (spent, *counts, len(self.working.prompt_versions))

    def _train_status(self) -> tuple[list[int], int, int]:
        """Train ids the current instructions have not been evaluated on (those no search saw last: they are what a
        confirmation of a lead can use; never their own demos' examples, which see their answer), and how many
        evaluated ones fail and pass."""
        ids = range(len(self.runs.splits["train"]))
        current = self.working.instructions()
        stored = self.runs.stored(current, "train", ids)
        failing = sum(1 for record in stored.values() if not record.passed)
        fresh = {i for i, _ in self.moves.fresh_ids(self.working.initial)}
        demos = self.moves.demo_sources(current)
        unevaluated = sorted((i for i in ids if i not in stored and i not in demos), key=lambda i: i in fresh)
        return unevaluated, failing, len(stored) - failing

    def tool_functions(self) -> list[Callable]:
        """The agent's tools, in the order the instructions describe them."""
        return [
            self.next_phase,
            self.evaluate_program,
            self.run_data,
            self.update_prompt,
            self.optimization_status,
            self.run_gepa,
            self.analyze_failures,
            self.propose_instructions,
            self.propose_demos,
            self.compare,
            self.adopt_candidate,
            self.confirm_gain,
            self.diff_runs,
            self.hard_examples,
            self.candidates,
            self.add_note,
            self.read_notes,
        ]

    def next_phase(self) -> dict:
        """Take the default loop's next phase (the state block names it), up to its next decision; a SUBMIT it makes ends the run. Spends what its tools spend.

        A phase is GEPA's (the run, its best adopted and checked on validation) or the targeted rounds' (propose, compare with 'current', adopt the winner, check on validation), up to SUBMIT once nothing is left to pay for. Returns {'ran': [the calls made], 'summary', 'submitted'}."""
        return self.pilot.take_phase()

    def add_note(self, text: str) -> str:
        """Keep a short conclusion in your notes, shown on every turn. Free.

        What you found, tried, what worked: notes survive the compaction of old turns and a resumed run."""
        try:
            return self.notes.add(text)
        except ValueError as exc:
            raise agent_error(str(exc), "pass add_note a short non-empty string") from None

    def read_notes(self) -> list[str]:
        """All your notes, oldest first. Free."""
        return [f"[{n['id']}] {n['text']}" for n in self.notes.all()]

    def evaluate_program(
        self,
        split: str = "train",
        limit: int | None = None,
        sample: str | None = None,
        ids: Any = None,
        failed_from_run: str | None = None,
        seed: int = 0,
        rollouts: int = 1,
    ) -> dict:
        """Run the program with the current instructions: on train examples (a run like baseline_train) or on the whole 'val' split (aggregates only). 1 unit per newly evaluated example per rollout.

        Train examples: limit=N (the first N), sample='random' (shuffled by seed; with limit), ids=[3, 7] or ids='3,7', or failed_from_run=a train run id (its failures); all by default. What the budget cannot cover is left out and 'note' says so. rollouts=k runs each example k times (per example 'pass_rate'; per run 'flaky_ids', 'always_failing_ids')."""
        if split not in self.runs.splits:
            raise agent_error(f"unknown split {split!r}", f"use one of {sorted(self.runs.splits)}")
        if split == "val":
            whole_validation(
                "evaluate_program",
                "call evaluate_program(split='val') with no other arguments",
                limit,
                sample,
                ids,
                failed_from_run,
            )
            if rollouts != 1:
                return self.moves.evaluate_rollouts(self.working.instructions(), "val", [], rollouts)  # refuses
            run = self.working.evaluate("val", None, label="agent")
            self.pilot.record(Validated())
            return run.agent_view()
        failed: list[int] | None = None
        if failed_from_run is not None:
            source = self.moves.get_run(failed_from_run)
            if source.split != "train":
                raise agent_error(
                    f"run {failed_from_run!r} is a {source.split} run",
                    "failed_from_run takes a train run id (validation examples are not shown)",
                )
            failed = source.failed_ids
        try:
            selected = select_ids(
                len(self.runs.splits["train"]),
                limit=limit,
                sample=sample,
                seed=seed,
                ids=ids,
                failed_ids_from_run=failed,
            )
        except ValueError as exc:
            raise agent_error(str(exc), "fix the selection arguments and call evaluate_program again") from None
        if not selected:  # (an empty run would read as a score of 0)
            why = f"run {failed_from_run!r} has no failures" if failed == [] and failed_from_run is not None else ""
            raise agent_error(
                f"the selection is empty{f' ({why})' if why else ''}", "select at least one example (ids=..., limit=N)"
            )
        if rollouts != 1:
            return self.moves.evaluate_rollouts(self.working.instructions(), "train", selected, rollouts)
        run = self.working.evaluate("train", selected, label="agent")
        return run.agent_view()

    @_watches_the_sub_lm
    def run_gepa(
        self,
        budget: int | None = None,
        steps: Any = None,
        start: Any = "current",
        seed: int | None = None,
        minibatch_size: int = 3,
        use_merge: bool = True,
        proposals_per_iteration: int = 1,
        group: Any = None,
    ) -> dict:
        """Run GEPA's engine (reflective proposals, Pareto selection, merge) from `start` for at most `budget` units (default: all that is left); returns its candidates and 'best', for adopt_candidate. Changes nothing.

        `start`: 'current' or a candidate id; `steps`: the steps it may change (all by default); `seed` orders its minibatches (default: the compile's attempt); group= a group of analyze_failures whose causes every reflection is told. Parents are chosen on the Pareto front, proposals are reflections on minibatches of failures. Returns {'best': a candidate id, 'best_is_new', 'candidate_ids': ['gepa-1', ...], 'candidates': [{'id', 'parents', 'score'}], 'pareto_front', 'best_score' (aggregate on validation, or train without one), 'spent', 'summary'}; then adopt_candidate(r['best']) when r['best_is_new'] ('best' is 'current' when nothing beat the start)."""
        if budget is None:  # all that is left; a run an earlier process was cut off in goes on with its own
            budget = self.moves.unfinished_gepa_budget() or self.ledger.left
        if steps is not None and not isinstance(steps, str):
            try:
                steps = list(steps)
            except TypeError:
                raise agent_error(
                    f"steps must be a list of step names, got {type(steps).__name__}",
                    f"pass steps=None (all) or a list from {self.working.step_names}",
                ) from None
        try:
            seed = self.seed if seed is None else seed
            result = self.moves.run_gepa(
                GepaSpec(budget, steps, start, seed, minibatch_size, use_merge, proposals_per_iteration, group)
            )
        finally:
            self._keep_candidates()
        self.pilot.record(GepaFinished(result["best"] if result["best_is_new"] else None))
        return result

    def _keep_candidates(self) -> None:
        write_candidates(self._directory, self.moves.proposals, self.moves.lineage)
        new = [name for name in self.moves.proposals if name not in self._announced]
        self._announced.update(new)
        for name in new:
            self._tell(CandidateAdded(name, dict(self.moves.proposals[name]), dict(self.moves.lineage.get(name, {}))))

    def _gepa_iteration_ended(self, run: str, iteration: int, accepted: bool, spent: int) -> None:
        self._tell(GepaIteration(run, iteration, accepted, spent, self.ledger.snapshot()))

    def _tell(self, event: Any) -> None:
        observer = getattr(self.runs, "observer", None)
        if observer is not None:
            observer.on_event(event)

    @_watches_the_sub_lm
    def analyze_failures(self, run_id: str | None = None, step: str | None = None, use_lm: bool = True) -> dict:
        """Group every failure of a train run by step and cause, with counts and example ids. 1 unit per sub-LM prompt (use_lm=False: code groups only, free). Changes nothing.

        The run: the current instructions' train records by default; step=: only failures where that step ran or raised. Code groups by step, kind and 'expected -> produced' label; the sub-LM names one short cause per failure (8 failures a prompt) and merges them into groups. Returns {'groups': [{'name', 'cause', 'count', 'example_ids', 'step', 'kind', 'labels', 'contrast_ids' (passing examples of the same kind)}] largest first, 'code_groups', 'causes', 'summary' (print it), 'analysis_id', 'note'}; then propose_instructions(step, group=0). Prompts: failures/8 rounded up, plus 1 (at most 7), refused if the budget cannot cover them all; asked again about the same records: free."""
        analysis = self._as_sub(self.moves.analyze_failures)(run_id=run_id, step=step, use_lm=use_lm)
        if run_id is None and use_lm:  # the current instructions' failures: the default loop proposes for its groups
            # (those whose step ran on some of their examples: a proposal has nothing to reflect on otherwise)
            groups = tuple((analysis.analysis_id, g.name, g.step) for g in analysis.groups if g.step_ran != 0)
            self.pilot.record(Analyzed(groups))
        return analysis.to_dict()

    @_watches_the_sub_lm
    def propose_instructions(
        self, step: str, run_id: str | None = None, ids: Any = None, n: int = 1, guidance: str = "", group: Any = None
    ) -> dict:
        """New instructions for `step`, written by the sub-LM from failures or from a group of analyze_failures (group=0: its largest). 1 unit per proposal. Changes nothing.

        GEPA's reflection: the sub-LM sees the step's inputs/outputs, the expected fields, scores and metric feedback of the failures of the current instructions (or of run_id, or of the examples ids=[...]). group= a group of analyze_failures (its index, name or dict): written from the group's causes and a few of its examples. guidance= adds your own requirements; n= proposals at once. Returns {'texts', 'candidate_ids': ['proposal-1', ...] (names compare and adopt_candidate take), 'candidates': [{step: text}], 'example_ids', 'check_ids', ...}."""
        if ids is not None:
            ids = self._select("propose_instructions", ids=ids)
        result = self._as_sub(self.moves.propose_instructions)(
            step, run_id=run_id, ids=ids, n=n, guidance=guidance, group=group
        )
        self._keep_candidates()
        made_for = result.get("made_for")
        self.pilot.record(
            Proposed(
                step,
                self._not_tried(result),
                tuple(result["check_ids"]),
                tuple(result["example_ids"]),
                group=(made_for["analysis"], made_for["group"]) if made_for else None,
            )
        )
        return result

    def propose_demos(self, step: str | None = None, k: int | None = None, run_id: str | None = None) -> dict:
        """A candidate that gives `step` (default: every step) demos from train examples the program got right. Free; compare it before you adopt it.

        Each demo is the step's own inputs and outputs on a train example the current instructions (or run_id) got right; k demos (default: the compile's max_demos), covering the labels they fail most, then varied. Its comparisons leave its demos' examples out (each sees its own answer). Returns {'candidate_ids', 'demo_ids', 'labels', 'check_ids', 'summary'}."""
        result = self.moves.propose_demos(step, k=k, run_id=run_id)
        self._keep_candidates()
        self.pilot.record(
            Proposed(DEMOS, self._not_tried(result), tuple(result["check_ids"]), tuple(result["failure_ids"]))
        )
        return result

    def _not_tried(self, result: dict) -> tuple[str, ...]:
        """The candidates of a proposal whose whole prompt map was never proposed before nor current; the others
        are named in the result's note (comparing them would show nothing new)."""
        current = self.working.instructions()
        self._tried.add(canonical_json(current))
        new, repeated = [], []
        for name in result["candidate_ids"]:
            key = canonical_json({**current, **self.moves.proposals[name]})
            (repeated if key in self._tried else new).append(name)
            self._tried.add(key)
        if repeated:
            note = f"{', '.join(repeated)} repeat(s) instructions already tried (current or proposed before)"
            result["note"] = "; ".join(filter(None, [result.get("note"), note]))
        return tuple(new)

    def compare(
        self,
        candidates: Any,
        split: str = "train",
        ids: Any = None,
        limit: int | None = None,
        sample: str | None = None,
        seed: int = 0,
        rollouts: int = 1,
    ) -> dict:
        """Evaluate instruction sets on the same examples: per candidate wins and losses against the first and 'beats_first' (a clear gain). 1 unit per new example per candidate per rollout. Changes nothing.

        Each candidate: 'current', a run id (that run's instructions), a proposal id or a {step: text} dict (other steps keep their current text). Returns per candidate score, passed_count, wins/losses/ties vs the first, 'beats_first' (at least 3 more wins than losses: no single example decides it), per example scores (train), 'best' (index; ties keep the earlier), 'winner' (train: the best that beats the first, else 0) and 'best_instructions'. Demos of a candidate are left out of the examples; stored records are free; refused if the budget cannot cover it all."""
        if split == "train":
            ids = self._select("compare", ids=ids, limit=limit, sample=sample, seed=seed)
        else:
            whole_validation(
                "compare", "call compare(candidates, split='val') without ids, limit or sample", ids, limit, sample
            )
        result = self.moves.compare(candidates, split=split, ids=ids, rollouts=rollouts)
        sources = tuple(str(row["source"]) for row in result["candidates"])
        self.pilot.record(Compared(sources, result["winner"], split, result["ahead"]))  # a clear gain, or ahead only
        return result

    def confirm_gain(self, units: int | None = None) -> dict:
        """Confirm a lead of the current instructions over the unchanged program on train examples no search saw, as many as the budget (or units=N) pays, 1-2 units each; once per set of instructions.

        For a lead on validation that is not a clear gain yet. Both run, paired, on train examples no candidate was evaluated on or written from; the final selection counts these fresh examples beside validation. 2 units an example when the unchanged program has no record of it, else 1. Returns {'example_ids', 'wins', 'losses', 'clear_gain', 'summary'}."""
        return self.moves.confirm(self.working.initial, units=units)

    def adopt_candidate(self, candidate: Any) -> dict:
        """Make a candidate (an id, a run id or {step: text}) the current instructions. Free.

        Candidate ids look like 'gepa-3', 'proposal-2'; a run id stands for that run's instructions; in a {step: text} dict, other steps keep their text. Returns {'changed_steps', 'version'}."""
        if isinstance(candidate, str) and candidate == "current":
            raise agent_error(
                "'current' is already the current instructions", "pass a proposal id, a run id or a {step: text} dict"
            )
        instructions = self.moves.instructions_of(candidate)
        current = self.working.instructions()
        # a run's whole map without a step's demos key: that step has no demos (a map names demos only when there are)
        instructions.update({k: "[]" for k in current if demos_step(k) and k not in instructions})
        changed = sorted(step for step, text in instructions.items() if current.get(step, "[]") != text)
        if changed:
            try:
                self.working.set_instructions({step: instructions[step] for step in changed}, source="adopt_candidate")
            except (StructureChangedError, ConfigurationError) as exc:
                raise agent_error(
                    f"adopt refused: {exc}", "only change the instructions text of existing steps"
                ) from None
        self.pilot.record(Adopted(candidate if isinstance(candidate, str) else None, bool(changed)))
        return {"changed_steps": changed, "version": len(self.working.prompt_versions)}

    def _select(self, tool: str, **selection: Any) -> list[int]:
        try:
            return select_ids(len(self.runs.splits["train"]), **selection)
        except ValueError as exc:
            raise agent_error(str(exc), f"fix the selection arguments and call {tool} again") from None

    def diff_runs(self, run_a: str, run_b: str) -> dict:
        """What two train runs differ on: fixed, broken, still failing, still passing. Free.

        Only examples both runs evaluated count. 'fixed' and 'broken' name, for each example, the first step whose outputs differ, and both outputs."""
        return self.moves.diff_runs(run_a, run_b)

    def hard_examples(self) -> dict:
        """Train ids the best candidate fails, and every example that ever failed. Free.

        Returns 'failing_under_best' (train ids the best candidate so far fails) and 'examples' (every train example that failed in any evaluation, with 'failed' and 'evaluated' counts, most often failed first)."""
        return self.moves.hard_examples()

    def candidates(self) -> dict:
        """Every instruction set evaluated so far, with its lineage and scores. Free.

        Each entry: 'instructions', 'ids' (its candidate ids), 'lineage' (parents and the move that made it), 'train_scores' by example id, 'val_score', 'on_pareto_front' (best on at least one example). 'best' is the index of the best (by validation when checked)."""
        return self.moves.candidates()

    def run_data(self, run_id: str) -> dict:
        """Return an earlier run (baseline runs included) by id: full records for train runs, aggregates for validation runs. Free."""
        if run_id == BASELINE_TRAIN:
            return self._baseline_train().agent_view()
        return self.moves.get_run(run_id).agent_view()

    def _baseline_train(self) -> EvalRun:
        """The unchanged program's train run, evaluated now (examples already run with its instructions are free,
        the others charged) unless a complete one exists: the REPL's ``baseline_train`` when it is on demand. Its
        records take at most half of what the moves may spend in the whole compile (the budget beyond one check of
        a submission on validation), and never what that check needs: a larger train set is a random sample of
        that many, and reading it again (a restart, a resume) gives the same sample, paying nothing more."""
        initial = self.working.initial
        complete = self.runs.complete_run("train", initial)
        if complete is not None:
            return complete
        size, val_size = len(self.runs.splits["train"]), len(self.runs.splits.get("val", ()))
        known = self.runs.stored(initial, "train", range(size))
        share = max(0, self.ledger.limit - val_size) // 2 - len(known)  # (what is stored counts toward it)
        share = max(0, min(share, self.ledger.left - val_size))
        if size - len(known) <= share:
            return self.working.evaluate("train", None, "baseline", instructions=initial)
        rest = [i for i in range(size) if i not in known]
        random.Random(self.seed).shuffle(rest)  # the examples evaluated: a sample, not the first ones
        reservation = self.ledger.reserve(share, TRAIN_EXAMPLE)
        try:
            return self.working.evaluate(
                "train", sorted(known) + rest, "baseline", instructions=initial, reservation=reservation
            )
        finally:
            reservation.release()

    def update_prompt(self, step: str, text: str | list[dict]) -> dict:
        """Set one step's instructions, or its demos ('<step>:demos'). Free.

        The step is a name from step_names; demos ('<step>:demos') are a list of dicts of the step's fields, '[]' for none. Returns {'step', 'previous', 'version'}."""
        self.working.check_step(demos_step(step) or step if isinstance(step, str) else step)
        text = self.working.check_text(step, text)
        previous = self.working.instructions().get(step, "[]")
        try:
            self.working.set_instructions({step: text}, source="update_prompt")
        except (StructureChangedError, ConfigurationError) as exc:
            raise agent_error(
                f"update refused: {exc}", "only change the instructions text of an existing step"
            ) from None
        self.pilot.record(PromptEdited())
        return {"step": step, "previous": previous, "version": len(self.working.prompt_versions)}

    def optimization_status(self) -> dict:
        """Budget spent and left, current instructions per step, step names, and every run so far with its score. Free."""
        budget = self.ledger.snapshot()
        return {
            "budget_limit": budget["limit"],
            "budget_spent": budget["spent"],
            "budget_left": budget["left"],
            "budget_spent_by_kind": budget["spent_by_kind"],
            **(
                {"sub_lm_limit": budget["sub_lm_limit"], "sub_lm_left": budget["sub_lm_left"]}
                if "sub_lm_limit" in budget
                else {}
            ),
            "step_names": list(self.working.step_names),
            "current_prompts": self.working.instructions(),
            "runs": [
                {k: run.summary()[k] for k in ("run_id", "split", "label", "score", "passed_count", "evaluated_count")}
                for run in self.runs.all()
            ],
        }
