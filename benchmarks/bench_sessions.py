"""What does root_stateful_session save? Input tokens sent to the root LM per agent turn, session off and on.

One scripted 20-turn optimization (19 turns that read baseline examples, then SUBMIT) runs twice through the
real sandbox against a fake OpenAI Responses server on 127.0.0.1 (``tests/responses_server.py``): once with
``root_stateful_session=False`` (every turn re-sends the whole REPL history) and once with ``True`` (each turn
names the previous response and sends only the new step). Both arms get the same replies, so they differ only
in what is sent.

Tokens are counted from the request bodies the server received: characters of the instructions and of every
input item, divided by 4 and rounded up (no tokenizer; the ratio is what matters). The server also reports the
context the model reads per turn (the chain's stored conversation counts, as OpenAI bills it); that total is
printed too.

    python benchmarks/bench_sessions.py [--turns 20] [--multiturn]

``--multiturn`` turns ``rlm_multiturn_history`` on in both arms. Needs a checkout (it imports the example and
the test server); the first run fetches Pyodide into Deno's cache.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("DSPY_CACHEDIR", tempfile.mkdtemp(prefix="rlmopt-bench-cache-"))
_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT), str(_ROOT / "tests")]

from support.responses_server import Recorded, ResponsesServer  # noqa: E402
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, metric, task_lm_reply  # noqa: E402

from rlmoptimizer import RLMDocstringOptimizer  # noqa: E402
from rlmoptimizer.testing import FunctionLM  # noqa: E402


def scripted_turns(count: int) -> list[dict[str, str]]:
    """``count - 1`` turns that each print three baseline examples with their steps, then a SUBMIT."""
    turns = []
    for i in range(count - 1):
        start = (3 * i) % 12
        turns.append(
            {
                "reasoning": f"Read baseline examples {start}..{start + 2} and what each step produced.",
                "code": (
                    f"for e in baseline_train['examples'][{start}:{start + 3}]:\n"
                    "    print(e['example_id'], repr(e['inputs']['ticket']), '->', e['predicted'].get('queue'),\n"
                    "          '| expected', e['expected']['queue'], '| score', e['score'])\n"
                    "    for s in e['steps']:\n"
                    "        print('   ', s['step_name'], s['outputs'])"
                ),
            }
        )
    turns.append({"reasoning": "Submit.", "code": f"SUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})"})
    return turns


def run_arm(turns: list[dict[str, str]], *, stateful: bool, multiturn: bool) -> list[Recorded]:
    trainset, valset = make_splits()
    with ResponsesServer(turns) as server:
        optimizer = RLMDocstringOptimizer(
            max_iterations=2,
            root_lm=server.lm(),
            eval_lm=FunctionLM(task_lm_reply),
            num_threads=4,
            rlm_max_iterations=len(turns) + 5,
            root_stateful_session=stateful,
            rlm_multiturn_history=multiturn,
        )
        result = optimizer.compile(student=RouteTicket(), trainset=trainset, metric=metric, valset=valset)
    if len(result.agent_trajectory) != len(turns) or result.optimized_dspy_program["route"] != POLICY_PROMPT:
        raise SystemExit(f"the {'on' if stateful else 'off'} arm did not play the script")
    if any(r.status != 200 for r in server.requests):
        raise SystemExit(f"the server refused a request: {[r.status for r in server.requests]}")
    return server.requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--multiturn", action="store_true", help="rlm_multiturn_history=True in both arms")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    turns = scripted_turns(args.turns)
    off = run_arm(turns, stateful=False, multiturn=args.multiturn)
    on = run_arm(turns, stateful=True, multiturn=args.multiturn)

    print(
        f"\nInput tokens sent to the root LM per agent turn ({args.turns}-turn scripted run, "
        f"rlm_multiturn_history={args.multiturn}; tokens = characters / 4)"
    )
    print(f"{'turn':>4}  {'session off':>11}  {'session on':>10}")
    for turn, (a, b) in enumerate(zip(off, on, strict=True), start=1):
        print(f"{turn:>4}  {a.sent_tokens:>11,}  {b.sent_tokens:>10,}")
    total_off, total_on = sum(r.sent_tokens for r in off), sum(r.sent_tokens for r in on)
    print(f"{'sum':>4}  {total_off:>11,}  {total_on:>10,}")
    print(f"on / off: {total_on / total_off:.3f} (session on sends {total_off / total_on:.1f}x fewer input tokens)")
    later_off = [b.sent_tokens - a.sent_tokens for a, b in zip(off[1:], off[2:], strict=False)]
    later_on = [r.sent_tokens for r in on[1:]]
    print(
        f"turn k > 1: off grows by ~{sum(later_off) / len(later_off):,.0f} tokens per turn (sum ~ quadratic), "
        f"on stays at ~{sum(later_on) / len(later_on):,.0f} per turn (sum ~ linear)"
    )
    print(
        f"context the model reads (server-reported input, as OpenAI bills a chain): off {sum(r.context_tokens for r in off):,}, "
        f"on {sum(r.context_tokens for r in on):,}"
    )


if __name__ == "__main__":
    main()
