"""One Deno process at a time, and one call into it at a time under the watchdog: starting the process, a call
that returns or raises :class:`~rlmoptimizer.sandbox.recovery.ProcessLost` saying why the process is gone, the
watch on its CPU between calls, and stopping it.

May import: the standard library, ``rlmoptimizer.errors``, ``rlmoptimizer.sandbox._dspy``, ``.deno``,
``.process``, ``.recovery``, ``.start_failure``, ``.tool_bridge`` and ``.watchdog``.
"""

from __future__ import annotations

import functools
import logging
import subprocess
from collections.abc import Callable
from typing import Any

from rlmoptimizer.errors import SandboxError
from rlmoptimizer.sandbox import deno, process, start_failure
from rlmoptimizer.sandbox._dspy import CodeExecutionError, CodeInterpreterError, FinalOutput
from rlmoptimizer.sandbox.process import DenoInterpreter
from rlmoptimizer.sandbox.recovery import ProcessLost, exit_diagnostic, lost_process, shorten
from rlmoptimizer.sandbox.tool_bridge import ToolBridge
from rlmoptimizer.sandbox.watchdog import Watchdog

# The idle-CPU warning is the sandbox's: it goes to the logger of :mod:`rlmoptimizer.sandbox.sandbox`.
logger = logging.getLogger("rlmoptimizer.sandbox.sandbox")

# CPU the process may use between executes (GC, a late tier-up compile) before what a cell left running is
# stopped: this much, plus this share of the idle time.
IDLE_CPU_ALLOWANCE_S = 1.0
IDLE_CPU_SHARE = 0.02


