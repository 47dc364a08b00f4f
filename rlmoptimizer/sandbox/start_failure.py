"""What a sandbox that did not start tells the user: Deno's own words, the download that failed, what to do.

May import: the standard library and ``rlmoptimizer.sandbox.deno`` and ``.process``.
"""

from __future__ import annotations

import os
import re
import subprocess

from rlmoptimizer.sandbox.deno import TlsTrust, deno_cache_dir, pyodide_version, tls_trust
from rlmoptimizer.sandbox.process import DenoInterpreter

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


def explain_start_failure(
    stderr: str, exit_code: int | None, error: str, cache_dir: str | None, trust: TlsTrust | None = None
) -> str:
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
        return f"The sandbox could not start: Deno could not load {what}{download}. {status}.{words}\n" + offline_help(
            cache_dir
        )
    return f"The sandbox could not start: {status}.{words}"


def describe_start_failure(
    interp: DenoInterpreter, error: str, timed_out: bool, deno_path: str, start_timeout_s: float
) -> str:
    """Why the interpreter ``interp`` did not start (``error``: what its start raised, shortened), in Deno's
    words, with what to do (:func:`explain_start_failure`); ``timed_out`` if it ran out of ``start_timeout_s``."""
    process, exit_code = interp.deno_process, None
    if process is not None:
        try:
            exit_code = process.wait(timeout=0.1 if timed_out else 5)  # stdout closes before the exit is seen
        except subprocess.TimeoutExpired:
            pass
    stderr = interp.stderr_text(wait_s=1.0 if exit_code is not None else 0.0)
    message = explain_start_failure(stderr, exit_code, error, deno_cache_dir(deno_path))
    if timed_out:
        message = f"The sandbox did not start within {start_timeout_s:g} s. " + message
    return message
