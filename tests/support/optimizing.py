"""The optimizer on the ticket task as most tests run it: the scripted agent turns they play, one builder for the
optimizer and one for a whole ``compile()``, the sub-LM that answers dspy's instruction proposer, and LMs that
fail or stop on cue.

Defaults (``max_iterations=2``, ``num_threads=4``, the fake task LM as ``eval_lm``, the ticket splits and metric)
are what a test does not care about; a test passes what it does care about.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import dspy

from rlmoptimizer import RLMDocstringOptimizer
from rlmoptimizer.testing import FunctionLM, last_user_text, scripted_agent, system_text
from support.processes import reached
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, metric, task_lm_reply

ORIGINAL_ROUTE = RouteTicket().route.signature.instructions

SUBMIT_POLICY = {"reasoning": "submit", "code": f"SUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})"}
SUBMIT_LINE = "SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"
SUBMIT_CURRENT = {"reasoning": "submit", "code": SUBMIT_LINE}
FIX_AND_SUBMIT = {
    "reasoning": "state the policy and submit",
    "code": f"update_prompt('route', {POLICY_PROMPT!r})\nSUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})",
}
# Four turns: look, state the policy and re-run the failures (2 train examples), check on validation, submit.
TURNS = [
    {"reasoning": "look", "code": "print(baseline_train['score'])"},
    {
        "reasoning": "fix",
        "code": f"update_prompt('route', {POLICY_PROMPT!r})\n"
        "r = evaluate_program(failed_from_run=baseline_train['run_id'])\n"
        "print('rerun', r['evaluated_count'], r['budget_spent'])",
    },
    {"reasoning": "validate", "code": "v = evaluate_program(split='val')\nprint('val <b>', float(v['score']))"},
    SUBMIT_POLICY,
]

NEXT_LINE = re.compile(r"^Next line: (.+)$", re.MULTILINE)
"""The line the optimizer state suggests at the end of every turn (the call that takes the default loop's next
step)."""

_DEFAULT: Any = object()


def optimizer(root: dspy.BaseLM | list, *, eval_lm: Any = _DEFAULT, **kwargs: Any) -> RLMDocstringOptimizer:
    """An optimizer whose root LM is ``root`` (an LM, or a list of turns for :func:`scripted_agent`); ``eval_lm``
    defaults to a new fake task LM (pass ``None`` for none), the budget to ``max_iterations=2`` unless
    ``max_metric_calls`` is given, ``rlm_autopilot`` to ``"off"``."""
    if "max_metric_calls" not in kwargs:
        kwargs.setdefault("max_iterations", 2)
    kwargs.setdefault("num_threads", 4)
    # Scripted turns are an agent that decides every turn: the pilot stays out unless a test is about it.
    kwargs.setdefault("rlm_autopilot", "off")
    root_lm = scripted_agent(root) if isinstance(root, list) else root
    if isinstance(root, list) and not root:  # no agent turn: the sub LM (else the root LM) proposes nothing new
        kwargs.setdefault("sub_lm", proposer(ORIGINAL_ROUTE, name="no-news"))
    return RLMDocstringOptimizer(
        root_lm=root_lm, eval_lm=FunctionLM(task_lm_reply) if eval_lm is _DEFAULT else eval_lm, **kwargs
    )


def compile_tickets(
    root: dspy.BaseLM | list,
    *,
    student: dspy.Module | None = None,
    trainset: Any = _DEFAULT,
    valset: Any = _DEFAULT,
    metric: Any = metric,
    **kwargs: Any,
) -> dspy.Module:
    """``optimizer(root, **kwargs).compile(...)`` on the ticket task (``valset=None``: no validation split)."""
    train, val = make_splits()
    return optimizer(root, **kwargs).compile(
        student=student if student is not None else RouteTicket(),
        trainset=train if trainset is _DEFAULT else trainset,
        valset=val if valset is _DEFAULT else valset,
        metric=metric,
    )


def copier(seen: list[str]) -> FunctionLM:
    """A root LM that runs, every turn, exactly the line the optimizer state suggests (what a small model that
    cannot plan does at best), and records in ``seen`` the lines it was shown."""

    def reply(messages):
        lines = NEXT_LINE.findall(last_user_text(messages))
        assert lines, "every turn's state block names the next line"
        seen.append(lines[-1])
        return {"reasoning": "follow the default loop", "code": lines[-1]}

    return FunctionLM(reply, name="copier")


def compile_in(directory: Any, root: dspy.BaseLM | list, eval_lm: Any, **kwargs: Any) -> dspy.Module:
    """:func:`compile_tickets` into the run directory ``directory`` with the evaluation LM ``eval_lm``."""
    return compile_tickets(root, eval_lm=eval_lm, run_storage_dir=directory, **kwargs)


def outputs(result: Any) -> list[str]:
    """What each agent turn printed."""
    return [turn["output"] for turn in result.agent_trajectory]


def proposer(*texts: str, name: str = "proposer") -> FunctionLM:
    """The sub-LM answering dspy's instruction proposer (JSON; ``run_gepa`` reflects through it too, as dspy.GEPA
    does): ``texts`` in order, then the last one again."""
    texts = texts or (POLICY_PROMPT,)
    answered = []
    lock = threading.Lock()

    def reply(messages):
        with lock:
            answered.append(1)
            text = texts[min(len(answered), len(texts)) - 1]
        return json.dumps({"new_instruction": text})

    return FunctionLM(reply, name=name)


def loop_optimizer(directory: Any, **kwargs: Any) -> RLMDocstringOptimizer:
    """The default loop with no agent on the ticket task, into the run directory ``directory``: the ticket metric,
    ``max_metric_calls=40``, the policy's proposer as the sub LM and a new fake task LM (``kwargs`` add or replace)."""
    settings = {
        "rlm_autopilot": "loop",
        "max_metric_calls": 40,
        "sub_lm": proposer(POLICY_PROMPT),
        "eval_lm": FunctionLM(task_lm_reply),
        "run_storage_dir": directory,
        **kwargs,
    }
    return RLMDocstringOptimizer(metric, **settings)


