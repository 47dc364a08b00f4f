"""The usage meter: LM calls, tokens and dollars per role, exact under threads; the spending cap's gate."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import dspy
import litellm
import pytest
from dspy.lm15 import Usage

from rlmoptimizer.budget import SUB_LM_CALL, TRAIN_EXAMPLE, BudgetLedger
from rlmoptimizer.errors import BudgetExhaustedError
from rlmoptimizer.testing import FunctionLM
from rlmoptimizer.usage import EVAL, ROOT, SUB, UsageMeter, price_of_call


def _qa_lm(name: str, cached_every: int = 0) -> FunctionLM:
    counter = {"n": 0}
    lock = threading.Lock()

    def usage(messages, text):
        with lock:
            counter["n"] += 1
            n = counter["n"]
        prompt = sum(len(str(m.get("content", ""))) for m in messages) // 4 + n % 7
        cached = (prompt // 2) if cached_every and n % cached_every == 0 else None
        return Usage(input_tokens=prompt, output_tokens=3 + n % 5, cache_read_tokens=cached)

    return FunctionLM(lambda messages: {"answer": "x"}, name=name, usage=usage)


def _totals(lm: FunctionLM) -> tuple[int, int, int, int]:
    return (
        len(lm.reported_usage),
        sum(u.input_tokens for u in lm.reported_usage),
        sum(u.cache_read_tokens or 0 for u in lm.reported_usage),
        sum(u.output_tokens for u in lm.reported_usage),
    )


def _expected_usd(lm: FunctionLM) -> float:
    total = Decimal(0)
    for u in lm.reported_usage:
        prompt, completion = litellm.cost_per_token(
            model=lm.model,
            prompt_tokens=u.input_tokens,
            completion_tokens=u.output_tokens,
            cache_read_input_tokens=u.cache_read_tokens or 0,
        )
        total += Decimal(repr(prompt)) + Decimal(repr(completion))
    return float(total)


def test_each_role_counts_exactly_what_the_fake_lms_reported_with_16_threads():
    meter = UsageMeter()
    root, sub, judge = _qa_lm("openai/gpt-4o-mini"), _qa_lm("openai/gpt-4o", cached_every=3), _qa_lm("fake-judge")
    program = dspy.Predict("question -> answer")

    def work(i: int) -> None:  # one "example": the program (eval role) on its own LM per predictor, a sub call
        meter.in_role(EVAL, lambda: program(question=f"q{i}"))()
        meter.in_role(SUB, lambda: sub(f"why {i}?"))()
        meter.in_role(ROOT, lambda: root(f"turn {i}"))()

    program.set_lm(judge)  # a predictor with its own LM still counts as eval
    with dspy.context(lm=root), ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(work, range(160)))

    snap = meter.snapshot()
    for role, lm in ((EVAL, judge), (SUB, sub), (ROOT, root)):
        calls, inputs, cached, outputs = _totals(lm)
        assert (
            snap[role]["calls"],
            snap[role]["input_tokens"],
            snap[role]["cached_input_tokens"],
            snap[role]["output_tokens"],
        ) == (calls, inputs, cached, outputs), role
    assert snap[SUB]["cached_input_tokens"] > 0
    assert snap["total"]["calls"] == 480
    assert snap["total"]["input_tokens"] == sum(_totals(lm)[1] for lm in (root, sub, judge))
    # dollars from litellm's table for known models, None (never a guess) for an unknown one
    assert snap[ROOT]["cost_usd"] == pytest.approx(_expected_usd(root), rel=1e-12)
    assert snap[SUB]["cost_usd"] == pytest.approx(_expected_usd(sub), rel=1e-12)
    assert snap[ROOT]["cost_usd"] > 0
    assert snap[EVAL]["cost_usd"] is None and snap[EVAL]["unpriced_models"] == ["fake-judge"]
    assert snap["total"]["cost_usd"] is None
    assert meter.spent_usd == pytest.approx(_expected_usd(root) + _expected_usd(sub), rel=1e-12)


def test_cached_input_tokens_are_priced_at_the_cached_rate():
    full = price_of_call("openai/gpt-4o-mini", 1_000, 100)
    cached = price_of_call("openai/gpt-4o-mini", 1_000, 100, cached_input_tokens=800)
    assert full is not None and cached is not None and cached < full
    assert price_of_call("no-such-provider/no-such-model", 1_000, 100) is None


def test_a_priced_model_whose_calls_report_no_usage_costs_an_unknown_amount_not_zero(caplog):
    """Regression: a client returning no token counts had its calls of a priced model booked at $0 as a known
    cost: the result said what they cost, and the spending cap never saw them."""
    meter = UsageMeter(max_cost_usd=0.01)
    meter.record(SUB, "openai/gpt-4o-mini", {"prompt_tokens": 1_000, "completion_tokens": 10})
    with caplog.at_level("WARNING", logger="rlmoptimizer.usage"):
        meter.record(SUB, "openai/gpt-4o-mini", {})
        meter.record(SUB, "openai/gpt-4o-mini", {"prompt_tokens": 0})
        meter.record(EVAL, "openai/gpt-4o-mini", {})  # the same model in another role: said already
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "reported no token usage" in warned[0] and "max_cost_usd counts only" in warned[0]
    snap = meter.snapshot()
    assert snap[SUB]["calls"] == 3 and snap[SUB]["cost_usd"] is None and snap[EVAL]["cost_usd"] is None
    assert snap[SUB]["unpriced_models"] == ["openai/gpt-4o-mini (no token usage reported)"]
    assert snap[SUB]["priced_usd"] == pytest.approx(float(price_of_call("openai/gpt-4o-mini", 1_000, 10)))


def test_counts_no_provider_could_mean_are_no_tokens_and_never_negative_dollars():
    """Regression: a reply reporting completion_tokens=-1000000 made usage show negative tokens and $-29.95, and the
    spending cap took the negative total for reached."""
    meter = UsageMeter(max_cost_usd=0.08)
    meter.record(SUB, "openai/gpt-4o-mini", {"prompt_tokens": 1_000, "completion_tokens": -1_000_000})
    meter.record(SUB, "openai/gpt-4o-mini", {"prompt_tokens": 1_000, "completion_tokens": float("nan")})
    snap = meter.snapshot()
    assert snap[SUB]["output_tokens"] == 0 and snap[SUB]["cost_usd"] > 0
    assert not meter.cap_reached


def test_a_tracker_installed_before_still_receives_every_call_once():
    meter = UsageMeter()
    lm = _qa_lm("openai/gpt-4o-mini")
    with dspy.track_usage() as users_tracker, dspy.context(lm=lm):
        meter.in_role(ROOT, lambda: meter.in_role(EVAL, lambda: dspy.Predict("q -> answer")(q="a"))())()
        meter.in_role(ROOT, lambda: dspy.Predict("q -> answer")(q="b"))()
    snap = meter.snapshot()
    assert (snap[EVAL]["calls"], snap[ROOT]["calls"]) == (1, 1)  # the innermost role books a call, once
    assert users_tracker.get_total_tokens()["openai/gpt-4o-mini"]["prompt_tokens"] == _totals(lm)[1]


def test_snapshot_restores_for_a_resumed_run():
    meter = UsageMeter()
    meter.record(ROOT, "openai/gpt-4o-mini", {"prompt_tokens": 1_000, "completion_tokens": 10})
    meter.record(EVAL, "mystery", {"prompt_tokens": 5, "completion_tokens": 1})
    again = UsageMeter()
    again.restore(meter.snapshot())
    again.record(ROOT, "openai/gpt-4o-mini", {"prompt_tokens": 1_000, "completion_tokens": 10})
    snap = again.snapshot()
    assert snap[ROOT]["calls"] == 2 and snap[ROOT]["input_tokens"] == 2_000
    assert snap[ROOT]["cost_usd"] == pytest.approx(2 * float(price_of_call("openai/gpt-4o-mini", 1_000, 10)))
    assert snap[EVAL]["cost_usd"] is None and snap[EVAL]["unpriced_models"] == ["mystery"]


def test_the_spending_cap_grants_what_the_average_unit_cost_allows_then_stops_the_ledger():
    per_call = float(price_of_call("openai/gpt-4o-mini", 10_000, 100))
    meter = UsageMeter(max_cost_usd=per_call * 10.5)
    ledger = BudgetLedger(1_000, gate=meter.gate())
    # nothing measured yet: the first units are allowed (the free baseline calibrates the eval role)
    assert ledger.reserve(4, TRAIN_EXAMPLE).granted == 4
    for _ in range(4):
        meter.record(EVAL, "openai/gpt-4o-mini", {"prompt_tokens": 10_000, "completion_tokens": 100})
        meter.add_units(EVAL, 1)
    # 4 spent at `per_call` each: 6 more fit under 10.5 calls' worth
    assert ledger.reserve(6, TRAIN_EXAMPLE).granted == 6 and not meter.cap_reached
    for _ in range(6):
        meter.record(EVAL, "openai/gpt-4o-mini", {"prompt_tokens": 10_000, "completion_tokens": 100})
        meter.add_units(EVAL, 1)
    assert ledger.reserve(5, TRAIN_EXAMPLE).granted == 0
    assert meter.cap_reached and "spending cap reached" in ledger.stop_reason
    with pytest.raises(BudgetExhaustedError, match="spending cap reached"):
        ledger.reserve_exactly(1, SUB_LM_CALL)
    assert meter.snapshot()["cap_reached"] is True
    assert ledger.left == 1_000 - 10  # reserved, not spent: the budget itself is untouched, the cap is what stops


def test_a_reached_cap_stays_reached_on_resume_unless_the_cap_was_raised():
    """Regression: a resumed run forgot the reached cap until its next reservation, so a finished run read back
    checked its submission again instead of returning the choice it had made."""
    per_call = float(price_of_call("openai/gpt-4o-mini", 10_000, 100))
    meter = UsageMeter(max_cost_usd=per_call * 2)
    for _ in range(3):
        meter.record(EVAL, "openai/gpt-4o-mini", {"prompt_tokens": 10_000, "completion_tokens": 100})
        meter.add_units(EVAL, 1)
    assert meter.affordable_units(EVAL, 1) == 0 and meter.cap_reached
    same = UsageMeter(max_cost_usd=per_call * 2)
    same.restore(meter.snapshot())
    assert same.cap_reached and same.cap_reason == meter.cap_reason
    raised = UsageMeter(max_cost_usd=per_call * 10)
    raised.restore(meter.snapshot())
    assert not raised.cap_reached and raised.affordable_units(EVAL, 5) > 0
    below = UsageMeter(max_cost_usd=per_call * 10)  # a run that had not reached its cap ...
    below.restore(raised.snapshot())
    lowered = UsageMeter(max_cost_usd=per_call * 2.5)  # ... resumed with a cap below what it had spent
    lowered.restore(below.snapshot())
    assert lowered.spent_all and lowered.cap_reached and "spending cap reached" in lowered.cap_reason


def test_a_resumed_run_prices_its_next_units_as_the_run_before_did():
    """Regression: the snapshot kept the dollars but not the units they paid for, so a resumed run priced its next
    example at 0 (granting a whole request past the cap), then at all the dollars over a few examples (stopping
    with most of the cap left)."""
    per_call = float(price_of_call("openai/gpt-4o-mini", 10_000, 100))
    meter = UsageMeter(max_cost_usd=per_call * 10.5)
    for _ in range(4):
        meter.record(EVAL, "openai/gpt-4o-mini", {"prompt_tokens": 10_000, "completion_tokens": 100})
        meter.add_units(EVAL, 1)
    resumed = UsageMeter(max_cost_usd=per_call * 10.5)
    resumed.restore(meter.snapshot())
    assert resumed.affordable_units(EVAL, 20) == 6  # not 20: 4 of 10.5 calls' worth were spent
    assert resumed.cap_reached
    again = UsageMeter(max_cost_usd=per_call * 10.5)
    again.restore(meter.snapshot())
    again.record(EVAL, "openai/gpt-4o-mini", {"prompt_tokens": 10_000, "completion_tokens": 100})
    again.add_units(EVAL, 1)
    assert again.affordable_units(EVAL, 5) == 5 and not again.cap_reached  # not priced at 5 calls a unit


def test_spending_the_cap_in_any_role_reaches_it():
    """Regression: only a reservation (an evaluation, a sub-LM prompt) could reach the cap, so the agent's own turns
    (the root role, never reserved) spent past it without end."""
    per_call = float(price_of_call("openai/gpt-4o-mini", 10_000, 100))
    meter = UsageMeter(max_cost_usd=per_call * 2.5)
    ledger = BudgetLedger(1_000, gate=meter.gate())
    for _ in range(2):
        meter.record(ROOT, "openai/gpt-4o-mini", {"prompt_tokens": 10_000, "completion_tokens": 100})
    assert not meter.cap_reached and not meter.spent_all
    meter.record(ROOT, "openai/gpt-4o-mini", {"prompt_tokens": 10_000, "completion_tokens": 100})
    assert meter.cap_reached and meter.spent_all and meter.snapshot()["cap_reached"] is True
    assert ledger.reserve(1, TRAIN_EXAMPLE).granted == 0 and "spending cap reached" in ledger.stop_reason
    assert not UsageMeter().spent_all  # no cap: never


def test_a_request_the_cap_covers_only_in_part_is_its_last_grant():
    per_call = float(price_of_call("openai/gpt-4o-mini", 10_000, 100))
    meter = UsageMeter(max_cost_usd=per_call * 10.5)
    for _ in range(4):
        meter.record(EVAL, "openai/gpt-4o-mini", {"prompt_tokens": 10_000, "completion_tokens": 100})
        meter.add_units(EVAL, 1)
    ledger = BudgetLedger(1_000, gate=meter.gate())
    assert ledger.reserve(100, TRAIN_EXAMPLE).granted == 6
    assert meter.cap_reached and ledger.reserve(1, TRAIN_EXAMPLE).granted == 0


def test_meter_rejects_unknown_roles():
    with pytest.raises(ValueError, match="unknown role"):
        UsageMeter().tracker("judge")


def test_a_cap_of_any_kind_of_number_is_taken():
    """numpy's floats and ints and a Decimal, as a notebook computes a cap."""
    import numpy as np

    from rlmoptimizer import RLMDocstringOptimizer

    for value in (np.float32(0.5), np.int64(2), Decimal("0.25")):
        assert RLMDocstringOptimizer(root_lm=FunctionLM(lambda m: ""), max_cost_usd=value).max_cost_usd == float(value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_cost_usd": 0}, "max_cost_usd must be a number of dollars > 0"),
        ({"max_cost_usd": "5"}, "max_cost_usd must be a number of dollars > 0"),
        ({"max_cost_usd": Decimal("sNaN")}, "max_cost_usd must be a number of dollars > 0"),
        ({"max_cost_usd": True}, "max_cost_usd must be a number of dollars > 0"),
        ({"root_context_window": 1_000}, "root_context_window=1000 is too small .* no window under 4,000 tokens"),
        ({"root_context_window": 0}, "root_context_window .* must be an int >= 4000"),
        ({"root_context_window": 32_000.5}, "root_context_window"),
    ],
)
def test_spending_cap_and_context_window_are_checked_at_construction(kwargs, match):
    from rlmoptimizer import ConfigurationError, RLMDocstringOptimizer

    with pytest.raises(ConfigurationError, match=match):
        RLMDocstringOptimizer(root_lm=FunctionLM(lambda m: ""), **kwargs)


