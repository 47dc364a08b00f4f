"""What ``import rlmoptimizer`` costs on top of ``import dspy``, and how much of that is the dspy contract check.

    python benchmarks/bench_import.py                          # this checkout
    python benchmarks/bench_import.py --baseline /tmp/old-tree # and another checkout, with the ratios

A checkout to compare with: ``git worktree add /tmp/old-tree <commit>`` (remove it after with ``git worktree
remove /tmp/old-tree``). Each measurement is a fresh interpreter run with ``-X importtime`` that imports dspy
first, then rlmoptimizer from the tree given (on ``PYTHONPATH``), so dspy's own import is counted apart:

* ``dspy``: the cumulative import time of dspy;
* ``package``: the cumulative import time of rlmoptimizer after dspy (everything the package adds);
* ``contract``: the self time of ``rlmoptimizer`` (its ``__init__``, where the check now runs),
  ``rlmoptimizer.dspy_contract`` and the wings' ``_dspy`` modules (where it ran before): the check itself.

The median of ``--runs`` runs (trees alternate) is printed, then the ratios. The machine's load moves the
numbers; the ratios of runs made side by side move much less.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTRACT_MODULES = (
    "rlmoptimizer",
    "rlmoptimizer.dspy_contract",
    "rlmoptimizer.agent._dspy",
    "rlmoptimizer.sandbox._dspy",
)
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def measure(tree: Path, python: str) -> dict[str, float]:
    """One fresh interpreter: milliseconds of dspy, the package after it, and the contract check."""
    env = {**os.environ, "PYTHONPATH": str(tree), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    result = subprocess.run(
        [python, "-X", "importtime", "-c", "import dspy; import rlmoptimizer"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        raise SystemExit(f"import rlmoptimizer failed in {tree}:\n{result.stderr[-3000:]}")
    self_us: dict[str, int] = {}
    cumulative_us: dict[str, int] = {}
    for match in _LINE.finditer(result.stderr):
        own, total, indent, name = int(match.group(1)), int(match.group(2)), match.group(3), match.group(4)
        self_us[name] = own
        if len(indent) <= 1:  # a top-level import of the -c line
            cumulative_us[name] = total
    return {
        "dspy": cumulative_us.get("dspy", 0) / 1000,
        "package": cumulative_us.get("rlmoptimizer", 0) / 1000,
        "contract": sum(self_us.get(name, 0) for name in CONTRACT_MODULES) / 1000,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="another checkout of rlmoptimizer to compare with")
    parser.add_argument("--runs", type=int, default=7, help="fresh interpreters per tree (default 7)")
    parser.add_argument("--python", default=sys.executable, help="the Python (with dspy installed) to run")
    args = parser.parse_args(argv)
    trees = {"this tree": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    samples: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    for _ in range(args.runs):
        for label, tree in trees.items():
            samples[label].append(measure(tree, args.python))
    medians = {
        label: {key: statistics.median(s[key] for s in runs) for key in runs[0]} for label, runs in samples.items()
    }
    print(f"median of {args.runs} fresh interpreters, milliseconds ({args.python})")
    print(f"{'':12} {'import dspy':>12} {'rlmoptimizer after dspy':>24} {'contract check':>15}  tree")
    for label, tree in trees.items():
        m = medians[label]
        print(f"{label:12} {m['dspy']:12.1f} {m['package']:24.1f} {m['contract']:15.2f}  {tree}")
    here = medians["this tree"]
    print(f"contract check / rlmoptimizer after dspy (this tree): {here['contract'] / here['package']:.3f}")
    if args.baseline:
        before = medians["baseline"]
        print(
            f"ratio this tree / baseline: contract check {here['contract'] / before['contract']:.3f}, "
            f"rlmoptimizer after dspy {here['package'] / before['package']:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
