"""Long runs through the real sandbox: 60 agent turns that each print close to rlm_max_output_chars, against a
root LM that refuses requests over its window (as providers do), finish with the submission applied, and resume
mid-way; every LM call is counted per role exactly; the spending cap stops spending and says so."""

from __future__ import annotations

import json
import logging
import re
import threading

import dspy
import litellm
import pytest
from dspy.lm15 import Usage
from support.fakes import FunctionLM
from support.optimizing import compile_in
from support.optimizing import optimizer as make_optimizer
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import OptimizationInterrupted

pytestmark = pytest.mark.slow

OUTPUT_CHARS = 2_000
TURNS = 60
_ITERATION = re.compile(r"\[\[ ## iteration ## \]\]\s*(\d+)/")


def turn_code(turn: int) -> dict[str, str]:
    """The agent's turn ``turn`` (1-based): notes, a prompt edit, a sub-LM query, a validation check, prints of
    about OUTPUT_CHARS characters every turn, and a SUBMIT at the end."""
    body = f"print(('turn {turn} analysis ' * 200)[:{OUTPUT_CHARS - 50}])\n"
    if turn == 1:
        body += "print(add_note('the disputes policy is the main failure'))\n"
    if turn == 2:
        body += (
            f"update_prompt('route', {POLICY_PROMPT!r})\nprint(llm_query_batched(['why?', 'how?']))\n"
            "print(llm_query('and one more?'))\n"
        )
    if turn == 3:
        body += "v = evaluate_program(split='val')\nprint('val', v['score'], v.get('note'))\n"
    if turn == 40:
        body += "print(add_note('turn 40: still good'))\n"
    if turn == TURNS:
        body = f"SUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})"
    return {"reasoning": f"Turn {turn}: keep going with the analysis. " * 4, "code": body}


class RefusingRoot:
    """A scripted root LM with a context window: a request over ``window_tokens`` (counted as
    ``chars / chars_per_token``) gets ``litellm.ContextWindowExceededError``, as providers answer."""

    def __init__(
        self,
        window_tokens: int,
        chars_per_token: float = 3.0,
        die_at: int | None = None,
        name: str = "openai/gpt-4o-mini",
        reports_usage: bool = True,
    ) -> None:
        self.window_tokens = window_tokens
        self.reports_usage = reports_usage
        self.chars_per_token = chars_per_token
        self.die_at = die_at
        self.accepted: list[int] = []  # tokens of each answered request
        self.refused: list[int] = []
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self.lm = FunctionLM(self._reply, name=name, usage=self._usage)

    def _usage(self, messages, reply: str) -> Usage:
        """The tokens it bills are the tokens it counts against its window (none, when it reports no usage)."""
        if not self.reports_usage:
            return Usage(input_tokens=0, output_tokens=0, total_tokens=0)
        text = "\n".join(str(m.get("content", "")) for m in messages)
        prompt, out = int(len(text) / self.chars_per_token) + 1, int(len(reply) / self.chars_per_token) + 1
        return Usage(input_tokens=prompt, output_tokens=out, total_tokens=prompt + out)

    def _reply(self, messages):
        text = "\n".join(str(m.get("content", "")) for m in messages)
        tokens = int(len(text) / self.chars_per_token) + 1
        found = _ITERATION.findall(text)
        turn = int(found[-1]) if found else TURNS
        with self._lock:
            if tokens > self.window_tokens:
                self.refused.append(tokens)
                return litellm.ContextWindowExceededError(
                    message=f"This model's maximum context length is {self.window_tokens} tokens, "
                    f"your request has {tokens}",
                    model="m",
                    llm_provider="openai",
                )
            if self.die_at is not None and turn >= self.die_at:
                return dspy.LMAuthError("invalid api key")
            self.accepted.append(tokens)
            self.requests.append(text)
        return turn_code(turn)


def compile_long(directory, root: RefusingRoot, *, task=None, sub=None, stated_window: int | None = None, **kw):
    return compile_in(
        directory,
        root.lm,
        task or FunctionLM(task_lm_reply),
        sub_lm=sub or FunctionLM(lambda m: {"answer": "an answer"}, name="openai/gpt-4o"),
        rlm_max_iterations=TURNS + 5,
        rlm_max_output_chars=OUTPUT_CHARS,
        root_context_window=stated_window or root.window_tokens,
        num_threads=16,
        **kw,
    )


