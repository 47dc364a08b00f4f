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

import json
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from typing import Any

from rlmoptimizer.errors import SandboxError
from rlmoptimizer.sandbox import deno, process
from rlmoptimizer.sandbox._dspy import CodeExecutionError, CodeInterpreterError, FinalOutput
from rlmoptimizer.sandbox.limits import INSTRUCTIONS, check_limits, instructions
from rlmoptimizer.sandbox.process import DenoInterpreter
from rlmoptimizer.sandbox.recovery import ProcessLost, SetupLog, restart_message, shorten
from rlmoptimizer.sandbox.session import Session
from rlmoptimizer.sandbox.tool_bridge import GLOBAL_NAMES_EXPR

__all__ = ["Sandbox"]

logger = logging.getLogger(__name__)


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
    execution_instructions: str = INSTRUCTIONS

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
            start_timeout_s: the most seconds starting the process may take, and the limit for each replayed
                execute; the first start on a machine downloads Pyodide from npm before it, within a limit of
                its own of the same length.
        """
        check_limits(timeout_s, start_timeout_s, replay_limit, memory_limit_mb)

        # configuration
        self.tools: dict[str, Callable[..., Any]] = dict(tools or {})
        self.output_fields: list[dict] | None = None
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.replay_limit = replay_limit
        self.memory_limit_mb = memory_limit_mb
        self.execution_instructions = instructions(self.timeout_s)

        # counters, readable by the caller
        self.restarts = 0
        self.timeouts = 0
        self.lost_variables_on_last_restart: list[str] = []

        # process state
        self._lock = threading.Lock()
        self._executing_thread: int | None = None
        self._session = Session()  # the process, its watchdog and tools
        self._deno_command: list[str] | None = None
        self._tmpdir: str | None = None
        self._deno_dir: str | None = None  # the process's own Deno cache directory (deno.own_deno_dir)
        self._finalizer: weakref.finalize | None = None
        self._closed = False
        self._broken: SandboxError | None = None
        self._background: threading.Thread | None = None
        self._background_error: BaseException | None = None
        self._notice = ""  # told to the agent with the next result (a restart it did not cause)
        self._replay_failures: list[str] = []  # setup steps that failed on the last restart
        self._setup = SetupLog()  # replay and variable bookkeeping

    @property
    def _interp(self) -> DenoInterpreter | None:
        """The interpreter of the running process, or None."""
        return self._session.interp

    @property
    def _user_names(self) -> list[str]:
        """The agent-defined globals after the last execute."""
        return self._setup.user_names

    # ------------------------------------------------------------------ public interface

    @property
    def deno_command(self) -> list[str]:
        """The command that starts the Deno process (built on first use)."""
        if self._deno_command is None:
            self._deno_command = self._build_deno_command()
        return list(self._deno_command)

    @property
    def own_deno_dir(self) -> str | None:
        """The Deno cache directory of this sandbox's own (:func:`deno.own_deno_dir`), or None when it uses the
        shared one (symbolic links cannot be made here)."""
        _ = self.deno_command  # (made with the command)
        return self._deno_dir

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
            except SyntaxError as exc:
                raise _explained(exc, code) from None
            finally:
                self._executing_thread = None
                self._session.watch_idle()

    def __call__(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        return self.execute(code, variables)

    def mark_setup_complete(self) -> None:
        """Make every execute that succeeded so far part of the setup replayed (in order, with its
        variables) after every restart; later executes are the agent's and are not replayed."""
        with self._lock:
            self._setup.mark_setup_complete(self.replay_limit)

    def shutdown(self) -> None:
        """Stop the process and release everything; the sandbox cannot be used afterwards. A start still running in
        the background is cut short (its process killed), not waited for: a compile() that fails before the agent
        (a broken metric) says so at once."""
        if self._executing_thread == threading.get_ident():
            raise CodeInterpreterError("The sandbox cannot be shut down from inside one of its own tools.")
        background = self._background
        if background is not None:
            self._closed = True  # a start that has not begun yet does not begin
            while background.is_alive():
                self._session.kill_start()  # its download of Pyodide, or its process
                background.join(timeout=0.05)
        with self._lock:
            self._closed = True
            self._session.close()
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
        elif not process.alive(self._interp):
            diagnostic = self._interp._last_diagnostic or "the process exited between cells"
            self._notice = self._recover(self._session.lost(self._interp, diagnostic, False), variables)

        try:
            result = self._call(code, variables, self.timeout_s)
        except ProcessLost as lost:
            submitted = self._session.tools.submission  # (a restart's replays reset it)
            message = self._recover(lost, variables)
            if submitted is not None:  # the process died after a SUBMIT the cell caught: the cell ended with it
                self._notice = message
                return FinalOutput(submitted)
            raise CodeExecutionError(message) from None
        except CodeExecutionError:
            self._after_execute(code, variables, succeeded=False)
            raise

        self._after_execute(code, variables, succeeded=True)
        if self._notice and (result is None or isinstance(result, str)):
            result, self._notice = f"{self._notice}\n{result or ''}", ""
        return result

    def _after_execute(self, code: str, variables: dict[str, Any], *, succeeded: bool) -> None:
        """Record a replayable execute and the agent's global names: those the execute reported as it ended
        (the runner hooks, see :mod:`.tool_bridge`), else listed by one extra call."""
        tools = self._session.tools
        names, tools.reported_names = tools.reported_names, None
        if names is None:
            names = self._global_names()
        if names is None:
            return
        self._setup.record(code, variables, names, self.tools, succeeded=succeeded, replay_limit=self.replay_limit)

    def _global_names(self) -> set[str] | None:
        """The REPL's public non-module globals, or None if they could not be listed."""
        try:
            listed = self._call(GLOBAL_NAMES_EXPR, {}, self.timeout_s)
            return set(json.loads(listed))
        except ProcessLost:
            return None  # noticed and recovered from on the next execute
        except (CodeExecutionError, SyntaxError, TypeError, ValueError) as e:
            logger.debug("Could not list the sandbox globals: %s", e)
            return None

    def _call(self, code: str, variables: dict[str, Any], limit: float) -> Any:
        """One ``PythonInterpreter.execute`` under the watchdog; ``ProcessLost`` if the process died."""
        return self._session.call(code, variables, limit, self.tools, self.output_fields)

    # ------------------------------------------------------------------ process lifecycle

    def _boot(self) -> None:
        """Start a process and bring it to the setup state; ``SandboxError`` on failure."""
        command = self.deno_command
        workdir = os.path.join(self._tmpdir, "work") if self._tmpdir else None
        self._session.start(command, workdir, self.memory_limit_mb, self.start_timeout_s, self._deno_dir)
        try:
            self._setup.pristine_names = self._global_names() or set()
            replay_failures = []
            for step, replay in enumerate(self._setup.replays(), start=1):
                try:
                    self._call(replay.code, replay.variables, self.start_timeout_s)
                except (CodeExecutionError, SyntaxError) as e:
                    replay_failures.append(f"setup step {step}: {shorten(str(e), 200)}")
            if replay_failures:
                logger.warning("Sandbox setup replay failed: %s", "; ".join(replay_failures))
            self._replay_failures = replay_failures
            names = self._global_names()
            if names is None:
                raise SandboxError("The sandbox did not answer after its setup.")
            self._setup.baseline_names = names | self._setup.baseline_names
        except ProcessLost as e:
            self._stop_process()
            raise SandboxError(f"The sandbox died during setup: {shorten(e.diagnostic)}") from e
        except (CodeExecutionError, SyntaxError, CodeInterpreterError) as e:
            self._stop_process()
            raise SandboxError(f"The sandbox setup failed: {shorten(str(e))}") from e
        except BaseException:
            self._stop_process()
            raise

    def _recover(self, lost: ProcessLost, variables: dict[str, Any]) -> str:
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
        lost_names = [name for name in lost_names if name not in self._setup.baseline_names]
        self.lost_variables_on_last_restart = lost_names
        self._setup.user_names = []
        return restart_message(
            lost,
            lost_names,
            self._setup.reloaded_names(self.tools),
            self._replay_failures,
            memory_limit_mb=self.memory_limit_mb,
            timeout_s=self.timeout_s,
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

    def _stop_process(self) -> None:
        """End the current process (politely if it is idle) and forget it."""
        self._session.stop()

    # ------------------------------------------------------------------ construction helpers

    def _build_deno_command(self) -> list[str]:
        """The Deno command (see :func:`deno.build_command`); its import map, working directory and Deno cache
        directory (:func:`deno.own_deno_dir`) live in a temporary directory removed with the sandbox."""
        self._tmpdir = tempfile.mkdtemp(prefix="rlmoptimizer-sandbox-")
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._tmpdir, ignore_errors=True)
        os.mkdir(os.path.join(self._tmpdir, "work"))
        command = deno.build_command([], self.memory_limit_mb, self._tmpdir)
        self._deno_dir = deno.own_deno_dir(command, self._tmpdir)
        return command


def _explained(error: SyntaxError, code: str) -> SyntaxError:
    """``error`` with what is wrong and where. The sandbox's runner reports a syntax error with a blank message
    ("Invalid Python syntax. message: "), which tells the agent nothing; the host's parser names the line and
    the cause. Code the host parses (a newer syntax than the host's Python knows) keeps the runner's error."""
    if str(error).split("message:", 1)[-1].strip():
        return error
    try:
        compile(code, "<cell>", "exec", dont_inherit=True)
    except SyntaxError as host:
        where = f"line {host.lineno}" if host.lineno else "the cell"
        text = (host.text or "").strip()
        return SyntaxError(f"Invalid Python syntax at {where}: {host.msg}" + (f": {text[:200]}" if text else ""))
    except (ValueError, OverflowError, MemoryError):  # e.g. null bytes in the code
        pass
    return error
