"""Every dspy name the moves use that dspy does not export at its top level.

The moves' modules import these names from here only. Each is a row of
``rlmoptimizer.dspy_contract.REQUIREMENTS["moves"]`` (:data:`REQUIRED`), checked when ``rlmoptimizer`` is
imported: by the time this module runs, every import below is known to work.
"""

from __future__ import annotations

from dspy.teleprompt.gepa import InstructionProposer

from rlmoptimizer.dspy_contract import REQUIREMENTS

REQUIRED = REQUIREMENTS["moves"]

__all__ = ["REQUIRED", "InstructionProposer"]
