"""Every dspy name the estimate uses that dspy does not export at its top level, and the adapters it renders with.

The estimate's modules import these names from here only. Each is a row of
``rlmoptimizer.dspy_contract.REQUIREMENTS["estimate"]`` (:data:`REQUIRED`), checked when ``rlmoptimizer`` is
imported.
"""

from __future__ import annotations

from dspy.adapters.chat_adapter import ChatAdapter
from dspy.adapters.json_adapter import JSONAdapter
from dspy.teleprompt.gepa import InstructionProposer

from rlmoptimizer.dspy_contract import REQUIREMENTS

REQUIRED = REQUIREMENTS["estimate"]

__all__ = ["REQUIRED", "ChatAdapter", "InstructionProposer", "JSONAdapter"]
