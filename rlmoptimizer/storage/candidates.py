"""The named candidates of a compile (``proposal-N``, ``gepa-N``) and their lineage, kept in the run directory.

``candidates.json`` holds ``{"candidates": {id: {step: text}}, "lineage": {id: {...}}}``, rewritten atomically
whenever a move names a new candidate, so that after a resume the agent's history still means what it says
(``adopt_candidate('gepa-3')`` works) and the report can show where the returned program came from.

May import: ``rlmoptimizer.storage.files``, ``.layout`` and the standard library.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rlmoptimizer.storage.files import WriteFailed, atomic_write_json
from rlmoptimizer.storage.layout import RunLayout

logger = logging.getLogger(__name__)


def read_candidates(directory: str | Path | None) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, Any]]]:
    """``(candidates, lineage)`` as kept in ``directory``; empty when there is no file or it cannot be read."""
    if directory is None:
        return {}, {}
    path = RunLayout(directory).candidates
    try:
        data = json.loads(path.read_bytes().decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        return {}, {}
    if not isinstance(data, dict):
        return {}, {}
    candidates = (
        {
            name: {str(k): v for k, v in mapping.items() if isinstance(v, str)}
            for name, mapping in (data.get("candidates") or {}).items()
            if isinstance(name, str) and isinstance(mapping, dict)
        }
        if isinstance(data.get("candidates"), dict)
        else {}
    )
    lineage = (
        {
            name: value
            for name, value in (data.get("lineage") or {}).items()
            if isinstance(name, str) and isinstance(value, dict)
        }
        if isinstance(data.get("lineage"), dict)
        else {}
    )
    return candidates, lineage


def write_candidates(
    directory: str | Path | None, candidates: dict[str, dict[str, str]], lineage: dict[str, dict[str, Any]]
) -> None:
    if directory is None:
        return
    try:
        atomic_write_json(
            RunLayout(directory).candidates, {"candidates": candidates, "lineage": lineage}, durable=False
        )
    except WriteFailed as exc:  # the candidates still work in this process
        logger.warning("could not keep the named candidates in %s: %s", directory, exc)


def read_gepa_progress(directory: str | Path | None) -> dict[str, dict[str, Any]]:
    """``{GEPA run name: {"budget", "taken" (units paid or reserved), "reserved" (of those, reserved for work under
    way, when some were), "finished", "checks" (what was taken at each of
    its stop checks, so that a replay makes them as it did), "evaluations" (what it had spent on evaluations at each),
    "start" (the digest of the instructions it started from), "started_at" (when it started) and, once finished, "best_new" (its best candidate's id
    when that is not where it started)}}`` as kept in ``directory``; empty when there is none (entries of another
    shape are dropped; "checks" is empty when unknown)."""
    if directory is None:
        return {}
    try:
        data = json.loads(RunLayout(directory).gepa_runs.read_bytes().decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    def checks(value: Any) -> list[int]:
        return [int(v) for v in value] if isinstance(value, list) and all(count(v) for v in value) else []

    return {
        name: {
            "budget": entry["budget"],
            "taken": entry["taken"],
            **({"reserved": entry["reserved"]} if count(entry.get("reserved")) and entry["reserved"] else {}),
            "finished": entry["finished"],
            "checks": checks(entry.get("checks")),
            "evaluations": checks(entry.get("evaluations")),
            **{key: entry[key] for key in ("start", "best_new") if isinstance(entry.get(key), str)},
            **(
                {"started_at": float(entry["started_at"])}
                if isinstance(entry.get("started_at"), (int, float)) and not isinstance(entry["started_at"], bool)
                else {}
            ),
        }
        for name, entry in data.items()
        if isinstance(name, str)
        and isinstance(entry, dict)
        and count(entry.get("budget"))
        and count(entry.get("taken"))
        and isinstance(entry.get("finished"), bool)
    }


def write_gepa_progress(directory: str | Path | None, progress: dict[str, dict[str, Any]]) -> None:
    """Keep what each GEPA run has paid or reserved so far, and whether it finished: a run killed in the middle and
    replayed on resume (the same call) starts its slice with that much already taken, so the two processes
    together never spend more than its budget; a finished one is not replayed under its name."""
    if directory is None:
        return
    # (not kept, a resume would take a GEPA run for new and could pay past its budget: a failed write stops the run)
    atomic_write_json(RunLayout(directory).gepa_runs, dict(progress), durable=False)


def gepa_runs_done(progress: dict[str, dict[str, Any]], named: set[Any], replaying: set[str]) -> int:
    """The number of the last GEPA run an earlier process of this compile is done with: the highest run number known
    (its progress, or the lineage of its candidates), less the runs at the end that a resume runs again: those started
    in the turn the resume replays, else the last run when it did not finish (cut off, or stopped by an error; one
    that did not finish with runs after it is over). Runs are named by number
    (``gepa run 2``), so the next one is this plus one: the first of those run again, else a new one."""
    numbers = {}
    for name in {*progress, *(n for n in named if isinstance(n, str))}:
        tail = name.removeprefix("gepa run ")
        if tail.isdigit():
            numbers[int(tail)] = name
    top = last = max(numbers, default=0)
    while last and numbers.get(last) in replaying:  # started in the turn the resume replays
        last -= 1
    if last == top and last and not progress.get(numbers[last], {}).get("finished", True):  # cut off, or stopped
        last -= 1
    return last


def replayed_gepa_runs(directory: str | Path | None, progress: dict[str, dict[str, Any]]) -> set[str]:
    """The GEPA runs of ``progress`` an earlier process started in the agent turn a resume replays: its reply was kept
    (``pending_reply.json``, with the time it was kept) before its code ran, so they started after; the replayed
    turn's ``run_gepa`` calls are those runs again."""
    path = RunLayout(directory).pending_reply if directory is not None else None
    if path is None or not path.is_file():  # no turn to replay (or no directory)
        return set()
    try:  # when the reply was kept (written in it: a copy of the directory keeps it), else the file's time
        since = float(json.loads(path.read_text(encoding="utf-8"))["kept_at"])
    except (OSError, ValueError, KeyError, TypeError):
        try:
            since = path.stat().st_mtime
        except OSError:
            return set()
    return {name for name, entry in progress.items() if entry.get("started_at", 0.0) >= since}
