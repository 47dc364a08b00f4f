"""A broken metric and a run directory that cannot be one, as a careless user meets them.

Regressions: a metric returning None got its clear MetricError only once the sandbox had finished starting (a
minute on a loaded machine), and its advice ("run compile() again with the same run_storage_dir to resume") failed
with RunDirectoryMismatchError once the metric was fixed; ``run_storage_dir`` naming a file gave a raw
FileExistsError."""

from __future__ import annotations

import signal
import subprocess
import sys
import types

import pytest
from support.optimizing import TURNS, compile_tickets
from support.tickets import metric

from rlmoptimizer import ConfigurationError, MetricError
from rlmoptimizer.errors import SandboxError
from rlmoptimizer.sandbox import session as session_module


def scores_none_at_first(example, prediction, trace=None):
    """The ticket metric with the bug a careless user writes: no score on one code path."""
    if example.queue == "security":
        return None
    return metric(example, prediction, trace)


def test_a_broken_metric_stops_the_compile_without_waiting_for_the_sandbox_start(monkeypatch, tmp_path):
    """Regression: compile() waited for the sandbox to finish starting before it raised the MetricError of the
    baseline. The start still running is cut short: its process is killed, not waited for."""
    started: list[subprocess.Popen] = []

    def slow_start(self, command, workdir, memory_limit_mb, start_timeout_s):
        # a start that takes far longer than the baseline: it ends early only if its process is killed
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        started.append(child)
        self.interp = types.SimpleNamespace(deno_process=child)
        child.wait()
        self.interp = None
        raise SandboxError("the start was cut short")

    monkeypatch.setattr(session_module.Session, "start", slow_start)
    with pytest.raises(MetricError, match="returned None"):
        compile_tickets(TURNS, metric=scores_none_at_first, run_storage_dir=tmp_path / "run")
    assert len(started) == 1
    assert started[0].returncode == -signal.SIGKILL  # killed by the compile's end, not finished on its own


@pytest.mark.slow
def test_the_advice_of_a_metric_error_works_once_the_metric_is_fixed(tmp_path):
    """Regression: the MetricError said "run compile() again with the same run_storage_dir to resume", which then
    failed with RunDirectoryMismatchError ("a different metric") once the metric was fixed."""
    directory = tmp_path / "run"
    with pytest.raises(MetricError) as raised:
        compile_tickets(TURNS, metric=scores_none_at_first, run_storage_dir=directory)
    advice = str(raised.value)
    assert "to resume where it stopped" not in advice
    assert "run compile() with a new run_storage_dir" in advice
    stored_id = advice.split("pass metric_id=")[1].split(" ")[0].strip("'")
    # either way the advice gives works with the fixed metric
    fresh = compile_tickets(TURNS, metric=metric, run_storage_dir=tmp_path / "new")
    resumed = compile_tickets(TURNS, metric=metric, run_storage_dir=directory, metric_id=stored_id)
    assert resumed.optimized_dspy_program == fresh.optimized_dspy_program


def test_a_run_storage_dir_that_is_a_file_is_a_configuration_error(tmp_path):
    """Regression: ``run_storage_dir`` naming an existing file gave a raw FileExistsError."""
    path = tmp_path / "results.json"
    path.write_text("{}")
    with pytest.raises(ConfigurationError, match="is a file, not a directory"):
        compile_tickets(TURNS, run_storage_dir=path)
    with pytest.raises(ConfigurationError, match="cannot be created"):
        compile_tickets(TURNS, run_storage_dir=path / "inside")
    assert path.read_text() == "{}"