def steps_seen(messages: list[dict]) -> int:
    """How many REPL steps the root LM's request shows (what ``scripted_agent`` counts its turns by)."""
    return sum(str(m.get("content", "")).count("=== Step ") for m in messages if m.get("role") == "user")


def dies_after(turns_played: int, error: Exception, turns: list = TURNS) -> FunctionLM:
    """A root LM that plays ``turns`` and raises ``error`` once ``turns_played`` of them were played."""

    def reply(messages):
        seen = steps_seen(messages)
        if seen >= turns_played:
            raise error
        return turns[seen]

    return FunctionLM(reply)


def stops_in_validation(marker: str, after: int = 4) -> FunctionLM:
    """The fake task LM, for a script to be killed: once the agent's validation run (the route step under the
    policy, on a validation ticket) has recorded ``after`` examples, the next call creates ``marker`` and blocks
    for good (:func:`support.processes.reached`). Run it with ``num_threads=1``: examples go in order."""
    val_tickets = [example.ticket for example in make_splits()[1]]
    routed: list[str] = []
    lock = threading.Lock()

    def reply(messages):
        user = last_user_text(messages)
        if "Policy overrides" in system_text(messages) and "[[ ## summary ## ]]" in user:
            if any(ticket in user for ticket in val_tickets):
                with lock:
                    routed.append(user)
                    count = len(routed)
                if count > after:
                    reached(marker)
        return task_lm_reply(messages)

    return FunctionLM(reply)


def killed_in_validation_script(directory: str, marker: str, after: int = 4) -> str:
    """A script running :data:`TURNS` into ``directory`` that stops in the agent's validation run with ``after``
    records in its in-flight log, and says so by creating ``marker`` (see :mod:`support.processes`)."""
    return (
        "from support.optimizing import TURNS, compile_tickets, stops_in_validation\n"
        f"compile_tickets(TURNS, eval_lm=stops_in_validation({marker!r}, after={after}), num_threads=1,\n"
        f"                run_storage_dir={directory!r})\n"
    )
