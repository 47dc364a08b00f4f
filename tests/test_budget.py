"""The budget ledger: reserve-then-spend, never overspent, exact totals under many threads."""

from __future__ import annotations

import random
import sys
import threading

import dspy
import pytest

from rlmoptimizer.budget import (
    AUTO_CANDIDATES,
    KINDS,
    SUB_LM_CALL,
    TRAIN_EXAMPLE,
    VAL_EXAMPLE,
    BudgetLedger,
    auto_metric_calls,
    budget_for,
    gepa_metric_calls,
)
from rlmoptimizer.errors import BudgetExhaustedError


@pytest.fixture
def eager_thread_switching():
    """Switch threads every microsecond so that races have a chance to show."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


def test_budget_for_counts_iterations_of_the_trainset_plus_the_valset():
    assert budget_for(5, 40, 20) == 220


def test_reserve_grants_what_is_left_and_release_returns_the_rest():
    ledger = BudgetLedger(10)
    with ledger.reserve(6, TRAIN_EXAMPLE) as first:
        assert first.granted == 6 and ledger.left == 4
        second = ledger.reserve(6, VAL_EXAMPLE)
        assert second.granted == 4 and ledger.left == 0
        assert ledger.reserve(3, TRAIN_EXAMPLE).granted == 0
        first.spend(2)
        second.spend(1)
        second.release()
        second.release()  # idempotent
        assert ledger.left == 3 and first.remaining == 4
    assert ledger.left == 7 and ledger.spent == 3
    assert ledger.spent_by_kind == {TRAIN_EXAMPLE: 2, VAL_EXAMPLE: 1, SUB_LM_CALL: 0}


def test_a_reservation_is_released_when_the_work_fails():
    ledger = BudgetLedger(5)
    with pytest.raises(RuntimeError):
        with ledger.reserve(5, TRAIN_EXAMPLE) as reservation:
            reservation.spend(1)
            raise RuntimeError("evaluation crashed")
    assert (ledger.spent, ledger.left) == (1, 4)


def test_spending_more_than_reserved_and_bad_requests_raise():
    ledger = BudgetLedger(3)
    reservation = ledger.reserve(2, SUB_LM_CALL)
    reservation.spend(2)
    with pytest.raises(BudgetExhaustedError, match="has only 0 left, asked to spend 1"):
        reservation.spend(1)
    with pytest.raises(ValueError, match="int >= 0"):
        reservation.spend(-1)
    with pytest.raises(BudgetExhaustedError, match="2 train_example unit\\(s\\) requested, 1 of 3 left"):
        ledger.reserve_exactly(2, TRAIN_EXAMPLE)
    assert ledger.left == 1  # a refused reserve_exactly reserves nothing
    with pytest.raises(ValueError, match="unknown budget kind 'tokens'"):
        ledger.reserve(1, "tokens")
    with pytest.raises(ValueError, match="int >= 0"):
        ledger.reserve(-2, TRAIN_EXAMPLE)
    for not_a_count in (True, 1.0, "1"):  # True == 1 in Python; a bool count is a caller's bug
        with pytest.raises(ValueError, match="int >= 0"):
            ledger.reserve(not_a_count, TRAIN_EXAMPLE)
        with pytest.raises(ValueError, match="int >= 0"):
            reservation.spend(not_a_count)
    assert ledger.left == 1
    with pytest.raises(ValueError, match="budget limit must be an int >= 0"):
        BudgetLedger(-1)


def test_snapshots_restore_the_counts():
    ledger = BudgetLedger(10)
    with ledger.reserve(3, VAL_EXAMPLE) as reservation:
        reservation.spend(1)
        reservation.spend(0)
        reservation.spend(2)
    snapshot = ledger.snapshot()
    assert snapshot == {
        "limit": 10,
        "spent": 3,
        "left": 7,
        "spent_by_kind": {TRAIN_EXAMPLE: 0, VAL_EXAMPLE: 3, SUB_LM_CALL: 0},
    }
    restored = BudgetLedger.from_snapshot(snapshot)
    assert (restored.limit, restored.spent, restored.left) == (10, 3, 7)
    assert restored.reserve(100, TRAIN_EXAMPLE).granted == 7


@pytest.mark.parametrize("sub_lm_limit", [None, 500])
def test_sixteen_threads_never_overspend_and_the_totals_are_exact(eager_thread_switching, sub_lm_limit):
    limit = 2_000
    ledger = BudgetLedger(limit, sub_lm_limit=sub_lm_limit)
    own = sub_lm_limit is not None  # sub-LM prompts draw on an allowance of their own
    spent_by_thread: list[dict[str, int]] = []
    lock = threading.Lock()
    violations: list[str] = []
    start = threading.Barrier(17)

    def check_invariant():
        with ledger._lock:
            sub = ledger._spent_by_kind[SUB_LM_CALL] if own else 0
            spent = sum(ledger._spent_by_kind.values()) - sub
            reserved, reserved_sub = ledger._reserved["main"], ledger._reserved["sub"]
            if spent + reserved > limit or reserved < 0:
                violations.append(f"spent {spent} + reserved {reserved} > {limit}")
            if sub + reserved_sub > (sub_lm_limit or 0) or reserved_sub < 0:
                violations.append(f"sub-LM spent {sub} + reserved {reserved_sub} > {sub_lm_limit}")

    def hammer(seed: int):
        rng = random.Random(seed)
        mine = dict.fromkeys(KINDS, 0)
        start.wait()
        for _ in range(300):
            kind = rng.choice(KINDS)
            with ledger.reserve(rng.randint(0, 12), kind) as reservation:
                for _ in range(rng.randint(0, reservation.granted)):
                    reservation.spend(1)
                    mine[kind] += 1
                check_invariant()
        with lock:
            spent_by_thread.append(mine)

    def watch():
        start.wait()
        while len(spent_by_thread) < 16:
            check_invariant()

    threads = [threading.Thread(target=hammer, args=(seed,)) for seed in range(16)]
    threads.append(threading.Thread(target=watch))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert violations == []
    expected = {kind: sum(t[kind] for t in spent_by_thread) for kind in KINDS}
    assert ledger.spent_by_kind == expected
    assert ledger.spent == sum(expected.values()) - (expected[SUB_LM_CALL] if own else 0) <= limit
    assert ledger.left == limit - ledger.spent and ledger._reserved == {"main": 0, "sub": 0}
    # the demand (16 * 300 * ~3 units) exceeds the limit: it was all used, but for what the last reservation of the
    # last thread left unspent (at most one request, 12 units: nobody was left to take them)
    assert limit - 12 <= ledger.spent <= limit
    assert ledger.reserve(limit, TRAIN_EXAMPLE).granted == limit - ledger.spent  # and what is left can be had
    if own:
        assert sub_lm_limit - 12 <= expected[SUB_LM_CALL] <= sub_lm_limit  # (the same: the last one's unspent)
        assert ledger.snapshot()["sub_lm_left"] == sub_lm_limit - expected[SUB_LM_CALL]


def test_concurrent_single_unit_reservations_grant_exactly_the_limit(eager_thread_switching):
    ledger = BudgetLedger(100)
    granted: list[int] = []
    lock = threading.Lock()

    def grab():
        for _ in range(20):
            reservation = ledger.reserve(1, SUB_LM_CALL)
            if reservation.granted:
                reservation.spend(1)
            with lock:
                granted.append(reservation.granted)

    threads = [threading.Thread(target=grab) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(granted) == 100 == ledger.spent_by_kind[SUB_LM_CALL] and ledger.left == 0


def test_auto_sizes_max_metric_calls_as_dspy_gepa_does():
    """dspy.GEPA's own auto_budget (an instance method, so not called by the package) gives the same numbers."""
    from dspy.teleprompt.gepa.gepa import AUTO_RUN_SETTINGS

    assert {auto: settings["n"] for auto, settings in AUTO_RUN_SETTINGS.items()} == AUTO_CANDIDATES
    for auto, candidates in AUTO_CANDIDATES.items():
        for steps in (0, 1, 2, 3, 7):
            for val_size in (1, 4, 8, 35, 200):
                theirs = dspy.GEPA.auto_budget(None, steps or 1, candidates, val_size)
                assert auto_metric_calls(auto, steps, val_size) == theirs, (auto, steps, val_size)
    assert gepa_metric_calls("light", None, 2, 12, 8) == auto_metric_calls("light", 2, 8) == 778
    assert gepa_metric_calls("light", None, 2, 12, 0) == auto_metric_calls("light", 2, 12)  # no valset: train's size
    assert gepa_metric_calls(None, 3, 2, 12, 8) == 60  # max_full_evals: the train and validation sets together
    assert gepa_metric_calls(None, None, 2, 12, 8) is None


