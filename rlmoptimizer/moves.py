"""The optimizer agent's moves: the steps fixed-algorithm optimizers make, each one call away.

GEPA's reflective proposal from traces and metric feedback (:meth:`Moves.propose_instructions`, built on
dspy's own ``dspy.teleprompt.gepa.InstructionProposer``), its paired comparison of candidates on the same
examples (:meth:`Moves.compare`) and its Pareto set of candidates (:meth:`Moves.candidates`); the failure
replay set (:meth:`Moves.hard_examples`), repeated rollouts for noisy scores (:meth:`Moves.evaluate_rollouts`)
and the contrast of two runs' traces for credit assignment (:meth:`Moves.diff_runs`).

The moves work over stored :class:`~rlmoptimizer.records.EvalRun` records and three small interfaces, so
they do not depend on where the agent's tools live:

* ``runs``: the run service (``get(run_id)``, ``runs()``, ``splits``, ``stored(instructions, split, ids,
  rollout)``);
* ``evaluate(instructions, split, ids, *, rollout, label, reservation)``: evaluate a full ``{step: text}``
  map on a copy of the program (the current prompts never change), store and return the run;
* ``ledger``: the :class:`~rlmoptimizer.budget.BudgetLedger`.

Budget, as everywhere: 1 unit per newly evaluated example per rollout, 1 unit per proposal LM call that
answered; stored records are reused free. A move that evaluates first works out what it will cost and
refuses, spending nothing, when the budget cannot cover all of it (a paired comparison on half its examples
would compare nothing). Refusals raise :class:`~rlmoptimizer.errors.AgentToolError` saying what was wrong
-> what to do.
"""

from __future__ import annotations

import contextvars
import copy
import json
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import dspy
from dspy.teleprompt.gepa import InstructionProposer

from rlmoptimizer.budget import SUB_LM_CALL, TRAIN_EXAMPLE, VAL_EXAMPLE, BudgetLedger, Reservation
from rlmoptimizer.errors import AgentToolError, BudgetExhaustedError
from rlmoptimizer.evaluation import classify_lm_failure, is_reusable, select_ids
from rlmoptimizer.fingerprint import apply_instructions, instructions_digest
from rlmoptimizer.records import EvalRun, ExampleResult, StepTrace

__all__ = ["MAX_PROPOSALS", "MAX_REFLECTION_EXAMPLES", "MAX_ROLLOUTS", "Moves", "program_evaluator", "reflective_example"]

MAX_ROLLOUTS = 10
"""The most samples per example one call may ask for."""
MAX_PROPOSALS = 8
"""The most candidate instructions one ``propose_instructions`` call may ask for."""
MAX_REFLECTION_EXAMPLES = 10
"""How many failures a proposal reflects on when no ids are given (GEPA reflects on a minibatch of 3)."""


class RunAccess(Protocol):
    splits: dict[str, list]

    def get(self, run_id: str) -> EvalRun: ...

    def runs(self) -> list[EvalRun]: ...

    def stored(self, instructions: dict[str, str], split: str, ids: Sequence[int], rollout: int = 0) -> dict[int, ExampleResult]: ...


EvaluateFn = Callable[..., EvalRun]
"""``evaluate(instructions, split, ids, *, rollout, label, reservation) -> EvalRun``."""


