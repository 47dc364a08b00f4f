"""The Deno process behind the sandbox: its command, its environment, its streams, and what a failed start means.

- **Command.** ``PythonInterpreter``'s default command plus an import map that points every
  ``https://deno.land/std`` import of dspy's ``runner.js`` at a module shipped in ``assets/`` (so only the npm
  ``pyodide`` package must be reachable once, or already in Deno's cache), the explicit denials of
  :data:`DENO_FLAGS` and a cap on WebAssembly memory.
- **Environment.** A short allow-list of the host's (:func:`deno_environment`): API keys never reach the
  process. Deno ignores the CA settings Python and pip honour, so a machine behind a TLS-inspecting proxy
  could not download Pyodide; :func:`tls_trust` hands Deno the CA bundle the environment names for Python
  (or the system store), unless the user configured Deno's TLS already. This only affects Deno's own
  downloads: sandboxed code has no network at all.
- **Streams.** Deno's stderr is drained on a thread with a bound (:class:`StreamTail`) and its stdout is read
  through :class:`~rlmoptimizer.sandbox.protocol.ProtocolReader` (bounded lines, validated messages): a flood
  or a forged message costs no host memory and cannot derail the host.
- **Memory.** On Linux the whole process's writable memory is capped (``RLIMIT_DATA``): what it used once
  started plus ``memory_limit_mb``, so JavaScript buffers outside the WebAssembly heap are bounded too.
- **A failed start** is explained by :func:`explain_start_failure`: Deno's own words, the download that
  failed, and what to do.

May import: the standard library, ``rlmoptimizer.errors`` and ``rlmoptimizer.sandbox._dspy``.
"""

from __future__ import annotations

import collections
import configparser
import contextlib
import functools
import inspect
import json
import logging
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlmoptimizer.errors import SandboxError
from rlmoptimizer.sandbox._dspy import CodeInterpreterError, PythonInterpreter, _validate_deno_version
from rlmoptimizer.sandbox.protocol import ProtocolReader

logger = logging.getLogger(__name__)

# Deno flags added to PythonInterpreter's command. PythonInterpreter already grants nothing but reading the
# runner, Deno's cache (revoked by runner.js once Pyodide is loaded) and the mounted files; these make the
# denials explicit (an explicit deny also wins over any allow a future dspy might add) and turn off prompts.
# Checked with Deno 2.9: Pyodide still loads from the npm cache and mounting still works with all of them.
DENO_FLAGS = (
    "--no-prompt",
    "--deny-net",
    "--deny-env",
    "--deny-run",
    "--deny-ffi",
    "--deny-sys",
    "--deny-write",
)

ASSETS_DIR = Path(__file__).resolve().parent / "assets"

# Local stand-ins for the deno.land std modules runner.js imports, by path below `std@<version>/`.
_LOCAL_STD_MODULES = {"io/mod.ts": "std_io.ts"}
_DENO_LAND_IMPORT = re.compile(r"""(?:import|export)\b[^'"]*?['"](https://deno\.land/[^'"]+)['"]""")
_STD_URL = re.compile(r"https://deno\.land/std@[^/]+/(.+\.ts)")
_ANY_REMOTE_IMPORT = re.compile(r"""(?:import|export)\b[^'"]*?['"](https?://[^'"]+)['"]""")
_PYODIDE_IMPORT = re.compile(r"""['"]npm:pyodide@([^/'"]+)""")

# Environment the Deno process keeps: what Deno needs to find its cache, reach the npm registry the first
# time (proxies, certificates, registry settings) and run on Windows. Everything else (API keys...) is
# dropped; Deno could not show it to sandboxed code anyway (no --allow-env), this is defense in depth.
_ENV_KEEP = frozenset({
    "PATH", "HOME", "USERPROFILE", "LOCALAPPDATA", "APPDATA", "SYSTEMROOT", "SYSTEMDRIVE", "WINDIR",
    "TMPDIR", "TEMP", "TMP", "XDG_CACHE_HOME", "LANG", "LC_ALL", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
})
_ENV_KEEP_PREFIXES = ("DENO_", "NPM_CONFIG_")

