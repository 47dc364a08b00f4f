#!/usr/bin/env bash
# CI for the docs: the site builds with no warning (mkdocs build --strict: broken links, missing pages, docstrings
# griffe cannot read), and the quick-start notebook runs top to bottom, offline, with a time limit per cell.
# Run from the repository root in an activated virtual environment with the project installed.
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install --quiet -e ".[docs,plot]"  # plot: the notebook shows the picture of its run
python -c "import mkdocs, material, mkdocstrings_handlers.python, nbclient, nbformat, ipykernel, matplotlib" 2>/dev/null || {
    echo "docs: the docs and plot extras did not install mkdocs-material, mkdocstrings[python], nbclient, nbformat, ipykernel and matplotlib" >&2
    exit 1
}
export NO_MKDOCS_2_WARNING=1  # mkdocs-material's notice about its successor, not about this site

SITE_DIR="$(mktemp -d -t rlmoptimizer-site-XXXXXX)"
trap 'rm -rf "$SITE_DIR"' EXIT
mkdocs build --strict --site-dir "$SITE_DIR"
echo "docs: the site built with --strict ($(find "$SITE_DIR" -name '*.html' | wc -l) pages)"

export LITELLM_LOCAL_MODEL_COST_MAP=True  # offline: litellm's price table from the package
python - <<'PY'
import sys
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

PATH = "examples/quickstart.ipynb"
CELL_TIMEOUT_S = 600  # the first sandbox start on a machine fetches Pyodide; every later cell takes seconds

notebook = nbformat.read(PATH, as_version=4)
kept = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
if kept:
    sys.exit(f"docs: {PATH} is committed with outputs in cells {kept}; clear them (Jupyter: Clear All Outputs)")
started = time.perf_counter()
client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                        resources={"metadata": {"path": "examples"}})
try:
    client.execute()
except CellExecutionError as exc:
    sys.exit(f"docs: {PATH} failed:\n{exc}")
errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
if errors:
    sys.exit(f"docs: {PATH} has error outputs: {[e['ename'] for e in errors]}")
code_cells = sum(c.cell_type == "code" for c in notebook.cells)
print(f"docs: {PATH} ran {code_cells} code cells in {time.perf_counter() - started:.1f} s")
PY
