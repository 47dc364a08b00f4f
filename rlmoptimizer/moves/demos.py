"""Demonstrations from the program's own successes: a candidate that sets steps' demos to the inputs and outputs
each step produced on train examples the program got right (MIPROv2's bootstrapped demos, ICRL's retrieved
successes), compared and adopted like any candidate.

Where demos come from: the first-rollout train records of the current instructions (or of one train run), the
examples that passed; a step's demo is that step's own call on the example, so an inner step of a pipeline gets
the inputs it really saw (a step called several times on one example, as ReAct's is, gives its demos calls spread
over its positions: the first demo its first call, the last its last). Validation records are never
read: only train records hold traces the moves can see.

Which ones: :func:`choose_demos`, a policy in code. It covers the labels the current instructions fail most
(an example whose expected fields match a failing example's come first), then varies the labels, round robin,
so ``k`` demos are not ``k`` copies of the commonest answer.

A demo sees its own answer: an example that is a demo of a candidate is left out of every train comparison that
candidate is in (:meth:`DemoMoves.demo_sources`), so its score is never evidence for the candidate that holds it.

May import: ``rlmoptimizer.fingerprint``, ``.inputs``, ``.records`` and ``rlmoptimizer.moves.context``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from rlmoptimizer.fingerprint import MAX_DEMOS_CHARS, canonical_json, demos_key, instructions_digest, sha256_json
from rlmoptimizer.inputs import MAX_DEMOS
from rlmoptimizer.moves.context import MoveContext, refuse
from rlmoptimizer.records import ExampleResult


def _label(record: ExampleResult) -> str:
    return canonical_json(record.expected)


def choose_demos(records: Sequence[ExampleResult], k: int, seed: int = 0) -> list[int]:
    """The ids of at most ``k`` passing records to use as demos: first those whose labels (expected fields) the
    failing records have, the most failed label first; then the other labels; one example per label in turn, in a
    reproducible shuffle (``seed``) within each label. Examples with the same inputs count once."""
    passed = [r for r in records if r.passed]
    failing: dict[str, int] = {}
    for r in records:
        if not r.passed:
            failing[_label(r)] = failing.get(_label(r), 0) + 1
    by_label: dict[str, list[int]] = {}
    seen: set[str] = set()
    for r in sorted(passed, key=lambda r: r.example_id):
        key = canonical_json(r.inputs)
        if key not in seen:  # a duplicated example is one demo (k demos are k different examples)
            seen.add(key)
            by_label.setdefault(_label(r), []).append(r.example_id)
    rng = random.Random(seed)
    for ids in by_label.values():
        rng.shuffle(ids)
    order = sorted(by_label, key=lambda label: (-failing.get(label, 0), -len(by_label[label]), label))
    chosen: list[int] = []
    while len(chosen) < k and any(by_label[label] for label in order):
        for label in order:
            if by_label[label] and len(chosen) < k:
                chosen.append(by_label[label].pop(0))
    return chosen


class DemoMoves(MoveContext):
    max_demos: int = 4
    """The demos a step gets by default; 0 switches the move off (the constructor's ``max_demos``)."""

    def propose_demos(self, step: Any = None, k: int | None = None, run_id: Any = None) -> dict[str, Any]:
        """A candidate ('demos-N') that gives ``step`` (every step when None) ``k`` demos from the train examples
        the current instructions (or ``run_id``) got right. Free: no LM call, no evaluation."""
        if not self.max_demos:
            raise refuse(
                "propose_demos: demos are switched off for this compile (max_demos=0)",
                "improve the instructions instead (propose_instructions)",
            )
        k = self.max_demos if k is None else k
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_DEMOS:
            raise refuse(f"propose_demos: k must be an int from 1 to {MAX_DEMOS}, got {k!r}", "pass k=4 for example")
        steps = list(self.step_names) if step is None else [step]
        for name in steps:
            self._check_step(name, "propose_demos")
        source, by_id = self._demo_source(run_id)
        records = [r for r in by_id.values() if r.reusable and r.example_id not in self._in_validation()]
        # drawn from what it is drawn from (a count of candidates, which a killed process had changed, drew others
        # on resume, and the comparison then paid for other examples): the same state gives the same candidate
        state = sha256_json([instructions_digest(self._current()), steps, k, sorted(r.example_id for r in records)])
        by_step: dict[str, list[int]] = {}
        for name in steps:  # each step's demos from the passing examples it ran on (a branch runs on some only)
            usable = [r for r in records if not r.passed or self._call(r, name)]
            chosen = choose_demos(usable, k, seed=int(state[:16], 16))  # one seed: a pipeline's steps share examples
            while chosen and len(canonical_json(self._demos(by_id, chosen, name))) > MAX_DEMOS_CHARS:
                chosen.pop()  # long documents: fewer demos, as many as the limit takes
            if chosen:
                by_step[name] = chosen
        if not by_step:
            raise refuse(
                f"propose_demos: {source} hold no passing example where {steps if step is None else step!r} ran",
                "evaluate more train examples first (evaluate_program(sample='random', limit=10, seed=1))",
            )
        left_out = [name for name in steps if name not in by_step]
        steps = list(by_step)
        lists = list(dict.fromkeys(tuple(ids) for ids in by_step.values()))
        chosen = list(lists[0]) if len(lists) == 1 else sorted({i for ids in lists for i in ids})
        where = (
            f"{len(chosen)} demo(s) for {steps} from train examples {chosen}"
            if len(lists) == 1
            else "; ".join(
                f"{len(ids)} demo(s) for {name!r} from train examples {ids}" for name, ids in by_step.items()
            )
        )
        mapping = {demos_key(name): canonical_json(self._demos(by_id, ids, name)) for name, ids in by_step.items()}
        with self._naming:
            same = [name for name, known in self.proposals.items() if name.startswith("demos-") and known == mapping]
            if same:  # proposed before (in this process, or in one a resume continues): the same candidate
                candidate = same[0]
            else:
                self.demo_calls = getattr(self, "demo_calls", 0) + 1
                candidate = f"demos-{self.demo_calls}"
                while candidate in self.proposals:
                    self.demo_calls += 1
                    candidate = f"demos-{self.demo_calls}"
                self.proposals[candidate] = mapping
        self.lineage[candidate] = {
            "parents": [self.name_of(self._current())],
            "move": "propose_demos",
            "steps": steps,
            "demo_ids": chosen,
            "source": source,
        }
        failing = sorted(r.example_id for r in records if not r.passed)
        others = sorted(r.example_id for r in records if r.passed and r.example_id not in set(chosen))
        labels = sorted({_label(by_id[i]) for i in chosen})
        return {
            "candidate_ids": [candidate],
            "steps": steps,
            "demo_ids": chosen,
            "labels": [json.loads(label) for label in labels],
            "check_ids": failing + others,
            "failure_ids": failing,
            "summary": (
                f"{candidate}: {where} ({source})"
                + (f"; none for {left_out}: it ran on no passing example" if left_out else "")
                + ", "
                f"{len(labels)} distinct label(s); compare it on other examples (its demos are left out of its "
                "comparisons), then adopt_candidate it if it wins"
            ),
        }

    @classmethod
    def _demos(cls, by_id: dict[int, ExampleResult], ids: list[int], step: str) -> list[dict[str, Any]]:
        """The demos of ``step`` from the train records ``ids``: the inputs and outputs of one of its calls. A step
        called several times on one example (ReAct's loop, a step asked again) gives calls spread over its
        positions, the first demo its first call and the last its last, so that the demos show each kind of call
        (only last calls would show ReAct only finishing), as ``dspy.BootstrapFewShot`` mixes earlier calls in."""
        demos = []
        for position, i in enumerate(ids):
            call = cls._call(by_id[i], step, position / (len(ids) - 1) if len(ids) > 1 else 1.0)
            demos.append({**call.inputs, **call.outputs})
        return demos

    @staticmethod
    def _call(record: ExampleResult, step: str, where: float = 1.0) -> Any:
        """The call of ``step`` at ``where`` (0: its first on this example, 1: its last), None when it did not run."""
        calls = [s for s in record.steps if s.step_name == step]
        return calls[round(where * (len(calls) - 1))] if calls else None

    def _demo_source(self, run_id: Any) -> tuple[str, dict[int, ExampleResult]]:
        if run_id is not None:
            run = self._train_run(run_id, "propose_demos")
            return f"run {run.run_id}", {r.example_id: r for r in run.records}
        digest = instructions_digest(self._current())
        mine = [
            run
            for run in self.runs.all()
            if run.split == "train" and run.rollout == 0 and instructions_digest(run.instructions) == digest
        ]
        if not mine:
            raise refuse(
                "propose_demos: the current instructions have no train run yet",
                "call evaluate_program() (or evaluate_program(limit=10)) first",
            )
        merged = {r.example_id: r for run in mine for r in run.records}
        return "the current instructions' train records", dict(sorted(merged.items()))
