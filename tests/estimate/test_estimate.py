"""The cost estimate: its arithmetic on real dspy programs with known prompt sizes, that it calls no LM, that a
verbose compile shows it first, and that the result and the run report show it beside what the run spent.

The offline LMs count tokens as their usage reports them (words), so an estimate made with them can be checked
token for token against what they then report."""

from __future__ import annotations

import json

import dspy
import pytest
from rich.console import Console
from support.fakes import FunctionLM
from support.optimizing import proposer
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import ConfigurationError, CostEstimate, RLMDocstringOptimizer
from rlmoptimizer.__main__ import main
from rlmoptimizer.budget import gepa_metric_calls
from rlmoptimizer.estimate._dspy import InstructionProposer
from rlmoptimizer.estimate.plan import RUNS_PER_ITERATION
from rlmoptimizer.estimate.sizes import PROPOSAL_TOKENS, REASONING_TOKENS, ROOT_OUTPUT_TOKENS, ROOT_REPLY_TOKENS
from rlmoptimizer.report.costs import CostCheck
from rlmoptimizer.usage import price_of_call

QA = [("What is the capital of France?", "Paris"), ("How many legs has a spider?", "eight")] * 5
REASONING = " ".join(["word"] * REASONING_TOKENS)


def qa_examples() -> list[dspy.Example]:
    return [dspy.Example(question=q, answer=a).with_inputs("question") for q, a in QA]


def qa_reply(messages):
    """Answers with the label (after exactly as much reasoning as the estimate assumes, when asked to reason), as
    dspy's ChatAdapter asks a reply to be written, its closing marker included."""
    question = messages[-1]["content"].split("[[ ## question ## ]]", 1)[1].split("Respond with", 1)[0].strip()
    reasoning = f"[[ ## reasoning ## ]]\n{REASONING}\n\n" if "`reasoning`" in messages[0]["content"] else ""
    return f"{reasoning}[[ ## answer ## ]]\n{dict(QA)[question]}\n\n[[ ## completed ## ]]\n"


def raises(messages):
    raise AssertionError("an LM was called")


def test_a_call_is_counted_as_the_lm_will_report_it_for_predict_and_chain_of_thought():
    for module in (dspy.Predict("question -> answer"), dspy.ChainOfThought("question -> answer")):
        lm = FunctionLM(qa_reply, name="qa-lm")
        examples = qa_examples()
        optimizer = RLMDocstringOptimizer(max_iterations=2, rlm_autopilot="loop", sub_lm=lm, eval_lm=lm)
        estimate = optimizer.estimate(module, trainset=examples[:6], valset=examples[6:])
        with dspy.context(lm=lm):
            for example in examples:
                module(**example.inputs())
        reported_in = sum(u.input_tokens for u in lm.reported_usage) / len(examples)
        reported_out = sum(u.output_tokens for u in lm.reported_usage) / len(examples)
        # 23.6 runs (see the arithmetic below), each call as the LM reports it; the 13.6 runs of candidates have a
        # proposed instruction of PROPOSAL_TOKENS in place of the program's own
        row = estimate.role("eval")
        growth = PROPOSAL_TOKENS - len(module.predictors()[0].signature.instructions.split())
        assert row.calls == round(23.6) == estimate.program_runs
        assert row.input_tokens == round(23.6 * reported_in + 13.6 * growth)
        assert row.output_tokens == round(23.6 * reported_out)


def test_the_arithmetic_of_the_budget_on_a_known_program():
    """max_iterations=2, 6 train and 4 validation examples: 16 units; a GEPA iteration costs 4 runs and its
    reflection 1 unit; one accepted child is checked on the 4 validation examples: (16 - 4) / 5 = 2.4 proposals, and
    the 13.6 units left are runs, after the 10 free baseline runs."""
    lm = FunctionLM(qa_reply, name="qa-lm")
    examples = qa_examples()
    optimizer = RLMDocstringOptimizer(max_iterations=2, rlm_autopilot="loop", sub_lm=lm, eval_lm=lm)
    estimate = optimizer.estimate(dspy.Predict("question -> answer"), trainset=examples[:6], valset=examples[6:])
    assert RUNS_PER_ITERATION * 3 == 4
    assert (estimate.baseline_runs, estimate.program_runs, estimate.proposals) == (10, 24, 2)  # 23.6 and 2.4 shown
    assert estimate.role("eval").calls == 24 and estimate.role("sub").calls == 2
    assert estimate.role("root").calls == 0 and estimate.root_turns == 0
    assert estimate.if_solved_early.calls < estimate.total.calls < estimate.at_most.calls
    reply = dspy.JSONAdapter().format_assistant_message_content(
        InstructionProposer().propose.signature, {"new_instruction": " ".join(["word"] * PROPOSAL_TOKENS)}
    )
    assert estimate.role("sub").output_tokens == round(2.4 * len(reply.split()))  # a reply as JSONAdapter writes it


