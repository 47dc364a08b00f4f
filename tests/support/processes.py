"""Scripts run in a process of their own (a compile to kill, a second holder of a run directory, a digest computed
in a new interpreter), and waiting for the point a script reports reaching.

A script imports what it needs from ``support`` (never from a test module); :func:`start_script` puts the tests
and the project on its ``sys.path``. A script signals a point by creating a file (:func:`reached`); the test waits
for that file with :func:`wait_for_file`, so a kill lands where the script says it is, not after a guessed delay.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

_PRELUDE = (
    "import os, sys\n"
    "os.environ.setdefault('LITELLM_LOCAL_MODEL_COST_MAP', 'True')\n"
    f"sys.path[:0] = [{str(TESTS)!r}, {str(ROOT)!r}]\n"
)


def write_script(directory: Path, name: str, body: str) -> Path:
    script = directory / f"{name}.py"
    script.write_text(_PRELUDE + body)
    return script


def script_env(directory: Path, name: str, **extra: str) -> dict[str, str]:
    """The test's environment with a dspy cache of the script's own (and ``extra``)."""
    return {**os.environ, "DSPY_CACHEDIR": str(directory / f"cache-{name}"), **extra}


def start_script(directory: Path, name: str, body: str, **extra_env: str) -> subprocess.Popen:
    """Start ``body`` as a Python script in a new process and a new process group (so that it and the sandbox it
    starts can be killed together, :func:`kill_group`); its output is captured as text."""
    script = write_script(directory, name, body)
    return subprocess.Popen(
        [sys.executable, str(script)],
        env=script_env(directory, name, **extra_env),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_script(directory: Path, name: str, body: str, *, timeout: float = 300, **extra_env: str) -> str:
    """Run ``body`` to the end; its standard output. A failing script fails the test with its output."""
    script = write_script(directory, name, body)
    done = subprocess.run(
        [sys.executable, str(script)],
        env=script_env(directory, name, **extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{name} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def wait_for_file(path: Path, process: subprocess.Popen, limit_s: float = 240) -> None:
    """Wait until ``path`` exists (the script created it on reaching a point). Fails at once if the script ended
    first, with its output, and after ``limit_s`` seconds at most."""
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the script ended ({process.returncode}) before creating {path.name}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the script did not create {path.name} within {limit_s:g} s")
        time.sleep(0.02)


def kill_group(process: subprocess.Popen) -> int:
    """SIGKILL the script's process group (the script and the sandbox it started); its return code."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    return process.returncode


def reached(marker: str | os.PathLike) -> None:
    """In a script: say this point is reached (create ``marker``, which :func:`wait_for_file` waits for), then
    block the calling thread for good, so the process is exactly here when the test kills it."""
    Path(marker).touch()
    threading.Event().wait()
