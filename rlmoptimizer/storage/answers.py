"""Sub-LM answers kept in the run directory, so that a resumed compile replays them instead of paying again.

One JSON line per answer, ``{"key": ..., "text": ...}``, appended and flushed as soon as the answer arrives. The
key says what was asked (a digest of the prompt and how many times the same prompt was asked before in this
compile), so the same sequence of questions after a resume finds the same answers in the same order. A torn last
line (a process killed mid-write) is ignored, and the next answer starts a line of its own.

May import: ``rlmoptimizer.storage.layout`` and the standard library.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path

from rlmoptimizer.storage.layout import SUB_LM_ANSWERS

logger = logging.getLogger(__name__)


class AnswerStore:
    """Answers by key, in memory and (with a directory) in ``<directory>/<name>``."""

    def __init__(self, directory: str | Path | None = None, name: str = SUB_LM_ANSWERS) -> None:
        self.path = Path(directory) / name if directory is not None else None
        self._lock = threading.Lock()
        self._answers: dict[str, str] = {}
        self._asked: dict[str, int] = {}
        self._torn = False  # the file ends in a torn line: the next answer is written on a line of its own
        if self.path is not None and self.path.exists():
            data = self.path.read_bytes()
            self._torn = bool(data) and not data.endswith(b"\n")
            for line in data.decode("utf-8", errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a torn line
                if isinstance(entry, dict) and isinstance(entry.get("key"), str) and isinstance(entry.get("text"), str):
                    self._answers[entry["key"]] = entry["text"]

    def key_for(self, prompt: str) -> tuple[str, int]:
        """The key of the next asking of ``prompt`` and how many times it was asked before (0 the first time)."""
        digest = hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        with self._lock:
            seen = self._asked.get(digest, 0)
            self._asked[digest] = seen + 1
        return f"{digest}:{seen}", seen

    def get(self, key: str) -> str | None:
        with self._lock:
            return self._answers.get(key)

    def put(self, key: str, text: str) -> None:
        with self._lock:
            self._answers[key] = text
            if self.path is None:
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as handle:
                    start = "\n" if self._torn else ""
                    handle.write(start + json.dumps({"key": key, "text": text}, ensure_ascii=True) + "\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                self._torn = False
            except OSError as exc:  # the answer is still used; only a resume would ask again
                self._torn = True  # (a write cut short may have left part of its line)
                logger.warning("could not keep a sub-LM answer in %s: %s", self.path, exc)

    def __len__(self) -> int:
        with self._lock:
            return len(self._answers)
