"""Run the quick-start notebook top to bottom, offline, and check it.

    python .ci/notebook.py            # check the committed notebook, then run a copy of it: fails on any error
    python .ci/notebook.py --write    # run it and save its outputs into examples/quickstart.ipynb (then commit)

The notebook is committed with its outputs, so a reader on a code host sees what each cell prints. The check:
the committed copy was run top to bottom in one kernel (execution counts 1, 2, 3, ... in order), holds no error
output, and shows ``run_gepa`` and the cost estimate; the run: every cell of a fresh copy executes without an error (nbclient, a kernel
of this Python: ``pip install -e ".[docs,plot]"``). Run from anywhere; the notebook runs in ``examples/``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
CELL_TIMEOUT_S = 600  # the first sandbox start on a machine fetches Pyodide; every later cell takes seconds


def committed_problems(notebook) -> list[str]:
    """What is wrong with the outputs committed in ``notebook`` (a nbformat node)."""
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    counts = [cell.get("execution_count") for cell in code]
    problems = []
    if counts != list(range(1, len(code) + 1)):
        problems.append(
            f"execution counts {counts}: run it top to bottom in a fresh kernel and save it with its outputs "
            "(python .ci/notebook.py --write)"
        )
    errors = [
        f"cell {index} ({output.get('ename')})"
        for index, cell in enumerate(code, start=1)
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    if errors:
        problems.append(f"committed with error outputs: {', '.join(errors)}")
    if not any("run_gepa" in cell.source for cell in code):
        problems.append("no cell shows run_gepa, the agent's first move")
    if not any("optimizer.estimate(" in cell.source for cell in code):
        problems.append("no cell shows the cost estimate made before the run (optimizer.estimate)")
    return problems


def execute(notebook) -> float:
    """Run every cell of ``notebook`` in place, in ``examples/``; returns the seconds it took."""
    from nbclient import NotebookClient

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: litellm's price table from the package
    started = time.perf_counter()
    client = NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        record_timing=False,  # no timestamps in the committed file
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="save the outputs into the notebook")
    args = parser.parse_args(argv)
    try:
        import nbformat
        from nbclient.exceptions import CellExecutionError
    except ImportError as exc:
        print(f"notebook: {exc.name} is missing: pip install -e '.[docs,plot]'", file=sys.stderr)
        return 2
    name = NOTEBOOK.relative_to(ROOT)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    problems = [] if args.write else committed_problems(notebook)
    try:
        seconds = execute(notebook)
    except CellExecutionError as exc:
        print(f"notebook: {name} failed:\n{exc}", file=sys.stderr)
        return 1
    problems += [f"after a fresh run: {problem}" for problem in committed_problems(notebook)]
    if problems:
        print(f"notebook: {name}:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    if args.write:
        nbformat.write(notebook, NOTEBOOK)
    code_cells = sum(cell.cell_type == "code" for cell in notebook.cells)
    print(
        f"notebook: {name} ran {code_cells} code cells in {seconds:.1f} s" + (", outputs saved" if args.write else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