def test_a_price_registered_with_litellm_prices_a_local_model():
    meter = UsageMeter()
    meter.record(ROOT, "local-server/my-model-x1", {"prompt_tokens": 1_000, "completion_tokens": 100})
    assert meter.snapshot()[ROOT]["cost_usd"] is None
    litellm.register_model(
        {
            "local-server/my-model-x1": {
                "input_cost_per_token": 1e-6,
                "output_cost_per_token": 2e-6,
                "litellm_provider": "openai",
                "mode": "chat",
            }
        }
    )
    try:
        fresh = UsageMeter()
        fresh.record(ROOT, "local-server/my-model-x1", {"prompt_tokens": 1_000, "completion_tokens": 100})
        assert fresh.snapshot()[ROOT]["cost_usd"] == pytest.approx(1_000 * 1e-6 + 100 * 2e-6)
    finally:
        litellm.model_cost.pop("local-server/my-model-x1", None)


def test_calls_a_program_makes_through_dspy_parallel_are_counted_too():
    # dspy's ParallelExecutor deep-copies the usage tracker into its threads; the meter must still see the calls
    meter = UsageMeter()
    lm = _qa_lm("openai/gpt-4o-mini")
    predict = dspy.Predict("question -> answer")
    with dspy.context(lm=lm):
        results = meter.in_role(
            EVAL, lambda: dspy.Parallel(num_threads=4)([(predict, {"question": f"q{i}"}) for i in range(12)])
        )()
    assert all(r.answer == "x" for r in results)
    assert meter.snapshot()[EVAL]["calls"] == len(lm.reported_usage) == 12
    assert meter.snapshot()[EVAL]["input_tokens"] == _totals(lm)[1]


