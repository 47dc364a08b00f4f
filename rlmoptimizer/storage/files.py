"""Files written atomically: complete or absent, never half of one; durable now or a moment later.

:func:`atomic_write_text` writes through a temporary file in the same directory and ``os.replace``. With
``durable=True`` it fsyncs the file and its directory before returning; with ``durable=False`` a
:class:`BackgroundSync` can make the file durable a few milliseconds later on its own thread, so the caller
does not wait for the disk (it can also write the file there), and :meth:`BackgroundSync.flush` waits for
every sync queued so far.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlmoptimizer.errors import RunDirectoryMismatchError

logger = logging.getLogger(__name__)


def _umask() -> int:
    """The process's umask, read where it can be read without changing it (Linux), else set and restored at import
    (before any thread of ours writes a file)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()
"""The mode of the files written here: what ``open()`` would give them (``mkstemp`` makes them private)."""


class WriteFailed(BaseException):  # noqa: N818 - a stop, as asyncio's CancelledError, not an error to handle
    """A file of the run directory could not be written (a full disk, a permission taken away): the run stops, and
    resumes from what is on disk once the directory can be written again. A ``BaseException``, as asyncio's
    ``CancelledError``, so that no ``except Exception`` of a move, a tool or the loop takes it for a move that
    failed and carries on (and the run ends as finished, with what it could not keep lost)."""

    def __init__(self, path: str | Path, error: OSError) -> None:
        super().__init__(f"could not write {path}: {error.strerror or error}")
        self.path = str(path)
        self.error = error


def not_readable_here(path: str | Path, error: PermissionError) -> RunDirectoryMismatchError:
    """The refusal of a run directory's file this user may not read: not damaged (restoring it, or starting over and
    paying everything again, would be the wrong advice), but another user's or one whose permissions changed."""
    return RunDirectoryMismatchError(
        f"{path} cannot be read ({error.strerror or error}): it was written by another user or its permissions "
        "were changed. Give this user read and write access to the run directory (e.g. chmod -R u+rw, or run as "
        "its owner), then compile again: nothing is lost."
    )


def atomic_write_text(path: str | Path, text: str, durable: bool = True) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory, fsync, then ``os.replace``.

    With ``durable=False`` the fsyncs are skipped: the file is still complete or absent if the process dies,
    but a power loss may lose the latest version (for state rewritten very often, like the ledger)."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        if hasattr(os, "fchmod"):  # (not on Windows, where the mode says little)
            os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(exc, OSError):
            raise WriteFailed(path, exc) from exc
        raise
    if durable:
        fsync_path(path.parent)


def json_text(data: Any, **kwargs: Any) -> str:
    """``json.dumps(data)`` with non-ASCII kept as is, unless the text holds a lone surrogate (half of a character,
    as an LM or a sliced string may produce), which has no UTF-8 form: then every non-ASCII character is escaped,
    and the JSON still reads back to the same strings."""
    text = json.dumps(data, ensure_ascii=False, **kwargs)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(data, ensure_ascii=True, **kwargs)
    return text


def atomic_write_json(path: str | Path, data: Any, durable: bool = True) -> None:
    """:func:`atomic_write_text` of ``data`` as indented JSON (:func:`json_text`: non-ASCII kept as is)."""
    atomic_write_text(path, json_text(data, indent=2) + "\n", durable=durable)


def fsync_path(path: Path, flags: int = os.O_RDONLY) -> None:
    """fsync a file or directory where the platform allows it; best effort (a refusal is ignored)."""
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file_and_directory(path: Path) -> None:
    """Flush ``path`` and its directory entry to disk (best effort where the platform refuses)."""
    fsync_path(path, os.O_RDWR)
    fsync_path(path.parent)


_UNSET: Any = object()


def _write_sync_remove(path: Path, then_remove: Path | None, data: Any) -> None:
    if data is not _UNSET:
        atomic_write_json(path, data, durable=False)
    fsync_file_and_directory(path)
    if then_remove is not None:
        then_remove.unlink(missing_ok=True)


class BackgroundSync:
    """fsyncs files on one background thread, so that the writer does not wait for the disk. The thread starts with
    the first file and ends at :meth:`flush`: none outlives the compile that wrote."""

    def __init__(self, name: str) -> None:
        self._lock = threading.Lock()
        self._name = name
        self._syncer: ThreadPoolExecutor | None = None
        self._syncs: list[Future] = []

    def submit(self, path: Path, then_remove: Path | None = None, data: Any = _UNSET) -> None:
        """Make ``path`` durable soon, then delete ``then_remove`` (a file whose content ``path`` now holds
        durably). ``path`` is already written with ``durable=False``, or, with ``data``, is written here first
        (:func:`atomic_write_json`), off the caller's thread. If the write fails, ``then_remove`` stays."""
        with self._lock:
            self._syncs = [future for future in self._syncs if not future.done()]
            try:
                if self._syncer is None:
                    self._syncer = ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix=f"rlmoptimizer-{self._name}-sync"
                    )
                self._syncs.append(self._syncer.submit(_write_sync_remove, path, then_remove, data))
            except RuntimeError:  # the interpreter is shutting down: no new threads, do it here
                _write_sync_remove(path, then_remove, data)

    def flush(self) -> None:
        """Wait until every file submitted so far is on disk, and end the thread (the next file starts another)."""
        with self._lock:
            syncs, self._syncs = self._syncs, []
            syncer, self._syncer = self._syncer, None
        for future in syncs:
            try:
                future.result()
            except (Exception, WriteFailed) as exc:  # fsync is best effort; nothing to undo
                logger.warning("Could not sync a file to disk: %s", exc)
        if syncer is not None:
            syncer.shutdown(wait=True)  # its files are written: the thread ends now
