"""The private dspy names rlmoptimizer relies on: pinned here, checked at import.

dspy's 3.4.0 -> 3.4.1 patch release renamed several private members we override; without this check the
first sign was an AttributeError in the middle of an optimization.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlmoptimizer.agent import _dspy as agent_dspy
from rlmoptimizer.dspy_contract import SUPPORTED_DSPY, TESTED_DSPY_VERSIONS, DspyVersionError, Requirement, check
from rlmoptimizer.sandbox import _dspy as sandbox_dspy

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "requirement", sandbox_dspy.REQUIRED + agent_dspy.REQUIRED, ids=lambda r: f"{r.owner}.{r.name}"
)
def test_every_private_name_we_use_is_in_the_installed_dspy(requirement):
    assert requirement.problem() is None


def test_the_installed_dspy_is_a_tested_one_and_the_declared_range_is_the_supported_one():
    assert importlib.metadata.version("dspy") in TESTED_DSPY_VERSIONS
    declared = re.findall(r'^\s*"(dspy[^"]*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared == [f"dspy{SUPPORTED_DSPY}"]


def test_a_missing_member_and_a_changed_signature_are_named():
    with pytest.raises(DspyVersionError) as caught:
        check(
            "agent",
            (
                Requirement("dspy.predict.rlm:RLM", "_gone_in_a_later_release"),
                Requirement("dspy.predict.rlm:RLM", "_execute_code", params=("repl", "code")),
            ),
        )
    message = str(caught.value)
    assert "dspy.predict.rlm:RLM._gone_in_a_later_release does not exist" in message
    assert "_execute_code takes (repl, code, input_args), expected (repl, code)" in message
    assert f"this environment has dspy {importlib.metadata.version('dspy')}" in message
    assert f'pip install "dspy{SUPPORTED_DSPY}"' in message


def test_importing_rlmoptimizer_with_an_incompatible_dspy_fails_with_the_reason():
    """A dspy whose REPL history lost a method we call: the import itself says so, in a fresh interpreter."""
    code = "import dspy.primitives.repl_types as repl\ndel repl.REPLHistory.append\nimport rlmoptimizer\n"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={"PATH": "", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode != 0
    error = result.stderr[result.stderr.index("rlmoptimizer.errors.DspyVersionError: ") :]
    assert error.startswith(f"rlmoptimizer.errors.DspyVersionError: rlmoptimizer supports dspy{SUPPORTED_DSPY}")
    assert "agent: dspy.primitives.repl_types:REPLHistory.append does not exist" in error


def _dspy_names_used() -> set[tuple[str, str]]:
    """Every ``(dspy module, name)`` the package reaches beyond ``import dspy``: ``from dspy.x import y`` and
    attribute chains through a dspy submodule (``dspy.lm15.Response``)."""
    import ast
    import importlib
    import types

    used: set[tuple[str, str]] = set()
    for path in (ROOT / "rlmoptimizer").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dspy."):
                used.update((node.module, alias.name) for alias in node.names)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
                chain, inner = [node.attr], node.value
                while isinstance(inner, ast.Attribute):
                    chain.append(inner.attr)
                    inner = inner.value
                if isinstance(inner, ast.Name) and inner.id == "dspy" and len(chain) == 2:
                    module = getattr(importlib.import_module("dspy"), chain[1], None)
                    if isinstance(module, types.ModuleType):  # dspy.<submodule>.<name>
                        used.add((module.__name__, chain[0]))
    return used


def test_every_dspy_name_used_beyond_the_top_level_is_a_contract_row():
    from rlmoptimizer.dspy_contract import REQUIREMENTS

    rows = {(r.owner, r.name) for wing in REQUIREMENTS.values() for r in wing}
    modules = {r.owner for wing in REQUIREMENTS.values() for r in wing}
    missing = {(module, name) for module, name in _dspy_names_used() if (module, name) not in rows}
    # ``from dspy.utils import exceptions`` imports a module whose names are rows of their own
    missing = {(module, name) for module, name in missing if f"{module}.{name}" not in modules}
    assert missing == set(), f"add these to dspy_contract.REQUIREMENTS: {sorted(missing)}"
