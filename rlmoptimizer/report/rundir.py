"""Reading a run directory back, whatever state it is in: finished, interrupted (killed mid-run), still being
written by a compile() in another process, or empty.

:func:`read_run_directory` never writes and never raises on what it finds inside: a file that cannot be read
(half written by a process that is still running, or damaged), or that parses but has the wrong shape (a ledger
without ``limit``, a ``selection`` that is a string: :mod:`rlmoptimizer.report.shapes`), is skipped, or the part
of it that is wrong is, and named in ``RunDirectory.problems``; an in-flight log is read up to its torn line, cut at
any byte. Only a path that is not a directory is an error.

Whether a compile() is still writing a directory is told by its holder (:func:`rlmoptimizer.storage.lock.holder_of`).
Without ``result.json`` and without a live holder, the run was interrupted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlmoptimizer.errors import ConfigurationError
from rlmoptimizer.records import EvalRun, ExampleResult
from rlmoptimizer.report.lineage import lineage_shape
from rlmoptimizer.report.shapes import (
    budget_shape,
    estimate_shape,
    manifest_shape,
    result_shape,
    run_problem,
    turn_shape,
    usage_shape,
    version_shape,
)
from rlmoptimizer.storage.candidates import read_candidates
from rlmoptimizer.storage.layout import PROMPT_VERSIONS, RUNS, TURNS, Numbered, RunLayout
from rlmoptimizer.storage.lock import holder_of
from rlmoptimizer.storage.run_store import read_pending_log

Status = Literal["finished", "interrupted", "in flight", "empty"]


@dataclass(frozen=True)
class PendingRun:
    """An evaluation that had started and not finished when the directory was read: the records it had paid for.

    It becomes a saved run (label ``<label>:recovered``) when the run directory is resumed."""

    path: str
    split: str
    label: str
    instructions: dict[str, str]
    requested_count: int
    charged: bool
    records: tuple[ExampleResult, ...]

    @property
    def evaluated_count(self) -> int:
        return len(self.records)

    @property
    def score(self) -> float:
        return sum(r.score for r in self.records) / len(self.records) if self.records else 0.0


@dataclass(frozen=True)
class RunDirectory:
    """Everything a run directory holds, read at one moment. ``status`` is one of
    ``"finished"`` (``result.json`` is there), ``"in flight"`` (a compile() is writing it now; ``holder`` names
    its process),
    ``"interrupted"`` (neither: the process stopped or was killed; compile() with the same
    ``run_storage_dir`` resumes it) and ``"empty"`` (no manifest, no runs)."""

    directory: str
    status: Status
    holder: dict[str, Any] | None
    manifest: dict[str, Any] | None
    ledger: dict[str, Any] | None
    runs: tuple[EvalRun, ...]
    pending: tuple[PendingRun, ...]
    prompt_versions: tuple[dict[str, Any], ...]
    turns: tuple[dict[str, Any], ...]
    result: dict[str, Any] | None
    problems: tuple[str, ...] = field(default=())
    usage_so_far: dict[str, Any] | None = None
    """``usage.json``: per-role LM usage written while the run goes (what an interrupted run spent)."""
    estimate: dict[str, Any] | None = None
    """``estimate.json``: what the compile was predicted to cost before its first paid call
    (:class:`~rlmoptimizer.report.costs.CostEstimate` as ``to_dict()`` writes it)."""
    named_candidates: dict[str, dict[str, str]] = field(default_factory=dict)
    """``candidates.json``: the candidates the moves named (``proposal-N``: the steps it wrote; ``gepa-N``: every
    step), in the order they were made."""
    lineage: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``candidates.json``: each named candidate's parents, the move that made it and what it reflected on."""
    stopped: dict[str, str] | None = None
    """``stopped.json``: what the last compile() raised as it stopped (``at``, ``error``, ``message``); None when
    it finished, is running, was killed, or never stopped so."""

    # -- derived views ---------------------------------------------------------------------------
    @property
    def budget(self) -> dict[str, Any] | None:
        """The final budget when finished, else the latest ledger (``limit``, ``spent``, ``left``, ``spent_by_kind``)."""
        if self.result and isinstance(self.result.get("budget"), dict):
            return self.result["budget"]
        if self.ledger is not None:
            return self.ledger
        if self.manifest and "budget_limit" in self.manifest:
            limit = int(self.manifest["budget_limit"])
            return {"limit": limit, "spent": 0, "left": limit, "spent_by_kind": {}}
        return None

    @property
    def budget_limit(self) -> int | None:
        budget = self.budget
        return int(budget["limit"]) if budget else None

    @property
    def selection(self) -> dict[str, Any] | None:
        return self.result.get("selection") if self.result else None

    @property
    def usage(self) -> dict[str, Any] | None:
        """Per-role LM usage and cost as compile() recorded it in ``result.json``, else as ``usage.json`` had it
        when the run stopped; None when neither was written."""
        usage = self.result.get("usage") if self.result else None
        if not (isinstance(usage, dict) and usage):
            usage = self.usage_so_far
        return usage if isinstance(usage, dict) and usage else None

    @property
    def cost(self) -> float | None:
        """Total cost in USD where it is known (from ``usage``), else None."""
        usage = self.usage
        if not usage:
            return None
        total = usage.get("total")
        if isinstance(total, dict) and "cost_usd" in total:  # rlmoptimizer.usage's shape; None: a model unpriced
            return float(total["cost_usd"]) if isinstance(total["cost_usd"], (int, float)) else None
        if isinstance(usage.get("total_cost"), (int, float)):
            return float(usage["total_cost"])
        costs = [v.get("cost") for v in usage.values() if isinstance(v, dict)]
        known = [float(c) for c in costs if isinstance(c, (int, float))]
        return sum(known) if known else None

    @property
    def optimized_instructions(self) -> dict[str, str] | None:
        return self.result.get("optimized_dspy_program") if self.result else None

    @property
    def initial_instructions(self) -> dict[str, str] | None:
        """The instructions of the unchanged program (those of its baseline run)."""
        for run in self.runs:
            if run.label == "baseline":
                return dict(run.instructions)
        return None

    def spent_after(self, run: EvalRun) -> int:
        """Budget spent when ``run`` was saved (the x position of a run in the picture)."""
        limit = self.budget_limit
        if limit is None:
            return 0
        return max(0, limit - run.budget_left)


