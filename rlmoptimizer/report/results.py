"""Detailed results of a run, in the spirit of ``dspy.GEPA``'s ``DspyGEPAResult``, built from the run directory.

A *candidate* is one distinct instruction set that was evaluated (candidate 0 is the unchanged program). For each
candidate: its score on the whole validation split (when it was checked there), its scores per example on train
and validation (every first-sample record stored, the latest evaluation of an example winning; extra rollouts
are in ``run_ids``), and the budget spent when it
was first evaluated. The Pareto front is the set of candidates that score best on at least one train example.

Names a user porting from another optimizer looks for:

* ``best_idx`` / ``best_candidate`` / ``candidates`` / ``val_aggregate_scores`` / ``to_dict()`` as in
  ``DspyGEPAResult`` (``candidates`` are instruction maps here: what GEPA's ``to_dict()`` gives for each candidate);
* ``score`` and ``candidate_programs`` as ``MIPROv2`` attaches them: the returned program's score on the selection
  split, and ``[{"score", "program", "full_eval": True, ...}]`` for every candidate evaluated on the whole selection
  split, best first (``program`` is built on the program given as ``program=``).

Where each candidate came from: ``candidate_ids`` (the ids the moves gave it, ``proposal-N`` and ``gepa-N``; several
can name one instruction set), ``lineage`` (each id's parents, the move that made it, its GEPA run, the train ids it
reflected on and the failure group it was written for, as ``candidates.json`` keeps them, with the ``candidate`` index
it stands for) and ``ancestry`` (the returned candidate's ancestors back to the unchanged program, each with its score:
:mod:`rlmoptimizer.report.lineage`).

Scores and ranks follow the selection's one rule (:func:`rlmoptimizer.records.ranked`): a candidate is scored by its
first sample (rollout 0), so a lucky extra rollout never raises a candidate's scores, its place on the Pareto front
or its rank; ``candidate_programs[0]`` is the returned program whenever it was checked on the whole split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlmoptimizer.errors import ConfigurationError
from rlmoptimizer.fingerprint import apply_instructions
from rlmoptimizer.records import first_sample_complete, ranked
from rlmoptimizer.report.lineage import Lineage
from rlmoptimizer.report.rundir import RunDirectory, read_run_directory


def _key(instructions: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(instructions.items()))


class CandidatePrograms(Sequence):
    """MIPROv2's ``candidate_programs``: ``{"score", "program", "full_eval": True, "instructions",
    "candidate_idx"}`` per candidate evaluated on the whole selection split, best first as the selection ranks
    them (:attr:`DetailedResults.ranking`). Each program is built when it is read, so the list costs nothing until
    used, and (not being a ``list``) it is not walked by ``named_sub_modules()`` when attached to the returned
    program."""

    def __init__(self, results: DetailedResults) -> None:
        self._results = results
        self._order = [(results.selection_scores[i], i) for i in results.ranking]

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        score, i = self._order[index]
        return {
            "score": score,
            "program": self._results.build_program(i),
            "full_eval": True,
            "instructions": dict(self._results.candidates[i]),
            "candidate_idx": i,
        }

    def __repr__(self) -> str:
        shown = ", ".join(f"candidate {i}: {s:.3f}" for s, i in self._order)
        return f"CandidatePrograms([{shown}])"


@dataclass(frozen=True)
class DetailedResults:
    """Every candidate of one run and how it scored. Read-only; ``to_dict()`` is plain JSON."""

    candidates: tuple[dict[str, str], ...]
    val_aggregate_scores: tuple[float | None, ...]
    train_aggregate_scores: tuple[float | None, ...]
    train_subscores: tuple[dict[int, float], ...]
    val_subscores: tuple[dict[int, float], ...]
    run_ids: tuple[tuple[str, ...], ...]
    discovery_budget: tuple[int, ...]
    per_train_example_best_candidates: dict[int, frozenset[int]]
    best_idx: int | None
    selection_split: str | None
    score: float | None
    baseline_score: float | None
    budget: dict[str, Any] | None
    usage: dict[str, Any] | None
    cost: float | None
    run_storage_dir: str
    status: str
    ranking: tuple[int, ...] = ()
    """The candidates checked on the whole selection split, best first by the selection's rule."""
    candidate_ids: tuple[tuple[str, ...], ...] = ()
    """Per candidate, the candidate ids naming it (``proposal-N``, ``gepa-N``) in the order they were made."""
    lineage: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per candidate id: ``parents`` (candidate ids, a run id or ``'current'``), ``move``, ``run`` (the GEPA run),
    ``steps``, ``reflected_on`` (train example ids), ``made_for`` (a proposal written for a group of a failure
    analysis: ``{"analysis", "group", "example_ids"}``) as the moves recorded them, and ``candidate`` (the index of
    the instruction set it stands for; None when it was never evaluated)."""
    ancestry: tuple[dict[str, Any], ...] = ()
    """The returned candidate's ancestors, the unchanged program (or the oldest ancestor known) first and the
    returned candidate last: per generation ``label`` (its id, or ``"the unchanged program"``), ``id``,
    ``candidate``, ``move``, ``parents`` (labels), ``run``, ``steps``, ``changed_steps`` (what differs from its first
    parent), ``reflected_on``, ``made_for``, ``generation``, ``score`` (on the whole selection split), ``val_score`` and
    ``returned``. Empty until a candidate is returned."""
    program: Any = field(default=None, compare=False, repr=False)

    # -- building ----------------------------------------------------------------------------------
    @classmethod
    def from_run_directory(cls, directory: str | Path | RunDirectory, program: Any = None) -> DetailedResults:
        """Build from a run directory (any state). ``program``: the student, so ``candidate_programs`` and
        ``best_candidate`` can give programs."""
        rundir = directory if isinstance(directory, RunDirectory) else read_run_directory(directory)
        index: dict[tuple, int] = {}
        candidates: list[dict[str, str]] = []
        train: list[dict[int, float]] = []
        val: list[dict[int, float]] = []
        run_ids: list[list[str]] = []
        discovery: list[int] = []
        full_val: dict[int, float] = {}
        full_train: dict[int, float] = {}
        val_size = train_size = None
        for run in rundir.runs:
            if run.label == "baseline":
                if run.split == "val":
                    val_size = run.requested_count
                else:
                    train_size = run.requested_count
        for run in rundir.runs:
            key = _key(run.instructions)
            if key not in index:
                index[key] = len(candidates)
                candidates.append(dict(run.instructions))
                train.append({})
                val.append({})
                run_ids.append([])
                discovery.append(max(0, rundir.spent_after(run) - run.budget_spent))
            i = index[key]
            run_ids[i].append(run.run_id)
            if run.rollout == 0:  # an extra rollout's sample never scores a candidate (one rule: selection.ranked)
                scores = train[i] if run.split == "train" else val[i]
                for record in run.records:
                    scores[record.example_id] = record.score
        selection = rundir.selection or {}
        rank: dict[str, list[int]] = {}
        for split, size, full in (("val", val_size, full_val), ("train", train_size, full_train)):
            order = ranked(
                first_sample_complete(rundir.runs, split, size or 0),
                initial=rundir.initial_instructions or {},
                preferred=selection.get("submission_run_id"),
            )
            for run in order:
                full.setdefault(index[_key(run.instructions)], run.score)
            rank[split] = list(dict.fromkeys(index[_key(run.instructions)] for run in order))

        best: dict[int, frozenset[int]] = {}
        example_ids = sorted({example for scores in train for example in scores})
        for example in example_ids:
            scored = {i: scores[example] for i, scores in enumerate(train) if example in scores}
            top = max(scored.values())
            best[example] = frozenset(i for i, s in scored.items() if s == top)

        chosen = rundir.optimized_instructions
        best_idx = index.get(_key(chosen)) if chosen else None
        named = Lineage(
            rundir.named_candidates,
            rundir.lineage,
            candidates,
            rundir.initial_instructions,
            {run.run_id: run.instructions for run in rundir.runs},
            rundir.prompt_versions,
        )
        selection_split = selection.get("split")
        selection_scores = full_train if selection_split == "train" else full_val
        ancestry = []
        for node in named.ancestry(best_idx):
            i = node["candidate"]
            ancestry.append(
                {
                    **node,
                    "score": selection_scores.get(i) if i is not None else None,
                    "val_score": full_val.get(i) if i is not None else None,
                    "returned": i == best_idx,
                }
            )
        return cls(
            candidates=tuple(candidates),
            val_aggregate_scores=tuple(full_val.get(i) for i in range(len(candidates))),
            train_aggregate_scores=tuple(full_train.get(i) for i in range(len(candidates))),
            train_subscores=tuple(train),
            val_subscores=tuple(val),
            run_ids=tuple(tuple(ids) for ids in run_ids),
            discovery_budget=tuple(discovery),
            per_train_example_best_candidates=best,
            best_idx=best_idx,
            selection_split=selection.get("split"),
            score=selection.get("chosen_score"),
            baseline_score=selection.get("baseline_score"),
            budget=rundir.budget,
            usage=rundir.usage,
            cost=rundir.cost,
            run_storage_dir=rundir.directory,
            status=rundir.status,
            ranking=tuple(rank["train" if selection.get("split") == "train" else "val"]),
            candidate_ids=tuple(named.ids_of(i) for i in range(len(candidates))),
            lineage={
                name: {**entry, "candidate": named.candidate_of(name)}
                for name, entry in ((n, rundir.lineage.get(n, {})) for n in rundir.named_candidates)
            },
            ancestry=tuple(ancestry),
            program=program,
        )

    # -- views -------------------------------------------------------------------------------------
    @property
    def pareto_front(self) -> list[int]:
        """Candidates that score best on at least one train example (ties included), in candidate order."""
        return sorted({i for ids in self.per_train_example_best_candidates.values() for i in ids})

    @property
    def discovery_eval_counts(self) -> tuple[int, ...]:
        """GEPA's name for :attr:`discovery_budget`: budget spent before each candidate was first evaluated."""
        return self.discovery_budget

    @property
    def log_dir(self) -> str:
        """GEPA's name for :attr:`run_storage_dir`."""
        return self.run_storage_dir

    @property
    def selection_scores(self) -> tuple[float | None, ...]:
        """Each candidate's score on the whole selection split (validation, or train without a valset)."""
        return self.train_aggregate_scores if self.selection_split == "train" else self.val_aggregate_scores

    @property
    def best_candidate(self) -> dict[str, str] | None:
        """The returned instructions (GEPA's ``best_candidate``, as its ``to_dict()`` shows candidates)."""
        return self.candidates[self.best_idx] if self.best_idx is not None else None

    def candidate_lineage(self, index: int) -> dict[str, dict[str, Any]]:
        """``{id: lineage}`` for every candidate id naming candidate ``index`` (empty when none does)."""
        return {name: self.lineage[name] for name in self.candidate_ids[index] if name in self.lineage}

    @property
    def returned_candidate_id(self) -> str | None:
        """The id the returned candidate was first made under (``gepa-3``), None when it has none."""
        return self.ancestry[-1]["id"] if self.ancestry else None

    def lineage_record(self) -> dict[str, Any]:
        """Where the candidates came from, as plain JSON: ``returned`` (the returned candidate's id), ``ancestry``,
        ``lineage`` (per candidate id) and ``candidate_ids`` (per candidate). MLflow logs it as ``lineage.json``."""
        return {
            "returned": self.returned_candidate_id,
            "ancestry": [dict(node) for node in self.ancestry],
            "lineage": {name: dict(entry) for name, entry in self.lineage.items()},
            "candidate_ids": [list(ids) for ids in self.candidate_ids],
        }

    def build_program(self, index: int, program: Any = None) -> Any:
        """A copy of ``program`` (default: the one given when these results were built) with candidate
        ``index``'s instructions."""
        base = program if program is not None else self.program
        if base is None:
            raise ConfigurationError(
                "no program to build candidates on: pass the student, e.g. "
                "DetailedResults.from_run_directory(run_dir, program=MyProgram()) or results.build_program(i, program)"
            )
        built = base.deepcopy()
        apply_instructions(built, self.candidates[index])
        return built

    @property
    def candidate_programs(self) -> CandidatePrograms:
        """As ``MIPROv2``: every candidate evaluated on the whole selection split, best first, as
        ``{"score", "program", "full_eval": True, "instructions", "candidate_idx"}`` (see :class:`CandidatePrograms`)."""
        return CandidatePrograms(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (example ids become string keys only when serialized by ``json``)."""
        return {
            "candidates": [dict(c) for c in self.candidates],
            "val_aggregate_scores": list(self.val_aggregate_scores),
            "train_aggregate_scores": list(self.train_aggregate_scores),
            "val_subscores": [dict(s) for s in self.val_subscores],
            "train_subscores": [dict(s) for s in self.train_subscores],
            "run_ids": [list(ids) for ids in self.run_ids],
            "discovery_budget": list(self.discovery_budget),
            "per_train_example_best_candidates": {
                example: sorted(ids) for example, ids in self.per_train_example_best_candidates.items()
            },
            "pareto_front": self.pareto_front,
            "best_idx": self.best_idx,
            "selection_split": self.selection_split,
            "score": self.score,
            "baseline_score": self.baseline_score,
            "budget": self.budget,
            "usage": self.usage,
            "cost": self.cost,
            "run_storage_dir": self.run_storage_dir,
            "status": self.status,
            "ranking": list(self.ranking),
            "candidate_ids": [list(ids) for ids in self.candidate_ids],
            "lineage": {name: dict(entry) for name, entry in self.lineage.items()},
            "ancestry": [dict(node) for node in self.ancestry],
        }
