"""The dspy rlmoptimizer works with: the supported version range and every dspy name it relies on (and every name
of the gepa package dspy pins, whose engine ``run_gepa`` runs), checked once, when ``rlmoptimizer`` is imported and
before anything else in it is.

rlmoptimizer subclasses ``dspy.PythonInterpreter``, overrides or calls some of its private members, builds its
agent on dspy's REPL types (as ``dspy.RLM`` does), and imports names from dspy's submodules; a dspy release may rename or remove any of them (3.4.0 ->
3.4.1 renamed several private members, 3.3.1 -> 3.4.1 removed ``dspy.LMResponse`` and changed
``RLM.forward``). :data:`REQUIREMENTS` lists, wing by wing, every name imported from dspy (top-level names
imported with ``from dspy import ...`` or reached as ``dspy.<name>`` included), every private member used, and every
gepa name ``run_gepa`` relies on (the keywords it passes ``gepa.optimize`` included), as :class:`Requirement` rows.
:func:`check_installed_dspy` (called first thing by ``rlmoptimizer/__init__.py``) checks the installed dspy's
version against :data:`SUPPORTED_DSPY` and every row of every wing, and raises one
:class:`DspyVersionError` (an ``ImportError``) listing every problem found, the supported range and the pip
command that fixes it. So a dspy outside the range never surfaces as a raw ``ImportError`` or an
``AttributeError`` in the middle of an optimization.

The check costs about a millisecond: it reads signatures and bytecode, never source files.

To move to a new dspy: widen :data:`SUPPORTED_DSPY` (and :data:`LOWEST_DSPY`, :data:`BELOW_DSPY`) together
with the ``dspy`` requirement in ``pyproject.toml``, run ``python -m pytest tests/test_dspy_versions.py`` (it
checks every row, parameters included), then the whole suite, on the lowest and the highest release of the range.

May import: the standard library and ``rlmoptimizer.errors`` only.
"""

from __future__ import annotations

import dis
import importlib
import importlib.metadata
import inspect
import re
import sys
import types
from dataclasses import dataclass

from rlmoptimizer.errors import DspyVersionError

__all__ = [
    "BELOW_DSPY",
    "LOWEST_DSPY",
    "REQUIREMENTS",
    "SUPPORTED_DSPY",
    "TESTED_DSPY_VERSIONS",
    "DspyVersionError",
    "Requirement",
    "check",
    "check_installed_dspy",
    "dspy_problems",
    "fix_command",
    "gepa_fix_command",
    "installed_dspy_version",
    "version_problem",
]

LOWEST_DSPY = (3, 4, 1)
"""The lowest supported dspy release (tested in CI)."""
BELOW_DSPY = (3, 5)
"""The first dspy release not supported: the range is the patch releases of the series we test."""
SUPPORTED_DSPY = ">=3.4.1,<3.5"
"""The dspy requirement of ``pyproject.toml``, as pip writes it."""
TESTED_DSPY_VERSIONS = ("3.4.1",)
"""The dspy releases of the range the test suite ran against."""


