"""The private dspy names rlmoptimizer leans on, checked when the package is imported.

rlmoptimizer subclasses ``dspy.RLM`` and ``dspy.PythonInterpreter`` and overrides or calls some of their
private members; a dspy patch release may rename them (3.4.0 -> 3.4.1 did). Each wing lists what it uses in
its own ``_dspy.py`` module as :class:`Requirement` rows and imports the names only through that module,
which calls :func:`check` first. A missing name then fails the import with :class:`DspyVersionError`, saying
which dspy is installed, what is missing and which dspy versions are supported, instead of an
``AttributeError`` in the middle of an optimization.

To move to a new dspy: widen :data:`TESTED_DSPY_VERSIONS` and the ``dspy`` pin in ``pyproject.toml``, run
``python -m pytest tests/test_dspy_contract.py`` (it pins every row, parameters included), then the whole suite.

May import: the standard library and ``rlmoptimizer.errors`` only.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from dataclasses import dataclass

from rlmoptimizer.errors import DspyVersionError

__all__ = ["TESTED_DSPY_VERSIONS", "DspyVersionError", "Requirement", "check"]

TESTED_DSPY_VERSIONS = ("3.4.1",)
"""The dspy releases the test suite ran against; ``pyproject.toml`` pins the same."""


@dataclass(frozen=True)
class Requirement:
    """One private dspy member a wing relies on.

    ``owner`` is ``"module"`` or ``"module:Class"``; ``name`` the member. ``params``, when given, are the
    parameter names (after ``self``) the member must accept, for a method we override or call. ``instance``
    marks an attribute set in ``__init__`` (looked up in the class source, since no instance is built)."""

    owner: str
    name: str
    params: tuple[str, ...] | None = None
    instance: bool = False

    def problem(self) -> str | None:
        """What is wrong with this requirement in the installed dspy, or None."""
        module_name, _, class_name = self.owner.partition(":")
        try:
            target = importlib.import_module(module_name)
        except ImportError as exc:
            return f"module {module_name} cannot be imported ({exc})"
        if class_name:
            target = getattr(target, class_name, None)
            if target is None:
                return f"{self.owner} does not exist"
        if self.instance:
            try:
                source = inspect.getsource(target)
            except (OSError, TypeError):
                return None  # no source to look in (a compiled install): nothing to check
            return None if f"self.{self.name} =" in source else f"{self.owner} no longer sets self.{self.name}"
        member = inspect.getattr_static(target, self.name, None) if class_name else getattr(target, self.name, None)
        if member is None:
            return f"{self.owner}.{self.name} does not exist"
        if self.params is not None:
            function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            try:
                names = [p for p in inspect.signature(function).parameters if p not in ("self", "cls")]
            except (TypeError, ValueError):
                return f"{self.owner}.{self.name} has no readable signature"
            if tuple(names) != self.params:
                return f"{self.owner}.{self.name} takes ({', '.join(names)}), expected ({', '.join(self.params)})"
        return None


def installed_dspy_version() -> str:
    try:
        return importlib.metadata.version("dspy")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def check(wing: str, requirements: tuple[Requirement, ...]) -> None:
    """Raise :class:`DspyVersionError` listing every requirement the installed dspy does not meet."""
    problems = [problem for requirement in requirements if (problem := requirement.problem())]
    if problems:
        raise DspyVersionError(
            f"rlmoptimizer's {wing} relies on dspy internals that the installed dspy {installed_dspy_version()} "
            f"does not have: {'; '.join(problems)}. rlmoptimizer is tested with dspy "
            f"{', '.join(TESTED_DSPY_VERSIONS)}: install it with `pip install \"dspy=={TESTED_DSPY_VERSIONS[-1]}\"`, "
            "or a rlmoptimizer release that supports your dspy."
        )
