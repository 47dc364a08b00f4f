"""Every dspy name the agent wing uses that dspy does not export at its top level, checked at import.

The agent's modules (``agent.py``, ``root_lm.py``) import these names from here only; :data:`REQUIRED` lists
each private member of ``dspy.RLM`` we override or call, with its parameters, and the internal helpers the
root-LM calls use; :func:`rlmoptimizer.dspy_contract.check` verifies them before the imports below run.
"""

from __future__ import annotations

from rlmoptimizer.dspy_contract import Requirement, check

_RLM = "dspy.predict.rlm:RLM"

REQUIRED = (
    Requirement("dspy.predict.rlm", "_LLMCallBudget"),
    Requirement("dspy.predict.rlm:_LLMCallBudget", "reserve", params=("n",)),
    Requirement("dspy.predict.rlm", "_strip_code_fences", params=("code",)),
    Requirement("dspy.predict.rlm", "SUB_AGENT_INSTRUCTIONS"),
    Requirement("dspy.primitives.code_interpreter", "resolve_interpreter_factory"),
    Requirement(_RLM, "forward", params=("interpreter_factory", "input_args")),  # overridden
    Requirement(_RLM, "_make_llm_tools", params=("budget", "max_workers")),  # overridden
    Requirement(_RLM, "_setup_facade", params=("repl", "budget", "interpreter_factory")),  # overridden
    Requirement(_RLM, "_extract_fallback", params=("variables", "history", "output_field_names")),  # overridden
    Requirement(_RLM, "_process_final_output", params=("result", "output_field_names")),  # overridden
    Requirement(_RLM, "_validate_inputs", params=("input_args",)),
    Requirement(_RLM, "_prepare_execution_tools", params=("budget",)),
    Requirement(_RLM, "_build_variables", params=("input_args",)),
    Requirement(_RLM, "_interpreter_context", params=("execution_tools", "factory")),
    Requirement(_RLM, "_prepare_serializable_vars", params=("input_args", "repl")),
    Requirement(_RLM, "_action_signature_for_current_factory", params=("factory", "sub_agent_rules")),
    Requirement(_RLM, "_execute_code", params=("repl", "code", "input_args")),
    Requirement(_RLM, "_process_execution_result", params=("pred", "code", "result", "history", "output_field_names")),
    Requirement(_RLM, "_interpreter_factory", instance=True),
    Requirement("dspy.primitives.repl_types", "REPLHistory"),
    Requirement("dspy.primitives.repl_types:REPLHistory", "append", params=("reasoning", "code", "output")),
    Requirement("dspy.primitives.repl_types", "REPLEntry"),
    Requirement("dspy.primitives.repl_types:REPLEntry", "format_output", params=("output", "max_output_chars")),
    Requirement("dspy.clients.backend_selection", "CLIENT_KEYS"),
    Requirement("dspy.utils.exceptions", "format_error_for_lm", params=("error", "traceback_frames")),
)

check("agent", REQUIRED)

from dspy.clients.backend_selection import CLIENT_KEYS  # noqa: E402
from dspy.predict.rlm import SUB_AGENT_INSTRUCTIONS, _LLMCallBudget, _strip_code_fences  # noqa: E402
from dspy.primitives.code_interpreter import resolve_interpreter_factory  # noqa: E402
from dspy.primitives.repl_types import REPLEntry, REPLHistory  # noqa: E402
from dspy.utils.exceptions import format_error_for_lm  # noqa: E402

__all__ = [
    "CLIENT_KEYS",
    "REQUIRED",
    "REPLEntry",
    "REPLHistory",
    "SUB_AGENT_INSTRUCTIONS",
    "_LLMCallBudget",
    "_strip_code_fences",
    "format_error_for_lm",
    "resolve_interpreter_factory",
]
