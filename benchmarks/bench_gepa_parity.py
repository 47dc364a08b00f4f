"""GEPA's search inside rlmoptimizer and in dspy.GEPA: what each gets out of the same budget of metric calls.

Offline and deterministic: the real-models benchmark's ticket-routing task (``real_models/tasks/ticket_routing.py``,
the first 20 train and 20 validation tickets) optimized by ``dspy.GEPA(max_metric_calls=B)`` and by
``RLMDocstringOptimizer(max_metric_calls=B, rlm_autopilot="loop")`` (gepa's engine run through rlmoptimizer's own
adapter), both with the same fake LMs:

* the task LM follows a routing rule only when the instruction names that rule's keyword (else it answers
  ``billing_escalations``), so an instruction gains tickets rule by rule;
* the reflection LM reads the failures GEPA shows it and adds the rule of each to the instruction (the expected
  queue's rationale is in the metric's feedback).

Variants (``--variants``): ``clean``; ``unp``, a quarter of (ticket, instruction) pairs answered in prose that does
not parse; ``noisy``, half of the reflections junk ("Certainly! Please provide..."); ``hard``, the reflection states
the rules only 20% of the time and else rewords the instruction without changing any answer; ``hardunp``, both
``hard`` and ``unp``. Per variant and seed (GEPA's ``seed``, rlmoptimizer's ``attempt``) it runs dspy.GEPA at B,
rlmoptimizer at B, then rlmoptimizer again at dspy.GEPA's actual spend (the mean over the seeds of its counted
metric calls), and prints per system, summed over the seeds: metric calls spent (program runs, counted as the
task LM's calls: a run whose output does not parse is paid too), children proposed (child minibatch evaluations),
children accepted, iterations, accepted per child, the mean of GEPA's best validation score, and ours / dspy.

    python benchmarks/bench_gepa_parity.py [--seeds 0-9] [--variants hard,hardunp] [--budget 80]

About a minute with the defaults (60 runs) on a loaded 2-core machine. Needs a checkout (it imports the task).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import random
import re
import statistics
import sys
import tempfile
import threading
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("DSPY_CACHEDIR", tempfile.mkdtemp(prefix="rlmopt-bench-gepa-parity-"))
_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))

import dspy  # noqa: E402
import gepa  # noqa: E402

from rlmoptimizer import RLMDocstringOptimizer  # noqa: E402
from rlmoptimizer.testing import FunctionLM, last_user_text, system_text  # noqa: E402


def load_task():
    path = Path(__file__).resolve().parent / "real_models" / "tasks" / "ticket_routing.py"
    spec = importlib.util.spec_from_file_location("bench_task_ticket_routing", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


T = load_task()
VARIANTS = {  # name: (unparsable, noisy, hard)
    "clean": (False, False, False),
    "unp": (True, False, False),
    "noisy": (False, True, False),
    "hard": (False, False, True),
    "hardunp": (True, False, True),
}
# The keyword an instruction must contain for the task LM to follow a rule (None: always followed), its queue, and
# the sentence the reflection LM adds for it.
RULES = {
    "2fa": ("two-factor", "security", "Anything about two-factor authentication goes to security."),
    "unauthorized_access": ("unauthorized", "security", "Possible unauthorized access goes to security."),
    "leaked_credentials": ("exposed", "security", "An exposed password, key or token goes to security."),
    "phishing": ("phishing", "security", "A phishing attempt goes to security."),
    "chargeback": (None, "billing_escalations", "A chargeback or payment dispute goes to billing_escalations."),
    "cancel_intent": ("cancel", "retention", "A wish to cancel, downgrade or leave goes to retention."),
    "routine_billing": ("routine billing", "customer_care", "A routine billing request goes to customer_care."),
    "routine": ("bug report", "customer_care", "A product question or bug report goes to customer_care."),
    "password_reset": (
        "ordinary login",
        "customer_care",
        "An ordinary login or password problem goes to customer_care.",
    ),
}
RULE_OF_WHY = {why: rule for rule, why in T.RATIONALES.items()}


def make_lms(variant: str, seed: int) -> tuple[FunctionLM, FunctionLM]:
    unparsable, noisy, hard = VARIANTS[variant]
    rng, lock = random.Random(1000 + seed), threading.Lock()

    def task_reply(messages):
        instruction = system_text(messages).split("your objective is:", 1)[-1].lower()
        ticket = last_user_text(messages).split("[[ ## ticket ## ]]", 1)[1].split("Respond with", 1)[0].strip()
        key, queue, _ = RULES[T._RULE_BY_TICKET[ticket]]
        answer = queue if key is None or key in instruction else "billing_escalations"
        digest = int(hashlib.sha256(f"{ticket}|{instruction}".encode()).hexdigest()[:8], 16)
        if unparsable and digest % 4 == 0:
            return f"I think this goes to {answer} because of the ticket."
        return {"reasoning": "Rule check for this ticket.", "queue": answer}

    def reflect_reply(messages):
        user = last_user_text(messages)
        with lock:
            junk = noisy and rng.random() < 0.5
            lucky = not hard or rng.random() < 0.2
        if junk:
            return "Certainly! Please provide the new instruction you would like me to write."
        current = user.split("[[ ## current_instruction ## ]]", 1)[1].split("[[ ## examples_with_feedback ## ]]")[0]
        new = current.strip()
        if not lucky:  # a rewording that changes no answer
            return json.dumps({"new_instruction": f"{new} Be careful ({len(refl_lm.calls)})."})
        for why in re.findall(r"expected \w+ \(([^)]*)\)", user):
            sentence = RULES[RULE_OF_WHY[why]][2] if why in RULE_OF_WHY else None
            if sentence and sentence not in new:
                new += " " + sentence
        return json.dumps({"new_instruction": new})

    refl_lm = FunctionLM(reflect_reply, name="reflection")
    return FunctionLM(task_reply, name="task"), refl_lm


class Watch:
    """A gepa callback that counts what the engine did, in every gepa.optimize call it is added to."""

    def __init__(self) -> None:
        self.iterations = self.children = self.accepted = self.gepa_calls = 0
        self.best = 0.0

    def on_iteration_start(self, event) -> None:
        self.iterations += 1

    def on_evaluation_start(self, event) -> None:
        self.children += event["candidate_idx"] is None  # a child's minibatch evaluation

    def on_candidate_accepted(self, event) -> None:
        self.accepted += 1

    def on_valset_evaluated(self, event) -> None:  # the seed and each accepted child (also in a run cut short)
        self.best = max(self.best, event["average_score"])

    def on_optimization_end(self, event) -> None:
        self.gepa_calls += event["total_metric_calls"]


def run(system: str, variant: str, seed: int, budget: int, train, val) -> dict:
    task_lm, refl_lm = make_lms(variant, seed)
    watch, optimize = Watch(), gepa.optimize

    def watched(*args, **kwargs):
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), watch]
        return optimize(*args, **kwargs)

    gepa.optimize = watched  # dspy.GEPA and rlmoptimizer both call gepa.optimize at run time
    try:
        # muted: dspy's progress bars (on stdout) and the parse errors it logs for unparsable answers
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
            if system == "dspy":
                with dspy.context(lm=task_lm):
                    optimizer = dspy.GEPA(
                        metric=T.metric, max_metric_calls=budget, reflection_lm=refl_lm, num_threads=2, seed=seed
                    )
                    optimizer.compile(T.make_program(), trainset=train, valset=val)
            else:
                with tempfile.TemporaryDirectory(prefix="gepa-parity-") as folder:
                    optimizer = RLMDocstringOptimizer(
                        max_metric_calls=budget, sub_lm=refl_lm, eval_lm=task_lm, num_threads=2,
                        rlm_autopilot="loop", attempt=seed, run_storage_dir=folder,
                    )  # fmt: skip
                    optimizer.compile(student=T.make_program(), trainset=train, metric=T.metric, valset=val)
    finally:
        gepa.optimize = optimize
    if system == "dspy" and watch.gepa_calls != len(task_lm.calls):
        print(f"warning: dspy.GEPA counted {watch.gepa_calls} metric calls, the task LM {len(task_lm.calls)}")
    return {"spent": len(task_lm.calls), "children": watch.children, "accepted": watch.accepted,
            "iterations": watch.iterations, "best": watch.best}  # fmt: skip


def seed_list(text: str) -> list[int]:
    seeds: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        seeds += range(int(low), int(high or low) + 1)
    return list(dict.fromkeys(seeds))


def table(variant: str, seeds: list[int], rows: list[tuple[str, int, list[dict]]]) -> None:
    print(f"\nvariant {variant}, seeds {','.join(map(str, seeds))}: totals over the seeds; best val = mean")
    head = f"{'system':<10} {'B':>4} {'spent':>6} {'per seed':>9} {'children':>9} {'accepted':>9} {'iterations':>11}"
    print(f"{head} {'acc/child':>10} {'best val':>9}")
    totals = {}
    for name, budget, results in rows:
        t = {k: sum(r[k] for r in results) for k in ("spent", "children", "accepted", "iterations")}
        t["acc/child"] = t["accepted"] / t["children"] if t["children"] else 0.0
        t["best"] = statistics.mean(r["best"] for r in results)
        spends = [r["spent"] for r in results]
        totals[name, budget] = t
        print(
            f"{name:<10} {budget:>4} {t['spent']:>6} {f'{min(spends)}-{max(spends)}':>9} {t['children']:>9} "
            f"{t['accepted']:>9} {t['iterations']:>11} {t['acc/child']:>10.3f} {t['best']:>9.3f}"
        )
    dspy_row = totals[rows[0][0], rows[0][1]]
    for name, budget, _ in rows[1:]:
        r = {k: v / dspy_row[k] if dspy_row[k] else float("nan") for k, v in totals[name, budget].items()}
        print(
            f"{'ours/dspy':<10} {budget:>4} {r['spent']:>6.2f} {'':>9} {r['children']:>9.2f} {r['accepted']:>9.2f} "
            f"{r['iterations']:>11.2f} {r['acc/child']:>10.2f} {r['best']:>9.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-9", help="seeds, e.g. 0-9 or 0,3,7 (default 0-9)")
    parser.add_argument("--variants", default="hard,hardunp", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--budget", type=int, default=80, help="max_metric_calls B (default 80)")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := [v for v in variants if v not in VARIANTS]:
        parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    seeds = seed_list(args.seeds)
    logging.disable(logging.CRITICAL)
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    train, val, _ = T.load()
    train, val = train[:20], val[:20]

    for variant in variants:
        rows = []
        for system in ("dspy", "ours"):
            results = [run(system, variant, seed, args.budget, train, val) for seed in seeds]
            rows.append((system, args.budget, results))
            print(f"  {variant} {system} B={args.budget}: spent {[r['spent'] for r in results]}", file=sys.stderr)
        matched = round(statistics.mean(r["spent"] for r in rows[0][2]))
        results = [run("ours", variant, seed, matched, train, val) for seed in seeds]
        rows.append(("ours", matched, results))
        table(variant, seeds, rows)


if __name__ == "__main__":
    main()
