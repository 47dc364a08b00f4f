"""What a restart brings back and what it tells the agent: the executes replayed as setup, which global names
are the setup's (reloaded) and which the agent's (lost), why the process was lost, and the message saying so.

May import: the standard library, ``rlmoptimizer.errors``, ``rlmoptimizer.sandbox._dspy`` and ``.process``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rlmoptimizer.errors import SandboxError
from rlmoptimizer.sandbox import process
from rlmoptimizer.sandbox._dspy import HOST_TOKEN_VAR, SHIM_SETUP
from rlmoptimizer.sandbox.process import DenoInterpreter

_DIAGNOSTIC_CHARS = 600


@dataclass(frozen=True)
class Replay:
    """An execute to run again, with the same variables, after a restart: always if it installed dspy's
    facade, else only once :meth:`Sandbox.mark_setup_complete` confirmed it as setup."""

    code: str
    variables: dict[str, Any]
    facade: bool


class ProcessLost(Exception):
    """The Deno process died (or was killed by the watchdog) during a call."""

    def __init__(self, diagnostic: str, timed_out: bool, reason: str = "crash"):
        super().__init__(diagnostic)
        self.diagnostic = diagnostic
        self.timed_out = timed_out
        self.reason = "timeout" if timed_out else reason  # timeout | memory | background | crash


class SetupLog:
    """The replay and variable bookkeeping of one sandbox: the executes recorded for replay (in execution
    order) and the REPL's global names, sorted into a fresh process's, the setup's and the agent's."""

    def __init__(self) -> None:
        self.records: list[Replay] = []  # in execution order
        self.confirmed = 0  # records[:confirmed] were made before mark_setup_complete()
        self.pending_overflow = False
        self.setup_complete = False
        self.pristine_names: set[str] = set()  # globals of a fresh process (runner internals)
        self.baseline_names: set[str] = set()  # globals after the replays
        self.pending_names: set[str] = set()  # globals made by executes not yet marked as setup
        self.user_names: list[str] = []  # agent-defined globals after the last execute

    def replays(self) -> list[Replay]:
        """What a restart runs again, in order: the facade installs and the confirmed setup."""
        return [r for i, r in enumerate(self.records) if r.facade or i < self.confirmed]

    def record(
        self,
        code: str,
        variables: dict[str, Any],
        names: set[str],
        tools: Iterable[str],
        *,
        succeeded: bool,
        replay_limit: int,
    ) -> None:
        """Note an execute that ended with the REPL's global names ``names``: record it for replay if it
        installed dspy's facade or ran before the setup was complete, and what the agent defined."""
        facade_install = code == SHIM_SETUP or HOST_TOKEN_VAR in variables
        if succeeded and facade_install:
            self.records.append(Replay(code, variables, facade=True))
            self.baseline_names |= names
            return
        if succeeded and not self.setup_complete:
            if sum(not record.facade for record in self.records) < replay_limit:
                self.records.append(Replay(code, variables, facade=False))
                self.pending_names |= names - self.baseline_names
            else:
                self.pending_overflow = True
        excluded = self.baseline_names | set(tools) | set(variables) | {"SUBMIT"}
        self.user_names = sorted(names - excluded)

    def mark_setup_complete(self, replay_limit: int) -> None:
        """Confirm every recorded execute as setup (see :meth:`Sandbox.mark_setup_complete`)."""
        if self.setup_complete:
            return
        if self.pending_overflow:
            raise SandboxError(
                f"More than replay_limit={replay_limit} executes ran before mark_setup_complete(); "
                "raise replay_limit, or do the setup in fewer executes."
            )
        self.confirmed = len(self.records)
        self.baseline_names |= self.pending_names
        self.pending_names, self.setup_complete = set(), True

    def reloaded_names(self, tools: Iterable[str]) -> list[str]:
        """The data variables the setup defines (what a restart reloads)."""
        return sorted(self.baseline_names - self.pristine_names - set(tools) - {"SUBMIT"})


