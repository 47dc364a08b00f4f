"""Everything a compile() paid for, on disk as soon as it exists.

Layout of a run directory (each file written atomically: complete or absent)::

    manifest.json            what this directory belongs to (program structure, data, metric, budget)
    ledger.json              the budget ledger after its latest change
    runs/run-0001.json       every evaluation run (written by RunStore)
    prompts/v-0001.json      every prompt version the agent made
    turns/turn-0001.json     every agent turn (reasoning, code, output)
    result.json              the final choice, once compile() has returned

A directory whose manifest differs from the current compile() is refused (RunDirectoryMismatchError)
rather than mixed in.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from rlmoptimizer.errors import RunDirectoryMismatchError
from rlmoptimizer.run_store import atomic_write_json

MANIFEST_KEYS_THAT_MUST_MATCH = ("program", "trainset", "valset", "metric", "budget_limit")


class RunJournal:
    """Numbered JSON files for turns and prompt versions, plus the ledger and the manifest."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        for sub in ("turns", "prompts"):
            (self.directory / sub).mkdir(exist_ok=True)
        self._lock = threading.Lock()

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
    def _next_path(self, sub: str, prefix: str) -> Path:
        existing = sorted((self.directory / sub).glob(f"{prefix}-*.json"))
        number = int(existing[-1].stem.split("-")[-1]) + 1 if existing else 1
        return self.directory / sub / f"{prefix}-{number:04d}.json"

    def _read_all(self, sub: str, prefix: str) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.directory / sub).glob(f"{prefix}-*.json"))]

    def write_turn(self, turn: dict[str, Any]) -> None:
        with self._lock:
            atomic_write_json(self._next_path("turns", "turn"), turn)

    def turns(self) -> list[dict[str, Any]]:
        return self._read_all("turns", "turn")

    def write_prompt_version(self, version: dict[str, Any]) -> None:
        with self._lock:
            atomic_write_json(self._next_path("prompts", "v"), version)

    def prompt_versions(self) -> list[dict[str, Any]]:
        return self._read_all("prompts", "v")

    # -- ledger and result ------------------------------------------------------------------------
    def write_ledger(self, snapshot: dict[str, Any]) -> None:
        with self._lock:
            atomic_write_json(self.directory / "ledger.json", snapshot, durable=False)

    def read_ledger(self) -> dict[str, Any] | None:
        path = self.directory / "ledger.json"
        return json.loads(path.read_text()) if path.exists() else None

    def write_result(self, result: dict[str, Any]) -> None:
        atomic_write_json(self.directory / "result.json", result)
