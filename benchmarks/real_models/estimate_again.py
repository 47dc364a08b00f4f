"""The cost estimate of the library checked out here, against what recorded real-model runs spent.

Each rlmoptimizer arm of a results directory (``run.sh --out DIR``) recorded what it spent per role (the task LM's
program runs, the optimizer LM's calls and tokens) and the estimate of the library it ran. This script makes the
estimate again with the library imported here, for the same settings (the task, its split sizes, the budget, the
mode, the turns and window the arm ran with; model names as recorded, no server: an estimate calls no LM), and
prints it beside what each arm spent:

    python benchmarks/real_models/estimate_again.py benchmarks/.work/results/issue38 [--root-turns N]

The agent's turns are the estimate's assumption (``root_turns``, 5 for the default mode unless given): pass the
turns a run took to check the rest. Nothing is run, written or downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("DSPY_CACHEDIR", tempfile.mkdtemp(prefix="rlmopt-estimate-again-"))
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import dspy  # noqa: E402
from run import load_task  # noqa: E402

from rlmoptimizer import RLMDocstringOptimizer  # noqa: E402


def _spent(optimize: dict) -> dict[str, tuple[int, int, int]]:
    """What an arm spent: (calls, tokens in, tokens out) of the task LM and of the optimizer LM."""
    task, optimizer = optimize.get("task_lm") or {}, optimize.get("optimizer_lm") or {}
    return {
        "eval": (task.get("calls", 0), task.get("input_tokens", 0), task.get("output_tokens", 0)),
        "optimizer": (optimizer.get("calls", 0), optimizer.get("input_tokens", 0), optimizer.get("output_tokens", 0)),
    }


def estimate_for(row: dict, tasks_dir: Path, root_turns: int | None) -> dict[str, tuple[int, int, int]]:
    """The estimate (calls, tokens in, tokens out) of the task LM and of the optimizer LM (sub + root) for ``row``'s
    settings, made by the library imported here."""
    settings = row["settings"]
    task = load_task(str(tasks_dir / settings["task"]))
    train, val, _ = task.load()
    sizes = settings["split_sizes"]
    train, val = train[: sizes["train"]], val[: sizes["val"]]
    program = task.make_program(**(settings.get("program_options") or {}))
    lm = dspy.LM(f"openai/{settings['local_model']}", api_base="http://127.0.0.1:9/v1", api_key="none", cache=False)
    ran = (row.get("details") or {}).get("settings") or {}
    mode = ran.get("rlm_autopilot") or "assist"
    optimizer = RLMDocstringOptimizer(
        max_metric_calls=settings["budget"],
        root_lm=lm,
        sub_lm=lm,
        eval_lm=lm,
        num_threads=settings["num_threads"],
        rlm_max_iterations=settings["rlm_max_turns"],
        rlm_max_llm_calls=settings["rlm_max_llm_calls"],
        root_context_window=ran.get("root_context_window") or settings.get("n_ctx"),
        rlm_autopilot=mode,
        run_storage_dir=tempfile.mkdtemp(prefix="rlmopt-estimate-again-run-"),
    )
    adapters = getattr(task, "ADAPTERS", None) or {}
    name = getattr(program, "adapter_name", None)
    adapter = adapters[name]() if name in adapters else None
    estimate = optimizer.estimate(program, trainset=train, valset=val, adapter=adapter, root_turns=root_turns)
    rows = {r.role: r for r in estimate.roles}
    sub, root = rows["sub"], rows["root"]
    return {
        "eval": (rows["eval"].calls, rows["eval"].input_tokens, rows["eval"].output_tokens),
        "optimizer": (
            sub.calls + root.calls,
            sub.input_tokens + root.input_tokens,
            sub.output_tokens + root.output_tokens,
        ),
    }


def _off(predicted: int, spent: int) -> str:
    return f"{(spent - predicted) / predicted:+.0%}" if predicted else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a results directory of run.sh (--out)")
    parser.add_argument("--root-turns", type=int, default=None, help="the agent turns the estimate assumes")
    args = parser.parse_args(argv)
    arms = sorted((args.results / "arms").glob("rlmoptimizer*.json"))
    if not arms:
        parser.error(f"no rlmoptimizer arm in {args.results / 'arms'}")
    print(f"{'arm':<28}{'role':<11}{'calls':>22}{'tokens in':>26}{'tokens out':>24}")
    for path in arms:
        row = json.loads(path.read_text())
        if row.get("status") != "ok":
            continue
        predicted, spent = estimate_for(row, HERE / "tasks", args.root_turns), _spent(row["optimize"])
        for i, role in enumerate(("eval", "optimizer")):
            cells = "".join(
                f"{p:>9,} -> {s:>7,} {_off(p, s):>5}" for p, s in zip(predicted[role], spent[role], strict=True)
            )
            print(f"{row['label'] if i == 0 else '':<28}{role:<11}{cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
