"""One run directory belongs to one live compile(): an operating-system lock on ``<directory>/.lock``, with
``holder.json`` naming the holder. The system releases the lock when its process ends, even when it is killed.

May import: the standard library and ``rlmoptimizer.errors``.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from rlmoptimizer.errors import ConfigurationError, RunDirectoryInUseError
from rlmoptimizer.storage.files import atomic_write_json
from rlmoptimizer.storage.layout import HOLDER as HOLDER_FILE
from rlmoptimizer.storage.layout import LOCK as LOCK_FILE

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
try:  # Windows
    import msvcrt
except ImportError:
    msvcrt = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

READ_ONLY_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}


def _describe_holder(directory: Path) -> str:
    try:
        holder = json.loads((directory / HOLDER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        holder = None
    if not isinstance(holder, dict):
        return "another compile() (its process did not record its details)"
    pid, host, since = holder.get("pid"), holder.get("host"), holder.get("since")
    if pid == os.getpid() and host == socket.gethostname():
        who = (
            f"another compile() in this same process (pid {pid}; e.g. an earlier notebook cell or thread still running)"
        )
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
            _lock_now(fd)
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
        if self.read_only:
            return
        try:
            now = datetime.datetime.now(datetime.timezone.utc)
            atomic_write_json(
                self.directory / HOLDER_FILE,
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": now.strftime("%Y-%m-%d %H:%M:%S UTC"),
                    "since_epoch": now.timestamp(),
                },
                durable=False,
            )
        except BaseException:  # (a full disk, say): the directory is not held by a compile that could not start
            self.release()
            raise
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


def _lock_now(fd: int, tries: int = 5) -> None:
    """Take the exclusive lock on ``fd`` without waiting for a holder; a report testing the lock (it takes it shared
    for an instant, :func:`_lock_is_held`) is waited out with a few short tries. OSError when it stays taken."""
    for attempt in range(tries):
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            elif msvcrt is not None:  # pragma: no cover - Windows
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return
        except OSError as exc:
            if attempt == tries - 1 or exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            time.sleep(0.02 * (attempt + 1))


def _lock_is_held(lock_file: Path, unknown: bool = False) -> bool:
    """Test the OS lock on ``lock_file`` by asking for it and giving it back at once (a shared ``flock``; on
    Windows the same one-byte ``msvcrt.locking`` region the holder locks); ``unknown`` when the file exists but
    cannot be opened (another user's)."""
    try:
        fd = os.open(lock_file, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return unknown
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        elif msvcrt is not None:  # pragma: no cover - Windows
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        else:  # pragma: no cover - no OS lock at all: "in flight" cannot be told from "interrupted"
            return False
    except OSError as exc:
        return exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK, errno.EDEADLK)
    finally:
        os.close(fd)
    return False


# Windows: OpenProcess access right, GetExitCodeProcess's "still running", and OpenProcess's error for a pid no
# process has. (There, os.kill(pid, 0) is no probe: signal 0 is CTRL_C_EVENT, sent to the pid's console group.)
_PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
_STILL_ACTIVE = 259
_ERROR_ACCESS_DENIED = 5


def _kernel32() -> Any:  # pragma: no cover - Windows
    import ctypes
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.OpenProcess.restype = wintypes.HANDLE
    kernel32.OpenProcess.argtypes = (wintypes.DWORD, wintypes.BOOL, wintypes.DWORD)
    kernel32.GetExitCodeProcess.restype = wintypes.BOOL
    kernel32.GetExitCodeProcess.argtypes = (wintypes.HANDLE, ctypes.POINTER(wintypes.DWORD))
    kernel32.CloseHandle.argtypes = (wintypes.HANDLE,)
    return kernel32


def _windows_process_alive(pid: int, kernel32: Any = None, last_error: Any = None) -> bool:
    """Whether process ``pid`` runs, asked of Windows (``OpenProcess`` + ``GetExitCodeProcess``) without
    signalling it. ``kernel32`` and ``last_error`` default to the real ones (``ctypes.get_last_error``)."""
    import ctypes

    if kernel32 is None:  # pragma: no cover - Windows
        kernel32, last_error = _kernel32(), ctypes.get_last_error
    handle = kernel32.OpenProcess(_PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    if not handle:
        # no such process (invalid parameter), or one we may not query, which exists (access denied)
        return last_error() == _ERROR_ACCESS_DENIED
    try:
        code = ctypes.c_ulong(0)
        if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
            return True  # it exists but its state cannot be read: alive, as POSIX counts EPERM
        return code.value == _STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` (on this host) runs, without disturbing it."""
    if pid <= 0:
        return False  # 0 and negative pids name process groups to os.kill, not one process
    if sys.platform == "win32":  # pragma: no cover - Windows
        return _windows_process_alive(pid)
    try:
        os.kill(pid, 0)  # POSIX: signal 0 checks for existence and permission, and sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    except OSError:
        return False
    return True


def holder_of(directory: str | Path) -> dict[str, Any] | None:
    """``holder.json`` of a compile() using ``directory`` now (pid, host, since), or None when none is. The lock
    itself is tested, with a shared lock given back at once; on this host the holder's process must be alive too (a
    SIGKILLed one leaves ``holder.json`` behind, and its pid may be another process's by now: a container's 1, say).
    Never writes."""
    path = Path(directory)
    try:
        holder = json.loads((path / HOLDER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        holder = None
    if isinstance(holder, dict) and isinstance(holder.get("pid"), int):
        if holder.get("host") == socket.gethostname():
            alive = _process_alive(holder["pid"])
            return holder if alive and _lock_is_held(path / LOCK_FILE, unknown=True) else None
        return holder if _lock_is_held(path / LOCK_FILE) else None
    # no (readable) holder.json: a compile() in its first instant, or one whose details were lost
    return {"pid": None, "host": None, "since": None} if _lock_is_held(path / LOCK_FILE) else None
