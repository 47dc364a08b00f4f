"""The agent's notes: its running conclusions, kept in the run directory and shown on every turn.

The agent calls ``add_note(text)`` to record what it found, tried and concluded, and ``read_notes()`` to read them
back.
Notes are the optimizer's state: they are shown in the state block of every root-LM request, so they survive the
compaction of older turns, a sandbox restart (they live on the host, not in the sandbox) and a resume (they are
in ``notes.json`` in the run directory, written atomically after every change). They cost no budget.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from rlmoptimizer.storage.files import atomic_write_json
from rlmoptimizer.storage.layout import NOTES as FILENAME
from rlmoptimizer.storage.layout import RunLayout

logger = logging.getLogger(__name__)

MAX_NOTE_CHARS = 1_000
MAX_NOTES = 200

__all__ = ["FILENAME", "MAX_NOTE_CHARS", "MAX_NOTES", "NotesStore"]


class NotesStore:
    """Numbered notes, thread-safe, persisted to ``directory/notes.json`` (or kept in memory without one)."""

    def __init__(
        self, directory: str | Path | None = None, *, max_note_chars: int = MAX_NOTE_CHARS, max_notes: int = MAX_NOTES
    ) -> None:
        self.path = RunLayout(directory).notes if directory is not None else None
        self.max_note_chars = max_note_chars
        self.max_notes = max_notes
        self._lock = threading.Lock()
        self._notes: list[dict[str, Any]] = []
        if self.path is not None and self.path.exists():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                self._notes = [
                    {"id": int(n["id"]), "text": str(n["text"]), "created_at": n.get("created_at")}
                    for n in data.get("notes", [])
                ]
            except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:  # notes cost nothing: go on
                kept = self.path.with_name(self.path.name + ".damaged")
                try:
                    self.path.replace(kept)  # (the next note would write over it)
                except OSError:
                    kept = self.path
                logger.warning(
                    "%s cannot be read (%s: %s): the run goes on without the agent's notes; the file is kept as %s.",
                    self.path,
                    type(exc).__name__,
                    exc,
                    kept,
                )
                self._notes = []

    def add(self, text: str) -> str:
        """Keep ``text`` as a note; the reply says its number. Too long a note is refused (say it shorter); a text
        kept already is not kept twice."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("add_note(text) needs a non-empty string")
        text = text.strip()
        if len(text) > self.max_note_chars:
            raise ValueError(
                f"a note holds at most {self.max_note_chars} characters (this one has {len(text)}); "
                "keep the conclusion, not the data"
            )
        with self._lock:
            same = next((n for n in self._notes if n["text"] == text), None)
            if same is not None:  # kept already (e.g. by the same cell before an interrupt): one note
                return f"note {same['id']} kept already; your notes are shown on every turn"
            number = (self._notes[-1]["id"] + 1) if self._notes else 1
            self._notes.append({"id": number, "text": text, "created_at": time.time()})
            dropped = self._notes[: max(0, len(self._notes) - self.max_notes)]
            self._notes = self._notes[len(dropped) :]
            self._save()
        extra = f" (the oldest {len(dropped)} dropped: at most {self.max_notes} notes)" if dropped else ""
        return f"note {number} kept{extra}; your notes are shown on every turn"

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(n) for n in self._notes]

    def render(self, max_chars: int | None = None) -> str:
        """The notes as the state block shows them, newest kept when ``max_chars`` cannot hold them all (empty
        string when there are none)."""
        lines = [f"[{n['id']}] {n['text']}" for n in self.all()]
        if max_chars is None:
            return "\n".join(lines)
        kept: list[str] = []
        size = 0
        for line in reversed(lines):
            if size + len(line) + 1 > max_chars and kept:
                break
            kept.append(line[:max_chars])
            size += len(line) + 1
        hidden = len(lines) - len(kept)
        head = [f"({hidden} older note(s) not shown here; read_notes() returns them all)"] if hidden else []
        return "\n".join(head + kept[::-1])

    def __len__(self) -> int:
        with self._lock:
            return len(self._notes)

    def _save(self) -> None:
        if self.path is not None:
            atomic_write_json(self.path, {"notes": self._notes}, durable=False)