def _refuse(problem: str, fix: str) -> AgentToolError:
    return AgentToolError(f"{problem} -> {fix}")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def reflective_example(step: str, record: ExampleResult) -> dict[str, Any] | None:
    """One entry of GEPA's reflective dataset for ``step`` from a stored record, or None when the step did
    not run on that example.

    As ``dspy.GEPA`` builds it: the step's own inputs and generated outputs (its last call, when the program
    called it more than once) and a feedback text. Ours carries what GEPA's default feedback ("This
    trajectory got a score of ...") leaves out: the expected fields, the program's final output when it is
    not this step's, the error, and the metric's own feedback.
    """
    calls: list[StepTrace] = [s for s in record.steps if s.step_name == step]
    if not calls:
        return None
    call = calls[-1]
    lines = [f"Score: {record.score:g} ({'passed' if record.passed else 'did not pass'})."]
    if record.expected:
        lines.append(f"Expected (the example's labels): {_json(record.expected)}")
    if record.predicted and record.predicted != call.outputs:
        lines.append(f"The program's final output: {_json(record.predicted)}")
    if record.error:
        lines.append(f"Error: {record.error}")
    if record.feedback:
        lines.append(f"Metric feedback: {record.feedback}")
    return {"Inputs": dict(call.inputs), "Generated Outputs": dict(call.outputs), "Feedback": "\n".join(lines)}


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
                if is_reusable(record):
                    self.train.setdefault(record.example_id, {})[run.rollout] = record
        elif run.split == "val" and run.evaluated_count == val_size and run.rollout == 0:
            self.val_run = run

    def train_scores(self) -> dict[int, float]:
        return {i: _mean([r.score for r in by_rollout.values()]) for i, by_rollout in sorted(self.train.items())}


