"""``python -m rlmoptimizer.sandbox``: fetch Pyodide into Deno's cache, start the sandbox, check its isolation,
and print one screen a person can act on, including which of the sandbox's protections this platform gives
(the memory cap of the whole process and the idle-CPU watch need Linux).

Run it once on a new machine (it is the prefetch step for an air-gapped one: run it where the npm registry is
reachable, then copy Deno's cache directory and point ``DENO_DIR`` at the copy). It exits with 0 when the
sandbox started and every isolation probe was refused, 1 otherwise.

May import: the standard library, ``rlmoptimizer.errors`` and the sandbox wing.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rlmoptimizer.errors import SandboxError
from rlmoptimizer.sandbox import deno, process
from rlmoptimizer.sandbox._dspy import CodeExecutionError
from rlmoptimizer.sandbox.sandbox import Sandbox

__all__ = ["Probe", "Protection", "CheckReport", "run_check", "isolation_probes", "platform_protections", "main"]

_SECRET = "rlmoptimizer-isolation-probe"


@dataclass(frozen=True)
class Probe:
    """One thing sandboxed code must not be able to do."""

    name: str
    passed: bool
    """True when the sandbox refused it (and, where the host can see it, nothing happened there)."""
    detail: str


@dataclass(frozen=True)
class Protection:
    """One limit the sandbox puts on its process, and whether this platform gives it."""

    name: str
    active: bool
    detail: str


@dataclass
class CheckReport:
    """What ``python -m rlmoptimizer.sandbox`` found."""

    deno_version: str | None = None
    pyodide_version: str | None = None
    cache_dir: str | None = None
    trust: str = ""
    pyodide_was_cached: bool = False
    first_start_s: float | None = None
    """The first start, including the download of Pyodide when it was not cached."""
    cold_start_s: float | None = None
    """A start with Pyodide in Deno's cache: what every optimization pays once."""
    probes: list[Probe] = field(default_factory=list)
    protections: list[Protection] = field(default_factory=list)
    """What limits the process on this platform (informative: a protection the platform lacks is not a failure)."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.probes) and all(probe.passed for probe in self.probes)

    def render(self) -> str:
        def seconds(value: float | None) -> str:
            return f"{value:.1f} s" if value is not None else "-"

        lines = [
            "rlmoptimizer sandbox check",
            f"  Deno:        {self.deno_version or 'not found'}",
            f"  Pyodide:     {self.pyodide_version or 'unknown'} (npm package pyodide)",
            f"  Deno cache:  {self.cache_dir or 'unknown'} (set DENO_DIR to use another)",
            f"  TLS trust:   {self.trust}",
            f"  Pyodide was {'already in the cache' if self.pyodide_was_cached else 'downloaded into the cache'}",
            f"  first start: {seconds(self.first_start_s)}; cold start with the cache: {seconds(self.cold_start_s)}",
        ]
        if self.error:
            lines += ["", "FAILED: the sandbox did not start.", self.error]
            return "\n".join(lines)
        lines.append("  isolation (sandboxed code must be refused):")
        lines += [f"    {'passed' if p.passed else 'FAILED'}  {p.name}: {p.detail}" for p in self.probes]
        if self.protections:
            lines.append(f"  protections on this platform ({sys.platform}):")
            lines += [f"    {'on ' if p.active else 'off'}  {p.name}: {p.detail}" for p in self.protections]
        lines.append("")
        lines.append(
            "OK: the sandbox works on this machine. To use it offline, copy the Deno cache above to the other "
            "machine and point DENO_DIR at it."
            if self.ok
            else "FAILED: the sandbox is not isolated as it should be; do not run optimizations here."
        )
        return "\n".join(lines)


def _pyodide_cached(cache_dir: str | None, version: str | None) -> bool:
    if not cache_dir or not version:
        return False
    return os.path.isdir(os.path.join(cache_dir, "npm", "registry.npmjs.org", "pyodide", version))


class _RecordingServer:
    """An HTTP server on 127.0.0.1 that records every request path (to see whether sandboxed code reached it)."""

    def __init__(self) -> None:
        paths = self.paths = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                paths.append(self.path)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"reached")

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class ConnectRecorder:
    """A proxy on 127.0.0.1 that records the request line of each connection it gets (a download attempt sent
    through it), then closes it."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(5)
                try:
                    self.lines.append(connection.recv(4096).decode("latin-1").split("\r\n", 1)[0])
                except OSError:
                    pass

    def close(self) -> None:
        self._socket.close()


_PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY")