# Where the host names a CA bundle for Python and pip, in the order we look: OpenSSL's own variable (Python's
# ssl module honours it), then requests', curl's, pip's and Node's. pip's config files come after PIP_CERT.
_CA_BUNDLE_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT")
_NODE_CA_VARIABLE = "NODE_EXTRA_CA_CERTS"

# One 64 KiB WebAssembly page.
_WASM_PAGE = 64 * 1024

# Bounds on what is kept of Deno's stderr: a few lines, each short.
STDERR_LINES = 20
STDERR_LINE_CHARS = 600
_READ_CHUNK = 64 * 1024


# ---------------------------------------------------------------------------------------------- command


def runner_source() -> str:
    """The source of dspy's ``runner.js``."""
    return (Path(inspect.getfile(PythonInterpreter)).parent / "runner.js").read_text(encoding="utf-8")


def pyodide_version(source: str | None = None) -> str | None:
    """The Pyodide version dspy's runner imports from npm, e.g. ``"0.29.4"``."""
    match = _PYODIDE_IMPORT.search(runner_source() if source is None else source)
    return match.group(1) if match else None


def build_import_map(source: str, assets_dir: Path = ASSETS_DIR) -> dict[str, dict[str, str]]:
    """The Deno import map sending each ``https://deno.land/std@<v>/<path>`` import of ``source`` (dspy's
    runner) to a local module. Raises ``SandboxError`` for a deno.land import there is no local module for."""
    imports: dict[str, str] = {}
    for url in sorted(set(_DENO_LAND_IMPORT.findall(source))):
        match = _STD_URL.fullmatch(url)
        local = _LOCAL_STD_MODULES.get(match.group(1)) if match else None
        if local is None:
            raise SandboxError(
                f"dspy's sandbox runner imports {url}, which rlmoptimizer cannot serve offline "
                f"(it provides {sorted(_LOCAL_STD_MODULES)} of deno.land/std). Use the dspy version "
                "rlmoptimizer supports, or add a local module for it to rlmoptimizer/sandbox/assets/."
            )
        imports[url] = (assets_dir / local).resolve().as_uri()
    for url in sorted(set(_ANY_REMOTE_IMPORT.findall(source)) - set(imports)):
        logger.warning("dspy's sandbox runner imports %s; the sandbox needs the network to start.", url)
    return {"imports": imports}


def build_command(read_paths: list[str], memory_limit_mb: int, workdir: str) -> list[str]:
    """PythonInterpreter's default command plus an import map (written to ``workdir``), :data:`DENO_FLAGS`
    and the WebAssembly memory cap."""
    try:
        default = PythonInterpreter(enable_read_paths=read_paths)
    except CodeInterpreterError as e:
        raise SandboxError(f"The sandbox files cannot be mounted: {e}") from e
    import_map = build_import_map(Path(default._get_runner_path()).read_text(encoding="utf-8"))
    map_path = os.path.join(workdir, "import_map.json")
    with open(map_path, "w", encoding="utf-8") as f:
        json.dump(import_map, f)
    command = list(default.deno_command)
    if any(arg.startswith(("--allow-net", "--allow-env", "--allow-write", "--allow-run")) for arg in command):
        raise SandboxError(f"dspy's default Deno command grants more than reading files: {command}")
    pages = memory_limit_mb * 1024 * 1024 // _WASM_PAGE
    at = command.index("run") + 1
    command[at:at] = [f"--import-map={map_path}", *DENO_FLAGS, f"--v8-flags=--wasm-max-mem-pages={pages}"]
    return command


@functools.cache
def check_deno_version(deno_executable: str) -> None:
    try:
        _validate_deno_version(deno_executable)
    except CodeInterpreterError as e:
        raise SandboxError(str(e)) from e


