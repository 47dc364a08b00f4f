"""Offline worked run of the default loop past GEPA: failures analysed by cause, a proposal written for the largest
group, demos from the program's own successes. No API key, no network, no sandbox (``rlm_autopilot="loop"`` runs
the loop in Python and never calls a root LM).

A one-step program routes support tickets to a queue. The fake task LM follows two policy rules only when the
instructions state them (chargebacks and bank disputes go to ``disputes``; unknown logins and breaches go to
``security``) and files a feature idea under ``feedback`` only when the ticket says "feature request" or when a
demo in its prompt shows it a feature idea: an instruction alone does not teach it that one, as with many small
models. The fake sub-LM writes instructions that state the rules the failures it is shown reveal, names a cause per
failure and merges the causes into groups.

    python examples/analysis_and_demos.py

docs/analysis-and-demos.md walks through what it prints.
"""

from __future__ import annotations

import json
import os
import re
import tempfile

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("DSPY_CACHEDIR", os.path.join(tempfile.gettempdir(), "rlmoptimizer-example-cache"))

import dspy  # noqa: E402

from rlmoptimizer import RLMDocstringOptimizer  # noqa: E402
from rlmoptimizer.testing import FunctionLM, last_user_text, system_text  # noqa: E402

TICKETS = [
    ("I was charged twice for my subscription this month.", "billing"),
    ("The app crashes when I open the settings page.", "technical"),
    ("My bank says I have a chargeback pending on my invoice.", "disputes"),
    ("Someone logged into my account from another country.", "security"),
    ("Feature request: a dark mode for the editor.", "feedback"),
    ("It would be great if the dashboard could show weekly totals.", "feedback"),
    ("The invoice amount is wrong, please refund the difference.", "billing"),
    ("I filed a dispute with my bank about the last payment.", "disputes"),
    ("A login from an unknown device changed my billing email.", "security"),
    ("Please add an export to PDF, the editor needs it.", "feedback"),
    ("Sync fails with error 500 since yesterday.", "technical"),
    ("The payment was reversed by my card issuer as a chargeback.", "disputes"),
    ("Was my account breached? I got a password reset I never asked for.", "security"),
    ("Feature request: keyboard shortcuts in the app.", "feedback"),
    ("It would be great if invoices listed the seat count.", "feedback"),
    ("Why did my plan price go up?", "billing"),
    ("My bank opened a dispute on your charge.", "disputes"),
    ("There was a login I did not make and a charge I do not know.", "security"),
    ("Please add dark mode to the dashboard, the app is too bright.", "feedback"),
    ("It would be great if sync ran every hour.", "feedback"),
    ("Uploads fail with an error for files over 10 MB.", "technical"),
    ("A chargeback was opened on my invoice by the bank.", "disputes"),
    ("Someone logged into my account and changed the password.", "security"),
    ("Please add a calendar view to the app.", "feedback"),
]
TOPIC_WORDS = {
    "billing": ("charge", "invoice", "refund", "billing", "price", "payment"),
    "technical": ("crash", "error", "fails", "sync", "editor", "dashboard", "app"),
}
RULES = {  # what an instruction must say for the task LM to follow it, and the tickets it applies to
    "disputes": ("Any chargeback or bank dispute goes to disputes.", ("chargeback", "dispute")),
    "security": ("Any unknown login, breach or password reset nobody asked for goes to security.", ("login", "breach")),
}
FEATURE_IDEA = ("would be great", "please add")
CAUSES = {
    "disputes": "Chargebacks and bank disputes belong to disputes, not billing.",
    "security": "An unknown login or a breach belongs to security, whatever else the ticket mentions.",
    "feedback": "A feature idea belongs to feedback even when it names a part of the product.",
}


def make_splits() -> tuple[list[dspy.Example], list[dspy.Example]]:
    examples = [dspy.Example(ticket=t, queue=q).with_inputs("ticket") for t, q in TICKETS]
    return examples[:16], examples[16:]


def metric(example, prediction, trace=None, pred_name=None, pred_trace=None):
    produced = (prediction.queue or "").strip().lower()
    right = produced == example.queue
    return dspy.Prediction(
        score=float(right), feedback="right" if right else f"expected {example.queue}, got {produced}"
    )


def task_lm_reply(messages):
    """Follows a policy rule only when the instructions state it; files a feature idea under feedback when the
    ticket says so or when an earlier message (a demo) shows a feature idea filed there."""
    instructions = system_text(messages).lower()
    ticket = last_user_text(messages).split("[[ ## ticket ## ]]", 1)[1].split("Respond with", 1)[0].strip().lower()
    demos = " ".join(str(m.get("content")) for m in messages[1:-1]).lower()
    for queue, (rule, words) in RULES.items():
        if rule.lower() in instructions and any(w in ticket for w in words):
            return {"queue": queue}
    if "feature request" in ticket:
        return {"queue": "feedback"}
    if any(w in ticket for w in FEATURE_IDEA) and "feedback" in demos:
        return {"queue": "feedback"}
    for queue, words in TOPIC_WORDS.items():
        if any(w in ticket for w in words):
            return {"queue": queue}
    return {"queue": "technical"}