@dataclass(frozen=True)
class Requirement:
    """One dspy name a wing relies on.

    ``owner`` is ``"module"`` or ``"module:Class"``; ``name`` the member. ``params``, when given, are the
    parameter names (after ``self``) the member must accept, for a method we override or call. ``accepts``, when
    given, are the keyword arguments we call the member with: it must take each of them (and may take more, as
    ``gepa.optimize`` does). ``instance`` marks an attribute set in the class's methods (``self.name = ...``, found
    in their bytecode, since no instance is built)."""

    owner: str
    name: str
    params: tuple[str, ...] | None = None
    instance: bool = False
    accepts: tuple[str, ...] | None = None

    @property
    def private(self) -> bool:
        """Whether dspy keeps the name private (a leading underscore)."""
        return self.name.startswith("_")

    def problem(self) -> str | None:
        """What is wrong with this requirement in the installed dspy, or None."""
        module_name, _, class_name = self.owner.partition(":")
        target, failure = _import(module_name)
        if failure is not None:
            return f"module {module_name} cannot be imported ({failure})"
        if class_name:
            target = getattr(target, class_name, None)
            if target is None:
                return f"{module_name}.{class_name} does not exist"
        if self.instance:
            return None if _sets_attribute(target, self.name) else f"{self.owner} no longer sets self.{self.name}"
        if class_name:
            member = inspect.getattr_static(target, self.name, None)
        else:
            member = getattr(target, self.name, None)
        if member is None:
            return f"{self.owner}.{self.name} does not exist"
        if self.params is not None or self.accepts is not None:
            function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            try:
                parameters = inspect.signature(function).parameters
            except (TypeError, ValueError):
                return f"{self.owner}.{self.name} has no readable signature"
            names = [p for p in parameters if p not in ("self", "cls")]
            if self.params is not None and tuple(names) != self.params:
                return f"{self.owner}.{self.name} takes ({', '.join(names)}), expected ({', '.join(self.params)})"
            takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
            missing = [name for name in self.accepts or () if name not in names and not takes_any]
            if missing:
                return f"{self.owner}.{self.name} no longer takes {', '.join(missing)}"
        return None


def _import(module_name: str) -> tuple[types.ModuleType | None, str | None]:
    """``(module, None)``, or ``(None, why it cannot be imported)``."""
    try:
        return importlib.import_module(module_name), None
    except ImportError as exc:
        return None, str(exc)
    except Exception as exc:  # a dspy module failing in its own import
        return None, f"{type(exc).__name__}: {exc}"


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _sets_attribute(cls: type, name: str) -> bool:
    """Whether a method of ``cls`` (or of a base class) stores ``<something>.name``: ``STORE_ATTR`` in its
    bytecode. Reading the bytecode costs microseconds; ``inspect.getsource`` cost tens of milliseconds."""
    for klass in getattr(cls, "__mro__", (cls,)):
        for value in vars(klass).values():
            function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            if isinstance(function, property):
                function = function.fset
            code = getattr(function, "__code__", None)
            if not isinstance(code, types.CodeType):
                continue
            if any(_stores_attribute(part, name) for part in _code_objects(code)):
                return True
    return False


_STORE_ATTR = dis.opmap["STORE_ATTR"]


def _stores_attribute(code: types.CodeType, name: str) -> bool:
    """Whether ``code`` has a ``STORE_ATTR name`` instruction (raw bytecode: two bytes per unit on every
    supported Python, ``STORE_ATTR``'s argument the index of the name in ``co_names``)."""
    try:
        index = code.co_names.index(name)
    except ValueError:
        return False
    raw, extended = code.co_code, 0
    for at in range(0, len(raw) - 1, 2):
        opcode, argument = raw[at], raw[at + 1] | extended
        if opcode == dis.EXTENDED_ARG:
            extended = argument << 8
            continue
        if opcode == _STORE_ATTR and argument == index:
            return True
        extended = 0
    return False


# ------------------------------------------------------------------------------------------------ the rows

_PI = "dspy.primitives.python_interpreter:PythonInterpreter"
_EXC = "dspy.utils.exceptions"

_GEPA_RESULT = "gepa.core.result:GEPAResult"
_GEPA_CALLBACK = "gepa.core.callbacks:GEPACallback"