def test_the_agent_turns_grow_by_the_history_they_carry():
    lm = FunctionLM(qa_reply, name="qa-lm")
    examples = qa_examples()
    optimizer = RLMDocstringOptimizer(max_iterations=2, root_lm=lm, eval_lm=lm)
    one = optimizer.estimate(dspy.Predict("question -> answer"), trainset=examples, root_turns=1).role("root")
    four = optimizer.estimate(dspy.Predict("question -> answer"), trainset=examples, root_turns=4).role("root")
    per_turn = ROOT_REPLY_TOKENS + ROOT_OUTPUT_TOKENS
    assert four.calls == 4 and four.input_tokens == 4 * one.input_tokens + (0 + 1 + 2 + 3) * per_turn
    assert four.output_tokens == 4 * ROOT_REPLY_TOKENS
    assert optimizer.estimate(dspy.Predict("question -> answer"), trainset=examples).root_turns == 5  # assist


def test_dollars_come_from_litellm_and_the_cap_is_judged_against_them():
    model = "openai/gpt-4o-mini"
    trainset, valset = make_splits()
    lm = FunctionLM(task_lm_reply, name=model)
    estimate = RLMDocstringOptimizer(max_iterations=2, rlm_autopilot="loop", sub_lm=lm, eval_lm=lm).estimate(
        RouteTicket(), trainset=trainset, valset=valset
    )
    sub = estimate.role("sub")
    per_call = price_of_call(model, round(sub.input_tokens / sub.calls), round(sub.output_tokens / sub.calls))
    assert sub.cost_usd == pytest.approx(float(per_call) * sub.calls, rel=0.05)
    assert estimate.cost_usd == pytest.approx(sum(r.cost_usd for r in estimate.roles))
    below = RLMDocstringOptimizer(
        max_iterations=2, rlm_autopilot="loop", sub_lm=lm, eval_lm=lm, max_cost_usd=estimate.cost_usd / 2
    ).estimate(RouteTicket(), trainset=trainset, valset=valset)
    assert "will stop the run early, after about 50%" in below.cap
    above = RLMDocstringOptimizer(
        max_iterations=2, rlm_autopilot="loop", sub_lm=lm, eval_lm=lm, max_cost_usd=10 * estimate.at_most.cost_usd
    ).estimate(RouteTicket(), trainset=trainset, valset=valset)
    assert "it should not stop the run, unless replies run longer than assumed" in above.cap  # sizes assumed
    eval_usd = estimate.role("eval").cost_usd
    baselines = eval_usd * estimate.baseline_runs / estimate.program_runs
    tiny = RLMDocstringOptimizer(
        max_iterations=2, rlm_autopilot="loop", sub_lm=lm, eval_lm=lm, max_cost_usd=baselines / 4
    ).estimate(RouteTicket(), trainset=trainset, valset=valset)
    assert "below what the unchanged program's baselines are expected to cost" in tiny.cap  # they run whole
    unpriced = RLMDocstringOptimizer(
        max_iterations=2, rlm_autopilot="loop", sub_lm=lm, eval_lm=FunctionLM(task_lm_reply), max_cost_usd=1.0
    ).estimate(RouteTicket(), trainset=trainset, valset=valset)
    assert unpriced.cost_usd is None and "litellm has no price for fake" in unpriced.cap
    assert "unknown" in str(unpriced)
    # one step on an unpriced LM, the eval LM priced: only the unpriced one is named as such
    mixed = RouteTicket()
    mixed.route.lm = FunctionLM(task_lm_reply, name="local/my-finetune")
    named = RLMDocstringOptimizer(
        max_iterations=2, rlm_autopilot="loop", sub_lm=lm, eval_lm=lm, max_cost_usd=1.0
    ).estimate(mixed, trainset=trainset, valset=valset)
    assert "litellm has no price for local/my-finetune" in named.cap and model not in named.cap.split("price for")[1]
    assert "dollars unknown: litellm has no price for local/my-finetune\n" in str(named) + "\n"


def test_estimate_calls_no_lm():
    trainset, valset = make_splits()
    lm = FunctionLM(raises, name="raises")
    optimizer = RLMDocstringOptimizer(max_iterations=3, root_lm=lm, sub_lm=lm, eval_lm=lm, metric=metric)
    with dspy.context(lm=lm):
        estimate = optimizer.estimate(RouteTicket(), trainset=trainset, valset=valset)
    assert lm.calls == [] and estimate.total.calls > 0
    assert all(len(line) <= 80 for line in str(estimate).splitlines())
    assert CostEstimate.from_dict(json.loads(json.dumps(estimate.to_dict()))) == estimate


