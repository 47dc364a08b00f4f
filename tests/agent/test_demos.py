"""Demos from the program's own successes, end to end: a task whose scripted task LM answers a kind of example
right only when it is an easy one or when a demo of that kind is in its prompt. The default loop (and an agent
through the real sandbox) finds the demos, compares them on other examples, adopts them and returns a program that
carries them; validation never becomes a demo nor reaches a sub-LM or root-LM prompt."""

from __future__ import annotations

import json

import dspy
import pytest
from support.fakes import FunctionLM, last_user_text

from rlmoptimizer import RLMDocstringOptimizer
from rlmoptimizer.__main__ import main

LABELS = {"north": "N7", "south": "S2", "east": "E5", "west": "W9"}
MARKER = "VALMARKER"


def make_splits() -> tuple[list[dspy.Example], list[dspy.Example]]:
    def example(kind: str, i: int, easy: bool = False, marker: str = "") -> dspy.Example:
        text = f"kind: {kind}; item {i}{' (easy)' if easy else ''}{marker}"
        return dspy.Example(question=text, label=LABELS[kind]).with_inputs("question")

    train = [example(kind, i, easy=i == 0) for i in range(4) for kind in LABELS]
    val = [example(kind, 10 + i, marker=f" {MARKER}") for i in range(3) for kind in LABELS]
    return train, val


def metric(example, pred, trace=None):
    right = (pred.label or "").strip() == example.label
    return dspy.Prediction(score=float(right), feedback="right" if right else f"expected {example.label}")


def task_reply(messages):
    """Right on an easy example, or when an earlier message (a demo) shows an example of the same kind."""
    question = last_user_text(messages)
    kind = next(k for k in LABELS if f"kind: {k}" in question)
    earlier = " ".join(str(m.get("content")) for m in messages[:-1])
    known = "(easy)" in question or f"kind: {kind}" in earlier
    return {"label": LABELS[kind] if known else "unknown"}


def useless_proposals():
    return FunctionLM(lambda messages: json.dumps({"new_instruction": "Answer with the label."}), name="sub")


def compile_labels(**kwargs):
    train, val = make_splits()
    eval_lm = FunctionLM(task_reply, name="task")
    sub_lm = kwargs.pop("sub_lm", None) or useless_proposals()
    optimizer = RLMDocstringOptimizer(eval_lm=eval_lm, sub_lm=sub_lm, num_threads=4, **kwargs)
    result = optimizer.compile(student=dspy.Predict("question -> label"), trainset=train, valset=val, metric=metric)
    return result, eval_lm, sub_lm


def loop_compile(student, train, val, reply=None, **settings):
    """``student`` compiled by the default loop with no agent on ``train``/``val``, answered by ``reply``."""
    optimizer = RLMDocstringOptimizer(
        eval_lm=FunctionLM(reply or task_reply, name="task"),
        sub_lm=useless_proposals(),
        num_threads=4,
        rlm_autopilot="loop",
        **{"max_metric_calls": 120, **settings},
    )
    return optimizer.compile(student=student, trainset=train, valset=val, metric=metric)


def demos_in(prompt: list[dict]) -> str:
    return " ".join(str(m.get("content")) for m in prompt[:-1])