REQUIREMENTS: dict[str, tuple[Requirement, ...]] = {
    # The names every wing reaches as ``dspy.<name>`` (after ``import dspy``).
    "dspy": tuple(
        Requirement("dspy", name)
        for name in (
            "BaseLM",
            "BaseModule",
            "ChainOfThought",
            "Example",
            "History",
            "InputField",
            "JSONAdapter",
            "LM",
            "LMNotConfiguredError",
            "Module",
            "OutputField",
            "Predict",
            "Prediction",
            "ReAct",
            "Signature",
            "context",
            "settings",
            "utils",
        )
    ),
    # The gepa package (pinned through dspy's own requirement), whose engine run_gepa runs
    # (rlmoptimizer/moves/gepa.py, gepa_adapter.py): what we call, with the keywords we pass, and the engine's
    # calls into our adapter and callbacks.
    "gepa": (
        Requirement(
            "gepa",
            "optimize",
            accepts=(
                "seed_candidate",
                "trainset",
                "valset",
                "adapter",
                "reflection_lm",
                "candidate_selection_strategy",
                "reflection_minibatch_size",
                "perfect_score",
                "skip_perfect_score",
                "module_selector",
                "use_merge",
                "max_merge_invocations",
                "stop_callbacks",
                "logger",
                "callbacks",
                "seed",
                "raise_on_exception",
                "track_best_outputs",
                "display_progress_bar",
                "sampling_strategy",
            ),
        ),
        Requirement("gepa.core.result", "GEPAResult"),
        Requirement(_GEPA_RESULT, "from_state", accepts=("state", "seed")),
        Requirement(_GEPA_RESULT, "best_idx"),
        Requirement("gepa.strategies.proposal_sampling", "PxNSampling", params=("p", "n")),
        Requirement(
            "gepa.core.adapter", "EvaluationBatch", accepts=("outputs", "scores", "trajectories", "num_metric_calls")
        ),
        Requirement("gepa.core.adapter:GEPAAdapter", "evaluate", params=("batch", "candidate", "capture_traces")),
        Requirement(
            "gepa.core.adapter:GEPAAdapter",
            "make_reflective_dataset",
            params=("candidate", "eval_batch", "components_to_update"),
        ),
        *(
            Requirement(_GEPA_CALLBACK, name, params=("event",))
            for name in ("on_iteration_start", "on_evaluation_start", "on_merge_accepted", "on_iteration_end")
        ),
    ),
    # The moves (rlmoptimizer/moves/): GEPA's reflective proposal, as dspy's own proposer writes it.
    "moves": (Requirement("dspy.teleprompt.gepa", "InstructionProposer"),),  # proposal.py, gepa_adapter.py
    # The optimizer agent (rlmoptimizer/agent/): a dspy.Module with its own turn loop on dspy's REPL types and its
    # root-LM calls.
    "agent": (
        Requirement("dspy", "ensure_signature"),
        Requirement("dspy", "AdapterParseError"),  # from dspy import (agent.py, root_lm.py)
        Requirement("dspy", "ChatAdapter"),
        Requirement("dspy", "CodeInterpreter"),
        Requirement("dspy", "LMError"),
        Requirement("dspy", "Prediction"),
        Requirement("dspy.adapters.chat_adapter", "ChatAdapter"),  # context.py
        Requirement("dspy.lm15", "Message"),  # root_lm.py: the Responses-API chain
        Requirement("dspy.lm15", "Request"),
        Requirement("dspy.lm15", "Response"),
        Requirement("dspy.lm15", "request_from_openai_chat"),
        Requirement("dspy.primitives.code_interpreter", "CodeExecutionError"),
        Requirement("dspy.primitives.code_interpreter", "FinalOutput"),
        Requirement("dspy.primitives.code_interpreter", "resolve_interpreter_factory"),
        Requirement("dspy.primitives.repl_types", "REPLVariable"),
        Requirement(
            "dspy.primitives.repl_types:REPLVariable",
            "from_value",
            params=("name", "value", "field_info", "preview_chars"),
        ),
        Requirement("dspy.primitives.repl_types", "REPLHistory"),
        Requirement("dspy.primitives.repl_types:REPLHistory", "append", params=("reasoning", "code", "output")),
        Requirement("dspy.primitives.repl_types", "REPLEntry"),
        Requirement("dspy.primitives.repl_types:REPLEntry", "format_output", params=("output", "max_output_chars")),
        Requirement("dspy.clients.backend_selection", "CLIENT_KEYS"),
        # agent.py: the markers dspy's adapters turn into image (or other media) parts of a request
        Requirement("dspy.adapters.types.base_type", "CUSTOM_TYPE_START_IDENTIFIER"),
        Requirement("dspy.adapters.types.base_type", "CUSTOM_TYPE_END_IDENTIFIER"),
        Requirement(_EXC, "format_error_for_lm", params=("error", "traceback_frames")),
    ),
    # The REPL (rlmoptimizer/sandbox/): dspy's Deno/Pyodide PythonInterpreter, subclassed.
    "sandbox": (
        Requirement("dspy.primitives.code_interpreter", "CodeExecutionError"),
        Requirement("dspy.primitives.code_interpreter", "CodeInterpreterError"),
        Requirement("dspy.primitives.code_interpreter", "FinalOutput"),  # a submission the host noted, returned
        Requirement("dspy.primitives.python_interpreter", "PythonInterpreter"),
        # Each private member below keeps dspy's own Deno/Pyodide runner (unchanged from 3.3.1 to 3.4.1) under our
        # process control, limits and recovery; owning the runner instead would mean forking runner.js.
        Requirement(
            "dspy.primitives.python_interpreter", "_validate_deno_version", params=("deno_executable",)
        ),  # the Deno dspy's runner needs
        Requirement("dspy.primitives.facade", "HOST_TOKEN_VAR"),
        Requirement("dspy.primitives.facade", "SHIM_SETUP"),
        Requirement(_PI, "_spawn_process", params=()),  # overridden: our environment, stderr drained
        Requirement(_PI, "_health_check", params=()),  # the runner's own readiness probe, after our spawn
        Requirement(_PI, "_next_request_id", params=()),  # overridden: the reader learns the id in flight
        Requirement(_PI, "_send_request", params=("method", "params", "context")),  # overridden: not an execution
        Requirement(_PI, "_get_runner_path", params=()),  # runner.js, to pre-cache its imports offline
        Requirement(_PI, "_extract_parameters", params=("fn",)),  # the tool-registration format runner.js reads
        Requirement(_PI, "_get_deno_dir", params=("deno_executable",)),  # where Deno caches Pyodide (check, pre-cache)
        Requirement(_PI, "_tools_registered", instance=True),  # re-register tools after a restart
        Requirement(_PI, "_session_ended", instance=True),  # a killed process is a session that ended
        Requirement(_PI, "_last_diagnostic", instance=True),  # why the process died, for the agent and the user
        Requirement(_PI, "_owner_thread", instance=True),  # our lock serializes calls from the tools' threads
    ),
    # Evaluation (rlmoptimizer/evaluation/lm_failures.py): which LM failures stop a run.
    "evaluation": (
        Requirement(_EXC, "LMError"),
        Requirement(_EXC, "LMAuthError"),
        Requirement(_EXC, "LMBillingError"),
        Requirement(_EXC, "LMConfigurationError"),
        Requirement(_EXC, "LMUnsupportedModelError"),
        Requirement(_EXC, "LMUnsupportedFeatureError"),
        Requirement(_EXC, "LMTransportError"),
        Requirement(_EXC, "LMInvalidRequestError"),
        Requirement(_EXC, "LMCollectionLimitError"),
        # evaluator.py: which step's call raised, from the module callbacks dspy calls around each module call
        Requirement("dspy.utils", "BaseCallback"),
        Requirement("dspy.utils:BaseCallback", "on_module_start", params=("call_id", "instance", "inputs")),
        Requirement("dspy.utils:BaseCallback", "on_module_end", params=("call_id", "outputs", "exception")),
        # usage.py: an error an LM call raised is marked as the LM's (a custom BaseLM's, which dspy does not wrap)
        Requirement("dspy.utils:BaseCallback", "on_lm_end", params=("call_id", "outputs", "exception")),
    ),
    # The teleprompter itself (rlmoptimizer/optimizer.py).
    "optimizer": (
        Requirement("dspy.teleprompt.teleprompt", "Teleprompter"),
        Requirement("dspy.utils", "BaseCallback"),  # inputs.py: dspy's own callbacks passed in callbacks=[...]
    ),
    # The cost estimate (rlmoptimizer/estimate/): the requests it renders, as the adapters and GEPA's proposer format
    # them, before any LM call.
    "estimate": (
        Requirement("dspy.adapters.chat_adapter", "ChatAdapter"),
        Requirement("dspy.adapters.json_adapter", "JSONAdapter"),
        Requirement("dspy.adapters.base:Adapter", "format", params=("signature", "demos", "inputs")),
        Requirement(
            "dspy.adapters.base:Adapter",
            "format_assistant_message_content",
            params=("signature", "outputs", "missing_field_message"),
        ),
        Requirement("dspy.teleprompt.gepa", "InstructionProposer"),
        Requirement("dspy.teleprompt.gepa:InstructionProposer", "propose", instance=True),
    ),
    # The fakes of rlmoptimizer.testing (the offline demo and the tests).
    "testing": (
        Requirement("dspy.clients.engines.dummy_engine", "DummyEngine"),
        Requirement("dspy.clients.engines.dummy_engine", "AsyncDummyEngine"),
        Requirement("dspy.lm15", "TextPart"),
        Requirement("dspy.lm15", "Usage"),
        Requirement("dspy.utils.dummies", "DummyLM"),
    ),
}


