"""Instructions by step name, and the structural fingerprint that must not change while they do."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dspy
import pytest
from support.fakes import FunctionLM

from rlmoptimizer.errors import ConfigurationError, StructureChangedError
from rlmoptimizer.fingerprint import (
    apply_instructions,
    check_structure,
    fingerprint_digest,
    get_instructions,
    instructions_digest,
    program_code_identity,
    structural_fingerprint,
)


class QA(dspy.Signature):
    """Answer the question."""

    question: str = dspy.InputField(desc="a factual question")
    answer: str = dspy.OutputField(desc="a short answer")


class Pipeline(dspy.Module):
    def __init__(self):
        super().__init__()
        self.rewrite = dspy.Predict("question -> query")
        self.generate = dspy.ChainOfThought(QA)

    def forward(self, question):
        return self.generate(question=self.rewrite(question=question).query)


def test_get_and_apply_instructions_by_step_name():
    program = Pipeline()
    assert get_instructions(program) == {
        "rewrite": "Given the fields `question`, produce the fields `query`.",
        "generate.predict": "Answer the question.",
    }
    copy = program.deepcopy()
    apply_instructions(copy, {"generate.predict": "Answer in one word."})
    assert get_instructions(copy)["generate.predict"] == "Answer in one word."
    assert get_instructions(program)["generate.predict"] == "Answer the question."  # the original is untouched
    assert list(copy.generate.predict.signature.output_fields) == ["reasoning", "answer"]


def test_apply_instructions_rejects_unknown_steps_and_changes_nothing():
    program = Pipeline()
    before = get_instructions(program)
    with pytest.raises(
        ConfigurationError, match=r"unknown step name\(s\) \['generate'\].*\['rewrite', 'generate.predict'\]"
    ):
        apply_instructions(program, {"rewrite": "new", "generate": "x"})
    assert get_instructions(program) == before
    with pytest.raises(ConfigurationError, match="must be a str"):
        apply_instructions(program, {"rewrite": None})


def test_the_fingerprint_describes_fields_demos_and_modules_but_not_instructions():
    program = Pipeline()
    fp = structural_fingerprint(program)
    json.dumps(fp)  # JSON-friendly
    generate = fp["predictors"][1]
    assert generate["name"] == "generate.predict" and generate["class"] == "Predict"
    assert generate["inputs"] == [
        {"name": "question", "prefix": "Question:", "desc": "a factual question", "type": "str"}
    ]
    assert [f["name"] for f in generate["outputs"]] == ["reasoning", "answer"]
    assert {"path": "self.generate", "class": "ChainOfThought"} in fp["modules"]
    assert "Answer the question." not in json.dumps(fp)

    changed = program.deepcopy()
    apply_instructions(changed, {"rewrite": "Rewrite as a search query.", "generate.predict": "Be brief."})
    assert structural_fingerprint(changed) == fp
    assert fingerprint_digest(structural_fingerprint(changed)) == fingerprint_digest(fp)
    check_structure(fp, changed)  # instructions alone never count as a structural change


def test_the_digest_is_canonical_and_sensitive():
    fp = structural_fingerprint(Pipeline())
    reordered = json.loads(json.dumps(fp, sort_keys=True))
    assert fingerprint_digest(reordered) == fingerprint_digest(fp)
    assert len(fingerprint_digest(fp)) == 64
    other = Pipeline()
    other.rewrite.demos = [dspy.Example(question="q", query="x")]
    assert fingerprint_digest(structural_fingerprint(other)) != fingerprint_digest(fp)
    assert instructions_digest({"a": "x", "b": "y"}) == instructions_digest({"b": "y", "a": "x"})
    assert instructions_digest({"a": "x"}) != instructions_digest({"a": "x "})


def _diff(program_change) -> str:
    program = Pipeline()
    fp = structural_fingerprint(program)
    program_change(program)
    with pytest.raises(StructureChangedError) as info:
        check_structure(fp, program)
    return str(info.value)


def test_a_removed_output_field_is_named():
    def change(program):
        program.generate.predict.signature = program.generate.predict.signature.delete("answer")

    message = _diff(change)
    assert message.startswith("the program's structure changed; only instructions and demos may change:")
    assert "step 'generate.predict': output field 'answer' removed" in message


def test_added_fields_changed_descriptions_and_types_are_named():
    def change(program):
        signature = program.rewrite.signature.append("hint", dspy.InputField())
        program.rewrite.signature = signature
        program.generate.predict.signature = program.generate.predict.signature.with_updated_fields(
            "question", desc="any question", type_=int
        )

    message = _diff(change)
    assert "step 'rewrite': input field 'hint' added" in message
    assert "step 'generate.predict': input field 'question' type changed from 'str' to 'int'" in message
    assert (
        "step 'generate.predict': input field 'question' desc changed from 'a factual question' to 'any question'"
        in message
    )


def test_demos_are_part_of_the_prompt_map_not_of_the_structure():
    program = Pipeline()
    fp = structural_fingerprint(program)
    assert set(get_instructions(program)) == {"rewrite", "generate.predict"}  # no demos: the plain map

    demos = json.dumps([{"question": "q", "query": "x"}])
    apply_instructions(program, {"rewrite:demos": demos})
    assert [dict(d) for d in program.rewrite.demos] == [{"question": "q", "query": "x"}]
    assert isinstance(program.rewrite.demos[0], dspy.Example)
    check_structure(fp, program)  # demos change through the map: the structure is the same
    mapping = get_instructions(program)
    assert json.loads(mapping["rewrite:demos"]) == [{"query": "x", "question": "q"}]

    copy = Pipeline()
    apply_instructions(copy, mapping)  # the map carries the demos to another program
    assert get_instructions(copy) == mapping
    apply_instructions(copy, {"rewrite:demos": "[]"})
    assert copy.rewrite.demos == [] and "rewrite:demos" not in get_instructions(copy)


def test_demos_equal_to_a_steps_own_keep_their_objects():
    program = Pipeline()
    own = [dspy.Example(question="q", query="x")]
    program.rewrite.demos = own
    apply_instructions(program, get_instructions(program))
    assert program.rewrite.demos is own  # nothing a JSON round trip could lose is replaced


def test_malformed_demos_and_unknown_demo_steps_are_refused_before_any_change():
    program = Pipeline()
    before = get_instructions(program)
    for bad in ["not json", "{}", "[1, 2]", "[{}]"]:
        with pytest.raises(ConfigurationError, match="rewrite:demos' must be the JSON text of a list of demos"):
            apply_instructions(program, {"rewrite": "changed", "rewrite:demos": bad})
    with pytest.raises(ConfigurationError, match="unknown step name"):
        apply_instructions(program, {"nope:demos": "[]"})
    assert get_instructions(program) == before


def test_a_block_with_demos_restores_the_very_demo_list():
    from rlmoptimizer.fingerprint import instructions_for_now

    program = Pipeline()
    own = [dspy.Example(question="q", query="x")]
    program.rewrite.demos = own
    with instructions_for_now(program, {"rewrite:demos": json.dumps([{"question": "a", "query": "b"}])}):
        assert program.rewrite.demos[0].query == "b"
    assert program.rewrite.demos is own


def test_added_removed_and_replaced_modules_are_named():
    def add_step(program):
        program.verify = dspy.Predict("answer -> verdict")

    message = _diff(add_step)
    assert "step 'verify' added" in message and "module 'self.verify' (Predict) added" in message

    def replace(program):
        program.generate = dspy.Predict(QA)

    message = _diff(replace)
    assert "step 'generate.predict' removed" in message and "step 'generate' added" in message
    assert "module 'self.generate': class changed from ChainOfThought to Predict" in message


def test_an_edit_keeps_the_demos_it_does_not_name_and_a_whole_programs_map_without_the_key_clears_them():
    program = Pipeline()
    program.rewrite.demos = [dspy.Example(question="q", query="x")]
    plain = {"rewrite": "r", "generate.predict": "g"}
    apply_instructions(program, {"rewrite": "only this step"})
    assert len(program.rewrite.demos) == 1
    apply_instructions(program, plain)  # an edit of every step's instructions: the demos stay
    assert len(program.rewrite.demos) == 1 and program.rewrite.signature.instructions == "r"
    apply_instructions(program, plain, whole=True)  # a candidate's map without the key: that step has no demos
    assert program.rewrite.demos == [] and get_instructions(program) == plain


def test_an_edit_of_a_one_step_programs_instructions_keeps_its_demos():
    program = dspy.Predict("question -> answer")
    program.demos = [dspy.Example(question="1 + 1?", answer="2")]
    apply_instructions(program, {"self": "Answer with a number."})
    assert [dict(d) for d in program.demos] == [{"question": "1 + 1?", "answer": "2"}]
    assert program.signature.instructions == "Answer with a number."


# -- the program's own code ------------------------------------------------------------------------------------


class _Stateful:
    """What a retry decorator or a client keeps: state that changes with every call and every process."""

    def __init__(self):
        self.calls, self.started = 0, time.time()


def _counted(fn):
    state = _Stateful()

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        state.calls += 1
        return fn(*args, **kwargs)

    return wrapper


class _Retrying(dspy.Module):
    def __init__(self):
        super().__init__()
        self.answer = dspy.Predict("question -> answer")

    @_counted
    def forward(self, question, _seen={}):  # noqa: B006 (a mutable default that fills up)
        _seen[question] = True
        return self.answer(question=question)


def test_a_programs_code_is_recognised_by_what_its_own_classes_compute_in_any_process():
    from support.tickets import RouteTicket

    identity = program_code_identity(RouteTicket())
    assert list(identity["classes"]) == ["RouteTicket"]  # dspy's own Predict and ChainOfThought are not code
    assert identity["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert program_code_identity(dspy.Predict("question -> answer"))["classes"] == {}
    again = subprocess.run(
        [
            sys.executable,
            "-c",
            "from support.tickets import RouteTicket\nfrom rlmoptimizer.fingerprint import program_code_identity as i"
            "\nprint(i(RouteTicket())['classes']['RouteTicket'])",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent,
        env={**os.environ, "PYTHONPATH": ".", "PYTHONHASHSEED": "7"},
    )
    assert again.stdout.strip() == identity["classes"]["RouteTicket"]

    class Edited(RouteTicket):  # an edit under the same name: its own code and its base's count
        def forward(self, ticket):
            return super().forward(ticket=ticket.lower())

    Edited.__qualname__ = "RouteTicket"
    assert program_code_identity(Edited())["classes"]["RouteTicket"] != identity["classes"]["RouteTicket"]


def test_state_a_decorator_default_or_closure_keeps_is_not_code():
    """Regression of a first version: a retry decorator's statistics, a mutable default that fills up and a client's
    clock in a closure changed the identity after a call or in a new process, and a resume was refused."""
    program = _Retrying()
    before = program_code_identity(program)
    with dspy.context(lm=FunctionLM(lambda messages: {"answer": "4"})):
        program(question="2 + 2?")
    assert program_code_identity(program) == before
    assert program_code_identity(_Retrying()) == before


def test_the_module_a_class_is_imported_from_is_not_code():
    """``python optimize.py`` records ``__main__.RAG``; a notebook importing ``optimize.RAG`` has the same code."""
    from support.tickets import RouteTicket

    moved = type("RouteTicket", (RouteTicket,), {"__module__": "__main__"})  # the same functions, run as a script
    assert moved.__module__ != RouteTicket.__module__
    assert program_code_identity(moved())["classes"] == program_code_identity(RouteTicket())["classes"]


def _lookup(query: str) -> str:
    """Look the query up."""
    return query.upper()


def _broken_lookup(query: str) -> str:
    """Look the query up."""
    return ""


def test_the_functions_a_module_holds_are_code_too():
    """Regression: a dspy.ReAct whose tool changed (same name, docstring and arguments) resumed with the old tool's
    records and scores: dspy's classes are skipped as code, and the tools they hold were recorded by type only."""
    plain = program_code_identity(dspy.ChainOfThought("question -> answer"))
    assert plain["classes"] == {}  # a program holding no function records none (older run directories still match)
    react = program_code_identity(dspy.ReAct("question -> answer", tools=[_lookup]))
    _broken_lookup.__name__ = _broken_lookup.__qualname__ = "_lookup"  # the same tool, edited
    edited = program_code_identity(dspy.ReAct("question -> answer", tools=[_broken_lookup]))
    assert list(react["classes"]) == ["ReAct (the functions it holds)"]
    assert edited["classes"] != react["classes"]
    assert program_code_identity(dspy.ReAct("question -> answer", tools=[dspy.Tool(_lookup)])) == react

    def reward(args, prediction):
        return 1.0

    def stricter(args, prediction):
        return 0.0

    stricter.__name__ = stricter.__qualname__ = reward.__qualname__
    best = program_code_identity(dspy.BestOfN(dspy.Predict("q -> a"), N=2, reward_fn=reward, threshold=1.0))
    other = program_code_identity(dspy.BestOfN(dspy.Predict("q -> a"), N=2, reward_fn=stricter, threshold=1.0))
    assert best["classes"] != other["classes"]
