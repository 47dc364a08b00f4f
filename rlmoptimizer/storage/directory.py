"""``run_storage_dir`` made a run directory, or refused with what to do: a file, a symlink to nowhere, a folder of
something else, a path this user cannot make.

May import: the standard library and ``rlmoptimizer.errors``.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlmoptimizer.errors import ConfigurationError

RUN_MANIFEST_KEYS = ("program", "trainset", "valset", "metric", "budget_limit")
"""What every ``manifest.json`` a compile has written holds (``compile_manifest`` in
:mod:`rlmoptimizer.storage.resume`), whatever the version that wrote it."""


def make_run_directory(path: Path) -> Path:
    """``run_storage_dir`` as a directory, created if missing; :class:`ConfigurationError` if it is a file, cannot
    be created, or holds files but no ``manifest.json`` of a run (a folder of something else, whose files a compile
    would write over, even one with a ``manifest.json`` of its own; or a run directory that lost what says what its
    runs belong to)."""
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
            raise ConfigurationError(
                f"run_storage_dir {str(path)!r} holds {_shown(held)} but no manifest.json, so it is not a run "
                "directory compile() can use: a compile writes result.json, ledger.json, runs/ and more there, over "
                "what is there; and a run directory without its manifest.json cannot be resumed safely (it says what "
                "the runs belong to). Pass a new or empty directory."
            )
    elif path.is_dir() and _foreign_manifest(path / "manifest.json"):
        raise ConfigurationError(
            f"run_storage_dir {str(path)!r} holds {_shown(sorted(_held_files(path)))}, and its manifest.json is not "
            f"a run's (a run's holds the keys {', '.join(RUN_MANIFEST_KEYS)}), so it is not a run directory compile() "
            "can use: a compile writes result.json, ledger.json, runs/ and more there, over what is there. Pass a "
            "new or empty directory."
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


def _foreign_manifest(manifest: Path) -> bool:
    """``manifest`` is another program's: a JSON object without :data:`RUN_MANIFEST_KEYS`, or a file that is not a
    JSON object in a folder without a run's ``runs/`` or ``result.json``. A run's manifest cut short or edited into
    something else, or one this user cannot read, is not: opening the run refuses it, naming the file."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except PermissionError:
        return False
    except (OSError, ValueError):  # not JSON, not UTF-8, a folder
        data = None
    if isinstance(data, dict):
        return not all(key in data for key in RUN_MANIFEST_KEYS)
    return not ((manifest.parent / "runs").is_dir() or (manifest.parent / "result.json").exists())


def _shown(held: list[str]) -> str:
    """The first five of ``held``, and how many more."""
    return ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")


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
