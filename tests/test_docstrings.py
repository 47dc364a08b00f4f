"""The API reference and ``help()`` are generated from docstrings: they must name every constructor argument
and document every result attribute, so an argument added without its documentation fails here."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from rlmoptimizer import ConfigurationError, RLMDocstringOptimizer
from rlmoptimizer.records import CompileResult


def _args_section(doc: str) -> dict[str, str]:
    """``{name: description}`` of a Google-style ``Args:`` section."""
    lines = inspect.cleandoc(doc).splitlines()
    start = lines.index("Args:") + 1
    entries: dict[str, str] = {}
    name = None
    for line in lines[start:]:
        if line and not line.startswith(" "):  # the next section
            break
        match = re.match(r"^    (?:\*\*)?(\w+): (.+)$", line)  # **kwargs: as Google style writes it
        if match:
            name = match.group(1)
            entries[name] = match.group(2)
        elif name and line.startswith("        "):
            entries[name] += " " + line.strip()
    return entries


def test_every_constructor_argument_is_documented_in_order():
    parameters = [name for name in inspect.signature(RLMDocstringOptimizer.__init__).parameters if name != "self"]
    documented = _args_section(RLMDocstringOptimizer.__doc__)
    assert list(documented) == parameters
    assert all(len(text) > 20 for text in documented.values()), documented


def test_limits_stated_in_words_hold():
    """What the Args text states in words rather than in the signature."""

    documented = _args_section(RLMDocstringOptimizer.__doc__)
    assert "5 when no budget is given" in documented["max_iterations"]
    assert RLMDocstringOptimizer(root_lm=_lm()).max_iterations == 5
    assert "at most 86400" in documented["sandbox_timeout_s"]
    assert RLMDocstringOptimizer(root_lm=_lm(), sandbox_timeout_s=86400).sandbox_timeout_s == 86400
    with pytest.raises(ConfigurationError):
        RLMDocstringOptimizer(root_lm=_lm(), sandbox_timeout_s=86401)
    stated = int(re.search(r"about (\d),(\d00) tokens", documented["root_context_window"]).expand(r"\1\2"))
    with pytest.raises(ConfigurationError, match=r"Pass root_context_window=(\d+) \(or more\)") as refused:
        RLMDocstringOptimizer(root_lm=_lm(), root_context_window=4000)
    smallest = int(re.search(r"Pass root_context_window=(\d+)", str(refused.value)).group(1))
    assert abs(smallest - stated) < 250  # "about 4,600" stays true
    assert RLMDocstringOptimizer(root_lm=_lm(), root_context_window=smallest).root_context_window == smallest
    assert "at least 100" in documented["rlm_max_output_chars"]
    with pytest.raises(ConfigurationError):
        RLMDocstringOptimizer(root_lm=_lm(), rlm_max_output_chars=99)
    assert "Required" in documented["root_lm"]
    with pytest.raises(ConfigurationError):
        RLMDocstringOptimizer()


def test_help_names_every_argument():
    text = inspect.getdoc(RLMDocstringOptimizer)
    for name in inspect.signature(RLMDocstringOptimizer.__init__).parameters:
        if name != "self":
            assert f"{name}:" in text


def test_every_result_attribute_has_a_docstring():
    source = inspect.getsource(CompileResult)
    for field in dataclasses.fields(CompileResult):
        assert re.search(rf"^    {field.name}: .*\n    \"\"\"", source, re.M), f"{field.name} has no docstring"


def _lm():
    from rlmoptimizer.testing import FunctionLM

    return FunctionLM(lambda messages: {"answer": ""})