def test_a_sample_pays_for_a_few_runs_and_measures_them():
    trainset, valset = make_splits()
    lm = FunctionLM(task_lm_reply, name="task")
    optimizer = RLMDocstringOptimizer(max_iterations=3, rlm_autopilot="loop", sub_lm=proposer(), eval_lm=lm)
    assumed = optimizer.estimate(RouteTicket(), trainset=trainset, valset=valset)
    sampled = optimizer.estimate(RouteTicket(), trainset=trainset, valset=valset, metric=metric, sample=2)
    assert len(lm.calls) == 2 * 2 and sampled.sampled == 2  # two steps a run
    # the fake task LM reasons in 3 words, not the REASONING_TOKENS assumed: the sample sees it
    assert sampled.role("eval").output_tokens < assumed.role("eval").output_tokens
    per_call = sum(u.output_tokens for u in lm.reported_usage) / len(lm.reported_usage)
    marker = len("[[ ## completed ## ]]".split())  # dspy's adapter asks for it; the offline LM leaves it out
    eval_row = sampled.role("eval")  # its calls are rounded (113.6 shown as 114)
    assert eval_row.output_tokens == pytest.approx(eval_row.calls * (per_call + marker), rel=0.01)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sample": 99}, "sample must be an int from 0 to 12"),
        ({"sample": 1}, "sample= runs the metric too"),
        ({"seconds_per_call": -1}, "seconds_per_call must be seconds >= 0"),
        ({"seconds_per_call": {"judge": 1}}, "'eval', 'sub' and 'root'"),
        ({"root_turns": 1.5}, "root_turns must be an int"),
        ({"adapter": "json"}, r"adapter must be a dspy adapter, e.g. dspy.JSONAdapter\(\) .* got 'json'"),
        ({"adapter": 3}, "adapter must be a dspy adapter"),
        ({"adapter": dspy.JSONAdapter}, r"a class: pass an instance"),
    ],
)
def test_bad_arguments_are_refused_before_any_lm_call(kwargs, message):
    trainset, valset = make_splits()
    lm = FunctionLM(raises)
    with pytest.raises(ConfigurationError, match=message):
        RLMDocstringOptimizer(rlm_autopilot="loop", sub_lm=lm, eval_lm=lm).estimate(
            RouteTicket(), trainset=trainset, valset=valset, **kwargs
        )
    assert lm.calls == []


def _loop_compile(tmp_path, console=None, **kwargs):
    trainset, valset = make_splits()
    optimizer = RLMDocstringOptimizer(
        max_iterations=3,
        rlm_autopilot="loop",
        sub_lm=proposer(POLICY_PROMPT),
        eval_lm=FunctionLM(task_lm_reply, name="task"),
        run_storage_dir=tmp_path / "run",
        verbose=console is not None,
        console=console,
        **kwargs,
    )
    return optimizer.compile(RouteTicket(), trainset=trainset, valset=valset, metric=metric)


def test_a_verbose_compile_shows_the_estimate_before_its_first_paid_call_and_the_check_at_the_end(tmp_path):
    console = Console(record=True, width=100)
    optimized = _loop_compile(tmp_path, console)
    out = console.export_text()
    assert out.index("Cost estimate (before any paid call)") < out.index("run-0001 baseline")
    assert out.index("Cost: predicted before the run, and spent") > out.index("Done:")
    assert f"plan: {optimized.cost_estimate.program_runs} program runs" in out


