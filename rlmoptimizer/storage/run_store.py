"""Evaluation runs on disk: one JSON file per run, ``<directory>/runs/<run_id>.json``, written atomically.

Runs are append-only snapshots: ids are handed out in order (``run-0001``, ``run-0002``, ...), continuing
after the highest id already on disk, so a resumed run directory keeps its history. A crash while
writing leaves the old file or the new one, never half of one; stray temporary files are ignored.
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlmoptimizer.records import SPLITS, EvalRun, ExampleResult
from rlmoptimizer.storage.files import BackgroundSync, WriteFailed, atomic_write_json, json_text, not_readable_here
from rlmoptimizer.storage.layout import RUNS, RunLayout

logger = logging.getLogger(__name__)


class PendingLog:
    """Append-only JSON lines: a header, then one completed record per line (flushed as written)."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self._handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in discard()
        except OSError as exc:
            raise WriteFailed(path, exc) from exc
        self._write(header)

    def _write(self, data: dict[str, Any]) -> None:
        try:
            self._handle.write(json_text(data) + "\n")
            self._handle.flush()
        except OSError as exc:  # a record that cannot be kept stops the run (it resumes from what is on disk)
            raise WriteFailed(self.path, exc) from exc

    def append(self, record: ExampleResult) -> None:
        with self._lock:
            if not self._handle.closed:
                self._write(record.to_dict(compact=True))

    def close(self) -> None:
        with self._lock:
            try:
                self._handle.close()
            except OSError as exc:  # its last lines could not be flushed (a full disk): the run stops, as in _write
                raise WriteFailed(self.path, exc) from exc

    def discard(self) -> None:
        """Close and delete the log (the records now live in a saved run)."""
        try:
            self.close()
        except WriteFailed:
            pass  # what it could not flush is kept in the saved run
        self.path.unlink(missing_ok=True)


def _run_number(run_id: str) -> int | None:
    return RUNS.number(run_id)