def lost_process(interp: DenoInterpreter, diagnostic: str, timed_out: bool, idle_cpu: float | None) -> ProcessLost:
    """Why ``interp`` is gone: the time limit, work left running between cells (``idle_cpu`` seconds of CPU),
    memory, or a crash."""
    if timed_out:
        return ProcessLost(diagnostic, True)
    if idle_cpu is not None:
        return ProcessLost(f"{idle_cpu:.1f} s of CPU used between executions", False, "background")
    if process.ran_out_of_memory(interp.stderr_text(wait_s=0.5)):
        return ProcessLost(diagnostic, False, "memory")
    return ProcessLost(diagnostic, False)


_HOST_PATH = re.compile(r"(?:file://)?/[^\s:;,()'\"]*/([^/\s:;,()'\"]+\.(?:js|mjs|ts|py))")
"""A host file's path in a diagnostic (Deno's stack frames name the runner on the host): only its name is shown."""


def exit_diagnostic(interp: DenoInterpreter, error: Exception) -> str:
    """What is known about a dead process: its exit code, the end of its stderr, the protocol error."""
    deno_process, parts = interp.deno_process, []
    if deno_process is not None:
        try:
            parts.append(f"Deno exited with code {deno_process.wait(timeout=5)}")
        except subprocess.TimeoutExpired:
            pass
        stderr = interp.stderr_text(wait_s=0.5)  # the stderr thread reads the last lines
        if stderr.strip():
            parts.append("stderr: " + shorten(_HOST_PATH.sub(r"<sandbox>/\1", stderr), 250))
    parts.append(shorten(_HOST_PATH.sub(r"<sandbox>/\1", str(error)), 150))
    return "; ".join(parts)


def shorten(text: str, limit: int = _DIAGNOSTIC_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else "..." + text[-limit:]


MAX_NAMES_SHOWN = 40
"""The lost variables a restart message names; the rest are counted (the advice after the list must stay in view)."""


def names_list(names: list[str]) -> str:
    if not names:
        return "[] (none)"
    shown = ", ".join(names[:MAX_NAMES_SHOWN])
    more = len(names) - MAX_NAMES_SHOWN
    return f"[{shown}, ... and {more} more]" if more > 0 else f"[{shown}]"


def restart_message(
    lost: ProcessLost,
    lost_names: list[str],
    reloaded: list[str],
    replay_failures: list[str],
    *,
    memory_limit_mb: int,
    timeout_s: float,
) -> str:
    """What the agent is told after a restart: why the process was lost, what the setup reloaded
    (``reloaded``; ``replay_failures`` are setup steps that failed), which of its variables are gone, and what
    to do differently."""
    restored = "The REPL was restarted and the setup was run again"
    restored += f" (data variables reloaded: {', '.join(reloaded)})." if reloaded else "."
    if replay_failures:
        restored += " Some setup steps failed on replay: " + "; ".join(replay_failures) + "."
    lost_text = f"These of your variables were lost: {names_list(lost_names)}."
    if lost.reason == "memory":
        limit = f"{memory_limit_mb} MB"
        return (
            f"MemoryError: the sandbox process ran out of memory (its limit is {limit}, JavaScript buffers "
            f"included) while running this code and was restarted. {restored} {lost_text} Process the data "
            "in pieces and keep fewer or smaller objects alive."
        )
    if lost.reason == "background":
        return (
            "BackgroundWork: something an earlier execution started (a Web Worker, a timer, a pending async "
            f"task) kept running after it ended ({shorten(lost.diagnostic, 80)}), so the sandbox process was "
            f"stopped. {restored} {lost_text} Do not leave work running after an execution: await what you "
            "start within the same execution."
        )
    if lost.timed_out:
        return (
            f"TimeoutError: this code ran for more than {timeout_s:g} s of sandbox time and was stopped. "
            f"{restored} {lost_text} Work on smaller slices of the data and avoid unbounded loops. A restart "
            "loses every variable, not what the tools keep on the host: keep what was costly to get (an LM's "
            "answers) with a tool that stores it, since asking again is paid again. Waiting on a tool call does not count "
            "toward the limit; CPU the sandbox uses meanwhile (a Worker, a timer, other tasks of the cell) does."
        )
    return (
        f"SandboxCrash: the sandbox process died while running this code "
        f"(last diagnostic: {shorten(lost.diagnostic, 500)}). {restored} {lost_text} Avoid building very "
        "large objects (process the data in pieces) and do not end the process (os._exit, js.Deno.exit)."
    )
