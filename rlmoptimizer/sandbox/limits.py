"""The limits a caller sets on a sandbox, checked, and what the agent is told about them.

May import: the standard library only.
"""

from __future__ import annotations

import math

# The longest limit accepted for one execute and for a start: a day (any longer is a mistake, and an infinite
# or NaN limit would be no limit).
MAX_TIMEOUT_S = 86_400.0

# What RLM shows the agent about the runtime when the time limit is not known (see :func:`instructions`).
INSTRUCTIONS = (
    "Python runs in Pyodide (WebAssembly) inside a Deno sandbox; variables persist across executions. "
    "There is no network, no environment variables, no subprocesses, no host files, and no packages beyond "
    "Pyodide's standard library. Each execution has a time limit "
    "(time spent inside tool calls does not count); past it the execution is stopped and the REPL restarts "
    "with its data reloaded, but the variables you defined are lost, so keep each step small."
)


def check_limits(timeout_s: float, start_timeout_s: float, replay_limit: int, memory_limit_mb: int) -> None:
    """``ValueError`` saying which limit is out of range (see :class:`~rlmoptimizer.sandbox.Sandbox`)."""
    for name, value in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s)):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S)
        ):
            raise ValueError(
                f"{name} must be a number of seconds greater than 0 and at most {MAX_TIMEOUT_S:g} "
                f"(one day), got {value!r}"
            )
    if isinstance(replay_limit, bool) or not isinstance(replay_limit, int) or replay_limit < 0:
        raise ValueError(f"replay_limit must be an int >= 0, got {replay_limit!r}")
    if not isinstance(memory_limit_mb, int) or not 64 <= memory_limit_mb <= 4096:
        raise ValueError(f"memory_limit_mb must be an int between 64 and 4096, got {memory_limit_mb!r}")


def instructions(timeout_s: float) -> str:
    """What RLM shows the agent about a runtime whose executions may run for ``timeout_s`` seconds."""
    return (
        "Python runs in Pyodide (WebAssembly) inside a Deno sandbox; variables persist across executions. "
        "There is no network, no environment variables, no subprocesses, no host files, and no packages "
        "beyond Pyodide's standard library. Each execution may "
        f"run for at most {timeout_s:g} s of sandbox time (time spent inside tool calls does not count); "
        "past that it is stopped and the REPL restarts with its data reloaded, but the variables you defined "
        "are lost, so keep each step small."
    )
