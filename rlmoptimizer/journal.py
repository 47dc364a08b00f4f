"""Everything a compile() paid for, on disk as soon as it exists.

Layout of a run directory (each file written atomically: complete or absent, and there as soon as the write
returns, so a killed process loses nothing written; turns and prompt versions are made durable against a
power loss a few milliseconds later, on a background thread, and all of them before ``write_result``
returns)::

    .lock                    locked (an OS file lock) by the one compile() using the directory
    holder.json              which process holds the lock (pid, host, since when) while it runs
    manifest.json            what this directory belongs to (program structure, data, metric, budget) and
                             what its stored scores depend on (evaluation LM, pass_threshold)
    ledger.json              the budget ledger after its latest change
    runs/run-0001.json       every evaluation run (written by RunStore)
    prompts/v-0001.json      every prompt version the agent made
    turns/turn-0001.json     every agent turn (reasoning, code, output)
    result.json              the final choice, once compile() has returned

A directory whose manifest differs from the current compile() is refused (RunDirectoryMismatchError)
rather than mixed in; so is one whose stored scores came from another evaluation LM, unless the caller
allows it. A changed ``pass_threshold`` is not a refusal: ``passed`` is recomputed from the stored scores.

One directory belongs to one live compile(): :class:`RunDirectoryLock` holds an OS lock on ``.lock`` for
as long as the compile runs, so a second compile() on the same directory (another process, or this one) is
refused at once (RunDirectoryInUseError). The OS drops the lock when its holder dies, even by SIGKILL, so
a dead holder never blocks a resume.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import re
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlmoptimizer.errors import ConfigurationError, RunDirectoryInUseError, RunDirectoryMismatchError
from rlmoptimizer.records import jsonable
from rlmoptimizer.run_store import atomic_write_json, fsync_path

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
try:  # Windows
    import msvcrt
except ImportError:
    msvcrt = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

MANIFEST_KEYS_THAT_MUST_MATCH = ("program", "trainset", "valset", "metric", "budget_limit")
LOCK_FILE = ".lock"
HOLDER_FILE = "holder.json"
_READ_ONLY_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}


# -- what a stored score depends on -----------------------------------------------------------------
# Settings of an LM that say where and how to connect, not what it answers: left out of its identity (and
# never written to disk: some are secrets).
_CONNECTION_KWARGS = frozenset({
    "api_key", "api_base", "base_url", "api_version", "organization", "headers", "extra_headers", "timeout",
    "request_timeout", "num_retries", "max_retries", "azure_ad_token", "vertex_credentials", "vertex_project",
    "vertex_location", "aws_region_name", "region_name",
})
_SECRET_WORDS = ("key", "secret", "password", "credential", "auth")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def lm_identity(lm: Any) -> dict[str, Any]:
    """What an LM answers depends on: its class, model name and sampling settings (temperature, max_tokens,
    ...), without connection settings or secrets."""
    kwargs = getattr(lm, "kwargs", None)
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    kept = {
        str(k): v for k, v in kwargs.items()
        if k not in _CONNECTION_KWARGS and not any(word in str(k).lower() for word in _SECRET_WORDS)
    }
    identity = {
        "class": f"{type(lm).__module__}.{type(lm).__qualname__}",
        "model": getattr(lm, "model", None),
        "model_type": getattr(lm, "model_type", None),
        "kwargs": kept,
    }
    return json.loads(_ADDRESS.sub("", json.dumps(jsonable(identity), sort_keys=True)))


def eval_lm_identity(lm: Any, program: Any) -> dict[str, Any]:
    """The identity of the LM that runs the program (``lm``), and of every LM pinned to one predictor
    (``predictor.lm``, which the program uses instead of ``lm`` for that step)."""
    per_step = {
        name: lm_identity(predictor.lm)
        for name, predictor in program.named_predictors()
        if getattr(predictor, "lm", None) is not None
    }
    return {"lm": lm_identity(lm), "per_step": per_step}


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def describe_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``"setting: old -> new"`` for every setting that differs between two nested dicts."""
    before, after = _flatten(old), _flatten(new)
    lines = []
    for key in sorted(set(before) | set(after)):
        if before.get(key, "<not set>") != after.get(key, "<not set>"):
            lines.append(
                f"{key}: {json.dumps(before.get(key, '<not set>'))} (stored) -> {json.dumps(after.get(key, '<not set>'))} (now)"
            )
    return lines


