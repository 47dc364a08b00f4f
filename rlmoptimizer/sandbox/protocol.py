"""The channel from the sandbox to the host, read as untrusted input.

Deno's standard output carries dspy's JSON-RPC messages, but code running in the sandbox can write to it too
(``js.console.log``, ``js.Deno.stdout.writeSync``, a Worker, a timer). :class:`ProtocolReader` stands between
that stream and ``PythonInterpreter``, which reads it with ``readline()``:

- **Bounded.** Lines are read in 64 KiB chunks; a line longer than :data:`MAX_LINE_BYTES` is not kept (its
  first and last bytes are, to find the request it answers), so a flood without a newline costs the host no
  more than that. An execution whose answer was cut is answered with an ``OutputTooLarge`` error.
- **Validated.** Only what dspy's runner itself sends reaches ``PythonInterpreter``: answers to the request in
  flight, well-formed tool calls, and a few notifications per request. Lines that are not JSON (console output,
  Pyodide's package messages) are dropped. Answers to anything else (a stale or forged id) are dropped.
  Malformed protocol messages (a tool call without an id or with ``params`` that is not an object, an
  unknown method) are dropped, and the execution in flight fails with a ``ProtocolError`` the agent sees.

May import: the standard library only.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

logger = logging.getLogger(__name__)

MAX_LINE_BYTES = 32 * 1024 * 1024
"""The longest line kept from the sandbox: an execution's answer carries its printed output."""

_READ_CHUNK = 64 * 1024
_EDGE_BYTES = 4096  # kept from each end of an oversize line
_NOTIFICATIONS_PER_REQUEST = 20  # PythonInterpreter gives up after 100 skipped lines
_RUNTIME_ERROR = -32007  # dspy's JSONRPC_APP_ERRORS["RuntimeError"]: raised as CodeExecutionError
_TAIL_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"\s*\}\s*$')


class _Oversize:
    def __init__(self, size: int, tail: bytes) -> None:
        self.size, self.tail = size, tail


def _describe(line: str) -> str:
    text = " ".join(line.split())
    return text if len(text) <= 120 else text[:117] + "..."