def _read_json(path: Path, problems: list[str]) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:  # removed between listing and reading (a pending log that became a run)
        return None
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: torn JSON or bytes that are not UTF-8
        problems.append(f"{path.name}: unreadable ({type(exc).__name__}: {str(exc)[:200]})")
        return None


def _read_pending(path: Path, problems: list[str]) -> PendingRun | None:
    try:
        parsed = read_pending_log(path)
    except FileNotFoundError:  # settled into a saved run while we read
        return None
    except OSError as exc:
        problems.append(f"{path.name}: unreadable ({exc})")
        return None
    except ValueError as exc:  # a header that parses but cannot say what was evaluated
        problems.append(f"{path.name}: not an in-flight log ({exc})")
        return None
    if parsed is None:
        return None  # the header itself was being written
    header, records = parsed
    return PendingRun(
        path=str(path),
        split=header["split"],
        label=header["label"],
        instructions=header["instructions"],
        requested_count=header["requested"],
        charged=header["charged"],
        records=tuple(sorted(records, key=lambda r: r.example_id)),
    )


def read_run_directory(directory: str | Path) -> RunDirectory:
    """Read ``directory`` as it is now. :class:`ConfigurationError` if it does not exist or is not a directory."""
    path = Path(directory)
    if not path.exists():
        raise ConfigurationError(f"no such run directory: {str(path)!r}; pass the run_storage_dir of a compile()")
    if not path.is_dir():
        raise ConfigurationError(f"{str(path)!r} is not a directory; pass the run_storage_dir of a compile()")
    problems: list[str] = []
    layout = RunLayout(path)
    holder = holder_of(path)
    manifest = manifest_shape(_read_json(layout.manifest, problems), problems)
    ledger = budget_shape(_read_json(layout.ledger, problems), layout.ledger.name, problems)
    result = result_shape(_read_json(layout.result, problems), problems)
    usage = usage_shape(_read_json(layout.usage, problems), layout.usage.name, problems)
    estimate = estimate_shape(_read_json(layout.estimate, problems), layout.estimate.name, problems)

    runs: list[EvalRun] = []
    for _, file in layout.numbered(RUNS):
        data = _read_json(file, problems)
        if data is None:
            continue
        try:
            run = EvalRun.from_dict(data)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{file.name}: not a run ({type(exc).__name__}: {str(exc)[:200]})")
            continue
        problem = run_problem(run)
        if problem is None:
            runs.append(run)
        else:
            problems.append(f"{file.name}: not a run ({problem})")
    pending = [p for p in (_read_pending(f, problems) for f in layout.pending_logs()) if p]
    named, lineage = _read_candidates(layout, problems)
    prompt_versions = _records(layout, PROMPT_VERSIONS, "a prompt version", version_shape, problems)
    turns = _records(layout, TURNS, "an agent turn", turn_shape, problems)

    if result is not None:
        status: Status = "finished"
    elif holder is not None:
        status = "in flight"
    elif manifest is None and not runs and not pending:
        status = "empty"
    else:
        status = "interrupted"
    return RunDirectory(
        directory=str(path),
        status=status,
        holder=holder if result is None else None,
        manifest=manifest,
        ledger=ledger,
        runs=tuple(runs),
        pending=tuple(pending),
        prompt_versions=tuple(prompt_versions),
        turns=tuple(turns),
        result=result,
        problems=tuple(problems),
        usage_so_far=usage,
        estimate=estimate,
        named_candidates=named,
        lineage=lineage,
        stopped=_stop_shape(_read_json(layout.stopped, problems), problems),
    )


