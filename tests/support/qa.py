"""A small question-answering task for evaluation tests: examples, fake LMs that answer them, programs."""

from __future__ import annotations

import re

import dspy

from rlmoptimizer.evaluation.evaluator import Evaluator
from rlmoptimizer.metric import Metric
from support.fakes import FunctionLM, last_user_text, system_text


def field(messages: list[dict], name: str) -> str:
    """The value of input field ``name`` in the last user message (ChatAdapter format)."""
    match = re.search(rf"\[\[ ## {name} ## \]\]\n(.*?)(?:\n\n|$)", last_user_text(messages), re.S)
    return match.group(1) if match else ""


def examples(n: int) -> list[dspy.Example]:
    return [dspy.Example(question=f"q{i}", answer=f"a{i}").with_inputs("question") for i in range(n)]


def echo_lm(**kwargs) -> FunctionLM:
    """Answers ``a<i>`` to question ``q<i>`` (with a reasoning field for ChainOfThought)."""
    return FunctionLM(lambda m: {"reasoning": "because", "answer": field(m, "question").replace("q", "a")}, **kwargs)


def exact(example, prediction):
    return example.answer == prediction.answer


def make_evaluator(lm, metric=exact, **kwargs) -> Evaluator:
    return Evaluator(metric=Metric(metric), lm=lm, **kwargs)


class TwoSteps(dspy.Module):
    def __init__(self):
        super().__init__()
        self.draft = dspy.Predict("question -> draft")
        self.generate = dspy.ChainOfThought("question, draft -> answer")

    def forward(self, question):
        draft = self.draft(question=question).draft
        return self.generate(question=question, draft=draft)


class Outer(dspy.Module):
    def __init__(self):
        super().__init__()
        self.inner = TwoSteps()
        self.polish = dspy.Predict("draft_answer -> answer")

    def forward(self, question):
        return self.polish(draft_answer=self.inner(question=question).answer)


def two_step_lm(**kwargs) -> FunctionLM:
    def reply(messages):
        if "`draft`" in system_text(messages).split("Your output fields are:")[1].split("All interactions")[0]:
            return {"draft": "D:" + field(messages, "question")}
        if "`reasoning`" in system_text(messages):
            return {"reasoning": "r", "answer": field(messages, "question").replace("q", "a")}
        return {"answer": field(messages, "draft_answer")}

    return FunctionLM(reply, **kwargs)