def deno_version(deno_executable: str) -> str | None:
    """``deno --version``'s first line, e.g. ``"deno 2.5.6 (stable, release, x86_64-unknown-linux-gnu)"``."""
    try:
        result = subprocess.run([deno_executable, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.splitlines()[0].strip() if result.returncode == 0 and result.stdout else None


def deno_cache_dir(deno_executable: str) -> str | None:
    """Deno's cache directory: ``DENO_DIR`` when set, else where ``deno info`` says it is."""
    return PythonInterpreter._get_deno_dir(deno_executable)


# ---------------------------------------------------------------------------------------------- environment


@dataclass(frozen=True)
class TlsTrust:
    """What Deno is told to trust for its downloads, and where that choice came from."""

    env: dict[str, str] = field(default_factory=dict)
    """Variables added to Deno's environment (``DENO_CERT`` or ``DENO_TLS_CA_STORE``); empty if none."""
    source: str = ""
    """Human-readable origin, e.g. ``"SSL_CERT_FILE=/etc/ssl/certs/ca.pem"`` or ``"DENO_CERT (yours)"``."""


def _pip_config_cert(environ: dict[str, str]) -> str | None:
    """The ``cert`` setting of pip's configuration files (the last file that sets it wins, as in pip; with
    ``PIP_CONFIG_FILE`` set to the null device, pip reads none)."""
    if environ.get("PIP_CONFIG_FILE") == os.devnull:
        return None
    home = environ.get("HOME") or os.path.expanduser("~")
    config_home = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    candidates = ["/etc/xdg/pip/pip.conf", "/etc/pip.conf"]
    if sys.platform == "win32":
        candidates += [os.path.join(environ.get("APPDATA", ""), "pip", "pip.ini")]
    candidates += [
        os.path.join(home, ".pip", "pip.conf"),
        os.path.join(config_home, "pip", "pip.conf"),
        os.path.join(sys.prefix, "pip.conf"),
    ]
    if environ.get("PIP_CONFIG_FILE"):
        candidates.append(environ["PIP_CONFIG_FILE"])
    cert = None
    for path in candidates:
        if not os.path.isfile(path):
            continue
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        for section in ("global", "install", "download"):
            if parser.has_option(section, "cert"):
                cert = parser.get(section, "cert").strip() or cert
    return cert


def tls_trust(environ: dict[str, str] | None = None) -> TlsTrust:
    """What Deno should trust for its downloads.

    - ``DENO_CERT`` or ``DENO_TLS_CA_STORE`` set by the user: left as they are.
    - Else the first existing file named by ``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``,
      ``PIP_CERT``, pip's ``cert`` setting or ``NODE_EXTRA_CA_CERTS`` becomes ``DENO_CERT``: the bundle the
      user's Python, pip or npm already trusts (a company proxy's CA lives there). Deno keeps its own roots too.
    - Else ``DENO_TLS_CA_STORE=system,mozilla``: the operating system's store (where ``update-ca-certificates``,
      the macOS keychain or Windows put a company CA, and what Python's ``ssl`` module trusts by default)
      before Deno's bundled roots.
    """
    environ = dict(os.environ) if environ is None else environ
    for name in ("DENO_CERT", "DENO_TLS_CA_STORE"):
        if environ.get(name):
            return TlsTrust({}, f"{name}={environ[name]} (set by you)")
    candidates = [(name, environ.get(name)) for name in _CA_BUNDLE_VARIABLES]
    candidates.append(("pip's cert setting", _pip_config_cert(environ)))
    candidates.append((_NODE_CA_VARIABLE, environ.get(_NODE_CA_VARIABLE)))
    for name, path in candidates:
        if not path:
            continue
        if os.path.isfile(path):
            return TlsTrust({"DENO_CERT": path}, f"DENO_CERT={path} (from {name})")
        logger.warning("%s names %r, which is not a file; the sandbox does not pass it on to Deno.", name, path)
    return TlsTrust({"DENO_TLS_CA_STORE": "system,mozilla"}, "DENO_TLS_CA_STORE=system,mozilla (the system store)")


def deno_environment(source: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the Deno process starts with: a short allow-list of ``source`` (``os.environ``) plus
    :func:`tls_trust`'s variables."""
    source = dict(os.environ) if source is None else source
    env = {
        key: value
        for key, value in source.items()
        if key.upper() in _ENV_KEEP or key.upper().startswith(_ENV_KEEP_PREFIXES)
    }
    env.update(tls_trust(source).env)
    env["DENO_NO_PACKAGE_JSON"] = "1"  # what PythonInterpreter sets for its default command
    env["NO_COLOR"] = "1"  # plain diagnostics in messages
    return env


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
            self._partial += rest[:max(0, room)]

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
                env=deno_environment(),
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


# ---------------------------------------------------------------------------------------------- a failed start

_TLS_ERROR = re.compile(r"certificate|UnknownIssuer|CertNotValid|tls handshake|InvalidCertificate", re.I)
_NETWORK_ERROR = re.compile(
    r"tcp connect error|Connection refused|dns error|failed to lookup|Network is unreachable|timed out|"
    r"connection reset|proxy|No route to host|error sending request",
    re.I,
)
_URL = re.compile(r"https?://[^\s'\"):]+")


def offline_help(cache_dir: str | None) -> str:
    where = f" (here: {cache_dir})" if cache_dir else ""
    return (
        "On a machine without the registry: run `python -m rlmoptimizer.sandbox` once where https://registry.npmjs.org "
        f"is reachable, copy Deno's cache directory{where} to this machine, and point DENO_DIR at the copy."
    )


def explain_start_failure(stderr: str, exit_code: int | None, error: str, cache_dir: str | None,
                          trust: TlsTrust | None = None) -> str:
    """The message of a sandbox that did not start: what happened (in Deno's words), which download failed,
    and what to do."""
    trust = tls_trust() if trust is None else trust
    said = "\n".join(line for line in stderr.splitlines() if line.strip())
    urls = [url for url in _URL.findall(said) if "registry" in url or "npm" in url or "pyodide" in url]
    download = f" downloading {urls[0]}" if urls else ""
    version = pyodide_version()
    what = f"Pyodide {version} (the npm package pyodide)" if version else "Pyodide (the npm package pyodide)"
    status = f"Deno exited with code {exit_code}" if exit_code is not None else "Deno did not answer"
    words = "\nDeno said:\n  " + "\n  ".join(said.splitlines()[-8:]) if said else f" ({error})"
    if _TLS_ERROR.search(said):
        return (
            f"The sandbox could not start: Deno could not verify the TLS certificate{download}, so it could not "
            f"fetch {what} into its cache. {status}.{words}\n"
            f"Deno was told to trust: {trust.source}. A TLS-inspecting proxy (common on company networks) needs its "
            "CA bundle: set SSL_CERT_FILE (rlmoptimizer passes it on to Deno) or DENO_CERT to that PEM file, or "
            "install the CA in the system store and set DENO_TLS_CA_STORE=system. " + offline_help(cache_dir)
        )
    if _NETWORK_ERROR.search(said):
        proxies = ", ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.upper().endswith("_PROXY")) or "none"
        return (
            f"The sandbox could not start: Deno could not reach the npm registry{download} to fetch {what} into its "
            f"cache. {status}.{words}\nProxy settings passed to Deno: {proxies}. Check HTTPS_PROXY/NO_PROXY "
            "(and NPM_CONFIG_REGISTRY for a registry mirror). " + offline_help(cache_dir)
        )
    if "npm" in said or "pyodide" in said.lower():
        return (
            f"The sandbox could not start: Deno could not load {what}{download}. {status}.{words}\n"
            + offline_help(cache_dir)
        )
    return f"The sandbox could not start: {status}.{words}"