def test_sixty_long_turns_fit_the_window_and_count_every_call_per_role(tmp_path):
    root = RefusingRoot(window_tokens=12_000)
    task = FunctionLM(task_lm_reply, name="openai/gpt-4o-mini")
    sub = FunctionLM(lambda m: {"answer": "an answer"}, name="no-price/sub-model")
    result = compile_long(tmp_path, root, task=task, sub=sub)

    # finished: all turns played, the submission applied and chosen
    assert len(result.agent_trajectory) == TURNS and result.agent_trajectory[-1]["final"]
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT
    # no request was refused (over the window); without compaction they would not fit; once the window has
    # filled, every request still uses more than half of it (compaction keeps what fits, not less)
    assert not root.refused and len(root.accepted) == TURNS
    assert min(root.accepted[TURNS // 2 :]) > root.window_tokens / 2
    assert sum(len(t["output"]) + len(t["code"]) for t in result.agent_trajectory) > 3 * root.window_tokens * 3
    # the state block closes every request; the note of turn 1 is still shown at the end, its step is not
    last = root.requests[-1]
    assert "=== Optimizer state (always current) ===" in last
    assert last.rindex("Optimizer state") > last.rindex("=== Step ")
    assert "[1] the disputes policy is the main failure" in last and "[2] turn 40: still good" in last
    assert "=== Step 1 ===" not in last and "=== Step 59 ===" in last
    # most turns append to the previous request (a prefix cache reuses it): the history part is a prefix
    histories = [r[: r.index("[[ ## iteration ## ]]")] for r in root.requests]
    appends = sum(1 for a, b in zip(histories, histories[1:], strict=False) if b.startswith(a))
    assert appends >= (TURNS - 1) // 2
    # nothing lost: the full outputs are in the trajectory and on disk
    assert all(len(t["output"]) >= OUTPUT_CHARS - 60 for t in result.agent_trajectory[:-1])
    assert len(list((tmp_path / "turns").glob("turn-*.json"))) == TURNS

    # usage per role equals what the fakes reported, exactly (16 evaluation threads)
    usage = result.usage
    for role, lm in (("root", root.lm), ("eval", task), ("sub", sub)):
        reported = lm.reported_usage
        assert usage[role]["calls"] == len(reported), role
        assert usage[role]["input_tokens"] == sum(u.input_tokens for u in reported), role
        assert usage[role]["output_tokens"] == sum(u.output_tokens for u in reported), role
    # two llm_query_batched prompts and one llm_query are sub-LM calls
    assert usage["sub"]["calls"] == 3 and usage["sub"]["cost_usd"] is None
    assert "an answer" in result.agent_trajectory[1]["output"]
    assert usage["root"]["cost_usd"] > 0 and usage["eval"]["cost_usd"] > 0
    assert usage["total"]["calls"] == sum(usage[r]["calls"] for r in ("root", "sub", "eval"))
    on_disk = json.loads((tmp_path / "result.json").read_text())
    assert on_disk["usage"] == usage == json.loads((tmp_path / "usage.json").read_text())
    assert json.loads((tmp_path / "notes.json").read_text())["notes"][0]["text"].startswith("the disputes")


def test_a_root_lm_that_refuses_more_than_estimated_still_finishes(tmp_path):
    # the user states a 12k window, the model counts 2 chars a token and reports no usage to learn that from:
    # requests near the estimate are refused
    root = RefusingRoot(window_tokens=12_000, chars_per_token=2.0, reports_usage=False)
    result = compile_long(tmp_path, root)
    # one refusal, and the next view compacts harder for good: that turn asked again, no other turn refused
    assert len(root.refused) == 1, "the scenario must make the root LM refuse once"
    assert len(root.accepted) == TURNS
    assert len(result.agent_trajectory) == TURNS and result.optimized_dspy_program["route"] == POLICY_PROMPT


def test_the_window_follows_the_tokens_the_root_lm_reports(tmp_path):
    # the same model, reporting its usage: its 2 characters a token are learned from the first turn on, and no
    # request is refused; a 5-character tokenizer gets more history shown than the default estimate allows
    dense = RefusingRoot(window_tokens=12_000, chars_per_token=2.0)
    compile_long(tmp_path / "dense", dense)
    assert not dense.refused and len(dense.accepted) == TURNS
    assert min(dense.accepted[TURNS // 2 :]) > dense.window_tokens / 2  # the learned ratio fills the window
    sparse, default = (
        RefusingRoot(window_tokens=12_000, chars_per_token=5.0),
        RefusingRoot(12_000, 5.0, reports_usage=False),
    )
    compile_long(tmp_path / "sparse", sparse)
    compile_long(tmp_path / "default", default)
    assert not sparse.refused and len(sparse.accepted) == TURNS
    assert sum(sparse.accepted) > 1.3 * sum(default.accepted)  # more of the window used, turn after turn


def test_an_interrupted_long_run_resumes_within_the_window(tmp_path):
    first = RefusingRoot(window_tokens=12_000, die_at=35)
    with pytest.raises(OptimizationInterrupted):
        compile_long(tmp_path, first)
    assert len(list((tmp_path / "turns").glob("turn-*.json"))) == 34
    stopped_usage = json.loads((tmp_path / "usage.json").read_text())
    assert stopped_usage["root"]["calls"] == len(first.lm.reported_usage)  # an interrupted run says what it spent

    second = RefusingRoot(window_tokens=12_000)
    result = compile_long(tmp_path, second)
    assert not second.refused and len(second.accepted) == TURNS - 34
    # the restored history is compacted on the first turn: the last step shown whole, the first one not
    assert "=== Step 34 ===" in second.requests[0] and "=== Step 1 ===" not in second.requests[0]
    assert "[1] the disputes policy is the main failure" in second.requests[0]  # notes survive the resume
    assert len(result.agent_trajectory) == TURNS and result.optimized_dspy_program["route"] == POLICY_PROMPT
    assert result.usage["root"]["calls"] == len(first.lm.reported_usage) + len(second.lm.reported_usage)


def capped_compile(directory, turns: list[dict[str, str]]):
    """A compile whose evaluation LM has a price and a ``max_cost_usd`` that the first turn's train evaluation
    reaches (after 4 examples); the root LM plays ``turns`` (the last one again after the end), costs next to
    nothing and records every request."""

    def priced(input_tokens):
        return lambda messages, text: Usage(input_tokens=input_tokens, output_tokens=0)

    per_call = litellm.cost_per_token(model="openai/gpt-4o-mini", prompt_tokens=100_000, completion_tokens=0)[0]
    task = FunctionLM(task_lm_reply, name="openai/gpt-4o-mini", usage=priced(100_000))
    train, val = make_splits()
    baseline_cost = 2 * per_call * (len(train) + len(val))  # two predictor calls per example
    first = {
        "reasoning": "fix",
        "code": f"update_prompt('route', {POLICY_PROMPT!r})\n"
        "r = evaluate_program()\nprint('train', r['evaluated_count'], r['note'])",
    }
    script = [first, *turns]

    def play(messages):
        text = "\n".join(str(m.get("content", "")) for m in messages)
        return script[min(int(_ITERATION.findall(text)[-1]) - 1, len(script) - 1)]

    root = FunctionLM(play, name="openai/gpt-4o-mini", usage=priced(10))
    optimizer = make_optimizer(
        root, eval_lm=task, run_storage_dir=directory, max_cost_usd=baseline_cost + 4.5 * 2 * per_call
    )
    result = optimizer.compile(student=RouteTicket(), trainset=train, valset=val, metric=metric)
    return result, optimizer, root, task


def test_the_spending_cap_stops_evaluations_and_leaves_three_turns_to_submit(tmp_path):
    """After the cap the agent has 3 more turns: a SUBMIT in the third is the agent's own, not cut short."""
    result, optimizer, root, task = capped_compile(
        tmp_path,
        [
            {
                "reasoning": "check",
                "code": "v = evaluate_program(split='val')\nprint('val', v['evaluated_count'], v['note'])",
            },
            {"reasoning": "think", "code": "print(optimization_status()['budget_left'])"},
            {"reasoning": "submit", "code": f"SUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})"},
        ],
    )
    train, val = make_splits()
    outputs = [t["output"] for t in result.agent_trajectory]
    assert outputs[0].startswith("train 4 ") and "spending cap reached" in outputs[0]
    assert outputs[1].startswith("val 0 ") and "spending cap reached" in outputs[1]
    assert [t["iteration"] for t in result.agent_trajectory] == [1, 2, 3, 4] and result.agent_trajectory[-1]["final"]
    assert "SUBMIT" in result.agent_trajectory[-1]["code"] and len(root.calls) == 4
    assert "current instructions were submitted" not in result.agent_final_reasoning
    assert result.selection["spending_cap_reached"] is True
    assert "spending cap reached" in result.selection["reason"]
    assert result.selection["chosen_label"] == "baseline"  # the unchecked submission is not returned
    assert result.usage["cap_reached"] is True
    assert result.usage["eval"]["calls"] == len(task.reported_usage) == 2 * (len(train) + len(val) + 4)
    assert result.usage["total"]["cost_usd"] <= optimizer.max_cost_usd


def test_an_agent_that_never_submits_after_the_cap_is_stopped_three_turns_later(tmp_path, caplog):
    """The turns cost too: 3 turns after the cap the run ends with the current instructions, without another
    root-LM call."""
    looks = [
        {"reasoning": f"keep looking {i}", "code": f"print({i}, optimization_status()['budget_left'])"}
        for i in range(2, 9)
    ]
    with caplog.at_level(logging.WARNING, logger="rlmoptimizer"):
        result, _, root, _ = capped_compile(tmp_path, looks)
    assert "spending cap reached" in result.agent_trajectory[0]["output"]
    assert [t["iteration"] for t in result.agent_trajectory] == [1, 2, 3, 4, 5]
    *turns, ended = result.agent_trajectory  # the last record says how the run ended: no code, no LM call
    assert not any(t.get("final") for t in turns) and ended["final"] and ended["code"] == ""
    assert ended["submitted_by"] == "the agent's current instructions (its run ended without a SUBMIT)"
    assert len(root.calls) == 4  # no fifth turn, and no extraction call either
    assert result.agent_final_reasoning.endswith("the current instructions were submitted.")
    assert "did not SUBMIT within 3 turns" in caplog.text
    assert result.selection["spending_cap_reached"] is True and result.selection["chosen_label"] == "baseline"
