"""A root context window too small for the fixed part of the agent's requests is refused when the optimizer is
built, naming the smallest window that works. Regression: ``root_context_window=4000`` was accepted although the
first request's fixed part alone (instructions, tools, brief, optimizer state) was about 19,000 characters; a root
LM that refuses over its window got the same request five times, and the run stopped after the baselines."""

from __future__ import annotations

import re
import threading

import litellm
import pytest
from dspy.lm15 import Usage
from support.fakes import FunctionLM
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import ConfigurationError, RLMDocstringOptimizer

_ITERATION = re.compile(r"\[\[ ## iteration ## \]\]\s*(\d+)/")
_SMALLEST = re.compile(r"smallest window that works is ([\d,]+) tokens")

TURNS = [
    {"reasoning": "look", "code": "print(len(baseline_train['examples']), ('x' * 3000))"},
    {"reasoning": "note", "code": "print(add_note('route misses the disputes policy'))"},
    {
        "reasoning": "fix",
        "code": f"update_prompt('route', {POLICY_PROMPT!r})\nprint(evaluate_program(split='val')['score'])",
    },
    {"reasoning": "submit", "code": f"SUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})"},
]


class WindowedRoot:
    """A scripted root LM that refuses, as providers do, any request over ``window`` tokens, counting (and
    billing) 4 characters a token, as common tokenizers do with English prose."""

    def __init__(self, window: int, **kwargs) -> None:
        self.window = window
        self.accepted: list[int] = []
        self.refused: list[int] = []
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self.lm = FunctionLM(self._reply, name="local/windowed-root", usage=self._usage, **kwargs)

    def _usage(self, messages, reply: str) -> Usage:
        """The tokens it bills are the tokens it counts against its window."""
        prompt = len("\n".join(str(m.get("content", "")) for m in messages)) // 4 + 1
        return Usage(input_tokens=prompt, output_tokens=len(reply) // 4 + 1, total_tokens=prompt + len(reply) // 4 + 1)

    def _reply(self, messages):
        text = "\n".join(str(m.get("content", "")) for m in messages)
        tokens = len(text) // 4 + 1
        with self._lock:
            if tokens > self.window:
                self.refused.append(tokens)
                return litellm.ContextWindowExceededError(
                    message=f"maximum context length is {self.window} tokens, your request has {tokens}",
                    model="m",
                    llm_provider="openai",
                )
            self.accepted.append(tokens)
            self.requests.append(text)
        turn = int(_ITERATION.findall(text)[-1])
        return TURNS[min(turn, len(TURNS)) - 1]


def smallest_named(**kwargs) -> int:
    root = WindowedRoot(4_000)
    with pytest.raises(ConfigurationError) as caught:
        RLMDocstringOptimizer(root_lm=root.lm, root_context_window=4_000, **kwargs)
    message = str(caught.value)
    assert "root_context_window=4000" in message and "characters" in message
    assert not root.lm.calls  # refused before any LM call
    return int(_SMALLEST.search(message).group(1).replace(",", ""))


@pytest.mark.slow
def test_a_window_smaller_than_the_fixed_part_is_refused_and_the_named_window_runs_to_the_end(tmp_path):
    smallest = smallest_named()
    assert 4_000 < smallest < 6_000  # the fixed part is ~9,500 characters, plus the reply kept free
    with pytest.raises(ConfigurationError, match=f"smallest window that works is {smallest:,} tokens"):
        RLMDocstringOptimizer(root_lm=WindowedRoot(4_000).lm, root_context_window=smallest - 1)

    # compile() measures again with the program's steps and data, before any LM call
    task = FunctionLM(task_lm_reply)
    trainset, valset = make_splits()
    root = WindowedRoot(smallest)
    optimizer = RLMDocstringOptimizer(root_lm=root.lm, eval_lm=task, root_context_window=smallest)
    with pytest.raises(ConfigurationError, match="for this program and data") as caught:
        optimizer.compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)
    assert not task.calls and not root.lm.calls
    needed = int(_SMALLEST.search(str(caught.value)).group(1).replace(",", ""))
    assert smallest < needed < smallest + 200  # two steps and a validation split: a little more

    # the window it names is enough: a root LM with exactly that window runs every turn, refusing none
    root = WindowedRoot(needed)
    optimized = RLMDocstringOptimizer(
        max_iterations=2,
        root_lm=root.lm,
        eval_lm=task,
        root_context_window=needed,
        run_storage_dir=tmp_path,
        rlm_autopilot="off",  # the scripted turns are the whole run (the pilot would reflect with this root LM)
    ).compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)
    assert not root.refused and len(root.accepted) == len(TURNS)
    # ... and the agent reads its last turn in every request after the first
    assert all(f"=== Step {turn} ===" in request for turn, request in enumerate(root.requests[1:], start=1))
    assert optimized.optimized_dspy_program["route"] == POLICY_PROMPT
    assert optimized.selection["chosen_label"] != "baseline"


def test_the_reply_kept_free_is_part_of_the_smallest_window():
    # the window keeps the root LM's max_tokens free for its reply (up to a quarter of the window): 500 more tokens
    # of reply, 500 more of window
    assert smallest_named_with_max_tokens(1_000) - smallest_named_with_max_tokens(500) == 500


def smallest_named_with_max_tokens(max_tokens: int) -> int:
    root = WindowedRoot(4_000)
    root.lm.kwargs["max_tokens"] = max_tokens
    with pytest.raises(ConfigurationError) as caught:
        RLMDocstringOptimizer(root_lm=root.lm, root_context_window=4_000)
    return int(_SMALLEST.search(str(caught.value)).group(1).replace(",", ""))


def test_a_program_whose_brief_does_not_fit_is_refused_at_compile_before_any_lm_call():
    """The constructor measures the fixed part with a one-step brief; compile() measures it again with the real
    program's, before the baselines."""
    smallest = smallest_named()
    fields = ", ".join(f"input_field_number_{i}" for i in range(400))
    wide = RouteTicket()
    wide.route = __import__("dspy").Predict(f"{fields} -> queue")
    task = FunctionLM(task_lm_reply)
    root = WindowedRoot(smallest)
    optimizer = RLMDocstringOptimizer(root_lm=root.lm, eval_lm=task, root_context_window=smallest)
    trainset, _ = make_splits()
    with pytest.raises(ConfigurationError, match="smallest window that works is"):
        optimizer.compile(student=wide, trainset=trainset, metric=metric)
    assert not task.calls and not root.lm.calls


def test_measuring_the_window_refuses_no_budget_itself():
    """The constructor measures with a one-example placeholder: a max_metric_calls only the real data can judge is
    still judged by compile(), naming the real sizes."""
    optimizer = RLMDocstringOptimizer(
        root_lm=WindowedRoot(100_000).lm, eval_lm=FunctionLM(task_lm_reply), max_metric_calls=1
    )
    trainset, valset = make_splits()
    with pytest.raises(ConfigurationError, match=r"\(8 validation examples\)"):
        optimizer.compile(student=RouteTicket(), trainset=trainset, valset=valset, metric=metric)
