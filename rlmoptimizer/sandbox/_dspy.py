"""Every dspy name the sandbox wing uses that dspy does not document as public, checked at import.

The rest of the wing imports these names from here only; :data:`REQUIRED` lists each private member with
the parameters we call or override, and :func:`rlmoptimizer.dspy_contract.check` verifies them before the
imports below run.
"""

from __future__ import annotations

from rlmoptimizer.dspy_contract import Requirement, check

_PI = "dspy.primitives.python_interpreter:PythonInterpreter"

REQUIRED = (
    Requirement("dspy.primitives.python_interpreter", "_validate_deno_version", params=("deno_executable",)),
    Requirement("dspy.primitives.facade", "HOST_TOKEN_VAR"),
    Requirement("dspy.primitives.facade", "SHIM_SETUP"),
    Requirement(_PI, "_spawn_process", params=()),  # overridden: our environment, stderr drained
    Requirement(_PI, "_health_check", params=()),
    Requirement(_PI, "_next_request_id", params=()),  # overridden: the reader learns the id in flight
    Requirement(_PI, "_send_request", params=("method", "params", "context")),  # overridden: not an execution
    Requirement(_PI, "_get_runner_path", params=()),
    Requirement(_PI, "_extract_parameters", params=("fn",)),
    Requirement(_PI, "_get_deno_dir", params=("deno_executable",)),
    Requirement(_PI, "_tools_registered", instance=True),
    Requirement(_PI, "_session_ended", instance=True),
    Requirement(_PI, "_last_diagnostic", instance=True),
    Requirement(_PI, "_owner_thread", instance=True),
)

check("sandbox", REQUIRED)

from dspy.primitives.code_interpreter import CodeExecutionError, CodeInterpreterError  # noqa: E402
from dspy.primitives.facade import HOST_TOKEN_VAR, SHIM_SETUP  # noqa: E402
from dspy.primitives.python_interpreter import PythonInterpreter, _validate_deno_version  # noqa: E402

__all__ = [
    "REQUIRED",
    "CodeExecutionError",
    "CodeInterpreterError",
    "HOST_TOKEN_VAR",
    "SHIM_SETUP",
    "PythonInterpreter",
    "_validate_deno_version",
]