def sub_lm_reply(messages):
    """The sub-LM: causes for an analysis' prompt, groups for its merge, instructions for a proposal (the rules the
    examples and guidance it is shown reveal, added to the current ones)."""
    text = last_user_text(messages)
    if "[[ ## failures ## ]]" in text:  # name a cause per failure, from what it expected
        blocks = re.split(r"(?=\[failure \d+\])", text.split("[[ ## failures ## ]]", 1)[1])
        causes = []
        for block in blocks:
            head = re.match(r"\[failure (\d+)\]", block)
            expected = re.search(r'expected: \{"queue": "(\w[\w-]*)"\}', block)
            if head and expected:
                cause = CAUSES.get(expected.group(1), f"The ticket belongs to {expected.group(1)}.")
                causes.append({"failure_id": int(head.group(1)), "cause": cause})
        return {"causes": causes}
    if "[[ ## causes ## ]]" in text:  # merge the causes: one group per distinct cause
        by_cause: dict[str, list[int]] = {}
        for i, cause in re.findall(r"^(\d+): (.+)$", text.split("[[ ## causes ## ]]", 1)[1], re.M):
            by_cause.setdefault(cause.strip(), []).append(int(i))
        names = {cause: f"{queue} tickets" for queue, cause in CAUSES.items()}
        groups = [{"name": names.get(c, c[:30]), "cause": c, "failure_ids": ids} for c, ids in by_cause.items()]
        return {"groups": sorted(groups, key=lambda g: -len(g["failure_ids"]))}
    shown = text.lower()
    rules = [
        rule for queue, (rule, _) in RULES.items() if f"expected {queue}" in shown or CAUSES[queue].lower() in shown
    ]
    if "feedback" in shown:
        rules.append("A feature idea goes to feedback.")
    keep = [rule for rule, _ in RULES.values() if rule.lower() in shown and rule not in rules]
    instruction = " ".join(
        ["Route the ticket to one queue: billing, technical, disputes, security or feedback.", *keep, *rules]
    )
    return json.dumps({"new_instruction": instruction})


class Route(dspy.Module):
    def __init__(self):
        super().__init__()
        self.route = dspy.Predict("ticket -> queue")

    def forward(self, ticket):
        return self.route(ticket=ticket)


def main() -> None:
    trainset, valset = make_splits()
    optimizer = RLMDocstringOptimizer(
        rlm_autopilot="loop",  # the default loop in Python: no root LM, no sandbox
        sub_lm=FunctionLM(sub_lm_reply, name="fake-sub-lm"),
        eval_lm=FunctionLM(task_lm_reply, name="fake-task-lm"),
        max_metric_calls=160,
        num_threads=4,
    )
    optimized = optimizer.compile(Route(), trainset=trainset, valset=valset, metric=metric)

    print("The loop's actions, phase by phase:")
    for turn in optimized.agent_trajectory:
        for call in turn["pilot"]:
            print(f"  {call}")
    print()
    analysis_dir = optimized.run_storage_dir
    with open(os.path.join(analysis_dir, "analyses.json")) as f:
        first = json.load(f)["analyses"][0]
    print(f"{first['analysis_id']}: {len(first['groups'])} group(s) of the failures GEPA's best left on train")
    for group in first["groups"]:
        print(f"  {group['name']} ({len(group['example_ids'])}: train {group['example_ids']}): {group['cause']}")
    print()
    results = optimized.detailed_results
    for candidate, lineage in results.lineage.items():
        if lineage.get("made_for"):
            made_for = lineage["made_for"]
            text = results.instructions_of(candidate)["route"]
            print(f"{candidate}, written for group {made_for['group']!r} of {made_for['analysis']}: {text!r}")
    print()
    print(f"demos of the returned program, from train examples {optimized.demo_sources['route']}:")
    for demo in optimized.route.demos:
        print(f"  {demo.ticket!r} -> {demo.queue}")
    selection = optimized.selection
    print()
    print(f"validation: {selection['baseline_score']:.2f} unchanged -> {selection['chosen_score']:.2f} returned")
    print(f"returned instructions: {optimized.route.signature.instructions!r}")
    print(f"metric calls: {optimized.budget['spent']} of {optimized.budget['limit']}")


if __name__ == "__main__":
    main()