# ------------------------------------------------------------------------------------------------ the check


def installed_dspy_version() -> str:
    """The installed dspy's version (its ``__version__``, else its distribution metadata), or ``"unknown"``."""
    module = sys.modules.get("dspy")
    version = getattr(module, "__version__", None)
    if isinstance(version, str) and version:
        return version
    try:
        return importlib.metadata.version("dspy")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _release(version: str) -> tuple[tuple[int, ...], bool] | None:
    """``(release numbers, is a pre-release)`` of a PEP 440 version, or None if it cannot be read."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)(.*)$", version)
    if match is None:
        return None
    rest = match.group(2).split("+", 1)[0].lower()
    prerelease = bool(re.match(r"[-_.]?(a|b|c|rc|alpha|beta|pre|preview|dev)", rest))
    return tuple(int(part) for part in match.group(1).split(".")), prerelease


def _padded(release: tuple[int, ...], width: int = 4) -> tuple[int, ...]:
    return release + (0,) * (width - len(release))


def version_problem(version: str) -> str | None:
    """Why ``version`` of dspy is outside :data:`SUPPORTED_DSPY`, or None when it is inside."""
    parsed = _release(version)
    if parsed is None:
        return f"dspy {version} is not a version rlmoptimizer can read; it supports dspy{SUPPORTED_DSPY}"
    release, prerelease = parsed
    below_lowest = _padded(release) < _padded(LOWEST_DSPY) or (prerelease and _padded(release) == _padded(LOWEST_DSPY))
    if below_lowest:
        return f"dspy {version} is older than the supported dspy{SUPPORTED_DSPY}"
    if _padded(release) >= _padded(BELOW_DSPY):
        return f"dspy {version} is newer than the supported dspy{SUPPORTED_DSPY} (rlmoptimizer is not tested with it)"
    return None


def fix_command() -> str:
    """The pip command that installs a supported dspy into this Python's environment."""
    return f'pip install "dspy{SUPPORTED_DSPY}"'


