"""Every dspy name the sandbox wing uses that dspy does not export at its top level.

The rest of the wing imports these names from here only. Each is a row of
``rlmoptimizer.dspy_contract.REQUIREMENTS["sandbox"]`` (:data:`REQUIRED`), checked, with the parameters of
each private method we call or override, when ``rlmoptimizer`` is imported: by the time this module runs,
every import below is known to work.
"""

from __future__ import annotations

from dspy.primitives.code_interpreter import CodeExecutionError, CodeInterpreterError, FinalOutput
from dspy.primitives.facade import HOST_TOKEN_VAR, SHIM_SETUP
from dspy.primitives.python_interpreter import PythonInterpreter, _validate_deno_version

from rlmoptimizer.dspy_contract import REQUIREMENTS

REQUIRED = REQUIREMENTS["sandbox"]

__all__ = [
    "REQUIRED",
    "CodeExecutionError",
    "CodeInterpreterError",
    "FinalOutput",
    "HOST_TOKEN_VAR",
    "SHIM_SETUP",
    "PythonInterpreter",
    "_validate_deno_version",
]