# A module import from the page and from a Node worker thread (a scope of its own): the cell returns only if one
# loaded.
_WORKER_JS = (
    "import('npm:left-pad@1.3.0').then(() => 'loaded', () => 'refused')"
    ".then((r) => require('worker_threads').parentPort.postMessage(r))"
)
_PAGE_JS = """(async () => {
  const out = [];
  try { await import("https://esm.sh/left-pad@1.3.0"); out.push("page"); } catch (e) {}
  const m = await import("node:worker_threads");
  const w = new m.Worker(globalThis.rlmoptimizer_probe, { eval: true });
  if (await new Promise((done) => w.on("message", done)) === "loaded") out.push("worker");
  await w.terminate();
  return out.join(",");
})()"""
_DOWNLOAD = (
    "import js\n"
    f"js.globalThis.rlmoptimizer_probe = {json.dumps(_WORKER_JS)}\n"
    f"loaded = await js.eval({json.dumps(_PAGE_JS)})\n"
    "if not loaded:\n"
    "    raise PermissionError('refused from the page and from a worker thread')\n"
    "return loaded"
)


# The Cache API from a worker thread (the page has none): it needs no write permission and writes below DENO_DIR.
_WORKER_CACHE_JS = (
    "caches.open('rlmoptimizer-check').then((c) => c.put('http://check/x', new Response('x')))"
    ".then(() => 'stored', (e) => 'refused: ' + e).then((r) => require('worker_threads').parentPort.postMessage(r))"
)
_WORKER_SAYS = """(async () => {
  const m = await import("node:worker_threads");
  const w = new m.Worker(globalThis.rlmoptimizer_probe, { eval: true });
  const said = await new Promise((done) => { w.on("message", done); w.on("error", (e) => done("refused: " + e)); });
  await w.terminate();
  return said;
})()"""
_WORKER_CACHE = (
    "import js\n"
    f"js.globalThis.rlmoptimizer_probe = {json.dumps(_WORKER_CACHE_JS)}\n"
    f"said = await js.eval({json.dumps(_WORKER_SAYS)})\n"
    "if said != 'stored':\n"
    "    raise PermissionError(said)\n"
    "return said"
)


def download_probe(make_sandbox: Callable[[], Sandbox]) -> Probe:
    """Import a module from the npm registry and from esm.sh, from the page and from a worker thread, in a sandbox
    whose Deno sends every download through a :class:`ConnectRecorder`: passes when all are refused and not one
    attempt reached it (Pyodide is in the cache by then: its fetch sends nothing)."""
    recorder = ConnectRecorder()
    saved = {name: os.environ.get(name) for name in _PROXY_VARIABLES}
    sandbox = None
    try:
        os.environ.pop("NO_PROXY", None)
        os.environ.update({name: recorder.url for name in _PROXY_VARIABLES[:3]})
        sandbox = make_sandbox()
        sandbox.start()
        outcome = _attempt(sandbox, _DOWNLOAD)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if sandbox is not None:
            sandbox.shutdown()
        recorder.close()
    reached = f"; a download reached the network: {recorder.lines[0]}" if recorder.lines else ""
    return Probe("download a module", outcome.startswith("refused") and not recorder.lines, outcome + reached)


def _attempt(sandbox: Sandbox, code: str) -> str:
    """Run probe ``code`` (which returns a value when the forbidden thing worked); ``"refused: ..."`` if it raised.

    The error is caught inside the sandbox: an uncaught JavaScript permission error ends dspy's runner."""
    body = "\n".join("    " + line for line in code.splitlines())
    wrapped = (
        f"async def _probe():\n{body}\n"
        "try:\n    print('ALLOWED:', repr(await _probe()))\n"
        "except BaseException as _e:\n    print('refused:', type(_e).__name__, _e)\n"
    )
    try:
        output = str(sandbox.execute(wrapped))
    except CodeExecutionError as exc:
        output = "refused: " + str(exc)
    return " ".join(output.split())[:160]


