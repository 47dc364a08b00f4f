"""One rule ranks candidates everywhere: a candidate's score on the selection split is its first sample (rollout 0)
on the whole split. Regression: without a valset, instructions that passed only on an extra rollout were scored
0.0 by the selection but 1.0 by ``detailed_results``, and ``candidate_programs[0]`` (what code written for MIPROv2
takes) was that lucky program while ``optimized.score`` was the unchanged program's."""

from __future__ import annotations

import pytest
from support.fakes import FunctionLM, scripted_agent
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import RLMDocstringOptimizer
from rlmoptimizer.records import EvalRun, ExampleResult, first_sample_complete, ranked
from rlmoptimizer.report import DetailedResults

pytestmark = pytest.mark.slow

ORIGINAL_ROUTE = RouteTicket().route.signature.instructions


def lucky_lm() -> FunctionLM:
    """Follows the policy for the LUCKY instructions on the extra rollout only; the first sample always misses."""

    def reply(messages, settings):
        system = next((m["content"] for m in messages if m.get("role") == "system"), "")
        if "LUCKY" in system and "[[ ## summary ## ]]" in str(messages[-1]["content"]):
            if settings.get("rollout_id") != 1:
                return {"queue": "nowhere"}
            messages = [
                {**m, "content": m["content"] + POLICY_PROMPT} if m.get("role") == "system" else m for m in messages
            ]
        return task_lm_reply(messages)

    return FunctionLM(reply, with_settings=True)


def test_a_lucky_rollout_never_ranks_first_in_candidate_programs_or_detailed_results(tmp_path):
    trainset, _ = make_splits()
    optimized = RLMDocstringOptimizer(
        max_iterations=3,
        num_threads=4,
        eval_lm=lucky_lm(),
        run_storage_dir=tmp_path,
        root_lm=scripted_agent(
            [
                {
                    "reasoning": "try",
                    "code": (
                        "update_prompt('route', 'LUCKY')\n"
                        "e = evaluate_program(rollouts=2)\n"
                        "print([run_data(i)['score'] for i in e['run_ids']])"
                    ),
                },
                {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program={'route': 'LUCKY'})"},
            ]
        ),
    ).compile(student=RouteTicket(), trainset=trainset, metric=metric)

    assert optimized.agent_trajectory[0]["output"].strip() == "[0, 1]"  # the scenario: only rollout 1 passes
    assert optimized.optimized_dspy_program["route"] == ORIGINAL_ROUTE and optimized.score == round(100 * 10 / 12, 2)

    best = optimized.candidate_programs[0]
    assert best["instructions"] == optimized.optimized_dspy_program and best["score"] == optimized.score
    assert [c["score"] for c in optimized.candidate_programs] == [83.33, 0.0]
    assert best["program"].route.signature.instructions == ORIGINAL_ROUTE

    for results in (optimized.detailed_results, DetailedResults.from_run_directory(tmp_path)):
        lucky = next(i for i, c in enumerate(results.instructions) if c["route"] == "LUCKY")
        assert results.train_aggregate_scores[lucky] == 0.0
        assert results.selection_scores[lucky] == 0.0
        assert set(results.train_subscores[lucky].values()) == {0.0}
        # best on no example the unchanged program passes (its lucky rollout is not its score)
        passed = [i for i, score in results.train_subscores[0].items() if score == 1.0]
        assert len(passed) == 10 and all(results.per_train_example_best_candidates[i] == {0} for i in passed)
        assert results.best_instructions == optimized.optimized_dspy_program
        assert results.instructions[results.ranking[0]] == results.best_instructions


def _run(run_id: str, instructions: dict[str, str], scores: list[float], rollout: int = 0) -> EvalRun:
    records = tuple(ExampleResult(i, {}, {}, {}, s, s >= 1.0) for i, s in enumerate(scores))
    return EvalRun(run_id, "train", "agent", instructions, records, len(scores), 0, 0, rollout=rollout)


def test_the_shared_rule_counts_whole_first_samples_and_breaks_ties_as_the_selection_does():
    initial, other, submitted = {"s": "a"}, {"s": "b"}, {"s": "c"}
    runs = [
        _run("run-0001", initial, [1, 0]),
        _run("run-0002", other, [1, 1], rollout=1),  # a lucky extra sample: never ranks
        _run("run-0003", other, [1]),  # part of the split: never ranks
        _run("run-0004", other, [0, 1]),
        _run("run-0005", submitted, [1, 0]),
    ]
    complete = first_sample_complete(runs, "train", 2)
    assert [r.run_id for r in complete] == ["run-0001", "run-0004", "run-0005"]
    # a three-way tie: the unchanged instructions, then the preferred (the submission), then the latest
    assert [r.run_id for r in ranked(complete, initial=initial, preferred=complete[2])] == [
        "run-0001",
        "run-0005",
        "run-0004",
    ]
    assert [r.run_id for r in ranked(complete[1:], initial=initial)] == ["run-0005", "run-0004"]
