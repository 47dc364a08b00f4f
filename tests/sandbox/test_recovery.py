"""What the agent is told after its sandbox process was lost: no host path, and advice that stays in view."""

from __future__ import annotations

import subprocess
import sys
import types

from rlmoptimizer.sandbox.recovery import MAX_NAMES_SHOWN, ProcessLost, exit_diagnostic, restart_message


def test_a_crash_diagnostic_names_the_runner_without_its_host_path():
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(6)"])
    dead.wait()
    stderr = (
        "error: Uncaught (in promise) RangeError: Invalid string length\n"
        "    at file:///home/me/project/.venv/lib/python3.11/site-packages/dspy/primitives/runner.js:342:22\n"
        "    at /opt/tools/deno/ext/console.ts:10:3"
    )
    interp = types.SimpleNamespace(deno_process=dead, stderr_text=lambda wait_s=0.0: stderr)
    diagnostic = exit_diagnostic(interp, RuntimeError("the process closed its output"))
    assert "Deno exited with code 6" in diagnostic and "Invalid string length" in diagnostic
    assert "<sandbox>/runner.js:342:22" in diagnostic and "<sandbox>/console.ts" in diagnostic
    assert "/home/me" not in diagnostic and "site-packages" not in diagnostic and "/opt/tools" not in diagnostic


def test_a_restart_names_a_bounded_list_of_lost_variables_and_keeps_its_advice():
    names = [f"frame_{i}" for i in range(50_000)]
    message = restart_message(
        ProcessLost("Deno exited with code 6", False), names, ["baseline_train"], [], memory_limit_mb=512, timeout_s=60
    )
    assert f"frame_{MAX_NAMES_SHOWN - 1}, ... and {50_000 - MAX_NAMES_SHOWN} more]" in message
    assert f"frame_{MAX_NAMES_SHOWN}," not in message
    assert len(message) < 2_000 and message.endswith("(os._exit, js.Deno.exit).")
