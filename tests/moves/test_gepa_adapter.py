"""What gepa's engine sees of a compile (``rlmoptimizer.moves.gepa_adapter``), driven the way gepa's
reflective proposer drives it: the parent on a minibatch, then a child announced by ``on_evaluation_start``.

The program is a table of scores (instructions -> example -> score); runs are kept as the store keeps them, so a
stored record is free and every new one is charged 1 unit of a real ledger."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlmoptimizer.budget import BudgetLedger
from rlmoptimizer.moves.gepa_adapter import Adapter, Slice, Stop
from rlmoptimizer.records import ExampleResult

PARENT = {"route": "Route the ticket."}
CHILD = {"route": "Route the ticket, carefully."}


class Program:
    """Scores by instructions and example; every run it makes is recorded, every record kept for reuse."""

    def __init__(self, scores: dict[str, dict[int, float]]) -> None:
        self.scores = scores
        self.runs: list[tuple[str, list[int]]] = []
        self.kept: dict[tuple[str, int], ExampleResult] = {}
        self.splits = {"train": list(range(20))}

    def stored(self, instructions, split, ids, rollout=0):
        found = {i: self.kept.get((instructions["route"], i)) for i in ids}
        return {i: r for i, r in found.items() if r is not None}

    def evaluate(self, instructions, split, ids, *, label, reservation):
        text = instructions["route"]
        new = [i for i in ids if (text, i) not in self.kept]
        assert len(set(ids)) == len(ids), f"an example ran twice in one run: {ids}"
        self.runs.append((text, list(ids)))
        for i in new:
            score = self.scores[text][i]
            self.kept[(text, i)] = ExampleResult(i, {}, {}, {"queue": "q"}, score, score >= 1.0)
        reservation.spend(len(new))
        return SimpleNamespace(records=[self.kept[(text, i)] for i in ids], note="")


def adapter_over(program: Program, units: int = 100, bound: float | None = 1.0) -> tuple[Adapter, Slice]:
    budget = Slice(BudgetLedger(units), units)
    adapter = Adapter(
        program, program.evaluate, lambda instructions: False, {}, budget, lambda: bound, propose=lambda *a: ""
    )
    return adapter, budget


def propose(adapter: Adapter, batch: list[int]):
    """One reflective step as gepa takes it: the parent with traces, then its announced child."""
    data = [("train", i) for i in batch]
    before = adapter.evaluate(data, PARENT, capture_traces=True)
    adapter.expect_child(data, PARENT)
    after = adapter.evaluate(data, CHILD, capture_traces=True)
    return before, after


@pytest.mark.parametrize(
    ("parent", "child", "child_runs", "kept"),
    [
        # the parent passed 2 of 3: the child fails the one it failed, so it cannot win: 1 call, not 3
        ({0: 1.0, 1: 0.0, 2: 1.0}, {0: 1.0, 1: 0.0, 2: 1.0}, [[1]], False),
        # it passes that one: it could still win, so it runs on the rest and wins
        ({0: 1.0, 1: 0.0, 2: 1.0}, {0: 1.0, 1: 1.0, 2: 1.0}, [[1], [0, 2]], True),
        # it passes that one but loses one the parent passed: all 3 run, and the sum does not beat the parent's
        ({0: 1.0, 1: 0.0, 2: 1.0}, {0: 0.0, 1: 1.0, 2: 1.0}, [[1], [0, 2]], False),
        # the parent failed everything: nothing can be skipped
        ({0: 0.0, 1: 0.0, 2: 0.0}, {0: 0.0, 1: 0.0, 2: 0.0}, [[0, 1, 2]], False),
        # graded scores: the parent's lowest first; 0.2 + 0.3 + at most 1.0 cannot beat 0.5 + 0.9 + 1.0
        ({0: 1.0, 1: 0.9, 2: 0.5}, {0: 1.0, 1: 0.3, 2: 0.2}, [[2, 1]], False),
    ],
)
def test_a_child_runs_where_its_parent_failed_first_and_only_as_far_as_it_can_still_win(
    parent, child, child_runs, kept
):
    program = Program({PARENT["route"]: parent, CHILD["route"]: child})
    adapter, budget = adapter_over(program)

    before, after = propose(adapter, [0, 1, 2])

    assert [ids for text, ids in program.runs if text == CHILD["route"]] == child_runs
    # gepa's rule (StrictImprovementAcceptance) decides as it would have with every example run
    assert (sum(after.scores) > sum(before.scores)) is kept
    assert sum(after.scores) <= sum(before.scores) or after.scores == [child[i] for i in (0, 1, 2)]
    ran = sum(len(ids) for _, ids in program.runs)
    assert after.num_metric_calls + before.num_metric_calls == ran == budget.spent
    assert adapter.cut_short == (1 if len(child_runs) == 1 and len(child_runs[0]) < 3 else 0)
    assert adapter.children == [(PARENT, CHILD, [0, 1, 2])]  # scored on its minibatch: its lineage is known


def test_an_example_drawn_twice_in_a_minibatch_runs_once_and_counts_twice_in_the_sums():
    # gepa pads the last minibatch of an epoch; here with example 1, which the parent failed
    program = Program({PARENT["route"]: {0: 1.0, 1: 0.0}, CHILD["route"]: {0: 1.0, 1: 0.0}})
    adapter, budget = adapter_over(program)

    before, after = propose(adapter, [0, 1, 1])

    assert program.runs == [(PARENT["route"], [0, 1]), (CHILD["route"], [1])]
    assert before.scores == [1.0, 0.0, 0.0] and before.num_metric_calls == 2
    assert adapter.cut_short == 1 and after.num_metric_calls == 1 == budget.spent - 2
    assert sum(after.scores) <= sum(before.scores)


def test_a_child_whose_parent_has_no_stored_minibatch_is_scored_whole():
    program = Program({PARENT["route"]: {0: 1.0, 1: 0.0, 2: 1.0}, CHILD["route"]: {0: 1.0, 1: 0.0, 2: 1.0}})
    adapter, _ = adapter_over(program)
    data = [("train", i) for i in (0, 1, 2)]

    adapter.expect_child(data, PARENT)  # announced, but the parent was never run on it
    after = adapter.evaluate(data, CHILD, capture_traces=True)

    assert program.runs == [(CHILD["route"], [0, 1, 2])] and after.scores == [1.0, 0.0, 1.0]
    assert adapter.cut_short == 0


def test_without_a_known_highest_score_a_child_runs_whole():
    program = Program({PARENT["route"]: {0: 1.0, 1: 0.0, 2: 1.0}, CHILD["route"]: {0: 1.0, 1: 0.0, 2: 1.0}})
    adapter, _ = adapter_over(program, bound=None)  # e.g. a metric on 0-5 (pass_threshold=5)

    propose(adapter, [0, 1, 2])

    assert program.runs[-1] == (CHILD["route"], [0, 1, 2]) and adapter.cut_short == 0


def test_a_child_whose_minibatch_the_slice_cannot_pay_whole_pays_nothing():
    program = Program({PARENT["route"]: {0: 1.0, 1: 0.0, 2: 1.0}, CHILD["route"]: {0: 1.0, 1: 1.0, 2: 1.0}})
    adapter, budget = adapter_over(program, units=5)  # the parent takes 3: 2 left, the child needs 3
    data = [("train", i) for i in (0, 1, 2)]
    adapter.evaluate(data, PARENT, capture_traces=True)
    adapter.expect_child(data, PARENT)

    with pytest.raises(Stop, match="ran out"):
        adapter.evaluate(data, CHILD, capture_traces=True)

    # not its first wave either: a child that might win is never paid for in part and then left unjudged
    assert [text for text, _ in program.runs] == [PARENT["route"]] and budget.spent == 3
    assert adapter.children == []  # never scored: not a child gepa kept or rejected


def test_an_announcement_is_for_its_own_iteration_only():
    program = Program({PARENT["route"]: {0: 1.0, 1: 0.0, 2: 1.0}, CHILD["route"]: {0: 1.0, 1: 0.0, 2: 1.0}})
    adapter, _ = adapter_over(program)
    data = [("train", i) for i in (0, 1, 2)]
    adapter.evaluate(data, PARENT, capture_traces=True)
    adapter.expect_child(data, PARENT)
    adapter.new_iteration()  # the announced child was never scored (its iteration stopped)

    adapter.evaluate(data, CHILD, capture_traces=True)

    assert program.runs[-1] == (CHILD["route"], [0, 1, 2]) and adapter.cut_short == 0
