"""The smallest root context window a run works in, measured on the agent's own first request.

Part of every request to the root LM cannot be compacted away: the agent's instructions and tool list, dspy's
REPL rules, the task brief and the optimizer state (the *fixed part*). The bounded context
(:mod:`rlmoptimizer.agent.bounded_context`) fits the history into what the window leaves of it, so a window that does not
hold the fixed part, the reply kept free and the agent's last turn (compacted) cannot work: the root LM would
refuse the same request turn after turn. :func:`check_root_window` builds that first request as the agent sends it
(the real signature, tools and runtime rules; the brief and state of the program at hand) and refuses such a
window with :class:`~rlmoptimizer.errors.ConfigurationError` naming the smallest one that works, before any LM call.

Windows are counted as the bounded context counts them once it has learned a tokenizer of
:data:`TYPICAL_CHARS_PER_TOKEN` (English prose on common tokenizers): the first turns of a run, before the root LM
has reported a token count, assume fewer characters per token and compact harder, never refusing a request for
that. A tokenizer that packs fewer characters in a token needs a larger window than the one named.

May import what :mod:`rlmoptimizer.agent` may.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import dspy

from rlmoptimizer.agent._dspy import ChatAdapter, REPLHistory
from rlmoptimizer.agent.agent import OptimizerAgent
from rlmoptimizer.agent.bounded_context import (
    LEARNED_SHARE,
    BoundedContext,
    ContextBudget,
    context_window_of,
    smallest_window,
)
from rlmoptimizer.agent.pilot import describe
from rlmoptimizer.agent.policy import RunGepa
from rlmoptimizer.agent.prompts import TOOL_NAMES, agent_signature, budget_note, render_task_brief
from rlmoptimizer.agent.services import TurnSettings
from rlmoptimizer.agent.state import render_state_block
from rlmoptimizer.agent.tools import AgentTools
from rlmoptimizer.budget import budget_for, budget_for_metric_calls
from rlmoptimizer.errors import ConfigurationError
from rlmoptimizer.usage import dollars

__all__ = [
    "TYPICAL_CHARS_PER_TOKEN",
    "check_root_window",
    "first_request_chars",
    "first_request_messages",
    "unbound_tools",
]

TYPICAL_CHARS_PER_TOKEN = 4.0
"""Characters per token of English prose on common tokenizers (GPT-4o, Llama 3, Qwen 2.5 run about 4)."""

# The smallest program there is: what the constructor measures before it knows the user's.
_ONE_STEP = {"predict": ("question -> answer", "Given the fields `question`, produce the fields `answer`.")}


def unbound_tools() -> list[Callable]:
    """The agent's tools as a request shows them (their names, type hints and docstrings), bound to no compile."""
    unbound = object.__new__(AgentTools)
    try:
        return unbound.tool_functions()
    except AttributeError:  # a tool list that depends on a compile's state: the tools the instructions name
        return [getattr(unbound, name) for name in TOOL_NAMES if hasattr(AgentTools, name)]


def first_request_chars(
    config: Any, runtime_rules: str, steps: Mapping[str, tuple[str, str]], train_size: int, val_size: int, budget: int
) -> int:
    """Characters of the fixed part of the agent's first request (:func:`first_request_messages`)."""
    messages = first_request_messages(config, runtime_rules, steps, train_size, val_size, budget)
    return sum(len(str(message.get("content", ""))) for message in messages)