def isolation_probes(sandbox: Sandbox) -> list[Probe]:
    """Try, from inside ``sandbox``, what its code must never do; each probe passes when it is refused."""
    probes = []
    with tempfile.TemporaryDirectory(prefix="rlmoptimizer-check-") as host_dir:
        secret_file = os.path.join(host_dir, "secret.txt")
        with open(secret_file, "w", encoding="utf-8") as f:
            f.write(_SECRET)
        target = os.path.join(host_dir, "written.txt")
        server = _RecordingServer()
        try:
            cases: list[tuple[str, str, Callable[[str], bool]]] = [
                (
                    "read a host file",
                    f"import js\nreturn js.Deno.readTextFileSync({secret_file!r})",
                    lambda out: _SECRET not in out,
                ),
                (
                    "write a host file",
                    f"import js\nreturn js.Deno.writeTextFileSync({target!r}, 'x')",
                    lambda out: not os.path.exists(target),
                ),
                ("read the environment", "import js\nreturn js.Deno.env.get('PATH')", lambda out: True),
                (
                    "reach the network",
                    f"import js\nreturn (await js.fetch({server.url + '/probe'!r})).status",
                    lambda out: not server.paths,
                ),
                (
                    "keep data on the host disk (web storage)",
                    "import js\nreturn js.eval(\"localStorage.setItem('rlmoptimizer-check', 'x')\")",
                    lambda out: True,
                ),
                (
                    "start a process",
                    "import js\nreturn js.eval(\"new Deno.Command('true').outputSync().code\")",
                    lambda out: True,
                ),
            ]
            if sandbox.own_deno_dir is not None:  # (else it would write to your Deno cache: a protection that is off)
                cases.insert(
                    -1, ("keep data on the host disk (a worker thread's Cache API)", _WORKER_CACHE, lambda out: True)
                )
            for name, code, host_clean in cases:
                outcome = _attempt(sandbox, code)
                passed = outcome.startswith("refused") and host_clean(outcome)
                probes.append(Probe(name, passed, outcome))
        finally:
            server.close()
    return probes


def platform_protections(sandbox: Sandbox) -> list[Protection]:
    """Which limits the running ``sandbox`` has on this platform, read from its live process."""
    interp = sandbox._interp
    pid = sandbox.process_id
    wasm_cap = any(arg.startswith("--v8-flags=--wasm-max-mem-pages=") for arg in sandbox.deno_command)
    data_limit = interp.data_limit_bytes if interp is not None else None
    cpu_readable = pid is not None and process.cpu_seconds(pid) is not None
    return [
        Protection(
            "time limit per cell",
            True,
            f"{sandbox.timeout_s:g} s per execute, {sandbox.start_timeout_s:g} s to start (a watchdog thread: "
            "every platform)",
        ),
        Protection(
            "Pyodide memory cap",
            wasm_cap,
            f"{sandbox.memory_limit_mb} MB of WebAssembly memory, then MemoryError (a V8 flag: every platform)"
            if wasm_cap
            else "the Deno command has no --wasm-max-mem-pages flag",
        ),
        Protection(
            "process memory cap",
            data_limit is not None,
            f"the whole Deno process may add {sandbox.memory_limit_mb} MB (JavaScript buffers included) to "
            "what it used once started (RLIMIT_DATA)"
            if data_limit is not None
            else f"off on {sys.platform}: it needs Linux (prlimit and /proc); only the Pyodide memory cap bounds "
            "the process, so JavaScript buffers made from Python can grow without bound",
        ),
        Protection(
            "a Deno cache directory of its own",
            sandbox.own_deno_dir is not None,
            "nothing a cell stores reaches your disk or a later sandbox (a worker thread's Cache API has no room to "
            "write)"
            if sandbox.own_deno_dir is not None
            else "off: symbolic links cannot be made here, so the sandbox uses your Deno cache, where a worker thread's "
            "Cache API can keep data between runs",
        ),
        Protection(
            "idle-CPU watch",
            cpu_readable,
            "a process that keeps computing between cells (a thread or timer a cell left running) is stopped"
            if cpu_readable
            else f"off on {sys.platform}: it needs Linux's /proc; work a cell leaves running keeps using CPU "
            "between cells",
        ),
    ]


def run_check(make_sandbox: Callable[[], Sandbox] = Sandbox) -> CheckReport:
    """Start a sandbox twice (the first start fetches Pyodide if needed), probe its isolation, and report."""
    report = CheckReport(trust=deno.tls_trust().source)
    probe_sandbox = make_sandbox()
    try:
        executable = probe_sandbox.deno_command[0]
        report.deno_version = deno.deno_version(executable)
        report.pyodide_version = deno.pyodide_version()
        report.cache_dir = deno.deno_cache_dir(executable)
        report.pyodide_was_cached = _pyodide_cached(report.cache_dir, report.pyodide_version)
        started = time.perf_counter()
        probe_sandbox.start()
        report.first_start_s = time.perf_counter() - started
        probe_sandbox.shutdown()
        probe_sandbox = make_sandbox()
        started = time.perf_counter()
        probe_sandbox.start()
        report.cold_start_s = time.perf_counter() - started
        report.protections = platform_protections(probe_sandbox)
        report.probes = isolation_probes(probe_sandbox)
        probe_sandbox.shutdown()
        report.probes.append(download_probe(make_sandbox))
    except SandboxError as exc:
        report.error = str(exc)
    finally:
        probe_sandbox.shutdown()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlmoptimizer.sandbox",
        description="Fetch Pyodide into Deno's cache, start rlmoptimizer's sandbox and check that it is isolated.",
    )
    parser.parse_args(argv)
    report = run_check()
    print(report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
