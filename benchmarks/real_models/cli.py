"""The real-model benchmark's command line, apart from everything it runs.

Only the standard library is imported here (and ``local_model``, which imports nothing else), so that
``python benchmarks/real_models/cli.py --help`` and ``bash benchmarks/real_models/run.sh --help`` answer at once,
without dspy, a venv, a build or a model. ``run.py`` parses its arguments with :func:`parse_args`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from local_model import DEFAULT_WEIGHTS, WEIGHTS  # noqa: E402  (standard library only)

LOCAL = "local"
DEFAULT_TASK = HERE / "tasks" / "ticket_routing.py"
DEFAULT_ARMS = "unchanged,gepa,mipro,rlmoptimizer"
# What --ceiling puts first: the unchanged program and the two ceilings, none of which calls an optimizer LM.
CEILING_ARMS = ("unchanged", "ceiling-instruction", "ceiling-demos")

# Every arm ``--optimizers`` accepts (``arms.ARMS`` has the same keys; run.py checks it), with its help line.
ARM_HELP: dict[str, str] = {
    "unchanged": "the program as given (once, not per seed)",
    "ceiling-instruction": "the unchanged program with the task's best known instruction (BEST_INSTRUCTION, "
    "else POLICY_INSTRUCTION); no optimizer call, once",
    "ceiling-demos": "the bare instruction with the task's hand-picked train demos (ceiling_demos(train)); no "
    "optimizer call, once",
    "policy": "the earlier name of ceiling-instruction (arm files of earlier runs load under it)",
    "gepa": "dspy.GEPA, max_metric_calls=B",
    "mipro": "dspy.MIPROv2 without demos (max_bootstrapped_demos=0, max_labeled_demos=0)",
    "mipro-demos": "dspy.MIPROv2 with its default demos (max_bootstrapped_demos=4, max_labeled_demos=4)",
    "rlmoptimizer": "RLMDocstringOptimizer as configured by default (its agent)",
    "rlmoptimizer-loop": "RLMDocstringOptimizer(rlm_autopilot='loop'): the default policy in Python, no root-LM "
    "turn, no sandbox ('not available' on a library without that mode)",
}
SEEDED = {"gepa", "mipro", "mipro-demos", "rlmoptimizer", "rlmoptimizer-loop"}


def _arms_help() -> str:
    return "; ".join(f"{key}: {text}" for key, text in ARM_HELP.items())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="run.sh",
        description="Compare the unchanged program, rlmoptimizer, GEPA and MIPROv2 on one task with real models. "
        "Arms run seed by seed: every arm's seed 0 (with the arms that run once), then every arm's seed 1, and so on, "
        "so a stopped run leaves matched pairs; a finished arm is saved at once and skipped when the same --out "
        "is given again.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("task and budget")
    g.add_argument(
        "--task",
        default=str(DEFAULT_TASK),
        help="a task: path to a .py file or a dotted module exposing load(), make_program(), metric()",
    )
    g.add_argument(
        "--budget",
        type=int,
        default=80,
        help="B, metric calls per optimizer (a metric call is one program run on one example, counted whether or "
        "not its output parses)",
    )
    g.add_argument(
        "--optimizers",
        default=DEFAULT_ARMS,
        help=f"comma-separated arms, in the order to run within each seed. The arms: {_arms_help()}",
    )
    g.add_argument(
        "--seeds",
        default="0",
        help="comma-separated seeds; every optimizer arm runs once per seed (GEPA's and MIPROv2's seed, "
        "rlmoptimizer's attempt), the unchanged program and the ceilings once; the arms run seed by seed",
    )
    g.add_argument(
        "--ceiling",
        action="store_true",
        help=f"run {', '.join(CEILING_ARMS)} first (the unchanged program, the best known instruction, the bare "
        "instruction with the task's hand-picked demos), each scored on the test split at no optimizer call "
        "(--optimizers '' for the ceilings alone)",
    )
    g.add_argument("--predictor", help="the task's predictor setting (the default task: cot or predict)")
    g.add_argument("--adapter", help="the task's adapter setting (the default task: json or chat)")
    g.add_argument(
        "--limit-train",
        type=int,
        default=20,
        help="use only the first N training examples (0: all; the default task has 40)",
    )
    g.add_argument(
        "--limit-val",
        type=int,
        default=20,
        help="use only the first N validation examples (0: all; the default task has 30)",
    )
    g.add_argument(
        "--limit-test",
        type=int,
        default=40,
        help="use only the first N test examples (0: all; the default task has 60)",
    )
    g.add_argument("--num-threads", type=int, default=2, help="evaluation threads for every optimizer and the test")
    g.add_argument(
        "--rlm-commit",
        default="HEAD",
        help="the git commit of rlmoptimizer to run (run.sh checks it out into a worktree under "
        "<work-dir> and puts it first on PYTHONPATH; recorded in every arm file)",
    )

    g = p.add_argument_group("models ('local' = the GGUF model on a llama.cpp server started here)")
    g.add_argument("--task-model", default=LOCAL, help="task LM, e.g. openai/gpt-4o-mini (a litellm model name)")
    g.add_argument("--optimizer-model", default=LOCAL, help="optimizer LM for all three optimizers, e.g. openai/gpt-4o")
    g.add_argument("--api-base", help="API base URL for hosted models (default: the provider's)")
    g.add_argument("--api-key", help="API key for hosted models (default: the provider's environment variable)")
    g.add_argument("--task-max-tokens", type=int, default=256)
    g.add_argument("--task-temperature", type=float, default=0.0)
    g.add_argument("--optimizer-max-tokens", type=int, default=1024)
    g.add_argument(
        "--price-as",
        default="openai/gpt-4o-mini",
        help="the hosted model (litellm name) whose price the table's dollar columns use for the local model",
    )
    g.add_argument("--optimizer-temperature", type=float, default=0.7)

    g = p.add_argument_group("local server")
    g.add_argument("--local-model", default=DEFAULT_WEIGHTS, choices=sorted(WEIGHTS))
    g.add_argument("--n-ctx", type=int, default=8192, help="context window of the optimizer LM's server")
    g.add_argument("--task-n-ctx", type=int, default=4096, help="context window of the task LM's server")
    g.add_argument("--server-threads", type=int, default=len(os.sched_getaffinity(0)))
    g.add_argument(
        "--one-server",
        action="store_true",
        help="serve both roles from one server (less memory, slower optimizer calls)",
    )
    g.add_argument(
        "--setup-only",
        action="store_true",
        help="assemble the model, start the server, check it answers, stop it; run nothing",
    )

    g = p.add_argument_group("optimizer settings")
    g.add_argument("--mipro-candidates", type=int, default=4, help="MIPROv2 num_candidates (instructions proposed)")
    g.add_argument("--mipro-minibatch-size", type=int, default=5)
    g.add_argument("--mipro-full-eval-steps", type=int, default=5)
    g.add_argument("--rlm-max-turns", type=int, default=12, help="rlmoptimizer rlm_max_iterations (agent turns)")
    g.add_argument("--rlm-max-llm-calls", type=int, default=10, help="rlmoptimizer rlm_max_llm_calls")

    g = p.add_argument_group("output")
    g.add_argument("--work-dir", default=str(REPO / "benchmarks" / ".work"))
    g.add_argument("--out", help="output folder (default: <work-dir>/results/<UTC timestamp>)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.optimizers.split(",") if a.strip()]
    if args.ceiling:
        arms = [*CEILING_ARMS, *(a for a in arms if a not in CEILING_ARMS)]
    unknown = [a for a in arms if a not in ARM_HELP]
    if unknown:
        p.error(f"--optimizers: unknown {unknown}; choose from {', '.join(ARM_HELP)}")
    args.arms = list(dict.fromkeys(arms))
    try:
        args.seed_list = list(dict.fromkeys(int(x) for x in args.seeds.split(",") if x.strip()))
    except ValueError:
        p.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    if not args.seed_list or min(args.seed_list) < 0:
        p.error(f"--seeds: at least one seed, none negative, got {args.seeds!r}")
    if args.budget < 1:
        p.error(f"--budget must be >= 1, got {args.budget}")
    for flag in ("limit_train", "limit_val", "limit_test"):
        value = getattr(args, flag)
        if value < 0:
            p.error(f"--{flag.replace('_', '-')} must be >= 0 (0: the whole split), got {value}")
        setattr(args, flag, value or None)
    return args


def plan_runs(arms: list[str], seeds: list[int]) -> list[tuple[str, int | None]]:
    """(arm, seed) in the order to run: seed by seed, each seed's arms in the order given; an arm that runs once
    (the unchanged program, the ceilings) runs in the first seed's round. A run stopped anywhere leaves every
    finished seed with all its arms, so the arms compare in matched pairs."""
    plan: list[tuple[str, int | None]] = []
    for index, seed in enumerate(seeds):
        for key in arms:
            if key in SEEDED:
                plan.append((key, seed))
            elif index == 0:
                plan.append((key, None))
    return plan


if __name__ == "__main__":
    # run.sh calls this first: --help prints the help, a bad flag fails here, before anything is set up.
    parse_args()
