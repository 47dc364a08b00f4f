"""Paired comparison of instruction sets on the same examples (GEPA's minibatch acceptance, with every
candidate on the same examples) and repeated rollouts of one set; all or nothing on budget.

A candidate whose demos are train examples is compared without them (each would see its own answer); on train,
``winner`` is the best candidate whose gain over the first no single example decides
(:func:`rlmoptimizer.selection.clear_gain`), 0 when none has one.

May import: ``rlmoptimizer.evaluation``, ``.budget``, ``.errors``, ``.fingerprint``, ``.records``, ``.selection`` and
``rlmoptimizer.moves.context``.
"""

from __future__ import annotations

import random
from typing import Any

from rlmoptimizer.budget import example_kind
from rlmoptimizer.errors import BudgetExhaustedError
from rlmoptimizer.fingerprint import demos_step, instructions_digest
from rlmoptimizer.moves.context import MoveContext, budget_spent, exhausted, mean, refuse
from rlmoptimizer.records import EvalRun, ExampleResult
from rlmoptimizer.selection import CONFIRM, clear_gain, confirmed_differences, describe_evidence


class PairedMoves(MoveContext):
    # -- compare ----------------------------------------------------------------------------------------
    def compare(
        self, candidates: Any, split: str = "train", ids: list[int] | None = None, rollouts: int = 1
    ) -> dict[str, Any]:
        """Evaluate several instruction sets on the same examples without changing the current prompts.
        Each candidate is 'current', a run id (that run's instructions) or a {step: text} map (steps left out
        keep their current text). Paired: every candidate sees the same examples, ``rollouts`` times each."""
        if isinstance(candidates, (str, dict)) or not isinstance(candidates, (list, tuple)) or not candidates:
            raise refuse(
                f"candidates must be a non-empty list, got {type(candidates).__name__} {candidates!r:.80}",
                "pass a list like ['current', {'step': 'new text'}] or ['current', 'run-0003']",
            )
        resolved = [self._resolve(c, i) for i, c in enumerate(candidates)]
        example_ids = self._example_ids(split, ids, "compare")
        held = set().union(*(self.demo_sources(instr) for _, instr in resolved)) if split == "train" else set()
        if held & set(example_ids):  # a demo sees its own answer: its score is no evidence for the candidate
            example_ids = [i for i in example_ids if i not in held]
            if not example_ids:
                raise refuse(
                    "compare: every selected example is a demo of a candidate (it would see its own answer)",
                    "select other train examples (ids=..., sample='random')",
                )
        rollouts = self._check_rollouts(rollouts, split)
        by_digest, spent = self._run_all([instr for _, instr in resolved], split, example_ids, rollouts, "compare")
        runs_of = [by_digest[instructions_digest(instr)] for _, instr in resolved]
        paired = _complete_ids(example_ids, [run for runs in runs_of for run in runs])
        rows = []
        for index, ((source, _), runs) in enumerate(zip(resolved, runs_of, strict=True)):
            rows.append(
                {
                    "candidate": index,
                    "source": source,
                    **self._aggregate(runs, paired, rollouts),
                    "run_ids": [run.run_id for run in runs],
                }
            )
        best = max(range(len(rows)), key=lambda i: (rows[i]["score"], -i))
        result: dict[str, Any] = {"split": split, "rollouts": rollouts, "evaluated_count": len(paired)}
        notes = self._notes(runs_of, paired, example_ids)
        per_example = {c: self._per_example(runs) for c, runs in enumerate(runs_of)}
        examples = []
        for i in paired:
            entry = {"example_id": i, "scores": [per_example[c][i][0] for c in range(len(rows))]}
            if rollouts > 1:
                entry["pass_rates"] = [per_example[c][i][1] for c in range(len(rows))]
            examples.append(entry)
        for c, row in enumerate(rows):
            differences = [e["scores"][c] - e["scores"][0] for e in examples]
            row["wins"] = sum(1 for d in differences if d > 0)
            row["losses"] = sum(1 for d in differences if d < 0)
            row["ties"] = sum(1 for d in differences if d == 0)
            row["beats_first"] = c > 0 and clear_gain(differences)
        winners = [c for c, row in enumerate(rows) if row["beats_first"]]
        ahead = [c for c, row in enumerate(rows) if c > 0 and row["wins"] > row["losses"]]
        result["winner"] = max(winners, key=lambda c: (rows[c]["score"], -c)) if winners else 0
        result["ahead"] = max(ahead, key=lambda c: (rows[c]["score"], -c)) if ahead and not winners else 0
        if split == "train":  # validation examples are never shown one by one
            result["example_ids"] = paired
            result["examples"] = examples
            if held:
                notes.append(
                    f"left out train example(s) {sorted(held)}: demos of a candidate (each sees its own answer)"
                )
        result.update(
            {
                "summary": _summary(rows, best, split),
                "candidates": rows,
                "best": best,
                # SUBMIT and update_prompt edit the current map: a step's demos the best lacks are named as none
                "best_instructions": {
                    **{k: "[]" for k in self._current() if demos_step(k)},
                    **resolved[best][1],
                },
                "budget_spent": spent,
                "budget_left": self.ledger.left,
                "note": "; ".join(notes) or None,
            }
        )
        return result

    # -- confirm --------------------------------------------------------------------------------------------
    def fresh_ids(self, initial: dict[str, str]) -> list[tuple[int, int]]:
        """The train examples a confirmation of the current instructions against ``initial`` may use, as
        ``(id, units)`` in a fixed shuffled order (never by what is known of them): those no search saw. Not one
        any instructions but the unchanged program were evaluated on (compared, accepted or chosen on), not one any
        candidate was written from (a proposal's or a GEPA child's ``reflected_on``, a group's ``made_for``), not a
        demo of the current instructions, not one that is also a validation example; when the current instructions
        have no lineage (written by hand, after reading the unchanged program's records), not one the unchanged
        program was evaluated on either. 1 unit when the unchanged program has a record of one, else 2."""
        current = self._current()
        if current == initial:
            return []
        size = len(self.runs.splits["train"])
        seen: set[int] = set(self.demo_sources(current))
        for run in self.runs.all():
            if run.split == "train" and run.instructions != initial:
                seen.update(r.example_id for r in run.records)
        for entry in list(self.lineage.values()):
            seen.update(int(i) for i in entry.get("reflected_on") or ())
            seen.update(int(i) for i in (entry.get("made_for") or {}).get("example_ids") or ())
        unchanged = self.runs.stored(initial, "train", range(size))
        if self.name_of(current) not in self.lineage:  # written outside the moves: every record could have taught it
            seen.update(unchanged)
        order = list(range(size))
        random.Random(size).shuffle(order)
        return [(i, 1 if i in unchanged else 2) for i in order if i not in seen and i not in self._in_validation()]

    def gain_evidence(self, initial: dict[str, str]) -> tuple[list[float], list[float]]:
        """The current instructions' paired score differences with the unchanged program (``initial``): on all of
        validation (empty unless both ran all of it) and on fresh train examples (a confirmation's)."""
        current = self._current()
        if current == initial:
            return [], []
        size = len(self.runs.splits.get("val", ()))
        theirs, ours = (self.runs.stored(instr, "val", range(size)) for instr in (initial, current))
        on_val = [ours[i].score - theirs[i].score for i in range(size) if i in ours and i in theirs]
        train_runs = [run for run in self.runs.all() if run.split == "train"]
        return (on_val if size and len(on_val) == size else []), confirmed_differences(train_runs, current, initial)

    def _confirmed_already(self, current: dict[str, str]) -> bool:
        return any(run.label == CONFIRM and run.instructions == current for run in self.runs.all())

    def confirmable(self, initial: dict[str, str]) -> int:
        """How many fresh train examples the budget pays to confirm the current instructions, when they lead the
        unchanged program (``initial``) on validation without a clear gain and were not confirmed before; else 0."""
        on_val, fresh = self.gain_evidence(initial)
        if sum(on_val) <= 0 or clear_gain(on_val + fresh) or self._confirmed_already(self._current()):
            return 0
        return len(_affordable(self.fresh_ids(initial), self.ledger.left))

    def confirm(self, initial: dict[str, str], units: int | None = None) -> dict[str, Any]:
        """Evaluate the current instructions and the unchanged program (``initial``) on fresh train examples
        (:meth:`fresh_ids`), as many as the budget (at most ``units``) pays, once per set of instructions: the final
        selection counts these paired results beside validation
        (:func:`rlmoptimizer.selection.confirmed_differences`)."""
        tool = "confirm_gain"
        if units is not None and (isinstance(units, bool) or not isinstance(units, int) or units < 1):
            raise refuse(f"{tool}: units must be a positive int, got {units!r}", "pass units=N or leave it out")
        current = self._current()
        on_val, fresh_before = self.gain_evidence(initial)
        why = None
        if current == initial:
            why = "the current instructions are the unchanged program's: there is no gain to confirm"
        elif not on_val:
            why = "the current instructions and the unchanged program were not both run on all of validation"
        elif self._confirmed_already(current):
            why = "the current instructions were confirmed already (once per set of instructions)"
        elif sum(on_val) <= 0:
            why = "the current instructions do not lead the unchanged program on validation: nothing to confirm"
        elif clear_gain(on_val + fresh_before):
            why = "the current instructions' gain on validation is clear already"
        if why is not None:
            raise refuse(
                f"{tool}: {why}", "adopt a candidate that leads on validation, check it there, then confirm it"
            )
        fresh = self.fresh_ids(initial)
        limit = self.ledger.left if units is None else min(units, self.ledger.left)
        chosen = _affordable(fresh, limit)
        if not chosen:
            if exhausted(self.ledger):
                raise budget_spent(tool, self.ledger)
            raise refuse(
                f"{tool}: no train example is fresh for the current instructions (every one was seen by the search)"
                if not fresh
                else f"{tool}: the cheapest fresh example costs {min(u for _, u in fresh)} unit(s), {limit} may be spent",
                "the selection decides on validation alone",
            )
        _, spent = self._run_all([initial, current], "train", sorted(chosen), 1, CONFIRM, tool)
        on_val, fresh_differences = self.gain_evidence(initial)
        clear = clear_gain(on_val + fresh_differences)
        summary = (
            f"confirmed on {len(chosen)} fresh train example(s) ({spent} unit(s)): the current instructions "
            f"{describe_evidence(on_val, fresh_differences, 'validation')} against the unchanged program: "
            + ("a clear gain" if clear else "no clear gain")
        )
        return {
            "example_ids": sorted(chosen),
            "wins": sum(1 for d in fresh_differences if d > 0),
            "losses": sum(1 for d in fresh_differences if d < 0),
            "clear_gain": clear,
            "summary": summary,
            "budget_spent": spent,
            "budget_left": self.ledger.left,
        }

    def evaluate_rollouts(
        self, instructions: dict[str, str], split: str, example_ids: list[int], rollouts: int, label: str = "agent"
    ) -> dict[str, Any]:
        """``rollouts`` independent samples of ``instructions`` on ``example_ids``: the first rollout's run view
        (records of train examples) plus every rollout's scores, per-example pass rate, the examples that
        failed in every rollout and those that passed only sometimes. Charged in full or refused."""
        rollouts = self._check_rollouts(rollouts, split)
        by_digest, spent = self._run_all([instructions], split, example_ids, rollouts, label)
        runs = by_digest[instructions_digest(instructions)]
        view = runs[0].agent_view()
        view.update(
            {
                **self._aggregate(runs, example_ids, rollouts),
                "rollouts": rollouts,
                "run_ids": [run.run_id for run in runs],
                "budget_spent": spent,
                "budget_left": self.ledger.left,
            }
        )
        notes = self._notes([runs], _complete_ids(example_ids, runs), example_ids)
        view["note"] = "; ".join(notes) or None
        if split == "train":
            per_example = self._per_example(runs)
            scores = {i: [rec.score for rec in by] for i, by in self._records_by_example(runs).items()}
            for example in view["examples"]:
                i = example["example_id"]
                example["rollout_scores"] = scores.get(i, [])
                example["pass_rate"] = per_example.get(i, (0.0, 0.0))[1]
            view["always_failing_ids"] = [i for i, (_, rate) in per_example.items() if rate == 0.0]
            view["flaky_ids"] = [i for i, (_, rate) in per_example.items() if 0.0 < rate < 1.0]
        return view

    def _run_all(
        self,
        instruction_sets: list[dict[str, str]],
        split: str,
        example_ids: list[int],
        rollouts: int,
        label: str,
        tool: str = "compare",
    ) -> tuple[dict[str, list[EvalRun]], int]:
        """Evaluate each distinct instruction set ``rollouts`` times on ``example_ids``; all or nothing on budget.
        Returns ({digest: [run of each rollout]}, units spent)."""
        distinct: dict[str, dict[str, str]] = {}
        for instructions in instruction_sets:
            distinct.setdefault(instructions_digest(instructions), instructions)
        cost = sum(
            len(example_ids) - len(self.runs.stored(instr, split, example_ids, r))
            for instr in distinct.values()
            for r in range(rollouts)
        )
        kind = example_kind(split)
        try:
            reservation = self.ledger.reserve_exactly(cost, kind)
        except BudgetExhaustedError:
            if exhausted(self.ledger):
                raise budget_spent(tool, self.ledger) from None
            stored = len(distinct) * rollouts * len(example_ids) - cost
            raise refuse(
                f"this needs {cost} budget unit(s) ({len(distinct)} instruction set(s) x {len(example_ids)} example(s) x "
                f"{rollouts} rollout(s), {stored} already stored and free) but {self.ledger.left} are left",
                "select fewer examples (ids=..., limit=...), fewer candidates or rollouts",
            ) from None
        done: dict[str, list[EvalRun]] = {}
        with reservation:
            for digest, instructions in distinct.items():
                done[digest] = [
                    self._evaluate(
                        instructions, split, list(example_ids), rollout=r, label=label, reservation=reservation
                    )
                    for r in range(rollouts)
                ]
        return done, reservation.spent

    @staticmethod
    def _records_by_example(runs: list[EvalRun]) -> dict[int, list[ExampleResult]]:
        out: dict[int, list[ExampleResult]] = {}
        for run in runs:
            for record in run.records:
                if record.reusable:  # an LM call that failed without an answer says nothing of the instructions
                    out.setdefault(record.example_id, []).append(record)
        return out

    def _per_example(self, runs: list[EvalRun]) -> dict[int, tuple[float, float]]:
        """example id -> (mean score, pass rate) over the rollouts."""
        return {
            i: (mean([r.score for r in recs]), mean([1.0 if r.passed else 0.0 for r in recs]))
            for i, recs in sorted(self._records_by_example(runs).items())
        }

    def _aggregate(self, runs: list[EvalRun], ids: list[int], rollouts: int) -> dict[str, Any]:
        wanted = set(ids)
        per_example = {i: v for i, v in self._per_example(runs).items() if i in wanted}
        out = {
            "score": mean([score for score, _ in per_example.values()]),
            "passed_count": sum(1 for _, rate in per_example.values() if rate == 1.0),
            "evaluated_count": len(per_example),
        }
        if rollouts > 1:
            out["pass_rate"] = mean([rate for _, rate in per_example.values()])
        return out

    @staticmethod
    def _notes(runs_of: list[list[EvalRun]], paired: list[int], example_ids: list[int]) -> list[str]:
        notes = []
        if len(paired) < len(example_ids):
            notes.append(
                f"{len(example_ids) - len(paired)} example(s) lack a record for some candidate or rollout "
                "(see each run's note); results are over the examples every one has"
            )
        failed_calls = sum(1 for runs in runs_of for run in runs for r in run.records if not r.reusable)
        if failed_calls:
            notes.append(
                f"{failed_calls} evaluation(s) failed in the LM call itself (score 0, not charged); "
                "they are tried again next time"
            )
        if any(len(runs) > 1 for runs in runs_of) and all(_same_scores(runs) for runs in runs_of):
            notes.append(
                "every rollout scored every example the same: at the evaluation LM's temperature, more "
                "rollouts may add little"
            )
        return notes


