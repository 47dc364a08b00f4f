""":class:`Sandbox`: dspy's Deno/Pyodide ``PythonInterpreter``, made to start offline, bounded in time and
memory, and able to come back from a dead process.

What :class:`Sandbox` adds to ``PythonInterpreter``:

- **Offline start.** dspy's ``runner.js`` imports ``readLines`` from ``https://deno.land/std@.../io/mod.ts``.
  An import map points every such URL at a local module shipped in ``assets/``, so the sandbox
  starts where deno.land cannot be reached (only the npm ``pyodide`` package must be in Deno's cache or
  reachable once, through the proxy and CA bundle the host's Python uses: see :mod:`.deno`).
- **Tighter isolation.** Deno's ``--deny-*`` flags on top of the permissions ``PythonInterpreter`` already
  withholds, no permission prompts, a cap on WebAssembly memory, and a Deno process that inherits only
  the environment variables Deno itself needs (see :mod:`.deno`).
- **A time limit per cell.** A watchdog kills the process when one ``execute()`` has spent more than
  ``timeout_s`` seconds inside the sandbox; time spent in host tools (an evaluation that takes minutes)
  does not count.
- **Nothing runs between cells.** Between executes the same watchdog samples the process's CPU time; work a
  cell left running (a Web Worker, a timer, a pending task) that burns more than a second of CPU gets the
  process killed, and the next execute restarts it and tells the agent why.
- **Bounded memory and output.** The whole process's writable memory is capped (see :mod:`.deno`), and what
  comes out of the process is read as untrusted input (see :mod:`.protocol`): a flood, an oversize line or a
  forged protocol message is an error of that cell, never a crash or a memory blow-up of the host.
- **Recovery.** After a timeout, a crash or running out of memory the sandbox restarts, re-runs the executes
  recorded before :meth:`Sandbox.mark_setup_complete`, and raises ``CodeExecutionError`` with a message for
  the agent naming the variables it lost. The run goes on.

Errors::

    CodeExecutionError (dspy)   the agent's code failed, timed out or killed the process; the REPL is usable
    SyntaxError                 the agent's code does not parse
    CodeInterpreterError (dspy) a host-side misuse (a value that cannot be handed in, a recursive execute)
    SandboxError                the sandbox could not be started or restarted; terminal (a failed start says
                                why in Deno's words and what to do)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import json
import logging
import math
import os
import shutil
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlmoptimizer.errors import AgentToolError, SandboxError
from rlmoptimizer.sandbox import deno, process, start_failure
from rlmoptimizer.sandbox._dspy import HOST_TOKEN_VAR, SHIM_SETUP, CodeExecutionError, CodeInterpreterError
from rlmoptimizer.sandbox.process import DenoInterpreter
from rlmoptimizer.sandbox.watchdog import Watchdog

__all__ = ["Sandbox"]

logger = logging.getLogger(__name__)

# A cheap expression listing the REPL's global names that are not private and not modules (``js`` is a
# JsProxy, hence the sys.modules check). It defines nothing and works even if the agent shadowed print.
_GLOBAL_NAMES_EXPR = (
    "(lambda _modules: __import__('json').dumps([_n for _n, _v in globals().items() "
    "if not _n.startswith('_') and type(_v).__name__ != 'module' and id(_v) not in _modules]))"
    "({id(_m) for _m in __import__('sys').modules.values()})"
)

# Sandbox-side code run with each tool registration (see the docstrings of the asset files): the tools'
# wrappers, then the runner hooks. The host appends the one call each file's docstring names.
_TOOL_WRAPPERS = (deno.ASSETS_DIR / "tool_wrappers.py").read_text(encoding="utf-8")
_RUNNER_HOOKS = (deno.ASSETS_DIR / "runner_hooks.py").read_text(encoding="utf-8")

# The internal host tool through which each execute reports the REPL's global names as it ends (private, so
# never listed itself, and not in ``Sandbox.tools``): one tool round trip (~0.5 ms) instead of a second
# execute listing them (dspy's runner sets up every execute: ~5 ms).
_NAMES_TOOL = "_rlmopt_names"

_DIAGNOSTIC_CHARS = 600

# The longest limit accepted for one execute and for a start: a day (any longer is a mistake, and an infinite
# or NaN limit would be no limit).
MAX_TIMEOUT_S = 86_400.0

# CPU the process may use between executes (GC, a late tier-up compile) before what a cell left running is
# stopped: this much, plus this share of the idle time.
IDLE_CPU_ALLOWANCE_S = 1.0
IDLE_CPU_SHARE = 0.02


def _registration_code(names: list[str], removed: list[str]) -> str:
    """What runs in the sandbox after dspy registered the tools ``names`` (``removed`` are gone since)."""
    wrap = f"_rlmopt_wrap_tools({json.dumps(names)}, {json.dumps(removed)}, {json.dumps(AgentToolError.__name__)})"
    hooks = f"_rlmopt_install_hooks(globals().get({json.dumps(_NAMES_TOOL)}))"
    return "\n".join([_TOOL_WRAPPERS, wrap, "del _rlmopt_wrap_tools", _RUNNER_HOOKS, hooks, "del _rlmopt_install_hooks, _HARDEN_JS"])


@dataclass(frozen=True)
class _Replay:
    """An execute to run again, with the same variables, after a restart: always if it installed dspy's
    facade, else only once :meth:`Sandbox.mark_setup_complete` confirmed it as setup."""

    code: str
    variables: dict[str, Any]
    facade: bool


class _ProcessLost(Exception):
    """The Deno process died (or was killed by the watchdog) during a call."""

    def __init__(self, diagnostic: str, timed_out: bool, reason: str = "crash"):
        super().__init__(diagnostic)
        self.diagnostic = diagnostic
        self.timed_out = timed_out
        self.reason = "timeout" if timed_out else reason  # timeout | memory | background | crash


def _exit_diagnostic(interp: DenoInterpreter, error: Exception) -> str:
    """What is known about a dead process: its exit code, the end of its stderr, the protocol error."""
    process, parts = interp.deno_process, []
    if process is not None:
        try:
            parts.append(f"Deno exited with code {process.wait(timeout=5)}")
        except subprocess.TimeoutExpired:
            pass
        stderr = interp.stderr_text(wait_s=0.5)  # the stderr thread reads the last lines
        if stderr.strip():
            parts.append("stderr: " + _shorten(stderr, 250))
    parts.append(_shorten(str(error), 150))
    return "; ".join(parts)


def _shorten(text: str, limit: int = _DIAGNOSTIC_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else "..." + text[-limit:]


def _names_list(names: list[str]) -> str:
    return "[" + ", ".join(names) + "]" if names else "[] (none)"


class Sandbox:
    """A persistent sandboxed Python REPL for the optimizer agent (implements dspy's CodeInterpreter protocol).

    Python runs in Pyodide inside a Deno process that reads no host files, with no network, environment,
    subprocesses or host writes. State persists across ``execute()`` calls until a restart; data comes in
    with ``variables=`` or through tools.

    Lifecycle: ``start()`` (or ``start_in_background()``, or lazily on the first ``execute()``), any number of
    ``execute()``, ``shutdown()``. After ``shutdown()`` the sandbox cannot be used again. Calls are serialized
    by a lock, so the sandbox may be started on one thread and used from another.

    Restarts (after a timeout, a crash or running out of memory) run, in their original order, every execute
    that succeeded before :meth:`mark_setup_complete` and the ``dspy`` facade installs made by ``dspy.RLM``
    (recognized automatically, replayed even if ``mark_setup_complete`` is never called); tools are
    registered again. Variables handed in with ``variables=`` come back with the
    next ``execute()`` that hands them in (``dspy.RLM`` hands its inputs in on every turn).
    """

    # What RLM shows the agent about this runtime (RLM reads it from the interpreter factory). Instances
    # override it with their own time limit.
    execution_instructions: str = (
        "Python runs in Pyodide (WebAssembly) inside a Deno sandbox; variables persist across executions. "
        "There is no network, no environment variables, no subprocesses, no host files, and no packages beyond "
        "Pyodide's standard library. Each execution has a time limit "
        "(time spent inside tool calls does not count); past it the execution is stopped and the REPL restarts "
        "with its data reloaded, but the variables you defined are lost, so keep each step small."
    )

    def __init__(
        self,
        *,
        tools: dict[str, Callable[..., Any]] | None = None,
        timeout_s: float = 120.0,
        replay_limit: int = 100,
        # limits of the process itself
        memory_limit_mb: int = 2048,
        start_timeout_s: float = 300.0,
    ) -> None:
        """
        Args:
            tools: host functions callable from sandboxed code by name (keyword arguments, JSON-friendly
                values). ``self.tools`` stays mutable; changes apply from the next ``execute()``.
            timeout_s: the most seconds one ``execute()`` may spend inside the sandbox; host tool time is
                not counted. Over it, the process is killed and restarted and the call raises
                ``CodeExecutionError``.
            replay_limit: the most executes recorded before :meth:`mark_setup_complete` for replay.
            memory_limit_mb: the most WebAssembly memory Pyodide may use (past it Python raises
                ``MemoryError`` and the process survives; bounded by Pyodide's own 4 GiB), and, on Linux, the
                most writable memory the whole process may add to what it used once started (JavaScript
                buffers included; past it an allocation fails, or the process is restarted with a message
                that says memory).
            start_timeout_s: the most seconds starting the process may take (the first start on a machine
                downloads Pyodide from npm), and the limit for each replayed execute.
        """
        # validation
        for name, value in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S
            ):
                raise ValueError(
                    f"{name} must be a number of seconds greater than 0 and at most {MAX_TIMEOUT_S:g} "
                    f"(one day), got {value!r}"
                )
        if isinstance(replay_limit, bool) or not isinstance(replay_limit, int) or replay_limit < 0:
            raise ValueError(f"replay_limit must be an int >= 0, got {replay_limit!r}")
        if not isinstance(memory_limit_mb, int) or not 64 <= memory_limit_mb <= 4096:
            raise ValueError(f"memory_limit_mb must be an int between 64 and 4096, got {memory_limit_mb!r}")

        # configuration
        self.tools: dict[str, Callable[..., Any]] = dict(tools or {})
        self.output_fields: list[dict] | None = None
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.replay_limit = replay_limit
        self.memory_limit_mb = memory_limit_mb
        self.execution_instructions = self._instructions()

        # counters, readable by the caller
        self.restarts = 0
        self.timeouts = 0
        self.lost_variables_on_last_restart: list[str] = []

        # process state
        self._lock = threading.Lock()
        self._executing_thread: int | None = None
        self._interp: DenoInterpreter | None = None
        self._watchdog: Watchdog | None = None
        self._deno_command: list[str] | None = None
        self._tmpdir: str | None = None
        self._finalizer: weakref.finalize | None = None
        self._closed = False
        self._broken: SandboxError | None = None
        self._background: threading.Thread | None = None
        self._background_error: BaseException | None = None
        self._registration_key: str | None = None
        self._registered_tools: set[str] = set()  # tool functions defined in the current process
        self._wrapped: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}
        self._notice = ""  # told to the agent with the next result (a restart it did not cause)
        self._replay_failures: list[str] = []  # setup steps that failed on the last restart
        self._reported_names: set[str] | None = None  # what the running execute reported (_NAMES_TOOL)
        self._idle_cpu_kill: float | None = None  # CPU seconds burnt between executes, when that killed it

        # replay and variable bookkeeping
        self._records: list[_Replay] = []  # in execution order
        self._confirmed = 0  # records[:confirmed] were made before mark_setup_complete()
        self._pending_overflow = False
        self._setup_complete = False
        self._pristine_names: set[str] = set()  # globals of a fresh process (runner internals)
        self._baseline_names: set[str] = set()  # globals after the replays
        self._pending_names: set[str] = set()  # globals made by executes not yet marked as setup
        self._user_names: list[str] = []  # agent-defined globals after the last execute

    # ------------------------------------------------------------------ public interface

    @property
    def deno_command(self) -> list[str]:
        """The command that starts the Deno process (built on first use)."""
        if self._deno_command is None:
            self._deno_command = self._build_deno_command()
        return list(self._deno_command)

    @property
    def process_id(self) -> int | None:
        """The Deno process id, or None when no process runs."""
        process = self._interp.deno_process if self._interp is not None else None
        return process.pid if process is not None and process.poll() is None else None

    def as_factory(self) -> Callable[[], Sandbox]:
        """An ``interpreter_factory`` for ``dspy.RLM`` that hands out this sandbox once.

        It carries :attr:`execution_instructions` (RLM reads them from the factory, not the interpreter).
        A second call (a sub-agent built inside the sandbox asking for its own REPL) raises
        ``CodeInterpreterError``, because sharing this one would let the sub-agent replace the tools and
        shut it down."""
        handed_out = threading.Event()

        def factory() -> Sandbox:
            if handed_out.is_set():
                raise CodeInterpreterError(
                    "This sandbox is already in use by the optimizer agent; sub-agents cannot get their own REPL."
                )
            handed_out.set()
            return self

        factory.execution_instructions = self.execution_instructions
        return factory

    def start(self) -> None:
        """Start the process; idempotent and blocking. Raises ``SandboxError``."""
        self._join_background()
        with self._lock:
            self._check_usable()
            if self._interp is None:
                self._boot()

    def start_in_background(self) -> None:
        """Begin :meth:`start` on a daemon thread and return; ``execute()``/``start()`` wait for it and
        raise its error, if any, as ``SandboxError``."""
        with self._lock:
            self._check_usable()
            if self._interp is not None or self._background is not None:
                return
            thread = threading.Thread(target=self._start_quietly, name="rlmoptimizer-sandbox-start", daemon=True)
            self._background = thread
        thread.start()

    def execute(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        """Run ``code`` with ``variables`` assigned first, like ``PythonInterpreter.execute``.

        Returns the captured stdout (or the value of a final expression), or ``FinalOutput`` if the code
        called ``SUBMIT``. Raises ``SyntaxError`` or ``CodeExecutionError`` for the agent's code, including a
        timeout or a crash after which the sandbox was restarted; ``SandboxError`` if it could not be."""
        if self._executing_thread == threading.get_ident():
            raise CodeInterpreterError("The sandbox cannot execute code from inside one of its own tools.")
        self._join_background()
        with self._lock:
            self._check_usable()
            self._executing_thread = threading.get_ident()
            try:
                return self._execute_locked(code, dict(variables or {}))
            finally:
                self._executing_thread = None
                self._watch_idle()

    def __call__(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        return self.execute(code, variables)

    def mark_setup_complete(self) -> None:
        """Make every execute that succeeded so far part of the setup replayed (in order, with its
        variables) after every restart; later executes are the agent's and are not replayed."""
        with self._lock:
            if self._setup_complete:
                return
            if self._pending_overflow:
                raise SandboxError(
                    f"More than replay_limit={self.replay_limit} executes ran before mark_setup_complete(); "
                    "raise replay_limit, or do the setup in fewer executes."
                )
            self._confirmed = len(self._records)
            self._baseline_names |= self._pending_names
            self._pending_names, self._setup_complete = set(), True

    def shutdown(self) -> None:
        """Stop the process and release everything; the sandbox cannot be used afterwards."""
        if self._executing_thread == threading.get_ident():
            raise CodeInterpreterError("The sandbox cannot be shut down from inside one of its own tools.")
        background = self._background
        if background is not None:
            background.join()
        with self._lock:
            self._closed = True
            self._stop_process()
            if self._watchdog is not None:
                self._watchdog.stop()
                self._watchdog = None
            if self._finalizer is not None:
                self._finalizer()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ execute

    def _execute_locked(self, code: str, variables: dict[str, Any]) -> Any:
        if self._interp is None:
            self._boot()
        elif not self._alive():
            diagnostic = self._interp._last_diagnostic or "the process exited between cells"
            self._notice = self._recover(self._lost(self._interp, diagnostic, False), variables)

        try:
            result = self._call(code, variables, self.timeout_s)
        except _ProcessLost as lost:
            raise CodeExecutionError(self._recover(lost, variables)) from None
        except CodeExecutionError:
            self._after_execute(code, variables, succeeded=False)
            raise

        self._after_execute(code, variables, succeeded=True)
        if self._notice and (result is None or isinstance(result, str)):
            result, self._notice = f"{self._notice}\n{result or ''}", ""
        return result

    def _after_execute(self, code: str, variables: dict[str, Any], *, succeeded: bool) -> None:
        """Record a replayable execute and the agent's global names: those the execute reported as it ended
        (see _RUNNER_HOOKS), else listed by one extra call."""
        names, self._reported_names = self._reported_names, None
        if names is None:
            names = self._global_names()
        if names is None:
            return
        facade_install = code == SHIM_SETUP or HOST_TOKEN_VAR in variables
        if succeeded and facade_install:
            self._records.append(_Replay(code, variables, facade=True))
            self._baseline_names |= names
            return
        if succeeded and not self._setup_complete:
            if sum(not record.facade for record in self._records) < self.replay_limit:
                self._records.append(_Replay(code, variables, facade=False))
                self._pending_names |= names - self._baseline_names
            else:
                self._pending_overflow = True
        excluded = self._baseline_names | set(self.tools) | set(variables) | {"SUBMIT"}
        self._user_names = sorted(names - excluded)

    def _global_names(self) -> set[str] | None:
        """The REPL's public non-module globals, or None if they could not be listed."""
        try:
            listed = self._call(_GLOBAL_NAMES_EXPR, {}, self.timeout_s)
            return set(json.loads(listed))
        except _ProcessLost:
            return None  # noticed and recovered from on the next execute
        except (CodeExecutionError, SyntaxError, TypeError, ValueError) as e:
            logger.debug("Could not list the sandbox globals: %s", e)
            return None

    def _call(self, code: str, variables: dict[str, Any], limit: float) -> Any:
        """One ``PythonInterpreter.execute`` under the watchdog; ``_ProcessLost`` if the process died."""
        interp = self._interp
        registering = self._sync_tools(interp)
        interp._owner_thread = None  # our lock serializes calls; let any thread make this one
        self._watchdog.arm(limit, functools.partial(self._kill, interp))
        timed_out = False
        try:
            if registering:  # execute() registers the tools first, then this wraps them
                removed = sorted(self._registered_tools - set(interp.tools))
                interp.execute(_registration_code(sorted(interp.tools), removed))
                self._registered_tools = set(interp.tools)
            self._reported_names = None  # what this execute reports as it ends
            return interp.execute(code, variables)
        except (CodeExecutionError, SyntaxError):
            raise
        except (CodeInterpreterError, OSError, ValueError) as e:
            if self._alive(interp):
                raise  # a host-side error before anything ran (e.g. a variable that cannot be handed in)
            timed_out = self._watchdog.disarm()
            raise self._lost(interp, _exit_diagnostic(interp, e), timed_out) from e
        except BaseException:
            # Interrupted mid-protocol (e.g. KeyboardInterrupt inside a tool): the process cannot be trusted.
            self._kill(interp)
            raise
        finally:
            timed_out = self._watchdog.disarm()
            if timed_out and self._alive(interp):
                self._kill(interp)

    def _lost(self, interp: DenoInterpreter, diagnostic: str, timed_out: bool) -> _ProcessLost:
        """Why ``interp`` is gone: the time limit, work left running between cells, memory, or a crash."""
        idle_cpu, self._idle_cpu_kill = self._idle_cpu_kill, None
        if timed_out:
            return _ProcessLost(diagnostic, True)
        if idle_cpu is not None:
            return _ProcessLost(f"{idle_cpu:.1f} s of CPU used between executions", False, "background")
        if process.ran_out_of_memory(interp.stderr_text(wait_s=0.5)):
            return _ProcessLost(diagnostic, False, "memory")
        return _ProcessLost(diagnostic, False)

    def _watch_idle(self) -> None:
        """Between executes: stop the process once it burns CPU (what a cell left running), see _on_idle_cpu."""
        interp, watchdog = self._interp, self._watchdog
        if interp is None or watchdog is None or not self._alive(interp):
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
        if interp is self._interp:
            self._idle_cpu_kill = used_s
        self._kill(interp)

    # ------------------------------------------------------------------ tools

    def _sync_tools(self, interp: DenoInterpreter) -> bool:
        """Hand ``self.tools`` (wrapped to pause the watchdog) and ``output_fields`` to the interpreter;
        re-register them in the sandbox when their names, signatures or the outputs changed (True then)."""
        wrapped = {}
        for name, fn in self.tools.items():
            if not (isinstance(name, str) and name.isidentifier()):
                raise SandboxError(f"Tool names must be Python identifiers, got {name!r}")
            cached = self._wrapped.get(name)
            if cached is None or cached[0] is not fn:
                cached = (fn, self._pausing(fn))
                self._wrapped[name] = cached
            wrapped[name] = cached[1]
        wrapped[_NAMES_TOOL] = self._receive_names
        interp.tools = wrapped
        interp.output_fields = self.output_fields
        key = json.dumps(
            [[name, interp._extract_parameters(fn)] for name, fn in wrapped.items()] + [self.output_fields],
            default=repr,
            sort_keys=True,
        )
        if key != self._registration_key or not interp._tools_registered:
            interp._tools_registered = False
            self._registration_key = key
        return not interp._tools_registered and bool(wrapped or self._registered_tools)

    def _receive_names(self, names: list) -> None:
        """_NAMES_TOOL: each execute reports the REPL's global names through it as it ends."""
        if isinstance(names, list) and all(isinstance(name, str) for name in names):
            self._reported_names = set(names)

    def _pausing(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with the watchdog paused while it runs (awaiting it too if it is async)."""

        @functools.wraps(fn)
        def tool(**kwargs: Any) -> Any:
            watchdog = self._watchdog
            watchdog.pause()
            try:
                result = fn(**kwargs)
                return _run_awaitable(result) if inspect.isawaitable(result) else result
            finally:
                watchdog.resume()

        try:
            tool.__signature__ = inspect.signature(fn)
        except (TypeError, ValueError):
            pass  # no introspectable signature: registered as taking no named parameters
        return tool

    # ------------------------------------------------------------------ process lifecycle

    def _boot(self) -> None:
        """Start a process and bring it to the setup state; ``SandboxError`` on failure."""
        if self._watchdog is None:
            self._watchdog = Watchdog()
        command = self.deno_command
        deno.check_deno_version(command[0])
        interp = DenoInterpreter(deno_command=command)
        interp.workdir = os.path.join(self._tmpdir, "work") if self._tmpdir else None
        interp.memory_limit_mb = self.memory_limit_mb
        self._interp, self._registration_key, self._registered_tools = interp, None, set()
        self._watchdog.arm(self.start_timeout_s, functools.partial(self._kill, interp))
        try:
            interp.start()
        except Exception as e:
            timed_out = self._watchdog.disarm()
            message = self._start_failure(interp, e, timed_out)
            self._stop_process()
            raise SandboxError(message) from e
        self._watchdog.disarm()
        try:
            self._pristine_names = self._global_names() or set()
            replay_failures = []
            replays = [r for i, r in enumerate(self._records) if r.facade or i < self._confirmed]
            for step, replay in enumerate(replays, start=1):
                try:
                    self._call(replay.code, replay.variables, self.start_timeout_s)
                except (CodeExecutionError, SyntaxError) as e:
                    replay_failures.append(f"setup step {step}: {_shorten(str(e), 200)}")
            if replay_failures:
                logger.warning("Sandbox setup replay failed: %s", "; ".join(replay_failures))
            self._replay_failures = replay_failures
            names = self._global_names()
            if names is None:
                raise SandboxError("The sandbox did not answer after its setup.")
            self._baseline_names = names | self._baseline_names
        except _ProcessLost as e:
            self._stop_process()
            raise SandboxError(f"The sandbox died during setup: {_shorten(e.diagnostic)}") from e
        except (CodeExecutionError, SyntaxError, CodeInterpreterError) as e:
            self._stop_process()
            raise SandboxError(f"The sandbox setup failed: {_shorten(str(e))}") from e
        except BaseException:
            self._stop_process()
            raise

    def _start_failure(self, interp: DenoInterpreter, error: Exception, timed_out: bool) -> str:
        """Why ``interp`` did not start, in Deno's words, with what to do (:func:`start_failure.explain_start_failure`)."""
        process, exit_code = interp.deno_process, None
        if process is not None:
            try:
                exit_code = process.wait(timeout=0.1 if timed_out else 5)  # stdout closes before the exit is seen
            except subprocess.TimeoutExpired:
                pass
        stderr = interp.stderr_text(wait_s=1.0 if exit_code is not None else 0.0)
        cache_dir = deno.deno_cache_dir(self.deno_command[0])
        message = start_failure.explain_start_failure(stderr, exit_code, _shorten(str(error)), cache_dir)
        if timed_out:
            message = f"The sandbox did not start within {self.start_timeout_s:g} s. " + message
        return message

    def _recover(self, lost: _ProcessLost, variables: dict[str, Any]) -> str:
        """Restart after ``lost`` (at most two tries, else ``SandboxError``); the agent-facing message."""
        lost_names = [name for name in self._user_names if name not in variables]
        self._stop_process()
        self.restarts += 1
        if lost.timed_out:
            self.timeouts += 1
        error: SandboxError | None = None
        for _attempt in range(2):
            try:
                self._boot()
                break
            except SandboxError as e:
                error = e
        else:
            self._broken = SandboxError(f"The sandbox could not be restarted: {error}")
            raise self._broken from error
        lost_names = [name for name in lost_names if name not in self._baseline_names]
        self.lost_variables_on_last_restart = lost_names
        self._user_names = []
        return self._restart_message(lost, lost_names)

    def _restart_message(self, lost: _ProcessLost, lost_names: list[str]) -> str:
        data = sorted(self._baseline_names - self._pristine_names - set(self.tools) - {"SUBMIT"})
        restored = "The REPL was restarted and the setup was run again"
        restored += f" (data variables reloaded: {', '.join(data)})." if data else "."
        if self._replay_failures:
            restored += " Some setup steps failed on replay: " + "; ".join(self._replay_failures) + "."
        lost_text = f"These of your variables were lost: {_names_list(lost_names)}."
        if lost.reason == "memory":
            limit = f"{self.memory_limit_mb} MB"
            return (
                f"MemoryError: the sandbox process ran out of memory (its limit is {limit}, JavaScript buffers "
                f"included) while running this code and was restarted. {restored} {lost_text} Process the data "
                "in pieces and keep fewer or smaller objects alive."
            )
        if lost.reason == "background":
            return (
                "BackgroundWork: something an earlier execution started (a Web Worker, a timer, a pending async "
                f"task) kept running after it ended ({_shorten(lost.diagnostic, 80)}), so the sandbox process was "
                f"stopped. {restored} {lost_text} Do not leave work running after an execution: await what you "
                "start within the same execution."
            )
        if lost.timed_out:
            return (
                f"TimeoutError: this code ran for more than {self.timeout_s:g} s of sandbox time and was stopped. "
                f"{restored} {lost_text} Work on smaller slices of the data, avoid unbounded loops, and keep "
                "intermediate results in variables so a restart costs little. Time spent inside tool calls "
                "does not count toward the limit."
            )
        return (
            f"SandboxCrash: the sandbox process died while running this code "
            f"(last diagnostic: {_shorten(lost.diagnostic, 500)}). {restored} {lost_text} Avoid building very "
            "large objects (process the data in pieces) and do not end the process (os._exit, js.Deno.exit)."
        )

    def _start_quietly(self) -> None:
        try:
            with self._lock:
                self._check_usable()
                if self._interp is None:
                    self._boot()
        except BaseException as e:  # surfaced by the next execute()/start()
            self._background_error = e

    def _join_background(self) -> None:
        background = self._background
        if background is None:
            return
        background.join()
        with self._lock:
            if self._background is background:
                self._background = None
            error, self._background_error = self._background_error, None
        if error is not None:
            if isinstance(error, SandboxError):
                raise SandboxError(str(error)) from error
            raise SandboxError(f"The sandbox could not start in the background: {error!r}") from error

    def _check_usable(self) -> None:
        if self._closed:
            raise SandboxError("The sandbox was shut down; create a new Sandbox.")
        if self._broken is not None:
            raise self._broken

    def _alive(self, interp: DenoInterpreter | None = None) -> bool:
        interp = interp if interp is not None else self._interp
        if interp is None or interp._session_ended or interp.deno_process is None:
            return False
        return interp.deno_process.poll() is None

    @staticmethod
    def _kill(interp: DenoInterpreter) -> None:
        process = interp.deno_process
        if process is not None and process.poll() is None:
            process.kill()

    def _stop_process(self) -> None:
        """End the current process (politely if it is idle) and forget it."""
        interp, self._interp = self._interp, None
        if interp is None or interp.deno_process is None:
            return
        process = interp.deno_process
        interp._session_ended = True
        if process.poll() is None:
            try:
                process.stdin.write('{"jsonrpc": "2.0", "method": "shutdown"}\n')
                process.stdin.close()
                process.wait(timeout=5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except (OSError, ValueError):
                pass

    # ------------------------------------------------------------------ construction helpers

    def _build_deno_command(self) -> list[str]:
        """The Deno command (see :func:`deno.build_command`); its import map and working directory live in a
        temporary directory removed with the sandbox."""
        self._tmpdir = tempfile.mkdtemp(prefix="rlmoptimizer-sandbox-")
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._tmpdir, ignore_errors=True)
        os.mkdir(os.path.join(self._tmpdir, "work"))
        return deno.build_command([], self.memory_limit_mb, self._tmpdir)

    def _instructions(self) -> str:
        return (
            "Python runs in Pyodide (WebAssembly) inside a Deno sandbox; variables persist across executions. "
            "There is no network, no environment variables, no subprocesses, no host files, and no packages "
            "beyond Pyodide's standard library. Each execution may "
            f"run for at most {self.timeout_s:g} s of sandbox time (time spent inside tool calls does not count); "
            "past that it is stopped and the REPL restarts with its data reloaded, but the variables you defined "
            "are lost, so keep each step small."
        )


def _run_awaitable(awaitable: Any) -> Any:
    """Await an async tool's result from sync code, on a helper thread if this one runs an event loop."""

    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()