def test_the_result_and_the_report_show_predicted_beside_spent(tmp_path, capsys):
    optimized = _loop_compile(tmp_path)
    estimate, check = optimized.cost_estimate, optimized.cost_check
    assert isinstance(estimate, CostEstimate) and isinstance(check, CostCheck)
    for role in ("eval", "sub", "root", "total"):
        row = check.row(role)
        assert row.actual.calls == optimized.usage[role]["calls"]
        assert row.actual.input_tokens == optimized.usage[role]["input_tokens"]
    assert check.row("eval").predicted == estimate.role("eval")
    # the policy is found by the first proposal: the run is the estimate's solved-early case, within 25% in tokens
    assert 0.75 <= check.row("total").solved_early_ratio <= 1.25
    assert 0.75 <= check.row("eval").actual.calls / check.row("eval").solved_early.calls <= 1.25
    assert CostEstimate.from_dict(json.loads((tmp_path / "run" / "estimate.json").read_text())) == estimate
    assert main(["report", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "Cost: predicted before the run, and spent" in out
    assert f"{estimate.role('eval').calls:>7,}" in out and f"{optimized.usage['eval']['calls']:>7,}" in out


def test_a_resumed_or_read_back_compile_keeps_the_estimate_made_before_the_first_paid_call(tmp_path):
    first = _loop_compile(tmp_path)
    stored = (tmp_path / "run" / "estimate.json").read_text()
    again = _loop_compile(tmp_path)  # a finished run, read back
    assert again.cost_estimate == first.cost_estimate
    assert (tmp_path / "run" / "estimate.json").read_text() == stored


def test_a_kept_estimate_is_judged_again_against_the_cap_a_resume_gives():
    """Regression: a run resumed with a higher max_cost_usd showed the first compile's verdict ("it will stop the
    run early") about a cap no longer in force."""
    from rlmoptimizer.estimate.model import with_cap

    trainset, valset = make_splits()
    lm = FunctionLM(task_lm_reply, name="openai/gpt-4o-mini")
    settings = {"max_iterations": 2, "rlm_autopilot": "loop", "sub_lm": lm, "eval_lm": lm}
    expected = RLMDocstringOptimizer(**settings).estimate(RouteTicket(), trainset=trainset, valset=valset).cost_usd
    low = RLMDocstringOptimizer(**settings, max_cost_usd=expected / 2).estimate(
        RouteTicket(), trainset=trainset, valset=valset
    )
    assert "will stop the run early" in low.cap
    raised = with_cap(CostEstimate.from_dict(json.loads(json.dumps(low.to_dict()))), 3 * expected)
    assert raised.max_cost_usd == 3 * expected and "it should not stop the run" in raised.cap
    assert raised.roles == low.roles and with_cap(low, low.max_cost_usd) is low


def test_an_estimate_that_cannot_be_made_never_fails_the_compile(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise ValueError("no estimate today")

    monkeypatch.setattr("rlmoptimizer.estimate.estimate_cost", broken)
    optimized = _loop_compile(tmp_path)
    assert optimized.cost_estimate is None and optimized.cost_check is None
    assert "Could not estimate what this compile will cost (ValueError: no estimate today)" in caplog.text
    assert optimized.selection["chosen_score"] == 1.0


def test_dspy_callbacks_are_not_told_of_the_prompts_an_estimate_renders():
    from dspy.utils.callback import BaseCallback

    class Seen(BaseCallback):
        events: list[str] = []

        def on_adapter_format_start(self, call_id, instance, inputs):
            self.events.append("format")

    trainset, valset = make_splits()
    lm = FunctionLM(raises)
    with dspy.context(callbacks=[Seen()]):
        RLMDocstringOptimizer(rlm_autopilot="loop", sub_lm=lm, eval_lm=lm).estimate(
            RouteTicket(), trainset=trainset, valset=valset
        )
    assert Seen.events == []


@pytest.mark.parametrize("sized", [{"auto": "light"}, {"max_full_evals": 3}])
def test_a_budget_given_as_dspy_gepa_gives_it_is_estimated_at_the_size_compile_runs_it(sized):
    """auto= and max_full_evals= stand for a max_metric_calls sized on the program and data, as compile() sizes
    them: the estimate prices that budget, not a default one."""
    lm = FunctionLM(qa_reply, name="qa-lm")
    examples = qa_examples()
    train, val = examples[:6], examples[6:]
    program = dspy.Predict("question -> answer")
    calls = gepa_metric_calls(sized.get("auto"), sized.get("max_full_evals"), 1, len(train), len(val))
    given = RLMDocstringOptimizer(**sized, rlm_autopilot="loop", sub_lm=lm, eval_lm=lm)
    explicit = RLMDocstringOptimizer(max_metric_calls=calls, rlm_autopilot="loop", sub_lm=lm, eval_lm=lm)
    estimate = given.estimate(program, trainset=train, valset=val)
    assert estimate == explicit.estimate(program, trainset=train, valset=val)
    assert f"max_metric_calls={calls}" in estimate.setting
    assert given.max_metric_calls is None  # sized per call, not kept


def test_an_adapter_given_renders_the_requests_the_estimate_counts():
    trainset, valset = make_splits()
    lm = FunctionLM(raises)
    optimizer = RLMDocstringOptimizer(rlm_autopilot="loop", sub_lm=lm, eval_lm=lm)
    chat = optimizer.estimate(RouteTicket(), trainset=trainset, valset=valset, adapter=dspy.ChatAdapter())
    as_json = optimizer.estimate(RouteTicket(), trainset=trainset, valset=valset, adapter=dspy.JSONAdapter())
    assert chat.role("eval").input_tokens != as_json.role("eval").input_tokens and lm.calls == []
