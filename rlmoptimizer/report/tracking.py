"""MLflow tracking of a compile(), as ``dspy.GEPA(use_mlflow=True)`` offers it.

Needs the optional extra: ``pip install "rlmoptimizer[mlflow]"``. The tracker uses the tracking URI and the
experiment set the usual MLflow way (``mlflow.set_tracking_uri`` / ``mlflow.set_experiment``, or the
``MLFLOW_TRACKING_URI`` / ``MLFLOW_EXPERIMENT_NAME`` environment variables) and nests its run under the active
MLflow run when there is one.

What it logs:

* at the start, the optimizer's parameters: every constructor setting that shapes a run (``None`` included, so
  ``max_iterations=None`` with ``max_metric_calls=B`` tells the budget mode; ``budget_mode`` names it), and what the
  compile runs with (the LMs' names, data sizes, the budget limit, the metric, the run directory);
* for every evaluation run, one metric step (the step is the run number): ``train_score`` or ``val_score``,
  ``train_passed`` or ``val_passed``, ``evaluated_count``, ``budget_spent``, ``budget_left``, and ``cost_usd`` when
  the cost is known;
* every agent turn (``turns/turn-NNNN.json``) and every prompt version (``prompts/v-NNNN.json``) as it happens;
* at the end, ``optimized_instructions.json``, ``selection.json``, ``trajectory.json``, ``detailed_results.json``
  and the picture of the run (``run.png``), plus ``final_score`` and ``baseline_score``;
* where the returned instructions came from: ``lineage.json`` (every named candidate's parents, move, GEPA run,
  the train ids it reflected on and the failure group it was written for, and the returned candidate's ancestry with
  its scores: :meth:`DetailedResults.lineage_record <rlmoptimizer.report.results.DetailedResults.lineage_record>`), and the
  tags ``returned_candidate`` (its id, e.g. ``gepa-3``) and ``returned_ancestry`` (``the unchanged program ->
  proposal-1 -> gepa-3``).

Tracking never fails an optimization: the first error from MLflow is reported once as a warning, and tracking
stops for the rest of that compile() (the run directory still has everything).

The tracker is an observer of a compile()'s events (:meth:`MlflowTracker.on_event`); the compile is tracked in
:func:`~rlmoptimizer.report.compile_state.tracked` (:meth:`~MlflowTracker.compile_started` with
:func:`~rlmoptimizer.report.compile_state.compile_params`, :meth:`~MlflowTracker.compile_failed`) and ends with
:meth:`~MlflowTracker.compile_finished` (:func:`~rlmoptimizer.report.finish.present_result`).
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlmoptimizer.errors import ConfigurationError
from rlmoptimizer.events import AgentTurn, EvaluationFinished, Event, PromptUpdated

logger = logging.getLogger(__name__)

MLFLOW_EXTRA = 'pip install "rlmoptimizer[mlflow]"'
_BOUNDED_REQUESTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}
"""MLflow's HTTP settings while a compile tracks, where the user set none: its defaults (7 retries, each waiting up
to 120 s) held a compile up for minutes at each call once a tracking server broke."""
_LAST_TRY = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
"""For closing a run once tracking failed: one short try (the store broke already)."""
_STOPPED_TAG = "stopped before the end (see the warning); the run directory has everything"
_PARAM_LIMIT = 500  # the smallest value length MLflow stores have accepted for a parameter


def require_mlflow() -> Any:
    """The ``mlflow`` module, or :class:`ConfigurationError` naming the extra to install."""
    try:
        import mlflow
    except ImportError as exc:
        raise ConfigurationError(
            f"use_mlflow=True needs MLflow, which is not installed: {MLFLOW_EXTRA} (or pip install mlflow), "
            "or drop use_mlflow=True"
        ) from exc
    return mlflow


def check_use_mlflow(value: Any) -> bool:
    """``use_mlflow`` as given to the optimizer: a bool, and MLflow importable when True."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"use_mlflow must be True or False, got {value!r}")
    if value:
        require_mlflow()  # fail when the optimizer is built, not after the baseline was paid for
    return value


def _bound(bounds: dict[str, str]) -> list[str]:
    """Set MLflow's HTTP retries and timeout to ``bounds`` where the user set none (MLflow reads them at each
    request); the names set here, for :func:`_unbound`."""
    set_here = [name for name in bounds if name not in os.environ]
    for name in set_here:
        os.environ[name] = bounds[name]
    return set_here


def _unbound(names: list[str]) -> None:
    for name in names:
        os.environ.pop(name, None)


@contextlib.contextmanager
def _bounded_requests(bounds: dict[str, str]):
    """``bounds`` for one closing call, where the user set none."""
    set_here = _bound(bounds)
    try:
        yield
    finally:
        _unbound(set_here)


