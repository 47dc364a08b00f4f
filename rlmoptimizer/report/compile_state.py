"""What the report reads of a compile() while it runs, typed: :class:`CompileState`, and the two readers that take
it before the run directory is complete: the MLflow parameters of a compile (:func:`compile_params`) and the
block a tracked compile runs in (:func:`tracked`). :func:`~rlmoptimizer.report.finish.present_result` reads it
at the end.

May import what :mod:`rlmoptimizer.report` may.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlmoptimizer.report.costs import CostEstimate
from rlmoptimizer.report.tracking import MlflowTracker
from rlmoptimizer.usage import UsageMeter

if TYPE_CHECKING:
    import dspy


class IdentifiedMetric(Protocol):
    @property
    def identity(self) -> str:
        """What the run directory records to recognise the metric on resume."""
        ...


class Shows(Protocol):
    def message(self, text: str, style: str = "") -> None:
        """Show ``text`` (when ``verbose``)."""
        ...


class CompileState(Protocol):
    """The attributes of one compile() the report reads, and only those (the optimizer's compile has them)."""

    @property
    def directory(self) -> Path:
        """The run directory."""
        ...

    @property
    def student(self) -> dspy.Module:
        """The program as the user passed it (copied before the returned instructions are applied)."""
        ...

    @property
    def tracker(self) -> MlflowTracker | None:
        """The MLflow tracker, when ``use_mlflow=True``."""
        ...

    @property
    def read_back(self) -> bool:
        """A finished run returned again: nothing is written, drawn or tracked."""
        ...

    @property
    def cost_estimate(self) -> CostEstimate | None:
        """What the compile was predicted to cost before its first paid call (None when it could not be made)."""
        ...

    @property
    def display(self) -> Shows:
        """Where ``verbose`` output goes."""
        ...

    @property
    def usage(self) -> UsageMeter:
        """What the compile has spent on LM calls so far."""
        ...

    @property
    def budget_limit(self) -> int:
        """The budget in units."""
        ...

    @property
    def trainset(self) -> Sequence[dspy.Example]: ...

    @property
    def valset(self) -> Sequence[dspy.Example]: ...

    @property
    def root_lm(self) -> dspy.BaseLM | None: ...

    @property
    def sub_lm(self) -> dspy.BaseLM | None: ...

    @property
    def eval_lm(self) -> dspy.BaseLM | None: ...

    @property
    def metric(self) -> IdentifiedMetric: ...


# Constructor arguments that are not logged as themselves: the LMs, the metric and the run directory are logged as
# what the compile runs with (their names and identity); the console, verbose output and MLflow itself shape nothing.
_NOT_SETTINGS = frozenset(
    {"root_lm", "sub_lm", "eval_lm", "metric", "run_storage_dir", "console", "verbose", "use_mlflow"}
)


def optimizer_settings(optimizer: Any) -> dict[str, Any]:
    """Every keyword argument of the optimizer's constructor that shapes a run, as the optimizer holds it (None
    included: ``max_iterations=None`` says the budget is ``max_metric_calls``)."""
    parameters = inspect.signature(type(optimizer).__init__).parameters.values()
    return {
        p.name: getattr(optimizer, p.name)
        for p in parameters
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in _NOT_SETTINGS and hasattr(optimizer, p.name)
    }


def _lm_name(lm: Any) -> str | None:
    if lm is None:
        return None
    model = getattr(lm, "model", None)  # a user's own BaseLM may have no model name
    return model if isinstance(model, str) and model else type(lm).__name__


def compile_params(optimizer: Any, state: CompileState) -> dict[str, Any]:
    """The parameters of one compile(): the optimizer's settings and what the compile runs with (its LMs, data
    sizes, budget, metric and run directory)."""
    settings = {name: "None" if value is None else value for name, value in optimizer_settings(optimizer).items()}
    params: dict[str, Any] = {"optimizer": type(optimizer).__name__, **settings}
    params["budget_mode"] = "max_metric_calls" if getattr(optimizer, "max_metric_calls", None) else "max_iterations"
    params.update(
        {
            "budget_limit": state.budget_limit,
            "trainset_size": len(state.trainset),
            "valset_size": len(state.valset),
            "root_lm": _lm_name(state.root_lm),
            "sub_lm": _lm_name(state.sub_lm),
            "eval_lm": _lm_name(state.eval_lm),
            "metric": state.metric.identity,
            "run_storage_dir": str(state.directory),
        }
    )
    return params


@contextmanager
def tracked(tracker: MlflowTracker | None, optimizer: Any, state: CompileState) -> Iterator[None]:
    """Open the MLflow run of a compile() for the duration of the block and close it as failed if the block
    raises (the block's success is closed by :meth:`MlflowTracker.compile_finished`). Nothing is tracked without
    a tracker, or for a finished run read back (``state.read_back``)."""
    if tracker is None or state.read_back:
        yield
        return
    meter = state.usage  # each evaluation logs the cost so far
    tracker.cost_source = lambda: meter.snapshot().get("total", {}).get("cost_usd")
    tracker.compile_started(compile_params(optimizer, state))
    try:
        yield
    except BaseException as exc:
        tracker.compile_failed(exc)
        raise
