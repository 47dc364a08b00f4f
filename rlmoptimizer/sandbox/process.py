"""The running Deno process: its bounded stderr, the interpreter that starts it with our environment, the
limits on what it may use (memory, CPU between cells) where the platform allows them (Linux), and ending it.

May import: the standard library, ``rlmoptimizer.sandbox._dspy``, ``.deno`` and ``.protocol``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
from typing import Any

from rlmoptimizer.sandbox._dspy import CodeInterpreterError, PythonInterpreter
from rlmoptimizer.sandbox.deno import deno_environment
from rlmoptimizer.sandbox.protocol import ProtocolReader

logger = logging.getLogger(__name__)

# Bounds on what is kept of Deno's stderr: a few lines, each short.
STDERR_LINES = 20
STDERR_LINE_CHARS = 600
_READ_CHUNK = 64 * 1024


# ---------------------------------------------------------------------------------------------- streams


class StreamTail:
    """Drains a text stream on a daemon thread, keeping only its last :data:`STDERR_LINES` lines, each cut to
    :data:`STDERR_LINE_CHARS` characters; a line without end costs no more memory than that. ``dropped``
    counts the characters not kept."""

    def __init__(self, stream: Any, name: str = "rlmoptimizer-deno-stderr") -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.dropped = 0
        self._partial = ""
        self._partial_cut = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, args=(stream,), name=name, daemon=True)
        self._thread.start()

    def _drain(self, stream: Any) -> None:
        try:
            while chunk := stream.read(_READ_CHUNK):
                self._feed(chunk)
        except (OSError, ValueError):
            pass
        finally:
            with self._lock:
                if self._partial:
                    self.lines.append(self._partial)
                    self._partial = ""
            try:
                stream.close()
            except (OSError, ValueError):
                pass

    def _feed(self, chunk: str) -> None:
        with self._lock:
            *complete, rest = chunk.split("\n")
            for piece in complete:
                line = self._partial + piece
                if len(line) > STDERR_LINE_CHARS:
                    self.dropped += len(line) - STDERR_LINE_CHARS
                    line = line[:STDERR_LINE_CHARS]
                if len(self.lines) == self.lines.maxlen:
                    self.dropped += len(self.lines[0])
                self.lines.append(line)
                self._partial = ""
            room = STDERR_LINE_CHARS - len(self._partial)
            self.dropped += max(0, len(rest) - room)
            self._partial += rest[: max(0, room)]

    def text(self, wait_s: float = 0.0) -> str:
        """What is kept, joined by newlines; waits up to ``wait_s`` for the stream to end first."""
        if wait_s > 0:
            self._thread.join(wait_s)
        with self._lock:
            lines = list(self.lines) + ([self._partial] if self._partial else [])
        return "\n".join(lines)


class DenoInterpreter(PythonInterpreter):
    """``PythonInterpreter`` whose Deno process gets :func:`deno_environment` instead of the host's, runs in a
    neutral working directory, has its stderr drained with a bound, its stdout read through a
    :class:`ProtocolReader`, and (on Linux) its writable memory capped at what it used once started plus
    ``memory_limit_mb``.

    (Passing ``deno_command=`` makes ``PythonInterpreter`` copy the whole host environment and skip its
    version check; the check runs once in :class:`~rlmoptimizer.sandbox.Sandbox`.)"""

    stderr: StreamTail | None = None
    reader: ProtocolReader | None = None
    workdir: str | None = None
    deno_dir: str | None = None  # the process's own DENO_DIR (deno.own_deno_dir), or None for the shared one
    memory_limit_mb: int | None = None
    data_limit_bytes: int | None = None
    _in_send_request = False

    def _spawn_process(self) -> None:
        try:
            process = subprocess.Popen(
                self.deno_command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                encoding="UTF-8",
                errors="replace",
                env=deno_environment(deno_dir=self.deno_dir),
                cwd=self.workdir,
            )
        except OSError as e:
            raise CodeInterpreterError(f"Could not start Deno ({self.deno_command[0]}): {e}") from e
        # PythonInterpreter reads stderr only after the process exits, and skips it when it is None; a full
        # pipe would block Deno, so it is drained here.
        stderr, process.stderr = process.stderr, None
        self.stderr = StreamTail(stderr)
        self.reader = ProtocolReader(process.stdout.detach())  # the binary stream, read in chunks
        process.stdout = self.reader
        self.deno_process = process
        self._health_check()
        self.data_limit_bytes = cap_process_memory(process.pid, self.memory_limit_mb)

    def _next_request_id(self) -> str:
        request_id = super()._next_request_id()
        if self.reader is not None:
            self.reader.expect(request_id, executing=not self._in_send_request)
        return request_id

    def _send_request(self, method: str, params: dict, context: str) -> dict:
        self._in_send_request = True  # not an execution of the agent's code
        try:
            return super()._send_request(method, params, context)
        finally:
            self._in_send_request = False

    def stderr_text(self, wait_s: float = 0.0) -> str:
        return self.stderr.text(wait_s) if self.stderr is not None else ""


# ---------------------------------------------------------------------------------------------- process limits


def _proc_status(pid: int) -> dict[str, int]:
    values = {}
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                values[key] = int(parts[0]) * 1024
    return values


def cap_process_memory(pid: int, memory_limit_mb: int | None) -> int | None:
    """Cap the writable memory (``RLIMIT_DATA``) of the running process ``pid`` at what it uses now plus
    ``memory_limit_mb``; the cap in bytes, or None where the platform has no such limit (only Linux has
    ``prlimit`` and ``/proc``). Past the cap, an allocation fails: a JavaScript buffer raises ``RangeError``,
    and an allocation Deno cannot refuse ends the process."""
    if memory_limit_mb is None or not sys.platform.startswith("linux"):
        return None
    try:
        import resource

        used = _proc_status(pid).get("VmData")
        if used is None:
            return None
        limit = used + memory_limit_mb * 1024 * 1024
        resource.prlimit(pid, resource.RLIMIT_DATA, (limit, limit))
        return limit
    except (ImportError, AttributeError, OSError, ValueError) as e:
        logger.warning("Could not cap the sandbox process's memory: %s", e)
        return None


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system, all threads, Workers included) process ``pid`` has used, or None if it
    cannot be read (not Linux, or the process is gone)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


_OUT_OF_MEMORY = re.compile(
    r"out of memory|\bOOM\b|allocation failed|Cannot allocate memory|memory allocation of \d+ bytes failed|"
    r"Fatal (?:JavaScript|process) out of memory|Reached heap limit",
    re.I,
)


def ran_out_of_memory(stderr: str) -> bool:
    """Whether Deno's last words say it ran out of memory."""
    return bool(_OUT_OF_MEMORY.search(stderr))


# ---------------------------------------------------------------------------------------------- ending it


def alive(interp: DenoInterpreter | None) -> bool:
    """Whether ``interp`` has a running process whose session has not ended."""
    if interp is None or interp._session_ended or interp.deno_process is None:
        return False
    return interp.deno_process.poll() is None


def kill(interp: DenoInterpreter) -> None:
    process = interp.deno_process
    if process is not None and process.poll() is None:
        process.kill()


def stop(interp: DenoInterpreter) -> None:
    """End the process of ``interp`` (politely if it is idle) and close its pipes."""
    if interp.deno_process is None:
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
