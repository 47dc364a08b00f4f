"""A program with a ``dspy.Image`` input: the data's media stays in the REPL and never becomes a part of a root-LM
request (a text-only root LM refuses one; any other is paid for an image nobody asked it to look at).

Regression: a train example's image input is recorded as dspy's custom-type marker; the agent printed the
example's inputs (a usual first move) and dspy's adapter sent the next turn with an ``image_url`` part."""

from __future__ import annotations

import dspy
import pytest
from support.fakes import FunctionLM, scripted_agent
from support.optimizing import SUBMIT_CURRENT

from rlmoptimizer import RLMDocstringOptimizer
from rlmoptimizer.agent.texts import without_media

IMAGE = dspy.Image("https://example.com/cat.png")


class Parity(dspy.Signature):
    """Say whether the number is even or odd."""

    number: str = dspy.InputField()
    picture: dspy.Image = dspy.InputField()
    label: str = dspy.OutputField()


def task_reply(messages):
    text = " ".join(str(m.get("content", "")) for m in messages)
    return {"label": "even" if "says even" in text else "odd"}


def examples(start: int) -> list[dspy.Example]:
    return [
        dspy.Example(number=str(n), picture=IMAGE, label="even" if n % 2 == 0 else "odd").with_inputs(
            "number", "picture"
        )
        for n in range(start, start + 6)
    ]


def metric(example, prediction, trace=None):
    return float(example.label == prediction.label)


def parts(messages: list[dict]) -> set[str]:
    return {
        part.get("type") if isinstance(part, dict) else "text"
        for message in messages
        for part in (message["content"] if isinstance(message.get("content"), list) else [message.get("content")])
    }


def test_media_blocks_become_a_line_and_a_lone_marker_stays_text():
    marked = str(IMAGE)  # as dspy renders it into a prompt, and as a run's records hold it
    assert "CUSTOM-TYPE" in marked
    shown = without_media(f"inputs: {{'picture': {marked!r}}} and more")
    assert "CUSTOM-TYPE" not in shown and "[image_url of " in shown and "characters: not shown]" in shown
    assert shown.endswith(" and more")
    half = marked[: len(marked) // 2]  # a print cut in the middle of the block
    assert "CUSTOM-TYPE" not in without_media(half) and without_media(12) == 12


@pytest.mark.slow
def test_printing_an_image_input_sends_no_image_to_the_root_lm():
    turns = [
        {"reasoning": "look", "code": "print(baseline_train['examples'][0]['inputs'])"},
        SUBMIT_CURRENT,
    ]
    root = scripted_agent(turns)
    optimizer = RLMDocstringOptimizer(
        root_lm=root, eval_lm=FunctionLM(task_reply), rlm_autopilot="off", max_metric_calls=40
    )
    result = optimizer.compile(student=dspy.Predict(Parity), trainset=examples(0), valset=examples(10), metric=metric)
    assert len(root.calls) == 2 and result.agent_trajectory[-1]["final"]
    assert all(parts(call) <= {"text"} for call in root.calls), [parts(call) for call in root.calls]
    printed = result.agent_trajectory[0]["output"]
    assert "[image_url of " in printed and "not shown]" in printed and "CUSTOM-TYPE" not in printed
