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