def test_an_import_of_litellm_stopped_midway_leaves_nothing_half_made(tmp_path):
    """Regression: a Ctrl-C while a compile first imported litellm left half-made litellm modules, every later import
    failed on them, and the compile run again recorded every example as a program error."""
    import subprocess
    import sys

    script = tmp_path / "stopped.py"
    script.write_text(
        "import importlib.abc, sys\n"
        "class CtrlC(importlib.abc.MetaPathFinder):\n"
        "    fired = False\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'litellm.main' and not CtrlC.fired:\n"
        "            CtrlC.fired = True\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, CtrlC())\n"
        "from rlmoptimizer.usage import import_litellm\n"
        "try:\n"
        "    import_litellm()\n"
        "except KeyboardInterrupt:\n"
        "    print('stopped', sum(n == 'litellm' or n.startswith('litellm.') for n in sys.modules))\n"
        "import litellm\n"
        "print('again', callable(litellm.completion), isinstance(litellm.model_cost, dict))\n"
    )
    shown = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert shown.stdout.split("\n")[:2] == ["stopped 0", "again True True"], shown.stderr[-2000:]


def test_litellm_imported_by_several_threads_at_once_is_whole_for_each(tmp_path):
    """Regression: a thread that found litellm in sys.modules while another was still importing it got a half-made
    module, and the price of its model was cached as unknown for the rest of the process."""
    import subprocess
    import sys

    script = tmp_path / "threads.py"
    script.write_text(
        "import threading\n"
        "from rlmoptimizer.usage import import_litellm, price_of_call\n"
        "got = []\n"
        "def price():\n"
        "    got.append((hasattr(import_litellm(), 'cost_per_token'), price_of_call('openai/gpt-4o-mini', 1000, 10)))\n"
        "threads = [threading.Thread(target=price) for _ in range(8)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(all(whole and cost is not None and cost > 0 for whole, cost in got), len(got))\n"
    )
    shown = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert shown.stdout.strip() == "True 8", shown.stdout + shown.stderr[-2000:]