def _check_reachable(uri: Any, timeout_s: float = 5.0) -> None:
    """``ConnectionError`` when ``uri`` names a tracking server (http or https) that does not accept a connection,
    or does not answer a request (any answer will do), within ``timeout_s``: MLflow's own retries would hold the
    compile up for minutes before its first evaluation."""
    parsed = urllib.parse.urlparse(str(uri))
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    proxies = urllib.request.getproxies()
    if (proxies.get(parsed.scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(parsed.hostname):
        return  # reached through a proxy: a direct connection says nothing
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
        if parsed.scheme == "http":  # (a TLS server's answer needs its certificates: its connection is enough)
            connection = http.client.HTTPConnection(parsed.hostname, port, timeout=timeout_s)
            try:
                connection.request("GET", "/health")
                connection.getresponse().read(1024)
            finally:
                connection.close()
    except (OSError, http.client.HTTPException) as exc:
        raise ConnectionError(f"the tracking server {parsed.hostname}:{port} did not answer ({exc})") from exc


def _run_number(run_id: str, fallback: int) -> int:
    tail = str(run_id).rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else fallback


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return obj.get(name, default) if isinstance(obj, dict) else getattr(obj, name, default)


class MlflowTracker:
    """Logs one compile() to MLflow. Thread safe; every method is a no-op once tracking has failed once."""

    cost_source: Callable[[], float | None] | None = None
    """What the run has spent on LM calls so far in USD (None where unknown), logged with each evaluation."""

    def __init__(self, run_name: str | None = None) -> None:
        self._mlflow = require_mlflow()
        self.run_name = run_name
        self.run_id: str | None = None
        self._client: Any = None
        self._started_here = False
        self._lock = threading.Lock()
        self._failed = False
        self._bounded: list[str] = []  # MLflow's settings set for this compile (undone at its end)
        self._evaluations = 0
        self._turns = 0
        self._versions = 0

    @property
    def active(self) -> bool:
        return self.run_id is not None and not self._failed

    def _guard(self, what: str, action: Callable[[], Any]) -> None:
        with self._lock:
            if self._failed:
                return
            try:
                action()
            except Exception as exc:  # a broken store must not break the optimization
                self._failed = True
                logger.warning(
                    "MLflow tracking stopped (%s failed: %s: %s). The optimization goes on; everything is still "
                    "in its run directory.",
                    what,
                    type(exc).__name__,
                    exc,
                )

    # -- events ----------------------------------------------------------------------------------------
    def on_event(self, event: Event) -> None:
        """The observer protocol (:mod:`rlmoptimizer.events`): a run saved, an agent turn, a prompt version."""
        if isinstance(event, EvaluationFinished):
            cost = self.cost_source() if self.cost_source is not None else None
            self.evaluation_finished(event.run, event.budget, cost if isinstance(cost, (int, float)) else None)
        elif isinstance(event, AgentTurn):
            self.agent_turn(event.turn)
        elif isinstance(event, PromptUpdated):
            self.prompt_updated(event.version)

    def compile_started(self, params: dict[str, Any]) -> None:
        """Open the MLflow run (nested under the active run, if any) and log ``params``."""

        def start() -> None:
            mlflow = self._mlflow
            from mlflow.entities import Param

            _check_reachable(mlflow.get_tracking_uri())
            parent = mlflow.active_run()
            launcher = None if parent is not None else os.environ.get("MLFLOW_RUN_ID")
            if launcher:  # a launcher's run (`mlflow run`): ours nests under it, left for the launcher to end
                os.environ.pop("MLFLOW_RUN_ID")
                try:
                    run = mlflow.start_run(run_name=self.run_name, parent_run_id=launcher)
                finally:
                    os.environ["MLFLOW_RUN_ID"] = launcher
            else:
                run = mlflow.start_run(run_name=self.run_name, nested=parent is not None)
            self._started_here = True
            self.run_id = run.info.run_id
            self._client = mlflow.MlflowClient()
            values = [Param(str(k), str(v)[:_PARAM_LIMIT]) for k, v in params.items() if v is not None]
            self._client.log_batch(self.run_id, params=values, tags=[])
            self._client.set_tag(self.run_id, "optimizer", "rlmoptimizer.RLMDocstringOptimizer")

        self._bounded = _bound(_BOUNDED_REQUESTS)  # for the compile: one change of the environment, undone at its end
        self._guard("starting the MLflow run", start)
        if self.run_id is None:
            _unbound(self._bounded)
            self._bounded = []

    def evaluation_finished(self, run: Any, budget: dict[str, Any] | None = None, cost: float | None = None) -> None:
        """One metric step for an evaluation run (an ``EvalRun`` or its ``summary()``); ``budget`` is the ledger
        snapshot after it, ``cost`` the USD spent so far when known."""
        if self.run_id is None:
            return

        def log() -> None:
            from mlflow.entities import Metric

            self._evaluations += 1
            step = _run_number(_get(run, "run_id", ""), self._evaluations)
            split = _get(run, "split", "train")
            now = int(time.time() * 1000)
            values = {
                f"{split}_score": float(_get(run, "score", 0.0)),
                f"{split}_passed": float(_get(run, "passed_count", 0)),
                "evaluated_count": float(_get(run, "evaluated_count", 0)),
            }
            if budget:
                values["budget_spent"] = float(budget.get("spent", 0))
                values["budget_left"] = float(budget.get("left", 0))
            else:
                values["budget_left"] = float(_get(run, "budget_left", 0))
            if cost is not None:
                values["cost_usd"] = float(cost)
            self._client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

        self._guard("logging an evaluation run", log)

    def agent_turn(self, turn: dict[str, Any]) -> None:
        if self.run_id is None:
            return

        def log() -> None:
            self._turns += 1
            number = (
                int(turn.get("iteration", self._turns)) if str(turn.get("iteration", "")).isdigit() else self._turns
            )
            self._turns = max(self._turns, number)  # (a resumed run's turns go on from those an earlier one took)
            self._client.log_dict(self.run_id, dict(turn), f"turns/turn-{number:04d}.json")
            self._client.log_metric(self.run_id, "agent_turns", number, step=number)

        self._guard("logging an agent turn", log)

    def prompt_updated(self, version: dict[str, Any]) -> None:
        if self.run_id is None:
            return

        def log() -> None:
            self._versions += 1
            number = version.get("version", self._versions)
            self._client.log_dict(self.run_id, dict(version), f"prompts/v-{int(number):04d}.json")

        self._guard("logging a prompt version", log)

    def compile_finished(
        self,
        *,
        instructions: dict[str, str],
        selection: dict[str, Any],
        trajectory: list[dict[str, Any]],
        picture: str | Path | None = None,
        detailed_results: dict[str, Any] | None = None,
        budget: dict[str, Any] | None = None,
        usage: dict[str, Any] | None = None,
        lineage: dict[str, Any] | None = None,
    ) -> None:
        """Log the outcome as artifacts and close the run. ``lineage``: where the candidates came from
        (:meth:`DetailedResults.lineage_record <rlmoptimizer.report.results.DetailedResults.lineage_record>`)."""
        if self.run_id is None:
            return

        def log() -> None:
            client, run_id = self._client, self.run_id
            client.log_dict(run_id, dict(instructions), "optimized_instructions.json")
            client.log_dict(run_id, dict(selection), "selection.json")
            client.log_dict(run_id, {"turns": list(trajectory)}, "trajectory.json")
            if detailed_results is not None:
                client.log_dict(run_id, detailed_results, "detailed_results.json")
            if usage:
                client.log_dict(run_id, usage, "usage.json")
            if picture is not None and Path(picture).exists():
                client.log_artifact(run_id, str(picture))
            now = int(time.time() * 1000)
            from mlflow.entities import Metric

            finals = {"final_score": selection.get("chosen_score"), "baseline_score": selection.get("baseline_score")}
            if budget:
                finals["final_budget_spent"] = budget.get("spent")
            metrics = [Metric(k, float(v), now, 0) for k, v in finals.items() if isinstance(v, (int, float))]
            if metrics:
                client.log_batch(run_id, metrics=metrics)
            client.set_tag(run_id, "selection_reason", str(selection.get("reason", ""))[:5000])
            if lineage and (lineage.get("lineage") or lineage.get("ancestry")):
                client.log_dict(run_id, lineage, "lineage.json")
                ancestry = lineage.get("ancestry") or []
                if lineage.get("returned"):
                    client.set_tag(run_id, "returned_candidate", str(lineage["returned"]))
                if ancestry:
                    chain = " -> ".join(str(node.get("label")) for node in ancestry)
                    client.set_tag(run_id, "returned_ancestry", chain[:5000])

        self._guard("logging the result", log)
        self._end("FINISHED")

    def compile_failed(self, error: BaseException) -> None:
        """Close the run as failed (KILLED for Ctrl-C), with the error as a tag."""
        if self.run_id is None:
            return
        self._guard(
            "logging the error",
            lambda: self._client.set_tag(self.run_id, "error", f"{type(error).__name__}: {error}"[:5000]),
        )
        self._end("KILLED" if isinstance(error, KeyboardInterrupt) or "interrupted" in str(error) else "FAILED")

    # -- closing -------------------------------------------------------------------------------------
    def _end(self, status: str) -> None:
        if self.run_id is None or not self._started_here:
            return
        _unbound(self._bounded)
        self._bounded = []
        mlflow = self._mlflow
        try:
            active = mlflow.active_run()
            with _bounded_requests(_LAST_TRY if self._failed else _BOUNDED_REQUESTS):  # (the compile's are undone)
                if self._failed and self._client is not None:  # what MLflow holds is incomplete: say so, if it can
                    with contextlib.suppress(Exception):
                        self._client.set_tag(self.run_id, "tracking", _STOPPED_TAG)
                if active is not None and active.info.run_id == self.run_id:
                    launcher = os.environ.get("MLFLOW_RUN_ID")
                    try:
                        mlflow.end_run(status=status)
                    finally:  # (end_run unsets MLFLOW_RUN_ID, even when it fails: the launcher's run is not ours)
                        if launcher:
                            os.environ["MLFLOW_RUN_ID"] = launcher
                elif self._client is not None:
                    self._client.set_terminated(self.run_id, status=status)
        except Exception as exc:  # never fail the optimization for this
            if not self._failed:
                logger.warning("Could not close the MLflow run %s: %s", self.run_id, exc)
            self._failed = True
        self._started_here = False
