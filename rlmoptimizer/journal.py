"""Everything a compile() paid for, on disk as soon as it exists.

Layout of a run directory (each file written atomically: complete or absent, and there as soon as the write
returns, so a killed process loses nothing written; turns and prompt versions are made durable against a
power loss a few milliseconds later, on a background thread, and all of them before ``write_result``
returns)::

    manifest.json            what this directory belongs to (program structure, data, metric, budget)
    ledger.json              the budget ledger after its latest change
    runs/run-0001.json       every evaluation run (written by RunStore)
    prompts/v-0001.json      every prompt version the agent made
    turns/turn-0001.json     every agent turn (reasoning, code, output)
    usage.json               LM calls, tokens and dollars per role, kept current while the run goes
    notes.json               the agent's notes (rlmoptimizer.notes)
    result.json              the final choice, once compile() has returned

A directory whose manifest differs from the current compile() is refused (RunDirectoryMismatchError)
rather than mixed in.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlmoptimizer.errors import RunDirectoryMismatchError
from rlmoptimizer.run_store import atomic_write_json, fsync_path

logger = logging.getLogger(__name__)

MANIFEST_KEYS_THAT_MUST_MATCH = ("program", "trainset", "valset", "metric", "budget_limit")


def _fsync(path: Path) -> None:
    """Flush ``path`` and its directory entry to disk (best effort where the platform refuses)."""
    fsync_path(path, os.O_RDWR)
    fsync_path(path.parent)


class RunJournal:
    """Numbered JSON files for turns and prompt versions, plus the ledger and the manifest.

    Turns and prompt versions are written on the caller's thread without waiting for the disk (the agent's
    turn goes on), then fsynced on one background thread; :meth:`flush` (called by :meth:`write_result`)
    waits for those syncs."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        for sub in ("turns", "prompts"):
            (self.directory / sub).mkdir(exist_ok=True)
        self._lock = threading.Lock()
        self._last_number: dict[str, int] = {}  # per subdirectory, read from disk once
        self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlmoptimizer-journal-sync")
        self._syncs: list[Future] = []

    # -- manifest ---------------------------------------------------------------------------------
    def open_manifest(self, manifest: dict[str, Any]) -> bool:
        """Write the manifest of a new directory, or check it against an existing one.

        Returns True when the directory already held this same compile (a resume)."""
        path = self.directory / "manifest.json"
        if not path.exists():
            atomic_write_json(path, manifest)
            return False
        stored = json.loads(path.read_text())
        different = [key for key in MANIFEST_KEYS_THAT_MUST_MATCH if stored.get(key) != manifest.get(key)]
        if different:
            raise RunDirectoryMismatchError(
                f"run_storage_dir {str(self.directory)!r} holds a run of a different "
                f"{', '.join(different)}; it cannot be resumed with this compile(). Use a new run_storage_dir "
                "(or delete this one) to start over."
            )
        return True

    # -- numbered records -------------------------------------------------------------------------
    def _numbered(self, sub: str, prefix: str) -> list[tuple[int, Path]]:
        found = []
        for path in (self.directory / sub).glob(f"{prefix}-*.json"):
            number = path.stem.split("-")[-1]
            if number.isdigit():
                found.append((int(number), path))
        return sorted(found)

    def _next_path(self, sub: str, prefix: str) -> Path:
        """The next numbered path (call with the lock held); the directory is listed only the first time."""
        last = self._last_number.get(sub)
        if last is None:
            existing = self._numbered(sub, prefix)
            last = existing[-1][0] if existing else 0
        self._last_number[sub] = last + 1
        return self.directory / sub / f"{prefix}-{last + 1:04d}.json"

    def _read_all(self, sub: str, prefix: str) -> list[dict[str, Any]]:
        return [json.loads(path.read_text()) for _, path in self._numbered(sub, prefix)]

    def _write_numbered(self, sub: str, prefix: str, data: dict[str, Any]) -> None:
        with self._lock:
            path = self._next_path(sub, prefix)
            atomic_write_json(path, data, durable=False)
            self._syncs = [future for future in self._syncs if not future.done()]
            try:
                self._syncs.append(self._syncer.submit(_fsync, path))
            except RuntimeError:  # the interpreter is shutting down: no new threads, sync here
                _fsync(path)

    def flush(self) -> None:
        """Wait until every turn and prompt version written so far is on disk."""
        with self._lock:
            syncs, self._syncs = self._syncs, []
        for future in syncs:
            try:
                future.result()
            except Exception as exc:  # _fsync is best effort; nothing to undo
                logger.warning("Could not sync a journal file to disk: %s", exc)

    def write_turn(self, turn: dict[str, Any]) -> None:
        self._write_numbered("turns", "turn", turn)

    def turns(self) -> list[dict[str, Any]]:
        return self._read_all("turns", "turn")

    def write_prompt_version(self, version: dict[str, Any]) -> None:
        self._write_numbered("prompts", "v", version)

    def prompt_versions(self) -> list[dict[str, Any]]:
        return self._read_all("prompts", "v")

    # -- ledger and result ------------------------------------------------------------------------
    def write_ledger(self, snapshot: dict[str, Any]) -> None:
        with self._lock:
            atomic_write_json(self.directory / "ledger.json", snapshot, durable=False)

    def write_usage(self, snapshot: dict[str, Any]) -> None:
        """usage.json: LM calls, tokens and dollars per role so far (rlmoptimizer.usage)."""
        atomic_write_json(self.directory / "usage.json", snapshot, durable=False)

    def read_ledger(self) -> dict[str, Any] | None:
        path = self.directory / "ledger.json"
        return json.loads(path.read_text()) if path.exists() else None

    def write_result(self, result: dict[str, Any]) -> None:
        self.flush()
        atomic_write_json(self.directory / "result.json", result)
