"""Instructions by step name, and the structural fingerprint that must not change while they do."""

from __future__ import annotations

import json

import dspy
import pytest

from rlmoptimizer.errors import ConfigurationError, StructureChangedError
from rlmoptimizer.fingerprint import (
    apply_instructions,
    check_structure,
    fingerprint_digest,
    get_instructions,
    instructions_digest,
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
