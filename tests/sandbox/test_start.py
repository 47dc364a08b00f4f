"""Starting the sandbox on a machine a user has: behind a TLS-inspecting proxy, offline, or misconfigured.

A new user's first start downloads Pyodide from the npm registry into Deno's cache. Deno reads neither
``SSL_CERT_FILE`` nor pip's settings, so behind a company proxy the first start failed with an empty message
after the colon. These tests give Deno an empty cache of its own and a registry on 127.0.0.1 (Deno honours
``NPM_CONFIG_REGISTRY``), so they never reach the network: the prefetch downloads from a mirror of the packages
in the machine's warm Deno cache (``support.npm_registry``).
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.npm_registry import MirrorRegistry

from rlmoptimizer.errors import SandboxError
from rlmoptimizer.sandbox import Sandbox, deno_environment, tls_trust
from rlmoptimizer.sandbox.check import run_check
from rlmoptimizer.sandbox.deno import deno_cache_dir, pyodide_version

pytestmark = pytest.mark.slow

_TLS_VARIABLES = (
    "DENO_CERT",
    "DENO_TLS_CA_STORE",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CONFIG_FILE",
)
_PROXY_VARIABLES = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
)


@pytest.fixture
def bare_env(monkeypatch, tmp_path):
    """No TLS or proxy settings, no pip config, and an empty Deno cache of the test's own."""
    for name in _TLS_VARIABLES + _PROXY_VARIABLES + ("NPM_CONFIG_REGISTRY",):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    monkeypatch.setenv("DENO_DIR", str(tmp_path / "deno-cache"))
    return tmp_path


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- what Deno is told to trust


def test_deno_gets_the_ca_bundle_python_uses(bare_env, monkeypatch):
    bundle = bare_env / "company-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    assert deno_environment()["DENO_CERT"] == str(bundle)
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    trust = tls_trust()
    assert trust.env == {"DENO_CERT": str(bundle)} and "SSL_CERT_FILE" in trust.source


def test_a_deno_setting_of_the_user_is_left_alone(bare_env, monkeypatch):
    bundle = bare_env / "ca.pem"
    bundle.write_text("x")
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    monkeypatch.setenv("DENO_TLS_CA_STORE", "mozilla")
    env = deno_environment()
    assert env["DENO_TLS_CA_STORE"] == "mozilla" and "DENO_CERT" not in env


