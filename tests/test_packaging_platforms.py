"""Off Linux: whether a run directory's holder is alive is asked without signalling it (on Windows,
``os.kill(pid, 0)`` sends CTRL_C_EVENT), and the sandbox self-check says which protections this platform gives."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlmoptimizer.sandbox import process
from rlmoptimizer.sandbox.check import run_check
from rlmoptimizer.storage import lock

STILL_ACTIVE = 259


class FakeKernel32:
    """The three kernel32 calls the Windows liveness check makes, over a table of processes
    (pid -> exit code, 259 while running); ``denied`` pids exist but may not be queried."""

    def __init__(self, processes: dict[int, int], denied: tuple[int, ...] = ()) -> None:
        self.processes, self.denied = processes, denied
        self.error = 0
        self.open_handles: dict[int, int] = {}
        self._next = 100

    def OpenProcess(self, access, inherit, pid):  # noqa: N802 (Windows' names)
        assert access == 0x1000 and inherit is False  # PROCESS_QUERY_LIMITED_INFORMATION, not inherited
        if pid in self.denied:
            self.error = 5  # ERROR_ACCESS_DENIED
            return 0
        if pid not in self.processes:
            self.error = 87  # ERROR_INVALID_PARAMETER: no such process
            return 0
        self._next += 4
        self.open_handles[self._next] = pid
        return self._next

    def GetExitCodeProcess(self, handle, code_ref):  # noqa: N802
        code_ref._obj.value = self.processes[self.open_handles[handle]]
        return 1

    def CloseHandle(self, handle):  # noqa: N802
        del self.open_handles[handle]
        return 1

    def GetLastError(self):  # noqa: N802
        return self.error


@pytest.mark.parametrize(("pid", "alive"), [(10, True), (11, False), (12, False), (13, True)])
def test_windows_liveness_asks_windows_and_closes_what_it_opens(pid, alive):
    kernel32 = FakeKernel32({10: STILL_ACTIVE, 11: 0}, denied=(13,))  # 11 exited, 12 never existed
    assert lock._windows_process_alive(pid, kernel32, kernel32.GetLastError) is alive
    assert kernel32.open_handles == {}


def test_on_windows_the_holder_check_never_signals(monkeypatch):
    asked = []

    def no_signals(pid, sig):
        raise AssertionError(f"os.kill({pid}, {sig}) on Windows sends CTRL_C_EVENT")

    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(os, "kill", no_signals)
    monkeypatch.setattr(lock, "_windows_process_alive", lambda pid: asked.append(pid) or pid == 4242)
    assert lock._process_alive(4242) is True
    assert lock._process_alive(4243) is False
    assert asked == [4242, 4243]


def test_liveness_on_this_host():
    assert lock._process_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process now
    assert not lock._process_alive(child.pid)
    assert not lock._process_alive(0) and not lock._process_alive(-1)  # process groups, not a holder


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux protections are checked on Linux")
def test_the_self_check_names_the_protections_of_this_platform():
    report = run_check()
    assert report.ok, report.render()
    states = {protection.name: protection.active for protection in report.protections}
    assert states == {
        "time limit per cell": True,
        "Pyodide memory cap": True,
        "process memory cap": True,
        "a Deno cache directory of its own": True,
        "idle-CPU watch": True,
    }
    assert "protections on this platform (linux):" in report.render()


@pytest.mark.slow
def test_the_self_check_says_which_protections_a_platform_without_proc_lacks(monkeypatch):
    """As on macOS: no prlimit, no /proc. The sandbox still works and is isolated; the check says what is off."""
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(process, "cpu_seconds", lambda pid: None)
    report = run_check()
    assert report.ok, report.render()
    states = {protection.name: protection.active for protection in report.protections}
    assert states == {
        "time limit per cell": True,
        "Pyodide memory cap": True,
        "process memory cap": False,
        "a Deno cache directory of its own": True,  # (symbolic links: every platform but Windows without the right)
        "idle-CPU watch": False,
    }
    text = report.render()
    assert "protections on this platform (darwin):" in text
    assert "off  process memory cap: off on darwin: it needs Linux" in text
    assert "off  idle-CPU watch: off on darwin" in text