class ProtocolReader:
    """A ``readline()`` over Deno's stdout (a binary stream with ``read1``) that bounds and validates lines.

    The interpreter calls :meth:`expect` with the id of each request it sends (``executing`` for an execution
    of the agent's code, whose answer may be turned into an error)."""

    def __init__(self, raw: Any, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._raw = raw
        self._max = max_line_bytes
        self._buffer = bytearray()
        self._scanned = 0  # bytes of _buffer known to hold no newline
        self._eof = False
        self._expected: str | None = None
        self._executing = False
        self._notifications = 0
        self.violations: list[str] = []  # protocol violations seen during the request in flight
        self._oversize_bytes = 0  # the longest line cut during the request in flight
        self.dropped_lines = 0

    # ------------------------------------------------------------------ the interpreter's side

    def expect(self, request_id: str, executing: bool) -> None:
        self._expected, self._executing = request_id, executing
        self._notifications = 0
        self.violations = []
        self._oversize_bytes = 0

    def readline(self) -> str:
        """The next line PythonInterpreter may see (with its newline), or ``""`` at the end of the stream."""
        while True:
            raw = self._raw_line()
            if raw is None:
                return ""
            if isinstance(raw, _Oversize):
                line = self._oversize(raw)
            else:
                line = self._check(raw.decode("utf-8", errors="replace").strip())
            if line is not None:
                return line + "\n"

    def close(self) -> None:
        try:
            self._raw.close()
        except (OSError, ValueError):
            pass

    # ------------------------------------------------------------------ validation

    def _check(self, line: str) -> str | None:
        if not line.startswith("{"):
            return self._drop(line)
        try:
            message = json.loads(line)
        except ValueError:
            return self._drop(line)
        if not isinstance(message, dict):
            return self._drop(line)
        method = message.get("method")
        if method is not None:
            if method == "tool_call" and self._valid_tool_call(message):
                return line
            if "id" not in message and isinstance(method, str) and method != "tool_call":
                self._notifications += 1  # e.g. the runner's unhandled_error diagnostic
                return line if self._notifications <= _NOTIFICATIONS_PER_REQUEST else self._drop(line)
            return self._violation(line)
        if "result" in message or "error" in message:
            if self._expected is not None and message.get("id") == self._expected:
                return self._answer(message, line)
            logger.debug("Dropping a sandbox answer to no request in flight: %s", _describe(line))
            return self._drop(line)
        return self._violation(line)

    @staticmethod
    def _valid_tool_call(message: dict) -> bool:
        params = message.get("params")
        return (
            isinstance(message.get("id"), str)
            and isinstance(params, dict)
            and isinstance(params.get("name"), str)
            and isinstance(params.get("kwargs", {}), dict)
        )

    def _answer(self, message: dict, line: str) -> str:
        """The answer to the request in flight; an error instead if the sandbox broke the protocol meanwhile."""
        if self._executing and self._oversize_bytes:
            return self._error_line(message.get("id"), "OutputTooLarge", self._too_large_text())
        if not (self._executing and self.violations):
            return self._as_python_shows(message, line)
        count = len(self.violations)
        shown = "; ".join(self.violations[:3])
        text = (
            f"this code (or something it started earlier) wrote {count} line{'s' if count > 1 else ''} to the "
            f"sandbox's channel to the host (Deno's standard output) that {'are' if count > 1 else 'is'} not a "
            f"valid message: {shown}. They were ignored and this execution counts as failed. Use print() for "
            "output and call tools as functions."
        )
        return self._error_line(message.get("id"), "ProtocolError", text)

    @staticmethod
    def _as_python_shows(message: dict, line: str) -> str:
        """An execute's error with its arguments as Python shows them: dspy's host writes ``"Type: {args}"`` with
        the list the runner sends, so every error read ``ValueError: ['message']``; one argument is sent as itself,
        several as a tuple (``str()`` of the exception)."""
        error = message.get("error")
        data = error.get("data") if isinstance(error, dict) else None
        args = data.get("args") if isinstance(data, dict) else None
        if not isinstance(args, list) or not args:
            return line
        data["args"] = str(args[0]) if len(args) == 1 else str(tuple(args))
        return json.dumps(message)

    def _violation(self, line: str) -> None:
        self.violations.append(_describe(line))
        logger.warning("The sandbox wrote a malformed protocol message (ignored): %s", _describe(line))
        return self._drop(line)

    def _drop(self, line: str) -> None:
        self.dropped_lines += 1
        return None

    def _oversize(self, raw: _Oversize) -> str | None:
        """An oversize line: whatever message ends it (dspy's runner writes its messages after whatever the
        sandboxed code left without a newline) is read as a line of its own; an answer to the request in flight
        that is itself too long becomes an error."""
        self._oversize_bytes = max(self._oversize_bytes, raw.size)
        start = raw.tail.rfind(b'{"jsonrpc"')
        if start >= 0:
            line = self._check(raw.tail[start:].decode("utf-8", errors="replace").strip())
            if line is not None:
                return line
        match = _TAIL_ID.search(raw.tail)
        found = match.group(1).decode("utf-8", errors="replace") if match else None
        if found is not None and found == self._expected:
            return self._error_line(found, "OutputTooLarge", self._too_large_text())
        return None

    def _too_large_text(self) -> str:
        return (
            f"this code wrote {self._oversize_bytes / 2**20:.0f} MiB of output (all of a cell's output comes back as "
            f"one message), more than the "
            f"{self._max / 2**20:.0f} MiB the sandbox passes back; it was discarded and this execution counts as "
            "failed. Print less (a summary, a slice) and keep large data in variables."
        )

    @staticmethod
    def _error_line(request_id: Any, kind: str, text: str) -> str:
        error = {"code": _RUNTIME_ERROR, "message": text, "data": {"type": kind, "args": []}}
        return json.dumps({"jsonrpc": "2.0", "error": error, "id": request_id})

    # ------------------------------------------------------------------ bounded line splitting

    def _raw_line(self) -> bytes | _Oversize | None:
        while True:
            at = self._buffer.find(b"\n", self._scanned)
            if at >= 0:
                line = bytes(self._buffer[:at])
                del self._buffer[: at + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buffer)
            if len(self._buffer) > self._max:
                return self._skip_rest()
            if self._eof:
                if not self._buffer:
                    return None
                line = bytes(self._buffer)
                self._buffer.clear()
                self._scanned = 0
                return line
            self._fill()

    def _fill(self) -> None:
        try:
            chunk = self._raw.read1(_READ_CHUNK)
        except (OSError, ValueError):
            chunk = b""
        if chunk:
            self._buffer += chunk
        else:
            self._eof = True

    def _skip_rest(self) -> _Oversize:
        """Read to the end of an oversize line keeping only its tail; what follows stays buffered."""
        size = len(self._buffer)
        tail = bytes(self._buffer[-_EDGE_BYTES:])
        self._buffer.clear()
        self._scanned = 0
        while not self._eof:
            self._fill()
            at = self._buffer.find(b"\n")
            if at >= 0:
                size += at
                tail = (tail + bytes(self._buffer[:at]))[-_EDGE_BYTES:]
                del self._buffer[: at + 1]
                return _Oversize(size, tail)
            size += len(self._buffer)
            tail = (tail + bytes(self._buffer))[-_EDGE_BYTES:]
            self._buffer.clear()
        return _Oversize(size, tail)
