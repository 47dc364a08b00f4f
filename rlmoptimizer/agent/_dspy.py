"""Every dspy name the agent wing uses that dspy does not export at its top level.

The agent's modules import these names from here only. Each is a row of
``rlmoptimizer.dspy_contract.REQUIREMENTS["agent"]`` (:data:`REQUIRED`), checked, with the parameters of each
private method we override or call, when ``rlmoptimizer`` is imported: by the time this module runs, every
import below is known to work.
"""

from __future__ import annotations

from dspy.adapters.chat_adapter import ChatAdapter
from dspy.adapters.types.base_type import CUSTOM_TYPE_END_IDENTIFIER, CUSTOM_TYPE_START_IDENTIFIER
from dspy.clients.backend_selection import CLIENT_KEYS
from dspy.lm15 import Message, Request, Response, request_from_openai_chat
from dspy.primitives.code_interpreter import CodeExecutionError, FinalOutput, resolve_interpreter_factory
from dspy.primitives.repl_types import REPLEntry, REPLHistory, REPLVariable
from dspy.utils.exceptions import format_error_for_lm

from rlmoptimizer.dspy_contract import REQUIREMENTS

REQUIRED = REQUIREMENTS["agent"]

__all__ = [
    "CLIENT_KEYS",
    "CUSTOM_TYPE_END_IDENTIFIER",
    "CUSTOM_TYPE_START_IDENTIFIER",
    "CodeExecutionError",
    "FinalOutput",
    "REQUIRED",
    "ChatAdapter",
    "Message",
    "REPLEntry",
    "REPLHistory",
    "REPLVariable",
    "Request",
    "Response",
    "format_error_for_lm",
    "request_from_openai_chat",
    "resolve_interpreter_factory",
]