def test_the_default_loop_returns_a_program_with_demos_that_beats_the_baseline(tmp_path, capsys):
    result, eval_lm, sub_lm = compile_labels(
        rlm_autopilot="loop", max_metric_calls=120, run_storage_dir=str(tmp_path / "run")
    )
    assert result.budget["spent"] <= 120
    demos = result.demos
    assert len(demos) == 4 and sorted(d.label for d in demos) == sorted(LABELS.values())  # one of each kind
    assert all("(easy)" in d.question for d in demos)  # the successes of the unchanged program
    [(step, ids)] = result.demo_sources.items()  # where each demo came from, in the demos' order
    assert ids == [next(i for i, e in enumerate(make_splits()[0]) if e.question == d.question) for d in demos]
    assert sorted(ids) == [0, 1, 2, 3]
    assert main(["report", str(tmp_path / "run"), "--no-plot"]) == 0  # the report says so too
    report = " ".join(capsys.readouterr().out.split())
    assert f"demos of the returned program: {step}: 4 from train {', '.join(map(str, ids))}" in report
    assert "phases of the default loop (no agent): " in report and "agent turns" not in report
    assert result.selection["chosen_score"] == 1.0 > result.selection["baseline_score"] == 0.0
    calls = [c for turn in result.agent_trajectory for c in turn["pilot"]]
    assert "propose_demos()" in calls and any(c.startswith("compare(['current', 'demos-1']") for c in calls)

    # validation never became a demo, nor reached a prompt other than its own evaluation
    assert all(MARKER not in d.question for d in demos)
    assert all(MARKER not in demos_in(prompt) for prompt in eval_lm.calls)
    assert any(MARKER in last_user_text(prompt) for prompt in eval_lm.calls)  # (it was evaluated)
    assert all(MARKER not in json.dumps(prompt, default=str) for prompt in sub_lm.calls)

    # the returned program carries its demos through save / load
    path = tmp_path / "program.json"
    result.save(str(path))
    loaded = dspy.Predict("question -> label")
    loaded.load(str(path))
    assert [dict(d) for d in loaded.demos] == [dict(d) for d in demos]


def test_a_train_example_that_is_also_a_validation_example_never_becomes_a_demo(caplog):
    """Regression: with a valset that overlaps the trainset (warned of at the start), the copies of validation
    examples were demos like any other train success: the validation score then read their own answers."""
    train, val = make_splits()
    val = val + train[:2]  # the easy north and south examples are validation examples too
    eval_lm = FunctionLM(task_reply, name="task")
    optimizer = RLMDocstringOptimizer(
        eval_lm=eval_lm, sub_lm=useless_proposals(), num_threads=4, rlm_autopilot="loop", max_metric_calls=120
    )
    result = optimizer.compile(student=dspy.Predict("question -> label"), trainset=train, valset=val, metric=metric)
    assert sorted(d.label for d in result.demos) == ["E5", "W9"]  # the two easy successes that are train only
    assert not {d.question for d in result.demos} & {e.question for e in val}


def test_max_demos_0_switches_the_move_off(tmp_path):
    result, _, _ = compile_labels(rlm_autopilot="loop", max_metric_calls=120, max_demos=0)
    assert not result.demos
    assert "propose_demos()" not in [c for turn in result.agent_trajectory for c in turn["pilot"]]


def test_demos_the_program_already_has_stay_when_its_only_steps_instructions_change(tmp_path):
    """A one-step program whose own demo teaches one kind; the sub-LM's instructions teach another. Adopting them
    names every step of the program, and its demo must stay: in the candidate's runs, in the program returned, and
    through save / load."""
    train, val = make_splits()
    demo = train[4]  # a north example, not an easy one
    assert "kind: north" in demo.question and "(easy)" not in demo.question
    student = dspy.Predict("question -> label")
    student.demos = [dspy.Example(question=demo.question, label=demo.label)]
    teaches_south = json.dumps({"new_instruction": "Answer with the label. Tickets of kind: south are S2."})
    eval_lm = FunctionLM(task_reply, name="task")
    optimizer = RLMDocstringOptimizer(
        eval_lm=eval_lm,
        sub_lm=FunctionLM(lambda messages: teaches_south, name="sub"),
        rlm_autopilot="loop",
        max_metric_calls=120,
        max_demos=0,  # the demos move is off: the program's own demos are kept as they are
        num_threads=4,
        run_storage_dir=str(tmp_path / "run"),
    )
    result = optimizer.compile(student=student, trainset=train, valset=val, metric=metric)

    assert "kind: south" in result.signature.instructions  # the instructions changed ...
    assert [dict(d) for d in result.demos] == [dict(student.demos[0])]  # ... and the demo stayed
    assert result.selection["chosen_score"] == 0.5 > result.selection["baseline_score"] == 0.25  # north and south
    assert result.budget["spent"] <= 120
    # every validation run of the returned instructions had the demo in its prompts
    south_val = [p for p in eval_lm.calls if MARKER in last_user_text(p) and "kind: south" in last_user_text(p)]
    assert south_val and all("kind: north" in demos_in(p) for p in south_val)

    path = tmp_path / "program.json"
    result.save(str(path))
    loaded = dspy.Predict("question -> label")
    loaded.load(str(path))
    assert [dict(d) for d in loaded.demos] == [dict(student.demos[0])]
    assert loaded.signature.instructions == result.signature.instructions


