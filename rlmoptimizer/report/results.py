"""Detailed results of a run, readable by code written for ``dspy.GEPA``'s ``DspyGEPAResult``, built from the run
directory.

A *candidate* is one distinct instruction set scored on the whole selection split (validation; train without it), as
``dspy.GEPA``'s candidates are its pool, each scored on its whole valset; candidate 0 is the unchanged program. The
instruction sets evaluated only in part (a GEPA child its minibatch rejected, a proposal compared on a few examples)
are ``unscored``, apart. For each candidate: its score on the whole selection split, its scores per example on train
and validation (every first-sample record stored, the latest evaluation of an example winning; extra rollouts
are in ``run_ids``), and the budget spent when it was first evaluated. The Pareto front is the set of candidates
that score best on at least one train example.

``dspy.GEPA``'s names (dspy 3.4.1), with its types and meaning: ``candidates`` (the programs, a list: built on the
program given as ``program=``), ``parents`` (per candidate, its parents' indices; ``[None]`` when it has none known),
``val_aggregate_scores``, ``val_subscores``, ``per_val_instance_best_candidates`` (sets), ``discovery_eval_counts``,
``best_outputs_valset`` (None unless asked for, as ``track_best_outputs``), ``total_metric_calls``,
``num_full_val_evals``, ``log_dir``, ``seed``, ``best_idx``, ``best_candidate`` (the returned program),
``highest_score_achieved_per_val_task`` and ``to_dict()`` (whose ``candidates`` are ``{step: text}`` maps, as
dspy.GEPA's). The ``val_`` names are on the validation set, or on the train set without one, as ``dspy.GEPA`` uses
its trainset as its valset then. Where ours differs: ``best_idx`` is the candidate ``compile()`` returned (the best
checked there, never worse than the unchanged program), None until it returned one.

Ours, beside them: ``instructions`` (each candidate's ``{step: text}`` map, what ``candidates`` held before it held
programs), ``best_instructions``, ``train_subscores``, ``train_aggregate_scores``, ``run_ids``, ``ranking``, the
budget, usage and cost; and as ``MIPROv2`` attaches them, ``score`` (the returned program's score on the selection
split) and ``candidate_programs`` (``[{"score", "program", "full_eval": True, ...}]`` for every candidate evaluated on
the whole selection split, best first).

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
from functools import cached_property
from pathlib import Path
from typing import Any

import dspy

from rlmoptimizer.errors import ConfigurationError
from rlmoptimizer.fingerprint import apply_instructions, copy_program
from rlmoptimizer.records import first_sample_complete, ranked
from rlmoptimizer.report.lineage import Lineage
from rlmoptimizer.report.rundir import RunDirectory, read_run_directory


def _key(instructions: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(instructions.items()))


def percent(score: float | None) -> float | None:
    """A mean score on MIPROv2's scale: ``dspy.Evaluate``'s, 100 times the mean, rounded to 2 decimals."""
    return None if score is None else round(100 * score, 2)


class CandidatePrograms(Sequence):
    """MIPROv2's ``candidate_programs``: ``{"score", "program", "full_eval": True, "instructions",
    "candidate_idx"}`` per candidate evaluated on the whole selection split, best first as the selection ranks
    them (:attr:`DetailedResults.ranking`); ``score`` on MIPROv2's scale (:func:`percent`), as code written for it
    reads it. Its programs are those of :attr:`DetailedResults.candidates`, built when
    first read, so the list costs nothing until used, and (not being a ``list``) it is not walked by
    ``named_sub_modules()`` when attached to the returned program."""

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
            "score": percent(score),
            "program": self._results.candidates[i],  # (the same programs as ``candidates``)
            "full_eval": True,
            "instructions": dict(self._results.instructions[i]),
            "candidate_idx": i,
        }

    def __repr__(self) -> str:
        shown = ", ".join(f"candidate {i}: {percent(s)}" for s, i in self._order)
        return f"CandidatePrograms([{shown}])"


def _best(subscores: Sequence[dict[int, float]]) -> dict[int, set[int]]:
    """Per example id, the candidates with the highest score on it among those scored there (ties included)."""
    best: dict[int, set[int]] = {}
    for example in sorted({example for scores in subscores for example in scores}):
        scored = {i: scores[example] for i, scores in enumerate(subscores) if example in scores}
        top = max(scored.values())
        best[example] = {i for i, score in scored.items() if score == top}
    return best


@dataclass(frozen=True)
class DetailedResults:
    """Every candidate of one run and how it scored, with the names and types of ``dspy.GEPA``'s ``DspyGEPAResult``
    (``candidates`` are programs, ``instructions`` their ``{step: text}`` maps): the instruction sets scored on the
    whole validation set (``unscored`` lists the others); ``best_idx`` is the candidate ``compile()`` returned.
    Read-only; ``to_dict()`` is plain JSON."""

    # -- dspy.GEPA's DspyGEPAResult fields (``candidates`` and ``discovery_eval_counts`` are properties below)
    instructions: tuple[dict[str, str], ...]
    """Each candidate's ``{step: text}`` map, candidate 0 the unchanged program (``candidates`` are the programs)."""
    parents: list[list[int | None]]
    """Per candidate, the indices of the candidates it was made from (two for a merge), as ``dspy.GEPA``'s
    ``parents``: ``[None]`` for the unchanged program and for a candidate whose parents were never scored on the
    whole split or not recorded (the agent's own edit)."""
    val_aggregate_scores: list[float]
    """Per candidate, its score on the whole validation set (the train set without one)."""
    val_subscores: list[dict[int, float]]
    """Per candidate, ``{example id: score}`` on the validation set (the train set without one), where it ran."""
    per_val_instance_best_candidates: dict[int, set[int]]
    """Per validation example id (train without a validation set), the candidates with its highest score there."""
    discovery_budget: tuple[int, ...]
    """Per candidate, the budget spent (in units) before it was first evaluated."""
    discovery_metric_calls: tuple[int, ...]
    """Per candidate, the metric calls (program runs, the baselines' included) made before it was first evaluated:
    ``dspy.GEPA``'s ``discovery_eval_counts``, on the scale of ``total_metric_calls``."""
    # -- ours
    train_aggregate_scores: tuple[float | None, ...]
    train_subscores: tuple[dict[int, float], ...]
    run_ids: tuple[tuple[str, ...], ...]
    per_train_example_best_candidates: dict[int, frozenset[int]]
    best_idx: int | None
    """The candidate ``compile()`` returned (the best checked on the selection split, never worse than the
    unchanged program); None until it returned one."""
    selection_split: str | None
    score: float | None
    baseline_score: float | None
    budget: dict[str, Any] | None
    usage: dict[str, Any] | None
    cost: float | None
    run_storage_dir: str
    status: str
    # -- dspy.GEPA's optional fields
    best_outputs_valset: dict[int, list[tuple[int, dspy.Prediction]]] | None = None
    """Asked for (``track_best_outputs=True``, or ``best_outputs=True`` here): per validation example id, ``(candidate,
    output)`` for each candidate with its highest score there, the output as a ``dspy.Prediction``; else None."""
    total_metric_calls: int | None = None
    """The program's runs on one example with the metric, every split and rollout, each counted once (a record
    reused for the same instructions is not counted again)."""
    num_full_val_evals: int | None = None
    """Evaluations of a candidate on the whole validation set (the train set without one): the candidates scored there."""
    seed: int | None = None
    """The compile's ``attempt`` (``seed`` in dspy.GEPA's words): every GEPA run's default seed; None when not recorded."""
    val_aggregate_subscores: list[dict[str, float]] | None = None
    """dspy.GEPA's multi-objective scores: None, a metric here has one objective."""
    per_objective_best_candidates: dict[str, set[int]] | None = None
    """dspy.GEPA's multi-objective fronts: None, a metric here has one objective."""
    objective_pareto_front: dict[str, float] | None = None
    """dspy.GEPA's multi-objective best scores: None, a metric here has one objective."""
    # -- ours
    ranking: tuple[int, ...] = ()
    """The candidates checked on the whole selection split, best first by the selection's rule."""
    candidate_ids: tuple[tuple[str, ...], ...] = ()
    """Per candidate, the candidate ids naming it (``proposal-N``, ``gepa-N``) in the order they were made."""
    lineage: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per candidate id: ``parents`` (candidate ids, a run id or ``'current'``), ``move``, ``run`` (the GEPA run),
    ``steps``, ``reflected_on`` (train example ids), ``made_for`` (a proposal written for a group of a failure
    analysis: ``{"analysis", "group", "example_ids"}``) as the moves recorded them, and ``candidate`` (the index of
    the candidate it stands for; None when it was never scored on the whole split)."""
    ancestry: tuple[dict[str, Any], ...] = ()
    """The returned candidate's ancestors, the unchanged program (or the oldest ancestor known) first and the
    returned candidate last: per generation ``label`` (its id, or ``"the unchanged program"``), ``id``,
    ``candidate``, ``move``, ``parents`` (labels), ``run``, ``steps``, ``changed_steps`` (what differs from its first
    parent), ``reflected_on``, ``made_for``, ``generation``, ``score`` (on the whole selection split), ``val_score`` and
    ``returned``, and ``run_ids`` (its runs: an ancestor never scored on the whole split has no ``candidate``). Empty
    until a candidate is returned."""
    unscored: tuple[dict[str, Any], ...] = ()
    """The instruction sets evaluated but never scored on the whole selection split (a GEPA child its minibatch
    rejected, a proposal compared on a few examples), which ``dspy.GEPA`` does not list either: each
    ``{"instructions", "candidate_ids", "parents" (indices of candidates), "run_ids", "train_subscores",
    "val_subscores"}``, in the order they were first evaluated."""
    program: Any = field(default=None, compare=False, repr=False)

    # -- building ----------------------------------------------------------------------------------
    @classmethod
    def from_run_directory(
        cls, directory: str | Path | RunDirectory, program: Any = None, best_outputs: bool = False
    ) -> DetailedResults:
        """Build from a run directory (any state). ``program``: the student, so ``candidates``,
        ``best_candidate`` and ``candidate_programs`` can give programs; ``best_outputs``: fill
        ``best_outputs_valset`` (``dspy.GEPA``'s ``track_best_outputs``)."""
        rundir = directory if isinstance(directory, RunDirectory) else read_run_directory(directory)
        index: dict[tuple, int] = {}
        candidates: list[dict[str, str]] = []
        subscores: dict[str, list[dict[int, float]]] = {"train": [], "val": []}
        outputs: dict[str, list[dict[int, dict[str, Any]]]] = {"train": [], "val": []}
        run_ids: list[list[str]] = []
        discovery: list[int] = []
        calls_before: list[int] = []
        metric_calls: set[tuple] = set()
        sizes: dict[str, int] = {}
        for run in rundir.runs:
            if run.label == "baseline":
                sizes[run.split] = run.requested_count
        for run in rundir.runs:
            key = _key(run.instructions)
            if key not in index:
                index[key] = len(candidates)
                candidates.append(dict(run.instructions))
                for split in ("train", "val"):
                    subscores[split].append({})
                    outputs[split].append({})
                run_ids.append([])
                discovery.append(max(0, rundir.spent_after(run) - run.budget_spent))
                calls_before.append(len(metric_calls))
            i = index[key]
            run_ids[i].append(run.run_id)
            metric_calls.update((key, run.split, run.rollout, record.example_id) for record in run.records)
            if run.rollout == 0:  # an extra rollout's sample never scores a candidate (one rule: selection.ranked)
                for record in run.records:
                    subscores[run.split][i][record.example_id] = record.score
                    outputs[run.split][i][record.example_id] = record.predicted
        selection = rundir.selection or {}
        full: dict[str, dict[int, float]] = {"train": {}, "val": {}}
        rank: dict[str, list[int]] = {}
        for split in ("val", "train"):
            order = ranked(
                first_sample_complete(rundir.runs, split, sizes.get(split, 0)),
                initial=rundir.initial_instructions or {},
                preferred=selection.get("submission_run_id"),
            )
            for run in order:
                full[split].setdefault(index[_key(run.instructions)], run.score)
            rank[split] = list(dict.fromkeys(index[_key(run.instructions)] for run in order))

        chosen = rundir.optimized_instructions
        named = Lineage(
            rundir.named_candidates,
            rundir.lineage,
            candidates,
            rundir.initial_instructions,
            {run.run_id: run.instructions for run in rundir.runs},
            rundir.prompt_versions,
        )
        # dspy.GEPA's val_ names: on the selection split (validation; train without it, as dspy.GEPA uses its trainset)
        split = selection.get("split") or ("val" if sizes.get("val") else "train")
        # the candidates are those scored on the whole split, as dspy.GEPA's pool; the rest are listed apart
        kept = [i for i in range(len(candidates)) if i in full[split]]
        new = {old: i for i, old in enumerate(kept)}
        best_idx = new.get(index.get(_key(chosen))) if chosen else None
        ancestry = []
        for node in named.ancestry(index.get(_key(chosen)) if chosen else None):
            i = node["candidate"]
            ancestry.append(
                {
                    **node,
                    "candidate": new.get(i),
                    "run_ids": list(run_ids[i]) if i is not None else [],
                    "score": full[split].get(i) if i is not None else None,
                    "val_score": full["val"].get(i) if i is not None else None,
                    "returned": best_idx is not None and i is not None and new.get(i) == best_idx,
                }
            )
        val_subscores = [dict(subscores[split][i]) for i in kept]
        best_val = _best(val_subscores)
        return cls(
            instructions=tuple(candidates[i] for i in kept),
            parents=[_parents(named, i, new) for i in kept],
            val_aggregate_scores=[full[split][i] for i in kept],
            val_subscores=val_subscores,
            per_val_instance_best_candidates=best_val,
            discovery_budget=tuple(discovery[i] for i in kept),
            discovery_metric_calls=tuple(calls_before[i] for i in kept),
            train_aggregate_scores=tuple(full["train"].get(i) for i in kept),
            train_subscores=tuple(subscores["train"][i] for i in kept),
            run_ids=tuple(tuple(run_ids[i]) for i in kept),
            per_train_example_best_candidates={
                e: frozenset(ids) for e, ids in _best([subscores["train"][i] for i in kept]).items()
            },
            best_idx=best_idx,
            selection_split=selection.get("split"),
            score=selection.get("chosen_score"),
            baseline_score=selection.get("baseline_score"),
            budget=rundir.budget,
            usage=rundir.usage,
            cost=rundir.cost,
            run_storage_dir=rundir.directory,
            status=rundir.status,
            best_outputs_valset=(
                {
                    example: [(i, dspy.Prediction(**outputs[split][kept[i]][example])) for i in sorted(ids)]
                    for example, ids in best_val.items()
                }
                if best_outputs
                else None
            ),
            total_metric_calls=len(metric_calls),
            num_full_val_evals=len(kept),
            seed=(rundir.result or {}).get("seed"),
            ranking=tuple(new[i] for i in rank[split]),
            candidate_ids=tuple(named.ids_of(i) for i in kept),
            lineage={
                name: {**entry, "candidate": new.get(named.candidate_of(name))}
                for name, entry in ((n, rundir.lineage.get(n, {})) for n in rundir.named_candidates)
            },
            ancestry=tuple(ancestry),
            unscored=tuple(
                {
                    "instructions": dict(candidates[i]),
                    "candidate_ids": list(named.ids_of(i)),
                    "parents": _parents(named, i, new),
                    "run_ids": list(run_ids[i]),
                    "train_subscores": dict(subscores["train"][i]),
                    "val_subscores": dict(subscores["val"][i]),
                }
                for i in range(len(candidates))
                if i not in new
            ),
            program=program,
        )

    # -- dspy.GEPA's views -------------------------------------------------------------------------
    @cached_property
    def candidates(self) -> list[Any]:
        """Every candidate as a program (a copy of ``program`` with its instructions and demos), as ``dspy.GEPA``'s
        ``candidates``; built once, when first read, on ``program`` as it is then (for the results compile() attaches,
        the returned program: an LM you set on its steps before reading them is theirs too).
        :class:`ConfigurationError` without a program."""
        return [self.build_program(i) for i in range(len(self.instructions))]

    @property
    def best_candidate(self) -> Any:
        """The returned program (``candidates[best_idx]``), as ``dspy.GEPA``'s; None until one was returned."""
        return self.candidates[self.best_idx] if self.best_idx is not None else None

    @property
    def discovery_eval_counts(self) -> list[int]:
        """``dspy.GEPA``'s name for :attr:`discovery_metric_calls`: the metric calls made before each candidate was
        first evaluated, the baselines' included, as gepa counts them (:attr:`discovery_budget` has the budget
        units)."""
        return list(self.discovery_metric_calls)

    @property
    def log_dir(self) -> str:
        """``dspy.GEPA``'s name for :attr:`run_storage_dir`."""
        return self.run_storage_dir

    @property
    def highest_score_achieved_per_val_task(self) -> dict[int, float]:
        """Per validation example id (train without a validation set), the highest score any candidate had there."""
        return {
            example: self.val_subscores[min(ids)][example]
            for example, ids in self.per_val_instance_best_candidates.items()
        }

    # -- ours --------------------------------------------------------------------------------------
    @property
    def pareto_front(self) -> list[int]:
        """Candidates that score best on at least one train example (ties included), in candidate order; dspy.GEPA's
        front, per validation example, is :attr:`per_val_instance_best_candidates`."""
        return sorted({i for ids in self.per_train_example_best_candidates.values() for i in ids})

    def __repr__(self) -> str:
        best = (
            f"best_idx={self.best_idx} ({self.val_aggregate_scores[self.best_idx]:.4f})"
            if self.best_idx is not None
            else "best_idx=None"
        )
        return (
            f"DetailedResults({len(self.instructions)} candidate(s) scored on the whole "
            f"{self.selection_split or 'val'} split, {len(self.unscored)} evaluated in part, {best}, "
            f"total_metric_calls={self.total_metric_calls}, status={self.status!r}, log_dir={self.log_dir!r})"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))

    @property
    def selection_scores(self) -> tuple[float | None, ...]:
        """Each candidate's score on the whole selection split (validation, or train without a valset)."""
        return tuple(self.val_aggregate_scores)

    @property
    def best_instructions(self) -> dict[str, str] | None:
        """The returned instructions, ``{step: text}`` (what ``best_candidate`` was before it was the program)."""
        return self.instructions[self.best_idx] if self.best_idx is not None else None

    def candidate_lineage(self, index: int) -> dict[str, dict[str, Any]]:
        """``{id: lineage}`` for every candidate id naming candidate ``index`` (empty when none does)."""
        return {name: self.lineage[name] for name in self.candidate_ids[index] if name in self.lineage}

    def instructions_of(self, candidate_id: str) -> dict[str, str] | None:
        """The ``{step: text}`` map candidate id ``candidate_id`` (``proposal-1``, ``gepa-3``) stands for, a candidate
        or one of ``unscored``; None when it names none (never evaluated)."""
        index = self.lineage.get(candidate_id, {}).get("candidate")
        if index is not None:
            return dict(self.instructions[index])
        found = [u["instructions"] for u in self.unscored if candidate_id in u["candidate_ids"]]
        return dict(found[0]) if found else None

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
                "DetailedResults.from_run_directory(run_dir, program=MyProgram()) or results.build_program(i, program); "
                "results.instructions has each candidate's {step: text}"
            )
        built = copy_program(base)  # (without the result attributes a returned program holds)
        apply_instructions(built, self.instructions[index], whole=True)
        return built

    def __getstate__(self) -> dict[str, Any]:
        """What a pickle or a deep copy keeps: not the candidate programs built so far (built again when read)."""
        state = dict(self.__dict__)
        state.pop("candidates", None)
        return state

    @property
    def candidate_programs(self) -> CandidatePrograms:
        """As ``MIPROv2``: every candidate evaluated on the whole selection split, best first, as
        ``{"score", "program", "full_eval": True, "instructions", "candidate_idx"}`` (see :class:`CandidatePrograms`)."""
        return CandidatePrograms(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON, with ``dspy.GEPA``'s ``to_dict()`` keys (``candidates`` as ``{step: text}`` maps, sets as sorted
        lists, outputs as dicts) and ours; example ids become string keys only when serialized by ``json``."""
        return {
            "candidates": [dict(c) for c in self.instructions],
            "parents": [list(p) for p in self.parents],
            "val_aggregate_scores": list(self.val_aggregate_scores),
            "best_outputs_valset": (
                {
                    example: [[i, dict(output.items())] for i, output in outputs]
                    for example, outputs in self.best_outputs_valset.items()
                }
                if self.best_outputs_valset is not None
                else None
            ),
            "val_subscores": [dict(s) for s in self.val_subscores],
            "per_val_instance_best_candidates": {
                example: sorted(ids) for example, ids in self.per_val_instance_best_candidates.items()
            },
            "val_aggregate_subscores": self.val_aggregate_subscores,
            "per_objective_best_candidates": self.per_objective_best_candidates,
            "objective_pareto_front": self.objective_pareto_front,
            "discovery_eval_counts": self.discovery_eval_counts,
            "total_metric_calls": self.total_metric_calls,
            "num_full_val_evals": self.num_full_val_evals,
            "log_dir": self.log_dir,
            "seed": self.seed,
            "best_idx": self.best_idx,
            "train_aggregate_scores": list(self.train_aggregate_scores),
            "train_subscores": [dict(s) for s in self.train_subscores],
            "run_ids": [list(ids) for ids in self.run_ids],
            "discovery_budget": list(self.discovery_budget),
            "discovery_metric_calls": list(self.discovery_metric_calls),
            "per_train_example_best_candidates": {
                example: sorted(ids) for example, ids in self.per_train_example_best_candidates.items()
            },
            "pareto_front": self.pareto_front,
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
            "unscored": [dict(entry) for entry in self.unscored],
        }


def _parents(named: Lineage, index: int, new: dict[int, int]) -> list[int | None]:
    """The indices (``new``: an instruction set's index among the candidates) of the candidates instruction set
    ``index`` was made from, as its ancestry names them (``[None]`` when none is known: the unchanged program, the
    agent's own edit, a parent never scored on the whole split)."""
    nodes = named.ancestry(index)
    if not nodes:
        return [None]
    by_label = {node["label"]: node["candidate"] for node in nodes}
    parents = [new.get(by_label.get(label)) for label in nodes[-1]["parents"]]
    known = [p for p in parents if p != new.get(index)]
    return known if any(p is not None for p in known) else [None]