def dspy_problems(requirements: dict[str, tuple[Requirement, ...]] | None = None) -> list[str]:
    """Every problem of the installed dspy: its version first, then each failing row as ``"wing: problem"``.
    Empty when the installed dspy is supported."""
    try:
        import dspy  # noqa: F401
    except ImportError as exc:
        return [f"dspy cannot be imported ({exc})"]
    problems = []
    version = installed_dspy_version()
    if (outside := version_problem(version)) is not None:
        problems.append(f"version: {outside}")
    for wing, rows in (REQUIREMENTS if requirements is None else requirements).items():
        problems += [f"{wing}: {problem}" for problem in _wing_problems(rows)]
    return problems


def _wing_problems(rows: tuple[Requirement, ...]) -> list[str]:
    """The problems of one wing's rows, each said once: a module that cannot be imported is one problem naming
    what the wing uses from it."""
    problems: list[str] = []
    missing: dict[str, tuple[int, str, list[str]]] = {}  # module -> (position in problems, why, names)
    for row in rows:
        module_name, _, class_name = row.owner.partition(":")
        _, failure = _import(module_name)
        if failure is not None:
            name = f"{class_name}.{row.name}" if class_name else row.name
            if module_name not in missing:
                missing[module_name] = (len(problems), failure, [])
                problems.append("")
            missing[module_name][2].append(name)
        elif (problem := row.problem()) is not None and problem not in problems:
            problems.append(problem)
    for module_name, (at, failure, names) in missing.items():
        problems[at] = (
            f"module {module_name} cannot be imported ({failure}); rlmoptimizer uses {', '.join(names)} from it"
        )
    return problems