@pytest.mark.parametrize(
    ("calls", "warned"), [(24, True), (29, True), (30, False), (200, False)], ids=["24", "29", "30", "200"]
)
def test_a_budget_that_pays_the_baseline_and_one_check_but_no_candidate_is_warned_about(calls, warned):
    """Regression: max_metric_calls=24 with 12 validation examples was taken, and the run paid its baseline and then
    returned the unchanged program without a word of why."""
    from rlmoptimizer.budget import thin_budget_warning

    said = thin_budget_warning(calls, 20, 12)
    assert (said is not None) is warned
    if warned:
        assert f"max_metric_calls={calls} leaves {calls - 12}" in said and "max_metric_calls >= 30" in said
    # no valset: the train set is the selection split, and its baseline holds the parent's minibatch
    train_only = thin_budget_warning(calls, 12, 0)
    assert (train_only is not None) is (calls < 27)
    assert train_only is None or ("12 train examples" in train_only and "fewer train examples" in train_only)
    assert train_only is None or ("costs about 15" in train_only and "max_metric_calls >= 27" in train_only)


def test_compile_warns_of_a_budget_that_pays_no_candidate_when_it_starts(caplog):
    from support.optimizing import compile_tickets, proposer
    from support.tickets import make_splits

    _, val = make_splits()
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        result = compile_tickets([], rlm_autopilot="loop", max_metric_calls=2 * len(val) + 2, sub_lm=proposer())
    warned = [
        r.getMessage() for r in caplog.records if "leaves" in r.getMessage() and "max_metric_calls=" in r.getMessage()
    ]
    assert len(warned) == 1 and f"max_metric_calls >= {2 * len(val) + 6}" in warned[0]
    assert "the default loop tries no change" in warned[0]
    # and it tries none: nothing is spent after the validation baseline, and the unchanged program is returned
    assert result.budget["spent"] == 0 and result.selection["chosen_label"] == "baseline"