def _json_line(raw: bytes) -> Any:
    """One line of a pending log as JSON, or None when it is torn: cut anywhere, also inside a multi-byte UTF-8
    character (the log keeps non-ASCII characters as they are, :func:`~rlmoptimizer.storage.files.json_text`)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is one
        return None


def pending_header(header: dict[str, Any]) -> dict[str, Any]:
    """The header of a pending log with its fields typed (``split``, ``instructions``, ``label``, ``requested``,
    ``charged``, ``rollout``); :class:`ValueError` naming what is wrong when it cannot say what was evaluated."""
    split, instructions = header.get("split"), header.get("instructions")
    if split not in SPLITS:
        raise ValueError(f"its header names no split (split={split!r})")
    if not isinstance(instructions, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in instructions.items()
    ):
        raise ValueError("its header holds no {step: instructions} map")
    typed = {
        "split": split,
        "instructions": dict(instructions),
        "label": str(header.get("label", "agent")),
        "charged": header.get("charged") is True,
    }
    for key in ("requested", "rollout"):
        value = header.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"its header's {key} is not a count ({value!r})")
        typed[key] = value
    return typed


def read_pending_log(path: Path) -> tuple[dict[str, Any], list[ExampleResult]] | None:
    """``(header, records)`` of the in-flight log at ``path``, reading past a torn last line (a record being
    written, cut at any byte); None when it has no readable header and nothing after it (the header was being
    written). The header's fields are typed (:func:`pending_header`); a header that cannot say what was
    evaluated, or that cannot be read although records follow it, is a :class:`ValueError` (damaged, not torn: the
    log is kept). A damaged record line before the last is skipped with a warning (its example is evaluated again
    when needed); the records after it are kept. Reads only; ``OSError`` (e.g. the file is gone) propagates."""
    first, *rest = path.read_bytes().split(b"\n")
    rest = [line for line in rest if line.strip()]
    header = _json_line(first)
    if not isinstance(header, dict):
        if rest:
            raise ValueError(f"its header cannot be read, but {len(rest)} record line(s) follow it")
        return None
    header = pending_header(header)
    requested = header["requested"]
    records, damaged = [], 0
    for number, line in enumerate(rest, start=1):
        try:
            records.append(ExampleResult.from_dict(_json_line(line)))
        except (ValueError, KeyError, TypeError, AttributeError):
            damaged += number < len(rest)  # only the last line can be torn by a kill
    if damaged:
        logger.warning(
            "%s: %d damaged record line(s) skipped, %d record(s) kept; those examples are evaluated (and paid) again "
            "when needed.",
            path,
            damaged,
            len(records),
        )
    if not requested:
        header["requested"] = len(records)
    return header, records


class RunStore:
    """Append-only store of :class:`EvalRun` by id. ``directory=None`` uses a fresh temporary directory.

    Thread safe. Runs are kept in memory as well as on disk; the disk is read once, at construction.
    A run saved with the pending log of its evaluation is written and fsynced on a background thread, which
    deletes the log only then: until the run file is durable, the log still holds its records. :meth:`flush`
    waits for those writes.

    With ``pass_threshold`` given, ``passed`` of every record read from disk (stored runs and in-flight logs)
    is recomputed from its stored score at that threshold, so runs written under another threshold count
    the same way as new ones.
    """

    def __init__(self, directory: str | Path | None = None, *, pass_threshold: float | None = None) -> None:
        self.is_temporary = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="rlmoptimizer-")) if directory is None else Path(directory)
        self.layout = RunLayout(self.directory)
        self.pass_threshold = pass_threshold
        runs = self.layout.folder(RUNS)
        if not runs.is_dir():  # only when missing: reading back a finished run writes nothing
            runs.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._runs: dict[str, EvalRun] = {}
        self._sync = BackgroundSync("runs")
        self.unreadable: list[str] = []  # run files skipped as unreadable (damaged): their examples run again
        self._load()
        numbers = [_run_number(r) or 0 for r in self._runs] + [n for n, _ in self.layout.numbered(RUNS)]
        self._last_number = max(numbers, default=0)  # an unreadable run file's number is never written over

    def __repr__(self) -> str:
        return f"RunStore({str(self.directory)!r}, runs={len(self)})"

    def _load(self) -> None:
        for _, path in self.layout.numbered(RUNS):
            try:
                run = EvalRun.from_dict(json.loads(path.read_text(encoding="utf-8")))
            except PermissionError as exc:  # not damaged: paying its examples again would be the loss
                raise not_readable_here(path, exc) from None
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.warning("skipping unreadable run file %s: %s", path, exc)
                self.unreadable.append(str(path))
                continue
            self._runs[run.run_id] = replace(run, records=self._rescored(run.records))

    def _rescored(self, records: Any) -> tuple[ExampleResult, ...]:
        """``records`` with ``passed`` recomputed at :attr:`pass_threshold` (unchanged when it is None)."""
        if self.pass_threshold is None:
            return tuple(records)
        threshold = self.pass_threshold
        return tuple(
            record
            if record.passed == (record.error is None and record.score >= threshold)
            else replace(record, passed=record.error is None and record.score >= threshold)
            for record in records
        )

    def next_run_id(self) -> str:
        """A new id, one above the highest id handed out or found on disk."""
        with self._lock:
            self._last_number += 1
            return RUNS.stem(self._last_number)

    def save(self, run: EvalRun, settles: PendingLog | None = None) -> None:
        """Write ``run`` to ``runs/<run_id>.json`` (atomically) and keep it in memory.

        With ``settles`` (the pending log of the evaluation that made ``run``), the file is written and made
        durable on a background thread, which then deletes the log (until then the log holds the records, so
        a crash loses nothing; :meth:`flush` waits for it); without it, before this returns."""
        number = _run_number(run.run_id)
        if number is None:
            raise ValueError(f"run_id must look like 'run-0001', got {run.run_id!r}")
        path = self.layout.run(run.run_id)
        if settles is None:
            atomic_write_json(path, run.to_dict(compact=True))
        else:
            settles.close()
            # Written now (made durable in the background): the ledger written after this run's event must never
            # count records that a kill could leave only in the pending log, or a resume would charge them again.
            atomic_write_json(path, run.to_dict(compact=True), durable=False)
            self._sync.submit(path, then_remove=settles.path)
        with self._lock:
            self._runs[run.run_id] = run
            self._last_number = max(self._last_number, number)

    def flush(self) -> None:
        """Wait until every run saved so far is on disk (and the pending logs it settles are gone)."""
        self._sync.flush()

    def get(self, run_id: str) -> EvalRun:
        """The run with this id; :class:`KeyError` naming the known ids if there is none."""
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                known = sorted(self._runs, key=lambda r: _run_number(r) or 0)
                shown = ", ".join(known) if known else "none yet"
                raise KeyError(f"unknown run_id {run_id!r}; known run ids: {shown}")
            return run

    def all(self) -> list[EvalRun]:
        """Every run, in id order."""
        with self._lock:
            return sorted(self._runs.values(), key=lambda r: _run_number(r.run_id) or 0)

    def __contains__(self, run_id: object) -> bool:
        with self._lock:
            return run_id in self._runs

    # -- records of an evaluation in flight --------------------------------------------------------
    def open_pending(self, header: dict[str, Any]) -> PendingLog:
        """A log of the records of one evaluation as they complete, so that a process killed mid-evaluation
        (SIGKILL, OOM, power cut) loses none of what it paid for. Discard it once the run is saved."""
        return PendingLog(self.layout.pending_log(uuid.uuid4().hex), header)

    def pending(self) -> list[tuple[Path, dict[str, Any], list[ExampleResult]]]:
        """Logs left by evaluations that never finished: ``(path, header, records)``; a torn last line is ignored,
        and a log without a readable header (nothing was paid for yet) is removed."""
        found = []
        for path in self.layout.pending_logs():
            try:
                parsed = read_pending_log(path)
            except FileNotFoundError:  # settled since it was listed (its run saved; the log removed)
                continue
            except ValueError as exc:  # damaged, not torn: kept for a person to look at, never guessed at
                logger.warning("skipping the in-flight log %s: %s", path, exc)
                continue
            if parsed is None:
                path.unlink(missing_ok=True)
                continue
            header, records = parsed
            found.append((path, header, list(self._rescored(records))))
        return found

    def __len__(self) -> int:
        with self._lock:
            return len(self._runs)