def _error(problems: list[str]) -> DspyVersionError:
    version = installed_dspy_version()
    dspy_module = sys.modules.get("dspy")
    where = getattr(dspy_module, "__file__", None)
    installed = f"dspy {version}" + (f" ({where})" if where else "") if dspy_module is not None else "no usable dspy"
    lines = [
        f"rlmoptimizer supports dspy{SUPPORTED_DSPY}; this environment has {installed}, "
        f"which rlmoptimizer cannot use ({len(problems)} problem{'s' if len(problems) != 1 else ''}):",
        *(f"  - {problem}" for problem in problems),
        f"Fix: {fix_command()}   (into the environment of {sys.executable}),",
        f"or install a rlmoptimizer release that supports dspy {version}.",
    ]
    # With a dspy outside the range, the Fix above brings the gepa that dspy pins too: one command, last lines kept.
    supported = not any(problem.startswith("version: ") for problem in problems)
    if supported and any(problem.startswith("gepa: ") for problem in problems):
        lines.append(
            f"gepa is the package dspy requires for GEPA; its installed release ({_distribution_version('gepa')}) "
            f"is not the one dspy {version} was released with: {gepa_fix_command()}"
        )
    return DspyVersionError("\n".join(lines))


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def gepa_fix_command() -> str:
    """The pip command that installs the gepa release the installed dspy requires (dspy pins it exactly)."""
    try:
        required = importlib.metadata.requires("dspy") or []
    except importlib.metadata.PackageNotFoundError:
        required = []
    for requirement in required:
        match = re.match(r"\s*gepa(?:\[[^\]]*\])?\s*([=<>!~][^;]*)", requirement)
        if match:
            return f'pip install "gepa{match.group(1).strip()}"'
    return 'pip install --force-reinstall "dspy' + SUPPORTED_DSPY + '"'


def check_installed_dspy() -> None:
    """Raise :class:`DspyVersionError` listing every problem of the installed dspy (see :func:`dspy_problems`).
    ``rlmoptimizer/__init__.py`` calls it before importing anything else of the package."""
    problems = dspy_problems()
    if problems:
        raise _error(problems)


def check(wing: str, requirements: tuple[Requirement, ...]) -> None:
    """Raise :class:`DspyVersionError` listing every requirement of ``wing`` the installed dspy does not meet
    (the version is not checked here: :func:`check_installed_dspy` does)."""
    problems = [f"{wing}: {problem}" for problem in _wing_problems(requirements)]
    if problems:
        raise _error(problems)