def _stop_shape(data: Any, problems: list[str]) -> dict[str, str] | None:
    if data is None:
        return None
    if isinstance(data, dict) and all(isinstance(data.get(k), str) for k in ("at", "error", "message")):
        return {k: data[k] for k in ("at", "error", "message")}
    problems.append("stopped.json: not what a stopped compile writes (at, error, message)")
    return None


def _read_candidates(
    layout: RunLayout, problems: list[str]
) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, Any]]]:
    """``candidates.json`` as :func:`rlmoptimizer.storage.candidates.read_candidates` reads it, with what it could
    not use named in ``problems``."""
    file = layout.candidates
    if not file.exists():
        return {}, {}
    data = _read_json(file, problems)
    if data is None:
        return {}, {}
    named, lineage = read_candidates(layout.directory)
    if not isinstance(data, dict):
        problems.append(f"{file.name}: not the named candidates (a {type(data).__name__})")
    elif any(
        not isinstance(data.get(part, {}), dict)
        or len(kept) != len(data.get(part, {}))
        or not all(isinstance(v, dict) for v in data.get(part, {}).values())
        for part, kept in (("candidates", named), ("lineage", lineage))
    ):
        problems.append(f"{file.name}: ignored entries that are not {{id: {{...}}}}")
    return named, lineage_shape(lineage, problems)


def _records(layout: RunLayout, kind: Numbered, what: str, shape: Any, problems: list[str]) -> list[dict[str, Any]]:
    """The numbered JSON objects of ``kind`` in order, each in its ``shape``; a file holding something else is
    named in ``problems``."""
    found = []
    for _, file in layout.numbered(kind):
        data = _read_json(file, problems)
        if isinstance(data, dict):
            found.append(shape(data, f"{kind.folder}/{file.name}", problems))
        elif data is not None:
            problems.append(f"{kind.folder}/{file.name}: not {what} (a {type(data).__name__})")
    return found
