"""What the stored runs say: the candidate pool with GEPA's Pareto front, the failure replay set, and the
contrast of two runs' traces.

May import: ``rlmoptimizer.evaluation``, ``.fingerprint``, ``.records`` and ``rlmoptimizer.moves.context``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlmoptimizer.fingerprint import instructions_digest
from rlmoptimizer.moves.context import MoveContext, mean
from rlmoptimizer.records import EvalRun, ExampleResult, StepTrace, first_sample_complete, ranked


class _Candidate:
    """Every stored run of one instruction set, merged. Records of LM calls that failed without an answer are
    left out of its scores: they say nothing about the instructions (and are tried again when asked)."""

    def __init__(self, index: int, instructions: dict[str, str]) -> None:
        self.index = index
        self.instructions = instructions
        self.runs: list[EvalRun] = []
        self.train: dict[int, dict[int, ExampleResult]] = {}  # example id -> rollout -> record
        self.val_run: EvalRun | None = None

    def add(self, run: EvalRun, val_size: int) -> None:
        self.runs.append(run)
        if run.split == "train":
            for record in run.records:
                if record.reusable:
                    self.train.setdefault(record.example_id, {})[run.rollout] = record
        elif run.split == "val" and run.evaluated_count == val_size and run.rollout == 0:
            self.val_run = run

    def train_scores(self) -> dict[int, float]:
        return {i: mean([r.score for r in by_rollout.values()]) for i, by_rollout in sorted(self.train.items())}


class HistoryMoves(MoveContext):
    # -- diff -------------------------------------------------------------------------------------------
    def diff_runs(self, run_a: str, run_b: str) -> dict[str, Any]:
        """What changed from ``run_a`` to ``run_b`` on the train examples both evaluated: fixed, broken, still
        failing, still passing; for fixed and broken, the first step whose outputs differ. Free."""
        a, b = (self._train_run(r, "diff_runs") for r in (run_a, run_b))
        recs_a = {r.example_id: r for r in a.records}
        recs_b = {r.example_id: r for r in b.records}
        shared = sorted(set(recs_a) & set(recs_b))
        fixed, broken, still_failing, still_passing = [], [], [], []
        for i in shared:
            ra, rb = recs_a[i], recs_b[i]
            if ra.passed and rb.passed:
                still_passing.append(i)
            elif not ra.passed and not rb.passed:
                still_failing.append(i)
            else:
                change = {
                    "example_id": i,
                    "score_a": ra.score,
                    "score_b": rb.score,
                    **_first_difference(ra.steps, rb.steps),
                }
                (fixed if rb.passed else broken).append(change)
        changed_steps = sorted(
            s for s in set(a.instructions) | set(b.instructions) if a.instructions.get(s) != b.instructions.get(s)
        )
        return {
            "run_a": a.run_id,
            "run_b": b.run_id,
            "instructions_changed": changed_steps,
            "shared_count": len(shared),
            "score_a": mean([recs_a[i].score for i in shared]),
            "score_b": mean([recs_b[i].score for i in shared]),
            "fixed": fixed,
            "broken": broken,
            "still_failing": still_failing,
            "still_passing": still_passing,
            "note": None if shared else "the runs share no examples: evaluate the same ids to compare them",
        }

    # -- candidates and hard examples --------------------------------------------------------------------
    def _candidates(self) -> list[_Candidate]:
        by_digest: dict[str, _Candidate] = {}
        val_size = len(self.runs.splits.get("val", ()))
        for run in self.runs.all():
            digest = instructions_digest(run.instructions)
            if digest not in by_digest:
                by_digest[digest] = _Candidate(len(by_digest), dict(run.instructions))
            by_digest[digest].add(run, val_size)
        return list(by_digest.values())

    def _best(self, cands: list[_Candidate]) -> tuple[_Candidate | None, str]:
        """The best candidate as the selection ranks them (:func:`rlmoptimizer.records.ranked`, on the first
        sample of a whole split): on validation when any candidate was checked there, else on the whole train
        split."""
        runs = self.runs.all()
        initial = runs[0].instructions if runs else {}
        for split in ("val", "train"):
            complete = first_sample_complete(runs, split, len(self.runs.splits.get(split, ())))
            if complete:
                digest = instructions_digest(ranked(complete, initial=initial)[0].instructions)
                best = next(c for c in cands if instructions_digest(c.instructions) == digest)
                return best, split
        return None, ""

    def candidates(self) -> dict[str, Any]:
        """Every instruction set evaluated so far with its train scores (where known), its validation score,
        and the Pareto front: the candidates best on at least one train example, after removing those whose
        every such example another front candidate also wins (as GEPA keeps its candidate pool). Free."""
        cands = self._candidates()
        scores = {c.index: c.train_scores() for c in cands}
        aggregate = {c.index: mean(list(scores[c.index].values())) for c in cands}
        fronts: dict[int, set[int]] = {}
        for i in sorted({i for s in scores.values() for i in s}):
            have = {c: s[i] for c, s in scores.items() if i in s}
            top = max(have.values())
            fronts[i] = {c for c, v in have.items() if v == top}
        fronts = _remove_dominated(fronts, aggregate)
        on_front = sorted({c for front in fronts.values() for c in front})
        best, best_split = self._best(cands)
        current = instructions_digest(self._current())
        names: dict[str, list[str]] = {}
        for name in list(self.proposals):
            names.setdefault(instructions_digest(self.instructions_of(name)), []).append(name)
        rows = []
        for c in cands:
            ids = names.get(instructions_digest(c.instructions), [])
            rows.append(
                {
                    "candidate": c.index,
                    "ids": ids,
                    "lineage": {name: self.lineage[name] for name in ids if name in self.lineage} or None,
                    "instructions": dict(c.instructions),
                    "is_current": instructions_digest(c.instructions) == current,
                    "labels": sorted({run.label for run in c.runs}),
                    "run_ids": [run.run_id for run in c.runs],
                    "train_scores": {str(i): s for i, s in scores[c.index].items()},
                    "train_score": aggregate[c.index],
                    "train_evaluated": len(scores[c.index]),
                    "val_score": c.val_run.score if c.val_run is not None else None,
                    "best_on": sorted(i for i, front in fronts.items() if c.index in front),
                    "on_pareto_front": c.index in on_front,
                }
            )
        return {
            "candidates": rows,
            "pareto_front": on_front,
            "best": best.index if best is not None else None,
            "best_by": best_split or None,
        }

    def hard_examples(self) -> dict[str, Any]:
        """The failure replay set: train examples failing under the best candidate so far, and every train
        example that failed in any evaluation, with how often (each instruction set and rollout counted once). Free."""
        cands = self._candidates()
        best, best_split = self._best(cands)
        counts: dict[int, list[int]] = {}
        for c in cands:
            for i, by_rollout in c.train.items():
                for record in by_rollout.values():
                    failed_evaluated = counts.setdefault(i, [0, 0])
                    failed_evaluated[1] += 1
                    failed_evaluated[0] += 0 if record.passed else 1
        failing = sorted(i for i, by in best.train.items() if not all(r.passed for r in by.values())) if best else []
        rows = [{"example_id": i, "failed": f, "evaluated": n, "fail_rate": f / n} for i, (f, n) in counts.items() if f]
        rows.sort(key=lambda r: (-r["failed"], -r["fail_rate"], r["example_id"]))
        return {
            "best_candidate": best.index if best is not None else None,
            "best_by": best_split or None,
            "failing_under_best": failing,
            "examples": rows,
        }


def _first_difference(a: Sequence[StepTrace], b: Sequence[StepTrace]) -> dict[str, Any]:
    """The first step call whose outputs differ between two traces of one example, with both outputs."""
    for index, (sa, sb) in enumerate(zip(a, b, strict=False)):
        if sa.step_name != sb.step_name or sa.outputs != sb.outputs:
            return {"first_changed_step": sb.step_name, "call": index, "outputs_a": sa.outputs, "outputs_b": sb.outputs}
    if len(a) != len(b):
        index = min(len(a), len(b))
        longer = a if len(a) > len(b) else b
        return {
            "first_changed_step": longer[index].step_name,
            "call": index,
            "outputs_a": a[index].outputs if index < len(a) else None,
            "outputs_b": b[index].outputs if index < len(b) else None,
        }
    return {"first_changed_step": None, "call": None, "outputs_a": None, "outputs_b": None}


def _remove_dominated(fronts: dict[int, set[int]], aggregate: dict[int, float]) -> dict[int, set[int]]:
    """GEPA's pruning of the per-example fronts: repeatedly drop a candidate (lowest aggregate first) when each
    example it is best on also has another remaining candidate that is best on it."""
    programs = sorted({c for front in fronts.values() for c in front}, key=lambda c: (aggregate.get(c, 0.0), -c))
    dominated: set[int] = set()
    changed = True
    while changed:
        changed = False
        for c in programs:
            if c in dominated:
                continue
            others = set(programs) - dominated - {c}
            mine = [front for front in fronts.values() if c in front]
            if mine and all(front & others for front in mine):
                dominated.add(c)
                changed = True
                break
    return {i: front - dominated for i, front in fronts.items()}