# -- one live compile per directory -----------------------------------------------------------------
def _describe_holder(directory: Path) -> str:
    try:
        holder = json.loads((directory / HOLDER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        holder = None
    if not isinstance(holder, dict):
        return "another compile() (its process did not record its details)"
    pid, host, since = holder.get("pid"), holder.get("host"), holder.get("since")
    if pid == os.getpid() and host == socket.gethostname():
        who = f"another compile() in this same process (pid {pid}; e.g. an earlier notebook cell or thread still running)"
    else:
        who = f"another compile(): process {pid} on host {host!r}"
    return f"{who}, running since {since}" if since else who


class RunDirectoryLock:
    """An exclusive OS lock on ``<directory>/.lock`` (``fcntl.flock``; ``msvcrt.locking`` on Windows) held for
    as long as one compile() uses the directory, plus ``holder.json`` naming the holder for the message a
    second compile() gets. The OS releases the lock when the holder exits or is killed.

    ``read_only=True`` is for reading back a finished run: nothing is created or written (an existing lock
    file is opened read-only; without one, the finished run is read without a lock)."""

    def __init__(self, directory: str | Path, *, read_only: bool = False) -> None:
        self.directory = Path(directory)
        self.read_only = read_only
        self._fd: int | None = None
        self._wrote_holder = False
        self._acquire()

    def _open(self) -> int | None:
        path = self.directory / LOCK_FILE
        if self.read_only:  # open what is there, create nothing
            try:
                return os.open(path, os.O_RDONLY)
            except OSError as exc:
                logger.debug("cannot open %s (%s); reading the finished run without a lock", path, exc)
                return None
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigurationError(
                f"run_storage_dir {str(self.directory)!r} cannot be written ({exc}); a run that is not finished "
                "must be written to as it goes. Pass a writable run_storage_dir."
            ) from exc

    def _acquire(self) -> None:
        fd = self._open()
        if fd is None:
            return
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            elif msvcrt is not None:  # pragma: no cover - Windows
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK, errno.EDEADLK):
                logger.warning("cannot lock %s (%s); going on without a lock", self.directory / LOCK_FILE, exc)
                return
            raise RunDirectoryInUseError(
                f"run_storage_dir {str(self.directory)!r} is in use by {_describe_holder(self.directory)}. "
                "One run directory belongs to one compile() at a time. Wait for that compile() to finish (or stop "
                "it) and run this one again to resume from everything it stored, or pass another run_storage_dir "
                "to start a separate run. A compile() that died leaves no lock behind."
            ) from None
        self._fd = fd
        if not self.read_only:
            now = datetime.datetime.now(datetime.timezone.utc)
            atomic_write_json(self.directory / HOLDER_FILE, {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": now.strftime("%Y-%m-%d %H:%M:%S UTC"),
                "since_epoch": now.timestamp(),
            }, durable=False)
            self._wrote_holder = True

    def release(self) -> None:
        """Give the directory up (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._wrote_holder:
            try:
                (self.directory / HOLDER_FILE).unlink(missing_ok=True)
            except OSError:
                pass
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
            elif msvcrt is not None:  # pragma: no cover - Windows
                os.lseek(fd, 0, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        except OSError:
            pass
        finally:
            os.close(fd)


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
        for sub in ("turns", "prompts"):  # only when missing: reading back a finished run writes nothing
            if not (self.directory / sub).is_dir():
                (self.directory / sub).mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._last_number: dict[str, int] = {}  # per subdirectory, read from disk once
        self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlmoptimizer-journal-sync")
        self._syncs: list[Future] = []

    # -- manifest ---------------------------------------------------------------------------------
    def open_manifest(
        self,
        manifest: dict[str, Any],
        *,
        legacy_examples: Callable[[], dict[str, str]] | None = None,
        allow_eval_lm_change: bool = False,
    ) -> bool:
        """Write the manifest of a new directory, or check it against an existing one.

        Returns True when the directory already held this same compile (a resume). ``manifest["eval_lm"]``
        must equal the stored one (else RunDirectoryMismatchError naming each differing setting, unless
        ``allow_eval_lm_change``); a changed ``pass_threshold`` is recorded and logged (the caller recomputes
        ``passed``). ``legacy_examples()`` gives the trainset/valset digests directories written before
        :data:`EXAMPLES_DIGEST_VERSION` recorded. Nothing is written when nothing changed."""
        path = self.directory / "manifest.json"
        if not path.exists():
            atomic_write_json(path, manifest)
            return False
        stored = json.loads(path.read_text(encoding="utf-8"))
        legacy = stored.get("examples_digest_version") != manifest.get("examples_digest_version")
        expected = {**manifest, **(legacy_examples() if legacy and legacy_examples is not None else {})}
        different = [key for key in MANIFEST_KEYS_THAT_MUST_MATCH if stored.get(key) != expected.get(key)]
        if different:
            hint = (
                " (This directory was written by an earlier version of rlmoptimizer, which identified examples "
                "holding objects by their memory address; such a run cannot be resumed in a new process.)"
                if legacy and {"trainset", "valset"} & set(different) else ""
            )
            raise RunDirectoryMismatchError(
                f"run_storage_dir {str(self.directory)!r} holds a run of a different "
                f"{', '.join(different)}; it cannot be resumed with this compile(). Use a new run_storage_dir "
                f"(or delete this one) to start over.{hint}"
            )
        updates: dict[str, Any] = {}
        if legacy:
            updates.update({key: manifest[key] for key in ("trainset", "valset", "examples_digest_version")})
        updates.update(self._check_eval_lm(stored, manifest["eval_lm"], allow_eval_lm_change))
        old_threshold, new_threshold = stored.get("pass_threshold"), manifest.get("pass_threshold")
        if old_threshold != new_threshold:
            logger.warning(
                "pass_threshold changed from %s to %s since this run directory was written: 'passed' of every "
                "stored example is recomputed from its stored score (score >= %s); no LM call is needed.",
                old_threshold, new_threshold, new_threshold,
            )
            updates["pass_threshold"] = new_threshold
        if updates:
            try:
                atomic_write_json(path, {**stored, **updates})
            except OSError as exc:
                if exc.errno not in _READ_ONLY_ERRNOS:
                    raise
                logger.warning("Could not record the change in %s (%s); the directory is read-only.", path, exc)
        return True

    def _check_eval_lm(self, stored: dict[str, Any], identity: dict[str, Any], allow_change: bool) -> dict[str, Any]:
        if "eval_lm" not in stored:
            logger.warning(
                "run_storage_dir %s was written before the evaluation LM was recorded; its stored scores are "
                "taken to come from the current evaluation LM (%s), which is recorded now.",
                self.directory, identity["lm"].get("model"),
            )
            return {"eval_lm": identity}
        if stored["eval_lm"] == identity:
            return {}
        lines = describe_differences(stored["eval_lm"], identity)
        listed = "\n".join(f"  - {line}" for line in lines)
        if not allow_change:
            raise RunDirectoryMismatchError(
                f"run_storage_dir {str(self.directory)!r} holds scores from a different evaluation LM than this "
                f"compile() uses:\n{listed}\nResuming would reuse the old LM's scores as if the new one had "
                "produced them. To start fresh, pass a new run_storage_dir (or move or delete this one); to resume "
                "with the stored scores anyway, pass RLMDocstringOptimizer(..., allow_eval_lm_change=True)."
            )
        logger.warning(
            "The evaluation LM differs from the one that produced the stored scores in %s (allowed by "
            "allow_eval_lm_change=True); the stored scores are reused:\n%s", self.directory, listed,
        )
        earlier = list(stored.get("earlier_eval_lms", [])) + [stored["eval_lm"]]
        return {"eval_lm": identity, "earlier_eval_lms": earlier}

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

    def write_ledger_if_changed(self, snapshot: dict[str, Any]) -> None:
        """:meth:`write_ledger` unless ``ledger.json`` already holds ``snapshot``."""
        if self.read_ledger() != snapshot:
            self.write_ledger(snapshot)

    def read_ledger(self) -> dict[str, Any] | None:
        path = self.directory / "ledger.json"
        return json.loads(path.read_text()) if path.exists() else None

    def write_result(self, result: dict[str, Any]) -> None:
        """Write ``result.json`` (after every turn and prompt version is on disk), unless it already holds
        ``result``: returning a finished run again writes nothing."""
        self.flush()
        path = self.directory / "result.json"
        try:
            unchanged = path.exists() and json.loads(path.read_text(encoding="utf-8")) == jsonable(result)
        except (OSError, ValueError):
            unchanged = False
        if not unchanged:
            atomic_write_json(path, result)
