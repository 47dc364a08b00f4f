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
- The process itself (streams, memory, CPU) is :mod:`.process`; what a failed start means is
  :mod:`.start_failure`.

May import: the standard library, ``rlmoptimizer.errors`` and ``rlmoptimizer.sandbox._dspy``.
"""

from __future__ import annotations

import configparser
import functools
import inspect
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlmoptimizer.errors import SandboxError
from rlmoptimizer.sandbox._dspy import CodeInterpreterError, PythonInterpreter, _validate_deno_version

logger = logging.getLogger(__name__)

# Deno flags added to PythonInterpreter's command. PythonInterpreter already grants nothing but reading the
# runner, Deno's cache (revoked by runner.js once Pyodide is loaded) and the mounted files; these make the
# denials explicit (an explicit deny also wins over any allow a future dspy might add) and turn off prompts.
# Loading a module is not network access to Deno: --deny-net leaves import() of https: (deno.land, esm.sh, jsr.io
# by default) and npm: specifiers free to download. --deny-import refuses remote hosts and --cached-only any npm
# package not in the cache, so the running sandbox downloads nothing: Pyodide is fetched before it starts, by a
# process that runs no sandboxed code (:func:`fetch_command`).
# Checked with Deno 2.9: Pyodide still loads from the npm cache and mounting still works with all of them.
DENO_FLAGS = (
    "--no-prompt",
    "--deny-net",
    "--deny-env",
    "--deny-run",
    "--deny-ffi",
    "--deny-sys",
    "--deny-write",
    "--deny-import",
    "--cached-only",
)
# Flags of the run command the fetch repeats, so that it resolves the packages the same way (no config file, no
# lock file, no node_modules directory: nothing written to the user's project).
_RESOLUTION_FLAGS = ("--no-config", "--no-lock", "--node-modules-dir")

ASSETS_DIR = Path(__file__).resolve().parent / "assets"

# Local stand-ins for the deno.land std modules runner.js imports, by path below `std@<version>/`.
_LOCAL_STD_MODULES = {"io/mod.ts": "std_io.ts"}
_DENO_LAND_IMPORT = re.compile(r"""(?:import|export)\b[^'"]*?['"](https://deno\.land/[^'"]+)['"]""")
_STD_URL = re.compile(r"https://deno\.land/std@[^/]+/(.+\.ts)")
_ANY_REMOTE_IMPORT = re.compile(r"""(?:import|export)\b[^'"]*?['"](https?://[^'"]+)['"]""")
_PYODIDE_IMPORT = re.compile(r"""['"]npm:pyodide@([^/'"]+)""")
_NPM_IMPORT = re.compile(r"""(?:import|export)\b[^'"]*?['"](npm:[^'"]+)['"]""")

# Environment the Deno process keeps: what Deno needs to find its cache, reach the npm registry the first
# time (proxies, certificates, registry settings) and run on Windows. Everything else (API keys...) is
# dropped; Deno could not show it to sandboxed code anyway (no --allow-env), this is defense in depth.
_ENV_KEEP = frozenset(
    {
        "PATH",
        "HOME",
        "USERPROFILE",
        "LOCALAPPDATA",
        "APPDATA",
        "SYSTEMROOT",
        "SYSTEMDRIVE",
        "WINDIR",
        "TMPDIR",
        "TEMP",
        "TMP",
        "XDG_CACHE_HOME",
        "LANG",
        "LC_ALL",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
    }
)
_ENV_KEEP_PREFIXES = ("DENO_", "NPM_CONFIG_")

# Where the host names a CA bundle for Python and pip, in the order we look: OpenSSL's own variable (Python's
# ssl module honours it), then requests', curl's, pip's and Node's. pip's config files come after PIP_CERT.
_CA_BUNDLE_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT")
_NODE_CA_VARIABLE = "NODE_EXTRA_CA_CERTS"

# One 64 KiB WebAssembly page.
_WASM_PAGE = 64 * 1024


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


def own_deno_dir(run_command: list[str], into: str) -> str | None:
    """A Deno cache directory of one sandbox's own, made in ``into``, for its process's ``DENO_DIR``; None when
    the command names no shared cache or the link cannot be made (Windows without the right to make symlinks).

    Its ``npm`` is a link to the shared cache's (the one ``run_command`` may read and revokes once Pyodide is
    loaded), so Pyodide loads from where :func:`fetch` put it. Its ``location_data``, where Deno keeps what the Web
    storage APIs write, is an empty file: the Cache API, which a ``node:worker_threads`` thread still has (and
    which ignores ``--deny-write``), fails instead of writing to the user's disk, where a later sandbox could
    read it. What else Deno writes while it runs (its analysis and code caches) stays here and goes with the
    sandbox's temporary directory."""
    shared = next((arg.split("=", 1)[1] for arg in run_command if arg.startswith("--dspy-deno-dir=")), None)
    if not shared:
        return None
    own = os.path.join(into, "deno")
    try:
        os.mkdir(own)
        os.symlink(os.path.join(shared, "npm"), os.path.join(own, "npm"), target_is_directory=True)
        open(os.path.join(own, "location_data"), "x").close()
    except OSError as e:
        logger.warning("The sandbox uses Deno's shared cache %s (no directory of its own: %s).", shared, e)
        shutil.rmtree(own, ignore_errors=True)
        return None
    return own


def fetch_command(run_command: list[str], source: str | None = None) -> list[str] | None:
    """The ``deno cache`` command that brings the npm packages dspy's runner imports (Pyodide) into Deno's cache,
    resolved as ``run_command`` resolves them; None when the runner imports none. The sandbox runs with
    ``--cached-only``, so this runs first; it runs no code, and does nothing when the packages are cached."""
    packages = sorted(set(_NPM_IMPORT.findall(runner_source() if source is None else source)))
    if not packages:
        return None
    flags = [arg for arg in run_command if arg.startswith(_RESOLUTION_FLAGS)]
    return [run_command[0], "cache", "--quiet", *flags, *packages]


_FETCHED: set[tuple[str, ...]] = set()  # fetch commands that succeeded in this process, with their DENO_DIR


def fetch(
    run_command: list[str],
    cwd: str | None,
    timeout_s: float,
    started: Callable[[subprocess.Popen | None], None] = lambda process: None,
) -> tuple[int | None, str] | None:
    """Run :func:`fetch_command` (once per process for a command and ``DENO_DIR``); None when the packages are in
    the cache, else ``(exit code, or None when it ran out of timeout_s, Deno's stderr)``. ``started`` is handed the
    process while it runs (so that a shutdown can kill it), then None."""
    command = fetch_command(run_command)
    if command is None:
        return None
    env = deno_environment()
    key = (*command, env.get("DENO_DIR", ""))
    if key in _FETCHED:
        return None
    try:
        process = subprocess.Popen(
            command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
    except OSError as e:
        return 127, str(e)
    started(process)
    try:
        _, said = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        _, said = process.communicate()
        return None, said or ""
    finally:
        started(None)
    if process.returncode != 0:
        return process.returncode, said or ""
    _FETCHED.add(key)
    return None


MIN_DENO = (2, 4)
"""The oldest Deno with ``--deny-import`` (:data:`DENO_FLAGS`)."""


@functools.cache
def check_deno_version(deno_executable: str) -> None:
    try:
        _validate_deno_version(deno_executable)
    except CodeInterpreterError as e:
        raise SandboxError(str(e)) from e
    shown = deno_version(deno_executable) or ""
    found = re.match(r"deno (\d+)\.(\d+)", shown)
    if found and (int(found.group(1)), int(found.group(2))) < MIN_DENO:
        raise SandboxError(
            f"The sandbox needs Deno {'.'.join(map(str, MIN_DENO))} or newer (its --deny-import keeps sandboxed code "
            f"from downloading modules); {deno_executable} is {shown.split(' (')[0]}. Upgrade it (pip install -U "
            "'deno>=2.4' installs one in this environment, which dspy prefers)."
        )


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


def deno_environment(source: dict[str, str] | None = None, deno_dir: str | None = None) -> dict[str, str]:
    """The environment the Deno process starts with: a short allow-list of ``source`` (``os.environ``) plus
    :func:`tls_trust`'s variables, with ``DENO_DIR`` set to ``deno_dir`` when one is given (:func:`own_deno_dir`),
    else yours made absolute (Deno is started in another directory: a relative one would name another cache)."""
    source = dict(os.environ) if source is None else source
    env = {
        key: value
        for key, value in source.items()
        if key.upper() in _ENV_KEEP or key.upper().startswith(_ENV_KEEP_PREFIXES)
    }
    env.update(tls_trust(source).env)
    env["DENO_NO_PACKAGE_JSON"] = "1"  # what PythonInterpreter sets for its default command
    env["NO_COLOR"] = "1"  # plain diagnostics in messages
    env["DENO_NO_UPDATE_CHECK"] = "1"  # no request to dl.deno.land at each start
    if deno_dir:
        env["DENO_DIR"] = deno_dir
    elif env.get("DENO_DIR"):  # yours, relative to this process's directory, not to where Deno is started
        env["DENO_DIR"] = os.path.abspath(os.path.expanduser(env["DENO_DIR"]))
    return env
