"""How close does the cost estimate (``optimizer.estimate(...)``) come to what an offline compile then spends?

Offline and deterministic: the offline demo's two-step ticket router (``example.py``) with its fake LMs, compiled
in five settings, each estimated first (no LM call) and then run, and the estimate compared with the usage the
compile recorded, per role (eval, sub, root): LM calls and tokens in and out.

* ``demo``: ``example.py`` as it is (the scripted agent, ``max_iterations=3``): its second proposal solves the task
  and the run stops with most of its budget left, the estimate's *solved early* case;
* ``demo, sampled``: the same, estimated with ``sample=3`` (3 paid train examples measure the program's calls);
* ``loop, solved``: ``rlm_autopilot="loop"`` with the demo's LMs (solved early too);
* ``loop, noisy``: ``"loop"`` with a task LM whose answers change with the instructions without getting better (a
  hash of the instructions and the ticket decides, about half right): children sometimes beat their parents, nothing
  solves the task, the budget is spent: the estimate's *budget spent* case;
* ``loop, max_metric_calls``: the same with ``max_metric_calls=60`` instead of ``max_iterations``.

    python benchmarks/bench_estimate.py [--json PATH]

It prints, per setting and role, the case the run was (solved early: it stopped once train passed; else budget spent)
and, for that case, predicted -> spent calls and tokens with how far off the prediction was.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("DSPY_CACHEDIR", tempfile.mkdtemp(prefix="rlmopt-bench-estimate-"))
_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))

import example  # noqa: E402
from rlmoptimizer import RLMDocstringOptimizer  # noqa: E402
from rlmoptimizer.testing import FunctionLM, ScriptedLM, last_user_text  # noqa: E402

_QUEUE_OF = {ticket: queue for ticket, queue in example.TICKETS}
_QUEUES = sorted(set(_QUEUE_OF.values()))


def noisy_task_lm_reply(messages):
    """The demo's task LM, except that its routing answers change with the instructions without getting better: for
    each (instructions, ticket) a hash of both decides whether it answers right or with another queue, about half and
    half, as a small model whose answers move with the prompt and do not improve. Summaries are the demo's."""
    reply = example.task_lm_reply(messages)
    if "queue" not in reply:
        return reply
    system, user = str(messages[0].get("content", "")), last_user_text(messages)
    summary = user.split("[[ ## summary ## ]]", 1)[1].split("Respond with", 1)[0].strip()
    right = _QUEUE_OF.get(summary, reply["queue"])
    digest = hashlib.sha256(f"{system}|{summary}".encode()).digest()
    if digest[0] % 2:
        return {"queue": right}
    others = [q for q in _QUEUES if q != right]
    return {"queue": others[digest[1] % len(others)]}


SETTINGS = {
    "demo": {"max_iterations": 3, "agent": True, "noisy": False},
    "demo, sampled": {"max_iterations": 3, "agent": True, "noisy": False, "sample": 3},
    "loop, solved": {"max_iterations": 3, "agent": False, "noisy": False},
    "loop, noisy": {"max_iterations": 3, "agent": False, "noisy": True},
    "loop, max_metric_calls": {"max_metric_calls": 60, "agent": False, "noisy": True},
}


def run(name: str, setting: dict) -> dict:
    trainset, valset = example.make_splits()
    task_lm = FunctionLM(noisy_task_lm_reply if setting["noisy"] else example.task_lm_reply, name="fake-task-lm")
    sub_lm = FunctionLM(example.proposal_reply, name="fake-sub-lm")
    budget = {k: setting[k] for k in ("max_iterations", "max_metric_calls") if k in setting}
    if setting["agent"]:
        mode = {"root_lm": ScriptedLM(example.AGENT_TURNS, name="scripted-root-agent")}
    else:
        mode = {"rlm_autopilot": "loop"}
    optimizer = RLMDocstringOptimizer(
        **budget, **mode, sub_lm=sub_lm, eval_lm=task_lm, run_storage_dir=tempfile.mkdtemp(prefix="rlmopt-est-")
    )
    program = example.RouteTicket()
    estimate = optimizer.estimate(
        program, trainset=trainset, valset=valset, metric=example.metric, sample=setting.get("sample", 0)
    )
    optimized = optimizer.compile(program, trainset=trainset, valset=valset, metric=example.metric)
    check = estimate.against(optimized.usage)
    # The case the run was: solved early when the loop stopped because train passed (GEPA idle, or the policy's
    # submission after every train example passed), else it spent what it could of its budget.
    solved = any(
        "nothing more to learn" in str(t.get("output")) or "pass every train example" in str(t.get("output"))
        for t in optimized.agent_trajectory
    )
    budget_spent = not solved
    rows = {}
    for row in check.rows:
        case = row.predicted if budget_spent else row.solved_early
        rows[row.role] = {
            "calls": [case.calls, row.actual.calls],
            "tokens_in": [case.input_tokens, row.actual.input_tokens],
            "tokens_out": [case.output_tokens, row.actual.output_tokens],
        }
    return {
        "setting": name,
        "case": "budget spent" if budget_spent else "solved early",
        "units": [optimized.budget["spent"], optimized.budget["limit"]],
        "roles": rows,
        "estimate": estimate.to_dict(),
        "check": check.to_dict(),
    }


def _off(pair: list[int]) -> str:
    predicted, spent = pair
    if not predicted:
        return "   -  " if not spent else "  new "
    return f"{(spent - predicted) / predicted:+6.0%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    results = [run(name, setting) for name, setting in SETTINGS.items()]
    print(f"{'setting':<24}{'case':<14}{'units':>7}  {'role':<6}{'calls':>24}{'tokens in':>24}{'tokens out':>24}")
    for result in results:
        for i, (role, row) in enumerate(result["roles"].items()):
            head = (
                f"{result['setting']:<24}{result['case']:<14}{'/'.join(map(str, result['units'])):>7}"
                if i == 0
                else " " * 45
            )
            cells = "".join(
                f"{row[k][0]:>7,} ->{row[k][1]:>7,}{_off(row[k]):>7}" for k in ("calls", "tokens_in", "tokens_out")
            )
            print(f"{head}  {role:<6}{cells}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