class Moves:
    """The moves of one optimization, over its runs, its ledger and an evaluate function."""

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
    ) -> None:
        self.runs = runs
        self._evaluate = evaluate
        self.ledger = ledger
        self.step_names = list(step_names)
        self._current = current
        self._check_map = check_map
        self._proposal_lm = proposal_lm

    # -- propose --------------------------------------------------------------------------------------
    def propose_instructions(
        self, step: str, run_id: str | None = None, ids: Any = None, n: int = 1, guidance: str = ""
    ) -> dict[str, Any]:
        """GEPA's reflective proposal for ``step``: new instructions written by dspy's InstructionProposer
        from the step's inputs and outputs on the selected examples of a train run, their expected fields,
        scores and metric feedback. Changes nothing; 1 budget unit per proposal LM call that answered."""
        self._check_step(step, "propose_instructions")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PROPOSALS:
            raise _refuse(f"n must be an int from 1 to {MAX_PROPOSALS}, got {n!r}", "pass n=1 (or a few more for alternatives)")
        if guidance is None:
            guidance = ""
        if not isinstance(guidance, str):
            raise _refuse(f"guidance must be a string, got {type(guidance).__name__}", "pass guidance='...' as text or leave it out")
        source, by_id = self._source(run_id, "propose_instructions")
        records = self._select_records(source, by_id, ids)
        dataset, skipped = [], []
        for record in records:
            entry = reflective_example(step, record)
            (dataset.append(entry) if entry is not None else skipped.append(record.example_id))
        if not dataset:
            raise _refuse(
                f"step {step!r} did not run on the selected examples of {source} (ids {[r.example_id for r in records]})",
                "pick examples where the step ran (see their 'steps'), or another step",
            )
        lm = self._lm()
        current = self._current()[step]
        proposer = InstructionProposer(additional_instructions=guidance.strip() or None)
        with self.ledger.reserve(n, SUB_LM_CALL) as reservation:
            if reservation.granted == 0:
                raise _refuse(
                    f"budget exhausted: a proposal costs 1 unit, {self.ledger.left} left",
                    "write instructions yourself with update_prompt, or SUBMIT",
                )
            lms = [lm if i == 0 else lm.copy(rollout_id=((lm.kwargs or {}).get("rollout_id") or 0) + i)
                   for i in range(reservation.granted)]
            outcomes = self._propose_all(proposer, lms, step, current, dataset, reservation)
            spent = reservation.spent
        texts = [text for text, _ in outcomes if text is not None]
        errors = [error for _, error in outcomes if error is not None]
        if not texts:
            raise _refuse(
                f"the proposal LM gave no usable instructions: {errors[0] if errors else 'no answer'}",
                "try again, pass guidance or other ids, or write the instructions yourself with update_prompt",
            )
        unique = list(dict.fromkeys(texts))
        notes = []
        if reservation.granted < n:
            notes.append(f"budget allowed {reservation.granted} of {n} proposals")
        if len(unique) < len(texts):
            notes.append(f"{len(texts) - len(unique)} proposal(s) repeated another (the proposal LM samples little)")
        if errors:
            notes.append(f"{len(errors)} proposal(s) failed: {errors[0]}")
        if skipped:
            notes.append(f"step {step!r} did not run on example(s) {skipped}; they were left out")
        used = [r.example_id for r in records if r.example_id not in skipped]
        return {
            "step": step,
            "from": source,
            "example_ids": used,
            "check_ids": used + self._others(used),
            "texts": unique,
            "candidates": [{step: text} for text in unique],
            "budget_spent": spent,
            "budget_left": self.ledger.left,
            "note": "; ".join(notes) or None,
        }

    def _propose_all(self, proposer, lms, step, current, dataset, reservation: Reservation) -> list[tuple[str | None, str | None]]:
        def one(lm) -> tuple[str | None, str | None]:
            try:
                with dspy.context(lm=lm):
                    text = proposer({step: current}, {step: dataset}, [step])[step]
            except Exception as exc:
                failure = classify_lm_failure(exc)
                if failure is None:  # the LM answered (e.g. a reply that does not parse): it was a call
                    reservation.spend(1)
                cause = failure[1] if failure else exc
                return None, f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
            reservation.spend(1)
            return text, None

        if len(lms) == 1:
            return [one(lms[0])]
        with ThreadPoolExecutor(max_workers=len(lms), thread_name_prefix="rlmoptimizer-propose") as pool:
            futures = [pool.submit(contextvars.copy_context().run, one, lm) for lm in lms]
            return [f.result() for f in futures]

    def _lm(self) -> dspy.BaseLM:
        lm = self._proposal_lm() if callable(self._proposal_lm) and not isinstance(self._proposal_lm, dspy.BaseLM) else self._proposal_lm
        lm = lm or dspy.settings.lm
        if lm is None:
            raise _refuse("no LM to write proposals with", "pass sub_lm=dspy.LM(...) to the optimizer")
        return lm

    # -- compare ----------------------------------------------------------------------------------------
    def compare(
        self,
        candidates: Any,
        split: str = "train",
        ids: Any = None,
        limit: int | None = None,
        sample: str | None = None,
        seed: int = 0,
        rollouts: int = 1,
    ) -> dict[str, Any]:
        """Evaluate several instruction sets on the same examples without changing the current prompts.
        Each candidate is 'current', a run id (that run's instructions) or a {step: text} map (steps left out
        keep their current text). Paired: every candidate sees the same examples, ``rollouts`` times each."""
        if isinstance(candidates, (str, dict)) or not isinstance(candidates, (list, tuple)) or not candidates:
            raise _refuse(
                f"candidates must be a non-empty list, got {type(candidates).__name__} {candidates!r:.80}",
                "pass a list like ['current', {'step': 'new text'}] or ['current', 'run-0003']",
            )
        resolved = [self._resolve(c, i) for i, c in enumerate(candidates)]
        example_ids = self._selection(split, ids, limit, sample, seed, "compare")
        rollouts = self._check_rollouts(rollouts, split)
        by_digest, spent = self._run_all([instr for _, instr in resolved], split, example_ids, rollouts, "compare")
        runs_of = [by_digest[instructions_digest(instr)] for _, instr in resolved]
        paired = _complete_ids(example_ids, [run for runs in runs_of for run in runs])
        rows = []
        for index, ((source, _), runs) in enumerate(zip(resolved, runs_of, strict=True)):
            rows.append({"candidate": index, "source": source, **self._aggregate(runs, paired, rollouts),
                         "run_ids": [run.run_id for run in runs]})
        best = max(range(len(rows)), key=lambda i: (rows[i]["score"], -i))
        result: dict[str, Any] = {"split": split, "rollouts": rollouts, "evaluated_count": len(paired)}
        notes = self._notes(runs_of, paired, example_ids)
        if split == "train":
            per_example = {c: self._per_example(runs) for c, runs in enumerate(runs_of)}
            examples = []
            for i in paired:
                entry = {"example_id": i, "scores": [per_example[c][i][0] for c in range(len(rows))]}
                if rollouts > 1:
                    entry["pass_rates"] = [per_example[c][i][1] for c in range(len(rows))]
                examples.append(entry)
            for c, row in enumerate(rows):
                mine = [e["scores"][c] for e in examples]
                first = [e["scores"][0] for e in examples]
                row["wins"] = sum(1 for a, b in zip(mine, first, strict=True) if a > b)
                row["losses"] = sum(1 for a, b in zip(mine, first, strict=True) if a < b)
                row["ties"] = sum(1 for a, b in zip(mine, first, strict=True) if a == b)
            result["example_ids"] = paired
            result["examples"] = examples
        result.update({"candidates": rows, "best": best, "best_instructions": dict(resolved[best][1]),
                       "budget_spent": spent, "budget_left": self.ledger.left,
                       "note": "; ".join(notes) or None})
        return result

    def evaluate_rollouts(self, instructions: dict[str, str], split: str, example_ids: list[int], rollouts: int,
                          label: str = "agent") -> dict[str, Any]:
        """``rollouts`` independent samples of ``instructions`` on ``example_ids``: the first rollout's run view
        (records of train examples) plus every rollout's scores, per-example pass rate, the examples that
        failed in every rollout and those that passed only sometimes. Charged in full or refused."""
        rollouts = self._check_rollouts(rollouts, split)
        by_digest, spent = self._run_all([instructions], split, example_ids, rollouts, label)
        runs = by_digest[instructions_digest(instructions)]
        view = runs[0].agent_view()
        view.update({
            **self._aggregate(runs, example_ids, rollouts),
            "rollouts": rollouts,
            "run_ids": [run.run_id for run in runs],
            "budget_spent": spent,
            "budget_left": self.ledger.left,
        })
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

    def _run_all(self, instruction_sets: list[dict[str, str]], split: str, example_ids: list[int], rollouts: int,
                 label: str) -> tuple[dict[str, list[EvalRun]], int]:
        """Evaluate each distinct instruction set ``rollouts`` times on ``example_ids``; all or nothing on budget.
        Returns ({digest: [run of each rollout]}, units spent)."""
        distinct: dict[str, dict[str, str]] = {}
        for instructions in instruction_sets:
            distinct.setdefault(instructions_digest(instructions), instructions)
        cost = sum(len(example_ids) - len(self.runs.stored(instr, split, example_ids, r))
                   for instr in distinct.values() for r in range(rollouts))
        kind = TRAIN_EXAMPLE if split == "train" else VAL_EXAMPLE
        try:
            reservation = self.ledger.reserve_exactly(cost, kind)
        except BudgetExhaustedError:
            stored = len(distinct) * rollouts * len(example_ids) - cost
            raise _refuse(
                f"this needs {cost} budget unit(s) ({len(distinct)} instruction set(s) x {len(example_ids)} example(s) x "
                f"{rollouts} rollout(s), {stored} already stored and free) but {self.ledger.left} are left",
                "select fewer examples (ids=..., limit=...), fewer candidates or rollouts",
            ) from None
        done: dict[str, list[EvalRun]] = {}
        with reservation:
            for digest, instructions in distinct.items():
                done[digest] = [
                    self._evaluate(instructions, split, list(example_ids), rollout=r, label=label, reservation=reservation)
                    for r in range(rollouts)
                ]
        return done, reservation.spent

    @staticmethod
    def _records_by_example(runs: list[EvalRun]) -> dict[int, list[ExampleResult]]:
        out: dict[int, list[ExampleResult]] = {}
        for run in runs:
            for record in run.records:
                out.setdefault(record.example_id, []).append(record)
        return out

    def _per_example(self, runs: list[EvalRun]) -> dict[int, tuple[float, float]]:
        """example id -> (mean score, pass rate) over the rollouts."""
        return {i: (_mean([r.score for r in recs]), _mean([1.0 if r.passed else 0.0 for r in recs]))
                for i, recs in sorted(self._records_by_example(runs).items())}

    def _aggregate(self, runs: list[EvalRun], ids: list[int], rollouts: int) -> dict[str, Any]:
        wanted = set(ids)
        per_example = {i: v for i, v in self._per_example(runs).items() if i in wanted}
        out = {
            "score": _mean([score for score, _ in per_example.values()]),
            "passed_count": sum(1 for _, rate in per_example.values() if rate == 1.0),
            "evaluated_count": len(per_example),
        }
        if rollouts > 1:
            out["pass_rate"] = _mean([rate for _, rate in per_example.values()])
        return out

    @staticmethod
    def _notes(runs_of: list[list[EvalRun]], paired: list[int], example_ids: list[int]) -> list[str]:
        notes = []
        if len(paired) < len(example_ids):
            notes.append(f"{len(example_ids) - len(paired)} example(s) lack a record for some candidate or rollout "
                         "(see each run's note); results are over the examples every one has")
        failed_calls = sum(1 for runs in runs_of for run in runs for r in run.records if not is_reusable(r))
        if failed_calls:
            notes.append(f"{failed_calls} evaluation(s) failed in the LM call itself (score 0, not charged); "
                         "they are tried again next time")
        return notes

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
                change = {"example_id": i, "score_a": ra.score, "score_b": rb.score, **_first_difference(ra.steps, rb.steps)}
                (fixed if rb.passed else broken).append(change)
        changed_steps = sorted(s for s in set(a.instructions) | set(b.instructions)
                               if a.instructions.get(s) != b.instructions.get(s))
        return {
            "run_a": a.run_id,
            "run_b": b.run_id,
            "instructions_changed": changed_steps,
            "shared_count": len(shared),
            "score_a": _mean([recs_a[i].score for i in shared]),
            "score_b": _mean([recs_b[i].score for i in shared]),
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
        for run in self.runs.runs():
            digest = instructions_digest(run.instructions)
            if digest not in by_digest:
                by_digest[digest] = _Candidate(len(by_digest), dict(run.instructions))
            by_digest[digest].add(run, val_size)
        return list(by_digest.values())

    def _best(self, cands: list[_Candidate]) -> tuple[_Candidate | None, str]:
        """Best on validation when any candidate was checked there; else best on the whole train split."""
        checked = [c for c in cands if c.val_run is not None]
        if checked:
            return max(checked, key=lambda c: (c.val_run.score, -c.index)), "val"
        train_size = len(self.runs.splits.get("train", ()))
        full = [c for c in cands if len(c.train) == train_size and train_size]
        if full:
            return max(full, key=lambda c: (_mean(list(c.train_scores().values())), -c.index)), "train"
        return None, ""

    def candidates(self) -> dict[str, Any]:
        """Every instruction set evaluated so far with its train scores (where known), its validation score,
        and the Pareto front: the candidates best on at least one train example, after removing those whose
        every such example another front candidate also wins (as GEPA keeps its candidate pool). Free."""
        cands = self._candidates()
        scores = {c.index: c.train_scores() for c in cands}
        aggregate = {c.index: _mean(list(scores[c.index].values())) for c in cands}
        fronts: dict[int, set[int]] = {}
        for i in sorted({i for s in scores.values() for i in s}):
            have = {c: s[i] for c, s in scores.items() if i in s}
            top = max(have.values())
            fronts[i] = {c for c, v in have.items() if v == top}
        fronts = _remove_dominated(fronts, aggregate)
        on_front = sorted({c for front in fronts.values() for c in front})
        best, best_split = self._best(cands)
        current = instructions_digest(self._current())
        rows = []
        for c in cands:
            rows.append({
                "candidate": c.index,
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
            })
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
        rows = [{"example_id": i, "failed": f, "evaluated": n, "fail_rate": f / n}
                for i, (f, n) in counts.items() if f]
        rows.sort(key=lambda r: (-r["failed"], -r["fail_rate"], r["example_id"]))
        return {
            "best_candidate": best.index if best is not None else None,
            "best_by": best_split or None,
            "failing_under_best": failing,
            "examples": rows,
        }

    # -- helpers --------------------------------------------------------------------------------------
    def _check_step(self, step: Any, tool: str) -> None:
        if not isinstance(step, str) or step not in self.step_names:
            raise _refuse(f"{tool}: unknown step name {step!r}", f"use one of {self.step_names}")

    def _get_run(self, run_id: Any) -> EvalRun:
        try:
            return self.runs.get(str(run_id))
        except KeyError:
            known = [run.run_id for run in self.runs.runs()]
            raise _refuse(f"no run with id {run_id!r}", f"use one of {known}") from None

    def _train_run(self, run_id: Any, tool: str) -> EvalRun:
        run = self._get_run(run_id)
        if run.split != "train":
            raise _refuse(f"{tool}: run {run.run_id} is a {run.split} run", "pass a train run id (validation examples are not shown)")
        return run

    def _source(self, run_id: Any, tool: str) -> tuple[str, dict[int, ExampleResult]]:
        """Where a proposal's examples come from: the given train run; by default every first-rollout train
        record of the current instructions (the latest per example), else the latest train run."""
        if run_id is not None:
            run = self._train_run(run_id, tool)
            return f"run {run.run_id}", {r.example_id: r for r in run.records}
        train = [run for run in self.runs.runs() if run.split == "train" and run.records]
        if not train:
            raise _refuse(f"{tool}: no train run yet", "call evaluate_program() first")
        digest = instructions_digest(self._current())
        mine = [run for run in train if run.rollout == 0 and instructions_digest(run.instructions) == digest]
        if mine:
            merged = {r.example_id: r for run in mine for r in run.records if is_reusable(r)}
            return "the current instructions' train records", dict(sorted(merged.items()))
        return f"run {train[-1].run_id}", {r.example_id: r for r in train[-1].records}

    def _others(self, used: list[int]) -> list[int]:
        """A random sample of other train ids, as many as ``used`` (at least 5): the check that a proposal
        fixing these failures breaks nothing else. Reproducible for a given number of stored runs."""
        rest = [i for i in range(len(self.runs.splits["train"])) if i not in set(used)]
        rng = random.Random(len(self.runs.runs()))
        return sorted(rng.sample(rest, min(len(rest), max(5, len(used)))))

    def _select_records(self, source: str, by_id: dict[int, ExampleResult], ids: Any) -> list[ExampleResult]:
        if ids is None:
            failed = [r for r in by_id.values() if not r.passed]
            if not failed:
                raise _refuse(
                    f"{source} show no failures to learn from",
                    "evaluate new examples first (evaluate_program(sample='random', limit=10, seed=1)), pass "
                    "ids=[...] of examples to reflect on, or run_id= of a run with failures",
                )
            if len(failed) > MAX_REFLECTION_EXAMPLES:
                failed = sorted(random.Random(0).sample(failed, MAX_REFLECTION_EXAMPLES), key=lambda r: r.example_id)
            return failed
        try:
            wanted = select_ids(len(self.runs.splits["train"]), ids=ids)
        except ValueError as exc:
            raise _refuse(str(exc), "pass ids like [3, 7] or '3,7'") from None
        missing = [i for i in wanted if i not in by_id]
        if missing:
            raise _refuse(
                f"example(s) {missing} were not evaluated in {source}",
                f"pick ids from {sorted(by_id)}, or pass run_id= of a run that evaluated them",
            )
        return [by_id[i] for i in wanted]

    def _resolve(self, candidate: Any, index: int) -> tuple[str, dict[str, str]]:
        current = self._current()
        if isinstance(candidate, str):
            if candidate == "current":
                return "current", current
            if candidate.startswith("run-"):
                run = self._get_run(candidate)
                return candidate, dict(run.instructions)
        if isinstance(candidate, dict):
            if not candidate:
                raise _refuse(f"candidate {index} is an empty dict", "give at least one {step: text} entry, or 'current'")
            checked = self._check_map(candidate) if self._check_map is not None else dict(candidate)
            return "map", {**current, **checked}
        raise _refuse(
            f"candidate {index} is {type(candidate).__name__} {candidate!r:.80}",
            "each candidate is 'current', a run id like 'run-0003', or a {step: text} dict",
        )

    def _selection(self, split: str, ids: Any, limit: Any, sample: Any, seed: Any, tool: str) -> list[int]:
        if split not in self.runs.splits:
            raise _refuse(f"{tool}: unknown split {split!r}", f"use one of {sorted(self.runs.splits)}")
        size = len(self.runs.splits[split])
        if split == "val":
            if any(v is not None for v in (ids, limit, sample)):
                raise _refuse(
                    f"{tool}: validation always runs on the whole split and takes no selection",
                    f"call {tool}(..., split='val') without ids, limit or sample",
                )
            return list(range(size))
        try:
            selected = select_ids(size, limit=limit, sample=sample, seed=seed, ids=ids)
        except ValueError as exc:
            raise _refuse(str(exc), f"fix the selection arguments and call {tool} again") from None
        if not selected:
            raise _refuse(f"{tool}: the selection is empty", "select at least one example (ids=..., limit=N)")
        return selected

    @staticmethod
    def _check_rollouts(rollouts: Any, split: str) -> int:
        if isinstance(rollouts, bool) or not isinstance(rollouts, int) or not 1 <= rollouts <= MAX_ROLLOUTS:
            raise _refuse(f"rollouts must be an int from 1 to {MAX_ROLLOUTS}, got {rollouts!r}", "pass rollouts=3 for example")
        if split == "val" and rollouts != 1:
            raise _refuse(
                "validation takes one sample per example (it is the checkpoint the final program is chosen by)",
                "use rollouts on split='train'; call validation with rollouts=1",
            )
        return rollouts


def _complete_ids(example_ids: list[int], runs: list[EvalRun]) -> list[int]:
    """The ids that every run has a record for."""
    have = [{r.example_id for r in run.records} for run in runs]
    return [i for i in example_ids if all(i in ids for ids in have)]


def program_evaluator(program: dspy.Module, runs: Any, on_run: Callable[[EvalRun], None] | None = None) -> EvaluateFn:
    """An ``evaluate`` for :class:`Moves` that runs ``instructions`` on a fresh copy of ``program`` through the
    run service ``runs`` (so the program itself, and its current prompts, never change)."""

    def evaluate(instructions: dict[str, str], split: str, ids: list[int], *, rollout: int = 0, label: str = "agent",
                 reservation: Reservation | None = None) -> EvalRun:
        candidate = copy.deepcopy(program)
        apply_instructions(candidate, instructions)
        run = runs.evaluate(candidate, split, label=label, ids=ids, rollout=rollout, reservation=reservation)
        if on_run is not None:
            on_run(run)
        return run

    return evaluate


def _first_difference(a: Sequence[StepTrace], b: Sequence[StepTrace]) -> dict[str, Any]:
    """The first step call whose outputs differ between two traces of one example, with both outputs."""
    for index, (sa, sb) in enumerate(zip(a, b, strict=False)):
        if sa.step_name != sb.step_name or sa.outputs != sb.outputs:
            return {"first_changed_step": sb.step_name, "call": index, "outputs_a": sa.outputs, "outputs_b": sb.outputs}
    if len(a) != len(b):
        index = min(len(a), len(b))
        longer = a if len(a) > len(b) else b
        return {"first_changed_step": longer[index].step_name, "call": index,
                "outputs_a": a[index].outputs if index < len(a) else None,
                "outputs_b": b[index].outputs if index < len(b) else None}
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
