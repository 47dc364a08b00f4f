"""The ticket-routing task the offline demo (``example.py``) also uses: a two-step DSPy program that routes
support tickets to a queue, its data, its metric, a deterministic fake task LM that follows the company
policy only when the routing step's instructions state it, and the instructions that state it."""

from __future__ import annotations

import dspy

from rlmoptimizer.testing import last_user_text, system_text

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
