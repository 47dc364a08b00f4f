"""The dspy a user has: the supported range, and one complete DspyVersionError at import for any other dspy.

Every name rlmoptimizer imports from dspy, and every private dspy member it relies on, is a row of
``rlmoptimizer.dspy_contract.REQUIREMENTS``; ``import rlmoptimizer`` checks the installed dspy's version and every
row before anything else in the package is imported. The slow tests at the end run ``import rlmoptimizer``
against real older dspy releases, in virtual environments ``.ci/run`` prepares (tests never reach the network):
``RLMOPTIMIZER_DSPY_VENVS`` is a directory holding ``dspy-<version>/`` environments.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlmoptimizer import dspy_contract
from rlmoptimizer.dspy_contract import (
    REQUIREMENTS,
    SUPPORTED_DSPY,
    DspyVersionError,
    Requirement,
    dspy_problems,
    version_problem,
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rlmoptimizer"
ROWS = [(wing, row) for wing, rows in REQUIREMENTS.items() for row in rows]


@pytest.mark.parametrize(("wing", "row"), ROWS, ids=[f"{w}:{r.owner}.{r.name}" for w, r in ROWS])
def test_every_row_holds_in_the_installed_dspy(wing, row):
    assert row.problem() is None


def test_the_installed_dspy_is_supported():
    assert dspy_problems() == []


@pytest.mark.parametrize("version", ["3.4.1", "3.4.2", "3.4.10", "3.4.1.post1", "3.4.3rc1", "3.4.1+local"])
def test_versions_inside_the_range(version):
    assert version_problem(version) is None


@pytest.mark.parametrize(
    ("version", "word"),
    [
        ("3.4.0", "older"),
        ("3.4.1rc1", "older"),
        ("3.4.1.dev0", "older"),
        ("3.3.1", "older"),
        ("3.2.1", "older"),
        ("2.6.27", "older"),
        ("3.5.0", "newer"),
        ("3.5", "newer"),
        ("3.5.0rc1", "newer"),
        ("4.0.0", "newer"),
        ("not-a-version", "not a version"),
    ],
)
def test_versions_outside_the_range(version, word):
    problem = version_problem(version)
    assert problem is not None and word in problem and SUPPORTED_DSPY in problem


def _dspy_imports() -> list[tuple[str, str, str]]:
    """``(file, module, name)`` for every ``from dspy... import name`` and ``import dspy.x`` in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = str(path.relative_to(ROOT))
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "dspy":
                found += [(where, node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [(where, alias.name, "") for alias in node.names if alias.name.startswith("dspy.")]
    return found


def test_every_name_imported_from_dspy_is_a_row():
    """A new ``from dspy.x import y`` (or ``from dspy import y``) anywhere in the package needs its row, so a dspy
    without it fails at ``import rlmoptimizer`` with the complete message, not with a raw ImportError."""
    rows = {(row.owner, row.name) for _, row in ROWS}
    owners = {row.owner.partition(":")[0] for _, row in ROWS}
    missing = []
    for where, module, name in _dspy_imports():
        if name and (module, name) in rows:
            continue
        whole = f"{module}.{name}" if name else module  # ``from dspy.utils import exceptions``, ``import dspy.x``
        if whole in owners and _is_module(whole):
            continue  # a module imported whole: the members used are its rows
        missing.append(f"{where}: from {module} import {name}" if name else f"{where}: import {module}")
    assert missing == []


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_the_wings_import_their_names_only_after_the_check():
    """Each wing's ``_dspy`` module exports its rows as REQUIRED and imports only names that are rows."""
    from rlmoptimizer.agent import _dspy as agent_dspy
    from rlmoptimizer.moves import _dspy as moves_dspy
    from rlmoptimizer.sandbox import _dspy as sandbox_dspy

    assert agent_dspy.REQUIRED == REQUIREMENTS["agent"] and sandbox_dspy.REQUIRED == REQUIREMENTS["sandbox"]
    assert moves_dspy.REQUIRED == REQUIREMENTS["moves"]


def test_a_missing_member_and_a_changed_signature_are_named():
    with pytest.raises(DspyVersionError) as caught:
        dspy_contract.check(
            "agent",
            (
                Requirement("dspy.predict.rlm:RLM", "_gone_in_a_later_release"),
                Requirement("dspy.predict.rlm:RLM", "_execute_code", params=("repl", "code")),
                Requirement("dspy.not_a_module", "A"),
                Requirement("dspy.not_a_module", "B"),
            ),
        )
    message = str(caught.value)
    assert "agent: dspy.predict.rlm:RLM._gone_in_a_later_release does not exist" in message
    assert "agent: dspy.predict.rlm:RLM._execute_code takes (repl, code, input_args), expected (repl, code)" in message
    assert "agent: module dspy.not_a_module cannot be imported" in message and "uses A, B from it" in message
    assert len([line for line in message.splitlines() if "dspy.not_a_module" in line]) == 1  # one module, one line
    assert f'pip install "dspy{SUPPORTED_DSPY}"' in message
    assert isinstance(caught.value, ImportError)


def test_the_check_reads_no_source(monkeypatch):
    """``inspect.getsource`` cost ~85 ms of every import; the check reads signatures and bytecode only."""

    def no_source(*args, **kwargs):
        raise AssertionError("the contract check read a source file")

    monkeypatch.setattr(inspect, "getsource", no_source)
    monkeypatch.setattr(inspect, "getsourcelines", no_source)
    assert dspy_problems() == []
    bogus = Requirement("dspy.primitives.python_interpreter:PythonInterpreter", "_never_set_anywhere", instance=True)
    assert (
        bogus.problem()
        == "dspy.primitives.python_interpreter:PythonInterpreter no longer sets self._never_set_anywhere"
    )


def _import_rlmoptimizer(
    prelude: str, python: str = sys.executable, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``import rlmoptimizer`` in a fresh interpreter after ``prelude``; prints the class and the message of
    what it raised, caught as an ImportError."""
    code = (
        f"{prelude}\n"
        "try:\n    import rlmoptimizer\n"
        "except ImportError as exc:\n    print('RAISED', type(exc).__name__)\n    print(exc)\n"
        "else:\n    print('IMPORTED')\n"
    )
    environment = {
        "PATH": os.environ.get("PATH", ""),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "PYTHONPATH": str(ROOT),
        "HOME": os.environ.get("HOME", "/tmp"),
        **(env or {}),
    }
    return subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300, env=environment)


def _message(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    first, _, message = result.stdout.partition("\n")
    assert first == "RAISED DspyVersionError", result.stdout + result.stderr
    problems = [line for line in message.splitlines() if line.startswith("  - ")]
    count = re.search(r"\((\d+) problems?\):", message)
    assert count and int(count.group(1)) == len(problems)  # the header counts every problem listed
    return message


def test_a_dspy_lacking_members_of_two_wings_gets_one_error_naming_all():
    result = _import_rlmoptimizer(
        "import dspy.primitives.repl_types as repl, dspy.primitives.python_interpreter as pi\n"
        "del repl.REPLHistory.append\n"
        "del pi.PythonInterpreter._health_check\n"
    )
    message = _message(result)
    assert "agent: dspy.primitives.repl_types:REPLHistory.append does not exist" in message
    assert "sandbox: dspy.primitives.python_interpreter:PythonInterpreter._health_check does not exist" in message
    assert "version:" not in message  # the installed dspy is in the range
    assert f'Fix: pip install "dspy{SUPPORTED_DSPY}"' in message


def test_deleted_top_level_dspy_names_get_the_contracts_error_not_an_attribute_error():
    """Regression: deleting top-level dspy names the package reaches as ``dspy.<name>`` (``dspy.Predict``,
    ``dspy.settings``) gave a raw AttributeError at construction; they are rows, checked at import."""
    message = _message(_import_rlmoptimizer("import dspy\ndel dspy.Predict\ndel dspy.settings\n"))
    assert "dspy: dspy.Predict does not exist" in message and "dspy: dspy.settings does not exist" in message
    assert f'Fix: pip install "dspy{SUPPORTED_DSPY}"' in message


def test_a_gepa_whose_optimize_changed_gets_the_contracts_error_at_import():
    """Regression: gepa was pinned only through dspy; a ``gepa.optimize`` whose signature changed imported cleanly
    and failed inside the agent's REPL in the middle of a run. gepa's names are rows, checked at import."""
    message = _message(
        _import_rlmoptimizer(
            "import gepa\n"
            "def optimize(seed_candidate, trainset, valset=None, adapter=None, budget=None):\n    pass\n"
            "gepa.optimize = optimize\n"
            "import gepa.core.result as result\ndel result.GEPAResult.from_state\n"
        )
    )
    assert "gepa: gepa.optimize no longer takes reflection_lm, candidate_selection_strategy" in message
    assert "gepa: gepa.core.result:GEPAResult.from_state does not exist" in message
    pinned = importlib.metadata.version("gepa")
    assert f'pip install "gepa=={pinned}"' in message


def _top_level_and_gepa_names() -> set[tuple[str, str]]:
    """``(owner, name)`` for every ``dspy.<name>`` that is not a submodule, every ``from dspy import name``, and
    every gepa name the package reaches (``gepa.<name>``, ``from gepa.x import name``)."""
    import types

    import dspy

    used: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "gepa":
                used.add(("gepa", node.attr))
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "dspy":
                if not isinstance(getattr(dspy, node.attr, None), types.ModuleType) or node.attr == "utils":
                    used.add(("dspy", node.attr))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "dspy":
                used.update(("dspy", alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "gepa":
                used.update((node.module, alias.name) for alias in node.names)
    return used


def test_every_top_level_dspy_name_and_every_gepa_name_used_is_a_row():
    """A new ``dspy.<name>`` or gepa name anywhere in the package needs its row (see the two regressions above)."""
    rows = {(row.owner.partition(":")[0], row.name) for _, row in ROWS}
    missing = sorted(used for used in _top_level_and_gepa_names() if used not in rows)
    assert missing == [], f"add these to dspy_contract.REQUIREMENTS: {missing}"


def test_a_newer_dspy_is_refused_at_import_even_when_every_name_is_there():
    message = _message(_import_rlmoptimizer("import dspy\ndspy.__version__ = '3.5.0'\n"))
    assert f"version: dspy 3.5.0 is newer than the supported dspy{SUPPORTED_DSPY}" in message
    assert "(1 problem):" in message


def test_no_dspy_at_all_is_a_dspy_version_error():
    message = _message(_import_rlmoptimizer("import sys\nsys.modules['dspy'] = None\n"))
    assert "dspy cannot be imported" in message and f'pip install "dspy{SUPPORTED_DSPY}"' in message


def test_the_package_is_imported_only_after_the_check():
    """When the check fails, nothing of rlmoptimizer but the contract and the errors has been imported."""
    code = (
        "import sys, dspy\ndspy.__version__ = '3.3.1'\ntry:\n    import rlmoptimizer\nexcept ImportError:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('rlmoptimizer')))"
    )
    listed = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={"PATH": "", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(ROOT)},
    )
    assert listed.stdout.strip() == "['rlmoptimizer.dspy_contract', 'rlmoptimizer.errors']", listed.stderr


# ------------------------------------------------------------------------------ real older dspy releases

VENVS = os.environ.get("RLMOPTIMIZER_DSPY_VENVS")


def _venv_python(version: str) -> Path:
    if not VENVS:
        pytest.skip(
            "RLMOPTIMIZER_DSPY_VENVS is not set: .ci/run prepares virtual environments with older dspy "
            "releases (tests do not reach the network)"
        )
    venv = Path(VENVS) / f"dspy-{version}"
    python = venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    if not python.exists():
        pytest.skip(f"no prepared environment {venv}")
    return python


@pytest.mark.slow
@pytest.mark.parametrize(
    ("version", "wings"),
    [
        ("3.3.1", ("agent", "sandbox", "evaluation", "testing")),
        ("3.2.1", ("agent", "sandbox", "evaluation", "testing")),
    ],
)
def test_an_older_dspy_release_gets_the_one_complete_error(version, wings):
    python = _venv_python(version)
    installed = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('dspy'))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.stdout.strip() == version
    result = _import_rlmoptimizer("", python=str(python))
    assert "cannot import name" not in result.stdout + result.stderr  # never a raw ImportError
    message = _message(result)
    lines = message.splitlines()
    assert lines[0].startswith(f"rlmoptimizer supports dspy{SUPPORTED_DSPY}; this environment has dspy {version}")
    assert f"  - version: dspy {version} is older than the supported dspy{SUPPORTED_DSPY}" in lines
    for wing in wings:  # every failing wing is listed, not only the first
        assert any(line.startswith(f"  - {wing}: ") for line in lines), wing
    assert any(line.startswith("  - agent: module dspy.lm15 cannot be imported") for line in lines)
    assert "  - sandbox: module dspy.primitives.facade cannot be imported" in message
    assert lines[-2].startswith(f'Fix: pip install "dspy{SUPPORTED_DSPY}"')
    assert lines[-1] == f"or install a rlmoptimizer release that supports dspy {version}."
