"""``run_storage_dir`` made a run directory, or refused with what to do: a file, a symlink to nowhere, a folder of
something else, a path this user cannot make.

May import: the standard library and ``rlmoptimizer.errors``.
"""

from __future__ import annotations

from pathlib import Path

from rlmoptimizer.errors import ConfigurationError


def make_run_directory(path: Path) -> Path:
    """``run_storage_dir`` as a directory, created if missing; :class:`ConfigurationError` if it is a file, cannot
    be created, or holds files but no ``manifest.json`` (a folder of something else, whose files a compile would
    write over, or a run directory that lost what says what its runs belong to)."""
    try:
        return _made_run_directory(path)
    except OSError as exc:  # a name too long, a symlink loop, a folder this user cannot list
        raise ConfigurationError(
            f"run_storage_dir {str(path)[:200]!r} cannot be used ({exc.strerror or exc}): pass a directory you can "
            "write to"
        ) from exc


def _made_run_directory(path: Path) -> Path:
    if path.is_symlink() and not path.exists():
        raise ConfigurationError(
            f"run_storage_dir {str(path)!r} is a symlink to {str(path.readlink())!r}, which does not exist (or "
            "loops): make that directory, or pass another path"
        )
    if path.exists() and not path.is_dir():
        raise ConfigurationError(
            f"run_storage_dir {str(path)!r} is a file, not a directory: pass the path of a directory (created if "
            "missing), e.g. a new one next to it"
        )
    if path.is_dir() and not (path / "manifest.json").exists():
        held = sorted(_held_files(path))
        if held:
            shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
            raise ConfigurationError(
                f"run_storage_dir {str(path)!r} holds {shown} but no manifest.json, so it is not a run directory "
                "compile() can use: a compile writes result.json, ledger.json, runs/ and more there, over what is "
                "there; and a run directory without its manifest.json cannot be resumed safely (it says what the "
                "runs belong to). Pass a new or empty directory."
            )
    try:
        if not path.is_dir():  # nothing is written to a directory that exists (a finished run read back)
            path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"run_storage_dir {str(path)!r} cannot be created ({type(exc).__name__}: {exc}): pass a directory you "
            "can write to"
        ) from exc
    return path


def _held_files(path: Path) -> list[str]:
    """What ``path`` holds besides a lock's files and hidden ones, and folders with nothing in them."""
    held = []
    for entry in path.iterdir():
        if entry.name.startswith(".") or entry.name == "holder.json":
            continue
        if entry.is_dir() and not any(entry.iterdir()):
            continue
        held.append(entry.name + ("/" if entry.is_dir() else ""))
    return held