def first_request_messages(
    config: Any, runtime_rules: str, steps: Mapping[str, tuple[str, str]], train_size: int, val_size: int, budget: int
) -> list[dict[str, Any]]:
    """The fixed part of the agent's first request, as the messages dspy's adapter makes of it: the system message
    (instructions, tools, REPL rules) and the user message with the task brief, an empty history, the iteration and
    the optimizer state. ``config``: the optimizer's settings; ``runtime_rules``: what the sandbox tells the agent
    about itself (its ``execution_instructions``); ``steps``: ``{step name: (signature, instructions)}``."""

    def no_interpreter() -> Any:  # never called: only its runtime rules are read
        raise RuntimeError("measuring a request needs no interpreter")

    no_interpreter.execution_instructions = runtime_rules
    note = budget_note(train_size, val_size, config.max_iterations, config.max_metric_calls)
    agent = OptimizerAgent(
        agent_signature(budget, note),
        TurnSettings.of(config),
        tools=unbound_tools(),
        interpreter_factory=no_interpreter,
    )
    brief = render_task_brief(
        {name: signature for name, (signature, _) in steps.items()},
        train_size,
        val_size,
        budget,
        pass_threshold=config.pass_threshold,
    )
    variables_info = [variable.format() for variable in agent.variables(task_brief=brief)]
    baselines = [("train", train_size)] + ([("val", val_size)] if val_size else [])
    spending = (
        f"Spending: $0.0000 of max_cost_usd {dollars(config.max_cost_usd)}." if config.max_cost_usd is not None else ""
    )
    state = render_state_block(
        runs=[
            {"run_id": f"run-{i:04d}", "split": split, "label": "baseline", "score": 0.0, "evaluated_count": size}
            for i, (split, size) in enumerate(baselines, start=1)
        ],
        instructions={name: text for name, (_, text) in steps.items()},
        budget={"spent": 0, "limit": budget, "left": budget},
        spending=spending,
        loop=describe(RunGepa(budget)),
    )
    inputs = {
        "variables_info": variables_info,
        "repl_history": REPLHistory(),
        "iteration": f"{config.rlm_max_iterations}/{config.rlm_max_iterations}\n\n{state}",
    }
    adapter = dspy.settings.adapter or ChatAdapter()
    return adapter.format(agent.generate_action.signature, demos=[], inputs=inputs)


def check_root_window(
    config: Any,
    runtime_rules: str,
    program: Any = None,
    train_size: int | None = None,
    val_size: int = 0,
    budget: int | None = None,
) -> None:
    """Refuse a root context window that cannot hold the agent's requests (see the module docstring).

    Without ``program`` (the constructor) the smallest program is measured: a window refused then is too small
    for any; ``compile()`` measures again with its program, data and budget."""
    if getattr(config, "rlm_autopilot", None) == "loop":  # no request is ever sent to the root LM
        return
    if program is not None:
        steps = {name: (str(p.signature.signature), p.signature.instructions) for name, p in program.named_predictors()}
    else:
        steps = _ONE_STEP
    train_size = train_size if train_size is not None else 1
    if budget is None:  # its digits are all a request shows of it; a budget too small is refused elsewhere
        try:
            budget = (
                budget_for_metric_calls(config.max_metric_calls, train_size, val_size)
                if config.max_metric_calls
                else budget_for(config.max_iterations, train_size, val_size)
            )
        except ConfigurationError:
            budget = 1
    window, source = context_window_of(config.root_lm, config.root_context_window)
    fixed = first_request_chars(config, runtime_rules, steps, train_size, val_size, max(budget, 0))
    learned = LEARNED_SHARE * TYPICAL_CHARS_PER_TOKEN  # what the bounded context counts on for such a tokenizer
    budget_now = ContextBudget.for_window(config.root_lm, window, learned)
    history = BoundedContext(budget_now, max_output_chars=config.rlm_max_output_chars).least_history_chars()
    if budget_now.request_chars >= fixed + history:
        return
    smallest = smallest_window(config.root_lm, fixed + history, learned)
    reply = ContextBudget.for_window(config.root_lm, smallest).output_tokens
    given = (
        f"root_context_window={window}"
        if source == "root_context_window"
        else f"the root LM's context window ({window:,} tokens, from {source})"
    )
    scope = (
        " for this program and data"
        if program is not None
        else " (for the smallest program; compile() measures yours again)"
    )
    raise ConfigurationError(
        f"{given} is too small for the optimizer agent: the fixed part of each of its requests (its instructions "
        f"and tools, the task brief and the optimizer state) takes {fixed:,} characters, and its last turn, "
        f"compacted, {history:,} more. At {TYPICAL_CHARS_PER_TOKEN:g} characters per token (English prose on common "
        f"tokenizers), with {reply:,} tokens kept for the reply and the bounded context's margin, the smallest window "
        f"that works is {smallest:,} tokens{scope}. Pass root_context_window={smallest} (or more) with a root LM whose "
        "window holds it, or use a root LM with a larger window."
    )