def test_every_paid_sub_lm_prompt_is_a_unit_the_spending_cap_prices(tmp_path):
    """Regression: only the agent's llm_query counted a sub-role unit, so the proposals, GEPA's reflections and the
    analyses of a run cost the sub role 0 dollars a unit: the cap granted every such request in full and the sub LM
    went past max_cost_usd. Every paid sub-LM prompt is now a unit."""
    from support.optimizing import loop_optimizer
    from support.tickets import RouteTicket, make_splits

    train, val = make_splits()
    optimized = loop_optimizer(tmp_path).compile(RouteTicket(), trainset=train, valset=val)
    paid = optimized.budget["spent_by_kind"][SUB_LM_CALL]
    assert paid > 0 and optimized.usage["sub_units"] == paid


def test_a_resume_keeps_what_the_priced_calls_of_a_role_with_an_unpriced_model_cost():
    """Regression: a role mixing a priced model (an LLM-judge metric) with an unpriced one (a local task LM) was
    written with cost_usd None, and a resume restored it as 0 dollars: the cap then let the two processes together
    spend past max_cost_usd."""
    per_call = float(price_of_call("openai/gpt-4o-mini", 10_000, 100))
    meter = UsageMeter(max_cost_usd=per_call * 3.5)
    meter.record(EVAL, "local/unpriced", {"prompt_tokens": 50, "completion_tokens": 5})
    for _ in range(3):
        meter.record(EVAL, "openai/gpt-4o-mini", {"prompt_tokens": 10_000, "completion_tokens": 100})
    snapshot = meter.snapshot()
    assert snapshot[EVAL]["cost_usd"] is None and snapshot[EVAL]["priced_usd"] == pytest.approx(3 * per_call)
    again = UsageMeter(max_cost_usd=per_call * 3.5)
    again.restore(snapshot)
    again.record(EVAL, "openai/gpt-4o-mini", {"prompt_tokens": 10_000, "completion_tokens": 100})
    assert again.snapshot()[EVAL]["priced_usd"] == pytest.approx(4 * per_call)
    assert again.cap_reached  # the fourth priced call went past the cap, counted with the three before the resume


def test_usage_is_written_within_an_evaluation_not_only_after_it(monkeypatch):
    """Regression: usage.json was written only after an evaluation ended, so a process killed in a long one left
    its calls out: a resumed run said (and its spending cap counted) less than the provider billed."""
    from rlmoptimizer.events import ExampleEvaluated
    from rlmoptimizer.records import ExampleResult
    from rlmoptimizer.usage import UsageObserver

    now = [100.0]
    monkeypatch.setattr("rlmoptimizer.usage.time.monotonic", lambda: now[0])
    meter, written = UsageMeter(), []
    observer = UsageObserver(meter, written.append)
    example = ExampleEvaluated(ExampleResult(0, {}, {}, {}, 1.0, True))
    for second in (0.0, 0.03, 0.06, 0.12, 0.14, 0.25):  # six examples finish over 0.25 s
        now[0] = 100.0 + second
        meter.record(EVAL, "fake", {"prompt_tokens": 10, "completion_tokens": 1})
        observer.on_event(example)
    assert [w[EVAL]["calls"] for w in written] == [1, 4, 6]  # at most one write in 0.1 s, each the latest counts
