"""The package's rooms and the one direction their imports flow, read from the source with ``ast``.

A room is a top-level module (``records``) or folder (``evaluation``) of ``rlmoptimizer``. Each has a rank;
a module may import its own room and rooms of a lower rank only, so there are no loops between rooms and no
lower room reaches up. Inside a room, the module graph has no loops either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "rlmoptimizer"

RANKS = {
    "errors": 0,
    # the standard library and dspy, plus errors
    "dspy_contract": 1,
    "records": 1,
    "budget": 1,
    "metric": 1,
    "inputs": 1,
    "student": 1,
    "testing": 1,
    # pure data and policies over records
    "fingerprint": 2,
    "events": 2,
    "selection": 2,
    # the run directory, the REPL, what the user sees
    "storage": 3,
    "sandbox": 3,
    "display": 3,
    "usage": 3,
    # what a person sees, read back from the run directory
    "evaluation": 4,
    "report": 4,
    # the steps fixed-algorithm optimizers make, over stored runs: what the agent's tools and the default loop call
    "moves": 5,
    "agent": 6,
    # what a compile will cost, from the agent's plan and prompts
    "estimate": 7,
    # one compile(): the baselines, the agent or the loop, the choice, the result
    "flow": 8,
    "optimizer": 9,
    "__init__": 10,
    "__main__": 10,
}
MAX_LINES = 600  # a sanity limit: rooms are split by concept, not by line count
MAX_AGENT_LINES = 5000  # the agent is its turn loop, root-LM calls, prompts and tools, not every algorithm it calls


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(("rlmoptimizer", *parts))
        found[name.removesuffix(".__init__")] = path
    return found


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.startswith("rlmoptimizer")
        ):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.add(f"<relative import in {path.name}>")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("rlmoptimizer"))
    return found


MODULES = modules()


def internal_imports(path: Path) -> set[str]:
    """The modules of the package that ``path`` imports (``from x import name`` counts ``x.name`` when that
    is a module)."""
    return {name for name in imports(path) if name in MODULES}


def test_every_room_has_a_rank_and_every_folder_says_what_it_owns_and_may_import():
    assert {room(m) for m in MODULES} <= set(RANKS)
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "May import" in doc, f"{init.relative_to(PACKAGE)} does not say what its room may import"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_flow_down_only(module):
    path = MODULES[module]
    names = imports(path)
    assert not [n for n in names if n.startswith("<relative")], "use absolute imports"
    unknown = sorted(n for n in names if n not in MODULES and n.rsplit(".", 1)[0] not in MODULES)
    assert not unknown, f"{module} imports modules the package does not have: {unknown}"
    mine = RANKS[room(module)]
    upward = sorted(n for n in internal_imports(path) if room(n) != room(module) and RANKS[room(n)] >= mine)
    assert not upward, f"{module} (rank {mine}) imports rooms at its rank or above: {upward}"


def test_no_import_loops():
    graph = {m: internal_imports(p) - {m} for m, p in MODULES.items()}
    # a package's own __init__ re-exporting its modules is not a loop of ideas; leave those edges out
    graph = {m: {d for d in deps if not (d == m.rsplit(".", 1)[0] and d in MODULES)} for m, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in graph[node]:
            if state.get(dep) == 1:
                raise AssertionError("import loop: " + " -> ".join([*trail[trail.index(dep) :], dep]))
            if dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_too_long_to_read(module):
    path = MODULES[module]
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines (at most {MAX_LINES})"


def test_the_agent_stays_the_agent():
    """The agent room holds the turn loop, its root-LM calls, its prompts and its tools; what those tools do lives
    in the rooms below it."""
    files = sorted((PACKAGE / "agent").rglob("*.py"))
    lines = sum(len(path.read_text(encoding="utf-8").splitlines()) for path in files)
    assert lines < MAX_AGENT_LINES, (
        f"rlmoptimizer/agent has {lines} lines of Python (it must stay under {MAX_AGENT_LINES}): put what is not "
        "the agent's turn loop, root-LM calls, prompts or tools where its concept lives: a step an optimizer makes "
        "(proposing, comparing, analysing, GEPA) in rlmoptimizer/moves/, what a run directory keeps in "
        "rlmoptimizer/storage/, evaluating in rlmoptimizer/evaluation/, what a person sees in rlmoptimizer/report/"
    )
