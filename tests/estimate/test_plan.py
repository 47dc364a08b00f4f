"""The work a compile does with a budget, as the estimate counts it: units, program runs, proposals, agent turns."""

from __future__ import annotations

import pytest

from rlmoptimizer.errors import ConfigurationError
from rlmoptimizer.estimate.plan import plan


def settings(**kwargs):
    base = {
        "train_size": 20,
        "val_size": 20,
        "max_iterations": None,
        "max_metric_calls": 80,
        "mode": "loop",
        "num_threads": 2,
        "rlm_max_iterations": 12,
    }
    return {**base, **kwargs}


def test_the_real_model_benchmark_setting_spends_its_metric_calls_on_ten_reflections():
    """B = 80 on 20 + 20 tickets (benchmarks/README.md, issue 35): the validation baseline takes 20, the 60 units
    left are metric calls; one accepted child is checked on the 20 validation tickets and the other 40 pay 10
    iterations of 4 runs. The loop's run there: 80 metric calls, 10 reflections."""
    work = plan(**settings())
    assert work.units == 60
    assert (work.expected.program_runs, work.expected.baseline_runs, work.expected.proposals) == (80, 20, 10)
    # and one analysis of 10 train failures: two cause prompts and the merge (the loop's run there made 3)
    assert (work.expected.analysed, work.expected.analysis_prompts) == (10, 3)
    assert work.at_most.program_runs == 80 and work.at_most.proposals == 80  # the sub-LM allowance is B prompts
    assert "max_metric_calls=80: 60 units after the 20-example baseline" in work.setting


def test_with_max_iterations_the_baselines_are_free_and_a_proposal_is_a_unit():
    work = plan(**settings(max_metric_calls=None, max_iterations=3, train_size=12, val_size=8))
    assert work.units == 3 * 12 + 8
    expected = work.expected
    assert expected.baseline_runs == 20
    # the analysis after GEPA: half of the 12 train examples failing, one prompt for their causes and the merge
    assert (expected.analysed, expected.analysis_prompts) == (6, 2)
    assert expected.proposals == pytest.approx((44 - 2 - 8) / 5)
    assert expected.program_runs == pytest.approx(20 + 44 - 2 - expected.proposals)
    assert work.at_most.program_runs == 20 + 44 + 8  # the submission's check, unpaid once the budget is spent


def test_without_validation_candidates_are_checked_on_train():
    work = plan(**settings(val_size=0, max_metric_calls=None, max_iterations=2))
    assert work.units == 40 and work.expected.baseline_runs == 20
    assert work.expected.analysis_prompts == 0  # 40 units pay no analysis beside a child checked on 20 and a round
    assert work.expected.proposals == pytest.approx((40 - 20) / 5)


def test_solved_early_is_a_round_of_proposals_one_per_step_the_check_and_the_rest_of_train():
    for steps in (1, 2):
        work = plan(**settings(max_metric_calls=None, max_iterations=3, train_size=12, val_size=8, steps=steps))
        early = work.solved_early
        assert early.proposals == steps
        # an iteration of 4 runs per proposal, the solving child's validation, the rest of train run with it
        assert early.program_runs == 20 + steps * 4 + 8 + (12 - 3)


@pytest.mark.parametrize(("mode", "turns"), [("loop", 0), ("assist", 5), ("off", 10)])
def test_agent_turns_by_mode_never_past_the_turn_limit(mode, turns):
    assert plan(**settings(mode=mode, rlm_max_iterations=50)).expected.root_turns == turns
    assert plan(**settings(mode=mode, rlm_max_iterations=3)).expected.root_turns == min(turns, 3)
    assert plan(**settings(mode=mode, root_turns=7, rlm_max_iterations=50)).expected.root_turns == (
        0 if mode == "loop" else 7
    )
    assert plan(**settings(mode=mode, rlm_max_iterations=12)).at_most.root_turns == (0 if mode == "loop" else 13)


def test_a_budget_the_compile_would_refuse_is_refused_the_same_way():
    with pytest.raises(ConfigurationError, match="max_metric_calls=30 does not cover the baseline"):
        plan(**settings(max_metric_calls=30))


def test_a_budget_too_small_for_a_kept_child_pays_iterations_only():
    work = plan(**settings(max_metric_calls=None, max_iterations=1, train_size=3, val_size=0))
    assert work.units == 3 and work.expected.proposals == 0  # not even one iteration of 4 runs and its reflection
    work = plan(**settings(max_metric_calls=None, max_iterations=2, train_size=3, val_size=0))
    assert work.units == 6 and work.expected.proposals == pytest.approx(6 / 5)  # no child checked on train
