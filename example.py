"""Offline demo of rlmoptimizer: no API keys, no network beyond the first sandbox start.

A real two-step DSPy program routes support tickets to a queue. The task LM is a deterministic fake that
follows the company policy only when the routing step's instructions state it; the root agent is scripted,
but it works through the real sandbox and the real tools: it reads the baseline failures, runs GEPA (the gepa
package's engine, inside the agent's REPL: its reflection LM is the offline sub-LM, which answers with the
policy the failures reveal), adopts GEPA's best, looks at what it still fails, checks validation and submits:
the default loop the agent instructions give.

    python example.py
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("DSPY_CACHEDIR", os.path.join(tempfile.gettempdir(), "rlmoptimizer-example-cache"))

import json  # noqa: E402

import dspy  # noqa: E402

from rlmoptimizer import RLMDocstringOptimizer  # noqa: E402
from rlmoptimizer.report.plot import picture_unavailable  # noqa: E402
from rlmoptimizer.testing import FunctionLM, ScriptedLM, last_user_text, system_text  # noqa: E402

# -- the task -------------------------------------------------------------------------------------------
# (ticket, queue). Policy: any mention of a chargeback or a bank dispute goes to "disputes", and anything
# about a security/login breach goes to "security", even when the ticket reads like billing or tech.
TICKETS = [
    ("I was charged twice for my subscription this month.", "billing"),
    ("The app crashes when I open the settings page.", "technical"),
    ("How do I export my data to CSV?", "how-to"),
    ("My bank says I have a chargeback pending on my invoice.", "disputes"),
    ("Someone logged into my account from another country.", "security"),
    ("The invoice amount is wrong, please refund the difference.", "billing"),
    ("Sync fails with error 500 since yesterday.", "technical"),
    ("Where can I change my notification settings?", "how-to"),
    ("I filed a dispute with my bank about the last payment.", "disputes"),
    ("I got a password reset email I never asked for, was my account breached?", "security"),
    ("Please cancel the extra seat you billed me for.", "billing"),
    ("The dashboard shows a blank page in Firefox.", "technical"),
    ("How do I invite a teammate?", "how-to"),
    ("The payment was reversed by my card issuer as a chargeback, what now?", "disputes"),
    ("My login was used to change the billing email without me.", "security"),
    ("Why did my plan price go up?", "billing"),
    ("Uploads time out for files over 10 MB.", "technical"),
    ("Can I use keyboard shortcuts in the editor?", "how-to"),
    ("My bank opened a dispute on your charge, and the app also crashes.", "disputes"),
    ("There was a login from an unknown device and a charge I did not make.", "security"),
]
TOPIC_WORDS = {
    "billing": ("charge", "invoice", "refund", "billed", "price", "payment", "bill"),
    "technical": ("crash", "error", "fails", "blank", "time out", "bug"),
    "security": ("logged into", "login", "breach", "password"),
    "how-to": ("how do i", "where can i", "can i"),
}
POLICY_WORDS = {"disputes": ("chargeback", "dispute"), "security": ("breach", "login", "logged into", "unknown device")}


def make_splits():
    examples = [dspy.Example(ticket=t, queue=q).with_inputs("ticket") for t, q in TICKETS]
    return examples[:12], examples[12:]


class RouteTicket(dspy.Module):
    """Two steps: summarize the ticket, then pick a queue from the summary."""

    def __init__(self):
        super().__init__()
        self.summarize = dspy.ChainOfThought("ticket -> summary")
        self.route = dspy.Predict("summary -> queue")

    def forward(self, ticket):
        summary = self.summarize(ticket=ticket).summary
        return self.route(summary=summary)


def metric(example, prediction, trace=None):
    return float(example.queue == (prediction.queue or "").strip().lower())


# -- a deterministic fake task LM -----------------------------------------------------------------------
def task_lm_reply(messages):
    """Summaries copy the ticket; routing follows the surface topic unless the instructions state the policy."""
    system, user = system_text(messages).lower(), last_user_text(messages)
    if "summary" in system and "[[ ## ticket ## ]]" in user:
        ticket = user.split("[[ ## ticket ## ]]", 1)[1].split("Respond with", 1)[0].strip()
        return {"reasoning": "Restate the ticket.", "summary": ticket}
    summary = user.split("[[ ## summary ## ]]", 1)[1].split("Respond with", 1)[0].strip().lower()
    if "chargeback" in system:  # the instructions state the disputes policy
        if any(w in summary for w in POLICY_WORDS["disputes"]):
            return {"queue": "disputes"}
    if "security" in system and "login" in system:  # the instructions state the security policy
        if any(w in summary for w in POLICY_WORDS["security"]):
            return {"queue": "security"}
    for queue, words in TOPIC_WORDS.items():
        if any(w in summary for w in words):
            return {"queue": queue}
    return {"queue": "how-to"}


# -- a scripted root agent --------------------------------------------------------------------------------
POLICY_PROMPT = (
    "Given the ticket summary, answer with exactly one queue: billing, technical, how-to, disputes or security. "
    "Policy overrides the surface topic: any chargeback or bank dispute goes to disputes; any unknown login, "
    "account breach or suspicious password reset goes to security."
)


def proposal_reply(messages):
    """The offline sub-LM: answers dspy's instruction proposal (a JSON object; GEPA's reflection inside
    ``run_gepa`` is one, as in dspy.GEPA) with the policy the failures reveal."""
    return json.dumps({"new_instruction": POLICY_PROMPT})


AGENT_TURNS = [
    {
        "reasoning": "Read the baseline failures first and group them by the step that produced the answer.",
        "code": (
            "from collections import Counter\n"
            "fails = [e for e in baseline_train['examples'] if not e['passed']]\n"
            "print('baseline score', baseline_train['score'], 'failures', len(fails))\n"
            "print(Counter((e['expected']['queue'], e['predicted'].get('queue')) for e in fails))\n"
            "for e in fails[:4]:\n"
            "    print(e['example_id'], '|', e['inputs']['ticket'], '->', e['steps'][-1]['outputs'])\n"
            "print(add_note(f'{len(fails)} baseline failures, all decided by the route step'))"
        ),
    },
    {
        "reasoning": "Every failure is decided by the route step. Run GEPA with most of the budget.",
        "code": "r = run_gepa(budget=40)\nprint(r['summary'])",
    },
    {
        "reasoning": "GEPA found a better candidate: keep it, and see where it came from.",
        "code": (
            "print(adopt_candidate(r['best']))\n"
            "row = [c for c in candidates()['candidates'] if r['best'] in c['ids']][0]\n"
            "print(r['best'], 'lineage:', row['lineage'][r['best']])"
        ),
    },
    {
        "reasoning": "What does the best still fail on train? Then check validation (free: GEPA scored it there).",
        "code": (
            "print('still failing under the best:', hard_examples()['failing_under_best'])\n"
            "val = evaluate_program(split='val')\nprint('val', val['score'], 'baseline val', baseline_val['score'])"
        ),
    },
    {
        "reasoning": "Validation improved; submit the current instructions.",
        "code": "SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])",
    },
]


def main() -> None:
    started = time.perf_counter()
    trainset, valset = make_splits()
    task_lm = FunctionLM(task_lm_reply, name="fake-task-lm")
    root_lm = ScriptedLM(AGENT_TURNS, name="scripted-root-agent")
    sub_lm = FunctionLM(proposal_reply, name="fake-sub-lm")
    program = RouteTicket()

    optimizer = RLMDocstringOptimizer(max_iterations=3, root_lm=root_lm, sub_lm=sub_lm, eval_lm=task_lm, verbose=True)
    optimized = optimizer.compile(student=program, trainset=trainset, metric=metric, valset=valset)

    selection = optimized.selection
    print()
    print(f"baseline {selection['split']} score: {selection['baseline_score']:.2f}")
    print(f"final    {selection['split']} score: {selection['chosen_score']:.2f}  ({selection['reason']})")
    before = {name: p.signature.instructions for name, p in program.named_predictors()}
    for step, text in optimized.optimized_dspy_program.items():
        if text != before[step]:
            print(f"changed prompt of {step!r}:\n  before: {before[step]!r}\n  after:  {text!r}")
    print(f"budget: {optimized.budget['spent']} of {optimized.budget['limit']} units spent")
    print(f"agent turns: {len(optimized.agent_trajectory)}; runs: {[t['run_id'] for t in optimized.trial_logs]}")
    picture = Path(optimized.run_storage_dir) / "run.png"
    print(
        f"picture of the run: {picture} (python -m rlmoptimizer report DIR prints a summary)"
        if picture.exists()
        else f"no picture of the run: {picture_unavailable() or 'see the warning above'}"
    )
    print(f"finished in {time.perf_counter() - started:.1f} s")
    if re.search("disputes", optimized.optimized_dspy_program["route"]) is None:
        raise SystemExit("the demo did not apply the policy prompt")


if __name__ == "__main__":
    main()