def test_a_budget_sized_from_max_full_evals_or_auto_is_refused_and_warned_about_in_the_users_own_setting(caplog):
    """Regression: max_full_evals=1 without a valset was refused as "max_metric_calls=12 ...: pass max_metric_calls >=
    24", a setting the user never wrote, and passing it besides max_full_evals is refused as two budgets."""
    from support.optimizing import compile_tickets, proposer
    from support.tickets import make_splits

    from rlmoptimizer.budget import budget_for_metric_calls, thin_budget_warning
    from rlmoptimizer.errors import ConfigurationError

    train, _ = make_splits()
    with pytest.raises(ConfigurationError) as refused:
        compile_tickets([], valset=None, rlm_autopilot="loop", max_iterations=None, max_full_evals=1, sub_lm=proposer())
    said = str(refused.value)
    assert said.startswith(f"max_full_evals=1 gives max_metric_calls={len(train)}, which does not cover")
    assert "pass max_full_evals >= 2" in said and "max_metric_calls >=" not in said
    assert "fewer examples" not in said  # (max_full_evals shrinks with the train set its baseline is paid on)
    # its advice taken: accepted, and the thin budget is said in the same setting
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        compile_tickets([], valset=None, rlm_autopilot="loop", max_iterations=None, max_full_evals=2, sub_lm=proposer())
    warned = [r.getMessage() for r in caplog.records if " leaves " in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"max_full_evals=2 gives max_metric_calls={2 * len(train)}, which")
    assert "Pass max_full_evals >= 3" in warned[0]
    # with a valset: the fewest full evaluations of both sets that cover it, and fewer validation examples help
    sized = gepa_metric_calls(None, 1, 1, 4, 12)
    with pytest.raises(ConfigurationError, match=r"^max_full_evals=1 gives max_metric_calls=16, .* >= 2 .*fewer ex"):
        budget_for_metric_calls(sized, 4, 12)
    assert "Pass max_full_evals >= 3 " in thin_budget_warning(gepa_metric_calls(None, 2, 1, 2, 12), 2, 12)
    # auto= sizes too much for either; were it less, the message would name it and what to pass instead
    assert thin_budget_warning(gepa_metric_calls("light", None, 1, 12, 0), 12, 0) is None
    with pytest.raises(ConfigurationError, match=r"^auto='light' gives .* pass max_metric_calls >= 24 instead of auto"):
        budget_for_metric_calls(type(sized)(20, "auto", "light"), 12, 0)
    # a max_metric_calls the user wrote is named as before
    with pytest.raises(ConfigurationError, match=r"^max_metric_calls=20 does not cover .* >= 24 .* fewer examples"):
        budget_for_metric_calls(20, 12, 0)