class Session:
    """The current process of a sandbox (``interp``, None when none runs), its watchdog (made on the first
    start, stopped by :meth:`close`) and its tools (:class:`ToolBridge`). Not thread-safe: the sandbox's lock
    serializes its use."""

    def __init__(self) -> None:
        self.interp: DenoInterpreter | None = None
        self.watchdog: Watchdog | None = None
        self.tools = ToolBridge(lambda: self.watchdog, self._cpu_clock)
        self._idle_cpu_kill: float | None = None  # CPU seconds burnt between executes, when that killed it
        self.fetching: subprocess.Popen | None = None  # the download of Pyodide before a first start, while it runs

    def start(
        self,
        command: list[str],
        workdir: str | None,
        memory_limit_mb: int,
        start_timeout_s: float,
        deno_dir: str | None = None,
    ) -> None:
        """Start a process running ``command`` with ``deno_dir`` as its ``DENO_DIR`` (the shared cache when None);
        ``SandboxError`` saying why in Deno's words if it does not."""
        if self.watchdog is None:
            self.watchdog = Watchdog()
        deno.check_deno_version(command[0])
        failed = deno.fetch(command, workdir, start_timeout_s, self._fetching)  # the sandbox downloads nothing itself
        if failed is not None:
            exit_code, said = failed
            message = start_failure.explain_start_failure(
                said, exit_code, "its download did not finish", deno.deno_cache_dir(command[0])
            )
            late = f"The sandbox did not start within {start_timeout_s:g} s. " if exit_code is None else ""
            raise SandboxError(late + message)
        interp = DenoInterpreter(deno_command=command)
        interp.workdir = workdir
        interp.deno_dir = deno_dir
        interp.memory_limit_mb = memory_limit_mb
        self.interp = interp
        self.tools.reset()
        self.watchdog.arm(start_timeout_s, functools.partial(process.kill, interp))
        try:
            interp.start()
        except Exception as e:
            timed_out = self.watchdog.disarm()
            message = start_failure.describe_start_failure(
                interp, shorten(str(e)), timed_out, command[0], start_timeout_s
            )
            self.stop()
            raise SandboxError(message) from e
        self.watchdog.disarm()

    def call(
        self,
        code: str,
        variables: dict[str, Any],
        limit: float,
        tools: dict[str, Callable[..., Any]],
        output_fields: list[dict] | None,
    ) -> Any:
        """One ``PythonInterpreter.execute`` under the watchdog; ``ProcessLost`` if the process died."""
        interp = self.interp
        registering = self.tools.sync(interp, tools, output_fields)
        interp._owner_thread = None  # our lock serializes calls; let any thread make this one
        self.watchdog.arm(limit, functools.partial(process.kill, interp))
        timed_out = False
        try:
            if registering:  # execute() registers the tools first, then this wraps them
                self.tools.register(interp)
            self.tools.reported_names = None  # what this execute reports as it ends
            self.tools.submission = None
            result = interp.execute(code, variables)
        except (CodeExecutionError, SyntaxError):
            if self.tools.submission is not None:  # the first SUBMIT ends the cell, caught or not
                return FinalOutput(self.tools.submission)
            raise
        except (CodeInterpreterError, OSError, ValueError) as e:
            if process.alive(interp):
                raise  # a host-side error before anything ran (e.g. a variable that cannot be handed in)
            timed_out = self.watchdog.disarm()
            raise self.lost(interp, exit_diagnostic(interp, e), timed_out) from e
        except BaseException:
            # Interrupted mid-protocol (e.g. KeyboardInterrupt inside a tool): the process cannot be trusted.
            process.kill(interp)
            raise
        finally:
            timed_out = self.watchdog.disarm()
            if timed_out and process.alive(interp):
                process.kill(interp)
        if self.tools.submission is not None:  # the first, whatever the cell did to the sandbox's own record of it
            return FinalOutput(self.tools.submission)
        return result

    def _fetching(self, process: subprocess.Popen | None) -> None:
        self.fetching = process

    def kill_start(self) -> None:
        """Cut short a start in progress on another thread: its download, or its process."""
        fetching, starting = self.fetching, self.interp
        if fetching is not None and fetching.poll() is None:
            fetching.kill()
        if starting is not None:
            process.kill(starting)

    def lost(self, interp: DenoInterpreter, diagnostic: str, timed_out: bool) -> ProcessLost:
        """Why ``interp`` is gone (see :func:`~rlmoptimizer.sandbox.recovery.lost_process`)."""
        idle_cpu, self._idle_cpu_kill = self._idle_cpu_kill, None
        return lost_process(interp, diagnostic, timed_out, idle_cpu)

    def _cpu_clock(self) -> Callable[[], float | None] | None:
        """The current process's CPU clock, or None when no process runs."""
        interp = self.interp
        if interp is None or interp.deno_process is None:
            return None
        return functools.partial(process.cpu_seconds, interp.deno_process.pid)

    def watch_idle(self) -> None:
        """Between executes: stop the process once it burns CPU (what a cell left running), see _on_idle_cpu."""
        interp, watchdog = self.interp, self.watchdog
        if interp is None or watchdog is None or not process.alive(interp):
            return
        pid = interp.deno_process.pid
        watchdog.idle(
            functools.partial(process.cpu_seconds, pid),
            functools.partial(self._on_idle_cpu, interp),
            allowance_s=IDLE_CPU_ALLOWANCE_S,
            share=IDLE_CPU_SHARE,
        )

    def _on_idle_cpu(self, interp: DenoInterpreter, used_s: float) -> None:
        """Watchdog thread: the idle process used ``used_s`` s of CPU; kill it (the next execute restarts it)."""
        logger.warning("Sandbox code kept running between executions (%.1f s of CPU); stopping the process.", used_s)
        if interp is self.interp:
            self._idle_cpu_kill = used_s
        process.kill(interp)

    def stop(self) -> None:
        """End the current process (politely if it is idle) and forget it."""
        interp, self.interp = self.interp, None
        if interp is not None:
            process.stop(interp)

    def close(self) -> None:
        """Stop the process and the watchdog."""
        self.stop()
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
