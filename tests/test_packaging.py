"""What a user installs: the declared dspy range is the contract's, matplotlib is an extra, the license is a file,
and the built sdist and wheel carry what they should. ``.ci/run`` builds them and names them in
``RLMOPTIMIZER_SDIST`` and ``RLMOPTIMIZER_WHEEL``; without those the built-artifact tests are skipped (tests do
not build: a build fetches its build backend from the network)."""

from __future__ import annotations

import os
import re
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from rlmoptimizer.dspy_contract import BELOW_DSPY, LOWEST_DSPY, SUPPORTED_DSPY, TESTED_DSPY_VERSIONS

ROOT = Path(__file__).resolve().parent.parent


def pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _requirement(requirements: list[str], name: str) -> list[str]:
    return [r for r in requirements if re.match(rf"{name}\b", r)]


def test_the_declared_dspy_is_the_supported_range():
    project = pyproject()["project"]
    assert _requirement(project["dependencies"], "dspy") == [f"dspy{SUPPORTED_DSPY}"]
    lowest = ".".join(map(str, LOWEST_DSPY))
    below = ".".join(map(str, BELOW_DSPY))
    assert SUPPORTED_DSPY == f">={lowest},<{below}"
    assert lowest in TESTED_DSPY_VERSIONS  # the range's lowest release is tested


def test_matplotlib_is_the_plot_extra_only():
    project = pyproject()["project"]
    assert _requirement(project["dependencies"], "matplotlib") == []
    extras = project["optional-dependencies"]
    assert _requirement(extras["plot"], "matplotlib") and _requirement(extras["dev"], "matplotlib")
    assert set(extras["docs"]) == {"mkdocs-material", "mkdocstrings[python]", "nbclient", "nbformat", "ipykernel"}


def test_the_license_is_a_file():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "Copyright (c) 2026 the rlmoptimizer authors" in text
    project = pyproject()["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]


def _built(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value:
        pytest.skip(f"{variable} is not set: .ci/run builds the sdist and the wheel and names them there")
    return Path(value)


def test_the_sdist_carries_its_tests():
    with tarfile.open(_built("RLMOPTIMIZER_SDIST")) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    tests = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py") if "__pycache__" not in p.parts}
    assert {
        "tests/conftest.py",
        "tests/support/__init__.py",
        "LICENSE",
        "pyproject.toml",
        "example.py",
        "examples/analysis_and_demos.py",
        "docs/analysis-and-demos.md",  # its worked run is checked against the example's output
    } <= names
    assert tests <= names, sorted(tests - names)
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]


def test_the_wheel_declares_the_range_and_the_extras():
    with zipfile.ZipFile(_built("RLMOPTIMIZER_WHEEL")) as wheel:
        names = wheel.namelist()
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(wheel.read(metadata).decode("utf-8"))
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [n for n in names if n.startswith("tests/")]
    assert {"rlmoptimizer/sandbox/assets/std_io.ts", "rlmoptimizer/sandbox/assets/tool_wrappers.py"} <= set(names)
    requires = meta.get_all("Requires-Dist")
    [dspy] = [r for r in requires if r.startswith("dspy")]
    assert sorted(dspy.removeprefix("dspy").split(",")) == sorted(SUPPORTED_DSPY.split(","))
    assert [r for r in requires if r.startswith("matplotlib")] == [
        r for r in requires if r.startswith("matplotlib") and ('extra == "plot"' in r or 'extra == "dev"' in r)
    ]
    assert "plot" in meta.get_all("Provides-Extra") and meta["License-Expression"] == "MIT"


def _install_commands(text: str) -> list[str]:
    """The bash blocks of the README's "Install and try it" section, as ``.ci/run`` reads them."""
    section = text.split("\n## Install and try it\n", 1)[1].split("\n## ", 1)[0]
    return [block.split("\n```", 1)[0].strip() for block in section.split("```bash\n")[1:]]


def test_the_first_command_installs_what_the_demo_needs_and_the_second_what_the_tests_need():
    """Regression: the README's first command installed the dev extra (1.4 GB: MLflow, pytest, ...) for a first
    look at the demo, which needs the package and its plot extra."""
    first, second = _install_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert first == 'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[plot]" && python example.py'
    assert second.startswith('pip install -e ".[dev]" && ') and second.endswith("python -m pytest")
    assert "ruff check ." in second and "ruff format --check ." in second
    for page in ("CONTRIBUTING.md", "docs/getting-started.md"):  # not in the sdist: checked from a checkout
        if (ROOT / page).exists():
            text = (ROOT / page).read_text(encoding="utf-8")
            assert first in text and second in text, page
