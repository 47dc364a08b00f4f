"""A file system that refuses every write, for checking that reading a run directory back writes nothing.

Tests run as root, which ignores permission bits, so chmod cannot stand in for a read-only mount: instead every
way Python writes (``open`` and ``os.open`` for writing, the ``os`` calls that rename, remove, create or change
files, and ``pathlib``'s own bindings of them) fails as on a read-only mount (EROFS) and is recorded.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import pathlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_OS_WRITES = (
    "replace",
    "rename",
    "unlink",
    "remove",
    "mkdir",
    "rmdir",
    "truncate",
    "chmod",
    "utime",
    "link",
    "symlink",
)
# Python 3.10's pathlib calls these through ``_NormalAccessor``, which bound the os functions (and io.open) when
# pathlib was imported: patching ``os`` alone misses ``Path.write_text`` and ``Path.mkdir`` there.
_ACCESSOR = getattr(pathlib, "_NormalAccessor", None)


@contextmanager
def read_only_filesystem() -> Iterator[list[str]]:
    """Inside the block every write fails with ``OSError(EROFS)``; yields the list of refused attempts."""
    attempts: list[str] = []

    def refuse(what: str):
        attempts.append(what)
        raise OSError(errno.EROFS, "Read-only file system", what)

    real_os_open, real_open = os.open, builtins.open

    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & _WRITE_FLAGS:
            refuse(f"os.open({path!r}, {flags:#o})")
        return real_os_open(path, flags, *args, **kwargs)

    def guarded_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+"):
            refuse(f"open({file!r}, {mode!r})")
        return real_open(file, mode, *args, **kwargs)

    def refusing(name: str):
        return lambda *args, **kwargs: refuse(f"os.{name}{args!r}")

    patches: list[tuple[object, str, object]] = [
        (os, "open", guarded_os_open),
        (builtins, "open", guarded_open),
        (io, "open", guarded_open),
    ]
    patches += [(os, name, refusing(name)) for name in _OS_WRITES if hasattr(os, name)]
    if _ACCESSOR is not None:
        patches.append((_ACCESSOR, "open", staticmethod(guarded_open)))
        patches += [(_ACCESSOR, name, staticmethod(refusing(name))) for name in _OS_WRITES if name in vars(_ACCESSOR)]
    originals = [
        (owner, name, vars(owner)[name] if isinstance(owner, type) else getattr(owner, name))
        for owner, name, _ in patches
    ]
    try:
        for owner, name, replacement in patches:
            setattr(owner, name, replacement)
        yield attempts
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def tree_bytes(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (hidden ones included) by relative path, with its bytes."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
