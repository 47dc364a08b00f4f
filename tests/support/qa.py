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


class Triage(dspy.Module):
    """A router and two handlers: each example runs the router and one handler (the billing one twice)."""

    def __init__(self):
        super().__init__()
        self.route = dspy.Predict("question -> team")
        self.billing = dspy.Predict("question -> billing_reply")
        self.tech = dspy.Predict("question -> tech_reply")

    def forward(self, question):
        if self.route(question=question).team == "billing":
            first = self.billing(question=question).billing_reply
            return dspy.Prediction(answer=self.billing(question=question + " " + first).billing_reply)
        return dspy.Prediction(answer=self.tech(question=question).tech_reply)


def triage_lm(unparsed_in: str):
    """q0, q1 go to billing and q2, q3 to tech; ``unparsed_in`` answers out of format on q1 and q3 (for billing,
    on its second call only)."""
    counts: dict[str, int] = {}

    def reply(messages):
        wanted = system_text(messages).split("Your output fields are:")[1].split("All interactions")[0]
        step = next(s for s in ("team", "billing_reply", "tech_reply") if f"`{s}`" in wanted)
        question = field(messages, "question")
        number = int(question.split()[0][1:])
        if step == "team":
            return {"team": "billing" if number < 2 else "tech"}
        counts[question] = counts.get(question, 0) + 1
        if step.startswith(unparsed_in) and number % 2 and (step != "billing_reply" or " " in question):
            return "Sorry, I will answer in my own words."
        return {step: f"a{number}"}

    return FunctionLM(reply)