@pytest.mark.slow
def test_an_agent_in_the_sandbox_proposes_compares_and_adopts_demos(tmp_path):
    from rlmoptimizer.testing import scripted_agent

    turns = [
        {
            "reasoning": "demos",
            "code": (
                "evaluate_program()\nd = propose_demos()\nprint(d['summary'])\n"
                "c = compare(['current', d['candidate_ids'][0]], ids=d['check_ids'])\n"
                "print(c['summary'], c['winner'], c['note'])\n"
                "if c['winner']:\n    adopt_candidate(d['candidate_ids'][0])\n"
                "print(evaluate_program(split='val')['score'])"
            ),
        },
        {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"},
    ]
    result, _, _ = compile_labels(
        root_lm=scripted_agent(turns), rlm_autopilot="off", max_metric_calls=80, run_storage_dir=str(tmp_path)
    )
    output = result.agent_trajectory[0]["output"]
    assert "left out train example(s) [0, 1, 2, 3]: demos of a candidate" in output  # each sees its own answer
    assert len(result.demos) == 4 and result.selection["chosen_score"] == 1.0


def test_demos_cover_the_labels_failed_most_first_then_vary():
    from rlmoptimizer.moves.demos import choose_demos
    from rlmoptimizer.records import ExampleResult

    def record(i, label, passed, inputs=None):
        return ExampleResult(i, inputs or {"question": f"q{i}"}, {"label": label}, {}, float(passed), passed)

    records = [record(0, "a", True), record(1, "a", True), record(2, "b", True), record(3, "c", False)]
    records += [record(4, "c", True), record(5, "b", False), record(6, "c", False)]
    chosen = choose_demos(records, 3)
    # 'c' failed twice, 'b' once: their successes first, then one of the 'a' successes
    assert chosen[:2] == [4, 2] and chosen[2] in (0, 1)
    assert sorted(choose_demos(records, 10)) == [0, 1, 2, 4]  # only passing records, each once
    assert choose_demos([record(0, "a", False)], 4) == []
    # a train set with duplicated examples: k demos are k different examples, not copies of one
    copies = [record(i, "a" if i % 3 else "b", True, {"question": "same" if i % 3 else "other"}) for i in range(12)]
    chosen = choose_demos(copies, 4)
    assert len(chosen) == 2 and {copies[i].inputs["question"] for i in chosen} == {"same", "other"}


def remembers_only_its_demos(messages):
    """Right on an easy example, or when a demo shows this very question: nothing is learned of its kind."""
    question = last_user_text(messages)
    kind = next(k for k in LABELS if f"kind: {k}" in question)
    asked = question.split("[[ ## question ## ]]")[-1].split("\n\n")[0].strip()
    known = "(easy)" in question or asked in demos_in(messages)
    return {"label": LABELS[kind] if known else "unknown"}


@pytest.mark.slow
def test_without_a_valset_a_candidates_own_demos_are_no_evidence_for_it(tmp_path):
    """Regression: with no valset the final choice is made on train, where a candidate whose demos are four train
    examples it got wrong 'won' exactly those four (each demo answers itself) and was returned as a clear gain,
    although it answers nothing else better."""
    from rlmoptimizer.testing import scripted_agent

    train, _ = make_splits()
    failing = [e for e in train if "(easy)" not in e.question][:4]
    demos = [{"question": e.question, "label": e.label} for e in failing]
    turns = [
        {
            "reasoning": "demos of the failures",
            "code": (
                "step = [k for k in optimization_status()['current_prompts'] if not k.endswith(':demos')][0]\n"
                f"update_prompt(step + ':demos', {demos!r})"
            ),
        },
        {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"},
    ]
    optimizer = RLMDocstringOptimizer(
        root_lm=scripted_agent(turns),
        eval_lm=FunctionLM(remembers_only_its_demos, name="task"),
        sub_lm=useless_proposals(),
        rlm_autopilot="off",
        max_metric_calls=60,
        num_threads=4,
        run_storage_dir=str(tmp_path),
    )
    result = optimizer.compile(student=dspy.Predict("question -> label"), trainset=train, metric=metric)

    [submitted] = [log for log in result.trial_logs if log["label"] == "submission"]
    assert submitted["score"] == 8 / 16 > result.selection["baseline_score"] == 4 / 16  # its demos answer themselves
    assert result.selection["basis"] == "unchanged" and not result.demos
    assert "won 0 and lost 0 of 12 train examples" in result.selection["reason"]  # its 4 demos left out


def test_a_near_copy_of_a_validation_example_never_becomes_a_demo(caplog):
    """Regression: only exact copies were kept from the demos, so a train example with a validation example's
    inputs and one more field (metadata) became a demo, and the validation score read its own answer."""
    train, val = make_splits()
    copies = [dspy.Example(**train[i], source="crm").with_inputs("question") for i in (0, 1)]
    val = val + [dspy.Example(**train[i]).with_inputs("question") for i in (0, 1)]
    train = copies + train[2:]
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        result = loop_compile(dspy.Predict("question -> label"), train, val)
    assert sorted(d.label for d in result.demos) == ["E5", "W9"]  # the two easy successes that are train only
    assert not {d.question for d in result.demos} & {e.question for e in val}
    assert any(
        "2 valset example(s) are also in the trainset (the same inputs)" in r.getMessage() for r in caplog.records
    )


def test_demos_made_by_bootstrap_few_shot_are_traced_to_their_train_examples():
    """A demo dspy.BootstrapFewShot makes holds the trace of a train example: its inputs, the teacher's outputs (a
    ChainOfThought's reasoning too) and ``augmented=True``. It is still that train example, seen answered."""
    train, val = make_splits()
    student = dspy.ChainOfThought("question -> label")
    bootstrapped = [
        dspy.Example(augmented=True, question=train[i].question, reasoning="the teacher's words", label=train[i].label)
        for i in (5, 9)
    ]
    student.predict.demos = list(bootstrapped)

    def reply(messages):
        return {"reasoning": "r", **task_reply(messages)}

    result = loop_compile(student, train, val, reply, max_metric_calls=60, max_demos=0)
    assert result.demo_sources == {"predict": [5, 9]}


def test_a_student_whose_demos_show_validation_examples_is_warned_about(caplog):
    from rlmoptimizer.student import warn_repeated_examples

    train, val = make_splits()
    student = dspy.Predict("question -> label")
    student.demos = [dspy.Example(question=val[0].question, label=val[0].label, augmented=True), train[1]]
    said = warn_repeated_examples(train, val, student)
    assert len(said) == 1 and "demos show the inputs of valset examples" in said[0] and "'self' (1)" in said[0]
    student.demos = [train[1]]
    assert warn_repeated_examples(train, val, student) == []


def test_demos_the_program_came_with_replaced_by_the_chosen_candidates_are_warned_about(caplog):
    """Regression: the demos a program came with (the user's, or another optimizer's) were replaced by the chosen
    candidate's without a word; only demo_sources changing hinted at it."""
    train, val = make_splits()
    student = dspy.Predict("question -> label")
    student.demos = [dspy.Example(question=train[4].question, label=train[4].label)]
    with caplog.at_level("WARNING", logger="rlmoptimizer"):
        result = loop_compile(student, train, val)
    assert len(result.demos) == 4 and [dict(d) for d in result.demos] != [dict(student.demos[0])]
    warned = [r.getMessage() for r in caplog.records if "replace those the program came with" in r.getMessage()]
    assert len(warned) == 1 and "'self'" in warned[0] and "max_demos=0" in warned[0]