def test_pips_cert_setting_is_used_and_a_missing_file_is_skipped(bare_env, monkeypatch):
    bundle = bare_env / "pip-ca.pem"
    bundle.write_text("x")
    config = bare_env / "home" / ".config" / "pip" / "pip.conf"
    config.parent.mkdir(parents=True)
    config.write_text(f"[global]\ncert = {bundle}\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(bare_env / "does-not-exist.pem"))
    assert tls_trust().env == {"DENO_CERT": str(bundle)}
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # pip's way to read no config file (also the machine's)
    assert tls_trust().env == {"DENO_TLS_CA_STORE": "system,mozilla"}  # nothing named: the system store


# ---------------------------------------------------------------- a start that cannot download Pyodide


def test_a_refusing_proxy_fails_fast_with_the_cause_and_the_fix(bare_env, monkeypatch):
    proxy = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HTTPS_PROXY", proxy)
    monkeypatch.setenv("HTTP_PROXY", proxy)
    with pytest.raises(SandboxError) as caught, Sandbox() as box:
        box.start()
    message = str(caught.value)
    assert message.startswith("The sandbox could not start:")  # an error Deno gave, not a wait for the limit
    assert "could not reach the npm registry" in message
    assert "https://registry.npmjs.org/pyodide" in message
    assert "Connection refused" in message  # Deno's own words
    assert f"HTTPS_PROXY={proxy}" in message
    assert "python -m rlmoptimizer.sandbox" in message and "DENO_DIR" in message


def test_a_sandbox_shut_down_while_it_downloads_pyodide_kills_the_download(bare_env, monkeypatch):
    """Regression: the download of Pyodide before a first start is a process of its own; a shutdown while it ran
    (a compile failing on its metric, a Ctrl-C) waited for it, up to the start's time limit, behind a proxy that
    never answers."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    proxy = f"http://127.0.0.1:{silent.getsockname()[1]}"
    monkeypatch.setenv("HTTPS_PROXY", proxy)
    monkeypatch.setenv("HTTP_PROXY", proxy)
    box = Sandbox(start_timeout_s=600)
    try:
        box.start_in_background()
        session = box._session
        for _ in range(600):
            if session.fetching is not None:
                break
            threading.Event().wait(0.05)
        fetching = session.fetching
        assert fetching is not None
        box.shutdown()
        assert fetching.returncode is not None and fetching.returncode < 0  # killed, not finished
    finally:
        silent.close()


def _make_ca_and_server_cert(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 signed by it (openssl's command line)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate authority")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=rlmoptimizer test CA",
    )
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (directory / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    )
    return directory / "ca.pem", directory / "server.pem", directory / "server.key"


@pytest.fixture
def tls_registry(bare_env):
    """An HTTPS 'npm registry' on 127.0.0.1 whose certificate only a private CA vouches for, like a company
    proxy's; it records the paths asked for and answers 404."""
    ca, cert, key = _make_ca_and_server_cert(bare_env)
    paths: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            paths.append(self.path)
            self.send_response(404)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.handle_error = lambda *args: None  # a client refusing our certificate is expected
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/", ca, paths
    finally:
        server.shutdown()
        server.server_close()


def test_an_untrusted_proxy_certificate_names_tls_and_the_fix(tls_registry, monkeypatch):
    registry, _ca, paths = tls_registry
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", registry)
    with pytest.raises(SandboxError) as caught, Sandbox() as box:
        box.start()
    message = str(caught.value)
    assert "could not verify the TLS certificate" in message
    assert "UnknownIssuer" in message or "certificate" in message.split("Deno said:")[1]
    assert "SSL_CERT_FILE" in message and "DENO_CERT" in message
    assert "python -m rlmoptimizer.sandbox" in message
    assert paths == []  # the handshake failed: no request got through


def test_the_ca_bundle_in_ssl_cert_file_reaches_deno(tls_registry, monkeypatch):
    """The same registry, with its CA in SSL_CERT_FILE only (as pip and requests use it): Deno now completes
    the handshake and asks for pyodide (this registry has none, so the start still fails, for that reason)."""
    registry, ca, paths = tls_registry
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", registry)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    with pytest.raises(SandboxError) as caught, Sandbox() as box:
        box.start()
    assert any("pyodide" in path for path in paths), paths
    assert "could not verify the TLS certificate" not in str(caught.value)


# ---------------------------------------------------------------- the check command


@pytest.fixture(scope="module")
def warm_cache() -> Path:
    """Deno's own cache with Pyodide in it (a first sandbox start puts it there, as on any machine)."""
    executable = Sandbox().deno_command[0]
    cache = Path(deno_cache_dir(executable) or "")
    if not (cache / "npm" / "registry.npmjs.org" / "pyodide" / pyodide_version()).is_dir():
        with Sandbox() as box:
            box.start()
    return cache


def test_check_command_prefetches_and_then_works_offline(tmp_path, warm_cache):
    """A machine that reaches the registry (here a mirror on 127.0.0.1 of the packages in the warm cache) runs
    the check, the prefetch; the same cache then starts the sandbox with every proxy refusing, as on an
    air-gapped machine with the cache copied over."""
    cache = tmp_path / "deno-cache"
    env = {k: v for k, v in os.environ.items() if k.upper() not in {p.upper() for p in _PROXY_VARIABLES}}
    env.pop("NPM_CONFIG_REGISTRY", None)
    env["DENO_DIR"] = str(cache)
    with MirrorRegistry(warm_cache) as registry:
        prefetch = _check_command({**env, **registry.env()})
    assert prefetch.returncode == 0, prefetch.stdout + prefetch.stderr
    assert "Pyodide was downloaded into the cache" in prefetch.stdout
    assert f"http://registry.npmjs.org/pyodide/-/pyodide-{pyodide_version()}.tgz" in registry.asked

    copied = tmp_path / "copied-cache"
    shutil.copytree(cache, copied, symlinks=True)
    closed = f"http://127.0.0.1:{_closed_port()}"
    offline = dict(env, DENO_DIR=str(copied), HTTPS_PROXY=closed, HTTP_PROXY=closed, ALL_PROXY=closed)
    result = _check_command(offline)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "Pyodide was already in the cache" in out
    assert f"Deno cache:  {copied}" in out
    for probe in (
        "read a host file",
        "write a host file",
        "read the environment",
        "reach the network",
        "start a process",
    ):
        assert f"passed  {probe}: refused" in out
    assert "Deno:        deno 2." in out and "Pyodide:     0." in out


def _check_command(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlmoptimizer.sandbox"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )


class _LeakySandbox(Sandbox):
    """A sandbox whose Deno may read the environment: the self-check must catch it."""

    def _build_deno_command(self):
        command = [arg for arg in super()._build_deno_command() if arg != "--deny-env"]
        command.insert(command.index("run") + 1, "--allow-env")
        return command


def test_the_self_check_fails_a_sandbox_that_leaks():
    report = run_check(_LeakySandbox)
    failed = [probe.name for probe in report.probes if not probe.passed]
    assert failed == ["read the environment"]
    assert not report.ok and "FAILED  read the environment: ALLOWED" in report.render()


def test_each_sandbox_has_a_deno_directory_of_its_own_that_shares_only_the_packages(tmp_path, monkeypatch, caplog):
    from rlmoptimizer.sandbox.deno import own_deno_dir

    shared = tmp_path / "shared"
    command = ["deno", "run", f"--dspy-deno-dir={shared}", "runner.js"]
    own = Path(own_deno_dir(command, str(tmp_path)))
    assert os.readlink(own / "npm") == str(shared / "npm")  # Pyodide from where the fetch puts it
    assert (own / "location_data").is_file()  # no directory for the Web storage APIs to write in
    assert deno_environment(deno_dir=str(own))["DENO_DIR"] == str(own)
    assert own_deno_dir(["deno", "run", "runner.js"], str(tmp_path / "x")) is None  # no shared cache named

    def refused(*args, **kwargs):
        raise OSError("symbolic links are not allowed here")

    monkeypatch.setattr(os, "symlink", refused)
    (tmp_path / "other").mkdir()
    assert own_deno_dir(command, str(tmp_path / "other")) is None
    assert not (tmp_path / "other" / "deno").exists()
    assert "shared cache" in caplog.text and "symbolic links are not allowed" in caplog.text


def test_without_a_deno_directory_of_its_own_the_self_check_says_so_and_stores_nothing(monkeypatch):
    """Where symbolic links cannot be made, the sandbox uses the shared Deno cache: the self-check reports that
    protection off instead of running the Cache API probe, which would write into that cache."""
    from rlmoptimizer.sandbox import deno

    monkeypatch.setattr(deno, "own_deno_dir", lambda command, into: None)
    report = run_check(Sandbox)
    assert report.ok, report.render()
    own = next(p for p in report.protections if p.name == "a Deno cache directory of its own")
    assert not own.active and "symbolic links cannot be made" in own.detail
    assert not any("Cache API" in probe.name for probe in report.probes)
    monkeypatch.undo()
    report = run_check(Sandbox)
    assert any("Cache API" in probe.name and probe.passed for probe in report.probes)
    assert next(p for p in report.protections if p.name == "a Deno cache directory of its own").active
