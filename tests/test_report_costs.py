"""A cost estimate and its check as values: plain JSON both ways, 80 columns, read tolerantly from a run directory."""

from __future__ import annotations

import json

from rlmoptimizer.report.costs import CostCheck, CostEstimate, RoleCost
from rlmoptimizer.report.rundir import read_run_directory
from rlmoptimizer.report.summary import render


def estimate(cost=0.25) -> CostEstimate:
    model = "openrouter/some-provider/a-model-with-a-very-long-name-indeed"
    return CostEstimate(
        roles=(
            RoleCost("eval", model, 1_234_567, 987_654_321, 12_345_678, cost, 5_400.0),
            RoleCost("sub", "openai/gpt-4o", 40, 30_000, 2_000, 0.1, 40.0),
            RoleCost("root", "openai/gpt-4o", 5, 20_000, 750, None, 50.0),
        ),
        solved_early=(
            RoleCost("eval", model, 100, 50_000, 5_000, 0.01, 100.0),
            RoleCost("sub", "openai/gpt-4o", 1, 700, 50, 0.001, 1.0),
            RoleCost("root", "openai/gpt-4o", 5, 20_000, 750, None, 50.0),
        ),
        at_most=RoleCost("at most", calls=2_000_000, input_tokens=2_000_000_000, output_tokens=1, cost_usd=None),
        setting="rlm_autopilot='assist'; max_metric_calls=80: 60 units after the 20-example baseline (20 train, 20 "
        "validation examples)",
        program_runs=1_234_567,
        baseline_runs=20,
        proposals=40,
        root_turns=5,
        cap="max_cost_usd: not set (no spending cap).",
        assumptions=("one", "two"),
    )


def test_the_tables_fit_80_columns_whatever_the_numbers_and_names():
    usage = {"eval": {"calls": 3, "input_tokens": 10, "output_tokens": 1, "cost_usd": 0.0}, "total": {"calls": 3}}
    for text in (str(estimate()), str(estimate().against(usage))):
        assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "unknown" in str(estimate())  # the root's model has no price: so has the total


def test_to_dict_is_plain_json_and_from_dict_gives_the_same_value():
    value = estimate()
    data = json.loads(json.dumps(value.to_dict()))
    assert data["total"]["calls"] == sum(r.calls for r in value.roles)
    assert data["total"]["cost_usd"] is None and data["if_solved_early"]["calls"] == 106
    assert CostEstimate.from_dict(data) == value
    check = value.against({})
    assert json.loads(json.dumps(check.to_dict()))["rows"][0]["role"] == "eval"


def test_a_damaged_estimate_reads_as_what_is_left_of_it():
    value = CostEstimate.from_dict({"roles": [{"role": "eval", "calls": "many", "cost_usd": "free"}, 3]})
    assert value.roles == (RoleCost("eval", cost_usd=None),) and value.program_runs == 0
    assert isinstance(value.against({"eval": "not a dict"}), CostCheck)


def test_the_check_sets_spent_beside_both_cases():
    usage = {
        "eval": {"calls": 110, "input_tokens": 55_000, "output_tokens": 5_500, "cost_usd": 0.011},
        "total": {"calls": 120, "input_tokens": 80_000, "output_tokens": 7_000, "cost_usd": None},
    }
    check = estimate().against(usage)
    row = check.row("eval")
    assert (row.predicted.calls, row.solved_early.calls, row.actual.calls) == (1_234_567, 100, 110)
    assert row.solved_early_ratio == (55_000 + 5_500) / 55_000 and row.cost_ratio == 0.011 / 0.25
    assert check.row("root").actual.calls == 0 and check.within_range


def test_the_report_of_a_run_that_stopped_shows_the_estimate_beside_what_it_spent_so_far(tmp_path):
    (tmp_path / "estimate.json").write_text(json.dumps(estimate().to_dict()))
    (tmp_path / "usage.json").write_text(json.dumps({"eval": {"calls": 7, "input_tokens": 70, "output_tokens": 7}}))
    (tmp_path / "manifest.json").write_text(json.dumps({"budget_limit": 60, "created_at": 1.0}))
    rundir = read_run_directory(tmp_path)
    assert rundir.estimate is not None and rundir.status == "interrupted"
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(render(rundir))
    out = console.export_text()
    assert "Cost: predicted before the run, and spent" in out and "1.23M" in out


def test_an_estimate_file_that_is_not_one_is_named_and_skipped(tmp_path):
    (tmp_path / "estimate.json").write_text(json.dumps({"roles": "none"}))
    rundir = read_run_directory(tmp_path)
    assert rundir.estimate is None and any("estimate.json" in p for p in rundir.problems)