def _summary(rows: list[dict[str, Any]], best: int, split: str) -> str:
    """One line a small model can print: the best candidate, then each candidate's score (and its wins and
    losses against the first, on train)."""
    parts = []
    for row in rows:
        part = f"{row['candidate']} ({row['source']}): {row['score']:.3f}, {row['passed_count']}/{row['evaluated_count']} passed"
        if split == "train" and row["candidate"] > 0:
            part += f", {row['wins']} wins {row['losses']} losses vs 0" + (
                " (a clear gain)" if row["beats_first"] else ""
            )
        parts.append(part)
    return f"best: candidate {best}" + (" (the first: nothing beat it)" if best == 0 else "") + " | " + "; ".join(parts)


def _same_scores(runs: list[EvalRun]) -> bool:
    by_run = [{r.example_id: r.score for r in run.records} for run in runs]
    return all(scores == by_run[0] for scores in by_run[1:])


def _complete_ids(example_ids: list[int], runs: list[EvalRun]) -> list[int]:
    """The ids that every run has a record for."""
    have = [{r.example_id for r in run.records} for run in runs]
    return [i for i in example_ids if all(i in ids for ids in have)]


def _affordable(fresh: list[tuple[int, int]], limit: int) -> list[int]:
    """The examples of ``fresh`` (``(id, units)``, in order) taken while their units fit in ``limit``."""
    chosen, cost = [], 0
    for i, units in fresh:
        if cost + units <= limit:
            chosen.append(i)
            cost += units
    return chosen
